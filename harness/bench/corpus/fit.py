"""Users' bugs through Keras's ``fit``: tf_keras and Keras 3, with callbacks.

Each job is a user's script as a function: it reads ``TF_CONFIG``, builds
its strategy, model and data, and fits.  Data is made in the job.
"""
from __future__ import annotations

import json
import os

from harness.bench.corpus import Case, at_fault

BATCH = 16
SAMPLES = 128


def task_index() -> int:
    """This task's index among the tasks in the collectives (a chief first)."""
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    return task["index"] + (len(cluster.get("chief", ())) if task["type"] == "worker" else 0)


def small_model(tf):
    model = tf.keras.Sequential([tf.keras.layers.Input((8,)), tf.keras.layers.Dense(4),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def arrays(tf, samples: int = SAMPLES):
    x = tf.random.stateless_normal((samples, 8), seed=(1, 2))
    return x, tf.reduce_sum(x, axis=1, keepdims=True)


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


CASES = (
    Case("fit_uneven_batch_per_worker", "fit (tf_keras)",
         "tensorflow/tensorflow#36153 (a partial last batch under MWMS fit)",
         "worker 1 batches its data with half the batch size, so its epoch has twice the steps.",
         uneven_batch, even_batch,
         truth=at_fault(1),
         sizes=(2, 3), keras="tf_keras", timeout=10),
)
