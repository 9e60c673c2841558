"""One verdict, made in one place: a result's outcome, culprits and text
are read from its verdict; what the controller knows beyond the
observation (a fault that never acted, restarts, attempts) reaches the
verdict only through the stages of ``harness.diagnosis.stages``, each
recorded; and no module outside ``harness/diagnosis/`` builds or changes
a ``Verdict``.  Properties over generated observations and plans: no
TensorFlow."""
import ast
import dataclasses
import pathlib

import pytest
from hypothesis import given, settings, strategies as st

from harness import faults as F
from harness.controller.outcome import (attempt_story, certain_to_recur, combine_attempts, judge,
                                        not_acted)
from harness.core import protocol
from harness.diagnosis import STAGES, Story, conclude, diagnose
from harness.diagnosis.observations import Event, Outcome, RunObservation
from harness.diagnosis.story import ENDED_FIRST, NOT_REACHED, NotActed
from harness.result import RunResult, WorkerResult
from observations import blocked, died, raised, returned, with_ledger

N = 3
ROOT = pathlib.Path(__file__).resolve().parents[2]
STAGE_NAMES = [s.name for s in STAGES]


@st.composite
def worker_observations(draw, index: int):
    steps = list(range(draw(st.integers(0, 8))))
    kind = draw(st.sampled_from(["returned", "blocked", "died", "raised", "ledger"]))
    if kind == "returned":
        w = returned(index, N, steps=steps)
    elif kind == "blocked":
        w = blocked(index, N, steps=steps)
    elif kind == "died":
        w = died(index, N, draw(st.sampled_from([1, -9, -11, 42])),
                 draw(st.floats(0.5, 9.0)), steps=steps)
    elif kind == "raised":
        w = raised(index, N, draw(st.sampled_from(["ValueError", "UnavailableError"])),
                   draw(st.sampled_from(["boom", "Socket closed"])), draw(st.floats(0.5, 9.0)),
                   steps=steps)
    else:
        w = with_ledger(blocked(index, N, steps=steps), blocked=draw(st.booleans()))
    if draw(st.booleans()):   # a fault reported as acted, or not
        fault = F.SkipStep(index, 2)
        w = dataclasses.replace(w, events=w.events + (Event(0.25, protocol.FAULT, 2, repr(fault)),))
    return w


@st.composite
def runs(draw):
    workers = tuple(draw(worker_observations(i)) for i in range(N))
    return RunObservation(num_workers=N, timeout=10.0, grace=5.0,
                          ended_by=draw(st.sampled_from(["all_finished", "hang",
                                                         "grace_expired", "deadlock"])),
                          duration=20.0, workers=workers)


plans = st.lists(st.builds(F.SkipStep, st.integers(0, N - 1), st.integers(0, 12),
                           attempt=st.integers(0, 1)), max_size=2)


def result_of(obs, plan, attempt=0, history=None) -> RunResult:
    story = attempt_story(obs, [f for f in plan if f.attempt == attempt], history, {}, plan)
    return RunResult(workers=tuple(WorkerResult(i, observation=w)
                                   for i, w in enumerate(obs.workers)),
                     duration=1.0, observation=obs, verdict=judge(obs, story), attempt=attempt)


def staged_in_order(r: RunResult) -> None:
    """The stages the verdict records are rows of the table, each once, in
    the table's order; and a run failed by a fault that never acted says
    so in its text."""
    stages = r.verdict.stages
    assert all(s in STAGE_NAMES for s in stages)
    assert sorted(stages, key=STAGE_NAMES.index) == list(stages) and len(set(stages)) == len(stages)
    for fault, why in r.faults_never_acted:
        assert f"{fault} never acted: {why}" in r.diagnosis
    if r.faults_never_acted:
        assert r.outcome in (Outcome.FAILED, Outcome.CRASHED)


@settings(max_examples=300, deadline=None)
@given(runs(), runs(), plans, st.booleans())
def test_what_the_controller_knows_reaches_the_verdict_through_recorded_stages(
        first, second, plan, restarted):
    attempts = [result_of(first, plan, 0)] + ([result_of(second, plan, 1)] if restarted else [])
    for a in attempts:
        staged_in_order(a)
        assert a.verdict.rule == diagnose(a.observation).rule   # the stages keep the rule
    combined = combine_attempts(attempts, plan, 2.0)
    staged_in_order(combined)
    assert ("attempts" in combined.verdict.stages) == restarted
    # Faults of attempt 1 with no attempt 1 never acted, and fail the run.
    if not restarted and any(f.attempt == 1 for f in plan):
        assert combined.outcome in (Outcome.FAILED, Outcome.CRASHED)
    # restart_policy="task": worker 1's first process ended and was restarted.
    history = {0: (), 1: (WorkerResult(1, observation=first.workers[1]),), 2: ()}
    task = result_of(second, plan, 0, history)
    staged_in_order(task)
    assert "task_restarts" in task.verdict.stages


