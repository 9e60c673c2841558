"""Silent wrong results: jobs that complete on every worker, replicas in
agreement, and still train the wrong model.  Two checks catch them: the
single-worker reference (``run(reference=True)``: the same global batch on
one worker, compared within 1e-3, as Keras's own ``ctl_correctness_test``
does) and a fingerprint of the examples each worker saw.

The job is one custom loop (SGD, so a gradient N times too large shows:
Adam would normalise it away) with each mistake on a switch.  It takes
its global batch from ``harness.context().global_batch_size(...)``, so its
single-worker reference trains on the same batches.
"""
import os

import pytest

from harness.faults import Crash
from scenarios.meta import DEFAULT_IS_KERAS_3, KERAS_2, scenario
from scenarios.test_collective_order import train_in_order

STEPS = 8
PER_WORKER_BATCH = 16
CHECKPOINT_EVERY = 2
AT = 5   # the crash of the restore scenarios: after the checkpoint of step 4


def train_custom(bug=None, directory=None, steps=STEPS):
    """The seed's model under SGD on a fixed, unshuffled stream of examples
    (each with an id).  ``bug``: ``"loss_per_replica"`` (the step averages
    its loss over the replica's batch), ``"unsharded"``
    (``AutoShardPolicy.OFF``), ``"shuffled"`` and ``"shuffled_seeded"`` (the
    stream shuffled before its batches, without a seed or with one), ``"replay"`` (with ``directory``: restored
    from a checkpoint, the input starts from its first batch again).  With
    ``directory`` it checkpoints every 2 steps and resumes from the latest.
    Returns this worker's first step, the ids of the examples it trained
    on, and the last loss."""
    import numpy as np
    import tensorflow as tf

    import harness
    from harness.workloads import make_loss_object
    from scenarios import mnist_like
    ctx = harness.context()
    # The reference must start from the same weights: seed the initializers.
    tf.keras.utils.set_random_seed(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    global_batch = ctx.global_batch_size(PER_WORKER_BATCH)
    with strategy.scope():
        model = mnist_like.build_model()
        optimizer = tf.keras.optimizers.SGD(learning_rate=0.5)
        loss_object = make_loss_object()
        done = tf.Variable(0, dtype=tf.int64, trainable=False)

    @tf.function
    def step(inputs):
        def replica(images, labels, _ids):
            with tf.GradientTape() as tape:
                per_example = loss_object(labels, model(images, training=True))
                if bug == "loss_per_replica":
                    loss = tf.reduce_mean(per_example)      # the replica's batch, not the global
                else:
                    loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss
        losses = strategy.run(replica, args=inputs)
        return strategy.reduce("SUM", losses, axis=None)

    first = 0
    manager = None
    if directory is not None:
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, done=done)
        write_dir = directory if ctx.is_chief else os.path.join(directory, f".w{ctx.index}")
        manager = tf.train.CheckpointManager(checkpoint, write_dir, max_to_keep=1)
        latest = tf.train.latest_checkpoint(directory)
        if latest:
            checkpoint.restore(latest)
            first = int(done.numpy())
    x, y = mnist_like.make_data(n=global_batch * (steps + 2))
    ids = np.arange(len(x), dtype=np.int64)
    dataset = tf.data.Dataset.from_tensor_slices((x, y, ids))
    if bug in ("shuffled", "shuffled_seeded"):
        # The model's seed above stands for what MWMS gives anyway (worker
        # 0's initial values); a pipeline nobody seeded shuffles as it likes.
        tf.random.set_seed(None)
        dataset = dataset.shuffle(len(x), seed=7 if bug == "shuffled_seeded" else None)
    dataset = dataset.batch(global_batch)
    if first and bug != "replay":
        dataset = dataset.skip(first)            # resume where the checkpoint was taken
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.OFF if bug == "unsharded"
        else tf.data.experimental.AutoShardPolicy.AUTO)
    iterator = iter(strategy.experimental_distribute_dataset(dataset.with_options(options)))
    seen, loss = [], None
    for _ in ctx.steps(steps - first):
        batch = next(iterator)
        seen += [int(i) for t in strategy.experimental_local_results(batch[2])
                 for i in t.numpy()]
        loss = float(step(batch))
        done.assign_add(1)
        if manager is not None and int(done.numpy()) % CHECKPOINT_EVERY == 0:
            manager.save()
            if not ctx.is_chief:
                tf.io.gfile.rmtree(write_dir)
    return {"first": first, "seen": seen, "loss": loss}


def _seen(result):
    return [set(v["seen"]) for v in result.return_values]


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="ReferenceMismatch",
          source="TensorFlow custom training guide (tf.nn.compute_average_loss)",
          fixed_by="test_loss_averaged_over_the_global_batch")
