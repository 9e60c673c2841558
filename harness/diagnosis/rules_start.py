"""The blame rule for a worker that started late, or never: what a cluster
manager's scheduling does to a job (a pod Pending, a node slow to come up).
See :mod:`harness.diagnosis.rules`.

It reads when each worker's process was seen to start (its first report,
``started``), as a pod's start time tells it in production: a worker that
reported nothing at all, and neither finished nor died, never started.
"""
from __future__ import annotations

from typing import List, Optional

from harness.core import protocol
from harness.diagnosis.blame import Blame
from harness.diagnosis.echoes import exit_text, short_type
from harness.diagnosis.facts import Facts, phase
from harness.diagnosis.observations import WorkerObservation
from harness.diagnosis.words import names

# A worker that starts this many seconds after the first one is late: far
# above the spread of a forkserver's forks (0.1-0.2 s for 4 workers on 2
# busy cores, measured), far below any wait TensorFlow gives up after.
LATE_START = 2.0


def started_at(w: WorkerObservation) -> Optional[float]:
    """When the worker reported that it started (None: it never did)."""
    return next((e.time for e in w.events if e.kind == protocol.STARTED), None)


def never_started(w: WorkerObservation) -> bool:
    """It reported nothing at all, and neither finished nor died: its
    process never ran (the harness ended it, or it waits still)."""
    return not w.events and not w.finished and not w.died


def _first_event(w: WorkerObservation, kind: str) -> Optional[float]:
    return next((e.time for e in w.events if e.kind == kind), None)


def _gave_up(w: WorkerObservation) -> str:
    """How an on-time worker's wait in strategy creation ended, and when
    (seconds since it entered it)."""
    began = _first_event(w, protocol.STRATEGY_CREATING) or 0.0
    if w.error is not None and w.finish_time is not None:
        return f"after {w.finish_time - began:.1f}s ({short_type(w.error.type_name)})"
    if w.died and w.exit_time is not None:
        return f"after {w.exit_time - began:.1f}s and died ({exit_text(w.exit_code)})"
    return "until the run was ended"


def _late(f: Facts) -> List[WorkerObservation]:
    starts = [t for t in map(started_at, f.workers) if t is not None]
    if not starts:
        return []
    first = min(starts)
    return [w for w in f.workers if never_started(w)
            or (started_at(w) is not None and started_at(w) - first > LATE_START)]


def late_start(f: Facts) -> Optional[Blame]:
    """A worker that started ``LATE_START`` s or more after the first, or
    never, while every other worker ended in strategy creation (waiting for
    the cluster to form: raised there, died there, or still blocked): the
    late one is the cause, whatever the others raised or how they died
    (TensorFlow's registration barrier times out on them, not on it)."""
    late = _late(f)
    on_time = [w for w in f.workers if w not in late]
    if not late or not on_time or any(phase(w) != protocol.STRATEGY_CREATING for w in on_time):
        return None
    first = min(started_at(w) for w in on_time)
    told = []
    for w in late:
        start = started_at(w)
        told.append(f"{names([w.index])} never started" if start is None
                    else f"{names([w.index])} started {start - first:.1f}s late")
    ways = {}
    for w in on_time:
        ways.setdefault(_gave_up(w), []).append(w.index)
    waited = "; ".join(
        f"{names(idx)} {'waited' if how.startswith('until') else 'gave up'} in strategy "
        f"creation {how}" for how, idx in ways.items())
    why = ("; ".join(told) + ": the others waited for it to join the cluster")
    return Blame([w.index for w in late], why, None, headline="; ".join(told) + "; " + waited)
