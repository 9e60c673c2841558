"""From observations to a run's result: the verdict, then the rule that a
fault which never acted fails the run, then the attempts put together.

A run that was asked for a fault and did not get it is not a pass: the
test would believe its job survives what never happened.  That rule is
:func:`fail_unacted`, the one place it is written; :func:`judge` applies it
to an attempt, :func:`combine_attempts` to faults of attempts that never ran.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence, Tuple

from harness import faults as faults_module
from harness.diagnosis import Verdict, diagnose
from harness.diagnosis.observations import Outcome, RunObservation
from harness.faults import Fault
from harness.result import RunResult

# (the fault as it prints, why it never acted)
Unacted = Tuple[str, str]


def fail_unacted(outcome: str, text: str, never: Sequence[Unacted]) -> Tuple[str, str]:
    """The outcome and text of a run in which the faults ``never`` did not
    act: a completed or hung run fails, and the text says which first."""
    if not never:
        return outcome, text
    if outcome in (Outcome.COMPLETED, Outcome.HANG):
        outcome = Outcome.FAILED
    return outcome, "\n".join([f"FAILED: {f} never acted: {why}" for f, why in never] + [text])


@dataclasses.dataclass(frozen=True)
class Judgement:
    """An attempt's verdict, and its outcome and text once unacted faults count."""

    verdict: Verdict
    outcome: str
    text: str
    never: Tuple[Unacted, ...]


def judge(obs: RunObservation, plan: Sequence[Fault]) -> Judgement:
    """The verdict on an attempt with fault ``plan``; a fault that acted too
    late to matter (the run ended first) is noted after the text."""
    verdict = diagnose(obs)
    never, ended_first = faults_module.not_acted(plan, obs.workers)
    never = tuple((repr(f), why) for f, why in never)
    outcome, text = fail_unacted(verdict.outcome, verdict.text, never)
    text += "".join(f"\nnot acted: {f!r}: {why}" for f, why in ended_first)
    return Judgement(verdict, outcome, text, never)


def combine_attempts(attempts: Sequence[RunResult], plan: Sequence[Fault],
                     total: float) -> RunResult:
    """The result of a run from its attempts' results: the last attempt's,
    with every attempt kept.  A fault planned for an attempt that never ran
    never acted, and a run with such a fault fails, as one whose worker
    never reached it does."""
    last = attempts[-1]
    unreached = tuple((repr(f), f"attempt {f.attempt} never ran: the run ended after attempt "
                                f"{len(attempts) - 1} ({last.outcome})")
                      for f in plan if f.attempt >= len(attempts))
    never = tuple(x for a in attempts for x in a.faults_never_acted) + unreached
    outcome, text = fail_unacted(last.outcome, last.diagnosis, unreached)
    if len(attempts) > 1:
        story = ", ".join(f"attempt {a.attempt} {a.outcome.upper()}" for a in attempts)
        parts = [f"{outcome.upper()} after {len(attempts) - 1} restart"
                 f"{'s' if len(attempts) > 2 else ''}: {story}",
                 f"--- attempt {last.attempt} (last) ---", text]
        for a in reversed(attempts[:-1]):
            parts += [f"--- attempt {a.attempt} ---", a.diagnosis]
        text = "\n".join(parts)
    return dataclasses.replace(last, outcome=outcome, diagnosis=text, duration=total,
                               faults_never_acted=never, attempts=tuple(attempts))
