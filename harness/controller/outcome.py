"""From observations to a run's result: the verdict, then the rule that a
fault which never acted fails the run, then the attempts put together.

A run that was asked for a fault and did not get it is not a pass: the
test would believe its job survives what never happened.  That rule is
:func:`fail_unacted`, the one place it is written; :func:`judge` applies it
to an attempt, :func:`combine_attempts` to faults of attempts that never ran.
Which failed attempts are not worth restarting is :func:`certain_to_recur`;
an attempt whose tasks were restarted one by one (``restart_policy="task"``)
tells their story through :func:`with_task_restarts`.
"""
from __future__ import annotations

import dataclasses
import re
from typing import List, Mapping, Optional, Sequence, Tuple

from harness.controller.phases import added
from harness.core import protocol
from harness.diagnosis import Verdict, diagnose, staged
from harness.diagnosis.echoes import exit_text, is_echo, short_type
from harness.diagnosis.observations import Outcome, RunObservation, WorkerObservation
from harness.faults import Fault, StepFault
from harness.result import RunResult, WorkerResult

# (the fault as it prints, why it never acted)
Unacted = Tuple[str, str]

AUTOMATIC_STEPS_HINT = ("use ctx.steps(), the Keras callback (ctx.keras_callback()), or "
                        "automatic steps (each call of a tf.function that launches collectives)")


def not_acted(plan: Sequence[Fault], workers) -> Tuple[List[Tuple[Fault, str]],
                                                      List[Tuple[Fault, str]]]:
    """The faults of ``plan`` that never acted in the run whose worker
    observations are ``workers``: ``(never, ended_first)``, each a list of
    (fault, why).  A fault acted when its worker reported it (its printed
    form is what the record keeps).  One whose worker finished on its own
    (returned, or exited 0) without reaching it *never* acted: the run asked
    for a fault and did not get it, which is a failure of the run.  One
    whose worker ended otherwise (raised, died, was stopped or killed when
    the run was decided) did not act because the run ended first: listed,
    not a failure."""
    never, ended_first = [], []
    for f in plan:
        if not isinstance(f, StepFault):
            continue   # a TF_CONFIG fault acts before the worker starts
        w = workers[f.worker]
        if any(e.kind == "fault" and e.data == repr(f) for e in w.events):
            continue
        if (w.returned and w.error is None) or (w.exit_code == 0 and not w.killed_by_harness
                                                and w.error is None):
            why = (f"worker {f.worker} never reached step {f.step}: "
                   + (f"it reported no steps; {AUTOMATIC_STEPS_HINT}" if not w.steps
                      else f"its last step was {w.steps[-1]}"))
            never.append((f, why))
        else:
            ended_first.append((f, "did not act (the run ended first)"))
    return never, ended_first


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
    never, ended_first = not_acted(plan, obs.workers)
    never = tuple((repr(f), why) for f, why in never)
    outcome, text = fail_unacted(verdict.outcome, verdict.text, never)
    text += "".join(f"\nnot acted: {f!r}: {why}" for f, why in ended_first)
    if never:
        verdict = staged(verdict, "fault_never_acted", outcome=outcome, text=text)
    else:
        verdict = dataclasses.replace(verdict, text=text)
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
                     total: float, not_restarted: Optional[str] = None,
                     setup: Optional[Mapping[str, float]] = None) -> RunResult:
    """The result of a run from its attempts' results: the last attempt's,
    with every attempt kept.  A fault planned for an attempt that never ran
    never acted, and a run with such a fault fails, as one whose worker
    never reached it does.  ``not_restarted``: why the last attempt was not
    restarted though restarts were left (:func:`certain_to_recur`).  ``setup``:
    the phases of the run outside its attempts, added to theirs."""
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
    verdict = last.verdict
    if verdict is not None and unreached:
        verdict = staged(verdict, "fault_never_acted", outcome=outcome, text=text)
    if verdict is not None and (len(attempts) > 1 or not_restarted):
        verdict = staged(verdict, "attempts", outcome=outcome, text=text)
    return dataclasses.replace(last, outcome=outcome, diagnosis=text, duration=total,
                               faults_never_acted=never, attempts=tuple(attempts),
                               verdict=verdict,
                               phases=added([a.phases for a in attempts] + [setup or {}]))


# Lines of a TensorFlow error message that say nothing of their own.
_NOT_TELLING = ("Graph execution error", "Detected at node", "File ", "[[", "The error could")
# The op TensorFlow names before an eager collective's message.
_FUNCTION_NODE = re.compile(r"\{\{function_node [^}]*\}\}")


