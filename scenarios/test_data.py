"""Input data: how much each worker has, how it is split and batched (the
seed article's rule 4)."""
import os

import pytest

from scenarios.meta import culprit_check, culprit_from_three, scenario

BATCH = 32  # per replica, in the uneven-shards scenarios


# ---------------------------------------------------------------- uneven shards

def train_uneven_shards(loop="local_count"):
    """Worker i holds its own 32 * (8 + i) examples (its own files, say).

    ``loop``: ``"local_count"`` runs as many steps as its own data holds
    batches; ``"dataset"`` iterates the distributed dataset until it ends.
    Returns the number of steps this worker ran.
    """
    import tensorflow as tf

    import harness
    from scenarios import mnist_like
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    _, _, step = mnist_like.make_training(strategy, global_batch_size=BATCH * ctx.num_workers)
    n_local = BATCH * (8 + ctx.index)
    x, y = mnist_like.make_data(n_local, seed=ctx.index)

    def dataset_fn(input_context):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    ran = 0
    if loop == "local_count":
        iterator = iter(dist)
        for _ in ctx.steps(n_local // BATCH):
            step(next(iterator))
            ran += 1
    else:
        for batch, _ in zip(dist, ctx.steps(10_000)):
            step(batch)
            ran += 1
    return ran


# Declared once certain (the short worker returned); the timeout only bounds
# a loaded machine's wait for that return (its iterator's teardown took
# over 5 s at 4 workers beside 3 other runs on 2 cores).
_UNEVEN_RUN = dict(timeout=15)


@pytest.mark.timeout(60)
@scenario(outcome="hang", source="tensorflow#35878, tensorflow#36153",
          fixed_by="test_uneven_shards_iterate_the_distributed_dataset")
def test_uneven_shards_steps_from_local_size(mwms_cluster, scenario_run):
    """Workers hold different amounts of data and each runs as many steps as
    its own shard holds batches.

    TensorFlow: worker 0 (8 batches) runs out first and returns; the others
    block forever in the all-reduce of step 8.  No error.

    Source: tensorflow#35878, tensorflow#36153 (and #37112 for custom loops).

    Fix: iterate the distributed dataset itself (``for batch in dist_dataset``):
    MWMS then agrees across workers whether any still has data and hands the
    exhausted ones empty batches; or ``.repeat()`` and one ``steps_per_epoch``
    for all.
    """
    result = scenario_run("uneven", train_uneven_shards, **_UNEVEN_RUN)
    result.assert_hang()
    assert result.workers[0].return_value == 8
    assert all(w.return_value is None and w.last_step == 8 for w in result.workers[1:])


@pytest.mark.timeout(60)
@culprit_check("test_uneven_shards_steps_from_local_size")
def test_uneven_shards_steps_from_local_size_culprit(mwms_cluster, scenario_run):
    """Worker 0 stopped early, leaving the others in step 8: it is the
    culprit from 3 workers up.  With 2, a loop that ended early looks like
    one that ran a step too many: it cannot tell."""
    result = scenario_run("uneven", train_uneven_shards, **_UNEVEN_RUN)
    culprit_from_three(result, 0)
    if mwms_cluster.num_workers > 2:
        result.assert_hang(step=8)


@pytest.mark.timeout(120)   # 4 workers beside 3 other runs on 2 cores took over 60 s
@scenario(outcome="completed", source="tensorflow#35878, tensorflow#36153")
def test_uneven_shards_iterate_the_distributed_dataset(mwms_cluster):
    """Fixed: the same uneven shards, iterated with ``for batch in dist_dataset``.

    TensorFlow: each step all-reduces whether any worker still has data;
    a worker whose shard is done gets empty batches until the largest shard
    is done: every worker runs 8 + N - 1 steps and completes.

    Source: tensorflow#35878, tensorflow#36153; fixed in TensorFlow 2.3+.

    Fix: loop over the distributed dataset (or its iterator's
    ``get_next_as_optional``) instead of counting local batches.
    """
    result = mwms_cluster.run(train_uneven_shards, kwargs={"loop": "dataset"}, timeout=20)
    result.assert_completed()
    n = mwms_cluster.num_workers
    assert result.return_values == [8 + n - 1] * n


# ---------------------------------------------------------------- partial batches

EXAMPLES = 1000  # 15 full global batches of 64, then a partial one of 40


def train_epochs(mode="repeat", epochs=3, steps_per_epoch=10):
    """The seed's loop on 1000 examples for 3 epochs; returns the steps run.

    ``mode``: ``"repeat"`` (the seed's ``.repeat()`` and a fixed
    ``steps_per_epoch``), ``"no_repeat_fixed_steps"`` (no ``.repeat()``, the
    same fixed steps) or ``"no_repeat_per_epoch"`` (no ``.repeat()``, each
    epoch iterates the distributed dataset to its end, partial batch
    included).
    """
    import tensorflow as tf

    import harness
    from scenarios import mnist_like
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    _, _, step = mnist_like.make_training(strategy)
    x, y = mnist_like.make_data(EXAMPLES)
    dist = mnist_like.distributed_dataset(strategy, x, y, repeat=mode == "repeat")
    ran = 0
    if mode == "no_repeat_per_epoch":
        steps = iter(ctx.steps(10_000))
        for _ in range(epochs):
            for batch, _ in zip(dist, steps):
                step(batch)
                ran += 1
    else:
        iterator = iter(dist)
        for _ in ctx.steps(epochs * steps_per_epoch):
            step(next(iterator))
            ran += 1
    return ran


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="tensorflow#36153, seed rule 4")
def test_repeat_with_steps_per_epoch(mwms_cluster):
    """Fixed: ``.repeat()`` the dataset and run a fixed number of steps per epoch.

    TensorFlow: every worker draws full batches forever; all run
    3 x 10 steps and complete.

    Source: tensorflow#36153 (the workaround its maintainers gave); the seed
    article's example.

    Fix: ``dataset.repeat()`` plus one ``steps_per_epoch`` for all workers.
    """
    result = mwms_cluster.run(train_epochs, timeout=20)
    result.assert_completed()
    assert result.return_values == [30] * mwms_cluster.num_workers


