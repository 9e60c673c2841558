"""MNIST-like data made in the test, and the seed article's model and loop, fixed.

Nothing here downloads anything.  ``make_data`` builds arrays of MNIST's
shape (784 float32 features in [0, 1), int64 labels 0-9) from a fixed numpy
seed: noisy copies of ten fixed random "digits", so the seed's model can
learn them and its loss goes down.

Everything that touches TensorFlow imports it inside the function: scenario
modules are imported by the pytest process (which never loads TensorFlow)
and, by name, in the workers (which have it preloaded).

The seed article (``shared/seed/000_151af5606005d280.txt``) gives five rules:

1. ``TF_CONFIG`` set correctly and consistently on every worker;
2. model, optimizer and variables created inside ``strategy.scope()``;
3. every step through ``strategy.run()`` inside a ``tf.function``;
4. input sharded with ``strategy.distribute_datasets_from_function``;
5. logging and file writes on the chief only (but see ``test_chief_only``:
   anything that runs a collective must still run on every worker).

:func:`seed_training_loop` is its example loop with its three bugs fixed;
each bug can be put back with ``bug=`` for the scenarios in ``test_seed.py``.
"""
from __future__ import annotations

import os
import uuid

import numpy as np

FEATURES = 784
CLASSES = 10
GLOBAL_BATCH_SIZE = 64
SEED_BUGS = ("num_inputpipelines", "replica_context_is_chief", "mnist_download")


def make_data(n: int = 2048, seed: int = 0):
    """``n`` MNIST-shaped examples: ``x`` (n, 784) float32 in [0, 1), ``y`` (n,) int64 in 0..9.

    Each class has a fixed random "digit" (a prototype image, the same for
    every seed); an example is half its class's prototype, half uniform
    noise.  The seed's small model learns it within tens of steps.
    """
    rng = np.random.default_rng(seed)
    prototypes = np.random.default_rng(1234).random((CLASSES, FEATURES), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=n).astype(np.int64)
    x = 0.5 * prototypes[y] + 0.5 * rng.random((n, FEATURES), dtype=np.float32)
    return x.astype(np.float32), y


def build_model(keras=None):
    """The seed's model: Dense(10, relu) on 784 inputs, then Dense(10, softmax).

    ``keras`` is the Keras module to build it with (default ``tf.keras``,
    which is Keras 3 unless ``TF_USE_LEGACY_KERAS=1``).
    """
    if keras is None:
        import tensorflow as tf
        keras = tf.keras
    return keras.Sequential([
        keras.Input(shape=(FEATURES,)),
        keras.layers.Dense(10, activation="relu"),
        keras.layers.Dense(CLASSES, activation="softmax"),
    ])


def make_training(strategy, global_batch_size: int = GLOBAL_BATCH_SIZE,
                  learning_rate: float = 0.001):
    """Model, optimizer and the distributed train step, made as the seed's rules 2
    and 3 say: variables inside ``strategy.scope()``, the step through
    ``strategy.run`` in a ``tf.function``.  Returns ``(model, optimizer, step)``;
    ``step(dist_inputs)`` returns the global mean loss (the same on every worker).
    """
    import tensorflow as tf
    with strategy.scope():
        model = build_model()
        optimizer = tf.keras.optimizers.Adam(learning_rate=learning_rate)
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=False, reduction=tf.keras.losses.Reduction.NONE)
    return model, optimizer, make_train_step(strategy, model, optimizer, loss_object,
                                             global_batch_size)


def make_train_step(strategy, model, optimizer, loss_object,
                    global_batch_size: int = GLOBAL_BATCH_SIZE):
    """The seed's ``distributed_train_step`` for a given model and optimizer."""
    import tensorflow as tf

    def compute_loss(labels, predictions):
        per_example_loss = loss_object(labels, predictions)
        return tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)

    def train_step(inputs):
        images, labels = inputs
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            loss = compute_loss(labels, predictions)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def distributed_train_step(dist_inputs):
        per_replica_losses = strategy.run(train_step, args=(dist_inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    return distributed_train_step


def distributed_dataset(strategy, x, y, global_batch_size: int = GLOBAL_BATCH_SIZE,
                        repeat: bool = True, typo: bool = False):
    """The seed's ``create_datasets``: shuffled, repeated, sharded per input
    pipeline with ``distribute_datasets_from_function`` (rule 4).

    The shuffle has a fixed seed, so that every worker shuffles alike and the
    shards are disjoint (the seed's unseeded shuffle gives each worker its own
    order, so shards overlap: not a deadlock, but not what it meant).
    ``typo=True`` puts back the seed's ``num_inputpipelines``.
    """
    import tensorflow as tf
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0)
    if repeat:
        dataset = dataset.repeat()

    def dataset_fn(input_context):
        ds = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        if typo:
            return ds.batch(global_batch_size // input_context.num_inputpipelines)
        return ds.batch(global_batch_size // input_context.num_input_pipelines)

    return strategy.distribute_datasets_from_function(dataset_fn)


def is_chief(strategy) -> bool:
    """The chief of a cluster of workers only: task 0 (the seed's rule 5, done right)."""
    resolver = strategy.cluster_resolver
    return resolver.task_type in (None, "chief") or (resolver.task_type == "worker"
                                                     and resolver.task_id == 0)


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
    """The seed article's example loop, its three bugs fixed; returns the loss
    of every step (a list of floats, the same on every worker).

    ``bug`` puts one of the seed's bugs back: ``"num_inputpipelines"``,
    ``"replica_context_is_chief"`` or ``"mnist_download"``.
    """
    import tensorflow as tf

    import harness
    if bug is not None and bug not in SEED_BUGS:
        raise ValueError(f"unknown seed bug {bug!r}; one of {SEED_BUGS}")
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model, optimizer, distributed_train_step = make_training(strategy)

    if bug == "mnist_download":
        x, y = load_mnist_by_download()
    else:
        x, y = make_data()
    iterator = iter(distributed_dataset(strategy, x, y, typo=bug == "num_inputpipelines"))

    if bug == "replica_context_is_chief":
        def chief():
            # The seed's test: outside strategy.run the replica context is the
            # default one, which has no is_chief.
            return (tf.distribute.get_replica_context() is None
                    or tf.distribute.get_replica_context().is_chief)
    else:
        def chief():
            return is_chief(strategy)

    if chief():
        print("Starting distributed training...")
    losses = []
    for k in ctx.steps(epochs * steps_per_epoch):
        epoch, step = divmod(k, steps_per_epoch)
        total_loss = distributed_train_step(next(iterator))
        losses.append(float(total_loss))
        if step % 10 == 0 and chief():
            print(f"Epoch {epoch}, Step {step}, Loss: {total_loss.numpy():.4f}")
    return losses
