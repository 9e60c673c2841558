"""ParameterServerStrategy jobs on a chief, two workers and a parameter
server (whatever ``--mwms-workers`` says): the chief's ``ClusterCoordinator``
schedules the job's functions on the workers, the variables live on the
parameter server.  A parameter server lost ends the job unless it
checkpoints and is restarted; a worker lost is absorbed by the
coordinator, which runs again each function whose result it lost with the
worker (counted twice where the job counts in a variable) and gives the
lost worker's share of the steps to the others (which a dataset sized for
each worker's share cannot serve)."""
import pytest

import harness
from harness.faults import Crash, Preempt
from scenarios.meta import scenario

STEPS = 20
# The job joins its functions and writes a checkpoint every this many.
EVERY = 4
WITH_PS = {"chief": 1, "worker": 2, "ps": 1}
pytestmark = pytest.mark.mwms(cluster=WITH_PS)


def counting_job(checkpoints=False):
    """``STEPS`` functions, each adding 1 to a counter on the parameter
    server (its py_function, which runs in the coordinator's process,
    keeps it in flight for 50 ms); every ``EVERY`` the coordinator joins
    them and, with ``checkpoints``, writes the counter to a checkpoint in
    the run's directory, which a restarted job reads back first.  Returns
    (the count it started from, the count at the end)."""
    import time

    import tensorflow as tf
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        counter = tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(counter=counter),
                                         harness.context().run_dir, max_to_keep=1) \
        if checkpoints else None
    if manager is not None and manager.latest_checkpoint:
        manager.checkpoint.restore(manager.latest_checkpoint)
    start = int(counter.numpy())

    @tf.function
    def step():
        counter.assign_add(1)
        tf.py_function(lambda: time.sleep(0.05), [], [])

    for k in range(start, STEPS):
        coordinator.schedule(step)
        if (k + 1) % EVERY == 0:
            coordinator.join()
            if manager is not None:
                manager.save()
    coordinator.join()
    return start, int(counter.numpy())


PS_LOST = Crash(task=("ps", 0), step=6, how="kill")


@pytest.mark.timeout(90)
@scenario(outcome="crashed", source="TensorFlow's ParameterServerStrategy tutorial (fault "
          "tolerance: parameter server failure)",
          fixed_by="test_a_parameter_server_lost_the_job_resumes_from_its_checkpoint")
def test_a_parameter_server_lost_without_a_checkpoint(mwms_cluster):
    """The parameter server dies (SIGKILL, a node lost) at the coordinator's
    seventh function, and the job neither checkpoints nor is restarted.

    TensorFlow: a worker's failure the coordinator absorbs, a parameter
    server's it does not: its next ``join`` raises ``UnavailableError``
    naming ``/job:ps/replica:0/task:0``, and the variables it held are
    gone.

    Source: TensorFlow's parameter server training tutorial: "parameter
    server failure" needs the job restarted from a checkpoint.

    Fix: write a checkpoint every few joins, restore it at start, and
    restart the cluster (``restarts=1``).
    """
    result = mwms_cluster.run(counting_job, faults=[PS_LOST], timeout=30)
    assert result.culprit_tasks == (("ps", 0),) and not result.ambiguous
    assert "ps 0: died (exit code -9, SIGKILL) at coordinator step 6" in result.diagnosis


@pytest.mark.timeout(90)
@scenario(outcome="completed", source="TensorFlow's ParameterServerStrategy tutorial (fault "
          "tolerance: parameter server failure)")
def test_a_parameter_server_lost_the_job_resumes_from_its_checkpoint(mwms_cluster):
    """The job writes its counter to a checkpoint every four functions and
    reads it back at start; the cluster is restarted once.

    TensorFlow: the first attempt raises as the parameter server dies; the
    restarted cluster's job restores the counter of its last checkpoint
    (the fourth function's: the next one could not be written) and runs
    the functions left, so the count ends at 20 exactly.

    Source: TensorFlow's parameter server training tutorial.

    Fix: this is the fix.
    """
    result = mwms_cluster.run(counting_job, kwargs={"checkpoints": True}, faults=[PS_LOST],
                              restarts=1, timeout=30)
    start, end = result.tasks[("chief", 0)].return_value
    assert (len(result.attempts), end) == (2, STEPS)
    assert start % EVERY == 0 and 0 < start < STEPS
    assert result.attempts[0].culprit_tasks == (("ps", 0),)