@pytest.mark.timeout(120)   # 4 workers beside 3 other runs on 2 cores took over 60 s
@scenario(outcome="completed", source="tensorflow#36153, tensorflow#37112",
          fixed_by="test_repeat_with_steps_per_epoch")
def test_last_partial_batch_without_repeat(mwms_cluster):
    """No ``.repeat()`` and no ``steps_per_epoch``: each epoch ends with a
    partial batch (1000 examples, global batch 64).

    TensorFlow: this hung in TensorFlow 2.0-2.2; since 2.3 the distributed
    iterator agrees across workers when the data ends and splits the last
    partial batch, so all workers run 16 steps per epoch and complete.  The
    scenario guards that fix: a release that regresses turns it red.

    Source: tensorflow#36153, tensorflow#37112.

    Fix: none needed on this version; on old ones, ``.repeat()`` and
    ``steps_per_epoch``.
    """
    result = mwms_cluster.run(train_epochs, kwargs={"mode": "no_repeat_per_epoch"}, timeout=20)
    result.assert_completed()
    assert result.return_values == [3 * 16] * mwms_cluster.num_workers


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="StopIteration", source="seed rule 4",
          fixed_by="test_repeat_with_steps_per_epoch")
def test_fixed_steps_outrun_unrepeated_data(mwms_cluster):
    """The seed's fixed 3 x 10 steps, but the ``.repeat()`` left out: the
    data holds 16 batches.

    TensorFlow: every worker takes the last, partial batch at step 15; at
    step 16 ``next(iterator)`` raises ``StopIteration`` on every worker at
    once (the end of data is agreed across workers): an error, not a hang.

    Source: seed rule 4 (its example has ``.repeat()`` for this reason).

    Fix: ``.repeat()`` with a fixed ``steps_per_epoch``, or iterate the
    dataset to its end each epoch.
    """
    result = mwms_cluster.run(train_epochs, kwargs={"mode": "no_repeat_fixed_steps"},
                              timeout=20)
    n = mwms_cluster.num_workers
    result.assert_failed(culprits=range(n), error="StopIteration")
    assert all(w.last_step == 16 for w in result.workers)


# ---------------------------------------------------------------- FILE sharding

FILES_EXAMPLES = 256


