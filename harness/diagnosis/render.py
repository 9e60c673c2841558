"""The verdict as text: a headline, then one line per group of workers in
the same state, then notes (injected faults, the root error).  What a person
reads first, so it is short: at most ``MAX_LINES`` lines of at most
``MAX_WIDTH`` characters.  A worker's line is shortened in its error text
(or where it waits) only: its ``<- culprit`` mark and its step tally are
what it is read for, and are never cut."""
from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from harness.core import protocol
from harness.diagnosis.observations import (EndedBy, Outcome, ReplicaCheck, RunObservation,
                                            WorkerObservation, error_of)
from harness.diagnosis import ledger
from harness.diagnosis.echoes import (error_text, exit_text, is_collective_mismatch, is_echo,
                                      is_restart_echo,
                                      short_type, tasks_named_unhealthy, telling_line)
from harness.diagnosis.data import data_lines
from harness.diagnosis.known import known_lines
from harness.diagnosis.facts import DIVERGED, Facts, reference_steps, state, where_stopped
from harness.diagnosis.order import order_lines
from harness.diagnosis.rules_links import link_lines
from harness.diagnosis.pasts import Sides
from harness.diagnosis.blame import Blame
from harness.diagnosis.deadlock import certain_deadlock
from harness.diagnosis.memory import memory_lines
from harness.diagnosis.rules_start import never_started
from harness.diagnosis.stacks import summarize_stack, where_raised
from harness.diagnosis.stragglers import straggler_lines
from harness.diagnosis.story import (ATTEMPT_NEVER_RAN, BEFORE_FN, NOT_REACHED, RECURRING,
                                     RESTART_NEVER_CAME, NotActed, NotRestarted, Story)
from harness.diagnosis.words import name, names, steps_text

if TYPE_CHECKING:
    from harness.diagnosis.verdict import Verdict

MAX_LINES = 40
MAX_WIDTH = 300
MAX_FAULTS_LISTED = 5


CULPRIT_MARK = "  <- culprit"


def worker_parts(w: WorkerObservation, ref: Sequence[int]) -> Tuple[str, str, str]:
    """What one worker did and where it stands, as ``(lead, detail, rest)``:
    ``blocked at step 9: `` + ``in call 10 of `step` (...)`` + ``; ran 10
    steps (0-9)``.  ``detail`` (TensorFlow's error text, or where it waits)
    is the one part that may be shortened."""
    now, tally = state(w), f"; ran {steps_text(w.steps, ref)}"
    if now == "raised":
        error, note = error_of(w), ""
        if is_echo(error):
            # The first line of "tasks are unhealthy" hides the task it names.
            named = sorted(set(tasks_named_unhealthy(error.message)) - {w.index})
            note = f" (echo, naming {names(named)})" if named else " (echo)"
        return f"raised {where_stopped(w)}: ", error_text(error), note + tally
    if now == "returned":
        if w.died_at_exit:
            return f"returned, then died at exit ({exit_text(w.exit_code)})", "", tally
        return "returned", "", tally
    if now == "died":
        return f"died ({exit_text(w.exit_code)}) {where_stopped(w)}", "", tally
    if now == "stopped":
        return f"stopped (SIGSTOP) {where_stopped(w)}, no stack", "", tally
    if never_started(w):
        return "never started (reported nothing)", "", tally
    where = summarize_stack(w.stack) if w.stack.strip() else ""
    where = where.replace(" (in strategy creation)", "")   # where_stopped says so already
    pending = ledger.describe_pending(w)
    if pending:   # the ledger knows better than "in a TensorFlow op"
        # An eager collective's call says the user's line itself.
        said = ledger.site_words(ledger.pending_call(w))
        where = where.split(" (in ", 1)[0] + f" {pending}" if where and not said else pending
    if not where:
        return f"blocked {where_stopped(w)}, no stack", "", tally
    return f"blocked {where_stopped(w)}: ", where, tally


def fit(lead: str, detail: str, rest: str, width: int = MAX_WIDTH) -> str:
    """``lead + detail + rest`` in ``width`` characters where it can be,
    shortening ``detail`` alone: ``lead`` and ``rest`` always stand whole."""
    room = width - len(lead) - len(rest)
    if len(detail) > room:
        detail = detail[:max(room - 3, 0)] + "..."
    return lead + detail + rest


