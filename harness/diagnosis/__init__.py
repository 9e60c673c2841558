"""Explain a finished MWMS run from what the parent observed: a pure function.

:func:`diagnose` reads a :class:`~harness.diagnosis.observations.RunObservation` and nothing
else (no fault plan, no TensorFlow, no clock, no I/O), so every rule can be
tested on hand-built or recorded runs.  It works in four parts:

* :mod:`.facts`: what the rules need, worked out once (outcome, steps,
  phases, ``TF_CONFIG`` issues from :mod:`.configs`, root errors, collective
  mismatches and echoes from :mod:`.echoes`, stacks from :mod:`.stacks`);
* :mod:`.rules`: the table of blame rules (the functions of the
  ``rules_*`` modules); the first that applies and answers wins, and the
  verdict names it (``Verdict.rule``);
* :mod:`.render`: the text a person reads first;
* :mod:`.stages`: the table of what the harness alone knows, applied after
  the rules by :func:`conclude` (a fault that never acted, the restarts,
  the attempts of a run), from a :class:`~.story.Story` the controller
  gives; the verdict records each stage that changed it (``Verdict.stages``).

Only this package makes or changes a :class:`Verdict`
(``tests/unit/test_one_verdict.py`` holds the rest of the tree to that).
Its inputs are :mod:`.observations` and :mod:`.story`.  It may import
:mod:`harness.core` and :mod:`harness.errors` only: no TensorFlow, no
clock, no I/O.

Outcome, by strict precedence: ``crashed`` if any worker died (ended without
returning or raising, not by the harness's hand); else ``failed`` if any
raised; else ``hang`` if the run ended by the hang detector, or the
ledgers proved it can never complete (:mod:`.deadlock`), or a worker never
returned; else ``failed`` if the replica check found the workers' models
differ (error ``ReplicaDivergence``), or their collectives reduce the same
tensors in another order (``CollectiveOrderDivergence``, :mod:`.order`), or
the run differs from its single-worker reference (``ReferenceMismatch``); else ``crashed_at_exit`` if
a worker's process died after it returned (every worker returned: training
completed); else ``completed``.  ``fault`` events are never used for blame;
the text lists them as "injected".  ``Verdict.step`` is the step where the
others wait for the culprit when they wait for it, else the culprit's last
step.

A cluster with an evaluator is judged in two parts: the training tasks
alone, by the rules; then, when they completed, the evaluator, whose
failure, crash or hang is then the verdict (``Verdict.rule`` is
``"evaluator_only"``, the one name outside ``RULES``).

A parameter-server cluster is judged by its own table of rules
(:mod:`.coordinated`): the chief runs the job, the rest serve.
"""
from __future__ import annotations

import dataclasses

from harness.diagnosis.coordinated import RULES as COORDINATED_RULES
from harness.diagnosis.coordinated import coordinated_verdict, is_coordinated
from harness.diagnosis.observations import OUTCOMES, EndedBy, Outcome, RunObservation, error_of
from harness.diagnosis.echoes import is_echo, short_type
from harness.diagnosis.facts import facts_of
from harness.diagnosis.render import evaluator_text, render
from harness.diagnosis.words import task_labels
from harness.diagnosis.rules import RULE, RULES, Blame, Rule, first_blame
from harness.diagnosis.stacks import summarize_stack
from harness.diagnosis.stages import STAGES, Stage, conclude
from harness.diagnosis.story import NotActed, NotRestarted, Story
from harness.diagnosis.verdict import Verdict

__all__ = ["diagnose", "conclude", "Verdict", "OUTCOMES", "RULES", "Rule", "Blame", "STAGES",
           "Stage", "Story", "NotActed", "NotRestarted", "is_echo", "summarize_stack",
           "RULE_NAMES"]


# Every name ``Verdict.rule`` can hold: the table's, the evaluator's part,
# and a parameter-server cluster's table.
RULE_NAMES = frozenset({r.name for r in RULES} | {"evaluator_only"}
                       | {name for name, _ in COORDINATED_RULES})


def diagnose(obs: RunObservation) -> Verdict:
    """The outcome of a run, who is to blame, and a text a person reads first.

    In a cluster with a chief, the tasks are named as their ``TF_CONFIG``
    names them.  An evaluator is outside the collectives: the training
    tasks are judged without it, so it is never the culprit of what
    happens in them; when they completed and only the evaluator failed,
    crashed or hung, the verdict is its own."""
    with task_labels(obs.labels()):
        if is_coordinated(obs):
            return coordinated_verdict(obs)
        if obs.evaluator is None:
            return _verdict(obs)
        return _with_evaluator(obs, obs.evaluator)


def _with_evaluator(obs: RunObservation, ev: int) -> Verdict:
    e = obs.workers[ev]
    training = tuple(w for w in obs.workers if w.index != ev)
    all_done = all(w.returned and w.error is None and not w.died for w in training)
    part = dataclasses.replace(
        obs, workers=training, num_workers=len(training),
        tasks=tuple(t for i, t in enumerate(obs.tasks) if i != ev),
        ended_by=EndedBy.ALL_FINISHED if all_done else obs.ended_by)
    v = _verdict(part)
    trouble = None if v.outcome != Outcome.COMPLETED else (
        Outcome.CRASHED if e.died else Outcome.FAILED if e.error is not None
        else Outcome.CRASHED_AT_EXIT if e.died_at_exit
        else None if e.returned else Outcome.HANG)
    text = evaluator_text(v, obs, e, trouble, [w.index for w in training])
    if trouble is None:
        return dataclasses.replace(v, text=text)
    error = short_type(e.error.type_name) if e.error is not None else None
    return Verdict(trouble, (ev,), text, e.last_step, error, False, "evaluator_only")


def _verdict(obs: RunObservation) -> Verdict:
    f = facts_of(obs)
    rule, blame = first_blame(f)
    culprits = tuple(sorted(set(blame.culprits)))
    # The run's error: the first cause when it failed, or when a crash was
    # blamed on a worker that raised before the deaths.
    errs = f.errors
    error = None
    if errs and (f.outcome == Outcome.FAILED or (f.outcome == Outcome.CRASHED and errs[0].index in culprits
                                           and not is_echo(errs[0].error))):
        error = short_type(error_of(errs[0]).type_name)
    else:
        error = RULE[rule].error
    return Verdict(f.outcome, culprits, render(f, blame, culprits), blame.step, error,
                   blame.ambiguous, rule)
