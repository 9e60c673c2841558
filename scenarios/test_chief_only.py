"""Work done on the chief only: fine when it is local (logging), a deadlock
or an error when it runs a collective (the seed article's rule 5, and where
it stops holding)."""
import os

import pytest

from scenarios.meta import KERAS_2_PACKAGE, culprit_check, culprit_from_three, scenario, use_keras2

STEPS = 6


def _write_dir(directory, strategy, index):
    """The chief writes to ``directory``; the others to a temporary directory
    of their own (the pattern of the MWMS tutorials), deleted afterwards."""
    from scenarios.mnist_like import is_chief
    return directory if is_chief(strategy) else os.path.join(directory, f".worker-{index}-tmp")


def train_and_checkpoint(directory, who="chief", sync_on_read=True):
    """The seed's loop for 6 steps, then ``tf.train.Checkpoint.save``.

    ``who``: ``"chief"`` saves on the chief only, ``"all"`` on every worker.
    ``sync_on_read``: the checkpoint also holds an "examples seen" counter
    kept per replica and summed when read (``VariableSynchronization.ON_READ``,
    what tf_keras metrics are made of).  Returns the chief directory's
    listing.
    """
    import shutil

    import tensorflow as tf

    import harness
    from scenarios import mnist_like
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model, optimizer, step = mnist_like.make_training(strategy)
    state = {"model": model, "optimizer": optimizer}
    if sync_on_read:
        with strategy.scope():
            seen = tf.Variable(0.0, trainable=False,
                               synchronization=tf.VariableSynchronization.ON_READ,
                               aggregation=tf.VariableAggregation.SUM)
        state["examples_seen"] = seen
        count = tf.function(lambda batch: strategy.run(
            lambda b: seen.assign_add(tf.cast(tf.shape(b[1])[0], tf.float32)), args=(batch,)))
    checkpoint = tf.train.Checkpoint(**state)
    x, y = mnist_like.make_data()
    iterator = iter(mnist_like.distributed_dataset(strategy, x, y))
    for _ in ctx.steps(STEPS):
        batch = next(iterator)
        step(batch)
        if sync_on_read:
            count(batch)
    if who == "all" or mnist_like.is_chief(strategy):
        write_dir = _write_dir(directory, strategy, ctx.index)
        checkpoint.save(os.path.join(write_dir, "ckpt"))
        if write_dir != directory:
            shutil.rmtree(write_dir, ignore_errors=True)
    return sorted(os.listdir(directory))


# The ledger proves these hangs once the other workers returned; the timeout
# only bounds a start-up that load slows (strategy creation took over 5 s
# with 16 workers on 2 cores).
_CKPT_RUN = dict(timeout=15)


def _chief_checkpoint(scenario_run, tmp_path):
    return scenario_run("checkpoint", train_and_checkpoint, args=(str(tmp_path),), **_CKPT_RUN)


@pytest.mark.timeout(60)
@scenario(outcome="hang", source="MWMS docs: save on every worker",
          fixed_by="test_checkpoint_on_every_worker")
def test_checkpoint_on_chief_only(mwms_cluster, scenario_run, tmp_path_factory):
    """``checkpoint.save`` on the chief only, and the checkpoint holds a
    sync-on-read variable.

    TensorFlow: saving reads the variable's value, which for a sync-on-read
    variable is an all-reduce across workers; the others have returned, so
    the chief blocks forever in ``save``.  Mid-training, the same all-reduce
    pairs with the others' next gradient all-reduce instead: an
    ``InvalidArgumentError`` (shape mismatch) rather than a hang.

    Source: the MWMS custom-training-loop tutorial ("save on every worker",
    non-chief workers to a temporary directory).

    Fix: call ``save`` on every worker, the non-chief ones into a temporary
    directory they delete afterwards.
    """
    result = _chief_checkpoint(scenario_run, tmp_path_factory.mktemp("ckpt"))
    result.assert_hang()
    assert result.workers[0].return_value is None
    assert "save" in result.workers[0].stack
    assert all(w.returned for w in result.workers[1:])
    # The ledger names the all-reduce by the user's line that launched it.
    chief = next(ln for ln in result.report().splitlines() if ln.startswith("  worker 0:"))
    assert "`<eager all-reduce>` from test_chief_only.py:" in chief and \
        'in train_and_checkpoint: checkpoint.save(os.path.join(write_dir, "ckpt"))' in chief, \
        result.report()