def worker_line(w: WorkerObservation, ref: Sequence[int], mark: str = "",
                width: int = MAX_WIDTH) -> str:
    """One worker's state and tally (and ``mark``), e.g. ``blocked at step 9:
    ...; ran 10 steps (0-9)``, fitted to ``width`` by its detail alone."""
    lead, detail, rest = worker_parts(w, ref)
    return fit(lead, detail, rest + mark, width)


def worker_lines(ws: Sequence[WorkerObservation], culprits: Sequence[int]) -> List[str]:
    """One line per group of workers in the same state, culprits marked."""
    ref = reference_steps(ws)
    groups: Dict[Tuple[str, str, str], List[int]] = collections.defaultdict(list)
    for w in ws:
        lead, detail, rest = worker_parts(w, ref)
        groups[(lead, detail, rest + (CULPRIT_MARK if w.index in culprits else ""))].append(w.index)
    return [fit(f"  {names(idx)}: {lead}", detail, rest)
            for (lead, detail, rest), idx in groups.items()]


def own_line(w: WorkerObservation) -> str:
    """The line of the user's code where the worker is or last was: its
    eager collective's (the ledger's), else the one its error was raised
    at, else its stack's; "" when none is known."""
    site = ledger.user_line(w)
    if site:
        return site
    if w.error is not None and where_raised(w.error.traceback):
        return where_raised(w.error.traceback)[len(" at "):]
    where = summarize_stack(w.stack) if (w.stack or "").strip() else ""
    return "" if where.startswith(("no stack", "stack unreadable")) else where.split(" (", 1)[0]


def culprit_line_lines(ws: Sequence[WorkerObservation], culprits: Sequence[int],
                       raisers: Sequence[int]) -> List[str]:
    """The culprits' own lines, beside a root error raised elsewhere."""
    by_index = {w.index: w for w in ws}
    lines = [(i, own_line(by_index[i])) for i in culprits if i not in raisers and i in by_index]
    return [f"culprit's line: {name(i)} at {line}" for i, line in lines if line]


def error_lines(f: Facts, culprits: Sequence[int] = ()) -> List[str]:
    """The run's first error, said for what it is: a root error, a
    collective whose members disagree, or TensorFlow reporting a failure;
    where it was raised, as the worker that raised it saw it, and where
    the culprits were, when they are others."""
    errs = f.errors
    if not errs:
        return []
    first = error_of(errs[0])
    if is_collective_mismatch(first):
        what, where = error_text(first).split(". ", 1)[0], where_raised(first.traceback)
        seen_by = f" ({name(errs[0].index)}'s line)" if where else ""
        return [f"root error: {what}{where}{seen_by}, reported by "
                f"{names([w.index for w in f.mismatches])}: the members of a collective "
                f"disagree, and the error does not say which worker is wrong"] + \
            culprit_line_lines(f.obs.workers, culprits, [errs[0].index])
    if not is_echo(first):
        return [f"root error: {error_text(first)}{where_raised(first.traceback)}, raised by "
                f"{name(errs[0].index)}"] + culprit_line_lines(f.obs.workers, culprits,
                                                               [errs[0].index])
    return [("the errors are TensorFlow reporting the death" if f.outcome == Outcome.CRASHED else
             "no root error: every error is TensorFlow reporting a peer's failure")
            + f" (first: {first})"]


def ledger_lines(ws: Sequence[WorkerObservation]) -> List[str]:
    """What the collective ledgers add: who never launched the call a worker
    waits in, where the sequences of collectives part, what was not kept."""
    lines = []
    counts = {o.index: ledger.calls_by_name(o) for o in ws if ledger.has_ledger(o)}
    # Workers that wait in the same call for the same missing ones share a line.
    waiting: Dict[Tuple[str, Tuple[int, ...]], List[int]] = collections.defaultdict(list)
    for w in ws:
        pending = None if w.finished or w.died else ledger.pending_call(w)
        if pending is None:
            continue
        missing = ledger.never_launched(ws, w, counts)
        if missing:
            waiting[(ledger.describe_call(w, pending), tuple(missing))].append(w.index)
    for (call, absent), waiters in waiting.items():
        lines.append(f"ledger: {names(absent)} never launched {call}, which "
                     f"{names(waiters)} wait{'s' if len(waiters) == 1 else ''} in")
    parted = ledger.where_sequences_part(ws)
    if parted:
        lines.append(f"ledger: {parted}")
    notes = sorted({w.ledger_note for w in ws if w.ledger_note})
    lines += [f"note: {n}" for n in notes]
    return lines


