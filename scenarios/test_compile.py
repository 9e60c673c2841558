"""XLA-compiled steps (``tf.function(jit_compile=True)``) on CPU workers,
with mixed precision as keras#21366 trains: a ``mixed_float16`` policy and
a ``LossScaleOptimizer`` in a custom loop.

XLA on CPU has no collectives: a compiled function that holds one (the
optimizer's gradient all-reduce inside ``strategy.run``) cannot be
compiled, on any worker.  keras#21366's ``merge_call`` error does not
appear: this fails first.
"""
import pytest

from scenarios.meta import scenario

STEPS = 3
XLA_ON_CPU = "not yet implemented for CPU devices when compiling with XLA"
ABORTED = "Collective ops is aborted by"


def train_compiled(compile_step=True):
    """A two-layer model under ``mixed_float16``, with ``LossScaleOptimizer``
    (SGD), in a custom loop.  ``compile_step``: the whole step is
    ``tf.function(jit_compile=True)``; else only the loss and its
    gradients are (a compiled function with no collective in it), and the
    step that applies them is a plain ``tf.function``.  Returns the last
    loss."""
    import tensorflow as tf

    import harness
    ctx = harness.context()
    keras = tf.keras
    keras.mixed_precision.set_global_policy("mixed_float16")
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16),
                                  keras.layers.Dense(3, dtype="float32")])
        optimizer = keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    # Keras 3 scales the loss with scale_loss and unscales in apply;
    # Keras 2 (TensorFlow 2.15) with get_scaled_loss and get_unscaled_gradients.
    keras_3 = hasattr(optimizer, "scale_loss")

    def loss_and_gradients(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x)))
            scaled = optimizer.scale_loss(loss) if keras_3 else optimizer.get_scaled_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        return loss, grads if keras_3 else optimizer.get_unscaled_gradients(grads)

    compiled_gradients = tf.function(loss_and_gradients, jit_compile=True)

    def replica_step(x):
        loss, grads = (loss_and_gradients if compile_step else compiled_gradients)(x)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function(jit_compile=compile_step)
    def step(x):
        return strategy.reduce("SUM", strategy.run(replica_step, args=(x,)), axis=None)

    loss = None
    for _ in ctx.steps(STEPS):
        loss = float(step(tf.ones([4, 8])))
    return loss


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="UnimplementedError", source="keras#21366",
          fixed_by="test_compiled_gradients_outside_the_collectives")
def test_compiled_step_with_collectives_on_cpu(mwms_cluster):
    """The whole step, ``strategy.run`` and the optimizer's all-reduce in
    it, is ``tf.function(jit_compile=True)``, on CPU workers.

    TensorFlow: 2.21, measured: each worker fails to compile the step
    (``UnimplementedError: Collectives are not yet implemented for CPU
    devices when compiling with XLA``) at step 0, before any collective
    runs.  The first to fail aborts the others' collectives, so a worker
    that has not failed yet raises ``InternalError: Collective ops is
    aborted by ...`` instead: which does is a race (measured: at 2
    workers sometimes both, sometimes worker 0 alone; at 3, worker 0 alone
    with the others aborted).  The diagnosis names only workers whose own
    compile failed.  TensorFlow 2.15.1 the same (measured).  The
    ``merge_call`` ``RuntimeError`` of keras#21366 (mixed precision with
    ``jit_compile=True`` under a strategy) does not appear: XLA on CPU
    stops the step first.

    Source: keras#21366 (``jit_compile=True`` with mixed precision under a
    strategy).

    Fix: compile what has no collective in it (the loss and its gradients)
    and apply them outside the compiled function
    (``test_compiled_gradients_outside_the_collectives``), or train
    without ``jit_compile`` on CPU.
    """
    result = mwms_cluster.run(train_compiled, timeout=30)
    result.assert_failed(error="UnimplementedError")
    compiled = {w.index for w in result.workers
                if w.exception and XLA_ON_CPU in w.exception.message}
    aborted = {w.index for w in result.workers if w.exception and ABORTED in w.exception.message}
    # Which workers fail to compile before the first one's failure aborts
    # them is a race; that one of them does, and no other error, is not.
    assert compiled and compiled | aborted == set(range(mwms_cluster.num_workers)), result.diagnosis
    assert set(result.verdict.culprits) <= compiled, result.diagnosis


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="keras#21366")
def test_compiled_gradients_outside_the_collectives(mwms_cluster):
    """Fixed: only the loss and its gradients are compiled; the step that
    all-reduces and applies them is a plain ``tf.function``.

    TensorFlow: 2.21, measured: the run completes, every worker with the
    same loss.

    Source: keras#21366.

    Fix: this is the fix.
    """
    result = mwms_cluster.run(train_compiled, kwargs={"compile_step": False}, timeout=30)
    result.assert_completed()
    assert len(set(result.return_values)) == 1
