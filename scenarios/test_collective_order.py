"""Collectives in another order: the same gradients, packed in another
order on one worker.

MWMS packs a step's gradients into one all-reduce, in the order of the
list handed to ``apply_gradients``; the *n*-th part of every worker's pack
is summed with the *n*-th of every other's.  A list built from a ``set``
(tensorflow/agents#473's ``variables_to_train``) is in hash order, which
can differ between processes; when the swapped variables have the same
shape, TensorFlow sums one variable's gradient into another's and goes on.

When each gradient is all-reduced on its own (a custom loop that sums
them itself), the *n*-th collective of one worker meets the *n*-th of the
others: with other shapes there, TensorFlow raises a shape mismatch.

A ``set`` of variables (of their ``ref()``: TensorFlow 2's variables are
not hashable) is ordered by the variables' ``id``: in forked
workers that is the same everywhere, so the scenario makes the order differ
every time by ordering worker 1's list backwards (what a hash order of its
own does), and says so.
"""
import pytest

from scenarios.meta import DEFAULT_IS_KERAS_3, culprit_check, culprit_from_three, scenario

STEPS = 3
WEIGHTS = 3      # variables of one shape
SIZE = 4
SIZES = (2, 3, 4)   # variables of other shapes


def in_hash_order(variables, index: int):
    """A ``set``'s order, as it can come out per process: here by name,
    backwards on worker 1, so that it differs there every time."""
    return sorted(variables, key=lambda v: v.name, reverse=index == 1)


def train_in_order(order: str = "sorted", steps: int = STEPS, sizes=(SIZE,) * WEIGHTS,
                   reduce: str = "optimizer"):
    """Variables of the shapes ``[size] for size in sizes`` under Keras SGD,
    in a custom loop: ``tape.gradient`` and ``optimizer.apply_gradients``
    over ``variables_to_train``, each worker on inputs of its own.
    ``order``: ``"sorted"`` (by name, the fix) or ``"set"`` (the list of a
    set of the variables' ``ref()``, in another order on worker 1:
    :func:`in_hash_order`).  ``reduce``: who sums the gradients across the
    workers: ``"optimizer"`` (``apply_gradients`` does), ``"each"`` (the
    loop all-reduces each gradient on its own, in ``variables_to_train``'s
    order, and applies the sums itself), ``"nobody"``
    (``apply_gradients(..., skip_gradients_aggregation=True)``, Keras 2's
    optimizer: tf_keras, or ``tf.keras`` on 2.15) or ``"loop"`` (the loop
    all-reduces them, then applies them so).  Returns the variables'
    values."""
    import tensorflow as tf

    import harness
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    # Updated in replica context with sums every worker has: one replica's
    # update stands for all.
    aggregation = (tf.VariableAggregation.ONLY_FIRST_REPLICA if reduce == "each"
                   else tf.VariableAggregation.NONE)
    with strategy.scope():
        weights = [tf.Variable(tf.fill([size], float(i + 1)), name=f"w{i}",
                               aggregation=aggregation) for i, size in enumerate(sizes)]
        optimizer = tf.keras.optimizers.SGD(0.1)
    chosen = [ref.deref() for ref in {w.ref() for w in weights}]   # a set of variables
    variables_to_train = (sorted(chosen, key=lambda v: v.name) if order == "sorted"
                          else in_hash_order(chosen, ctx.index))

    @tf.function
    def step(x):
        def replica_step():
            with tf.GradientTape() as tape:
                loss = tf.add_n([tf.reduce_sum(w * x) * float(i + 1)
                                 for i, w in enumerate(weights)])
            grads = tape.gradient(loss, variables_to_train)
            replica = tf.distribute.get_replica_context()
            if reduce == "each":
                for v, g in zip(variables_to_train, grads):
                    v.assign_sub(0.1 * replica.all_reduce("SUM", g))
            elif reduce == "optimizer":
                optimizer.apply_gradients(zip(grads, variables_to_train))
            else:
                if reduce == "loop":
                    grads = replica.all_reduce("SUM", grads)
                optimizer.apply_gradients(zip(grads, variables_to_train),
                                          skip_gradients_aggregation=True)
            return loss
        return strategy.reduce("SUM", strategy.run(replica_step), axis=None)

    x = tf.constant(float(ctx.index + 1))
    for _ in ctx.steps(steps):
        step(x)
    return [w.numpy().tolist() for w in weights]


