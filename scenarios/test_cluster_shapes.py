"""Clusters with a ``chief`` task beside the workers and an ``evaluator``
outside the collectives, as Kubeflow's TFJob and TensorFlow's own test
presets deploy them (one chief and two workers here, whatever
``--mwms-workers`` says): work done on one task only, the tutorials'
``_is_chief`` rule in a cluster that has a chief, an evaluator that crashes,
a ``TF_CONFIG`` whose chief differs on one task, one task of each type
killed."""
import json
import os

import pytest

from harness.faults import Crash
from scenarios.meta import NO_FIX, scenario

STEPS = 6
CHIEF_AND_TWO = {"chief": 1, "worker": 2}
WITH_EVALUATOR = {"chief": 1, "worker": 2, "evaluator": 1}
pytestmark = pytest.mark.mwms(cluster=CHIEF_AND_TWO)


def tutorial_is_chief(task_type, task_id):
    """The multi-worker tutorials' ``_is_chief``, written for a cluster of
    workers only (worker 0 is the chief there), as users copy it."""
    return (task_type == "worker" and task_id == 0) or task_type is None


def train_then_save(directory, saves="chief"):
    """The seed's loop for 6 steps with an "examples seen" counter (a
    sync-on-read variable, what Keras metrics are made of), then
    ``tf.train.Checkpoint.save`` on the tasks ``saves`` names: ``"chief"``
    (``task_type == "chief"``), ``"tutorial"`` (the tutorials'
    ``_is_chief``), or ``"all"`` (the chief into ``directory``, the others
    into temporary directories they remove).  An evaluator returns at once.
    Returns the listing of ``directory``."""
    import shutil

    import tensorflow as tf

    import harness
    from scenarios import mnist_like
    ctx = harness.context()
    if ctx.task_type == "evaluator":
        return None
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model, optimizer, step = mnist_like.make_training(strategy)
    with strategy.scope():
        seen = tf.Variable(0.0, trainable=False,
                           synchronization=tf.VariableSynchronization.ON_READ,
                           aggregation=tf.VariableAggregation.SUM)
    count = tf.function(lambda batch: strategy.run(
        lambda b: seen.assign_add(tf.cast(tf.shape(b[1])[0], tf.float32)), args=(batch,)))
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, examples_seen=seen)
    x, y = mnist_like.make_data()
    iterator = iter(mnist_like.distributed_dataset(strategy, x, y))
    for _ in ctx.steps(STEPS):
        batch = next(iterator)
        step(batch)
        count(batch)
    chief = resolver.task_type == "chief"
    if saves == "tutorial":
        chief = tutorial_is_chief(resolver.task_type, resolver.task_id)
    if saves == "all" or chief:
        where = directory if chief else os.path.join(directory, f".{ctx.task_type}-"
                                                                 f"{ctx.task_index}-tmp")
        checkpoint.save(os.path.join(where, "ckpt"))
        if where != directory:
            shutil.rmtree(where, ignore_errors=True)
    return sorted(os.listdir(directory))


@pytest.mark.timeout(60)
@scenario(outcome="hang", source="MWMS docs: save on every worker; Kubeflow TFJob (Chief)",
          fixed_by="test_checkpoint_on_every_task")