@pytest.mark.timeout(90)
@scenario(outcome="completed", source="TensorFlow's ClusterCoordinator docs (worker failure: "
          "functions re-run)")
def test_a_worker_lost_the_coordinator_runs_its_functions_again(mwms_cluster):
    """Worker 1 is SIGKILLed once the sixth function scheduled (or the
    first after it to run there) has run on it: the job goes on without it.

    TensorFlow: the coordinator puts back each function the worker held
    and runs it on worker 0; ``join`` returns.  The function that had
    updated the parameter server before its worker died runs again, so
    the counter counts every function, one twice.

    Source: TensorFlow's ``ClusterCoordinator.schedule`` docs: "a function
    may be executed more than once".

    Fix: none needed for the job to complete; a count that must be exact
    is made from the values the coordinator fetched, not from a variable
    the functions update.
    """
    result = mwms_cluster.run(counting_job, faults=[Crash(task=("worker", 1), step=5,
                                                          how="kill")], timeout=30)
    assert result.tasks[("chief", 0)].return_value[1] >= STEPS
    assert "worker 1 stopped serving and the job went on" in result.diagnosis.splitlines()[0]
    assert "of worker 1 back in its queue" in result.diagnosis


def exactly_once_job(count_from="variable"):
    """``STEPS`` functions, each counting one example into a counter on the
    parameter server and returning 1; the job then checks that it counted
    each example once, counting ``"variable"`` (the counter the functions
    updated) or ``"results"`` (the values the coordinator fetched).
    Returns (the counter, the sum of the fetched values)."""
    import tensorflow as tf
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        seen = tf.Variable(0, dtype=tf.int64)

    @tf.function
    def step():
        seen.assign_add(1)
        return tf.constant(1, dtype=tf.int64)

    results = [coordinator.schedule(step) for _ in range(STEPS)]
    coordinator.join()
    fetched = sum(int(r.fetch()) for r in results)
    counted = int(seen.numpy()) if count_from == "variable" else fetched
    if counted != STEPS:
        raise AssertionError(f"counted {counted} examples of {STEPS}")
    return int(seen.numpy()), fetched


WORKER_LOST = Crash(task=("worker", 1), step=5, how="kill")


@pytest.mark.timeout(90)
@scenario(outcome="failed", source="TensorFlow's ClusterCoordinator.schedule docs (\"a "
          "function may be executed more than once\")",
          fixed_by="test_a_function_run_twice_counted_from_its_fetched_results")
def test_a_function_run_twice_breaks_an_exactly_once_counter(mwms_cluster):
    """A job counts its examples in a variable its functions update, and
    worker 1 is lost (SIGKILL) after running one, before its result came.

    Worker 1 dies once the sixth function scheduled (or the first after
    it to run there) has run on it, before the coordinator has its result.

    TensorFlow: the coordinator's fetch of the result fails, it puts the
    function back and runs it on worker 0, so the counter on the
    parameter server counts that example twice: 21 of 20.  The job's
    check raises; the verdict names the job's error (the chief's) and
    says the coordinator put a function of worker 1 back, which may have
    run twice.

    Source: TensorFlow's ``ClusterCoordinator.schedule`` docs: a function
    "may be executed more than once" after a worker failure.

    Fix: count from the values the coordinator fetched, one per function
    that finished.
    """
    result = mwms_cluster.run(exactly_once_job, faults=[WORKER_LOST], timeout=30)
    assert "counted 21 examples of 20" in result.diagnosis
    assert "of worker 1 back in its queue" in result.diagnosis
    assert result.culprit_tasks == (("chief", 0),)


@pytest.mark.timeout(90)
@scenario(outcome="completed", source="TensorFlow's ClusterCoordinator.schedule docs (\"a "
          "function may be executed more than once\")")
def test_a_function_run_twice_counted_from_its_fetched_results(mwms_cluster):
    """The same lost worker; the job counts the values the coordinator
    fetched.

    TensorFlow: the function run twice still counts twice in the variable
    (21), but its first result was lost with the worker, so the fetched
    values sum to 20 exactly.

    Source: TensorFlow's ``ClusterCoordinator.schedule`` docs.

    Fix: this is the fix.
    """
    result = mwms_cluster.run(exactly_once_job, kwargs={"count_from": "results"},
                              faults=[WORKER_LOST], timeout=30)
    assert result.tasks[("chief", 0)].return_value == (STEPS + 1, STEPS)


