"""tf_keras ``model.fit`` under MWMS, second round: validation data,
stopping early, saving weights (``TF_USE_LEGACY_KERAS=1``: Keras 3's
``fit`` does not run under this strategy).

A small classifier on 8 made-up features; the training set is shared and
repeated, 2 epochs of 5 steps unless a scenario says otherwise.
"""
import os
import time

import pytest

from scenarios.meta import KERAS_2, NO_FIX, culprit_from_three, scenario  # noqa: F401

TF_KERAS = KERAS_2
BATCH = 16


MARKS = "marks"            # the overlapping saves' handshake files, in the run's directory
MARK_TIMEOUT = 30.0


def _mark(directory, name, text=""):
    with open(os.path.join(directory, MARKS, name), "w") as f:
        f.write(text)


def _wait_for_mark(directory, name) -> str:
    path = os.path.join(directory, MARKS, name)
    deadline = time.monotonic() + MARK_TIMEOUT
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {name!r} mark after {MARK_TIMEOUT:.0f} s")
        time.sleep(0.01)
    with open(path) as f:
        return f.read()


def save_overlapping(model, path, directory, ctx):
    """Every worker's ``model.save(path)`` to one ``.keras`` path, overlapped
    the way a slow disk or a busy machine can: worker 0 opens the archive
    and writes its first member (``metadata.json``, with a ``date_saved``
    to the second), then the others start theirs, in a later second; worker
    0 writes the archive's directory last.  Files in ``directory/marks``
    line the writers up; the saves themselves are Keras's, unchanged."""
    import zipfile
    os.makedirs(os.path.join(directory, MARKS), exist_ok=True)
    others = [f"saved-{i}" for i in range(1, ctx.num_workers)]
    if ctx.index != 0:
        opened_at = float(_wait_for_mark(directory, "opened-0"))
        while int(time.time()) <= int(opened_at):    # another second: another date_saved
            time.sleep(0.01)
        model.save(path)
        _mark(directory, f"saved-{ctx.index}")
        return
    plain = zipfile.ZipFile

    class SlowToFinish(plain):
        """Marks its second member's start (the first is written), and
        closes only once the other workers' saves have ended."""
        members = 0

        def open(self, name, mode="r", **kwargs):
            if mode == "w":
                self.members += 1
                if self.members == 2:
                    _mark(directory, "opened-0", repr(time.time()))
            return super().open(name, mode, **kwargs)

        def close(self):
            if self.mode == "w" and self.fp is not None:
                for name in others:
                    _wait_for_mark(directory, name)
            super().close()

    zipfile.ZipFile = SlowToFinish
    try:
        model.save(path)
    finally:
        zipfile.ZipFile = plain


