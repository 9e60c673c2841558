"""Worker side: acting out faults, and watching ``fn`` create its strategy.

Everything here runs inside a worker process and may import TensorFlow.
"""
from __future__ import annotations

import os
import signal
import time

from . import protocol
from .worker import _flush
from .faults import (Crash, Delay, ExtraCollective, InjectedFault, Pause, RaiseError,
                     SkipStep)


def apply_step_fault(fault, ctx) -> None:
    """Act out one step-keyed fault in this worker (SkipStep is the loop's job)."""
    if isinstance(fault, Delay):
        time.sleep(fault.seconds)
    elif isinstance(fault, Pause):
        # The parent sends SIGCONT after fault.seconds (it saw the FAULT
        # message first); a stopped process cannot wake itself.
        os.kill(os.getpid(), signal.SIGSTOP)
    elif isinstance(fault, Crash):
        _flush()
        if fault.how == "exit":
            os._exit(1)
        elif fault.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        else:
            os.abort()
    elif isinstance(fault, RaiseError):
        raise InjectedFault(fault.message)
    elif isinstance(fault, ExtraCollective):
        run_extra_collective(ctx)


def run_extra_collective(ctx) -> None:
    """One all-reduce across the cluster that only this worker runs."""
    strategy = ctx.strategy
    if strategy is None:
        raise RuntimeError("ExtraCollective: fn has not created a MultiWorkerMirroredStrategy "
                           "before this step, so there is no collective to run")
    import tensorflow as tf
    extra = getattr(ctx, "_extra_collective", None)
    if extra is None:
        # Traced like a user's step function, so it joins the same ordered
        # stream of collectives: TensorFlow pairs it with the peers' next
        # all-reduce (silently when the shapes agree, with "Shape mismatch"
        # when they do not).
        @tf.function
        def extra():
            return strategy.reduce(tf.distribute.ReduceOp.SUM,
                                   strategy.run(lambda: tf.constant(1.0)), axis=None)
        ctx._extra_collective = extra
    extra()


class StepDesyncError(RuntimeError):
    """Raised by the opt-in sync check when workers are at different steps."""


def check_step_sync(ctx, step: int) -> None:
    """All-reduce every worker's step number; raise if they disagree.

    Each worker puts ``step + 1`` in its own slot of an N-vector (zeros
    elsewhere) and the cluster sums the vectors, so every worker learns every
    worker's step in one tiny collective.  Like PyTorch's
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` fingerprints, it turns a silent
    misalignment (a skipped step pairs step k with k+1 and hangs only at the
    end) into an error at the first divergent step, naming the worker.  A
    collective skipped or added inside a step makes this check pair with a
    training collective of another shape, which TensorFlow reports at once
    as a shape mismatch.  Its cost is one extra all-reduce per step (see the
    benchmark figures in the README).
    """
    import numpy as np
    import tensorflow as tf
    strategy = ctx.strategy
    n = ctx.num_workers
    check = getattr(ctx, "_sync_fn", None)
    if check is None:
        @tf.function
        def check(vec):
            return strategy.reduce(tf.distribute.ReduceOp.SUM,
                                   strategy.run(lambda: tf.identity(vec)), axis=None)
        ctx._sync_fn = check
    mine = np.zeros(n, dtype=np.float32)
    mine[ctx.index] = step + 1
    per_worker = max(1, strategy.num_replicas_in_sync // n)
    seen = [int(round(v / per_worker)) - 1 for v in check(tf.constant(mine)).numpy()]
    if len(set(seen)) > 1:
        raise StepDesyncError(describe_desync(seen))


def describe_desync(seen) -> str:
    """``seen[i]`` is worker i's step; name the odd ones out when a strict
    majority agrees (the text the diagnosis reads back)."""
    from collections import Counter
    counts = Counter(seen)
    (common, hits), = counts.most_common(1)
    at = ", ".join(f"worker {i} at step {s}" for i, s in enumerate(seen))
    if hits * 2 > len(seen) and list(counts.values()).count(hits) == 1:
        odd = [i for i, s in enumerate(seen) if s != common]
        return (f"step desync: {at}; odd one out: "
                + ", ".join(f"worker {i}" for i in odd))
    return f"step desync: {at}; no majority, so no single worker can be blamed"


CHIEF_WAIT = 1.0


def _wait_for_chief(tf_config, limit: float = CHIEF_WAIT) -> None:
    """Give worker 0's gRPC server a moment to listen before joining.

    A worker that reaches the coordination service before the chief's
    server is up backs off for about a second before it retries, which
    made one 4-worker start-up in three take ~1 s longer.  Waiting here
    until the chief's port accepts a TCP connection (at most ``limit``
    seconds, then carry on as TensorFlow would) removes that back-off
    without changing what happens: a chief that never listens still hangs
    the cluster, a second later.
    """
    import socket
    try:
        task = tf_config["task"]
        if task.get("type") != "worker" or int(task.get("index", 0)) == 0:
            return
        host, port = tf_config["cluster"]["worker"][0].rsplit(":", 1)
        port = int(port)
    except (TypeError, KeyError, ValueError, IndexError, AttributeError):
        return
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.05):
                return
        except OSError:
            time.sleep(0.005)