def test_loss_averaged_per_replica(mwms_cluster):
    """The train step averages its loss over the replica's own batch
    (``tf.reduce_mean``) instead of the global batch.

    TensorFlow: the strategy sums the replicas' gradients, so each step's
    gradient is N times the mean gradient: the job completes on every
    worker, the replicas agree bit for bit, and the model is wrong (with
    SGD; Adam hides the scale).  Only the single-worker reference shows it:
    its weights differ from the run's.

    Source: TensorFlow's custom training guide ("scale the loss by the
    global batch size", ``tf.nn.compute_average_loss``).

    Fix: ``tf.nn.compute_average_loss(per_example_loss,
    global_batch_size=...)``.
    """
    if mwms_cluster.num_workers == 1:
        pytest.skip("one worker: the replica's batch is the global batch")
    result = mwms_cluster.run(train_custom, kwargs={"bug": "loss_per_replica"}, timeout=30,
                              check_replicas=True, reference=True)
    result.assert_failed(error="ReferenceMismatch").assert_cannot_tell(
        range(mwms_cluster.num_workers))
    assert result.replicas.divergence is None           # the replicas agree
    assert result.observation.reference.max_difference > 1e-3


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="TensorFlow custom training guide "
          "(tf.nn.compute_average_loss)")
def test_loss_averaged_over_the_global_batch(mwms_cluster):
    """Fixed: the loss is averaged over the global batch.

    TensorFlow: the run matches its single-worker reference within 1e-3
    (every variable and the last loss), and each worker saw its own share of
    every global batch.

    Source: TensorFlow's custom training guide.

    Fix: this.
    """
    result = mwms_cluster.run(train_custom, timeout=30, check_replicas=True, reference=True)
    result.assert_completed()
    assert result.observation.reference.variables > 0
    seen = _seen(result)
    assert all(not (a & b) for i, a in enumerate(seen) for b in seen[i + 1:])


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="ReferenceMismatch", source="tensorflow#42146, "
          "tensorflow#56513", fixed_by="test_loss_averaged_over_the_global_batch")
def test_data_not_sharded(mwms_cluster):
    """Every worker reads the whole dataset (``AutoShardPolicy.OFF``).

    TensorFlow: each worker's batch at step k is the same slice of the
    stream, so the cluster trains on 1/N of the global batch, N times over:
    the job completes, the replicas agree, and the model differs from the
    single-worker reference.  The examples each worker saw are the same.
    (Under ``AUTO`` a source autoshard cannot split by file, such as
    ``from_tensor_slices``, falls back to ``DATA`` sharding, which is
    correct: that is the fixed variant.)

    Source: tensorflow#42146, tensorflow#56513.

    Fix: leave the auto-shard policy at ``AUTO`` (or ``DATA``), or shard by
    ``input_context`` in ``distribute_datasets_from_function``.
    """
    if mwms_cluster.num_workers == 1:
        pytest.skip("one worker: there is nothing to shard")
    result = mwms_cluster.run(train_custom, kwargs={"bug": "unsharded"}, timeout=30,
                              check_replicas=True, reference=True)
    result.assert_failed(error="ReferenceMismatch")
    seen = _seen(result)
    assert all(s == seen[0] for s in seen)              # every worker saw the same examples


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="ReferenceMismatch",
          source="tensorflow/datasets#1302, tensorflow#56513",
          fixed_by="test_shuffled_with_a_seed_before_sharding")
def test_shuffled_without_a_seed_before_sharding(mwms_cluster):
    """The stream is shuffled, with no seed, before MWMS shards it by data
    (``AutoShardPolicy.AUTO`` falls back to ``DATA`` for
    ``from_tensor_slices``).

    TensorFlow: each worker shuffles the whole stream its own way, then
    keeps its share of each global batch; the shares of two workers
    overlap (8 steps of 16 examples each, out of 160: they must) and some
    examples no worker sees.  The job completes, the replicas agree, and
    the model differs from the single-worker reference.

    Source: tensorflow/datasets#1302, tensorflow#56513.

    Fix: a seed for the shuffle (the same on every worker), or shuffle
    after sharding.
    """
    if mwms_cluster.num_workers == 1:
        pytest.skip("one worker: there is nothing to shard")
    result = mwms_cluster.run(train_custom, kwargs={"bug": "shuffled"}, timeout=30,
                              check_replicas=True, reference=True)
    result.assert_failed(error="ReferenceMismatch")
    assert result.replicas.divergence is None
    seen = _seen(result)
    assert any(a & b for i, a in enumerate(seen) for b in seen[i + 1:])


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="tensorflow/datasets#1302, tensorflow#56513")
def test_shuffled_with_a_seed_before_sharding(mwms_cluster):
    """Fixed: the shuffle has a seed, so every worker shuffles alike and
    the shares are disjoint.

    TensorFlow: the run matches its single-worker reference (which
    shuffles with the same seed) within 1e-3.

    Source: tensorflow/datasets#1302, tensorflow#56513.

    Fix: this.
    """
    result = mwms_cluster.run(train_custom, kwargs={"bug": "shuffled_seeded"}, timeout=30,
                              check_replicas=True, reference=True)
    result.assert_completed()
    seen = _seen(result)
    assert all(not (a & b) for i, a in enumerate(seen) for b in seen[i + 1:])


