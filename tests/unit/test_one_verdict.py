"""One verdict: whatever the controller adds to the rules' verdict (a fault
that never acted, the attempts of a run with restarts, a task restarted
first), a result's outcome, culprits and text are its verdict's.  A
property over generated observations and plans: no TensorFlow."""
import dataclasses

from hypothesis import given, settings, strategies as st

from harness import faults as F
from harness.controller.outcome import combine_attempts, judge, with_task_restarts
from harness.diagnosis import STAGES, Verdict, staged
from harness.diagnosis.observations import Event, RunObservation
from harness.core import protocol
from harness.result import RunResult, WorkerResult
from observations import blocked, died, events, raised, returned, with_ledger

N = 3


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


def result_of(obs, plan, attempt=0) -> RunResult:
    judged = judge(obs, [f for f in plan if f.attempt == attempt])
    return RunResult(outcome=judged.outcome, workers=tuple(WorkerResult(i) for i in range(N)),
                     culprits=judged.verdict.culprits, diagnosis=judged.text, duration=1.0,
                     observation=obs, verdict=judged.verdict, faults_never_acted=judged.never,
                     attempt=attempt)


def one_verdict(r: RunResult) -> None:
    v = r.verdict
    assert (r.outcome, tuple(r.culprits), r.diagnosis) == (v.outcome, v.culprits, v.text)
    assert all(stage in STAGES for stage in v.stages)


@settings(max_examples=300, deadline=None)
@given(runs(), runs(), plans, st.booleans())
def test_a_result_s_outcome_culprits_and_text_are_its_verdict_s(first, second, plan, restarted):
    attempts = [result_of(first, plan, 0)] + ([result_of(second, plan, 1)] if restarted else [])
    for a in attempts:
        one_verdict(a)
    one_verdict(combine_attempts(attempts, plan, 2.0))
    # restart_policy="task": worker 1's first process ended and was restarted.
    history = {1: (WorkerResult(1, exit_code=1, last_step=2, observation=first.workers[1]),)}
    one_verdict(with_task_restarts(attempts[0], history, {}, plan))


def test_a_stage_is_declared_and_recorded():
    v = Verdict("completed", (), "COMPLETED", rule="nothing_to_blame")
    failed = staged(v, "fault_never_acted", outcome="failed", text="FAILED: ...")
    assert (failed.outcome, failed.stages, failed.rule) == ("failed", ("fault_never_acted",),
                                                            "nothing_to_blame")
    try:
        staged(v, "something_else")
    except ValueError as e:
        assert "not a stage" in str(e)
    else:
        raise AssertionError("an undeclared stage was accepted")
