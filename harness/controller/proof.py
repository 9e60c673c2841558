"""When the watch loop looks for a run's certain end, and what it finds:
:class:`Proofs` holds the next time to look and asks the pure proofs of
:mod:`harness.diagnosis.deadlock` with the workers as they are now.

Without ``end_when_certain`` it looks only once a worker has returned (a
deadlock the ledgers prove).  With it (and no task restarts) it also
looks :data:`~harness.diagnosis.deadlock.SETTLE` seconds after a failure
(a worker that raised or died holds the others up for ever) and, until
anything has ended, every :data:`STOPPED_EVERY` seconds for a worker
stopped for good: SIGSTOPped, with no SIGCONT due from the harness, the
only one that sends a run's workers one.
"""
from __future__ import annotations

import math
import signal
from typing import Dict, List, Optional, Sequence

from harness.diagnosis.deadlock import SETTLE, certain_after_failure, certain_deadlock
from harness.diagnosis.observations import EndedBy

# How often, once a worker has returned or failed while others have not,
# the ledgers are read for a certain end.
PROOF_EVERY = 0.1
# How often a run that ends when its verdict is certain looks for a worker
# stopped for good before any worker ended.
STOPPED_EVERY = 0.25


class Proofs:
    """The next time to look for a certain end (``next``), and the look."""

    def __init__(self, start: float, end_when_certain: bool):
        self.end_when_certain = end_when_certain
        self.next = start + STOPPED_EVERY if end_when_certain else math.inf
        self.stopped_since: Dict[int, float] = {}   # worker -> elapsed when first seen stopped

    def returned(self, now: float) -> None:
        self.next = min(self.next, now)

    def failed(self, now: float) -> None:
        if self.end_when_certain:
            self.next = min(self.next, now + SETTLE)

    def look(self, workers: Sequence, tracked: Sequence, actions: Sequence, elapsed: float,
             now: float, failed: bool, exit_on_return: bool) -> Optional[EndedBy]:
        """How the run ends, when it is certain now: ``workers`` are the
        training workers' observations, ``tracked`` their live handles (in
        the same order), ``actions`` the parent's actions still due."""
        settled = any(w.returned or w.error is not None or w.exit_code is not None
                      for w in workers)
        self.next = now + (PROOF_EVERY if settled else STOPPED_EVERY)
        held = held_for_good(tracked, actions) if self.end_when_certain else []
        self.stopped_since = {i: self.stopped_since.get(i, elapsed) for i in held}
        if certain_deadlock(workers, elapsed, exit_on_return=exit_on_return,
                            held=self.stopped_since) is not None:
            return EndedBy.DEADLOCK
        if self.end_when_certain and failed and \
                certain_after_failure(workers, elapsed) is not None:
            return EndedBy.GRACE_EXPIRED
        return None


def held_for_good(tracked: Sequence, actions: Sequence) -> List[int]:
    """The workers stopped (SIGSTOP) with no SIGCONT due."""
    due = {a.worker for a in actions if a.signal == signal.SIGCONT}
    return [w.index for w in tracked
            if w.index not in due and w.pending and w.handle.is_stopped()]