EPOCHS, STEPS_PER_EPOCH = 2, 10


def epoch_job(repeat=False):
    """``EPOCHS`` epochs of ``STEPS_PER_EPOCH`` functions, each taking one
    element of its worker's dataset (``coordinator.create_per_worker_dataset``)
    and returning 1; the coordinator joins at each epoch's end.  Each
    worker's dataset holds its share of every epoch's elements (the steps
    over the workers), repeated or not.  Returns the values fetched."""
    import tensorflow as tf
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    workers = len(resolver.cluster_spec().as_dict()["worker"])
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        total = tf.Variable(0, dtype=tf.int64)
    share = EPOCHS * STEPS_PER_EPOCH // workers

    def dataset_fn():
        dataset = tf.data.Dataset.range(share)
        return dataset.repeat() if repeat else dataset

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def step(it):
        total.assign_add(next(it))
        return tf.constant(1, dtype=tf.int64)

    fetched = 0
    for _ in range(EPOCHS):
        results = [coordinator.schedule(step, args=(iterator,)) for _ in range(STEPS_PER_EPOCH)]
        coordinator.join()
        fetched += sum(int(r.fetch()) for r in results)
    return fetched


PREEMPTED_MID_EPOCH = Preempt(task=("worker", 1), step=3)


@pytest.mark.timeout(90)
@scenario(outcome="failed", source="TensorFlow's ClusterCoordinator.create_per_worker_dataset "
          "docs (repeat the datasets, schedule a finite number of steps)",
          fixed_by="test_a_worker_preempted_mid_epoch_a_repeated_dataset_serves_every_step")
def test_a_worker_preempted_mid_epoch_its_share_overruns_the_others_dataset(mwms_cluster):
    """Each worker's dataset holds only its share of the steps, not
    repeated, and worker 1 is preempted (SIGTERM) in the first epoch.

    Worker 1 gets SIGTERM once the fourth function scheduled (or the first
    after it to run there) has run on it.

    TensorFlow: the coordinator runs the rest of the job on worker 0, whose
    dataset runs out before the job's steps do: a function raises
    ``OutOfRangeError`` and the coordinator's ``join`` raises it.  The
    verdict names the job's error (the chief's) and says worker 1 stopped
    serving.  Without the preemption the same job fails whenever the
    coordinator gives one worker more functions than its share (1 of 3
    runs here): the loss of a worker makes it happen every time.

    Source: TensorFlow's ``ClusterCoordinator.create_per_worker_dataset``
    docs recommend datasets "repeated indefinitely" and a finite number of
    steps scheduled, "instead of relying on the OutOfRangeError".

    Fix: ``repeat()`` each worker's dataset; the steps scheduled end the epoch.
    """
    result = mwms_cluster.run(epoch_job, faults=[PREEMPTED_MID_EPOCH], timeout=30)
    assert result.culprit_tasks == (("chief", 0),) and not result.ambiguous
    assert "OutOfRangeError" in result.diagnosis
    assert "worker 1: died (exit code -15, SIGTERM) at coordinator step 3" in result.diagnosis


@pytest.mark.timeout(90)
@scenario(outcome="completed", source="TensorFlow's ClusterCoordinator.create_per_worker_dataset "
          "docs (repeat the datasets, schedule a finite number of steps)")
def test_a_worker_preempted_mid_epoch_a_repeated_dataset_serves_every_step(mwms_cluster):
    """The same preemption; each worker's dataset is repeated.

    TensorFlow: worker 0 takes worker 1's share and its dataset never runs
    out: every step of both epochs runs and its value is fetched (20); the
    verdict says worker 1 stopped serving and the job went on.

    Source: TensorFlow's ``ClusterCoordinator.create_per_worker_dataset`` docs.

    Fix: this is the fix.
    """
    result = mwms_cluster.run(epoch_job, kwargs={"repeat": True},
                              faults=[PREEMPTED_MID_EPOCH], timeout=30)
    assert result.tasks[("chief", 0)].return_value == EPOCHS * STEPS_PER_EPOCH
    assert "worker 1 stopped serving and the job went on" in result.diagnosis.splitlines()[0]
