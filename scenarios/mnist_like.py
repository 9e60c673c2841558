"""The seed article's loop for the scenarios, with each of its bugs on a switch.

The seed article (the Chinese-language blog post on MWMS deadlocks this
project grew from; it is not part of this repository) gives five rules:

1. ``TF_CONFIG`` set correctly and consistently on every worker;
2. model, optimizer and variables created inside ``strategy.scope()``;
3. every step through ``strategy.run()`` inside a ``tf.function``;
4. input sharded with ``strategy.distribute_datasets_from_function``;
5. logging and file writes on the chief only (but see ``test_chief_only``:
   anything that runs a collective must still run on every worker).

Its loop, fixed, and the pieces the scenarios build on (the MNIST-like data
``make_data``, the model, the train step, the sharded dataset, the chief
test) live in :mod:`harness.workloads` and are re-exported here.  What is
only the scenarios' stays here: each of the seed's three bugs can be put
back with ``bug=`` of :func:`seed_training_loop`, for ``test_seed.py``.

Everything that touches TensorFlow imports it inside the function: scenario
modules are imported by the pytest process (which never loads TensorFlow)
and, by name, in the workers (which have it preloaded).
"""
from __future__ import annotations

import os
import uuid

from harness import workloads
from harness.workloads import (CLASSES, FEATURES, GLOBAL_BATCH_SIZE, build_model, is_chief,
                               make_data, make_train_step, make_training)

__all__ = ["CLASSES", "FEATURES", "GLOBAL_BATCH_SIZE", "SEED_BUGS", "build_model",
           "checkpointed_training", "distributed_dataset", "is_chief", "load_mnist_by_download", "make_data",
           "make_train_step", "make_training", "seed_training_loop"]

SEED_BUGS = ("num_inputpipelines", "replica_context_is_chief", "mnist_download")


def checkpointed_training(strategy):
    """:func:`make_training` for a job that checkpoints: ``(model, optimizer,
    step, done, checkpoint)``, where ``done`` counts the steps trained (an
    int64 variable in scope), the optimizer is built (its slots exist before
    a restore) and ``checkpoint`` holds all three."""
    import tensorflow as tf
    model, optimizer, step = make_training(strategy)
    with strategy.scope():
        done = tf.Variable(0, dtype=tf.int64, trainable=False)
        optimizer.build(model.trainable_variables)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, done=done)
    return model, optimizer, step, done, checkpoint


def distributed_dataset(strategy, x, y, global_batch_size: int = GLOBAL_BATCH_SIZE,
                        repeat: bool = True, typo: bool = False):
    """:func:`harness.workloads.distributed_dataset`; ``typo=True`` puts back
    the seed's ``num_inputpipelines``."""
    if not typo:
        return workloads.distributed_dataset(strategy, x, y, global_batch_size, repeat)
    dataset = workloads.shuffled_dataset(x, y, repeat)

    def dataset_fn(input_context):
        ds = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return ds.batch(global_batch_size // input_context.num_inputpipelines)  # the typo

    return strategy.distribute_datasets_from_function(dataset_fn)


def load_mnist_by_download():
    """What the seed does: ``tf.keras.datasets.mnist.load_data()``, a download.

    To make the scenario the same on every machine, the cache is missed on
    purpose (a file name of its own) and HTTPS goes through a proxy on a
    closed local port, as on a cluster without Internet access.  Nothing
    is downloaded.
    """
    import tensorflow as tf
    for var in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"):
        os.environ[var] = "http://127.0.0.1:9"
    for var in ("no_proxy", "NO_PROXY"):
        os.environ.pop(var, None)
    (x_train, y_train), _ = tf.keras.datasets.mnist.load_data(
        path=f"mnist-pytest-mwms-{uuid.uuid4().hex}.npz")
    return x_train.reshape(-1, FEATURES).astype("float32") / 255.0, y_train.astype("int64")


def seed_training_loop(epochs: int = 3, steps_per_epoch: int = 10, bug=None):
    """The seed article's example loop (:func:`harness.workloads.seed_training_loop`);
    returns the loss of every step (a list of floats, the same on every worker).

    ``bug`` puts one of the seed's bugs back: ``"num_inputpipelines"``,
    ``"replica_context_is_chief"`` or ``"mnist_download"``.
    """
    if bug is not None and bug not in SEED_BUGS:
        raise ValueError(f"unknown seed bug {bug!r}; one of {SEED_BUGS}")
    if bug is None:
        return workloads.seed_training_loop(epochs, steps_per_epoch)
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    _, _, step = make_training(strategy)
    x, y = load_mnist_by_download() if bug == "mnist_download" else make_data()
    iterator = iter(distributed_dataset(strategy, x, y, typo=bug == "num_inputpipelines"))
    if bug == "replica_context_is_chief":
        # The seed's test: outside strategy.run the replica context is the
        # default one, which has no is_chief.
        chief = (tf.distribute.get_replica_context() is None
                 or tf.distribute.get_replica_context().is_chief)
    else:
        chief = is_chief(strategy)
    return workloads.train_loop(step, iterator, epochs, steps_per_epoch, chief)