def replica_lines(check: ReplicaCheck) -> List[str]:
    """What the replica check adds: that the replicas agree, or notes."""
    lines = [f"note: replica check: {n}" for n in check.notes]
    if check.divergence is None:
        counts = sorted(set(check.variables))
        lines.append(f"replicas: {counts[0] if len(counts) == 1 else counts} mirrored "
                     f"variables agree on every worker (tolerance {check.tolerance:g})"
                     if counts and counts != [0] else
                     "replicas: no mirrored variables to compare (none was created under "
                     "the strategy's scope)")
    return lines


def cut(line: str, width: int = MAX_WIDTH) -> str:
    """A line that is not a worker's, cut at its end to ``width``."""
    return line if len(line) <= width else line[:width - 3] + "..."


def deadlock_text(obs: RunObservation) -> str:
    """Why the ledgers prove the run can never complete."""
    # The run ended on this proof, so its stopped workers had been stopped long enough.
    proof = certain_deadlock(obs.workers, obs.duration, exit_on_return=obs.exit_on_return,
                             held={w.index: 0.0 for w in obs.workers if w.stopped})
    return str(proof) if proof is not None else "the ledgers prove it can never complete"


def headline(f: Facts, blame: Blame, culprits: Tuple[int, ...]) -> str:
    obs, outcome, errs = f.obs, f.outcome, f.errors
    who = f"culprit{'s' if len(culprits) > 1 else ''}: {names(culprits)}"
    reason = "ambiguous, see below" if blame.ambiguous else blame.reason
    if outcome == Outcome.COMPLETED:
        kind = "tasks" if obs.tasks else "workers"
        return f"COMPLETED: all {len(obs.workers)} {kind} returned in {obs.duration:.1f}s"
    if blame.headline:
        return f"{outcome.upper()}: {blame.headline}"
    if outcome == Outcome.HANG:
        causes: Dict[str, str] = {EndedBy.HANG: f"no progress for {obs.timeout:.1f}s",
                                  EndedBy.DEADLOCK: f"certain deadlock ({deadlock_text(obs)})"}
        cause = causes.get(obs.ended_by, "not every worker finished")
        return f"HANG: {cause}; {who} ({reason})"
    if outcome == Outcome.FAILED and errs:
        kinds = "/".join(sorted({short_type(error_of(w).type_name) for w in errs}))
        return f"FAILED: {names([w.index for w in errs])} raised {kinds}; {who} ({reason})"
    return f"{outcome.upper()}: {who} ({reason})"


def note_lines(f: Facts, culprits: Sequence[int] = (), ambiguous: bool = False) -> List[str]:
    """What follows the workers' lines: the ledgers, notes, the checks,
    the injected faults, and the run's first error."""
    obs, outcome, ws = f.obs, f.outcome, f.obs.workers
    lines = ledger_lines(ws) + data_lines(ws) if outcome != Outcome.COMPLETED else []
    if outcome != Outcome.COMPLETED:
        lines += order_lines(ws, untold_too=f.situation == DIVERGED)
    if outcome == Outcome.COMPLETED and len({w.steps for w in ws}) > 1:
        lines.append("note: the workers ran different steps")
    if outcome == Outcome.COMPLETED:
        lines += straggler_lines(obs)
    lines += memory_lines(obs)
    lines += link_lines(obs.links, obs.links_note, ambiguous)
    if outcome in (Outcome.COMPLETED, Outcome.CRASHED):   # else the config is the blame, said above
        lines += [f"note: TF_CONFIG of {names([i])}: {'; '.join(v)}"
                  for i, v in sorted(f.config_issues.items())]
    if obs.replicas is not None:
        lines += replica_lines(obs.replicas)
    if obs.reference is not None and not obs.reference.differs:
        lines.append(f"reference: matches the single-worker reference ({obs.reference.variables} "
                     f"variables and the return value, tolerance {obs.reference.tolerance:g})")
    faults = [(w.index, e) for w in ws for e in w.events if e.kind == protocol.FAULT]
    for i, e in faults[:MAX_FAULTS_LISTED]:
        at = f" at step {e.step}" if e.step is not None else ""
        lines.append(f"injected: {names([i])}{at}: {e.data}")
    if len(faults) > MAX_FAULTS_LISTED:
        lines.append(f"injected: ... and {len(faults) - MAX_FAULTS_LISTED} more")
    return lines + error_lines(f, culprits) + known_lines(ws)


