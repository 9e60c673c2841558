"""Divergent control flow: a worker that takes another path than the others
through code that runs collectives."""
import numpy as np
import pytest

from scenarios.meta import culprit_check, culprit_from_three, scenario

STEPS = 6


# ---------------------------------------------------------------- branch on task_id

def train_with_branch(branch="chief"):
    """The seed's step, where the chief also logs the global gradient norm,
    computed with an all-reduce inside ``strategy.run``.

    ``branch``: ``"chief"`` (``if task_id == 0`` around the all-reduce) or
    ``"all"`` (every worker all-reduces; only the chief prints).
    Returns the losses.
    """
    import tensorflow as tf

    import harness
    from harness import workloads
    from scenarios import mnist_like
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model, optimizer, _ = mnist_like.make_training(strategy)
    loss_object = workloads.make_loss_object()
    task_id = strategy.cluster_resolver.task_id

    def replica_step(inputs):
        _, loss, grads = workloads.replica_gradients(model, loss_object, inputs)
        if branch == "all" or task_id == 0:
            squared = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, tf.add_n([tf.reduce_sum(g * g) for g in grads]))
            if task_id == 0:
                tf.print("global gradient norm", tf.sqrt(squared))
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def step(inputs):
        return strategy.reduce(tf.distribute.ReduceOp.SUM,
                               strategy.run(replica_step, args=(inputs,)), axis=None)

    x, y = mnist_like.make_data()
    iterator = iter(mnist_like.distributed_dataset(strategy, x, y))
    return [float(step(next(iterator))) for _ in ctx.steps(STEPS)]


_BRANCH_RUN = dict(timeout=10, grace=2)


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="InvalidArgumentError", source="seed rule 3",
          fixed_by="test_collective_on_every_branch")
def test_branch_on_task_id_with_collective(mwms_cluster, scenario_run):
    """``if task_id == 0:`` inside the replica function, around an all-reduce
    (the chief logs the global gradient norm).

    TensorFlow: the chief traces one more all-reduce than the others, so
    collectives pair up out of order: the chief's scalar norm meets the
    others' packed gradients and the workers raise ``InvalidArgumentError:
    Shape mismatch in the collective instance`` at step 0 (every worker, or
    all but one left blocked until killed; which one varies).  Had the
    shapes matched, the values would have been silently mixed up, and the
    run would hang at the end.

    Source: seed rule 3 (all replicas run the same computation).

    Fix: run every collective on every worker and branch only around the
    local side effect (the print).
    """
    result = scenario_run("branch", train_with_branch, **_BRANCH_RUN)
    result.assert_failed(error="InvalidArgumentError")
    assert any("Shape mismatch in the collective instance" in w.exception.message
               for w in result.workers if w.exception is not None)
    assert all(w.last_step == 0 for w in result.workers)


@pytest.mark.timeout(60)
@culprit_check("test_branch_on_task_id_with_collective")
def test_branch_on_task_id_with_collective_culprit(mwms_cluster, scenario_run):
    """The chief took the branch with the extra all-reduce: it is the culprit
    from 3 workers up (its step 0 launched more collectives than the
    majority's).  With 2 the run fails in the first step, so no worker has a
    usual count to differ from: it cannot tell."""
    result = scenario_run("branch", train_with_branch, **_BRANCH_RUN)
    culprit_from_three(result, 0)


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="seed rule 3")
def test_collective_on_every_branch(mwms_cluster):
    """Fixed: every worker all-reduces the gradient norm; only the chief prints it.

    TensorFlow: the same collectives in the same order everywhere; all
    workers complete with the same losses; the chief's log has the norms.

    Source: seed rule 3.

    Fix: this.
    """
    result = mwms_cluster.run(train_with_branch, kwargs={"branch": "all"}, timeout=20)
    result.assert_completed()
    assert all(v == result.return_values[0] for v in result.return_values)
    assert result.workers[0].log.count("global gradient norm") == STEPS


# ---------------------------------------------------------------- early stopping

EVAL_EVERY = 5


def train_with_early_stopping(decision="local", steps=40, patience=1):
    """The seed's loop with early stopping on a validation loss, checked every
    5 steps.  Each worker holds its own validation data; the chief's has bad
    labels, so its validation loss soon goes up.

    ``decision``: ``"local"`` (each worker stops on its own validation
    loss) or ``"agreed"`` (the validation losses are all-reduced first, so
    all decide alike).  Returns (stopping step or None, validation losses).
    """
    import tensorflow as tf

    import harness
    from scenarios import mnist_like
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    tf.keras.utils.set_random_seed(0)  # the same initial weights every run
    model, _, step = mnist_like.make_training(strategy)
    x, y = mnist_like.make_data()
    iterator = iter(mnist_like.distributed_dataset(strategy, x, y))
    vx, vy = mnist_like.make_data(512, seed=100 + ctx.index)
    if ctx.index == 0:
        vy = np.random.default_rng(7).integers(0, mnist_like.CLASSES, len(vy)).astype(np.int64)

    def local_val_loss():
        return tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(vy, model(vx)))

    @tf.function
    def agreed_val_loss():
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(local_val_loss),
                               axis=None)

    best, worse, history = float("inf"), 0, []
    for k in ctx.steps(steps):
        step(next(iterator))
        if (k + 1) % EVAL_EVERY:
            continue
        val = float(agreed_val_loss() if decision == "agreed" else local_val_loss())
        history.append(round(val, 4))
        if val < best:
            best, worse = val, 0
        else:
            worse += 1
            if worse >= patience:
                return k, history
    return None, history