def write_tfrecords(directory, n_files):
    """Worker 0 writes ``n_files`` TFRecord files of 256 MNIST-like examples
    each into ``directory`` (the others do nothing); returns the paths."""
    import tensorflow as tf

    import harness
    from scenarios import mnist_like
    if harness.context().index != 0:
        return []
    x, y = mnist_like.make_data(n_files * FILES_EXAMPLES)
    paths = []
    for f in range(n_files):
        path = os.path.join(directory, f"part-{f:03d}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for i in range(f * FILES_EXAMPLES, (f + 1) * FILES_EXAMPLES):
                example = tf.train.Example(features=tf.train.Features(feature={
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=x[i])),
                    "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[y[i]]))}))
                writer.write(example.SerializeToString())
        paths.append(path)
    return paths


def train_from_files(directory, policy="FILE", steps=5):
    """Train on the TFRecord files in ``directory``, auto-sharded by ``policy``."""
    import tensorflow as tf

    import harness
    from scenarios import mnist_like
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    _, _, step = mnist_like.make_training(strategy)
    files = sorted(tf.io.gfile.glob(os.path.join(directory, "*.tfrecord")))
    spec = {"x": tf.io.FixedLenFeature([mnist_like.FEATURES], tf.float32),
            "y": tf.io.FixedLenFeature([], tf.int64)}

    def parse(record):
        example = tf.io.parse_single_example(record, spec)
        return example["x"], example["y"]

    dataset = tf.data.TFRecordDataset(files).map(parse).repeat().batch(
        mnist_like.GLOBAL_BATCH_SIZE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = getattr(
        tf.data.experimental.AutoShardPolicy, policy)
    iterator = iter(strategy.experimental_distribute_dataset(dataset.with_options(options)))
    losses = [float(step(next(iterator))) for _ in ctx.steps(steps)]
    return losses[-1]


def _fewer_files_than_workers(mwms_cluster, directory, policy):
    """Write N - 1 files (a first run, on worker 0), then train on them."""
    n_files = mwms_cluster.num_workers - 1
    prepared = mwms_cluster.run(write_tfrecords, args=(str(directory), n_files), timeout=20)
    prepared.assert_completed()
    assert len(prepared.return_values[0]) == n_files
    return mwms_cluster.run(train_from_files, args=(str(directory), policy), timeout=10, grace=2)


def _file_shard_run(scenario_run, mwms_cluster, directory):
    """The FILE-policy run, shared by the scenario and its culprit check."""
    return scenario_run.shared(
        "file_shard", lambda: _fewer_files_than_workers(mwms_cluster, directory, "FILE"))


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="InvalidArgumentError",
          source="TensorFlow distributed input guide",
          fixed_by="test_data_autoshard_with_fewer_files_than_workers")
def test_file_autoshard_with_fewer_files_than_workers(mwms_cluster, scenario_run, tmp_path):
    """``AutoShardPolicy.FILE`` on a dataset of N - 1 TFRecord files for N workers.

    TensorFlow: FILE sharding gives each worker whole files, and there are
    not enough: at the first ``next()`` workers 0 to N - 2 raise
    ``InvalidArgumentError: Could not apply FILE based sharding: the dataset
    only has 1 file(s), which is not enough for the required 2
    shards/workers`` and the last worker, left without a file, raises
    ``StopIteration``.

    Source: the TensorFlow distributed input guide (auto-sharding); a common
    MWMS question.

    Fix: at least as many files as workers, or ``AutoShardPolicy.DATA``
    (every worker reads everything and keeps its share), or shard by hand
    in ``distribute_datasets_from_function``.
    """
    result = _file_shard_run(scenario_run, mwms_cluster, tmp_path)
    result.assert_failed()
    *first, last = result.workers
    assert all(w.exception.type_name == "InvalidArgumentError"
               and "Could not apply FILE based sharding" in w.exception.message for w in first)
    assert last.exception.type_name == "StopIteration"


@pytest.mark.timeout(60)
@culprit_check("test_file_autoshard_with_fewer_files_than_workers")
def test_file_autoshard_with_fewer_files_than_workers_culprit(mwms_cluster, scenario_run,
                                                              tmp_path):
    """The root error is the sharding one, raised by workers 0 to N - 2, the
    last worker's StopIteration its consequence; its cause is the job's
    files, which every task shares, so every task is named."""
    result = _file_shard_run(scenario_run, mwms_cluster, tmp_path)
    result.assert_failed(culprits=range(mwms_cluster.num_workers), error="InvalidArgumentError")
    assert result.diagnosis.startswith("FAILED: no single task is at fault: the dataset has "
                                       "fewer files than the workers"), result.diagnosis


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="TensorFlow distributed input guide")
def test_data_autoshard_with_fewer_files_than_workers(mwms_cluster, tmp_path):
    """Fixed: the same N - 1 files, with ``AutoShardPolicy.DATA``.

    TensorFlow: every worker reads all files and keeps every N-th example;
    all workers complete.

    Source: the TensorFlow distributed input guide (auto-sharding).

    Fix: ``options.experimental_distribute.auto_shard_policy =
    AutoShardPolicy.DATA`` (or more files than workers with FILE).
    """
    _fewer_files_than_workers(mwms_cluster, tmp_path, "DATA").assert_completed()


# ---------------------------------------------------------------- batch sizes

GLOBAL_BATCH = 48  # divisible by 2, 3 and 4 workers

def train_batch_sizes(per_worker_batch="config", steps=5):
    """Each step all-reduces the per-example losses (say, for a global loss
    histogram); returns the shape of the last reduced value.

    ``per_worker_batch``: ``"config"`` gives the chief a per-replica batch
    of 32 and the others 16 (each worker's own setting);
    ``"global"`` derives every worker's from the one global batch size.
    """
    import tensorflow as tf

    import harness
    from harness import workloads
    from scenarios import mnist_like
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model, optimizer, _ = mnist_like.make_training(strategy)
    loss_object = workloads.make_loss_object()
    x, y = mnist_like.make_data()

    def dataset_fn(input_context):
        if per_worker_batch == "config":
            batch = 32 if ctx.index == 0 else 16
        else:
            batch = input_context.get_per_replica_batch_size(GLOBAL_BATCH)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
        return ds.shard(input_context.num_input_pipelines,
                        input_context.input_pipeline_id).batch(batch, drop_remainder=True)

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

    def replica_step(inputs):
        per_example, _, grads = workloads.replica_gradients(model, loss_object, inputs,
                                                            GLOBAL_BATCH)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return per_example

    @tf.function
    def step(inputs):
        per_example = strategy.run(replica_step, args=(inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_example, axis=None)

    shape = None
    for _ in ctx.steps(steps):
        shape = tuple(step(next(iterator)).shape)
    return shape


_BATCH_RUN = dict(kwargs={"per_worker_batch": "config"}, timeout=10, grace=2)


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="InvalidArgumentError", source="tensorflow#34156",
          fixed_by="test_per_worker_batch_size_from_the_global_one")
def test_per_worker_batch_size_mismatch(mwms_cluster, scenario_run):
    """Workers use different per-replica batch sizes (32 on the chief, 16
    elsewhere), and a batch-shaped value is all-reduced.

    TensorFlow: the gradients still match in shape and all-reduce fine, but
    the per-example losses are [32] on one worker and [16] on the others:
    ``InvalidArgumentError: Shape mismatch in the collective instance ...
    expected shape [32] but another member in the group expected shape [16]``
    at step 0 (on every worker, or all but one which is killed blocked).

    Source: tensorflow#34156.

    Fix: derive every worker's batch from one global batch size
    (``input_context.get_per_replica_batch_size(GLOBAL_BATCH)``), and
    reduce batch-shaped values over the batch axis (``axis=0``).
    """
    result = scenario_run("batch", train_batch_sizes, **_BATCH_RUN)
    result.assert_failed(error="InvalidArgumentError")
    assert any("Shape mismatch in the collective instance" in w.exception.message
               for w in result.workers if w.exception is not None)
    assert all(w.last_step == 0 for w in result.workers)


@pytest.mark.timeout(60)
@culprit_check("test_per_worker_batch_size_mismatch")
def test_per_worker_batch_size_mismatch_culprit(mwms_cluster, scenario_run):
    """The chief's batch differs from all the others': it is the culprit from
    3 workers up (the odd shape).  With 2 the two shapes are symmetric and
    who raised first is no evidence: it cannot tell."""
    result = scenario_run("batch", train_batch_sizes, **_BATCH_RUN)
    culprit_from_three(result, 0)


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="tensorflow#34156")
def test_per_worker_batch_size_from_the_global_one(mwms_cluster):
    """Fixed: every worker's batch is ``get_per_replica_batch_size(48)``.

    TensorFlow: all per-example tensors have the same shape everywhere; the
    all-reduce succeeds and all workers complete.

    Source: tensorflow#34156.

    Fix: one global batch size, divided by ``num_replicas_in_sync``.
    """
    result = mwms_cluster.run(train_batch_sizes, kwargs={"per_worker_batch": "global"},
                              timeout=20)
    result.assert_completed()
    n = mwms_cluster.num_workers
    assert result.return_values == [(GLOBAL_BATCH // n,)] * n
