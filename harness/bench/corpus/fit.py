"""Users' bugs through Keras's ``fit``: tf_keras and Keras 3 (callbacks: :mod:`.callbacks`).

Each job is a user's script as a function: it reads ``TF_CONFIG``, builds
its strategy, model and data, and fits.  Data is made in the job.  A broken
job's docstring says how TensorFlow ends it.  A case's ``keras`` holds for
both its jobs, so the Keras 3 cases' fixed twins import tf_keras themselves,
as the workaround of keras-team/keras#20585 reads.
"""
from __future__ import annotations

import json
import os

from harness.bench.corpus import Case, at_fault, no_single

BATCH = 16
SAMPLES = 128


def task_index() -> int:
    """This task's index among the tasks in the collectives (a chief first)."""
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    return task["index"] + (len(cluster.get("chief", ())) if task["type"] == "worker" else 0)


def is_chief() -> bool:
    """The tutorials' test: the chief, or worker 0 where there is none."""
    return task_index() == 0


def num_tasks() -> int:
    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    return sum(len(cluster.get(kind, ())) for kind in ("chief", "worker"))


def small_model(tf, keras=None, metrics=(), optimizer="sgd"):
    keras = keras or tf.keras
    model = keras.Sequential([keras.layers.Input((8,)), keras.layers.Dense(4),
                              keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse", metrics=list(metrics))
    return model


def arrays(tf, samples: int = SAMPLES, seed: int = 2):
    x = tf.random.stateless_normal((samples, 8), seed=(1, seed))
    return x, tf.reduce_sum(x, axis=1, keepdims=True)


def repeated(tf, samples: int = SAMPLES):
    """The training set every worker shares: repeated, fitted with ``steps_per_epoch``."""
    return tf.data.Dataset.from_tensor_slices(arrays(tf, samples)).repeat().batch(BATCH)


def own(tf, dataset):
    """A worker's own data: the strategy does not shard it."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)


def fitted(tf, **compile_kwargs):
    """The strategy, then the model built and compiled in its scope."""
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = small_model(tf, **compile_kwargs)
    return strategy, model


def _uneven_batch(directory: str, broken: bool):
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = small_model(tf)
    x, y = arrays(tf)
    # Each worker batches its own shard: the broken script halves the batch
    # on worker 1 (a per-host setting read from the wrong place).
    batch = BATCH // 2 if broken and task_index() == 1 else BATCH
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).with_options(options)
    model.fit(data, epochs=2, verbose=0)


def uneven_batch(directory: str):
    _uneven_batch(directory, broken=True)


def even_batch(directory: str):
    _uneven_batch(directory, broken=False)


# ---------------------------------------------------------------- steps per epoch

def _local_steps(directory: str, broken: bool):
    import tensorflow as tf
    _, model = fitted(tf)
    # Each worker's share of the records: the last worker's is larger.
    records = SAMPLES // 2 + (2 * BATCH if task_index() == num_tasks() - 1 else 0)
    # The broken script counts its own records; the fixed one agrees on a number.
    steps = records // BATCH if broken else (SAMPLES // 2) // BATCH
    model.fit(repeated(tf), epochs=2, steps_per_epoch=steps, verbose=0)


def steps_from_local_count(directory: str):
    """The workers that count fewer steps end each epoch first; their next
    collective meets the last worker's gradient all-reduce (TensorFlow 2.21:
    InvalidArgumentError, a shape mismatch)."""
    _local_steps(directory, broken=True)


def steps_agreed(directory: str):
    _local_steps(directory, broken=False)


def last_task(size: int):
    return at_fault(size - 1)


def every_task(size: int):
    return no_single(range(size))


# ---------------------------------------------------------------- validation

def _validation(directory: str, broken: bool):
    import tensorflow as tf
    _, model = fitted(tf)
    # Each worker validates on its own held-out records; the last has a batch more.
    batches = 3 + (1 if task_index() == num_tasks() - 1 else 0)
    held_out = tf.data.Dataset.from_tensor_slices(
        arrays(tf, batches * BATCH, seed=10 + task_index())).batch(BATCH)
    kwargs = {}
    if not broken:
        held_out, kwargs["validation_steps"] = held_out.repeat(), 3
    model.fit(repeated(tf), epochs=2, steps_per_epoch=4, validation_data=own(tf, held_out),
              verbose=0, **kwargs)


def validation_uneven(directory: str):
    """tf_keras counts validation steps from each worker's own dataset: the
    others leave validation while the last runs one more step (TensorFlow
    2.21: InternalError, a collective's type mismatch)."""
    _validation(directory, broken=True)


def validation_with_steps(directory: str):
    _validation(directory, broken=False)


# ---------------------------------------------------------------- a dataset per worker

def _drop_remainder(directory: str, broken: bool):
    import tensorflow as tf
    _, model = fitted(tf)
    # Each worker's own 72 records: 4 full batches and a partial one.
    data = tf.data.Dataset.from_tensor_slices(arrays(tf, 72, seed=20 + task_index()))
    data = data.batch(BATCH, drop_remainder=broken and task_index() == 1)
    model.fit(own(tf, data), epochs=2, verbose=0)


def drop_remainder_on_one(directory: str):
    """Worker 1's epoch has a step fewer (TensorFlow 2.21: InternalError, a
    collective's type mismatch at the end of its epoch)."""
    _drop_remainder(directory, broken=True)


def drop_remainder_nowhere(directory: str):
    _drop_remainder(directory, broken=False)


FILES = 5          # record files of one batch each


def _file_lists(directory: str, broken: bool):
    import tensorflow as tf
    _, model = fitted(tf)
    # Each worker reads every n-th file: 5 files do not split evenly.
    mine = list(range(FILES))[task_index()::num_tasks()]
    parts = [tf.data.Dataset.from_tensor_slices(arrays(tf, BATCH, seed=30 + f)) for f in mine]
    data = parts[0]
    for part in parts[1:]:
        data = data.concatenate(part)
    data = own(tf, data.batch(BATCH))
    if broken:
        model.fit(data, epochs=2, verbose=0)
    else:
        # Repeated, with as many steps as the smallest share holds.
        model.fit(data.repeat(), epochs=2, steps_per_epoch=FILES // num_tasks(), verbose=0)


def file_lists_uneven(directory: str):
    """The workers' epochs have different lengths (TensorFlow 2.21:
    InternalError, a collective's type mismatch where the shorter ends)."""
    _file_lists(directory, broken=True)


def file_lists_repeated(directory: str):
    _file_lists(directory, broken=False)


def odd_share(size: int):
    """The worker whose share of the files differs from the majority's
    (at 2, the one that runs out first)."""
    counts = [len(range(FILES)[i::size]) for i in range(size)]
    odd = [i for i, c in enumerate(counts) if counts.count(c) == 1]
    return at_fault(odd[-1] if size > 2 else counts.index(min(counts)))


# ---------------------------------------------------------------- saving

def _save_weights(directory: str, broken: bool):
    import tensorflow as tf
    _, model = fitted(tf)
    model.fit(repeated(tf), epochs=1, steps_per_epoch=4, verbose=0)
    target = directory
    if not broken and not is_chief():
        target = os.path.join(directory, f"workertemp_{task_index()}")
        os.makedirs(target, exist_ok=True)
    model.save_weights(os.path.join(target, "model.weights.h5"))
    if target != directory:
        tf.io.gfile.rmtree(target)


def save_weights_same_path(directory: str):
    """Saving all-reduces the loss tracker's sync-on-read variable, so every
    worker is in the save at once: one holds the HDF5 file's lock while it
    waits in that all-reduce, the others fail to lock it (TensorFlow 2.21:
    BlockingIOError).  The collision is every worker's, not one's."""
    _save_weights(directory, broken=True)


def save_weights_write_paths(directory: str):
    _save_weights(directory, broken=False)


# ---------------------------------------------------------------- the strategy first

def _strategy_order(directory: str, broken: bool):
    import tensorflow as tf
    if broken:
        data = repeated(tf)     # the input pipeline made before the strategy
        _, model = fitted(tf)
    else:
        _, model = fitted(tf)
        data = repeated(tf)
    model.fit(data, epochs=1, steps_per_epoch=4, verbose=0)


def data_before_strategy(directory: str):
    """The pipeline's ops start the eager context before the strategy can
    configure collectives (TensorFlow 2.21: RuntimeError on every worker)."""
    _strategy_order(directory, broken=True)


def strategy_first(directory: str):
    _strategy_order(directory, broken=False)


# ---------------------------------------------------------------- Keras 3

def keras3_fit(directory: str):
    """Keras 3's fit hands the distributed batch to code that wants a tensor
    (TensorFlow 2.21, Keras 3.15: ValueError on every worker)."""
    import tensorflow as tf
    _, model = fitted(tf)
    model.fit(repeated(tf), epochs=1, steps_per_epoch=4, verbose=0)


def tf_keras_fit(directory: str):
    import tensorflow as tf
    import tf_keras
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = small_model(tf, keras=tf_keras)
    model.fit(repeated(tf), epochs=1, steps_per_epoch=4, verbose=0)


def keras3_evaluate(directory: str):
    """As Keras 3's fit (TensorFlow 2.21, Keras 3.15: ValueError on every worker)."""
    import tensorflow as tf
    _, model = fitted(tf)
    model.evaluate(tf.data.Dataset.from_tensor_slices(arrays(tf)).batch(BATCH), verbose=0)


def keras3_evaluate_in_a_loop(directory: str):
    """Keras 3's model, its loss summed per replica and reduced across workers."""
    import tensorflow as tf
    strategy, model = fitted(tf)
    data = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensor_slices(arrays(tf)).batch(BATCH))

    @tf.function
    def step(batch):
        def replica(x, y):
            return tf.reduce_sum(tf.square(model(x, training=False) - y))
        return strategy.reduce("SUM", strategy.run(replica, args=batch), axis=None)

    total = sum(float(step(batch)) for batch in data)
    return total / SAMPLES


# ---------------------------------------------------------------- after fit

def _after_fit(directory: str, broken: bool, work):
    import tensorflow as tf
    _, model = fitted(tf, metrics=["mae"])
    model.fit(repeated(tf), epochs=1, steps_per_epoch=4, verbose=0)
    if is_chief() or not broken:
        work(tf, model, directory)


def _evaluate(tf, model, directory):
    loss = model.evaluate(tf.data.Dataset.from_tensor_slices(arrays(tf, 2 * BATCH, seed=60))
                          .batch(BATCH), verbose=0)
    if is_chief():
        print(f"test loss {loss}")


def _save(tf, model, directory):
    target = directory if is_chief() else os.path.join(directory, f"workertemp_{task_index()}")
    os.makedirs(target, exist_ok=True)
    model.save(os.path.join(target, "model.keras"))
    if target != directory:
        tf.io.gfile.rmtree(target)


def evaluate_after_fit_on_chief(directory: str):
    """The chief evaluates alone after the workers returned (TensorFlow 2.21:
    the chief hangs in evaluate)."""
    _after_fit(directory, True, _evaluate)


def evaluate_after_fit_everywhere(directory: str):
    _after_fit(directory, False, _evaluate)


def save_after_fit_on_chief(directory: str):
    """The chief's save all-reduces the metrics' sync-on-read variables after
    the workers returned (TensorFlow 2.21: the chief hangs in model.save)."""
    _after_fit(directory, True, _save)


def save_after_fit_everywhere(directory: str):
    _after_fit(directory, False, _save)


CASES = (
    Case("fit_uneven_batch_per_worker", "fit (tf_keras)",
         "tensorflow/tensorflow#36153 (a partial last batch under MWMS fit)",
         "worker 1 batches its data with half the batch size, so its epoch has twice the steps.",
         uneven_batch, even_batch,
         truth=at_fault(1),
         sizes=(2, 3), keras="tf_keras", timeout=10),
    Case("fit_steps_per_epoch_from_local_count", "fit (tf_keras)",
         "tensorflow/tensorflow#36515 (how steps_per_epoch should be set under MWMS)",
         "each worker sets steps_per_epoch from its own record count; the last has more.",
         steps_from_local_count, steps_agreed,
         truth=last_task, sizes=(2, 3, 4), keras="tf_keras", timeout=10),
    Case("fit_validation_uneven_without_steps", "fit (tf_keras)",
         "tensorflow/models#10849; tensorflow/tensorflow#33531",
         "each worker validates on its own held-out set, the last one a batch longer, "
         "without validation_steps.",
         validation_uneven, validation_with_steps,
         truth=last_task, sizes=(2, 3), keras="tf_keras", timeout=10),
    Case("fit_drop_remainder_on_one_worker", "fit (tf_keras)",
         "tensorflow/tensorflow#36153 (a partial last batch under MWMS fit)",
         "worker 1 drops its partial last batch, the others keep theirs.",
         drop_remainder_on_one, drop_remainder_nowhere,
         truth=at_fault(1), sizes=(2, 3), keras="tf_keras", timeout=10),
    Case("fit_file_lists_uneven", "fit (tf_keras)",
         "tensorflow/tensorflow#35878 (the Keras example with auto-sharding off hangs)",
         "each worker reads every n-th of 5 files, so their epochs have different lengths.",
         file_lists_uneven, file_lists_repeated,
         truth=odd_share, sizes=(2, 3, 4), keras="tf_keras", timeout=10),
    Case("fit_save_weights_same_path", "fit (tf_keras)",
         "tensorflow/tensorflow#38635 (every worker saves to the same path)",
         "after fit, every worker calls save_weights with the same .h5 path.",
         save_weights_same_path, save_weights_write_paths,
         truth=every_task, sizes=(2, 3), keras="tf_keras", timeout=10),
    Case("fit_data_before_strategy", "fit (tf_keras)",
         "tensorflow/tensorflow#34568 (collective ops must be configured at program startup)",
         "the input pipeline is made before MultiWorkerMirroredStrategy() is created.",
         data_before_strategy, strategy_first,
         truth=every_task, sizes=(2, 3), keras="tf_keras", timeout=10),
    Case("keras3_fit_under_mwms", "fit (Keras 3)",
         "keras-team/keras#20585; tensorflow/tensorflow#72388",
         "Keras 3's model.fit under MultiWorkerMirroredStrategy; fixed by tf_keras.",
         keras3_fit, tf_keras_fit,
         truth=every_task, sizes=(2, 3), timeout=10),
    Case("keras3_evaluate_under_mwms", "fit (Keras 3)",
         "keras-team/keras#20585 (Keras 3's fit, evaluate and predict under MWMS)",
         "Keras 3's model.evaluate under MultiWorkerMirroredStrategy; fixed by a loop of "
         "strategy.run and reduce.",
         keras3_evaluate, keras3_evaluate_in_a_loop,
         truth=every_task, sizes=(2, 3), timeout=10),
    Case("fit_then_evaluate_on_chief_only", "fit (tf_keras)",
         "tensorflow/tensorflow#36515 (how to run evaluation under MWMS)",
         "after fit, only the chief runs model.evaluate on the test set.",
         evaluate_after_fit_on_chief, evaluate_after_fit_everywhere,
         truth=at_fault(0), sizes=(2, 3), keras="tf_keras", timeout=10),
    Case("fit_then_save_on_chief_only", "fit (tf_keras)",
         "tensorflow/tensorflow#31252 (a Keras model under MWMS cannot be checkpointed)",
         "after fit, only the chief calls model.save, the tutorial's write path done wrong.",
         save_after_fit_on_chief, save_after_fit_everywhere,
         truth=at_fault(0), sizes=(2, 3), chief=True, keras="tf_keras", timeout=10),
)
