"""Worker side: acting out step-keyed faults, one function per fault kind.

:data:`ACTIONS` maps each step-keyed fault class to what it does in the
worker at its step's boundary.  A row marked ``replaces_step`` acts instead
of the step's body: under ``ctx.steps()`` the boundary is reported and the
loop does not yield the step, as a ``continue`` at the top of the body
would; with automatic steps the ``tf.function`` call does not happen and
does not count, so the next call is the same step.
Everything here runs inside a worker process and may import TensorFlow.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Generic, TypeVar

from harness.errors import InjectedFault
from harness.faults import (Bandwidth, Crash, Delay, DiskFull, ExtraCollective, Latency,
                            LostRename, Partition, Pause, Preempt, RaiseError, ResetPeers,
                            SkipStep, SlowWrite, StepFault, TornWrite)
from harness.plan import changes_the_network_at_once
from harness.worker.process import flush_output

if TYPE_CHECKING:
    from harness.worker.context import WorkerContext


def skip_step(fault: SkipStep, ctx: WorkerContext) -> None:
    """Nothing to run: the step itself is left out (its row replaces the step)."""


def delay(fault: Delay, ctx: WorkerContext) -> None:
    time.sleep(fault.seconds)


def pause(fault: Pause, ctx: WorkerContext) -> None:
    # The parent sends SIGCONT after the fault's parent_signals (it saw the
    # FAULT message first); a stopped process cannot wake itself.  Sent to
    # this thread: it stops before its next line, where a signal to the
    # process may be taken by another thread first (a server's fault acts
    # in a thread beside the one in the server's join) and this one would
    # run on a moment.
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)


def crash(fault: Crash, ctx: WorkerContext) -> None:
    flush_output()
    if fault.how == "exit":
        os._exit(1)
    elif fault.how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        os.abort()


def preempt(fault: Preempt, ctx: WorkerContext) -> None:
    """The preemption notice: SIGTERM to this process, whatever handles it.
    With no handler it dies of it; a handler (TensorFlow's
    PreemptionCheckpointHandler) runs in the main thread right after this
    returns.  The parent kills it if it outlives the fault's grace."""
    flush_output()
    os.kill(os.getpid(), signal.SIGTERM)


def on_the_network(fault: StepFault, ctx: WorkerContext) -> None:
    """Nothing in the worker: the parent acts on its network link (it saw
    the FAULT message first).  The step runs on into it once the parent
    says the change is made; a change due later (``ResetPeers(after=...)``)
    is not waited for."""
    if changes_the_network_at_once(fault) and ctx.wait_applied is not None:
        ctx.wait_applied()


def raise_error(fault: RaiseError, ctx: WorkerContext) -> None:
    error = InjectedFault(fault.message)
    # A step can begin while a tf.function is traced (its first call, or
    # every call of one made per step).  Autograph rewraps what a trace
    # raises as StagingError, listing the harness's frames as "user code";
    # an exception carrying ``ag_pass_through`` it lets through as itself
    # (TensorFlow's own UnliftableError does so), with a plain traceback.
    error.ag_pass_through = True   # type: ignore[attr-defined]  # autograph reads it
    raise error


def extra_collective(fault: ExtraCollective, ctx: WorkerContext) -> None:
    """One all-reduce across the cluster that only this worker runs."""
    strategy = ctx.strategy
    if strategy is None:
        raise RuntimeError("ExtraCollective: fn has not created a MultiWorkerMirroredStrategy "
                           "before this step, so there is no collective to run")
    import tensorflow as tf
    extra = ctx.traced.get("extra_collective")
    if extra is None:
        # Traced like a user's step function, so it joins the same ordered
        # stream of collectives: TensorFlow pairs it with the peers' next
        # all-reduce (silently when the shapes agree, with "Shape mismatch"
        # when they do not).
        @tf.function
        def extra():
            return strategy.reduce(tf.distribute.ReduceOp.SUM,
                                   strategy.run(lambda: tf.constant(1.0)), axis=None)
        ctx.traced["extra_collective"] = extra
    extra()


_Fault = TypeVar("_Fault", bound=StepFault)


@dataclasses.dataclass(frozen=True)
class Action(Generic[_Fault]):
    act: Callable[[_Fault, WorkerContext], None]
    replaces_step: bool = False
    # The fault tells the parent itself when it acts, later than its
    # boundary (a file fault, on the job's next write), or never.
    reports_itself: bool = False


def on_files(fault: StepFault, ctx: WorkerContext) -> None:
    from harness.worker.files import arm
    arm(fault, ctx)


ACTIONS: Dict[type, Action[Any]] = {
    SkipStep: Action(skip_step, replaces_step=True),
    ExtraCollective: Action(extra_collective),
    Crash: Action(crash),
    RaiseError: Action(raise_error),
    Pause: Action(pause),
    Delay: Action(delay),
    Preempt: Action(preempt),
    Partition: Action(on_the_network),
    Bandwidth: Action(on_the_network),
    Latency: Action(on_the_network),
    ResetPeers: Action(on_the_network),
    DiskFull: Action(on_files, reports_itself=True),
    TornWrite: Action(on_files, reports_itself=True),
    LostRename: Action(on_files, reports_itself=True),
    SlowWrite: Action(on_files, reports_itself=True),
}


def _action(fault: StepFault) -> Action[Any]:
    try:
        return ACTIONS[type(fault)]
    except KeyError:
        raise TypeError(f"{fault!r}: no worker action for {type(fault).__name__}; "
                        f"add a row to harness.worker.actions.ACTIONS") from None


def replaces_step(fault: StepFault) -> bool:
    """Whether ``fault`` acts instead of its step (the step does not run)."""
    return _action(fault).replaces_step


def reports_itself(fault: StepFault) -> bool:
    """Whether ``fault`` tells the parent itself when it acts."""
    return _action(fault).reports_itself


def act_out(fault: StepFault, ctx: WorkerContext) -> None:
    """Do what ``fault`` does in this worker, now."""
    _action(fault).act(fault, ctx)
