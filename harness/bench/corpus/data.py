"""Users' bugs in ``tf.data`` pipelines under MWMS: datasets whose length,
sharding or batching differs per worker.  The jobs are users' scripts as
functions, on the cluster, model and train step of
:mod:`harness.bench.corpus.loops`."""
from __future__ import annotations

import os

from harness.bench.corpus import Case, at_fault, no_single
from harness.bench.corpus.loop_parts import (FEATURES, GLOBAL_BATCH, STEPS, arrays, build, is_chief,
                                        make_train_step, num_tasks, replica_loss, sharded,
                                        task_index)

TF_DATA = "tf.data"


# -- tf.data --------------------------------------------------------------------------

PER_WORKER_BATCHES = 8


def _short_local_copy(directory: str, broken: bool):
    """Each worker reads its own copy of the training files; worker 1's copy
    is short (6 batches, the others' 8).  The broken script runs as many
    steps as its own data holds; the fixed one iterates the distributed
    dataset to its end.

    TensorFlow 2.21.0: worker 1 returns after 6 steps; the others wait in
    step 6 for ever.  Iterating the distributed dataset, TensorFlow agrees
    across workers when data ends, and all complete."""
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model, optimizer = build(tf, strategy)
    train_step = make_train_step(tf, strategy, model, optimizer)
    per_replica = GLOBAL_BATCH // num_tasks()
    batches = PER_WORKER_BATCHES - 2 if task_index() == 1 else PER_WORKER_BATCHES
    x, y = arrays(batches * per_replica, seed=task_index())
    local = tf.data.Dataset.from_tensor_slices((x, y)).batch(per_replica)
    dist = strategy.distribute_datasets_from_function(lambda context: local)
    ran = 0
    if broken:
        iterator = iter(dist)
        for _ in range(int(local.cardinality())):
            train_step(next(iterator))
            ran += 1
    else:
        for batch in dist:
            train_step(batch)
            ran += 1
    return ran


def steps_from_local_cardinality(directory: str):
    return _short_local_copy(directory, broken=True)


def iterate_distributed_dataset(directory: str):
    return _short_local_copy(directory, broken=False)


EXAMPLES = 200   # 8 full global batches of 24, then a partial one of 8


def _fixed_steps_without_repeat(directory: str, broken: bool, epochs: int = 2,
                                steps_per_epoch: int = 8):
    """``steps_per_epoch`` steps per epoch from one iterator, as the
    tutorials do; the broken script left out ``.repeat()``.

    TensorFlow 2.21.0: the data holds 9 global batches; the end of data is
    agreed across workers, so ``next()`` raises StopIteration on every
    task at once, in the second epoch."""
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model, optimizer = build(tf, strategy)
    train_step = make_train_step(tf, strategy, model, optimizer)
    x, y = arrays(EXAMPLES)
    iterator = iter(sharded(tf, strategy, x, y, repeat=not broken))
    for epoch in range(epochs):
        for _ in range(steps_per_epoch):
            loss = train_step(next(iterator))
        if is_chief():
            print(f"epoch {epoch}: loss {float(loss):.4f}")


def fixed_steps_without_repeat(directory: str):
    _fixed_steps_without_repeat(directory, broken=True)


def fixed_steps_with_repeat(directory: str):
    _fixed_steps_without_repeat(directory, broken=False)


def _batch_from_host_setting(directory: str, broken: bool):
    """Each step all-reduces the per-example losses (a loss histogram on the
    chief).  The broken script reads the per-replica batch from the host's
    own setting: 16 on the chief's machine, 8 on the others'.

    TensorFlow 2.21.0: the per-example losses are [16] on the chief and [8]
    elsewhere: InvalidArgumentError, a shape mismatch, in step 0."""
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model, optimizer = build(tf, strategy)
    global_batch = 8 * num_tasks()
    x, y = arrays(1024)

    def dataset_fn(context):
        batch = (16 if is_chief() else 8) if broken else \
            context.get_per_replica_batch_size(global_batch)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
        return ds.shard(context.num_input_pipelines,
                        context.input_pipeline_id).batch(batch, drop_remainder=True)

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            per_example, loss = replica_loss(tf, model, x, y, global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return per_example

    @tf.function
    def train_step(batch):
        per_example = strategy.run(replica_step, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_example, axis=None)

    for step in range(STEPS):
        losses = train_step(next(iterator))
        if is_chief():
            print(f"step {step}: {losses.shape[0]} per-example losses")


def batch_from_host_setting(directory: str):
    _batch_from_host_setting(directory, broken=True)


def batch_from_global_batch(directory: str):
    _batch_from_host_setting(directory, broken=False)


def write_records(tf, path: str, x, y):
    with tf.io.TFRecordWriter(path) as writer:
        for features, target in zip(x, y):
            example = tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=features)),
                "y": tf.train.Feature(float_list=tf.train.FloatList(value=target))}))
            writer.write(example.SerializeToString())


def record_dataset(tf, files):
    spec = {"x": tf.io.FixedLenFeature([FEATURES], tf.float32),
            "y": tf.io.FixedLenFeature([1], tf.float32)}

    def parse(record):
        example = tf.io.parse_single_example(record, spec)
        return example["x"], example["y"]
    return tf.data.TFRecordDataset(files).map(parse)


def train_on_files(tf, strategy, files, policy: str):
    """The tutorials' input from files: one dataset of them, auto-sharded by
    ``policy``, through ``experimental_distribute_dataset``."""
    model, optimizer = build(tf, strategy)
    train_step = make_train_step(tf, strategy, model, optimizer)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = getattr(
        tf.data.experimental.AutoShardPolicy, policy)
    dataset = record_dataset(tf, files).repeat().batch(GLOBAL_BATCH).with_options(options)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    for _ in range(STEPS):
        train_step(next(iterator))