def fit_job(variant, directory=None, epochs=2):
    """``fit`` with one of the scenarios' ``variant``s; returns the epochs
    fitted and the validation losses fit reported."""
    import numpy as np
    import tensorflow as tf

    import harness
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    tf.keras.utils.set_random_seed(1)
    rng = np.random.default_rng(0)
    x = rng.random((512, 8)).astype("float32")
    y = rng.integers(0, 3, 512)
    train = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH)
    own = tf.data.Options()          # each worker's own validation data, not sharded
    own.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    mine = np.random.default_rng(100 + ctx.index)
    kwargs, callbacks, learning_rate = {}, [], 0.01
    if variant in ("val_uneven", "val_repeated"):
        n = (3 + ctx.index) * BATCH                    # worker i: 3 + i batches
        val = tf.data.Dataset.from_tensor_slices(
            (mine.random((n, 8)).astype("float32"), mine.integers(0, 3, n))).batch(BATCH)
        if variant == "val_repeated":
            val, kwargs["validation_steps"] = val.repeat(), 3
        kwargs["validation_data"] = val.with_options(own)
    elif variant == "val_shared":
        kwargs["validation_data"] = tf.data.Dataset.from_tensor_slices(
            (rng.random((5 * BATCH, 8)).astype("float32"), rng.integers(0, 3, 5 * BATCH))
        ).batch(BATCH)                                 # 5 batches: shards of 3 and 2
    elif variant in ("stop_one", "early_stopping"):
        n = 3 * BATCH
        val = tf.data.Dataset.from_tensor_slices(
            ((mine.random((n, 8)) + 3.0 * ctx.index).astype("float32"), mine.integers(0, 3, n)))
        kwargs["validation_data"] = val.batch(BATCH).repeat().with_options(own)
        kwargs["validation_steps"] = 3
        epochs = 6
        if variant == "early_stopping":
            callbacks.append(tf.keras.callbacks.EarlyStopping(monitor="val_loss", patience=0))
            learning_rate = 2.0    # the validation loss goes up within a few epochs
        else:
            class StopOnWorker1(tf.keras.callbacks.Callback):
                """A stopping rule that looks at this worker's own numbers."""

                def on_epoch_end(self, epoch, logs=None):
                    if ctx.index == 1 and epoch == 1:
                        self.model.stop_training = True
            callbacks.append(StopOnWorker1())
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(16, activation="relu",
                                                           input_shape=(8,)),
                                     tf.keras.layers.Dense(3)])
        model.compile(tf.keras.optimizers.SGD(learning_rate),
                      tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(train, epochs=epochs, steps_per_epoch=5, callbacks=callbacks,
                        verbose=0, **kwargs)
    if variant == "save_same":
        save_overlapping(model, os.path.join(directory, "model.keras"), directory, ctx)
    elif variant == "save_weights_same":
        model.save_weights(os.path.join(directory, "model.weights.h5"))
    elif variant == "save_weights_chief":
        target = directory if ctx.is_chief else os.path.join(directory, f"workertemp_{ctx.index}")
        os.makedirs(target, exist_ok=True)
        model.save_weights(os.path.join(target, "model.weights.h5"))
        if not ctx.is_chief:
            tf.io.gfile.rmtree(target)
    return {"epochs": len(history.history["loss"]),
            "val_loss": [round(float(v), 6) for v in history.history.get("val_loss", [])]}


def _same_on_every_worker(result):
    return all(v == result.return_values[0] for v in result.return_values)


# ---------------------------------------------------------------- validation

@pytest.mark.timeout(60)
@scenario(outcome="failed", error="InternalError", source="tensorflow/models#10849, "
          "tensorflow#33531", fixed_by="test_fit_validation_repeated_with_steps")
def test_fit_validation_uneven_without_steps(mwms_cluster):
    """``fit(validation_data=...)`` where each worker has its own finite
    validation set (worker i: 3 + i batches), no ``validation_steps``.

    TensorFlow: tf_keras counts validation steps from the *local* dataset's
    cardinality, so worker 0 validates 3 batches and moves on to the
    validation metrics' all-reduce (float32) while the others still run
    their 4th validation step (int64): ``InternalError`` "Collective ...
    expected type 0 and data_type 1 but got type 0 and data_type 9", the
    others blocked.

    Source: tensorflow/models#10849, tensorflow#33531.

    Fix: a repeated validation set and ``validation_steps`` the same on
    every worker (or one validation set the strategy shards).
    """
    result = mwms_cluster.run(fit_job, args=("val_uneven",), timeout=10, grace=2, env=TF_KERAS)
    result.assert_failed(error="InternalError")
    raised = [w for w in result.workers if w.exception is not None]
    assert any("expected type" in w.exception.message for w in raised)


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="tensorflow/models#10849, tensorflow#33531")
def test_fit_validation_repeated_with_steps(mwms_cluster):
    """Fixed: each worker's validation set repeated, ``validation_steps=3``.

    TensorFlow: every worker validates 3 batches an epoch; ``val_loss`` is
    aggregated across workers, the same number on every worker.

    Source: tensorflow/models#10849, tensorflow#33531.

    Fix: this.
    """
    result = mwms_cluster.run(fit_job, args=("val_repeated",), timeout=20, env=TF_KERAS,
                              check_replicas=True)
    result.assert_completed()
    assert _same_on_every_worker(result) and len(result.return_values[0]["val_loss"]) == 2


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="tensorflow/models#10849, tensorflow#33531")
def test_fit_validation_one_set_sharded(mwms_cluster):
    """Fixed upstream: one finite validation set the strategy shards, no
    ``validation_steps``, of 5 batches (shards of 3 and 2 at 2 workers).

    TensorFlow: on 2.21 this completes: the distributed iterator keeps the
    workers in step over shards of unequal length, and ``val_loss`` is the
    same on every worker.  Reported as a hang on older versions.

    Source: tensorflow/models#10849, tensorflow#33531.

    Fix: none needed on TensorFlow 2.21.
    """
    result = mwms_cluster.run(fit_job, args=("val_shared",), timeout=20, env=TF_KERAS)
    result.assert_completed()
    assert _same_on_every_worker(result)


# ---------------------------------------------------------------- stopping early

@pytest.mark.timeout(60)
@scenario(outcome="hang", source="DeepRec-AI/HybridBackend#88",
          fixed_by="test_fit_early_stopping_on_val_loss")