def _restarted(mwms_cluster, tmp_path, bug):
    last = mwms_cluster.num_workers - 1
    result = mwms_cluster.run(train_custom, kwargs={"bug": bug, "directory": str(tmp_path)},
                              timeout=30, grace=2, restarts=1, faults=[Crash(last, AT)])
    result.assert_completed()
    result.attempts[0].assert_crashed().assert_culprit(last)
    return result.attempts[1]


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="tensorflow#24408",
          fixed_by="test_restore_skips_the_data_already_trained")
def test_restore_replays_the_data(mwms_cluster, tmp_path):
    """After a restart from a checkpoint, the input pipeline starts from its
    first batch again.

    TensorFlow: the checkpoint restores model, optimizer and step counter,
    not the position in the data; the job completes, and the batches of
    steps 0-3 are trained twice while the last ones are never seen.  The
    fingerprint of the examples each worker saw after the restart shows it.

    Source: tensorflow#24408.

    Fix: skip the batches already trained (``dataset.skip(restored_step)``),
    or checkpoint the iterator.
    """
    resumed = _restarted(mwms_cluster, tmp_path, "replay")
    global_batch = PER_WORKER_BATCH * mwms_cluster.num_workers
    assert all(v["first"] == 4 for v in resumed.return_values)
    seen = set().union(*_seen(resumed))
    assert seen == set(range(0, (STEPS - 4) * global_batch))       # batches 0-3 again


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="tensorflow#24408")
def test_restore_skips_the_data_already_trained(mwms_cluster, tmp_path):
    """Fixed: on restore the input skips the batches the checkpoint covers.

    TensorFlow: after the restart the workers train batches 4-7, each
    example of them once.

    Source: tensorflow#24408.

    Fix: this.
    """
    resumed = _restarted(mwms_cluster, tmp_path, None)
    global_batch = PER_WORKER_BATCH * mwms_cluster.num_workers
    assert all(v["first"] == 4 for v in resumed.return_values)
    assert set().union(*_seen(resumed)) == set(range(4 * global_batch, STEPS * global_batch))


def train_batch_norm(synchronized=False, steps=10):
    """Keras 3 in a custom loop: a ``BatchNormalization`` layer, each
    worker on data of its own (its mean 5 apart from the next worker's).
    Returns this worker's copy of the layer's moving mean."""
    import numpy as np
    import tensorflow as tf

    import harness
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(10 + ctx.index)
    x = (rng.random((256, 4)) + 5 * ctx.index).astype("float32")
    y = rng.integers(0, 2, 256)
    own = tf.data.Options()
    own.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32).with_options(own)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    global_batch = ctx.global_batch_size(32)
    with strategy.scope():
        norm = tf.keras.layers.BatchNormalization(momentum=0.5, synchronized=synchronized)
        model = tf.keras.Sequential([tf.keras.Input((4,)), norm, tf.keras.layers.Dense(2)])
        optimizer = tf.keras.optimizers.SGD(0.1)
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                    reduction="none")

    @tf.function
    def step(inputs):
        def replica(images, labels):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_object(labels, model(images, training=True)),
                                                  global_batch_size=global_batch)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss
        return strategy.reduce("SUM", strategy.run(replica, args=inputs), axis=None)

    for _ in ctx.steps(steps):
        step(next(iterator))
    return [round(float(v), 4) for v in np.asarray(norm.moving_mean.numpy())]


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="ReplicaDivergence", source="tensorflow#41980",
          fixed_by="test_batch_norm_synchronized", on={"2.15": dict(outcome="completed")})