def telling_line(message: str) -> str:
    """The first line of an error message that says what went wrong
    (TensorFlow's often opens with "Graph execution error:")."""
    lines = [_FUNCTION_NODE.sub("", l).strip() for l in (message or "").strip().splitlines()]
    lines = [l for l in lines if l]
    for line in lines:
        if not line.startswith(_NOT_TELLING) and not line.endswith(":"):
            return line
    return lines[0] if lines else ""


def _ended_as(w: WorkerResult) -> str:
    """How one ended process of a restarted task ended, for the story."""
    step = f" at step {w.last_step}" if w.last_step is not None else ""
    if w.exception is not None:
        return (f"failed{step} with {short_type(w.exception.type_name)}: "
                f"{telling_line(w.exception.message)[:240]}")
    return f"crashed{step} ({exit_text(w.exit_code)})"


def task_story(history: Mapping[int, Sequence[WorkerResult]]) -> Tuple[str, Tuple[int, ...]]:
    """The restarts of ``restart_policy="task"`` (each task's ended
    processes, ``history``), and the tasks restarted, first first.  A
    process that ended of its own cause comes before those that reported a
    peer's failure (an echo: :mod:`harness.diagnosis.echoes`), whatever the
    order the parent heard of them in: the two arrive within a millisecond."""
    def when(w: WorkerResult):
        seen = w.observation
        t = (seen.finish_time if seen.error is not None else seen.exit_time) if seen else None
        return is_echo(w.exception), t if t is not None else 0.0

    ended = sorted((w for ws in history.values() for w in ws), key=when)
    story = "; ".join(f"worker {w.index} {_ended_as(w)} and was restarted" for w in ended)
    order = tuple(dict.fromkeys(w.index for w in ended))
    return story, order


def own_cause(result: RunResult) -> Optional[int]:
    """The one worker the verdict names, when it raised an error of its own
    (not TensorFlow reporting a peer's failure or restart); else None."""
    if result.verdict is None or result.verdict.ambiguous or len(result.culprits) != 1:
        return None
    error = result.workers[result.culprits[0]].exception
    return None if error is None or is_echo(error) else result.culprits[0]


def with_task_restarts(result: RunResult, history: Mapping[int, Sequence[WorkerResult]],
                       not_restarted: Mapping[int, str], plan: Sequence[Fault]) -> RunResult:
    """An attempt's result under ``restart_policy="task"``: each task's
    processes in ``workers[i].attempts``, and, when a task was restarted,
    the story first.  A run that did not complete after a restart is blamed
    on the task restarted first: what the others did after is what its
    failure and its restart led to, unless the last processes' verdict
    names one worker by an error of its own (:func:`own_cause`).  A fault
    planned for a restart that never came never acted."""
    workers = tuple(dataclasses.replace(w, attempts=tuple(history.get(w.index, ())) + (w,))
                    for w in result.workers)
    story, order = task_story(history)
    unreached = tuple((repr(f), f"worker {f.worker} was restarted "
                                f"{len(history.get(f.worker, ()))} times, so its attempt "
                                f"{f.attempt} never ran")
                      for f in plan if f.attempt > len(history.get(f.worker, ())))
    outcome, text = fail_unacted(result.outcome, result.diagnosis, unreached)
    verdict, culprits = result.verdict, result.culprits
    if verdict is not None and unreached:
        verdict = staged(verdict, "fault_never_acted", outcome=outcome, text=text)
    if not order and not not_restarted:
        return dataclasses.replace(result, workers=workers, outcome=outcome, diagnosis=text,
                                   verdict=verdict,
                                   faults_never_acted=result.faults_never_acted + unreached)
    restarts = sum(len(ws) for ws in history.values())
    head = (f"{outcome.upper()} after {restarts} task restart{'s' if restarts != 1 else ''}: "
            f"{story}; then:\n" if order else "")
    notes = "".join(f"\nworker {i} not restarted: {why}" for i, why in sorted(not_restarted.items()))
    text = f"{head}{text}{notes}"
    if order and outcome != Outcome.COMPLETED and own_cause(result) is None:
        first = history[order[0]][0]
        culprits = (order[0],)
        if verdict is not None:
            verdict = staged(verdict, "task_restart", outcome=outcome, culprits=culprits,
                             ambiguous=False, step=first.last_step, text=text)
    elif verdict is not None:
        verdict = dataclasses.replace(verdict, outcome=outcome, text=text)
    return dataclasses.replace(result, workers=workers, outcome=outcome, culprits=culprits,
                               verdict=verdict, diagnosis=text,
                               faults_never_acted=result.faults_never_acted + unreached)