# How an evaluator ended, by the outcome it gives a run whose training completed.
EVALUATOR_ENDED = {Outcome.CRASHED: "died", Outcome.FAILED: "raised",
                   Outcome.CRASHED_AT_EXIT: "died at exit", Outcome.HANG: "never returned"}


def evaluator_text(v: Verdict, obs: RunObservation, e: WorkerObservation,
                   trouble: Optional[Outcome], training: Sequence[int]) -> str:
    """The text of a run with an evaluator: the training tasks' verdict
    ``v`` with the evaluator's line, or, when they completed and the
    evaluator did not (``trouble``: the outcome it gives), the evaluator's
    own headline first."""
    line = f"  {name(e.index)} (outside the collectives): {worker_line(e, ())}"
    head, _, rest = v.text.partition("\n")
    known = "\n".join(cut(k) for k in known_lines([e]))
    if trouble is not None:
        head = (f"{trouble.upper()}: the evaluator {EVALUATOR_ENDED[trouble]}; the training "
                f"tasks ({names(training)}) completed")
        return "\n".join(filter(None, [head, line + CULPRIT_MARK, rest, known]))
    if v.outcome == Outcome.COMPLETED:
        head = f"COMPLETED: all {len(obs.workers)} tasks returned in {obs.duration:.1f}s"
    return "\n".join(filter(None, [head, rest, line, known]))


def render(f: Facts, blame: Blame, culprits: Tuple[int, ...]) -> str:
    lines = [cut(headline(f, blame, culprits))]
    if f.obs.ended_by == EndedBy.DEADLOCK and blame.headline:
        lines.append(cut(f"certain deadlock: {deadlock_text(f.obs)}"))
    if blame.ambiguous:
        lines.append(cut(f"ambiguous: {blame.reason}"))
    lines += worker_lines(f.obs.workers, culprits)
    lines += [cut(ln) for ln in note_lines(f, culprits, blame.ambiguous)]
    if len(lines) > MAX_LINES:
        lines = lines[:MAX_LINES - 1] + [f"... {len(lines) - MAX_LINES + 1} more lines"]
    return "\n".join(lines)


# -- what the stages add (harness.diagnosis.stages) ----------------------

AUTOMATIC_STEPS_HINT = ("use ctx.steps(), the Keras callback (ctx.keras_callback()), or "
                        "automatic steps (each call of a tf.function that launches collectives)")
WHY_MISSING = "a host lost, or its directory not gathered"


def why_not_acted(n: NotActed, story: Story) -> str:
    """Why the fault ``n`` did not act, for a person."""
    if n.why == NOT_REACHED:
        return (f"{name(n.worker)} never reached step {n.step}: "
                + (f"it reported no steps; {AUTOMATIC_STEPS_HINT}" if n.last_step is None
                   else f"its last step was {n.last_step}"))
    if n.why == ATTEMPT_NEVER_RAN:
        if not story.attempts:
            return f"attempt {n.attempt} never ran"
        ended = (f"the run ended after attempt {len(story.attempts) - 1} "
                 f"({story.attempts[-1].outcome})")
        if story.not_restarted is not None:
            ended += f", not restarted: {not_restarted_text(story.not_restarted)}"
        return f"attempt {n.attempt} never ran: {ended}"
    if n.why == RESTART_NEVER_CAME:
        return (f"{name(n.worker)} was restarted {n.restarts} times, so its attempt "
                f"{n.attempt} never ran")
    return "did not act (the run ended first)"


