"""Restarts, preemption and the replica check against real TensorFlow workers."""
import glob
import os

import pytest

import harness
from harness.faults import Crash, Pause, Preempt, RaiseError
from harness.launch import scratch
from harness.launch.state_dir import default_state_dir
from harness.workloads import seed_training_loop

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("no_leftover_workers")]


def attempt_loop(n_steps=6, sleep=0.0, sigterm_at=None):
    """Six all-reduce steps; returns the attempt it ran in.  At step
    ``sigterm_at``, worker 1 gets SIGTERM from another process (``kill``):
    the preemption's twin."""
    import subprocess
    import time
    ctx = harness.context()
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    @tf.function
    def step():
        return strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)

    for k in ctx.steps(n_steps):
        if k == sigterm_at and ctx.index == 1:
            subprocess.run(["kill", "-TERM", str(os.getpid())], check=True)
        step()
        time.sleep(sleep)
    return ctx.attempt


def _outcomes(result):
    return [a.outcome for a in result.attempts]


def _run_dirs():
    return set(glob.glob(os.path.join(scratch.scratch_dir(), "run-*")))


def test_a_crash_restarts_the_whole_cluster_at_the_same_addresses(mwms_cluster):
    before = _run_dirs()
    result = mwms_cluster.run(attempt_loop, timeout=20, grace=1, restarts=1,
                              faults=[Crash(1, 3)])
    result.assert_completed()
    assert _outcomes(result) == ["crashed", "completed"]
    assert result.attempts[0].culprits == (1,) and result.return_values == [1, 1]
    first, last = (a.observation.workers for a in result.attempts)
    assert [w.tf_config for w in first] == [w.tf_config for w in last]
    assert result.diagnosis.startswith("COMPLETED after 1 restart: attempt 0 CRASHED, "
                                       "attempt 1 COMPLETED")
    assert _run_dirs() <= before      # the run's directory went with it
    # and its ports with it: held across the attempts, released after
    state_dir = os.environ.get("MWMS_STATE_DIR") or default_state_dir()
    ports = [int(a.rsplit(":", 1)[1]) for a in first[0].tf_config["cluster"]["worker"]]
    assert not [p for p in ports if os.path.exists(os.path.join(state_dir, str(p)))]


def test_a_hang_is_restarted_only_when_asked(mwms_cluster):
    # 6 s: a busy machine (CI) spent over 2 s tracing the step, and a 2 s
    # timeout called that the hang, before the pause.
    hung = mwms_cluster.run(attempt_loop, timeout=6, restarts=1, faults=[Pause(1, 2)])
    hung.assert_hang(culprits=[1])
    assert _outcomes(hung) == ["hang"]
    again = mwms_cluster.run(attempt_loop, timeout=6, restarts=1, restart_on="crash,fail,hang",
                             faults=[Pause(1, 2)])
    again.assert_completed()
    assert _outcomes(again) == ["hang", "completed"]


def test_each_fault_acts_in_its_attempt(mwms_cluster):
    result = mwms_cluster.run(attempt_loop, timeout=20, grace=1, restarts=2,
                              faults=[RaiseError(0, 2), Crash(1, 2, attempt=1)])
    assert _outcomes(result) == ["failed", "crashed", "completed"]
    assert [a.culprits for a in result.attempts] == [(0,), (1,), ()]
    assert result.return_values == [2, 2]


def test_restarts_end_when_they_run_out(mwms_cluster):
    result = mwms_cluster.run(attempt_loop, timeout=20, grace=1, restarts=1,
                              faults=[Crash(1, 2), Crash(1, 2, attempt=1)])
    result.assert_crashed(culprits=[1])
    assert _outcomes(result) == ["crashed", "crashed"]


@pytest.mark.mwms(restarts=1)
def test_the_marker_sets_the_default(mwms_cluster):
    result = mwms_cluster.run(attempt_loop, timeout=20, grace=1, faults=[Crash(0, 1)])
    assert _outcomes(result) == ["crashed", "completed"]


def test_mwms_swallows_sigterm_whoever_sends_it(mwms_cluster):
    """TensorFlow's preemption notifier catches SIGTERM once a strategy
    exists: without a PreemptionCheckpointHandler the notice changes
    nothing.  The fault and its twin (a kill from another process) leave
    the same record."""
    twin = mwms_cluster.run(attempt_loop, kwargs={"sigterm_at": 2}, timeout=20)
    fault = mwms_cluster.run(attempt_loop, timeout=20, faults=[Preempt(1, 2, grace=30)])
    for result in (twin, fault):
        result.assert_completed()
        assert [w.exit_code for w in result.workers] == [0, 0]
        assert result.workers[1].last_step == 5


def test_a_preempted_worker_that_outlives_its_grace_is_killed(mwms_cluster):
    result = mwms_cluster.run(attempt_loop, kwargs={"n_steps": 40, "sleep": 0.1}, timeout=20,
                              grace=2, faults=[Preempt(1, 2, grace=0.5)])
    result.assert_crashed(culprits=[1])
    assert result.workers[1].exit_code == -9
    assert "SIGKILL" in result.diagnosis


# ---------------------------------------------------------------- replicas

