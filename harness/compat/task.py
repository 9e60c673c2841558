"""The worker side: what every harness worker runs for a TensorFlow runner's task.

A worker finds its task in ``TF_CONFIG``, imports the module ``fn`` came
from (TensorFlow's forkserver has imported the test file, so what its top
level sets, such as a strategy's class attributes, holds in the worker),
takes its own ``(fn, args, kwargs)``, sets the barrier :func:`get_barrier`
hands out, logs at INFO to stderr as TensorFlow's runner's children do,
and records the exception ``fn`` raised, pickled, for the parent to raise.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import sys
from typing import Any, Callable, Mapping, MutableMapping, Optional, Tuple

from harness.compat import originals
from harness.core import serialize

# A task's call as its worker takes it: the module its function came from
# (None for ``__main__``), and ``(fn, args, kwargs)`` pickled.
Payload = Tuple[Optional[str], bytes]

_barrier = None


def get_barrier():
    """The barrier of every task of this attempt (``multi_process_runner.get_barrier``)."""
    if _barrier is None:
        raise ValueError(
            "barrier is not defined. It is likely because you are calling get_barrier() in "
            "the main process. get_barrier() can only be called in the subprocesses.")
    return _barrier


@dataclasses.dataclass(frozen=True)
class Shared:
    """What every task of one cluster shares, made in the parent.

    ``statuses``: a managed dict, task index to (attempt, the pickled
    exception or None); ``starts``: a managed dict, task index to how many
    times it started (its attempt); ``barriers``: one manager barrier per
    attempt, as a barrier that a killed task left waited on is spent;
    ``eager``: whether the parent ran eagerly; ``grpc_fail_fast``: the
    runner's argument, for ``GRPC_FAIL_FAST``; ``payloads``: a managed
    dict, task index to the call ``start_single_process`` gave it when it
    started the task again into the running cluster; ``order``: each
    task's ``(type, index)`` by the harness's index (empty: workers only);
    ``on_start``: :func:`harness.compat.install` where the parent ran it,
    which each task then runs too (a test that runs again in the task, as
    ``combinations``' do, reaches the same bound references);
    ``rpc_layer``: what the task's ``TF_CONFIG`` names as its
    ``rpc_layer``, as TensorFlow's runner writes it (its default: ``grpc``);
    ``addresses``: the cluster spec as the test gave it, whose addresses
    each task's ``TF_CONFIG`` lists in place of the harness's (a
    ``MultiProcessCluster``, whose test process connects to its servers
    there), or None."""

    statuses: MutableMapping[int, Tuple[int, Optional[bytes]]]
    starts: MutableMapping[int, int]
    barriers: Tuple[Any, ...]
    payloads: MutableMapping[int, Payload]
    eager: bool = True
    grpc_fail_fast: Optional[bool] = None
    order: Tuple[Tuple[str, int], ...] = ()
    on_start: Optional[Callable[[], None]] = None
    rpc_layer: str = "grpc"
    addresses: Optional[Mapping[str, Any]] = None


def task_index(order: Tuple[Tuple[str, int], ...] = ()) -> int:
    """This task's index among the runner's: its place in ``order`` (the
    chief first), or its ``worker`` index."""
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    if order:
        return order.index((task["type"], int(task["index"])))
    return int(task["index"])


def as_tensorflows_runner_writes(tf_config: str, rpc_layer: str,
                                 addresses: Optional[Mapping[str, Any]] = None) -> str:
    """``TF_CONFIG`` naming ``rpc_layer``, as TensorFlow's runner writes it
    (code that builds a server from ``TFConfigClusterResolver().rpc_layer``
    reads it there), and listing ``addresses`` as its cluster where given."""
    config = json.loads(tf_config)
    config["rpc_layer"] = rpc_layer
    if addresses is not None:
        config["cluster"] = {kind: list(tasks) for kind, tasks in addresses.items()}
    return json.dumps(config)


def _share_barrier_with_tensorflow(barrier) -> None:
    """TensorFlow's own ``get_barrier()`` hands out the same barrier: code
    reaches it as ``tf.__internal__.distribute.multi_process_runner`` too,
    which :func:`harness.compat.install` patches in the test process only."""
    if "tensorflow" not in sys.modules:
        return
    with contextlib.suppress(ImportError):
        originals.tensorflows("tensorflow.python.distribute.multi_process_runner")._barrier = barrier


def _log_like_tensorflow() -> None:
    with contextlib.suppress(ImportError):
        from absl import logging
        logging.set_verbosity(logging.INFO)
        logging.set_stderrthreshold(logging.DEBUG)


@contextlib.contextmanager
def _runtime_mode(eager: bool):
    if eager:
        yield
        return
    from tensorflow.python.eager import context
    with context.graph_mode():
        yield


def pickled_exception(exc: BaseException) -> Optional[bytes]:
    try:
        return serialize.dumps(exc.with_traceback(None))
    except Exception:   # the parent falls back to the harness's record of it
        return None


def run_task(tasks: Mapping[int, Payload], shared: Shared):
    """The function each harness worker runs: its task's ``fn``."""
    global _barrier
    index = task_index(shared.order)
    again = shared.payloads.get(index)
    module, payload = again or tasks[index]
    attempt = shared.starts.get(index, 0)
    shared.starts[index] = attempt + 1
    _barrier = shared.barriers[min(attempt, len(shared.barriers) - 1)]
    _share_barrier_with_tensorflow(_barrier)
    os.environ["TF_CONFIG"] = as_tensorflows_runner_writes(
        os.environ["TF_CONFIG"], shared.rpc_layer, shared.addresses)
    if shared.grpc_fail_fast is not None:
        os.environ["GRPC_FAIL_FAST"] = str(shared.grpc_fail_fast)
    _log_like_tensorflow()
    if shared.on_start is not None:
        shared.on_start()
    fn, args, kwargs = _loaded((module, payload))
    try:
        with _runtime_mode(shared.eager):
            value = fn(*args, **kwargs)
    except Exception as e:
        shared.statuses[index] = (attempt, pickled_exception(e))
        raise
    shared.statuses[index] = (attempt, None)
    return value


def _loaded(payload: Payload) -> Tuple[Callable, tuple, dict]:
    """A call as the parent sent it, ``(fn, args, kwargs)``, once its
    module is imported (what its top level sets holds here too)."""
    module, pickled = payload
    if module:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    return serialize.loads(pickled)


def pool_loop(initializer, inboxes: Mapping[Tuple[str, int], Any], outbox) -> None:
    """A :class:`~harness.compat.pool.MultiProcessPoolRunner`'s task, as
    TensorFlow's pool's: the initializer once, then each call from its
    inbox (``(number, payload)``; None ends the loop), its answer to the
    outbox as ``(task, number, ok, pickled value or exception)``; an
    exception is the call's answer, and the loop goes on."""
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    key = (task["type"], int(task["index"]))
    if initializer is not None:
        initializer()
    inbox = inboxes[key]
    while True:
        call = inbox.get()
        if call is None:
            return
        number, payload = call
        try:
            fn, args, kwargs = _loaded(payload)
            answer = (True, serialize.dumps(fn(*args, **kwargs)))
        except Exception as e:
            answer = (False, pickled_exception(e) or serialize.dumps(
                RuntimeError(f"{type(e).__name__}: {e} (not picklable)")))
        sys.stdout.flush()
        sys.stderr.flush()
        outbox.put((key, number) + answer)
