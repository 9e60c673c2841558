"""How a job ends: workers that finish at different times.

A training script ends when its main returns, and its process goes with
it.  These runs ask the harness for the same (``on_return="exit"``), so
the other workers see the worker leave, as they would in a real cluster.
"""
import pytest

from scenarios.meta import culprit_from_three, scenario

STEPS = 6
EVAL_STEPS = 3


def train_then_evaluate(uneven_tail=False):
    """The seed's loop for 6 steps, then an evaluation whose every step
    all-reduces its metric; with ``uneven_tail`` worker 0 evaluates one
    batch fewer than the others (its own count of validation batches)."""
    import tensorflow as tf

    import harness
    from scenarios import mnist_like
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model, _, step = mnist_like.make_training(strategy)
    x, y = mnist_like.make_data()
    iterator = iter(mnist_like.distributed_dataset(strategy, x, y))
    for _ in ctx.steps(STEPS):
        step(next(iterator))

    @tf.function
    def evaluate(inputs):
        def replica(images, labels):
            hits = tf.cast(tf.equal(tf.argmax(model(images), axis=1), labels), tf.float32)
            return tf.reduce_sum(hits)
        return strategy.reduce("SUM", strategy.run(replica, args=inputs), axis=None)

    eval_steps = EVAL_STEPS - 1 if (uneven_tail and ctx.index == 0) else EVAL_STEPS
    return [float(evaluate(next(iterator))) for _ in range(eval_steps)]


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="UnavailableError", source="tensorflow#58434",
          fixed_by="test_workers_run_the_same_tail")
def test_worker_leaves_while_others_evaluate(mwms_cluster):
    """Worker 0 evaluates one batch fewer than the others, returns and its
    process ends while the others still evaluate.

    TensorFlow: the others' last evaluation all-reduce needs a peer that is
    gone: they raise ``UnavailableError`` (its connection refused, or its
    heartbeats stopped), echoes the harness reads as such: the worker that
    left launched one collective fewer.  Kept in the cluster instead
    (``on_return="stay"``), the same job hangs in that all-reduce.

    Source: tensorflow#58434 (workers that finish at different times; the
    coordination service's errors at shutdown).

    Fix: every worker runs the same tail (the same number of evaluation
    steps, agreed before the loop), so none leaves while a collective still
    needs it.
    """
    result = mwms_cluster.run(train_then_evaluate, kwargs={"uneven_tail": True},
                              timeout=30, grace=20, on_return="exit")
    result.assert_failed(error="UnavailableError")
    assert result.workers[0].returned and result.workers[0].exit_code == 0
    assert all(w.exception is not None and w.exception.type_name == "UnavailableError"
               for w in result.workers[1:])
    culprit_from_three(result, 0)


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="tensorflow#58434")
def test_workers_run_the_same_tail(mwms_cluster):
    """Fixed: every worker evaluates the same number of batches, then ends.

    TensorFlow: the evaluation's all-reduces pair up; each worker's process
    ends when its main returns, after the last collective: nothing waits for
    a worker that left.

    Source: tensorflow#58434.

    Fix: this.
    """
    result = mwms_cluster.run(train_then_evaluate, timeout=30, on_return="exit")
    result.assert_completed()
    assert all(w.exit_code == 0 for w in result.workers)
    assert all(v == result.return_values[0] for v in result.return_values)