def drifting_loop(drifters=(), sync_on_read=True):
    """Mirrored variables trained together; each worker in ``drifters``
    also moves its own copy of one of them, outside the strategy (the
    twin of a local update: an assign in cross-replica context writes
    this worker's copy only).  A sync-on-read variable that differs
    per worker, as a metric does, must not count."""
    import tensorflow as tf
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = tf.Variable([1.0, 2.0], name="w")
        b = tf.Variable(0.0, name="b")
        if sync_on_read:
            seen = tf.Variable(0.0, name="seen", synchronization=tf.VariableSynchronization.ON_READ,
                               aggregation=tf.VariableAggregation.SUM)

    @tf.function
    def step():
        def replica():
            w.assign_sub(0.1 * tf.ones(2))
            return w
        strategy.run(replica)

    for _ in ctx.steps(4):
        step()
    if ctx.index in drifters:
        b.assign_add(0.25)
    if sync_on_read:
        seen.values[0].assign(float(ctx.index))   # this worker's count only
    return ctx.index


def test_replicas_that_agree_pass_and_say_so(mwms_cluster):
    result = mwms_cluster.run(drifting_loop, timeout=20, check_replicas=True)
    result.assert_completed()
    assert result.replicas.variables == (2, 2) and result.replicas.divergence is None
    assert "replicas: 2 mirrored variables agree on every worker" in result.diagnosis


def test_replicas_that_drift_apart_fail_naming_the_variable(mwms_cluster):
    result = mwms_cluster.run(drifting_loop, args=((1,),), timeout=20, check_replicas=True)
    result.assert_failed(error="ReplicaDivergence").assert_cannot_tell([0, 1])
    d = result.replicas.divergence
    assert "'b:0'" in d.variable and d.max_difference == pytest.approx(0.25)
    assert "b:0" in result.diagnosis.splitlines()[0]
    # without the check, the same run passes: the drift is silent
    mwms_cluster.run(drifting_loop, args=((1,),), timeout=20).assert_completed()


@pytest.mark.mwms(workers=3)
def test_a_lone_drifter_among_three_is_the_culprit(mwms_cluster):
    result = mwms_cluster.run(drifting_loop, args=((2,),), timeout=20, check_replicas=True)
    result.assert_failed(culprits=[2], error="ReplicaDivergence").assert_culprit(2)


def test_the_replica_check_covers_optimizer_slots(mwms_cluster):
    result = mwms_cluster.run(seed_training_loop, kwargs={"epochs": 1, "steps_per_epoch": 3},
                              timeout=30, check_replicas=0)
    result.assert_completed()
    # the model's 4 weights, the optimizer's iteration count and learning
    # rate, and its slots: Keras 3's SGD has none, so 6
    assert result.replicas.variables[0] >= 6 and result.replicas.divergence is None


def test_no_check_without_every_worker_returning(mwms_cluster):
    result = mwms_cluster.run(drifting_loop, timeout=20, grace=1, check_replicas=True,
                              faults=[Crash(1, 1)])
    assert result.outcome == "crashed" and result.replicas is None


# ---------------------------------------------------------------- task restarts

def exits_before_its_strategy(exit_code=1):
    """Worker 1's first process exits before it builds its strategy; every
    process returns (its restart count, its pid)."""
    ctx = harness.context()
    if ctx.index == 1 and ctx.attempt == 0:
        os._exit(exit_code)
    return attempt_loop(n_steps=3), os.getpid()


@pytest.mark.mwms(workers=3)
def test_task_policy_restarts_the_crashed_worker_alone(mwms_cluster):
    """TensorFlow 2.21, measured: a task that dies before it builds its
    strategy and comes back is taken in by peers still waiting in theirs;
    they never fail, so only its process is new."""
    result = mwms_cluster.run(exits_before_its_strategy, timeout=20, grace=2, restarts=1,
                              restart_policy="task")
    result.assert_completed()
    assert len(result.attempts) == 1 and [w.restarts for w in result.workers] == [0, 1, 0]
    first, second = result.workers[1].attempts
    assert (first.exit_code, first.attempt, second.attempt) == (1, 0, 1)
    assert first.pid != second.pid
    # the others kept their processes: the pids they returned are those started
    assert [r[1] for r in result.return_values] == [w.pid for w in result.workers]
    assert [r[0] for r in result.return_values] == [0, 1, 0]
    assert result.diagnosis.startswith("COMPLETED after 1 task restart: worker 1 crashed "
                                       "(exit code 1) and was restarted")


def test_task_restarts_end_when_a_worker_used_them(mwms_cluster):
    # Each echo restarted alone: worker 1's second process is not stopped
    # with its peers' first ones, so its Crash acts.
    result = mwms_cluster.run(attempt_loop, timeout=20, grace=1, restarts=1,
                              restart_policy="task", restart_echoes_together=False,
                              faults=[Crash(1, 0, attempt=0), Crash(1, 0, attempt=1)])
    result.assert_crashed(culprits=[1])
    assert [a.exit_code for a in result.workers[1].attempts] == [1, 1]
    assert "worker 1 not restarted: worker 1 used its 1 restart" in result.diagnosis
