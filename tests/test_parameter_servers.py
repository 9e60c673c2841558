"""Parameter-server clusters on real TensorFlow tasks: the chief runs a
``ClusterCoordinator`` job, the workers and the parameter server serve.
A job completes; a parameter server that dies is the crash's culprit; a
worker that dies is absorbed and the verdict says what the coordinator did
about it; a parameter server stopped for ever is the hang's, one cut off
the failure's; a server that raises, a MultiWorkerMirroredStrategy on such a
cluster and a fault no server can take are each one clear error."""
import pytest

from harness.errors import ExplorationFailed, FaultError, SettingError
from harness.faults import Crash, Delay, Partition, Pause, RaiseError
from harness.network import namespace as netns

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leftover_workers"),
              pytest.mark.mwms(cluster={"chief": 1, "worker": 2, "ps": 1}, timeout=30)]

STEPS = 20
SWITCH = netns.switch_available()
needs_switch = pytest.mark.skipif(not SWITCH[0], reason=f"no namespace per worker here: "
                                  f"{SWITCH[1]}")


def coordinator_job(steps=STEPS):
    """A counter on the parameter server, one increment per scheduled
    function; the py_function's sleep (it runs in the coordinator's
    process) keeps functions in flight on the workers for about a second."""
    import time

    import tensorflow as tf
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        counter = tf.Variable(0.0)

    @tf.function
    def step():
        counter.assign_add(1.0)
        tf.py_function(lambda: time.sleep(0.1), [], [])
        return counter.read_value()

    for _ in range(steps):
        coordinator.schedule(step)
    coordinator.join()
    return float(counter.numpy())


def mirrored_job():
    import tensorflow as tf
    tf.distribute.MultiWorkerMirroredStrategy()


def test_a_coordinator_job_completes_with_the_servers_serving(mwms_cluster):
    result = mwms_cluster.run(coordinator_job).assert_completed()
    assert list(result.tasks) == [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]
    assert result.tasks[("chief", 0)].return_value == STEPS
    lines = result.diagnosis.splitlines()
    assert lines[0].startswith("COMPLETED: the coordinator returned")
    assert f"{STEPS} functions scheduled" in lines[1]
    assert [ln.strip() for ln in lines[2:5]] == [
        "worker 0: served until the end", "worker 1: served until the end",
        "ps 0: served until the end"]


def test_a_parameter_server_killed_at_a_step_is_the_crash_s_culprit(mwms_cluster):
    result = mwms_cluster.run(coordinator_job, faults=[Crash(task=("ps", 0), step=5, how="kill")])
    result.assert_crashed()
    assert result.culprit_tasks == (("ps", 0),) and not result.ambiguous
    first = result.diagnosis.splitlines()[0]
    assert first.startswith("CRASHED: culprit: ps 0 (ps 0 stopped serving; the coordinator "
                            "raised"), first
    assert "ps 0: died (exit code -9, SIGKILL) at coordinator step 5" in result.diagnosis


def test_a_worker_killed_mid_job_is_absorbed_and_its_functions_run_again(mwms_cluster):
    result = mwms_cluster.run(coordinator_job,
                              faults=[Crash(task=("worker", 1), step=5, how="kill")])
    result.assert_completed()
    # Each function put back runs again elsewhere: the counter counts at
    # least every function, and more where one had incremented it.
    assert result.tasks[("chief", 0)].return_value >= STEPS
    text = result.diagnosis
    assert "worker 1 stopped serving and the job went on" in text.splitlines()[0]
    assert "of worker 1 back in its queue and ran them again" in text, text


def test_a_parameter_server_that_raises_is_named(mwms_cluster):
    result = mwms_cluster.run(coordinator_job, faults=[RaiseError(task=("ps", 0), step=3)])
    assert result.outcome == "failed" and result.culprit_tasks == (("ps", 0),)
    assert "ps 0: raised at coordinator step 3: InjectedFault" in result.diagnosis


def test_a_parameter_server_stopped_for_ever_holds_the_coordinator_and_is_named(mwms_cluster):
    result = mwms_cluster.run(coordinator_job, faults=[Pause(task=("ps", 0), step=5)], timeout=6)
    result.assert_hang()
    assert result.culprit_tasks == (("ps", 0),) and not result.ambiguous
    assert "ps 0: stopped (SIGSTOP) at coordinator step 5" in result.diagnosis


