"""What the ledger learns of each collective at trace time on real
workers: its label (the ops producing each packed part) and its timeout."""
import pytest


def reduce_two(timeout_seconds=None):
    """Two variables made in scope, then 3 steps that all-reduce two
    gradients-like values in one pack, under ``CommunicationOptions(timeout_seconds=...)``."""
    import tensorflow as tf

    import harness
    ctx = harness.context()
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout_seconds)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    with strategy.scope():
        a, b = tf.Variable(1.0), tf.Variable(2.0)

    @tf.function
    def step():
        def replica():
            doubled = tf.identity(a * 2.0, name="doubled")
            tripled = tf.cast(b * 3.0, tf.float32, name="tripled")
            return tf.distribute.get_replica_context().all_reduce("SUM", [doubled, tripled])
        return strategy.run(replica)

    for _ in ctx.steps(3):
        step()
    return True


@pytest.mark.timeout(60)
def test_labels_and_timeouts_of_real_collectives(mwms_cluster):
    result = mwms_cluster.run(reduce_two, kwargs={"timeout_seconds": 5.0}, timeout=30)
    result.assert_completed()
    for w in result.workers:
        ops = {f.name: f.collectives for f in w.observation.functions}
        (packed,) = ops["step"]
        # Through Identity and Cast to the ops that made each part; MWMS
        # packs the list backwards (measured on TensorFlow 2.21).
        assert (packed.shape, packed.label, packed.timeout) == ((2,), ("mul_1", "mul"), 5.0)
        (init,) = ops["<eager broadcast>"]
        assert (init.label, init.timeout) == ((), 0.0)   # eager: no graph, no timeout given
