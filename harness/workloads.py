"""Known-good MWMS workloads: small jobs to try the harness on.

Each ``*_loop`` function runs on every worker of a cluster and completes
when nothing is wrong, e.g.::

    from harness.workloads import seed_training_loop
    mwms_cluster.run(seed_training_loop).assert_completed()

* :func:`allreduce_loop`: all-reduces (SUM) of the scalar 1.0, nothing else;
* :func:`variable_loop`: a variable made in ``strategy.scope()``, one
  all-reduce of it per step;
* :func:`seed_training_loop`: the custom training loop of the "seed
  article" (the Chinese-language blog post on MWMS deadlocks this project
  grew from: five rules and one example loop, which has three bugs), with
  its bugs fixed, on MNIST-shaped arrays made
  here (:func:`make_data`; nothing is downloaded).  Its pieces (model,
  train step, sharded dataset, chief test) are here too, to build variants.

Steps come from ``steps(n)``, a parameter of every loop that defaults to
:func:`steps`: inside a harness worker that is ``harness.context().steps(n)``
(progress reports; step-keyed faults act there), elsewhere plain
``range(n)``, so the same functions also run under other launchers.  Pass
your own to wrap or change the step numbers.

Importing this module does not import TensorFlow (or numpy): each function
imports what it needs when it runs, in the worker.
"""
from __future__ import annotations

from typing import Callable, Iterable, List

from harness import NotInWorkerError, context

__all__ = ["allreduce_loop", "variable_loop", "seed_training_loop", "steps", "Steps",
           # the seed loop's pieces, to build variants
           "make_data", "build_model", "make_training", "make_loss_object", "replica_gradients",
           "make_train_step", "shuffled_dataset", "distributed_dataset", "is_chief", "train_loop",
           "FEATURES", "CLASSES", "GLOBAL_BATCH_SIZE"]

# The seed article's constants: MNIST's 784 features and 10 classes.
FEATURES = 784
CLASSES = 10
GLOBAL_BATCH_SIZE = 64

Steps = Callable[[int], Iterable[int]]


def steps(n: int) -> Iterable[int]:
    """Step numbers ``0..n-1``: from the harness context inside a harness
    worker (so the harness sees progress and its faults act), else ``range(n)``."""
    try:
        ctx = context()
    except NotInWorkerError:
        return range(n)
    return ctx.steps(n)


# -- the seed article's training pieces ---------------------------------------------

def make_data(n: int = 2048, seed: int = 0):
    """``n`` MNIST-shaped examples: ``x`` (n, 784) float32 in [0, 1), ``y`` (n,) int64 in 0..9.

    Each class has a fixed random "digit" (a prototype image, the same for
    every seed); an example is half its class's prototype, half uniform
    noise.  The seed's small model learns it within tens of steps.
    """
    import numpy as np
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
        loss_object = make_loss_object()
    return model, optimizer, make_train_step(strategy, model, optimizer, loss_object,
                                             global_batch_size)


def make_loss_object():
    """The seed's loss: per-example sparse categorical cross-entropy, so that
    the step can average it over the *global* batch itself."""
    import tensorflow as tf
    # "none": the spelling both Keras 3 and tf_keras accept.
    return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=False, reduction="none")


def replica_gradients(model, loss_object, inputs, global_batch_size: int = GLOBAL_BATCH_SIZE):
    """One replica's forward and backward pass over ``inputs`` (images, labels):
    ``(per_example_losses, loss, gradients)``, the loss averaged over the
    global batch (``tf.nn.compute_average_loss``), as MWMS wants it."""
    import tensorflow as tf
    images, labels = inputs
    with tf.GradientTape() as tape:
        per_example = loss_object(labels, model(images, training=True))
        loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)
    return per_example, loss, tape.gradient(loss, model.trainable_variables)