def _local_files_short(directory: str, broken: bool, files: int = 4):
    """Each worker reads the files of its own local copy, sharded by FILE;
    worker 1's copy holds 1 file of the 4 (a sync that did not finish).

    TensorFlow 2.21.0: worker 1's shard of its one file is empty; its first
    ``next()`` raises StopIteration, and the others lose it in step 0."""
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    local = os.path.join(directory, f"host-{task_index()}")
    os.makedirs(local, exist_ok=True)
    have = 1 if broken and task_index() == 1 else files
    for f in range(have):
        x, y = arrays(64, seed=f)
        write_records(tf, os.path.join(local, f"part-{f}.tfrecord"), x, y)
    train_on_files(tf, strategy, sorted(tf.io.gfile.glob(os.path.join(local, "*.tfrecord"))),
                   "FILE")


def local_copy_missing_files(directory: str):
    _local_files_short(directory, broken=True)


def local_copy_complete(directory: str):
    _local_files_short(directory, broken=False)


def _fewer_files_than_workers(directory: str, policy: str):
    """One shared directory of N - 1 files (the chief writes them; the
    others wait for its marker).

    TensorFlow 2.21.0, FILE: workers 0 to N - 2 raise InvalidArgumentError
    (``Could not apply FILE based sharding``), the last StopIteration (its
    shard is empty), all at the first ``next()``: the same code and files
    everywhere, no single worker at fault.  DATA: all complete."""
    import time

    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    done = os.path.join(directory, "written")
    if is_chief():
        for f in range(num_tasks() - 1):
            x, y = arrays(64, seed=f)
            write_records(tf, os.path.join(directory, f"part-{f}.tfrecord"), x, y)
        open(done, "w").close()
    while not os.path.exists(done):
        time.sleep(0.1)
    train_on_files(tf, strategy, sorted(tf.io.gfile.glob(os.path.join(directory, "*.tfrecord"))),
                   policy)


def file_shard_fewer_files(directory: str):
    _fewer_files_than_workers(directory, "FILE")


def data_shard_fewer_files(directory: str):
    _fewer_files_than_workers(directory, "DATA")


def _repeat_on_chief(directory: str, broken: bool, epochs: int = 2):
    """Each epoch iterates the distributed dataset to its end.  The broken
    script repeats the chief's pipeline (a flag only its launcher sets).

    TensorFlow 2.21.0: an infinite dataset skips the per-step all-reduce
    that agrees whether data is left, so the chief's gradient all-reduce
    meets the others' (int64) one: InternalError in step 0."""
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model, optimizer = build(tf, strategy)
    train_step = make_train_step(tf, strategy, model, optimizer)
    x, y = arrays(128)

    def dataset_fn(context):
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(
            context.num_input_pipelines, context.input_pipeline_id)
        ds = ds.repeat() if broken and is_chief() else ds
        return ds.batch(context.get_per_replica_batch_size(GLOBAL_BATCH))

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    ran = 0
    for _ in range(epochs):
        for batch in dist:
            train_step(batch)
            ran += 1
    return ran


def repeat_on_chief(directory: str):
    return _repeat_on_chief(directory, broken=True)


def repeat_nowhere(directory: str):
    return _repeat_on_chief(directory, broken=False)


CASES = (
    Case("data_steps_from_local_cardinality", TF_DATA,
         "tensorflow/tensorflow#37112, tensorflow/tensorflow#35878",
         "each worker runs as many steps as its own files hold batches; worker 1's copy is short.",
         steps_from_local_cardinality, iterate_distributed_dataset,
         truth=at_fault(1), sizes=(2, 3, 4), timeout=12),
    Case("data_fixed_steps_without_repeat", TF_DATA,
         "tensorflow/tensorflow#36153 (the maintainers' workaround: .repeat() and steps_per_epoch)",
         "two epochs of a fixed number of steps from one iterator, without .repeat().",
         fixed_steps_without_repeat, fixed_steps_with_repeat,
         truth=lambda n: no_single(range(n)), sizes=(2, 3), timeout=10),
    Case("data_batch_from_host_setting", TF_DATA,
         "tensorflow/tensorflow#34156 (per-worker batch sizes under MWMS)",
         "the per-replica batch is read from each host's setting: 16 on the chief, 8 elsewhere.",
         batch_from_host_setting, batch_from_global_batch,
         truth=at_fault(0), sizes=(2, 3), chief=True, timeout=10),
    Case("data_local_copy_missing_files", TF_DATA,
         "TensorFlow's distributed input guide (FILE auto-sharding needs a file per worker)",
         "each worker reads its local copy of the files, sharded by FILE; worker 1's copy has 1.",
         local_copy_missing_files, local_copy_complete,
         truth=at_fault(1), sizes=(2, 3), timeout=10),
    Case("data_file_shard_fewer_files", TF_DATA,
         "TensorFlow's distributed input guide (FILE auto-sharding needs a file per worker)",
         "AutoShardPolicy.FILE on N - 1 files for N workers.",
         file_shard_fewer_files, data_shard_fewer_files,
         truth=lambda n: no_single(range(n)), sizes=(2, 3), timeout=10),
    Case("data_repeat_on_chief", TF_DATA,
         "tensorflow/tensorflow#37112 (iterating the distributed dataset to its end)",
         "epochs iterate the distributed dataset to its end; the chief's pipeline repeats.",
         repeat_on_chief, repeat_nowhere,
         truth=at_fault(0), sizes=(2, 3), timeout=10),
)