def test_fit_callback_stops_one_worker(mwms_cluster):
    """A callback sets ``model.stop_training`` on worker 1 only (a rule on
    that worker's own numbers), after epoch 1 of 6.

    TensorFlow: worker 1 leaves ``fit`` and returns; the others start epoch
    3 and wait in its first all-reduce for ever (no error, even once
    worker 1's process is gone).

    Source: DeepRec-AI/HybridBackend#88 (early stopping without agreement
    under ``fit``); the custom-loop form is ``test_early_stopping_on_a_local_metric``.

    Fix: decide on a metric every worker shares (``fit``'s ``val_loss`` is
    aggregated across workers, so ``EarlyStopping`` agrees), or all-reduce
    the decision.
    """
    # Proven once worker 1 returned: the timeout only bounds a slow start.
    result = mwms_cluster.run(fit_job, args=("stop_one",), timeout=15, env=TF_KERAS)
    result.assert_hang()
    assert result.workers[1].returned and result.workers[1].return_value["epochs"] == 2
    culprit_from_three(result, 1)


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="DeepRec-AI/HybridBackend#88")
def test_fit_early_stopping_on_val_loss(mwms_cluster):
    """Fixed: ``EarlyStopping(monitor="val_loss", patience=0)``, with
    validation data of each worker's own (their local losses differ).

    TensorFlow: ``fit`` aggregates ``val_loss`` across workers before the
    callbacks see it, so every worker stops after the same epoch.

    Source: DeepRec-AI/HybridBackend#88.

    Fix: this.
    """
    result = mwms_cluster.run(fit_job, args=("early_stopping",), timeout=20, env=TF_KERAS)
    result.assert_completed()
    assert _same_on_every_worker(result) and result.return_values[0]["epochs"] < 6


# ---------------------------------------------------------------- saving

@pytest.mark.timeout(60)
@scenario(outcome="failed", error="BlockingIOError", source="tensorflow#38635",
          fixed_by="test_save_weights_chief_and_temporary_paths")
def test_save_weights_to_the_same_path(mwms_cluster, tmp_path):
    """Every worker calls ``model.save_weights`` with the same ``.h5`` path.

    TensorFlow: saving reads the loss tracker's sync-on-read variables,
    which all-reduces, so every worker is inside the save at the same
    moment: one holds the HDF5 file's lock while it waits in that
    all-reduce, another fails to lock it (``BlockingIOError`` "unable to
    lock file"), and the file is left empty.

    Source: tensorflow#38635 (saving from every worker to one path).

    Fix: the chief saves to the real path, the others to temporary paths
    they delete (every worker must still call save: it runs a collective).
    """
    result = mwms_cluster.run(fit_job, args=("save_weights_same", str(tmp_path)), timeout=10,
                              grace=2, env=TF_KERAS)
    result.assert_failed(error="BlockingIOError")
    assert any("unable to lock file" in (w.exception.message if w.exception else "")
               for w in result.workers)


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="tensorflow#38635")
def test_save_weights_chief_and_temporary_paths(mwms_cluster, tmp_path):
    """Fixed: the chief saves the weights to the real path, the others to
    temporary directories they delete.

    TensorFlow: every worker runs the save's all-reduce; one file is left.

    Source: tensorflow#38635; the MWMS Keras tutorial's ``write_filepath``.

    Fix: this.
    """
    result = mwms_cluster.run(fit_job, args=("save_weights_chief", str(tmp_path)), timeout=20,
                              env=TF_KERAS)
    result.assert_completed()
    assert sorted(os.listdir(tmp_path)) == ["model.weights.h5"]


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="tensorflow#38635",
          fixed_by="test_save_weights_chief_and_temporary_paths")
def test_model_save_keras_file_to_the_same_path(mwms_cluster, tmp_path):
    """Every worker calls ``model.save`` with the same ``.keras`` path, and
    the saves overlap.

    Worker 0 starts first and ends last, the others start their archives
    a second later (:func:`save_overlapping` lines them up so, every time).

    TensorFlow: 2.21 (tf_keras 2.21), measured: each save opens the path
    for writing (truncating it) and writes its members at its own offsets.
    The others' later opens wipe worker 0's ``metadata.json``, so the
    archive holds theirs (another ``date_saved``) under worker 0's
    directory, written last, with its checksum: ``testzip()`` names
    ``metadata.json``.  Every worker returns, so no verdict can see it;
    only the file is lost.  Saves that do not overlap, or that fall in the
    same second, leave a whole file: the race as it comes decides.

    Source: tensorflow#38635.

    Fix: as for ``save_weights``: chief to the real path, the others to
    temporary ones (``test_save_weights_chief_and_temporary_paths``).
    """
    import zipfile
    result = mwms_cluster.run(fit_job, args=("save_same", str(tmp_path)), timeout=20,
                              env=TF_KERAS)
    result.assert_completed()
    with zipfile.ZipFile(tmp_path / "model.keras") as archive:
        assert archive.testzip() == "metadata.json"
