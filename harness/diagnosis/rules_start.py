"""The blame rule for a worker that joined its cluster late, or never: a
process started late or never (what a cluster manager's scheduling does to
a job: a pod Pending, a node slow to come up), or one whose own code ran
for long before it created its strategy.  See :mod:`harness.diagnosis.rules`.

It reads when each worker was seen to start (its first report,
``started``), as a pod's start time tells it in production, and when it
entered strategy creation: a worker that reported nothing at all, and
neither finished nor died, never started.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from harness.core import protocol
from harness.diagnosis.blame import Blame
from harness.diagnosis.echoes import exit_text, short_type
from harness.diagnosis.facts import Facts, phase
from harness.diagnosis.observations import EndedBy, WorkerObservation
from harness.diagnosis.words import names

# A worker that starts, or enters strategy creation, this many seconds after
# the first one is late: far above the spread of a forkserver's forks
# (0.1-0.2 s for 4 workers on 2 busy cores, measured).  One less late than
# this that still outlasted a shorter registration timeout is not named
# here: the verdict is left to the rules that follow.
LATE_START = 2.0


def _first_event(w: WorkerObservation, kind: str) -> Optional[float]:
    return next((e.time for e in w.events if e.kind == kind), None)


def started_at(w: WorkerObservation) -> Optional[float]:
    """When the worker reported that it started (None: it never did)."""
    return _first_event(w, protocol.STARTED)


def never_started(w: WorkerObservation) -> bool:
    """It reported nothing at all, and neither finished nor died: its
    process never ran (the harness ended it, or it waits still)."""
    return not w.events and not w.finished and not w.died


def _waiting_before_strategy(w: WorkerObservation) -> bool:
    """Started, never entered strategy creation, and neither finished nor died."""
    return phase(w) == protocol.STARTED and not w.finished and not w.died


def _lateness(f: Facts) -> Dict[int, Tuple[str, bool]]:
    """The late workers, each with what is late about it, worded, and
    whether it came at all (started and entered strategy creation)."""
    starts = [t for t in map(started_at, f.workers) if t is not None]
    joins = [t for t in (_first_event(w, protocol.STRATEGY_CREATING) for w in f.workers)
             if t is not None]
    if not starts or not joins:
        return {}
    first_start, first_join = min(starts), min(joins)
    late = {}
    for w in f.workers:
        start, join = started_at(w), _first_event(w, protocol.STRATEGY_CREATING)
        if never_started(w):
            late[w.index] = (f"{names([w.index])} never started", False)
        elif start is not None and start - first_start > LATE_START:
            late[w.index] = (f"{names([w.index])} started {start - first_start:.1f}s late",
                             join is not None)
        elif join is not None and join - first_join > LATE_START:
            late[w.index] = (f"{names([w.index])} entered strategy creation "
                             f"{join - first_join:.1f}s after the first worker (it started on "
                             f"time: its code before the strategy took that long)", True)
        elif _waiting_before_strategy(w):
            late[w.index] = (f"{names([w.index])} never entered strategy creation (it started "
                             f"on time, and its code before the strategy had not returned)", False)
    return late


def _ending(w: WorkerObservation) -> Tuple[str, Optional[float]]:
    """How an on-time worker's wait in strategy creation ended, and after
    how long (seconds since it entered it; None: it was still waiting)."""
    began = _first_event(w, protocol.STRATEGY_CREATING) or 0.0
    if w.error is not None and w.finish_time is not None:
        return f"({short_type(w.error.type_name)})", w.finish_time - began
    if w.died and w.exit_time is not None:
        return f"and died ({exit_text(w.exit_code)})", w.exit_time - began
    return "", None


def _waits(on_time: List[WorkerObservation], ended: str) -> str:
    """``workers 0,1 gave up in strategy creation after 2.1-2.2s
    (DeadlineExceededError)``, one clause per way their waits ended."""
    groups: Dict[str, List[Tuple[int, Optional[float]]]] = {}
    for w in on_time:
        how, after = _ending(w)
        groups.setdefault(how, []).append((w.index, after))
    clauses = []
    for how, found in groups.items():
        who = names([i for i, _ in found])
        if not how:
            clauses.append(f"{who} waited in strategy creation {ended}")
            continue
        times = [t for _, t in found if t is not None]   # every wait that ended has its time
        low, high = (f"{t:.1f}" for t in (min(times), max(times)))
        clauses.append(f"{who} gave up in strategy creation after "
                       f"{low if low == high else low + '-' + high}s {how}")
    return "; ".join(clauses)


# TensorFlow's words for a peer that did not register in time (the
# coordination service's registration barrier, 2.19 and later).
REGISTRATION_TIMEOUT = "wait_for_all_tasks_to_register"


def _registration_timed_out(w: WorkerObservation) -> bool:
    return w.error is not None and REGISTRATION_TIMEOUT in (w.error.message or "").lower()


def _gave_up_waiting(w: WorkerObservation) -> bool:
    """It died, or raised TensorFlow's report that a peer did not register."""
    return w.died or _registration_timed_out(w)


def late_start(f: Facts) -> Optional[Blame]:
    """A worker that started ``LATE_START`` s or more after the first, or
    never, or that entered strategy creation that much later than the first
    (or never, still in its own code), while every other worker ended in
    strategy creation waiting for the cluster to form: the late one is the
    cause, whatever the others raised or how they died (TensorFlow's
    registration barrier times out on them, not on it).

    The others may still be waiting (a hang) only for one that never came:
    one that came late is admitted by TensorFlow, so with everyone waiting
    still its lateness explains nothing (nor does a launcher's slow start,
    ``spawn``'s imports, say).  Any error but the registration's timeout
    (an address that does not resolve, say) or a ``TF_CONFIG`` that
    disagrees is better evidence, and leaves the blame to the rules that
    read it."""
    late = _lateness(f)
    on_time = [w for w in f.workers if w.index not in late]
    if not late or not on_time or f.config_issues \
            or any(phase(w) != protocol.STRATEGY_CREATING for w in on_time) \
            or any(w.error is not None and not _registration_timed_out(w) for w in on_time):
        return None
    if any(came for _, came in late.values()) and not all(map(_gave_up_waiting, on_time)):
        return None
    obs = f.obs
    waited = _waits(on_time, f"until the hang timeout ({obs.timeout:.1f}s without progress)"
                    if obs.ended_by == EndedBy.HANG else "until the run was ended")
    told = "; ".join(late[i][0] for i in sorted(late))
    return Blame(sorted(late), f"{told}: the others waited for it to join the cluster", None,
                 headline=f"{told}; {waited}")