_SET_RUN = dict(kwargs={"order": "set"}, timeout=30)
_SHAPES_RUN = dict(kwargs={"order": "set", "sizes": SIZES}, timeout=30)
_EACH_RUN = dict(kwargs={"order": "set", "sizes": SIZES, "reduce": "each"}, timeout=30)


@pytest.mark.timeout(90)
@scenario(outcome="failed", error="CollectiveOrderDivergence", source="tensorflow/agents#473",
          fixed_by="test_gradients_sorted_by_name")
def test_gradients_in_set_order(mwms_cluster, scenario_run):
    """``variables_to_train`` built from a ``set``: worker 1 hands the same
    equal-shape gradients to ``apply_gradients`` in another order.

    TensorFlow: 2.21, measured: the packed all-reduce has the same shape on
    every worker, so nothing raises; each step sums worker 1's gradient of
    ``w2`` into worker 0's ``w0`` and so on, and every worker returns.
    With ``check_replicas=True`` the replicas disagree (each worker's
    inputs are its own); without it the run would pass.  The ledger labels
    each packed part by the op that produces it (the gradient's op, named
    after the forward op), the same multiset on every worker, in another
    order on worker 1: the run fails with ``CollectiveOrderDivergence``.
    TensorFlow 2.15.1 (Keras 2's optimizer) does the same (measured).

    Source: tensorflow/agents#473 (``variables_to_train`` ordered
    differently per replica), tensorflow#56885.

    Fix: a deterministic order, e.g. ``sorted(..., key=lambda v: v.name)``,
    or the model's own ``trainable_variables``.
    """
    result = scenario_run("set", train_in_order, **_SET_RUN)
    result.assert_failed(error="CollectiveOrderDivergence")
    assert "part 1 of 3" in result.diagnosis and "gradient_tape" in result.diagnosis
    assert all(w.returned for w in result.workers)


@pytest.mark.timeout(90)
@culprit_check("test_gradients_in_set_order")
def test_gradients_in_set_order_culprit(mwms_cluster, scenario_run):
    result = scenario_run("set", train_in_order, **_SET_RUN)
    culprit_from_three(result, 1)


@pytest.mark.timeout(90)
@scenario(outcome="completed", source="tensorflow/agents#473")
def test_gradients_sorted_by_name(mwms_cluster):
    """Fixed: ``variables_to_train`` sorted by name, the same order on
    every worker.

    TensorFlow: 2.21, measured: the packs pair part for part; every worker
    returns the same variables (the replica check agrees).

    Source: tensorflow/agents#473.

    Fix: this is the fix.
    """
    result = mwms_cluster.run(train_in_order, timeout=30, check_replicas=True)
    result.assert_completed()
    assert len({str(v) for v in result.return_values}) == 1


@pytest.mark.timeout(90)
@scenario(outcome="failed", error="CollectiveOrderDivergence", source="tensorflow/agents#473",
          fixed_by="test_gradients_sorted_by_name",
          on={"2.15": dict(outcome="failed", error="InvalidArgumentError")})