def test_a_fault_never_reached_fails_a_completed_run_and_the_stage_is_recorded():
    obs = RunObservation(num_workers=2, timeout=10.0, grace=5.0, ended_by="all_finished",
                         duration=5.0, workers=(returned(0, 2), returned(1, 2)))
    plan = [F.Crash(1, 50), F.SkipStep(0, 3)]
    found = not_acted(plan, obs.workers)
    assert found == (NotActed(repr(plan[0]), 1, NOT_REACHED, 50, last_step=9),
                     NotActed(repr(plan[1]), 0, NOT_REACHED, 3, last_step=9))
    v = judge(obs, Story(not_acted=found))
    assert (v.outcome, v.stages, v.rule) == ("failed", ("fault_never_acted",), "nothing_to_blame")
    assert v.faults_never_acted[0] == (repr(plan[0]), "worker 1 never reached step 50: its "
                                                      "last step was 9")


def test_a_fault_whose_run_ended_first_is_noted_not_failed():
    obs = RunObservation(num_workers=2, timeout=10.0, grace=5.0, ended_by="all_finished",
                         duration=5.0, workers=(returned(0, 2), died(1, 2, 1, 3.0)))
    found = not_acted([F.Crash(1, 50)], obs.workers)
    assert [n.why for n in found] == [ENDED_FIRST]
    v = conclude(diagnose(obs), obs, Story(not_acted=found))
    assert v.outcome == diagnose(obs).outcome and v.stages == ("faults_ended_first",)
    assert v.text.endswith("not acted: Crash(worker=1, step=50, how='exit'): did not act "
                           "(the run ended first)")


def test_a_task_named_by_its_label_in_a_cluster_with_a_chief():
    """The phrases the stages add name tasks as the rest of the verdict does."""
    chief_dead = RunObservation(num_workers=2, timeout=10.0, grace=5.0, ended_by="all_finished",
                                duration=5.0, workers=(returned(0, 2), returned(1, 2)),
                                tasks=(("chief", 0), ("worker", 0)))
    v = judge(chief_dead, Story(not_acted=(NotActed("Crash(worker=0, step=50)", 0, NOT_REACHED,
                                                    50, last_step=9),)))
    assert "chief never reached step 50" in v.text
    early = raised(0, 2, "SerializationError", "x", 0.5, events=())
    assert certain_to_recur([early]).workers == (0,)


# -- only the diagnosis builds or changes a Verdict ---------------------------------

def verdict_edits(tree: ast.AST):
    """(line, what) for each place ``tree`` builds a Verdict, or replaces
    fields of one (``dataclasses.replace(x.verdict, ...)``, ``replace(verdict, ...)``)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
            node.func, "id", "")
        if called == "Verdict":
            yield node.lineno, "builds a Verdict"
        if called in ("replace", "__setattr__") and node.args:
            first = node.args[0]
            target = first.attr if isinstance(first, ast.Attribute) else getattr(first, "id", "")
            if "verdict" in target.lower() or target == "v":
                yield node.lineno, f"changes {ast.unparse(first)}"


def test_no_module_outside_the_diagnosis_builds_or_changes_a_verdict():
    found = []
    for path in sorted((ROOT / "harness").rglob("*.py")):
        if "diagnosis" in path.relative_to(ROOT / "harness").parts:
            continue
        for line, what in verdict_edits(ast.parse(path.read_text())):
            found.append(f"{path.relative_to(ROOT)}:{line} {what}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("source", [
    "Verdict('completed', (), 'x')",
    "dataclasses.replace(result.verdict, culprits=(1,))",
    "replace(verdict, text='y')",
    "object.__setattr__(verdict, 'text', 'y')",
])
def test_the_check_finds_a_verdict_built_or_changed(source):
    assert list(verdict_edits(ast.parse(source)))


def test_the_api_page_names_every_stage_in_the_tables_order():
    import re
    text = (ROOT / "docs" / "api.md").read_text()
    named = [n for n in re.findall(r"`(\w+)`", text) if n in STAGE_NAMES]
    assert list(dict.fromkeys(named)) == STAGE_NAMES