def test_batch_norm_statistics_per_worker(mwms_cluster):
    """Keras 3 ``BatchNormalization()`` (not synchronized) in a custom loop,
    each worker on data of its own.

    TensorFlow: each worker normalises with its own batch's statistics and
    keeps its own moving mean and variance (Keras 3 makes them mirrored
    variables, updated locally): the job completes and the workers' moving
    means differ by the data's offset, so the model each worker would save
    differs.  The replica check names the moving mean.  (tf_keras keeps
    them sync-on-read, averaged when read: its ``fit`` hides the same
    difference.)  On TensorFlow 2.15 ``tf.keras`` is Keras 2, whose moving
    statistics are sync-on-read too: the replica check finds every mirrored
    variable equal and the run completes (measured).

    Source: tensorflow#41980 (SyncBatchNormalization statistics across
    workers).

    Fix: ``BatchNormalization(synchronized=True)``: statistics all-reduced
    across the replicas every step.
    """
    if mwms_cluster.num_workers == 1:
        pytest.skip("one worker: nothing to differ from")
    result = mwms_cluster.run(train_batch_norm, timeout=30, check_replicas=True)
    if not DEFAULT_IS_KERAS_3:
        result.assert_completed()
        return
    result.assert_failed(error="ReplicaDivergence")
    assert "moving_mean" in result.replicas.divergence.variable
    assert result.replicas.divergence.max_difference > 1.0


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="tensorflow#41980")
def test_batch_norm_synchronized(mwms_cluster):
    """Fixed: ``BatchNormalization(synchronized=True)``.

    TensorFlow: the batch statistics are all-reduced every step, so the
    moving statistics are the same on every worker (those of all the data).

    Source: tensorflow#41980.

    Fix: this.
    """
    result = mwms_cluster.run(train_batch_norm, kwargs={"synchronized": True}, timeout=30,
                              check_replicas=True)
    result.assert_completed()
    assert all(v == result.return_values[0] for v in result.return_values)


# ------------------------------------------------------- gradients not summed

@pytest.mark.by_version   # measured on 2.15.1's Keras 2 too
@pytest.mark.timeout(60)
@scenario(outcome="failed", error="ReplicaDivergence", source="keras#19308",
          fixed_by="test_gradients_summed_before_they_are_applied")
def test_gradients_applied_without_summing(mwms_cluster):
    """Each worker applies its own gradients: nothing sums them across the
    workers.

    Three variables under Keras 2's SGD in a custom loop, each worker on
    inputs of its own, applied with ``apply_gradients(...,
    skip_gradients_aggregation=True)`` and no sum of the loop's own
    (``train_in_order(reduce="nobody")`` of ``test_collective_order``).

    TensorFlow: 2.21 with tf_keras 2.21, measured: with
    ``skip_gradients_aggregation=True`` the step's only collective is its
    loss's reduce; each worker updates its mirrored variables with its own
    gradients, and the job completes with replicas that differ.  The
    replica check fails the run (``ReplicaDivergence``); each worker's
    inputs are its own, so no majority stands and it cannot tell which is
    right.  Keras 3 before 3.5 does the same by default (keras#19308:
    ``apply_gradients`` under ``tf.distribute`` without summing; measured
    with Keras 3.4.1 on TensorFlow 2.21, where the step all-reduced only
    its loss and the replicas differed the same way).  TensorFlow 2.15.1's
    Keras 2 the same (measured).

    Source: keras#19308 (Keras 3's gradients not summed across replicas,
    fixed in Keras 3.5).

    Fix: sum the gradients before applying them
    (``test_gradients_summed_before_they_are_applied``), let the optimizer
    sum them (the default), or on Keras 3 use 3.5 or later.
    """
    if mwms_cluster.num_workers == 1:
        pytest.skip("one worker: nothing to differ from")
    result = mwms_cluster.run(train_in_order, kwargs={"reduce": "nobody"}, timeout=30,
                              check_replicas=True, env=KERAS_2)
    result.assert_failed(error="ReplicaDivergence")
    result.assert_cannot_tell(range(mwms_cluster.num_workers))
    assert "w0" in result.replicas.divergence.variable
    steps = [c for c in result.workers[0].collectives if c.function == "step"]
    assert {c.shape for c in steps} == {(1,)}, steps   # the loss's reduce alone


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="keras#19308")
def test_gradients_summed_before_they_are_applied(mwms_cluster):
    """Fixed: the loop sums the gradients across the workers
    (``ReplicaContext.all_reduce``) before it applies them unaggregated.

    TensorFlow: 2.21 with tf_keras 2.21, measured: the step all-reduces
    the gradients, then its loss; every worker returns the same variables
    (the replica check agrees).

    Source: keras#19308.

    Fix: this is the fix.
    """
    result = mwms_cluster.run(train_in_order, kwargs={"reduce": "loop"}, timeout=30,
                              check_replicas=True, env=KERAS_2)
    result.assert_completed()
    assert len({str(v) for v in result.return_values}) == 1
