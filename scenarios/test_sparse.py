"""Sparse gradients: an embedding lookup's gradient is ``IndexedSlices``,
and MWMS does not all-reduce those.  It logs "Collective all_reduce
IndexedSlices: 1 all_reduces" and all-gathers the rows and their indexes
from every worker instead: what each step moves grows with the number of
workers (each gathers every worker's rows), not with the table.  The job
completes; the ledger shows which collectives ran.
"""
import pytest

from scenarios.meta import scenario

VOCAB = 1000
WIDTH = 16
STEPS = 6
BATCH = 32
IDS_PER_EXAMPLE = 8
LOOKUPS = BATCH * IDS_PER_EXAMPLE   # the rows of a worker's gradient


def train_embedding(dense=False):
    """A table of ``VOCAB`` x ``WIDTH`` looked up by ids, under SGD; with
    ``dense``, each gradient is made a dense tensor before it is applied.
    Returns the last loss."""
    import tensorflow as tf

    import harness
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        table = tf.Variable(tf.random.stateless_normal([VOCAB, WIDTH], seed=[1, 2]))
        head = tf.Variable(tf.random.stateless_normal([WIDTH, 1], seed=[3, 4]))
        optimizer = tf.keras.optimizers.SGD(learning_rate=0.1)

    @tf.function
    def step(ids, target):
        def replica(ids, target):
            with tf.GradientTape() as tape:
                rows = tf.reduce_mean(tf.gather(table, ids), axis=1)
                loss = tf.reduce_mean((rows @ head - target) ** 2)
            grads = tape.gradient(loss, [table, head])
            if dense:
                grads = [tf.convert_to_tensor(g) for g in grads]
            optimizer.apply_gradients(zip(grads, [table, head]))
            return loss
        return strategy.reduce("SUM", strategy.run(replica, args=(ids, target)), axis=None)

    loss = None
    for k in ctx.steps(STEPS):
        ids = tf.random.stateless_uniform([BATCH, IDS_PER_EXAMPLE], seed=[ctx.index, k],
                                          maxval=VOCAB, dtype=tf.int32)
        loss = float(step(ids, tf.ones([BATCH, 1])))
    return loss


def _kinds(result):
    return {c.kind for c in result.workers[0].collectives if c.function == "step"}


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="tensorflow#53160",
          fixed_by="test_embedding_gradients_made_dense")
def test_embedding_gradients_left_sparse(mwms_cluster):
    """An embedding table's gradient is left ``IndexedSlices``: MWMS
    all-gathers every worker's rows.

    TensorFlow: 2.21 (Keras 3.15's SGD), measured: each step all-reduces
    the dense head's gradient and all-gathers the table's: the rows'
    count, then the rows and their indexes (the ledger lists the gathers of
    both ``tf.cond`` branches, unpadded and padded, five in all).  Each
    worker gathers every worker's 256 rows, so the step's traffic grows
    with the workers.  The job completes, every worker with the same loss.

    Source: tensorflow#53160 ("Efficient allreduce is not supported for n
    IndexedSlices").

    Fix: dense gradients (``tf.convert_to_tensor``, what
    ``sparse_as_dense`` does), all-reduced with the rest
    (``test_embedding_gradients_made_dense``).
    """
    result = mwms_cluster.run(train_embedding, timeout=30)
    result.assert_completed()
    assert _kinds(result) == {"all-gather", "all-reduce"}, _kinds(result)
    gathered = {c.shape for c in result.workers[0].collectives
                if c.function == "step" and c.kind == "all-gather"}
    assert (LOOKUPS, WIDTH) in gathered, gathered   # each worker's rows, all of them
    assert len(set(result.return_values)) == 1


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="tensorflow#53160")
def test_embedding_gradients_made_dense(mwms_cluster):
    """Fixed: each gradient made dense before it is applied, all-reduced
    with the rest.

    TensorFlow: 2.21, measured: the step all-reduces the table's gradient
    with the head's, packed, and all-gathers nothing; the run completes.

    Source: tensorflow#53160.

    Fix: this.
    """
    result = mwms_cluster.run(train_embedding, kwargs={"dense": True}, timeout=30)
    result.assert_completed()
    assert _kinds(result) == {"all-reduce"}, _kinds(result)
