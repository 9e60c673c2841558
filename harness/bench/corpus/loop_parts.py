"""The pieces of the custom-loop and ``tf.data`` jobs of the corpus
(:mod:`.loops`, :mod:`.data`), as a user's script has them: the cluster as
read from ``TF_CONFIG``, the data, a small regression model, the train
step."""
from __future__ import annotations

import json
import os

FEATURES = 8
GLOBAL_BATCH = 24   # divisible by 2, 3 and 4 workers
STEPS = 6


# -- the cluster, as the user's script reads it from TF_CONFIG ----------------------

def _tf_config() -> dict:
    return json.loads(os.environ["TF_CONFIG"])


def task_index() -> int:
    """This task's index among the tasks in the collectives (a chief first)."""
    config = _tf_config()
    task, cluster = config["task"], config["cluster"]
    return task["index"] + (len(cluster.get("chief", ())) if task["type"] == "worker" else 0)


def num_tasks() -> int:
    cluster = _tf_config()["cluster"]
    return len(cluster.get("chief", ())) + len(cluster.get("worker", ()))


def is_chief() -> bool:
    return task_index() == 0


def last_task() -> int:
    return num_tasks() - 1


# -- the user's pieces: data, model, train step --------------------------------------

def arrays(samples: int, seed: int = 0):
    """``samples`` rows of 8 features and their sum as the target."""
    import numpy as np
    x = np.random.default_rng(seed).normal(size=(samples, FEATURES)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def build(tf, strategy):
    """Model and optimizer, made in the strategy's scope."""
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((FEATURES,)), tf.keras.layers.Dense(4),
                                     tf.keras.layers.Dense(1)])
        optimizer = tf.keras.optimizers.SGD(0.01)
    return model, optimizer


def replica_loss(tf, model, x, y, global_batch: int = GLOBAL_BATCH):
    """Per-example squared errors and their mean over the global batch."""
    per_example = tf.reduce_mean(tf.square(model(x, training=True) - y), axis=1)
    return per_example, tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)


def make_replica_step(tf, model, optimizer, global_batch: int = GLOBAL_BATCH):
    def replica_step(x, y):
        with tf.GradientTape() as tape:
            _, loss = replica_loss(tf, model, x, y, global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return replica_step


def make_train_step(tf, strategy, model, optimizer, global_batch: int = GLOBAL_BATCH):
    """The tutorials' ``distributed_train_step``: ``strategy.run``, then the
    loss summed across replicas."""
    replica_step = make_replica_step(tf, model, optimizer, global_batch)

    @tf.function
    def train_step(batch):
        per_replica = strategy.run(replica_step, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
    return train_step


def sharded(tf, strategy, x, y, repeat: bool = True, global_batch: int = GLOBAL_BATCH):
    """The tutorials' input: one dataset, sharded per worker, batched to the
    per-replica size (``distribute_datasets_from_function``)."""
    def dataset_fn(context):
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        ds = ds.shard(context.num_input_pipelines, context.input_pipeline_id)
        ds = ds.repeat() if repeat else ds
        return ds.batch(context.get_per_replica_batch_size(global_batch))
    return strategy.distribute_datasets_from_function(dataset_fn)


def local_dataset(tf, strategy, x, y, batch: int):
    """Each worker's own data (its own files), batched as it is: no sharding."""
    return strategy.distribute_datasets_from_function(
        lambda context: tf.data.Dataset.from_tensor_slices((x, y)).batch(batch))


def setup(samples: int = 1024):
    """TensorFlow, the strategy, model, optimizer, train step and a
    repeated sharded dataset's iterator: the loop every case starts from."""
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model, optimizer = build(tf, strategy)
    x, y = arrays(samples)
    return tf, strategy, model, optimizer, iter(sharded(tf, strategy, x, y))


def run_steps(tf, strategy, replica_step, iterator, steps: int = STEPS):
    """The loop: ``steps`` calls of a ``tf.function`` that runs
    ``replica_step`` on the next batch and sums its losses."""
    @tf.function
    def train_step(batch):
        return strategy.reduce(tf.distribute.ReduceOp.SUM,
                               strategy.run(replica_step, args=batch), axis=None)

    for _ in range(steps):
        train_step(next(iterator))
