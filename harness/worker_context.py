"""Worker side: what ``fn`` sees of the harness while it runs in a worker.

``harness.context()`` returns the :class:`WorkerContext` of the worker it is
called in.  Its ``steps(n)`` loop is where progress is reported to the parent
and where step-keyed faults act; a Keras ``fit`` gets the same through
``keras_callback()``.
"""
from __future__ import annotations

import itertools
import json
import os
from typing import Callable, Iterator, Optional, Tuple

from . import protocol
from .faults import Fault, SkipStep, at_step


class NotInWorkerError(RuntimeError):
    """``harness.context()`` was called outside a worker process."""


_current: Optional["WorkerContext"] = None


def context() -> "WorkerContext":
    """The context of the worker this code runs in.

    Raises :class:`NotInWorkerError` when called in the pytest process or any
    process the harness did not start as a worker.
    """
    if _current is None:
        raise NotInWorkerError(
            "harness.context() is only available inside a function run by "
            "mwms_cluster.run(); here there is no MWMS worker")
    return _current


class WorkerContext:
    """One worker's view of its cluster.

    ``index`` is this worker's task index, ``num_workers`` the cluster size,
    ``is_chief`` true for worker 0 (a cluster of workers only has no separate
    chief task), ``tf_config`` the dict its ``TF_CONFIG`` holds (None when a
    fault removed it) and ``strategy`` the MultiWorkerMirroredStrategy ``fn``
    created, once it has.
    """

    def __init__(self, index: int, num_workers: int, tf_config: Optional[dict],
                 send: Callable[..., None], faults: Tuple[Fault, ...] = (),
                 sync_check: bool = False):
        self.index = index
        self.sync_check = sync_check
        self.num_workers = num_workers
        self.tf_config = tf_config
        self.faults = tuple(f for f in faults if f.worker == index)
        self.strategy = None
        self._send = send
        self._global_step = 0

    @property
    def is_chief(self) -> bool:
        return self.index == 0

    def __repr__(self) -> str:
        return f"WorkerContext(index={self.index}, num_workers={self.num_workers})"

    # -- progress -------------------------------------------------------
    def steps(self, n: Optional[int] = None) -> Iterator[int]:
        """Iterate over ``0..n-1``, reporting each step boundary to the parent.

        Step-keyed faults for this worker act here, after the boundary is
        reported and before the step's body runs: a ``SkipStep`` makes the
        loop not yield that step at all.  With ``n=None`` it counts without
        end, for loops driven by something else:
        ``for batch, k in zip(dist_dataset, ctx.steps()):``.
        """
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
            raise ValueError(f"steps(n): n must be an integer 0 or more or None, got {n!r}")
        ran = 0
        for k in (range(n) if n is not None else itertools.count()):
            if self._boundary(k):
                ran += 1
                yield k
        self._send(protocol.STEPS_DONE, step=ran, data=n)

    def _boundary(self, step: int) -> bool:
        """Report step ``step`` and apply its faults; False when it is skipped."""
        faults = at_step(self.faults, step)
        if any(isinstance(f, SkipStep) for f in faults):
            self._send(protocol.FAULT, step=step, data=SkipStep(self.index, step))
            return False
        self._send(protocol.STEP, step=step)
        if self.sync_check and self.strategy is not None:
            from .inject import check_step_sync
            check_step_sync(self, step)
        for f in faults:
            self._send(protocol.FAULT, step=step, data=f)
            from .inject import apply_step_fault
            apply_step_fault(f, self)
        return True

    def keras_callback(self):
        """A Keras callback that counts training batches as steps.

        Batches are numbered across epochs, so step 25 of a 10-batch epoch
        is the sixth batch of the third epoch.  It works with Keras 3 and
        with tf_keras (``TF_USE_LEGACY_KERAS=1``); ``SkipStep`` cannot act
        here (``fit`` has no way to skip a batch) and is rejected.
        """
        from .inject import make_keras_callback
        return make_keras_callback(self)


def tf_config_from_env() -> Optional[dict]:
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return {"unparsable": raw}