def test_gradients_of_other_shapes_in_set_order(mwms_cluster, scenario_run):
    """``variables_to_train`` built from a ``set``, its variables of three
    shapes (``[2]``, ``[3]``, ``[4]``): worker 1 hands their gradients to
    ``apply_gradients`` in another order.

    TensorFlow: 2.21, measured: still silent.  The optimizer's gradients
    go into one packed all-reduce of their total size (``float32[9]``, the
    same on every worker), and each worker cuts the sum back by its own
    shapes: parts of one variable's gradient land in another's, and the
    replicas disagree.  The ledger sees the packed parts in another order
    on worker 1: the run fails with ``CollectiveOrderDivergence``; with 2
    workers it cannot tell which order is right.  Keras 2's optimizer
    (TensorFlow 2.15.1's ``tf.keras``, and tf_keras on 2.21, measured)
    all-reduces each gradient on its own instead: worker 1 raises
    ``InvalidArgumentError: Shape mismatch in the collective instance``, as
    in ``test_gradients_reduced_one_by_one_in_set_order``.

    Source: tensorflow/agents#473, tensorflow#56885.

    Fix: a deterministic order (``test_gradients_sorted_by_name``).
    """
    result = scenario_run("shapes", train_in_order, **_SHAPES_RUN)
    if not DEFAULT_IS_KERAS_3:
        result.assert_failed(error="InvalidArgumentError")
        assert "Shape mismatch in the collective instance" in result.diagnosis, result.diagnosis
        return
    result.assert_failed(error="CollectiveOrderDivergence")
    assert "float32[9]" in result.diagnosis, result.diagnosis
    assert all(w.returned for w in result.workers)
    assert len({str(v) for v in result.return_values}) > 1


@pytest.mark.timeout(90)
@culprit_check("test_gradients_of_other_shapes_in_set_order")
def test_gradients_of_other_shapes_in_set_order_culprit(mwms_cluster, scenario_run):
    result = scenario_run("shapes", train_in_order, **_SHAPES_RUN)
    culprit_from_three(result, 1)


@pytest.mark.timeout(90)
@scenario(outcome="failed", error="InvalidArgumentError", source="tensorflow#56885",
          fixed_by="test_gradients_reduced_one_by_one_sorted_by_name")
def test_gradients_reduced_one_by_one_in_set_order(mwms_cluster, scenario_run):
    """The loop all-reduces each gradient on its own, in the order of a
    ``variables_to_train`` built from a ``set``.

    Per gradient, ``ReplicaContext.all_reduce``: worker 1's first
    collective is its ``[4]`` gradient where the others' is their ``[2]``.

    TensorFlow: 2.21, measured: worker 1 raises ``InvalidArgumentError:
    Shape mismatch in the collective instance ...: expected shape [4] but
    another member in the group expected shape [2]``; the error does not
    say which member is wrong.  The ledger's collectives part at the
    first all-reduce (``float32[2]`` against ``float32[4]``); with 2
    workers it cannot tell which order is right.

    Source: tensorflow#56885 (collectives in another order per worker),
    tensorflow#34156 ("Shape mismatch in the collective instance").

    Fix: a deterministic order
    (``test_gradients_reduced_one_by_one_sorted_by_name``).
    """
    result = scenario_run("each", train_in_order, **_EACH_RUN)
    result.assert_failed(error="InvalidArgumentError")
    assert "Shape mismatch in the collective instance" in result.diagnosis, result.diagnosis


@pytest.mark.timeout(90)
@culprit_check("test_gradients_reduced_one_by_one_in_set_order")
def test_gradients_reduced_one_by_one_in_set_order_culprit(mwms_cluster, scenario_run):
    result = scenario_run("each", train_in_order, **_EACH_RUN)
    culprit_from_three(result, 1)


@pytest.mark.timeout(90)
@scenario(outcome="completed", source="tensorflow#56885")
def test_gradients_reduced_one_by_one_sorted_by_name(mwms_cluster):
    """Fixed: each gradient all-reduced on its own, in an order sorted by
    name, the same on every worker.

    TensorFlow: 2.21, measured: every collective meets its own shape;
    every worker returns the same variables (the replica check agrees).

    Source: tensorflow#56885.

    Fix: this is the fix.
    """
    result = mwms_cluster.run(train_in_order, kwargs={"sizes": SIZES, "reduce": "each"},
                              timeout=30, check_replicas=True)
    result.assert_completed()
    assert len({str(v) for v in result.return_values}) == 1