@pytest.mark.timeout(60)
@culprit_check("test_checkpoint_on_chief_only")
def test_checkpoint_on_chief_only_culprit(mwms_cluster, scenario_run, tmp_path_factory):
    """The chief runs a collective nobody else joins: it is the culprit, at
    every N (its steps launched one collective more than its others)."""
    _chief_checkpoint(scenario_run, tmp_path_factory.mktemp("ckpt")).assert_culprit(0)


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="MWMS docs: save on every worker")
def test_checkpoint_on_every_worker(mwms_cluster, tmp_path):
    """Fixed: every worker calls ``checkpoint.save``; the chief into the real
    directory, the others into temporary ones they delete.

    TensorFlow: the all-reduce behind the sync-on-read variable runs on all
    workers and pairs up; all complete; the chief's directory holds the
    checkpoint.

    Source: the MWMS custom-training-loop tutorial.

    Fix: this.
    """
    result = mwms_cluster.run(train_and_checkpoint, args=(str(tmp_path),),
                              kwargs={"who": "all"}, timeout=20)
    result.assert_completed()
    assert sorted(os.listdir(tmp_path)) == [
        "checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="MWMS docs: save on every worker",
          fixed_by="test_checkpoint_on_every_worker")
def test_checkpoint_on_chief_only_mirrored_state(mwms_cluster, tmp_path):
    """``checkpoint.save`` on the chief only, of a model and optimizer alone
    (mirrored variables, nothing sync-on-read).

    TensorFlow: reading a mirrored variable is local, so on this version the
    save runs no collective and all workers complete: the mistake is silent
    until someone adds a metric or a counter to the checkpoint (see
    ``test_checkpoint_on_chief_only``).  The replica check passes too: the
    replicas really stay equal, since the mistake is in saving, not in
    training.

    Source: the MWMS custom-training-loop tutorial.

    Fix: save on every worker anyway.
    """
    result = mwms_cluster.run(train_and_checkpoint, args=(str(tmp_path),),
                              kwargs={"sync_on_read": False}, timeout=20, check_replicas=True)
    result.assert_completed()
    assert "ckpt-1.index" in os.listdir(tmp_path)
    assert result.replicas.divergence is None and result.replicas.variables[0] > 0


def fit_and_save(directory, who="chief"):
    """tf_keras (``TF_USE_LEGACY_KERAS=1``): compile with a metric, fit 5
    steps, then ``model.save`` (``.keras``) on the chief only or on all."""
    import shutil

    import tensorflow as tf

    import harness
    from scenarios import mnist_like
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = mnist_like.build_model()
        model.compile(optimizer=tf.keras.optimizers.Adam(0.001),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    x, y = mnist_like.make_data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
        mnist_like.GLOBAL_BATCH_SIZE)
    model.fit(dataset, epochs=1, steps_per_epoch=5, verbose=0,
              callbacks=[ctx.keras_callback()])
    if who == "all" or mnist_like.is_chief(strategy):
        write_dir = _write_dir(directory, strategy, ctx.index)
        os.makedirs(write_dir, exist_ok=True)
        model.save(os.path.join(write_dir, "model.keras"))
        if write_dir != directory:
            shutil.rmtree(write_dir, ignore_errors=True)
    return tf.keras.__name__, sorted(os.listdir(directory))


_SAVE_RUN = dict(timeout=15)   # proven, as _CKPT_RUN


def _chief_save(scenario_run, directory):
    return scenario_run("model_save", fit_and_save, args=(str(directory),), **_SAVE_RUN)


@pytest.mark.timeout(60)
@scenario(outcome="hang", source="MWMS Keras docs: save on every worker",
          fixed_by="test_model_save_on_every_worker")
def test_model_save_on_chief_only(mwms_cluster, scenario_run, tmp_path_factory, monkeypatch):
    """tf_keras ``model.save`` on the chief only, after ``fit`` with a metric.

    TensorFlow: the compiled metrics' variables are sync-on-read; saving
    reads them, an all-reduce the other workers (already returned) never
    join: the chief blocks forever in ``model.save``.  (``.h5`` saving,
    which skips them, completes.)

    Source: the multi-worker Keras tutorial ("model saving ... needs to
    happen on every worker").

    Fix: ``model.save`` on every worker, non-chief ones into a temporary
    directory they delete.
    """
    use_keras2(monkeypatch)
    result = _chief_save(scenario_run, tmp_path_factory.mktemp("save"))
    result.assert_hang()
    assert result.workers[0].return_value is None
    assert all(w.return_value[0].startswith(KERAS_2_PACKAGE) for w in result.workers[1:])


@pytest.mark.timeout(60)
@culprit_check("test_model_save_on_chief_only")
def test_model_save_on_chief_only_culprit(mwms_cluster, scenario_run, tmp_path_factory,
                                          monkeypatch):
    """The chief runs a collective nobody else joins: it is the culprit from
    3 workers up (the majority); with 2 the save's collectives come outside
    any step of ``fit``, and one finished worker against one blocked is
    symmetric: it cannot tell."""
    use_keras2(monkeypatch)
    result = _chief_save(scenario_run, tmp_path_factory.mktemp("save"))
    culprit_from_three(result, 0)


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="MWMS Keras docs: save on every worker")
def test_model_save_on_every_worker(mwms_cluster, tmp_path, monkeypatch):
    """Fixed: every worker calls tf_keras ``model.save``, non-chief ones into
    temporary directories they delete.

    TensorFlow: the metrics' all-reduces pair up; all complete; the chief's
    directory holds ``model.keras``.

    Source: the multi-worker Keras tutorial.

    Fix: this.
    """
    use_keras2(monkeypatch)
    result = mwms_cluster.run(fit_and_save, args=(str(tmp_path),), kwargs={"who": "all"},
                              timeout=20)
    result.assert_completed()
    assert os.listdir(tmp_path) == ["model.keras"]


