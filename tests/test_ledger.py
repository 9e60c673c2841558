"""The collective ledger: its record format and parent-side assembly (fast,
no TensorFlow), its hooks on a TensorFlow that lacks them, and what it
records on real workers at each level."""

import inspect
import os

import pytest

from harness.workloads import allreduce_loop


@pytest.mark.timeout(120)
@pytest.mark.parametrize("level", [True, "collectives", False])
def test_what_the_ledger_records_on_real_workers(mwms_cluster, level):
    result = mwms_cluster.run(allreduce_loop, args=(5,), timeout=60, ledger=level)
    result.assert_completed()
    for w in result.workers:
        mine = [c for c in w.collectives if c.function == "step"]
        if level is False:
            assert w.collectives == () and w.observation.ledger is None
            continue
        assert [c.step for c in mine] == [0, 1, 2, 3, 4]
        assert {(c.kind, c.dtype, c.state) for c in mine} == {("all-reduce", "float32",
                                                               "completed")}
        if level == "collectives":
            assert all(call.launched == (0,) and call.done == (0,)
                       for call in w.observation.calls if call.step is not None)


def test_bad_ledger_level_is_rejected_before_any_process(mwms_cluster):
    with pytest.raises(ValueError, match="run\\(ledger=...\\)"):
        mwms_cluster.run(allreduce_loop, ledger="everything")


def reduce_sparse_and_dense(steps=3):
    """A step that all-reduces an ``IndexedSlices`` and then a dense
    tensor.  MWMS all-gathers the slices' lengths, then their values and
    indexes inside a ``tf.cond`` (padded or not), graphs of their own in
    the step's trace.  Returns the last dense sum."""
    import tensorflow as tf

    import harness
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    @tf.function
    def step(x):
        def replica():
            replica_ctx = tf.distribute.get_replica_context()
            rows = tf.IndexedSlices(tf.fill([2, 4], x), tf.constant([0, 3]), tf.constant([5, 4]))
            summed = replica_ctx.all_reduce("SUM", [rows, tf.fill([3], x)])
            return summed[1] + tf.reduce_sum(summed[0].values)
        return strategy.run(replica)

    out = None
    for _ in ctx.steps(steps):
        out = step(tf.constant(1.0))
    return out.numpy().tolist()


@pytest.mark.timeout(120)
def test_collectives_in_a_branch_count_in_their_step_trace(mwms_cluster):
    result = mwms_cluster.run(reduce_sparse_and_dense, timeout=60)
    result.assert_completed()
    for w in result.workers:
        mine = [(c.step, c.index, c.kind, c.shape) for c in w.collectives if c.function == "step"]
        # The dense all-reduce, the lengths' all-gather, then both branches'
        # all-gathers of values and indexes (unpadded, padded), every step.
        assert mine == [(s, i, kind, shape) for s in range(3) for i, (kind, shape) in enumerate(
            [("all-reduce", (3,)), ("all-gather", (1,)), ("all-gather", (2, 4)),
             ("all-gather", (2,)), ("all-gather", (-1, -1)), ("all-gather", (-1,))])], mine


def reduce_eagerly(steps=3):
    """A variable made in ``strategy.scope()`` (an eager broadcast of its
    initial value), then each step an eager ``strategy.reduce`` of it."""
    import tensorflow as tf

    import harness
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = tf.Variable(1.0)   # the broadcast's line
    total = 0.0
    for _ in ctx.steps(steps):
        total += float(strategy.reduce("SUM", strategy.run(lambda: w * 1.0), axis=None))
    return total


def _line_of(function, text: str) -> str:
    """``file.py:LINE in function: text``, the line of ``function`` holding ``text``."""
    lines, first = inspect.getsourcelines(function)
    at = next(i for i, line in enumerate(lines) if text in line)
    return f"{os.path.basename(__file__)}:{first + at} in {function.__name__}: {lines[at].strip()}"


@pytest.mark.timeout(120)
def test_an_eager_collective_keeps_the_line_that_launched_it(mwms_cluster):
    """Each call of ``<eager all-reduce>`` has the user's line that made it
    (from TensorFlow's pool thread, the caller's); the calls are numbered
    as before, by kind."""
    result = mwms_cluster.run(reduce_eagerly, timeout=60)
    result.assert_completed()
    for w in result.workers:
        reduces = [c for c in w.collectives if c.function == "<eager all-reduce>"]
        assert [(c.call, c.step) for c in reduces] == [(1, 0), (2, 1), (3, 2)], reduces
        assert {c.site for c in reduces} == {_line_of(reduce_eagerly, "strategy.reduce(")}
        (broadcast,) = [c for c in w.collectives if c.function == "<eager broadcast>"]
        assert broadcast.site == _line_of(reduce_eagerly, "tf.Variable(1.0)")