@needs_switch
def test_a_parameter_server_cut_off_is_named_by_the_links_tried_as_the_run_ended(mwms_cluster):
    """The coordinator's error names only an address ("No route to host");
    the links the harness tries as the run ends find the parameter server
    answering no one while every other link answers."""
    result = mwms_cluster.run(coordinator_job, faults=[Partition(task=("ps", 0), step=5)],
                              timeout=10)
    assert result.outcome == "failed" and result.error == "UnavailableError"
    assert result.culprit_tasks == (("ps", 0),) and not result.ambiguous
    assert "ps 0: cut off: as the run ended no link to or from it answered" in result.diagnosis


def test_a_mirrored_strategy_on_a_parameter_server_cluster_is_a_setting_error(mwms_cluster):
    result = mwms_cluster.run(mirrored_job)
    assert result.outcome == "failed" and result.error == "SettingError"
    assert "MultiWorkerMirroredStrategy on a parameter-server cluster" in result.diagnosis


def test_a_fault_no_server_can_take_is_refused_before_anything_starts(mwms_cluster):
    with pytest.raises(FaultError, match=r"ps 0 runs a server, none of the job's code"):
        mwms_cluster.run(coordinator_job, faults=[Delay(task=("ps", 0), step=1, seconds=1)])
    with pytest.raises(SettingError, match=r"parameter servers, which keep one copy"):
        mwms_cluster.run(coordinator_job, check_replicas=True)


def checkpointed_count(count_from="variable", every=4):
    """``STEPS`` functions, each counting one example into ``seen`` on the
    parameter server and returning 1; every ``every`` the coordinator joins
    them, adds the values it fetched to ``fetched`` and writes both to a
    checkpoint that a restarted job reads back first.  At the end it
    checks that it counted each example once, by ``"variable"`` (``seen``)
    or by ``"results"`` (``fetched``)."""
    import tensorflow as tf

    import harness
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        seen = tf.Variable(0, dtype=tf.int64)
        fetched = tf.Variable(0, dtype=tf.int64)
        done = tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(seen=seen, fetched=fetched, done=done), harness.context().run_dir,
        max_to_keep=1)
    if manager.latest_checkpoint:
        manager.checkpoint.restore(manager.latest_checkpoint)

    @tf.function
    def step():
        seen.assign_add(1)
        return tf.constant(1, dtype=tf.int64)

    results = []
    for k in range(int(done.numpy()), STEPS):
        results.append(coordinator.schedule(step))
        if (k + 1) % every == 0 or k + 1 == STEPS:
            coordinator.join()
            fetched.assign_add(sum(int(r.fetch()) for r in results))
            done.assign(k + 1)
            results = []
            manager.save()
    counted = int((seen if count_from == "variable" else fetched).numpy())
    assert counted == STEPS, f"counted {counted} examples of {STEPS}"
    return counted


def test_the_search_finds_a_function_run_twice_and_the_fixed_job_survives(mwms_cluster):
    """Under ``survives`` with one restart, a job that checkpoints its
    count survives a lost parameter server or chief; a worker lost after
    running a function makes that function run twice.  The search finds
    it and shrinks it to a worker's fault; counting the fetched values
    survives every plan the same search runs."""
    with pytest.raises(ExplorationFailed) as caught:
        mwms_cluster.explore(checkpointed_count, restarts=1, budget=60, seed=0, reproduce=1)
    failure = caught.value.exploration.failure
    assert len(failure.plan) == 1 and failure.plan[0].worker in (1, 2)
    assert failure.line.startswith("faults=[") and "task=('worker', " in failure.line
    assert "counted 21 examples of 20" in failure.result.diagnosis
    clean = mwms_cluster.explore(checkpointed_count, kwargs={"count_from": "results"},
                                 restarts=1, budget=12, seed=0)
    assert clean.failure is None and clean.runs > 3
    assert {f.worker for run in clean.plans for f in run.plan} >= {0, 3}
