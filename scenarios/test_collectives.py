"""Collectives: every step through ``strategy.run`` (the seed article's rule 3),
and the same collectives, in the same order, on every worker."""
import pytest

from scenarios.meta import DEFAULT_IS_KERAS_3, culprit_check, scenario

STEPS = 5


def train_collectives(mode="fixed"):
    """The seed's model for 5 steps after one warm-up step; returns the last loss.

    ``mode``: ``"fixed"`` (warm-up on every worker, steps through
    ``strategy.run``), ``"no_strategy_run"`` (the step function is called
    directly, with the distributed batch) or ``"warmup_on_chief"`` (only the
    chief runs the warm-up step).
    """
    import tensorflow as tf

    import harness
    from harness import workloads
    from scenarios import mnist_like
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model, optimizer, distributed_step = mnist_like.make_training(strategy)
    x, y = mnist_like.make_data()
    iterator = iter(mnist_like.distributed_dataset(strategy, x, y))

    if mode == "no_strategy_run":
        loss_object = workloads.make_loss_object()

        @tf.function
        def step(inputs):  # the seed's train_step, without strategy.run around it
            _, loss, grads = workloads.replica_gradients(model, loss_object, inputs)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
    else:
        step = distributed_step

    if mode != "warmup_on_chief" or mnist_like.is_chief(strategy):
        step(next(iterator))  # warm-up: trace the step once before timing it
    losses = [float(step(next(iterator))) for _ in ctx.steps(STEPS)]
    return losses[-1]


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="seed rule 3")
def test_same_collectives_on_every_worker(mwms_cluster):
    """Fixed: every worker runs the warm-up and every step, each through
    ``strategy.run`` inside one ``tf.function``.

    TensorFlow: each step's all-reduces pair up across workers, in order;
    all workers complete with the same loss.

    Source: seed rule 3.

    Fix: call the step through ``strategy.run`` and make every worker call
    it the same number of times (warm-ups, extra evaluations and
    checkpoints included).
    """
    result = mwms_cluster.run(train_collectives, timeout=20)
    result.assert_completed()
    assert len(set(result.return_values)) == 1


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="ValueError", source="seed rule 3",
          fixed_by="test_same_collectives_on_every_worker",
          on={"2.15": dict(outcome="failed", error="TypeError")})
def test_step_without_strategy_run(mwms_cluster):
    """The train step is called directly on the distributed batch, not
    through ``strategy.run``.

    TensorFlow: in cross-replica context the batch is a ``PerReplica`` value;
    the Keras 3 model refuses it and every worker raises ``ValueError: Only
    input tensors may be passed as positional arguments ... PerReplica`` at
    step 0.  (With plain tensors, the optimizer fails instead: ``Need to be
    inside "with strategy.scope()"``.)  On TensorFlow 2.15, Keras 2 refuses
    it as ``TypeError: Inputs to a layer should be tensors. Got
    'PerReplica...'`` (measured).

    Source: seed rule 3.

    Fix: ``strategy.run(train_step, args=(dist_inputs,))`` inside a
    ``tf.function``, then ``strategy.reduce`` the per-replica losses.
    """
    result = mwms_cluster.run(train_collectives, kwargs={"mode": "no_strategy_run"},
                              timeout=20)
    n = mwms_cluster.num_workers
    result.assert_failed(culprits=range(n), error="ValueError" if DEFAULT_IS_KERAS_3 else "TypeError")
    assert all("PerReplica" in w.exception.message for w in result.workers)


# The deadlock is declared once certain (the others returned); the timeout
# only bounds a loaded machine's wait for their return.
_WARMUP_RUN = dict(kwargs={"mode": "warmup_on_chief"}, timeout=15)


@pytest.mark.by_version   # Keras 2's first step differs (docs/versions.md)
@pytest.mark.timeout(60)
@scenario(outcome="hang", source="seed rule 3", fixed_by="test_same_collectives_on_every_worker")
def test_strategy_run_more_often_on_chief(mwms_cluster, scenario_run):
    """Only the chief runs a warm-up step: ``strategy.run`` is called once
    more on the chief than on the others.

    TensorFlow: collectives pair up by order, not by meaning: the chief's
    warm-up pairs with the others' step 0, and so on, silently; at the end
    the others return and the chief blocks forever in its last all-reduce.

    Source: seed rule 3 (every worker runs the same steps).

    Fix: run the warm-up (or any extra step) on every worker, or on none.
    """
    result = scenario_run("warmup", train_collectives, **_WARMUP_RUN)
    result.assert_hang()
    assert result.workers[0].return_value is None
    assert all(w.return_value is not None for w in result.workers[1:])
    assert "train_collectives" in result.workers[0].stack


@pytest.mark.timeout(60)
@culprit_check("test_strategy_run_more_often_on_chief")
def test_strategy_run_more_often_on_chief_culprit(mwms_cluster, scenario_run):
    """The chief made the extra call: it is the culprit at every N.  Its
    warm-up call comes before ``ctx.steps()``, so it is an automatic step 0
    of its own: the chief's step 0 launched one call more than each of its
    other steps, which names it even with 2 workers."""
    scenario_run("warmup", train_collectives, **_WARMUP_RUN).assert_culprit(0)
