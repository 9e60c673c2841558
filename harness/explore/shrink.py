"""Shrinking a failing plan: the simpler plans to try next, and the order
that says which of two plans is the simpler.

A plan is simpler when it has fewer faults, then (fault by fault, sorted)
a kind earlier in the kinds' table (:data:`harness.strategies.STEP_KINDS`),
an earlier attempt, an earlier step, a lower worker, a simpler setting (a
crash by ``exit``, a shorter pause, a pause that ends).  Every candidate
:func:`simpler` gives is below its plan in that order, so a shrink that
takes any candidate that still fails the same way ends.  Plain functions.
"""
from __future__ import annotations

import dataclasses
from typing import List, Sequence, Set, Tuple

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


def _simpler_faults(f: F.Fault, kinds: Sequence[str]) -> List[F.Fault]:
    out: List[F.Fault] = []
    if not isinstance(f, F.StepFault) or f.task is not None:
        return out
    kind = type(f).__name__
    for k in kinds:
        if k in STEP_KINDS and kind in STEP_KINDS and STEP_KINDS.index(k) < STEP_KINDS.index(kind):
            out.append(_plain(k, f))
    out += [dataclasses.replace(f, attempt=a) for a in _smaller(f.attempt)]
    out += [dataclasses.replace(f, step=s) for s in _smaller(f.step)]
    out += [dataclasses.replace(f, worker=w) for w in _smaller(f.worker)]
    if isinstance(f, F.Crash):
        out += [dataclasses.replace(f, how=h) for h in F.CRASH_HOW[:F.CRASH_HOW.index(f.how)]]
    if isinstance(f, (F.Pause, F.Delay)):
        shorter = [s for s in SHORT_SECONDS if f.seconds is None or s < f.seconds]
        out += [dataclasses.replace(f, seconds=s) for s in shorter]
    return out


def valid(plan: Sequence[F.Fault]) -> bool:
    """At most one fault per worker, step and attempt: which of two acts
    first would be a race."""
    places = [(f.worker, getattr(f, "step", None), f.attempt) for f in plan]
    return len(places) == len(set(places))


def simpler(plan: Sequence[F.Fault], kinds: Sequence[str] = STEP_KINDS) -> List[Plan]:
    """The plans one change simpler than ``plan``, the simplest first: one
    fault fewer; a fault of an earlier kind of ``kinds``, in an earlier
    attempt, at an earlier step (the first, half way, one before), at a
    lower worker, with a simpler setting."""
    plan = tuple(plan)
    out: Set[Plan] = set()
    if len(plan) > 1:
        out.update(plan[:i] + plan[i + 1:] for i in range(len(plan)))
    for i, f in enumerate(plan):
        out.update(plan[:i] + (g,) + plan[i + 1:] for g in _simpler_faults(f, kinds))
    below = order(plan)
    return sorted((p for p in out if valid(p) and order(p) < below), key=order)