def never_acted_lines(never: Sequence[Tuple[str, str]]) -> List[str]:
    """The lines that open the text of a run failed by faults that never acted."""
    return [f"FAILED: {fault} never acted: {why}" for fault, why in never]


def ended_first_lines(ended: Sequence[NotActed], story: Story) -> List[str]:
    """Notes on the faults that did not act because the run ended first."""
    return [f"not acted: {n.fault}: {why_not_acted(n, story)}" for n in ended]


def not_restarted_text(nr: NotRestarted) -> str:
    """Why ``nr.workers`` were not started again."""
    if nr.why == BEFORE_FN:
        return (f"{names(nr.workers)} raised {nr.error} before fn ran, and a restart brings "
                f"the same fn, arguments and setup")
    if nr.why == RECURRING:
        return f"{names(nr.workers)} raised {nr.error}, which every attempt raises again"
    return f"{names(nr.workers)} used its {nr.restarts} restart{'s' if nr.restarts != 1 else ''}"


def ended_as(w: WorkerObservation) -> str:
    """How one ended process of a restarted task ended."""
    step = f" at step {w.last_step}" if w.last_step is not None else ""
    if w.error is not None:
        return (f"failed{step} with {short_type(w.error.type_name)}: "
                f"{telling_line(w.error.message)[:240]}")
    return f"crashed{step} ({exit_text(w.exit_code)})"


def task_failures(ended: Sequence[WorkerObservation]) -> Tuple[WorkerObservation, ...]:
    """The ended processes of restarted tasks that failed of their own
    cause: neither an echo (TensorFlow reporting a peer's failure) nor
    stopped by the harness to start again with the others."""
    return tuple(w for w in ended if not is_restart_echo(w.error) and not w.killed_by_harness)


def task_story(ended: Sequence[WorkerObservation]) -> str:
    """The restarts of ``restart_policy="task"``, in the order given: each
    task that failed of its own cause, then its echoes, told as such (and
    whether every task was restarted with them, as a process the harness
    stopped to start again shows)."""
    failures = task_failures(ended) or tuple(ended)
    told = [f"{name(w.index)} {ended_as(w)} and was restarted" for w in failures]
    echoes = [w for w in ended if is_restart_echo(w.error) and w not in failures]
    if echoes:
        together = any(w.killed_by_harness and w.error is None for w in ended)
        how = "every task restarted together" if together else "each restarted"
        told.append(f"then the echoes of {'that failure' if len(failures) == 1 else 'those'} "
                    f"({how}): " + "; ".join(f"{name(w.index)} {ended_as(w)}" for w in echoes))
    return "; ".join(told)


def task_restarts_text(v: Verdict, ended: Sequence[WorkerObservation],
                       not_restarted: Sequence[NotRestarted]) -> str:
    """``v``'s text with the task restarts told first (counted by the
    failures restarted: an echo's restart is its failure's) and the tasks
    not restarted noted after."""
    n = len(task_failures(ended) or ended)
    head = (f"{v.outcome.upper()} after {n} task restart"
            f"{'s' if n != 1 else ''}: {task_story(ended)}; then:\n" if ended else "")
    notes = "".join(f"\n{names(nr.workers)} not restarted: {not_restarted_text(nr)}"
                    for nr in sorted(not_restarted, key=lambda nr: nr.workers))
    return f"{head}{v.text}{notes}"


def attempts_text(v: Verdict, attempts: Sequence[Verdict]) -> str:
    """The text of a run with restarts: its story, the last attempt's
    verdict ``v``, then each earlier attempt's, last first."""
    n = len(attempts)
    story = ", ".join(f"attempt {k} {a.outcome.upper()}" for k, a in enumerate(attempts))
    parts = [f"{v.outcome.upper()} after {n - 1} restart{'s' if n > 2 else ''}: {story}",
             f"--- attempt {n - 1} (last) ---", v.text]
    for k in reversed(range(n - 1)):
        parts += [f"--- attempt {k} ---", attempts[k].text]
    return "\n".join(parts)


def unmarked(lines: str) -> str:
    """Workers' lines without the culprit's mark: for a verdict that now
    cannot tell."""
    return lines.replace(CULPRIT_MARK, "")


