"""What the controller alone knows of a run's verdict: the fault plan set
against what happened, and which failures a restart cannot mend.

The diagnosis never reads the fault plan.  This module does, and gives the
diagnosis plain facts (a :class:`~harness.diagnosis.story.Story`): which
faults did not act and why (:func:`not_acted`, :func:`unreached_attempts`,
:func:`unreached_restarts`), and why a failure was not restarted
(:func:`certain_to_recur`).  The stages of :mod:`harness.diagnosis.stages`
make of them what the verdict says; this module only hands them over
(:func:`judge`, :func:`combine_attempts`).
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping, Optional, Sequence, Tuple

from harness import plan as plan_module
from harness.controller.phases import added
from harness.core import protocol
from harness.diagnosis import Verdict, conclude, diagnose
from harness.diagnosis.observations import RunObservation, WorkerObservation, error_of
from harness.diagnosis.story import (ATTEMPT_NEVER_RAN, BEFORE_FN, ENDED_FIRST, NOT_REACHED,
                                     RECURRING, RESTART_NEVER_CAME, NotActed, NotRestarted,
                                     Story)
from harness.faults import Fault
from harness.result import RunResult, WorkerResult


def _finished(w: WorkerObservation) -> bool:
    """Whether ``w`` finished on its own: returned, or exited 0 unasked, with no error."""
    return w.error is None and (w.returned or (w.exit_code == 0 and not w.killed_by_harness))


def not_acted(plan: Sequence[Fault], workers: Sequence[WorkerObservation],
              serving: Sequence[int] = ()) -> Tuple[NotActed, ...]:
    """The faults of ``plan`` that did not act in the attempt whose worker
    observations are ``workers``.  One whose worker finished on its own
    without reaching it never acted (NOT_REACHED: the run fails); one whose
    worker ended otherwise (raised, died, was stopped or killed when the
    run was decided) did not act because the run ended first (ENDED_FIRST).
    In a parameter-server cluster a server's (one of ``serving``) steps
    are its coordinator's: its fault is unreached when the coordinator
    (the chief, process 0) finished on its own without reaching the step."""
    found = []
    for f in plan:
        w = workers[f.worker]
        if not plan_module.acts_in_worker(f) or plan_module.acted(f, w.events):
            continue
        if f.worker in serving and _finished(workers[0]) \
                and not (w.died or w.error is not None):
            last = workers[0].steps[-1] if workers[0].steps else None
            found.append(NotActed(repr(f), f.worker, NOT_REACHED, f.step, f.attempt,
                                  last_step=last))
        elif _finished(w):
            found.append(NotActed(repr(f), f.worker, NOT_REACHED, f.step, f.attempt,
                                  last_step=w.steps[-1] if w.steps else None))
        else:
            found.append(NotActed(repr(f), f.worker, ENDED_FIRST, f.step, f.attempt))
    return tuple(found)


def unreached_attempts(plan: Iterable[Fault], ran: int) -> Tuple[NotActed, ...]:
    """The faults of ``plan`` planned for an attempt of the cluster past
    the ``ran`` that ran."""
    return tuple(NotActed(repr(f), f.worker, ATTEMPT_NEVER_RAN, getattr(f, "step", None),
                          f.attempt)
                 for f in plan if f.attempt >= ran)


def unreached_restarts(plan: Iterable[Fault], restarts: Mapping[int, int]) -> Tuple[NotActed, ...]:
    """The faults of ``plan`` planned for a restart of their task that never
    came (``restarts``: how many times each task was restarted)."""
    return tuple(NotActed(repr(f), f.worker, RESTART_NEVER_CAME, getattr(f, "step", None),
                          f.attempt, restarts=restarts.get(f.worker, 0))
                 for f in plan if f.attempt > restarts.get(f.worker, 0))


# Errors that every attempt raises again: the harness refusing a setting it
# was given, and fn or its arguments that cannot be unpickled.
RECURRING_ERRORS = ("SettingError", "SerializationError")


def certain_to_recur(workers: Sequence[WorkerObservation]) -> Optional[NotRestarted]:
    """Why a restart of the attempt whose workers are ``workers`` would fail
    the same way, or None when it may not.  Every attempt hands each worker
    the same bytes of ``fn`` and its arguments, the same settings and the
    same setup; only what ``fn`` does may differ.  So an error raised before
    ``fn`` ran (the worker never reported STARTED) recurs, and so does one
    of :data:`RECURRING_ERRORS`."""
    raised = [w for w in workers if w.error is not None]
    before = [w for w in raised if not any(e.kind == protocol.STARTED for e in w.events)]
    if before:
        return NotRestarted(BEFORE_FN, tuple(w.index for w in before),
                            error_of(before[0]).type_name)
    recurring = [w for w in raised if error_of(w).type_name in RECURRING_ERRORS]
    if recurring:
        return NotRestarted(RECURRING, tuple(w.index for w in recurring),
                            error_of(recurring[0]).type_name)
    return None


def judge(obs: RunObservation, story: Optional[Story] = None) -> Verdict:
    """The verdict on an attempt: the rules on what was observed, then the
    stages on what the controller knows of it (``story``; none by default)."""
    return conclude(diagnose(obs), obs, story or Story())


def attempt_story(obs: RunObservation, plan: Sequence[Fault],
                  history: Optional[Mapping[int, Sequence[WorkerResult]]] = None,
                  tasks_not_restarted: Mapping[int, NotRestarted] = {},
                  whole_plan: Sequence[Fault] = ()) -> Story:
    """What the controller knows of one attempt: the faults of ``plan`` (its
    workers' own) that did not act; under ``restart_policy="task"``, each
    task's ended processes (``history``), why some were not restarted, and
    the faults of ``whole_plan`` planned for a restart that never came."""
    history = history or {}
    restarted = tuple(r.observation for rs in history.values() for r in rs
                      if r.observation is not None)
    counts = {i: len(rs) for i, rs in history.items()}
    unreached = unreached_restarts(whole_plan, counts) if history else ()
    return Story(not_acted=not_acted(plan, obs.workers, obs.serving) + unreached, restarted=restarted,
                 tasks_not_restarted=tuple(tasks_not_restarted[i]
                                           for i in sorted(tasks_not_restarted)))


def combine_attempts(attempts: Sequence[RunResult], plan: Sequence[Fault],
                     total: float, not_restarted: Optional[NotRestarted] = None,
                     setup: Optional[Mapping[str, float]] = None) -> RunResult:
    """The result of a run from its attempts' results: the last attempt's,
    with every attempt kept and the run's stages applied (a fault planned
    for an attempt that never ran, why the last was not restarted, the
    story of the attempts).  ``setup``: the phases of the run outside its
    attempts, added to theirs."""
    last = attempts[-1]
    story = Story(not_acted=unreached_attempts(plan, len(attempts)),
                  attempts=tuple(a.verdict for a in attempts), not_restarted=not_restarted)
    return dataclasses.replace(last, verdict=conclude(last.verdict, last.observation, story),
                               duration=total, attempts=tuple(attempts),
                               phases=added([a.phases for a in attempts] + [setup or {}]))


def with_task_history(workers: Sequence[WorkerResult],
                      history: Mapping[int, Sequence[WorkerResult]]) -> Tuple[WorkerResult, ...]:
    """Each worker's result with its task's processes in ``attempts``
    (``restart_policy="task"``), the last one included."""
    return tuple(dataclasses.replace(w, attempts=tuple(history.get(w.index, ())) + (w,))
                 for w in workers)