def train_with_chief_work(directory, evaluate="chief", every=3):
    """The seed's loop for 6 steps; every 3 steps an evaluation on a held-out
    batch (an all-reduced mean loss) and a log line, both on the chief only.

    ``evaluate``: ``"chief"`` (evaluate on the chief only), ``"all"``
    (evaluate everywhere, log on the chief only) or ``None`` (no
    evaluation: log the training loss, which every worker computed anyway).
    """
    import tensorflow as tf

    import harness
    from scenarios import mnist_like
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model, _, step = mnist_like.make_training(strategy)
    x, y = mnist_like.make_data()
    iterator = iter(mnist_like.distributed_dataset(strategy, x, y))
    vx, vy = mnist_like.make_data(256, seed=1)
    val_iterator = iter(mnist_like.distributed_dataset(strategy, vx, vy))
    chief = mnist_like.is_chief(strategy)

    @tf.function
    def eval_step(inputs):
        def replica(inputs):
            images, labels = inputs
            return tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
                labels, model(images, training=False)))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(replica, args=(inputs,)),
                               axis=None)

    log = []
    for k in ctx.steps(STEPS):
        loss = float(step(next(iterator)))
        if (k + 1) % every:
            continue
        if evaluate == "all" or (evaluate == "chief" and chief):
            val = float(eval_step(next(val_iterator)))
        else:
            val = None
        if chief:
            log.append(f"step {k}: loss {loss:.4f} val {val}")
            with open(os.path.join(directory, "train.log"), "a") as f:
                print(log[-1], file=f)
    return log


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="seed rule 5")
def test_chief_only_logging(mwms_cluster, tmp_path):
    """Chief-only logging: only the chief prints and writes a log file, of
    values every worker computed anyway.

    TensorFlow: logging is local and runs no collective; all workers
    complete; one log file, from the chief.

    Source: seed rule 5 (log and write files on the chief only).

    Fix: nothing to fix: chief-only side effects are fine as long as they
    call no collective.
    """
    result = mwms_cluster.run(train_with_chief_work, args=(str(tmp_path),),
                              kwargs={"evaluate": None}, timeout=20)
    result.assert_completed()
    assert len(result.workers[0].return_value) == STEPS // 3
    assert all(w.return_value == [] for w in result.workers[1:])
    assert os.listdir(tmp_path) == ["train.log"]


_EVAL_RUN = dict(kwargs={"evaluate": "chief"}, timeout=10, grace=10)


@pytest.mark.by_version   # Keras 2's first step differs (docs/versions.md)
@pytest.mark.timeout(60)
@scenario(outcome="failed", error="InvalidArgumentError", source="seed rule 5",
          fixed_by="test_evaluation_on_every_worker")
def test_chief_only_evaluation(mwms_cluster, tmp_path):
    """Chief-only evaluation: every 3 steps the chief alone runs an
    evaluation step that all-reduces its loss.

    TensorFlow: the chief's evaluation all-reduce (a scalar) pairs with the
    others' next gradient all-reduce (the packed gradients): every worker
    raises ``InvalidArgumentError: Shape mismatch in the collective instance
    ... expected shape [1] but another member in the group expected shape
    [7960]`` at step 2/3.  Had the shapes matched, the values would have been
    silently mixed up.  The verdict, from 3 workers: the chief, whose step
    launched one collective more than the majority's; with 2, a chief whose
    loop ended a step early (its last step's collective more) looks the
    same, and it cannot tell.

    Source: seed rule 5, applied too far (its own loop only logs).

    Fix: run the evaluation on every worker (each on its shard of the
    validation data); only the logging stays on the chief.
    """
    result = mwms_cluster.run(train_with_chief_work, args=(str(tmp_path),), **_EVAL_RUN)
    culprit_from_three(result.assert_failed(error="InvalidArgumentError"), 0)
    assert "Shape mismatch in the collective instance" in result.workers[0].exception.message
    assert "eval_step" in result.workers[0].exception.traceback


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="seed rule 5")
def test_evaluation_on_every_worker(mwms_cluster, tmp_path):
    """Fixed: every worker runs the evaluation step; only the chief logs it.

    TensorFlow: the evaluation all-reduces pair up; all workers complete; the
    chief's log has the validation loss.

    Source: seed rule 5.

    Fix: this.
    """
    result = mwms_cluster.run(train_with_chief_work, args=(str(tmp_path),),
                              kwargs={"evaluate": "all"}, timeout=20)
    result.assert_completed()
    assert all("val None" not in line for line in result.workers[0].return_value)
