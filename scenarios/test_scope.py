"""Where state is created: inside ``strategy.scope()`` (the seed article's
rule 2), and only after the strategy itself (tensorflow#34568)."""
import pytest

from scenarios.meta import DEFAULT_IS_KERAS_3, scenario

STEPS = 5


def train_with_scope(outside=(), ops_before_strategy=False):
    """The seed's model and loop for 5 steps; returns the last loss.

    ``outside``: any of ``"model"``, ``"optimizer"`` to create that one
    outside ``strategy.scope()``.  ``ops_before_strategy``: run TensorFlow
    ops (a constant, a device listing) before creating the strategy.
    """
    import tensorflow as tf

    import harness
    from scenarios import mnist_like
    ctx = harness.context()
    if ops_before_strategy:
        tf.constant(1.0) + 1.0
        tf.config.list_logical_devices()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    if not ops_before_strategy:
        # The same ops, after the strategy: fine.
        tf.constant(1.0) + 1.0
        tf.config.list_logical_devices()
    model = mnist_like.build_model() if "model" in outside else None
    optimizer = tf.keras.optimizers.Adam(0.001) if "optimizer" in outside else None
    with strategy.scope():
        model = model or mnist_like.build_model()
        optimizer = optimizer or tf.keras.optimizers.Adam(0.001)
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
            reduction=tf.keras.losses.Reduction.NONE)
    step = mnist_like.make_train_step(strategy, model, optimizer, loss_object)
    x, y = mnist_like.make_data()
    iterator = iter(mnist_like.distributed_dataset(strategy, x, y))
    losses = [float(step(next(iterator))) for _ in ctx.steps(STEPS)]
    kernel = model.trainable_variables[0]
    # Keras 3 wraps the TensorFlow variable (its ``value`` property); Keras
    # 2's is the TensorFlow variable itself (``value`` is a method).
    wrapped = isinstance(getattr(type(kernel), "value", None), property)
    return type(kernel.value if wrapped else kernel).__name__, losses[-1]


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="seed rule 2")
def test_strategy_first_then_everything_in_scope(mwms_cluster):
    """Fixed: the strategy is created first; model, optimizer and loss inside
    ``strategy.scope()``.

    TensorFlow: ops run after the strategy's creation are fine; the model's
    variables are mirrored (``MirroredVariable``),
    the optimizer's slots are created beside them on first use, gradients
    are all-reduced; all workers complete with the same loss.

    Source: seed rule 2; tensorflow#34568.

    Fix: create the strategy before any other TensorFlow call, then
    everything that holds variables inside ``with strategy.scope():``.
    """
    result = mwms_cluster.run(train_with_scope, timeout=20)
    result.assert_completed()
    assert all(v == result.return_values[0] for v in result.return_values)
    assert result.return_values[0][0] == "MirroredVariable"


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="ValueError", source="seed rule 2",
          fixed_by="test_strategy_first_then_everything_in_scope")
def test_model_outside_scope(mwms_cluster):
    """The model is built outside ``strategy.scope()``, the optimizer inside.

    TensorFlow: the model's variables are plain ``ResourceVariable``s; the
    first ``apply_gradients`` (Keras 3) tries to place the optimizer's slot
    next to them and every worker raises ``ValueError: `colocate_vars_with`
    must only be passed a variable created in this tf.distribute.Strategy.scope()``
    at step 0: an error, not a hang.

    Source: seed rule 2.

    Fix: build the model inside ``with strategy.scope():``.
    """
    result = mwms_cluster.run(train_with_scope, kwargs={"outside": ("model",)}, timeout=20)
    n = mwms_cluster.num_workers
    result.assert_failed(culprits=range(n), error="ValueError")
    assert all("colocate_vars_with" in w.exception.message for w in result.workers)
    assert "known: the model's variables were created outside strategy.scope()" in \
        result.diagnosis
    assert all(w.last_step == 0 for w in result.workers)


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="RuntimeError", source="seed rule 2",
          fixed_by="test_strategy_first_then_everything_in_scope",
          on={"2.15": dict(outcome="completed")})
def test_optimizer_outside_scope(mwms_cluster):
    """The optimizer is created outside ``strategy.scope()``, the model inside.

    TensorFlow: the optimizer remembers the default strategy; its first
    ``apply_gradients`` inside ``strategy.run`` makes every worker raise
    ``RuntimeError: Mixing different tf.distribute.Strategy objects`` at
    step 0.  On TensorFlow 2.15 (Keras 2's optimizer) every worker
    completes with the same loss (measured).

    Source: seed rule 2.

    Fix: create the optimizer inside ``with strategy.scope():`` too.
    """
    result = mwms_cluster.run(train_with_scope, kwargs={"outside": ("optimizer",)}, timeout=20)
    if not DEFAULT_IS_KERAS_3:
        result.assert_completed()
        assert all(v == result.return_values[0] for v in result.return_values)
        return
    n = mwms_cluster.num_workers
    result.assert_failed(culprits=range(n), error="RuntimeError")
    assert all("Mixing different tf.distribute.Strategy objects" in w.exception.message
               for w in result.workers)
    assert "known: the optimizer (or a variable) was created outside" in result.diagnosis


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="RuntimeError", source="tensorflow#34568",
          fixed_by="test_strategy_first_then_everything_in_scope")
def test_strategy_created_after_other_ops(mwms_cluster):
    """TensorFlow ops (a constant, ``list_logical_devices``) run before
    ``MultiWorkerMirroredStrategy()`` is created.

    TensorFlow: those ops initialise the eager context; the strategy must
    configure collective ops before that, so every worker raises
    ``RuntimeError: Collective ops must be configured at program startup``
    from ``MultiWorkerMirroredStrategy()``.

    Source: tensorflow#34568.

    Fix: create the strategy first thing in the program, before any op, any
    model, any ``list_logical_devices`` (``list_physical_devices`` is safe).
    """
    result = mwms_cluster.run(train_with_scope, kwargs={"ops_before_strategy": True},
                              timeout=20)
    n = mwms_cluster.num_workers
    result.assert_failed(culprits=range(n), error="RuntimeError")
    assert all("Collective ops must be configured at program startup" in w.exception.message
               for w in result.workers)
    assert all(w.last_step is None for w in result.workers)
    assert "known: TensorFlow ran ops before MultiWorkerMirroredStrategy() was created" in \
        result.diagnosis
