"""explore on real TensorFlow workers: a recovery bug that shows only when
a crash falls on some steps is found, shrunk, and its printed line replays
it; a fixed job breaks nothing; the diagnosis holds over the standard
workload."""
import json
import os

import pytest

import harness
from harness import faults as F
from harness import faults_text
from harness.errors import ExplorationFailed
from harness.workloads import variable_loop

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("no_leftover_workers"),
              pytest.mark.mwms(workers=2, timeout=20)]

STEPS = 6


def resumable(fixed=False, n=STEPS):
    """Adds step + 1 to a mirrored total at each step and resumes after a
    restart from what it saved in ``run_dir``.  Broken: the total is saved
    at every step, the next step only every second one, so a crash after
    an even step repeats it; fixed: both together, every step."""
    import tensorflow as tf
    ctx = harness.context()
    path = os.path.join(ctx.run_dir, f"state-{ctx.index}.json")
    state = {"next": 0, "total": 0.0}
    if os.path.exists(path):
        with open(path) as f:
            state.update(json.load(f))
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        total = tf.Variable(state["total"])

    @tf.function
    def step(k):
        def add():
            ctx_ = tf.distribute.get_replica_context()
            total.assign_add(ctx_.all_reduce("sum", k + 1.0) / ctx_.num_replicas_in_sync)
        strategy.run(add)

    for s in ctx.steps(n):
        if s < state["next"]:
            continue
        step(tf.constant(float(s)))
        saved = {"total": float(total.numpy())}
        if fixed or s % 2 == 1:
            saved["next"] = s + 1
        with open(path + ".tmp", "w") as f:
            json.dump({**state, **saved}, f)
        os.replace(path + ".tmp", path)
        state.update(saved)
    return float(total.numpy())


def each_step_once(result):
    want = sum(range(1, STEPS + 1))
    got = [w.return_value for w in result.workers]
    assert got == [want] * len(got), f"the totals are {got}, not {want}: a step was applied twice"


def test_a_recovery_window_is_found_shrunk_and_its_line_replays_it(mwms_cluster):
    with pytest.raises(ExplorationFailed) as raised:
        mwms_cluster.explore(resumable, property="survives", invariant=each_step_once,
                             kinds=["Crash"], restarts=1, budget=60, seed=2)
    found = raised.value.exploration
    assert str(raised.value).startswith("faults=[Crash(worker=0, step=")
    # The smallest plan: one crash of worker 0, by exit, after the first even step.
    assert found.failure.plan == (F.Crash(0, 1, "exit"),)
    assert found.failure.signature.broken == "invariant: AssertionError"
    assert found.steps == STEPS
    # The failing run is the test's, for its report; the search's are not.
    assert mwms_cluster.runs == [found.failure.result]
    again = mwms_cluster.run(resumable, faults=faults_text.parse_plan(found.failure.line), restarts=1)
    assert again.outcome == "completed"
    with pytest.raises(AssertionError, match="applied twice"):
        each_step_once(again)


def test_the_fixed_job_survives_every_single_crash(mwms_cluster):
    found = mwms_cluster.explore(resumable, kwargs={"fixed": True}, invariant=each_step_once,
                                 kinds=["Crash"], restarts=1, budget=6, seed=2)
    assert found.failure is None
    assert found.runs >= 2   # the fault-free run and at least one plan, however slow the machine
    assert set(found.outcomes) == {"completed"}
    assert "no plan broke the property" in found.summary()


def test_the_diagnosis_names_the_faulted_worker_of_every_plan_of_a_small_space(mwms_cluster):
    """Every plan of two kinds at 2 workers and 2 steps (8 plans), so the
    search ends by exhausting them, not by its budget (an extra collective
    and a pause for ever: tests/test_deadlock.py)."""
    found = mwms_cluster.explore(variable_loop, args=(2,), property="detected",
                                 kinds=["RaiseError", "SkipStep"], budget=150, seed=5)
    assert found.failure is None, found.summary()
    assert found.exhausted and found.runs == 1 + 8, found.summary()
    assert found.outcomes == {"completed": 1, "failed": 4, "hang": 4}, found.summary()
    assert found.timeout == 3.0   # a warm step is far below the least timeout


def test_a_run_that_watches_its_state_reports_where_run_dir_was_written(mwms_cluster):
    """The job writes its state at the end of every step (a temporary file
    renamed): each boundary from step 1 on sees the write of the step
    before; a run that does not watch reports nothing."""
    from harness.explore.search import state_steps
    watched = mwms_cluster.run(resumable, watch_state=True)
    watched.assert_completed()
    assert state_steps(watched) == tuple(range(1, STEPS))
    saved = [e for e in watched.observation.workers[1].events if e.kind == "saved"]
    assert saved[0].step == 1 and "state-1.json" in saved[0].data["files"]
    plain = mwms_cluster.run(resumable)
    assert state_steps(plain) == ()
