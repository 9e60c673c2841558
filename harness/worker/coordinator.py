"""Worker side: the coordinator of a parameter-server cluster (the chief).

Its steps are the functions its ``ClusterCoordinator`` schedules.  Each
function that has run on a worker is written to the chief's progress map
(:data:`~harness.core.progress.RAN`) before the coordinator fetches its
result; the worker's server takes it as its step (:mod:`harness.worker.
servers`).  Where a fault ends that worker at that step, the coordinator
waits until the worker no longer listens before it fetches: the function
has run there and its result is lost with the worker, so TensorFlow puts
it back and runs it again, every time, as it does when a machine is lost
between the two.  The patches live only in this
process; a TensorFlow without these internals is left as it is.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Tuple

from harness.core import progress, protocol

# The longest the coordinator waits for a worker a fault ends to stop
# listening (a Preempt's grace included) before it fetches all the same.
HOLD_LIMIT = 30.0
HOLD_POLL = 0.01


def watch_coordinator(ctx) -> None:
    """Count the functions a ``ClusterCoordinator`` schedules as steps
    (where ``fn`` reports none of its own), report each that ran on a
    worker and hold the ones :attr:`ctx.holds` names, and tell the parent
    each function the coordinator puts back in its queue after its worker
    failed (:data:`~harness.core.protocol.RESCHEDULED`)."""
    if not ctx.coordinates:
        return
    try:
        from tensorflow.python.distribute.coordinator import cluster_coordinator as cc
    except ImportError:
        return
    coordinator = cc.ClusterCoordinator
    schedule = coordinator.schedule
    if getattr(schedule, "_mwms_hooked", False):
        return
    scheduling = threading.local()

    def counted_schedule(self, fn, args=None, kwargs=None):
        name = getattr(fn, "__name__", None) or getattr(fn, "name", None) or "schedule"
        ctx.automatic_step(str(name))
        scheduling.step = ctx.current_step
        try:
            return schedule(self, fn, args=args, kwargs=kwargs)
        finally:
            scheduling.step = None

    counted_schedule._mwms_hooked = True   # type: ignore[attr-defined]  # read back above
    coordinator.schedule = counted_schedule
    _report_functions_run(ctx, cc, scheduling)
    _report_put_back(ctx, cc)


def _report_functions_run(ctx, cc, scheduling: threading.local) -> None:
    closure = getattr(cc, "Closure", None)
    init, execute_on = getattr(closure, "__init__", None), getattr(closure, "execute_on", None)
    if closure is None or init is None or execute_on is None or ctx.progress_map is None:
        return
    holds = Holds(ctx.holds, _worker_addresses())

    def tagged_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._mwms_step = getattr(scheduling, "step", None)

    def execute_then_report(self, worker):
        out = execute_on(self, worker)
        step, index = getattr(self, "_mwms_step", None), getattr(worker, "worker_index", None)
        if step is not None and index is not None:
            ctx.progress_map.write(progress.RAN, number=step, detail=index)
            holds.wait(index, step)
        return out

    closure.__init__ = tagged_init
    closure.execute_on = execute_then_report


def _report_put_back(ctx, cc) -> None:
    worker = getattr(cc, "Worker", None)
    failed = getattr(worker, "_on_closure_failure", None)
    if worker is None or failed is None:
        return

    def on_closure_failure(self, closure, e):
        ctx.send(protocol.RESCHEDULED, data={"task": "worker",
                                             "index": getattr(self, "worker_index", None),
                                             "error": type(e).__name__})
        return failed(self, closure, e)

    worker._on_closure_failure = on_closure_failure


def _worker_addresses() -> Tuple[str, ...]:
    from harness.worker.strategy_hook import tf_config_from_env
    config = tf_config_from_env() or {}
    try:
        return tuple(config["cluster"]["worker"])
    except (KeyError, TypeError):
        return ()


class Holds:
    """Where the coordinator waits for a worker to go: each ``(worker,
    step)`` once, at the first function of that step or later to run on
    that worker."""

    def __init__(self, holds, addresses: Tuple[str, ...], limit: float = HOLD_LIMIT):
        self._left = sorted((int(w), int(s)) for w, s in holds)
        self._addresses = addresses
        self._limit = limit
        self._lock = threading.Lock()

    def due(self, worker: int, step: int) -> bool:
        """Whether a function of ``step`` on ``worker`` is held (each hold
        is taken once)."""
        with self._lock:
            taken = [h for h in self._left if h[0] == worker and h[1] <= step]
            for h in taken:
                self._left.remove(h)
            return bool(taken)

    def wait(self, worker: int, step: int) -> None:
        if not self.due(worker, step) or worker >= len(self._addresses):
            return
        deadline = time.monotonic() + self._limit
        while time.monotonic() < deadline and listening(self._addresses[worker]):
            time.sleep(HOLD_POLL)


def listening(address: str) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=0.2):
            return True
    except (OSError, ValueError):
        return False
