"""From observations to a run's result: the verdict, then the rule that a
fault which never acted fails the run, then the attempts put together.

A run that was asked for a fault and did not get it is not a pass: the
test would believe its job survives what never happened.  That rule is
:func:`fail_unacted`, the one place it is written; :func:`judge` applies it
to an attempt, :func:`combine_attempts` to faults of attempts that never ran.
Which failed attempts are not worth restarting is :func:`certain_to_recur`.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Tuple

from harness import faults as faults_module
from harness.core import protocol
from harness.diagnosis import Verdict, diagnose
from harness.diagnosis.observations import Outcome, RunObservation, WorkerObservation
from harness.faults import Fault
from harness.result import RunResult

# (the fault as it prints, why it never acted)
Unacted = Tuple[str, str]


def fail_unacted(outcome: str, text: str, never: Sequence[Unacted]) -> Tuple[str, str]:
    """The outcome and text of a run in which the faults ``never`` did not
    act: a completed or hung run (or one that crashed only at exit) fails,
    and the text says which first."""
    if not never:
        return outcome, text
    if outcome in (Outcome.COMPLETED, Outcome.HANG, Outcome.CRASHED_AT_EXIT):
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


# Errors that every attempt raises again: the harness refusing a setting it
# was given, and fn or its arguments that cannot be unpickled.
RECURRING_ERRORS = ("SettingError", "SerializationError")


def _who(workers: Sequence[WorkerObservation]) -> str:
    return (f"worker {workers[0].index}" if len(workers) == 1 else
            "workers " + ",".join(str(w.index) for w in workers))


def certain_to_recur(workers: Sequence[WorkerObservation]) -> Optional[str]:
    """Why a restart of the attempt whose workers are ``workers`` would fail
    the same way, or None when it may not.  Every attempt hands each worker
    the same bytes of ``fn`` and its arguments, the same settings and the
    same setup; only what ``fn`` does may differ.  So an error raised before
    ``fn`` ran (the worker never reported STARTED) recurs, and so does one
    of :data:`RECURRING_ERRORS`."""
    raised = [w for w in workers if w.error is not None]
    before = [w for w in raised if not any(e.kind == protocol.STARTED for e in w.events)]
    if before:
        return (f"{_who(before)} raised {before[0].error.type_name} before fn ran, and a "
                f"restart brings the same fn, arguments and setup")
    recurring = [w for w in raised if w.error.type_name in RECURRING_ERRORS]
    if recurring:
        return (f"{_who(recurring)} raised {recurring[0].error.type_name}, which every "
                f"attempt raises again")
    return None


def combine_attempts(attempts: Sequence[RunResult], plan: Sequence[Fault],
                     total: float, not_restarted: Optional[str] = None) -> RunResult:
    """The result of a run from its attempts' results: the last attempt's,
    with every attempt kept.  A fault planned for an attempt that never ran
    never acted, and a run with such a fault fails, as one whose worker
    never reached it does.  ``not_restarted``: why the last attempt was not
    restarted though restarts were left (:func:`certain_to_recur`)."""
    last = attempts[-1]
    ended = f"the run ended after attempt {len(attempts) - 1} ({last.outcome})"
    if not_restarted:
        ended += f", not restarted: {not_restarted}"
    unreached = tuple((repr(f), f"attempt {f.attempt} never ran: {ended}")
                      for f in plan if f.attempt >= len(attempts))
    never = tuple(x for a in attempts for x in a.faults_never_acted) + unreached
    outcome, text = fail_unacted(last.outcome, last.diagnosis, unreached)
    if not_restarted:
        text += f"\nnot restarted: {not_restarted}"
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
