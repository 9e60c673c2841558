"""The stages after the rules, as a table: each is a small function of the
verdict, the observation and the :class:`~harness.diagnosis.story.Story`
(what the controller alone knows: the faults that did not act, the
restarts) that answers the changes it makes, or passes (None).  Every row
that answers applies, in the table's order, and the verdict records its
name (``Verdict.stages``), as it records the rule that decided.

A run's verdict is its attempt's (the rules, then these stages with the
attempt's story), then, for a run with restarts of the cluster, these
stages again with the run's story (the attempts, the faults of attempts
that never ran).  Each row reads only the story's part of its level, so a
row applies once whatever the level.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence, Tuple

from harness.diagnosis import known, pasts
from harness.diagnosis.render import (attempts_text, ended_first_lines, missing_text,
                                      never_acted_lines, not_restarted_text, pasts_text,
                                      race_text, shared_setting_text, slow_link_text,
                                      task_restarts_text,
                                      unseen_past_text, why_not_acted)
from harness.diagnosis.echoes import is_restart_echo
from harness.diagnosis.observations import Outcome, RunObservation, WorkerObservation
from harness.diagnosis.rules_links import slow_link_end, slow_link_line
from harness.diagnosis.story import (ATTEMPT_NEVER_RAN, NOT_REACHED, RESTART_NEVER_CAME,
                                     NotActed, Story)
from harness.diagnosis.verdict import Verdict
from harness.diagnosis.words import task_labels

Changes = Optional[dict]


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    change: Callable[[Verdict, RunObservation, Story], Changes]


def _failed_by(v: Verdict, story: Story, never: Sequence[NotActed]) -> Changes:
    """A run that asked for the faults ``never`` and did not get them fails
    when it completed, hung or crashed only at exit, and the text says
    which first: the test would believe its job survives what never
    happened."""
    if not never:
        return None
    pairs = tuple((n.fault, why_not_acted(n, story)) for n in never)
    failed = v.outcome in (Outcome.COMPLETED, Outcome.HANG, Outcome.CRASHED_AT_EXIT)
    return dict(outcome=Outcome.FAILED if failed else v.outcome,
                text="\n".join(never_acted_lines(pairs) + [v.text]),
                faults_never_acted=v.faults_never_acted + pairs)


def fault_never_acted(v: Verdict, obs: RunObservation, story: Story) -> Changes:
    """A fault whose worker finished without reaching it, or whose task's
    restart never came."""
    return _failed_by(v, story, [n for n in story.not_acted
                                 if n.why in (NOT_REACHED, RESTART_NEVER_CAME)])


def attempt_never_ran(v: Verdict, obs: RunObservation, story: Story) -> Changes:
    """A fault planned for an attempt of the cluster that never ran."""
    return _failed_by(v, story, [n for n in story.not_acted if n.why == ATTEMPT_NEVER_RAN])


def faults_ended_first(v: Verdict, obs: RunObservation, story: Story) -> Changes:
    """A fault whose step never came because the run ended first is noted."""
    ended = [n for n in story.not_acted if not n.fails_the_run]
    if not ended:
        return None
    return dict(text="\n".join([v.text] + ended_first_lines(ended, story)))


def restart_order(ended: Sequence[WorkerObservation]) -> Tuple[WorkerObservation, ...]:
    """The ended processes of restarted tasks, a process that ended of its
    own cause before those that reported a peer's failure (an echo), then
    by time: the parent hears of the two within a millisecond, in either
    order."""
    def when(w: WorkerObservation):
        t = w.finish_time if w.error is not None else w.exit_time
        return is_restart_echo(w.error), t if t is not None else 0.0
    return tuple(sorted(ended, key=when))


def task_restarts(v: Verdict, obs: RunObservation, story: Story) -> Changes:
    """Under ``restart_policy="task"``, the restarts are told first, and
    the tasks that failed and were not restarted noted after."""
    if not story.restarted and not story.tasks_not_restarted:
        return None
    return dict(text=task_restarts_text(v, restart_order(story.restarted),
                                               story.tasks_not_restarted))


def own_cause(v: Verdict, obs: RunObservation) -> Optional[int]:
    """The one worker ``v`` names, when it raised an error of its own (not
    TensorFlow reporting a peer's failure or restart); else None."""
    if v.ambiguous or len(v.culprits) != 1:
        return None
    error = obs.workers[v.culprits[0]].error
    return None if error is None or is_restart_echo(error) else v.culprits[0]


def task_restart(v: Verdict, obs: RunObservation, story: Story) -> Changes:
    """A run that did not complete after a task restart is blamed on the
    task restarted first: what the others did after is what its failure and
    its restart led to, unless the verdict names one worker by an error of
    its own."""
    if not story.restarted or v.outcome == Outcome.COMPLETED or own_cause(v, obs) is not None:
        return None
    first = restart_order(story.restarted)[0]
    return dict(culprits=(first.index,), ambiguous=False, step=first.last_step)


def resumed(obs: RunObservation, story: Story) -> Tuple[WorkerObservation, ...]:
    """The training tasks whose processes resumed from a past of their
    own choosing: under ``restart_policy="task"``, the restarted ones (a
    task never restarted goes on from where its process is); else all."""
    training = obs.training
    if not story.restarted:
        return training
    return tuple(w for w in training if story.restarts_of(w.index) > 0)


def direct_evidence(v: Verdict, obs: RunObservation) -> bool:
    """``v`` names one worker by what that worker itself did: an error of
    its own, or its death."""
    return own_cause(v, obs) is not None or (
        len(v.culprits) == 1 and obs.workers[v.culprits[0]].died)


# The rules that compare the workers' progress (who went on longest, who
# agrees with whom): evidence only among workers that started alike.
PROGRESS_RULES = frozenset({"left_early", "collective_counts", "majority", "behind", "split"})


def different_pasts(v: Verdict, obs: RunObservation, story: Story) -> Changes:
    """Workers that resumed from different checkpoints (one restored
    ckpt-3, another nothing) did not do the same work: a verdict that
    rests on which of them agree, or on who went on longest, is no
    evidence.  Unless it names one worker by its own error or death, it
    becomes "cannot tell", naming every side; either way the text says
    what each restored.  After a restart of the cluster, workers that
    restored alike may still have resumed at different points (a position
    kept outside the checkpoint), so a verdict of the rules comparing
    progress cannot tell there either."""
    ws = resumed(obs, story)
    # A parameter-server cluster's servers restore nothing and run no job:
    # its verdict reads how they ended, not what the tasks did alike.
    if v.outcome == Outcome.COMPLETED or direct_evidence(v, obs) or obs.serving:
        return None
    if not pasts.differ(ws):
        # Under task restarts the stages of the restarted tasks tell it.
        restarted_all = len(story.attempts) > 1 and not story.restarted
        if not restarted_all or v.rule not in PROGRESS_RULES or v.ambiguous:
            return None
        candidates = tuple(sorted({w.index for w in ws} | set(v.culprits)))
        return dict(culprits=candidates, ambiguous=True,
                    text=unseen_past_text(v, pasts.sides(ws), candidates))
    found = pasts.sides(ws)
    candidates = tuple(sorted({i for _, side in found for i in side} | set(v.culprits)))
    if "\nresumed from: " in v.text:   # told at the attempt's level already
        return None
    return dict(culprits=candidates, ambiguous=True, text=pasts_text(v, found, candidates))


def shared_cause(v: Verdict, obs: RunObservation, story: Story) -> Changes:
    """An error whose known cause every task shares names whoever raised
    it, not who is at fault: a race every task ran (saving to one file:
    the lock went to another) makes the verdict "cannot tell", every
    training task a candidate; the job's own setting (fewer files than
    workers) makes every training task the culprit."""
    training = obs.training
    row = known.shared_cause(training)
    if v.outcome == Outcome.COMPLETED or row is None or len(training) < 2 or obs.serving:
        return None   # a parameter-server cluster's job runs on its chief alone
    every = tuple(w.index for w in training)
    if row.shared == "race":
        if v.ambiguous:
            return None
        return dict(culprits=every, ambiguous=True, text=race_text(v, row.what, every))
    if set(v.culprits) == set(every) and not v.ambiguous:
        return None
    return dict(culprits=every, ambiguous=False, text=shared_setting_text(v, row.what, every))


def slow_link(v: Verdict, obs: RunObservation, story: Story) -> Changes:
    """A run that did not complete, whose verdict names a worker by
    progress alone (it did not go on), while the links tried as it ended
    found another worker's every round trip slow: the slow link slows its
    peers' calls too, so the verdict cannot tell, the slow end a candidate.
    A worker named by its own error or death keeps the blame."""
    if v.outcome == Outcome.COMPLETED or v.rule not in PROGRESS_RULES or not obs.links \
            or direct_evidence(v, obs):
        return None
    end = slow_link_end(obs.links, len(obs.workers))
    if end is None or end in v.culprits:
        return None
    candidates = tuple(sorted(set(v.culprits) | {end}))
    return dict(culprits=candidates, ambiguous=True,
                text=slow_link_text(v, slow_link_line(obs.links, end), candidates))


def not_restarted(v: Verdict, obs: RunObservation, story: Story) -> Changes:
    """Why the last attempt was not started again though restarts were left."""
    if story.not_restarted is None:
        return None
    return dict(text=f"{v.text}\nnot restarted: {not_restarted_text(story.not_restarted)}")


def attempts(v: Verdict, obs: RunObservation, story: Story) -> Changes:
    """A run with restarts of the cluster: the last attempt's verdict, told
    after the story of every attempt and before theirs; the faults that
    never acted in any attempt kept."""
    if len(story.attempts) < 2:
        return None
    earlier = tuple(pair for a in story.attempts[:-1] for pair in a.faults_never_acted)
    return dict(text=attempts_text(v, story.attempts),
                faults_never_acted=earlier + v.faults_never_acted)


def missing_workers(v: Verdict, obs: RunObservation, story: Story) -> Changes:
    """A recorded job some of whose workers left no files: the verdict on
    the others, in the job's numbering, widened to "cannot tell" with the
    missing ones among the candidates.  What they did could overturn what
    the others' files show; a confident wrong culprit is the worst answer."""
    if not story.missing:
        return None
    positions = story.positions or tuple(range(len(obs.workers)))
    candidates = tuple(sorted({positions[c] for c in v.culprits} | set(story.missing)))
    with task_labels(None):   # the job's own numbering, not the observation's
        text = missing_text(v, story.missing, candidates)
    return dict(culprits=candidates, ambiguous=True, text=text)


STAGES: Tuple[Stage, ...] = (
    Stage("fault_never_acted", fault_never_acted),
    Stage("faults_ended_first", faults_ended_first),
    Stage("task_restarts", task_restarts),
    Stage("task_restart", task_restart),
    Stage("different_pasts", different_pasts),
    Stage("shared_cause", shared_cause),
    Stage("slow_link", slow_link),
    Stage("attempt_never_ran", attempt_never_ran),
    Stage("not_restarted", not_restarted),
    Stage("attempts", attempts),
    Stage("missing_workers", missing_workers),
)

STAGE = {stage.name: stage for stage in STAGES}


def conclude(v: Verdict, obs: RunObservation, story: Story) -> Verdict:
    """``v`` once every stage of :data:`STAGES` that answers to ``story``
    has changed it, in order, each recorded in ``v.stages``."""
    with task_labels(obs.labels()):
        for stage in STAGES:
            changes = stage.change(v, obs, story)
            if changes is None:
                continue
            if "culprits" in changes:
                changes["culprits"] = tuple(sorted(set(changes["culprits"])))
            v = dataclasses.replace(v, stages=v.stages + (stage.name,), **changes)
    return v