def test_checkpoint_on_the_chief_task_only(mwms_cluster, tmp_path):
    """``checkpoint.save`` only where ``task_type == "chief"``, in a cluster
    of a chief and two workers, and the checkpoint holds a sync-on-read
    variable.

    TensorFlow: saving reads the variable, an all-reduce across the chief
    and the workers; the workers have returned, so the chief blocks in
    ``save`` for ever.

    Source: the MWMS custom-training-loop tutorial ("save on every
    worker"); TFJob's ``Chief`` replica, where the chief is its own task.

    Fix: call ``save`` on every task, the workers into temporary
    directories they remove.
    """
    result = mwms_cluster.run(train_then_save, args=(str(tmp_path),), timeout=15)
    result.assert_hang()
    assert result.culprit_tasks == (("chief", 0),)
    assert "save" in result.tasks[("chief", 0)].stack


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="MWMS docs: save on every worker; Kubeflow TFJob (Chief)")
def test_checkpoint_on_every_task(mwms_cluster, tmp_path):
    """Fixed: every task calls ``save``; the chief into the real directory,
    the workers into temporary ones they remove.

    TensorFlow: the all-reduce behind the sync-on-read variable pairs up on
    all three tasks; all complete; the directory holds the chief's
    checkpoint.

    Source: the MWMS custom-training-loop tutorial.

    Fix: this.
    """
    result = mwms_cluster.run(train_then_save, args=(str(tmp_path),), kwargs={"saves": "all"},
                              timeout=20)
    result.assert_completed()
    assert sorted(os.listdir(tmp_path)) == [
        "checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]


@pytest.mark.timeout(60)
@scenario(outcome="hang", source="MWMS tutorials' _is_chief; Kubeflow TFJob (Chief)",
          fixed_by="test_checkpoint_on_every_task")
def test_worker_0_taken_for_the_chief(mwms_cluster, tmp_path):
    """The tutorials' ``_is_chief`` (``task_type == "worker" and task_id ==
    0``), written for a cluster of workers only, decides who saves in a
    cluster that has a chief: worker 0 saves, the chief does not.

    TensorFlow: worker 0's save reads the sync-on-read variable, an
    all-reduce the chief and worker 1 (returned) never join: worker 0
    blocks in ``save`` for ever.

    Source: the multi-worker tutorials' ``_is_chief``, whose comment says to
    change it when a chief task is used; TFJob's ``Chief`` replica.

    Fix: ``task_type == "chief"`` where the cluster has a chief (the cluster
    resolver's ``task_type``), and save on every task anyway.
    """
    result = mwms_cluster.run(train_then_save, args=(str(tmp_path),),
                              kwargs={"saves": "tutorial"}, timeout=15)
    result.assert_hang()
    assert result.culprit_tasks == (("worker", 0),)


def train_with_an_evaluator(exits_at=None):
    """The seed's loop on the chief and the workers; the evaluator counts
    the examples it evaluates (no collectives, as a sidecar evaluator
    reading checkpoints), and with ``exits_at`` dies of a bad record there
    (``os._exit(1)``, as a segfaulting input pipeline would)."""
    import time

    import harness
    from harness.workloads import seed_training_loop
    ctx = harness.context()
    if ctx.task_type != "evaluator":
        return seed_training_loop(epochs=1, steps_per_epoch=10, steps=ctx.steps)
    for k in ctx.steps(5):
        time.sleep(0.05)
        if k == exits_at:
            os._exit(1)
    return "evaluated"


@pytest.mark.timeout(60)
@pytest.mark.mwms(cluster=WITH_EVALUATOR)
@scenario(outcome="crashed", source="Keras SidecarEvaluator; Kubeflow TFJob (Evaluator)",
          fixed_by=NO_FIX)
def test_the_evaluator_crashes_while_training_goes_on(mwms_cluster):
    """The evaluator dies at its third evaluation while the chief and the
    workers train.

    TensorFlow: the evaluator is not in the training cluster's collectives
    (TFJob lists it in no task's cluster), so training goes on and
    completes; only the evaluator's process is gone.

    Source: Keras's ``SidecarEvaluator``; TFJob's ``Evaluator`` replica.

    Fix: none in training; the evaluator's own bug, which the verdict names.
    """
    result = mwms_cluster.run(train_with_an_evaluator, kwargs={"exits_at": 2}, timeout=20)
    assert result.outcome == "crashed" and result.culprit_tasks == (("evaluator", 0),)
    assert result.diagnosis.startswith("CRASHED: the evaluator died")
    training = [result.tasks[t].return_value for t in (("chief", 0), ("worker", 0), ("worker", 1))]
    assert len(training[0]) == 10 and training[0] == training[1] == training[2]


def train_with_tfjob_evaluator(tfjob_config=True):
    """The seed's loop on the chief and the workers; the evaluator builds the
    same strategy to evaluate with.  With ``tfjob_config`` the evaluator's
    ``TF_CONFIG`` is TFJob's: its cluster lists the chief and the workers
    but not the evaluator; without it the evaluator evaluates with the
    default strategy (no collectives), as Keras's ``SidecarEvaluator`` does."""
    import tensorflow as tf

    import harness
    from harness.workloads import seed_training_loop
    ctx = harness.context()
    if ctx.task_type != "evaluator":
        return seed_training_loop(epochs=1, steps_per_epoch=5, steps=ctx.steps)
    if tfjob_config:
        # The harness writes the evaluator's TF_CONFIG as TFJob does.
        assert "evaluator" not in json.loads(os.environ["TF_CONFIG"])["cluster"]
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        strategy = tf.distribute.get_strategy()
    with strategy.scope():
        total = tf.Variable(0.0)
    for _ in ctx.steps(3):
        total.assign_add(1.0)
    return float(total.numpy())


@pytest.mark.timeout(60)
@pytest.mark.mwms(cluster=WITH_EVALUATOR)
@scenario(outcome="failed", source="kubeflow/trainer#1139 (TFJob leaves the evaluator out of "
          "TF_CONFIG's cluster)", fixed_by="test_the_evaluator_evaluates_without_the_strategy")
def test_the_evaluator_builds_the_strategy_from_tfjobs_tf_config(mwms_cluster):
    """The evaluator builds ``MultiWorkerMirroredStrategy()`` from a
    ``TF_CONFIG`` that, as TFJob writes it, leaves the evaluator out of the
    cluster.

    TensorFlow: TensorFlow 2.21, measured: the strategy counts the tasks of
    the evaluator's own type and raises ``KeyError: 'evaluator'``
    (``multi_worker_util.worker_count``); the chief and the workers train on
    and complete.

    Source: kubeflow/trainer#1139: TFJob leaves the evaluator out of the
    cluster in ``TF_CONFIG``, and the evaluator's strategy fails.

    Fix: the evaluator evaluates outside the training strategy (Keras's
    ``SidecarEvaluator``, or the default strategy).
    """
    result = mwms_cluster.run(train_with_tfjob_evaluator, timeout=20)
    result.assert_failed()
    assert result.culprit_tasks == (("evaluator", 0),)
    evaluator = result.tasks[("evaluator", 0)]
    assert evaluator.exception.type_name.endswith("KeyError")
    assert "known: the evaluator's TF_CONFIG has no 'evaluator' in its cluster" in \
        result.diagnosis, result.diagnosis
    assert "kubeflow/trainer/issues/1139" in result.diagnosis
    losses = [result.tasks[t].return_value for t in (("chief", 0), ("worker", 0), ("worker", 1))]
    assert losses[0] == losses[1] == losses[2] and len(losses[0]) == 5


@pytest.mark.timeout(60)
@pytest.mark.mwms(cluster=WITH_EVALUATOR)
@scenario(outcome="completed", source="kubeflow/trainer#1139; Keras SidecarEvaluator")
def test_the_evaluator_evaluates_without_the_strategy(mwms_cluster):
    """Fixed: the evaluator evaluates with the default strategy.

    TensorFlow: the chief and the workers train and complete; the evaluator
    runs its three evaluations and returns.

    Source: Keras's ``SidecarEvaluator``.

    Fix: this.
    """
    result = mwms_cluster.run(train_with_tfjob_evaluator, kwargs={"tfjob_config": False},
                              timeout=20)
    result.assert_completed()
    assert result.tasks[("evaluator", 0)].return_value == 3.0


def train_with_its_own_tf_config(chief_port_offset=0):
    """The seed's loop, where worker 1's ``TF_CONFIG`` names another chief
    address (``chief_port_offset`` added to the port), as a launcher that
    built one task's environment from a stale list would."""
    import harness
    from harness.workloads import seed_training_loop
    ctx = harness.context()
    if (ctx.task_type, ctx.task_index) == ("worker", 1) and chief_port_offset:
        config = json.loads(os.environ["TF_CONFIG"])
        host, _, port = config["cluster"]["chief"][0].rpartition(":")
        config["cluster"]["chief"][0] = f"{host}:{int(port) + chief_port_offset}"
        os.environ["TF_CONFIG"] = json.dumps(config)
    return seed_training_loop(epochs=1, steps_per_epoch=5, steps=ctx.steps)


@pytest.mark.timeout(60)
@scenario(outcome="hang", source="Kubeflow TFJob; seed rule 1 (TF_CONFIG)",
          fixed_by="test_the_chief_the_same_on_every_task")
def test_the_chief_differs_on_one_task(mwms_cluster):
    """Worker 1's ``TF_CONFIG`` lists the chief at another port than the
    chief's and worker 0's do.

    TensorFlow: worker 1 looks for the chief where nobody listens, and the
    chief and worker 0 wait for worker 1 to join: the cluster never forms,
    every task waits in strategy creation.

    Source: TFJob and hand-written launchers that build each task's
    ``TF_CONFIG`` (the seed's first rule: the same cluster everywhere).

    Fix: one cluster list, the same in every task's ``TF_CONFIG``.
    """
    result = mwms_cluster.run(train_with_its_own_tf_config, kwargs={"chief_port_offset": 1},
                              timeout=10)
    result.assert_hang()
    assert result.culprit_tasks == (("worker", 1),)


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="Kubeflow TFJob; seed rule 1 (TF_CONFIG)")
def test_the_chief_the_same_on_every_task(mwms_cluster):
    """Fixed: every task's ``TF_CONFIG`` lists the same chief.

    TensorFlow: the cluster forms and the seed's loop completes on the
    chief and the two workers with the same losses.

    Source: TFJob.

    Fix: this.
    """
    result = mwms_cluster.run(train_with_its_own_tf_config, timeout=20)
    result.assert_completed()


@pytest.mark.timeout(60)
@pytest.mark.mwms(cluster=WITH_EVALUATOR)
@pytest.mark.parametrize("task", [("chief", 0), ("worker", 0), ("evaluator", 0)],
                         ids=["chief", "worker", "evaluator"])
@scenario(outcome="crashed", source="Kubeflow TFJob (Chief, Worker, Evaluator)", fixed_by=NO_FIX)
def test_one_task_of_each_type_killed(mwms_cluster, task):
    """One task, of each type in turn, is SIGKILLed at step 2: the OOM
    killer, a node lost.

    TensorFlow: the chief's or a worker's death leaves the others blocked
    in their next all-reduce until the coordination service reports the
    task unhealthy; the evaluator's leaves training to complete.

    Source: TFJob's replica types.

    Fix: none completes; restarts (``restarts=``) are what recovers a job.
    """
    result = mwms_cluster.run(train_with_an_evaluator, faults=[Crash(task=task, step=2,
                                                                   how="kill")], timeout=20)
    assert result.outcome == "crashed" and result.culprit_tasks == (task,)
    if task[0] == "evaluator":
        assert all(len(result.tasks[t].return_value) == 10
                   for t in (("chief", 0), ("worker", 0), ("worker", 1)))
