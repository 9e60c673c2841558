"""The verdict as text: a headline, then one line per group of workers in
the same state, then notes (injected faults, the root error).  What a person
reads first, so it is short: at most ``MAX_LINES`` lines of at most
``MAX_WIDTH`` characters."""
from __future__ import annotations

import collections
from typing import Dict, List, Sequence, Tuple

from harness.core import protocol
from harness.diagnosis.observations import EndedBy, Outcome, WorkerObservation
from harness.diagnosis import ledger
from harness.diagnosis.echoes import exit_text, is_echo, short_type, tasks_named
from harness.diagnosis.facts import Facts, reference_steps, state, where_stopped
from harness.diagnosis.blame import Blame
from harness.diagnosis.stacks import summarize_stack, where_raised
from harness.diagnosis.words import names, steps_text

MAX_LINES = 40
MAX_WIDTH = 300
MAX_FAULTS_LISTED = 5


def worker_line(w: WorkerObservation, ref: Sequence[int]) -> str:
    """What one worker did and where it stands, e.g. ``blocked at step 9: ...; ran 10 steps (0-9)``."""
    now = state(w)
    if now == "raised":
        text = f"raised {where_stopped(w)}: {w.error}"
        if is_echo(w.error):
            # The first line of "tasks are unhealthy" hides the task it names.
            named = sorted(set(tasks_named(w.error.message)) - {w.index})
            text += f" (echo, naming {names(named)})" if named else " (echo)"
    elif now == "returned":
        text = "returned"
    elif now == "died":
        text = f"died ({exit_text(w.exit_code)}) {where_stopped(w)}"
    elif now == "stopped":
        text = f"stopped (SIGSTOP) {where_stopped(w)}, no stack"
    else:
        where = summarize_stack(w.stack) if w.stack.strip() else ""
        where = where.replace(" (in strategy creation)", "")   # where_stopped says so already
        pending = ledger.describe_pending(w)
        if pending:   # the ledger knows better than "in a TensorFlow op"
            where = where.split(" (in ", 1)[0] + f" {pending}" if where else pending
        text = f"blocked {where_stopped(w)}" + (f": {where}" if where else ", no stack")
    return f"{text}; ran {steps_text(w.steps, ref)}"


def ledger_lines(ws: Sequence[WorkerObservation]) -> List[str]:
    """What the collective ledgers add: who never launched the call a worker
    waits in, where the sequences of collectives part, what was not kept."""
    lines = []
    for w in ws:
        if w.finished or w.died or ledger.pending_call(w) is None:
            continue
        missing = ledger.never_launched(ws, w)
        if missing:
            call = ledger.describe_call(w, ledger.pending_call(w))
            lines.append(f"ledger: {names(missing)} never launched {call}, which "
                         f"{names([w.index])} waits in")
    parted = ledger.where_sequences_part(ws)
    if parted:
        lines.append(f"ledger: {parted}")
    notes = sorted({w.ledger_note for w in ws if w.ledger_note})
    lines += [f"note: {n}" for n in notes]
    return lines


def replica_lines(check) -> List[str]:
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


def render(f: Facts, blame: Blame, culprits: Tuple[int, ...]) -> str:
    obs, outcome, issues, errs = f.obs, f.outcome, f.config_issues, f.errors
    ws = obs.workers
    who = f"culprit{'s' if len(culprits) > 1 else ''}: {names(culprits)}"
    reason = "ambiguous, see below" if blame.ambiguous else blame.reason
    if outcome == Outcome.COMPLETED:
        head = f"COMPLETED: all {len(ws)} workers returned in {obs.duration:.1f}s"
    elif blame.headline:
        head = f"{outcome.upper()}: {blame.headline}"
    elif outcome == Outcome.HANG:
        cause = (f"no progress for {obs.timeout:.1f}s" if obs.ended_by == EndedBy.HANG
                 else "not every worker finished")
        head = f"HANG: {cause}; {who} ({reason})"
    elif outcome == Outcome.FAILED and errs:
        kinds = "/".join(sorted({short_type(w.error.type_name) for w in errs}))
        head = f"FAILED: {names([w.index for w in errs])} raised {kinds}; {who} ({reason})"
    else:
        head = f"{outcome.upper()}: {who} ({reason})"
    lines = [head]
    if blame.ambiguous:
        lines.append(f"ambiguous: {blame.reason}")
    ref = reference_steps(ws)
    groups: Dict[str, List[int]] = collections.defaultdict(list)
    for w in ws:
        mark = "  <- culprit" if w.index in culprits else ""
        groups[worker_line(w, ref) + mark].append(w.index)
    lines += [f"  {names(idx)}: {text}" for text, idx in groups.items()]
    if outcome != Outcome.COMPLETED:
        lines += ledger_lines(ws)
    if outcome == Outcome.COMPLETED and len({w.steps for w in ws}) > 1:
        lines.append("note: the workers ran different steps")
    if outcome in (Outcome.COMPLETED, Outcome.CRASHED):   # else the config is the blame, said above
        lines += [f"note: TF_CONFIG of {names([i])}: {'; '.join(v)}"
                  for i, v in sorted(issues.items())]
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
    if errs and not is_echo(errs[0].error):
        lines.append(f"root error: {errs[0].error}{where_raised(errs[0].error.traceback)}")
    elif errs:
        lines.append(("the errors are TensorFlow reporting the death" if outcome == Outcome.CRASHED else
                      "no root error: every error is TensorFlow reporting a peer's failure")
                     + f" (first: {errs[0].error})")
    lines = [ln if len(ln) <= MAX_WIDTH else ln[:MAX_WIDTH - 3] + "..." for ln in lines]
    if len(lines) > MAX_LINES:
        lines = lines[:MAX_LINES - 1] + [f"... {len(lines) - MAX_LINES + 1} more lines"]
    return "\n".join(lines)
