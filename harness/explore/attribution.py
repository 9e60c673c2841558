"""How a run's diagnosis stands against the faults that were injected: a
plain function of the result and the plan, used by ``explore``'s
``detected`` property and by the accuracy benchmark
(``python -m harness.bench.accuracy``).

The truth is the workers whose faults acted (a fault after the one that
stopped the run never acts).  A verdict that names exactly those workers,
or some of them, is :attr:`Attribution.NAMED`; one that says "cannot tell"
with one of them among its candidates is :attr:`Attribution.CANNOT_TELL`;
anything else that did not complete (a sole culprit no fault acted in,
candidates without the truth, no culprit at all) is
:attr:`Attribution.WRONG`: the worst answer, a confident wrong culprit, is
among those.  A run that completed survived its faults: nothing to name.
"""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Dict, FrozenSet, Iterable, List, Sequence, Tuple

from harness import plan as plan_module
from harness.diagnosis.observations import Event, Outcome
from harness.faults import Fault

if TYPE_CHECKING:
    from harness.result import RunResult


class Attribution(str, enum.Enum):
    NAMED = "named"               # the culprits are faulted workers, decided
    CANNOT_TELL = "cannot tell"   # ambiguous, a faulted worker among the candidates
    WRONG = "wrong"               # a culprit no fault acted in, or none named
    SURVIVED = "survived"         # the run completed: nothing to name
    NOT_ACTED = "never acted"     # no fault acted: the plan proved nothing

    def __str__(self) -> str:
        return self.value


def _results(result: RunResult) -> Tuple[RunResult, ...]:
    return tuple(result.attempts) or (result,)


def acted(result: RunResult, plan: Iterable[Fault]) -> Tuple[Fault, ...]:
    """The faults of ``plan`` that acted in ``result``: in any of its
    attempts, in any process of a restarted task (:func:`harness.plan.acted`
    on each one's events)."""
    events: Dict[int, List[Event]] = {}
    for attempt in _results(result):
        for w in attempt.workers:
            for process in tuple(w.attempts) or (w,):
                if process.observation is not None:
                    events.setdefault(w.index, []).extend(process.observation.events)
    return tuple(f for f in plan if plan_module.acted(f, events.get(f.worker, ())))


def truth(result: RunResult, plan: Iterable[Fault]) -> FrozenSet[int]:
    """The workers (indexes in the collectives) whose faults acted."""
    return frozenset(f.worker for f in acted(result, plan))


def attribute(result: RunResult, plan: Sequence[Fault]) -> Attribution:
    """Where ``result``'s verdict stands against ``plan``: see the module docstring."""
    faulted = truth(result, plan)
    if not faulted:
        return Attribution.NOT_ACTED
    if result.outcome == Outcome.COMPLETED:
        return Attribution.SURVIVED
    culprits = set(result.culprits)
    ambiguous = result.ambiguous
    if not culprits:
        return Attribution.WRONG
    if ambiguous:
        return Attribution.CANNOT_TELL if culprits & faulted else Attribution.WRONG
    return Attribution.NAMED if culprits <= faulted else Attribution.WRONG