# The hang is proven once the chief has returned; the timeout only bounds
# how late its return may come (freeing its iterator takes seconds under load).
_EARLY_RUN = dict(timeout=30)


@pytest.mark.timeout(60)
@scenario(outcome="hang", source="DeepRec-AI/HybridBackend#88",
          fixed_by="test_early_stopping_on_an_agreed_metric")
def test_per_worker_early_stopping(mwms_cluster, scenario_run):
    """Each worker decides on its own to stop early, from its own validation loss.

    TensorFlow: the chief's validation loss rises first (step 9 on this
    seed), it leaves the loop and returns; the others go on to step 10 and
    block forever in its all-reduce.  No error.

    Source: DeepRec-AI/HybridBackend#88 (EarlyStopping on a multi-worker job
    hangs every worker).

    Fix: base the decision on a value all workers share: all-reduce the
    validation loss (Keras ``fit`` does this for ``val_loss``), or
    all-reduce the stop flag itself.
    """
    result = scenario_run("early", train_with_early_stopping, **_EARLY_RUN)
    result.assert_hang()
    stopped_at, _ = result.workers[0].return_value
    assert stopped_at == 9
    assert all(w.return_value is None and w.last_step == stopped_at + 1
               for w in result.workers[1:])


@pytest.mark.timeout(60)
@culprit_check("test_per_worker_early_stopping")
def test_per_worker_early_stopping_culprit(mwms_cluster, scenario_run):
    """The chief stopped alone, leaving the others in step 10: it is the
    culprit from 3 workers up.  With 2, a loop that ended early looks like
    one that ran a step too many: it cannot tell."""
    result = scenario_run("early", train_with_early_stopping, **_EARLY_RUN)
    culprit_from_three(result, 0)
    if mwms_cluster.num_workers > 2:
        result.assert_hang(step=10)


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="DeepRec-AI/HybridBackend#88")
def test_early_stopping_on_an_agreed_metric(mwms_cluster):
    """Fixed: the validation losses are all-reduced before the decision.

    TensorFlow: every worker sees the same mean validation loss, so all stop
    at the same step (or none does); all complete.

    Source: DeepRec-AI/HybridBackend#88.

    Fix: this.
    """
    result = mwms_cluster.run(train_with_early_stopping, kwargs={"decision": "agreed"},
                              timeout=20)
    result.assert_completed()
    assert all(v == result.return_values[0] for v in result.return_values)


# ---------------------------------------------------------------- skipped step

SKIPPED = 3


def train_skipping(skip_where="last", steps=8):
    """The seed's loop for 8 steps; returns the number of steps it ran.

    ``skip_where``: ``"last"`` (the last worker finds step 3's local batch
    bad and skips it with ``continue``: a decision only it makes) or
    ``"everywhere"`` (a "bad batch" rule that every worker applies alike:
    step 3's batch is drawn, and all skip it).
    """
    import tensorflow as tf

    import harness
    from scenarios import mnist_like
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    _, _, step = mnist_like.make_training(strategy)
    x, y = mnist_like.make_data()
    iterator = iter(mnist_like.distributed_dataset(strategy, x, y))
    ran = 0
    for k in ctx.steps(steps):
        batch = next(iterator)
        local_bad = skip_where == "last" and ctx.index == ctx.num_workers - 1
        if k == SKIPPED and (skip_where == "everywhere" or local_bad):
            continue
        step(batch)
        ran += 1
    return ran


@pytest.mark.timeout(60)
@scenario(outcome="hang", source="seed article (the deadlock it describes)",
          fixed_by="test_step_skipped_by_every_worker")
def test_worker_skips_a_step(mwms_cluster):
    """One worker skips step 3 (a ``continue`` on a bad local batch, say);
    the others run it.

    TensorFlow: collectives pair up by order, so from step 3 on the skipper's
    step k meets the others' step k - 1, silently; at the last step the
    skipper has returned and the others block forever.

    Source: the seed article: workers "stuck at a barrier" because one did
    not run the same communication.

    Fix: decide any skip from a value every worker shares (an all-reduced
    flag), so that all skip together.
    """
    last = mwms_cluster.num_workers - 1
    # Declared once certain (the skipper returned): the timeout only bounds
    # a loaded machine's wait for that return.
    result = mwms_cluster.run(train_skipping, timeout=15)
    result.assert_hang(culprits=[last], step=SKIPPED)
    assert not result.ambiguous
    assert result.workers[last].return_value == 7
    assert all(w.return_value is None for w in result.workers[:last])


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="seed article (the deadlock it describes)")
def test_step_skipped_by_every_worker(mwms_cluster):
    """Fixed: step 3 is skipped by every worker alike.

    TensorFlow: the same collectives in the same order everywhere; all
    workers complete after 7 steps.

    Source: the seed article.

    Fix: skip only on a decision all workers share.
    """
    result = mwms_cluster.run(train_skipping, kwargs={"skip_where": "everywhere"}, timeout=20)
    result.assert_completed()
    assert result.return_values == [7] * mwms_cluster.num_workers
