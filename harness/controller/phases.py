"""Where a run's time went: its phases, in seconds (``RunResult.phases``).

The parent's own steps are timed where they run (:class:`Clock`); what the
workers did between the launch and the verdict is read from their events
(:func:`worker_phases`), on the run's clock.  The phases, in order:

``request``
    checking ``run()``'s arguments and pickling ``fn`` with them;
``setup``
    the workers' ports, the run's network and scratch directory;
``launch``
    asking the backend for the processes (forks of the forkserver);
``start``
    until every worker was set up and about to call ``fn``;
``strategy``
    until every worker that makes an MWMS strategy had it (TensorFlow's
    cluster start-up, the first collective);
``steps``
    until the last step any worker began (or, with no steps, the first
    worker's end, or else the last progress seen): ``fn``'s own work;
``wait: ...``
    from there to the moment the run was decided, named by what it waited
    for: ``finish`` (the workers' returns), ``TensorFlow's failure
    detection`` (until a worker ended badly, and then, where every worker
    ended, until TensorFlow failed its peers: heartbeats, collective
    time-outs), ``grace`` (from the first worker that ended badly, while
    its peers stayed blocked), ``hang timeout`` (no progress for
    ``timeout`` seconds), ``deadlock proof`` (the ledgers proved it);
``stacks``
    the stacks of the workers still running, when the run did not complete;
``teardown``
    every process of the attempt gone;
``diagnosis``
    the verdict and the results;
``cleanup``
    the run's directory and network removed.

A run with restarts adds its attempts' phases up.
"""
from __future__ import annotations

import time
from typing import Dict, Mapping, Optional, Sequence

from harness.core import protocol
from harness.diagnosis.observations import EndedBy, RunObservation, WorkerObservation

ORDER = ("request", "setup", "launch", "start", "strategy", "steps", "wait: finish",
         "wait: TensorFlow's failure detection", "wait: grace", "wait: hang timeout",
         "wait: deadlock proof", "stacks", "links", "teardown", "diagnosis", "cleanup")

DETECTION = "wait: TensorFlow's failure detection"
WAITS: Dict[str, str] = {
    EndedBy.HANG: "wait: hang timeout",
    EndedBy.DEADLOCK: "wait: deadlock proof",
}


class Clock:
    """Adds the time between successive :meth:`mark` calls to named phases
    (:meth:`skip` leaves an interval out)."""

    def __init__(self) -> None:
        self.phases: Dict[str, float] = {}
        self.last = time.monotonic()

    def mark(self, phase: str) -> float:
        """The time since the last mark goes to ``phase``; returns now."""
        now = time.monotonic()
        self.add(phase, now - self.last)
        self.last = now
        return now

    def skip(self) -> float:
        """The time since the last mark goes to no phase (another clock
        accounts for it); returns now."""
        self.last = time.monotonic()
        return self.last

    def add(self, phase: str, seconds: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + max(0.0, seconds)


def _first(w: WorkerObservation, kind: str) -> Optional[float]:
    return next((e.time for e in w.events if e.kind == kind), None)


def _ended(w: WorkerObservation) -> Optional[float]:
    """When the worker's ``fn`` ended or its process died, on the run's clock."""
    times = [t for t in (w.finish_time, w.exit_time) if t is not None]
    return min(times) if times else None


def _bad(w: WorkerObservation) -> bool:
    return w.error is not None or (w.exit_code is not None and not w.returned)


def worker_phases(obs: RunObservation) -> Dict[str, float]:
    """``start``, ``strategy``, ``steps`` and the waits: the run's
    ``duration`` (from the launch's end to the verdict) cut at the last
    worker's start, the last strategy made, the last step begun and, where
    the grace ran out, the first worker that ended badly."""
    end = obs.duration
    workers = obs.workers
    started = [_first(w, protocol.STARTED) for w in workers]
    start = max((t for t in started if t is not None), default=0.0)
    made = [t for t in (_first(w, protocol.STRATEGY_CREATED) for w in workers) if t is not None]
    strategy = max([start] + made)
    stepped = [e.time for w in workers for e in w.events if e.kind == protocol.STEP]
    ended = [t for t in (_ended(w) for w in workers) if t is not None]
    # Without steps, the work ends where the first worker ended, or where
    # the last progress was seen (the hang timer's start).
    work_end = max(stepped) if stepped else min(ended, default=obs.last_progress_time)
    cuts = [min(start, end), min(max(strategy, start), end)]
    cuts.append(min(max(work_end, cuts[-1]), end))
    phases = {"start": cuts[0], "strategy": cuts[1] - cuts[0], "steps": cuts[2] - cuts[1]}
    bad = [t for t in (_ended(w) for w in workers if _bad(w)) if t is not None]
    detected = min(max(min(bad, default=cuts[2]), cuts[2]), end)
    if obs.ended_by == EndedBy.GRACE_EXPIRED:
        phases[DETECTION] = detected - cuts[2]
        phases["wait: grace"] = end - detected
    elif obs.ended_by in WAITS:
        phases[WAITS[obs.ended_by]] = end - cuts[2]
    else:
        phases[DETECTION if bad else "wait: finish"] = end - cuts[2]
    return phases


def added(parts: Sequence[Mapping[str, float]]) -> Dict[str, float]:
    """The phases of several attempts (or runs), added up, in :data:`ORDER`."""
    total: Dict[str, float] = {}
    for part in parts:
        for name, seconds in part.items():
            total[name] = total.get(name, 0.0) + seconds
    return ordered(total)


def ordered(phases: Mapping[str, float]) -> Dict[str, float]:
    """``phases`` in :data:`ORDER` (any other name last)."""
    rank = {name: i for i, name in enumerate(ORDER)}
    return {k: phases[k] for k in sorted(phases, key=lambda k: rank.get(k, len(ORDER)))}


def render(phases: Mapping[str, float]) -> str:
    """``launch 0.02 s, start 0.05 s, ...``: the phases that took any time."""
    return ", ".join(f"{name} {seconds:.2f} s" for name, seconds in ordered(phases).items()
                     if seconds >= 0.005)