class SecondStrategyError(RuntimeError):
    """``fn`` created a second MultiWorkerMirroredStrategy in one process."""


def install_strategy_hook(ctx, send) -> None:
    """Report strategy creation to the parent and keep the instance on ``ctx``.

    Wrapping ``__init__`` of the class behind ``tf.distribute.MultiWorkerMirroredStrategy``
    (and its ``experimental`` alias, a subclass) tells the parent that a
    worker is blocked *in strategy creation*, which is where a bad
    ``TF_CONFIG`` hangs, and how many replicas the worker ended up with.
    The patch lives only in this worker process.
    """
    from tensorflow.python.distribute import collective_all_reduce_strategy as cars

    cls = cars.CollectiveAllReduceStrategy
    original = cls.__init__
    if getattr(original, "_mwms_hooked", False):
        return

    def __init__(self, *args, **kwargs):
        outermost = not getattr(ctx, "_creating", False)
        if outermost and ctx.strategy is not None:
            # TensorFlow would block here for ever with nothing but a
            # warning ("Enabling collective ops after program startup may
            # cause error"): say what is wrong at once instead.
            raise SecondStrategyError(
                "a second MultiWorkerMirroredStrategy in one worker process: TensorFlow "
                "configures collective ops once per process and hangs silently on a second "
                "strategy. Create one strategy per process and reuse it.")
        if outermost:
            ctx._creating = True
            send(protocol.STRATEGY_CREATING)
            from .worker_context import tf_config_from_env
            _wait_for_chief(tf_config_from_env())
        try:
            original(self, *args, **kwargs)
        finally:
            if outermost:
                ctx._creating = False
        if outermost:
            ctx.strategy = self
            send(protocol.STRATEGY_CREATED, data=int(self.num_replicas_in_sync))

    __init__._mwms_hooked = True
    cls.__init__ = __init__


def make_keras_callback(ctx):
    """A Keras callback whose batch boundaries are this worker's steps."""
    if any(isinstance(f, SkipStep) for f in ctx.faults):
        raise ValueError("SkipStep cannot act through keras_callback(): model.fit has no "
                         "way to skip a batch; use a custom loop with context().steps()")
    import tensorflow as tf
    base = tf.keras.callbacks.Callback  # tf_keras when TF_USE_LEGACY_KERAS=1

    class MWMSProgress(base):
        """Reports each training batch to the harness as a step."""

        def on_train_batch_begin(self, batch, logs=None):
            ctx._boundary(ctx._global_step)
            ctx._global_step += 1

        def on_train_end(self, logs=None):
            ctx._send(protocol.STEPS_DONE, step=ctx._global_step)

    return MWMSProgress()