def restored_text(found: Sides) -> str:
    """``worker 0 restored ckpt-3; workers 1,2 restored nothing``."""
    return "; ".join(f"{names(side)} restored {checkpoint or 'nothing'}"
                     for checkpoint, side in found)


def cannot_tell_text(v: Verdict, why: str, candidates: Sequence[int], said_as: str,
                     more: Sequence[str] = ()) -> str:
    """``v``'s text told as "cannot tell" for ``why``: that headline, the
    ``more`` lines, ``v``'s own headline as what ``said_as`` says, and its
    workers' lines without the culprit's mark."""
    head, _, rest = v.text.partition("\n")
    return "\n".join([f"{v.outcome.upper()}: cannot tell who is to blame: {why}; candidates: "
                      f"{names(candidates)}", *more, f"  {said_as}: {head}"]
                     + ([unmarked(rest)] if rest else []))


def slow_link_text(v: Verdict, said: str, candidates: Sequence[int]) -> str:
    """``v``'s text, a verdict by progress alone, told as "cannot tell"
    because the links found another worker's end slow (``said``)."""
    return cannot_tell_text(v, "a slow link slows its peers' calls too, so the worker that did "
                            "not go on may be waiting on it", candidates, "without the links",
                            [said])


def pasts_text(v: Verdict, found: Sides, candidates: Sequence[int]) -> str:
    """``v``'s text, told as "cannot tell" because the workers resumed
    from the different pasts ``found``; a verdict that cannot tell already,
    naming every side, keeps its headline and gets what each restored."""
    head, _, rest = v.text.partition("\n")
    resumed = f"resumed from: {restored_text(found)}"
    if v.ambiguous and set(candidates) <= set(v.culprits):
        return "\n".join([head, resumed] + ([rest] if rest else []))
    return cannot_tell_text(v, "the workers resumed from different checkpoints, so they did "
                            "not do the same work, and those that agree are not right because "
                            "they agree", candidates, "without the pasts", [resumed])


def unseen_past_text(v: Verdict, found: Sides, candidates: Sequence[int]) -> str:
    """``v``'s text, a verdict that compared the workers' progress after a
    restart, told as "cannot tell": where each resumed is not seen beyond
    the checkpoints they restored (``found``)."""
    return cannot_tell_text(v, "after the restart the workers' progress is compared from where "
                            "each resumed, which nothing seen shows beyond the checkpoint it "
                            "restored", candidates, "comparing progress alone",
                            [f"resumed from: {restored_text(found)}"])


def race_text(v: Verdict, what: str, candidates: Sequence[int]) -> str:
    """``v``'s text, told as "cannot tell": the error it rests on is one
    a task raises for losing a race every task ran (``what`` it was)."""
    return cannot_tell_text(v, f"{what}, and which task raised is the race's chance, not its "
                            f"cause", candidates, "by the errors alone")


def shared_setting_text(v: Verdict, what: str, culprits: Sequence[int]) -> str:
    """``v``'s text, its culprits now every task: the error it rests on
    comes of a setting of the job every task shares (``what`` it is)."""
    head, _, rest = v.text.partition("\n")
    return "\n".join([f"{v.outcome.upper()}: no single task is at fault: {what}, a setting of "
                      f"the job every task shares; culprits: {names(culprits)}",
                      f"  by the errors alone: {head}"] + ([unmarked(rest)] if rest else []))


def missing_text(v: Verdict, missing: Sequence[int], candidates: Sequence[int]) -> str:
    """``v``'s text, the verdict on the workers that left files, told as
    "cannot tell" with the ``missing`` ones among the ``candidates``."""
    head, _, rest = v.text.partition("\n")
    what = "whether the job completed" if v.outcome == Outcome.COMPLETED else "who is to blame"
    lines = [f"{v.outcome.upper()}: cannot tell {what}: {names(missing)} left no files "
             f"({WHY_MISSING}), and what {'it' if len(missing) == 1 else 'they'} did could "
             f"overturn what the others' files show; candidates: {names(candidates)}",
             f"  from the others' files alone: {head}"]
    return "\n".join(lines + ([rest] if rest else []))