def make_train_step(strategy, model, optimizer, loss_object,
                    global_batch_size: int = GLOBAL_BATCH_SIZE):
    """The seed's ``distributed_train_step`` for a given model and optimizer."""
    import tensorflow as tf

    def train_step(inputs):
        _, loss, gradients = replica_gradients(model, loss_object, inputs, global_batch_size)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def distributed_train_step(dist_inputs):
        per_replica_losses = strategy.run(train_step, args=(dist_inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    return distributed_train_step


def shuffled_dataset(x, y, repeat: bool = True):
    """``(x, y)`` as a ``tf.data.Dataset``, shuffled with a fixed seed (and repeated).

    The fixed seed makes every worker shuffle alike, so that shards taken
    from it are disjoint (the seed's unseeded shuffle gives each worker its
    own order, so shards overlap: not a deadlock, but not what it meant).
    """
    import tensorflow as tf
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0)
    return dataset.repeat() if repeat else dataset


def distributed_dataset(strategy, x, y, global_batch_size: int = GLOBAL_BATCH_SIZE,
                        repeat: bool = True):
    """The seed's ``create_datasets``: :func:`shuffled_dataset`, sharded per
    input pipeline with ``distribute_datasets_from_function`` (rule 4)."""
    dataset = shuffled_dataset(x, y, repeat)

    def dataset_fn(input_context):
        ds = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return ds.batch(global_batch_size // input_context.num_input_pipelines)

    return strategy.distribute_datasets_from_function(dataset_fn)


def is_chief(strategy) -> bool:
    """The chief of a cluster of workers only: task 0 (the seed's rule 5, done right)."""
    resolver = strategy.cluster_resolver
    return resolver.task_type in (None, "chief") or (resolver.task_type == "worker"
                                                     and resolver.task_id == 0)


def train_loop(step, iterator, epochs: int, steps_per_epoch: int, chief: bool,
               steps: Steps = steps) -> List[float]:
    """The seed's loop: ``epochs * steps_per_epoch`` calls of ``step(next(iterator))``,
    logging on the chief only.  Returns the loss of every step."""
    if chief:
        print("Starting distributed training...")
    losses = []
    for k in steps(epochs * steps_per_epoch):
        epoch, step_in_epoch = divmod(k, steps_per_epoch)
        total_loss = step(next(iterator))
        losses.append(float(total_loss))
        if step_in_epoch % 10 == 0 and chief:
            print(f"Epoch {epoch}, Step {step_in_epoch}, Loss: {total_loss.numpy():.4f}")
    return losses


def seed_training_loop(epochs: int = 3, steps_per_epoch: int = 10,
                       steps: Steps = steps) -> List[float]:
    """The seed article's example loop, its three bugs fixed; returns the loss
    of every step (a list of floats, the same on every worker).

    Fixed: ``input_context.num_input_pipelines`` (the article has
    ``num_inputpipelines``); the chief from the cluster resolver (the
    default replica context has no ``is_chief``); :func:`make_data` in place
    of the MNIST download.
    """
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    _, _, step = make_training(strategy)
    x, y = make_data()
    iterator = iter(distributed_dataset(strategy, x, y))
    return train_loop(step, iterator, epochs, steps_per_epoch, is_chief(strategy), steps)


# -- collectives only -----------------------------------------------------------------

def allreduce_loop(n_steps: int = 20, steps: Steps = steps) -> float:
    """``n_steps`` all-reduces (SUM) of the scalar 1.0; returns the last sum
    (the number of workers), or 0.0 when the worker ran no step."""
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    @tf.function
    def step():
        value = strategy.run(lambda: tf.constant(1.0))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)

    total = None
    for _ in steps(n_steps):
        total = step()
    return float(total) if total is not None else 0.0


def variable_loop(n_steps: int, steps: Steps = steps) -> float:
    """A variable made in ``strategy.scope()`` and one all-reduce of it per
    step.  Returns the sum of the reductions."""
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = tf.Variable(1.0)

    @tf.function
    def step():
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: w * 1.0), axis=None)

    total = 0.0
    for _ in steps(n_steps):
        total += float(step())
    return total
