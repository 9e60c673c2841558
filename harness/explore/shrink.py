"""Shrinking a failing plan: the simpler plans to try next, and the order
that says which of two plans is the simpler.

A plan is simpler when it has fewer faults, then (fault by fault, sorted)
a kind earlier in the kinds' table (:data:`harness.strategies.STEP_KINDS`),
an earlier attempt, an earlier step, a lower worker, a simpler setting (a
crash by ``exit``, a shorter pause, a pause that ends).  Every candidate
:func:`simpler` gives is below its plan in that order, so a shrink that
takes any candidate that still fails the same way ends.

The candidates come in the order of the moves most likely to keep a
failure: a fault fewer, an earlier attempt, an earlier step, a simpler
setting, a lower worker, and last another kind (a crash that breaks a
job's recovery is rarely a preemption's failure too).  Plain functions.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Sequence, Tuple

from harness import faults as F
from harness.strategies import SHORT_SECONDS, STEP_KINDS

Plan = Tuple[F.Fault, ...]


def _setting_rank(f: F.Fault) -> float:
    if isinstance(f, F.Crash):
        return F.CRASH_HOW.index(f.how) if f.how in F.CRASH_HOW else len(F.CRASH_HOW)
    if isinstance(f, (F.Pause, F.Delay)):
        return float("inf") if f.seconds is None else f.seconds
    return 0


def fault_key(f: F.Fault) -> tuple:
    kind = type(f).__name__
    rank = STEP_KINDS.index(kind) if kind in STEP_KINDS else len(STEP_KINDS)
    return (rank, f.attempt, getattr(f, "step", 0), f.worker, _setting_rank(f))


def order(plan: Sequence[F.Fault]) -> tuple:
    """The sort key of a plan: smaller is simpler."""
    return (len(plan), tuple(sorted(fault_key(f) for f in plan)))


def _plain(kind: str, f: F.StepFault) -> F.Fault:
    """A fault of ``kind`` where ``f`` acts, with the kind's simplest setting."""
    cls = getattr(F, kind)
    extra = {"Delay": (SHORT_SECONDS[0],), "Pause": (SHORT_SECONDS[0],)}.get(kind, ())
    return cls(f.worker, f.step, *extra, attempt=f.attempt)


def _smaller(value: int) -> List[int]:
    return sorted({v for v in (0, value // 2, value - 1) if 0 <= v < value})


# Each move's rank: the lower, the sooner it is tried.
FEWER, ATTEMPT, STEP, SETTING, WORKER, KIND = range(6)


def _simpler_faults(f: F.Fault, kinds: Sequence[str]) -> List[Tuple[int, F.Fault]]:
    """The faults one move simpler than ``f``, each with its move's rank."""
    out: List[Tuple[int, F.Fault]] = []
    if not isinstance(f, F.StepFault) or f.task is not None:
        return out
    kind = type(f).__name__
    for k in kinds:
        if k in STEP_KINDS and kind in STEP_KINDS and STEP_KINDS.index(k) < STEP_KINDS.index(kind):
            out.append((KIND, _plain(k, f)))
    out += [(ATTEMPT, dataclasses.replace(f, attempt=a)) for a in _smaller(f.attempt)]
    out += [(STEP, dataclasses.replace(f, step=s)) for s in _smaller(f.step)]
    out += [(WORKER, dataclasses.replace(f, worker=w)) for w in _smaller(f.worker)]
    if isinstance(f, F.Crash):
        out += [(SETTING, dataclasses.replace(f, how=h))
                for h in F.CRASH_HOW[:F.CRASH_HOW.index(f.how)]]
    if isinstance(f, (F.Pause, F.Delay)):
        shorter = [s for s in SHORT_SECONDS if f.seconds is None or s < f.seconds]
        out += [(SETTING, dataclasses.replace(f, seconds=s)) for s in shorter]
    return out


def valid(plan: Sequence[F.Fault]) -> bool:
    """At most one fault per worker, step and attempt: which of two acts
    first would be a race."""
    places = [(f.worker, getattr(f, "step", None), f.attempt) for f in plan]
    return len(places) == len(set(places))


def simpler(plan: Sequence[F.Fault], kinds: Sequence[str] = STEP_KINDS) -> List[Plan]:
    """The plans one change simpler than ``plan``, by move (see the module
    docstring), the simplest first within a move: one fault fewer; a fault
    in an earlier attempt, at an earlier step (the first, half way, one
    before), with a simpler setting, at a lower worker, of an earlier kind
    of ``kinds``.  Each plan once, at its cheapest move."""
    plan = tuple(plan)
    rank: Dict[Plan, int] = {}
    moves = [(FEWER, plan[:i] + plan[i + 1:]) for i in range(len(plan))] if len(plan) > 1 else []
    for i, f in enumerate(plan):
        moves += [(r, plan[:i] + (g,) + plan[i + 1:]) for r, g in _simpler_faults(f, kinds)]
    below = order(plan)
    for r, p in moves:
        if valid(p) and order(p) < below:
            rank[p] = min(r, rank.get(p, r))
    return sorted(rank, key=lambda p: (rank[p], order(p)))
