"""Users' bugs in Keras callbacks under MWMS: a callback that stops,
evaluates, reads a metric or saves on one worker only.  The jobs are a
user's script as a function, as in :mod:`harness.bench.corpus.fit`, whose
model and data they share."""
from __future__ import annotations

import os

from harness.bench.corpus import Case, at_fault
from harness.bench.corpus.fit import BATCH, arrays, fitted, is_chief, own, repeated, task_index


# ---------------------------------------------------------------- callbacks

def _stop_on_local_loss(directory: str, broken: bool):
    import tensorflow as tf
    _, model = fitted(tf)
    # The held-out labels: worker 1's came with the wrong sign, so its
    # loss rises as the model learns while the others' falls.
    x, y = arrays(tf, 2 * BATCH, seed=40 + task_index())
    y = -y if task_index() == 1 else y

    class StopWhenWorse(tf.keras.callbacks.Callback):
        """Stops when this worker's own held-out loss gets worse."""
        best = float("inf")

        def on_epoch_end(self, epoch, logs=None):
            loss = float(tf.reduce_mean(tf.square(self.model(x) - y)))
            if loss > self.best:
                self.model.stop_training = True
            self.best = min(self.best, loss)

    if broken:
        model.fit(repeated(tf), epochs=4, steps_per_epoch=4, callbacks=[StopWhenWorse()],
                  verbose=0)
    else:
        # val_loss is fit's, aggregated across workers: every worker stops alike.
        held_out = own(tf, tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat())
        model.fit(repeated(tf), epochs=4, steps_per_epoch=4, validation_data=held_out,
                  validation_steps=2, verbose=0,
                  callbacks=[tf.keras.callbacks.EarlyStopping("val_loss", patience=0)])


def stop_on_local_loss(directory: str):
    """Worker 1 leaves fit after its loss rose; the others wait in the next
    epoch's first all-reduce (TensorFlow 2.21: a hang)."""
    _stop_on_local_loss(directory, broken=True)


def early_stopping_on_val_loss(directory: str):
    _stop_on_local_loss(directory, broken=False)


TARGET_LOSS = 1e6   # met after the first epoch


def _stop_at_target(directory: str, broken: bool):
    import tensorflow as tf

    class StopAtTarget(tf.keras.callbacks.Callback):
        """Stops once the loss reaches a target (fit's loss: the same on
        every worker); the broken script decides, and logs, on the chief."""

        def on_epoch_end(self, epoch, logs=None):
            if (is_chief() or not broken) and logs["loss"] < TARGET_LOSS:
                self.model.stop_training = True
            if is_chief():
                print(f"epoch {epoch}: loss {logs['loss']:.4f}")

    _, model = fitted(tf)
    model.fit(repeated(tf), epochs=3, steps_per_epoch=4, callbacks=[StopAtTarget()], verbose=0)


def stop_at_target_on_chief(directory: str):
    """The chief leaves fit after the first epoch; the workers wait in the
    next epoch's first all-reduce (TensorFlow 2.21: a hang)."""
    _stop_at_target(directory, broken=True)


def stop_at_target_everywhere(directory: str):
    _stop_at_target(directory, broken=False)


def _evaluate_in_callback(directory: str, broken: bool):
    import tensorflow as tf
    _, model = fitted(tf)
    held_out = tf.data.Dataset.from_tensor_slices(arrays(tf, 2 * BATCH, seed=50)).batch(BATCH)

    class Evaluate(tf.keras.callbacks.Callback):
        """Evaluates at each epoch's end and logs it on the chief."""

        def on_epoch_end(self, epoch, logs=None):
            if is_chief() or not broken:
                loss = self.model.evaluate(held_out, verbose=0)
                if is_chief():
                    print(f"epoch {epoch}: held-out loss {loss:.4f}")

    model.fit(repeated(tf), epochs=3, steps_per_epoch=4, callbacks=[Evaluate()], verbose=0)


def evaluate_on_chief(directory: str):
    """The chief's evaluation collectives meet the workers' next training
    step (TensorFlow 2.21: InternalError, a collective's type mismatch)."""
    _evaluate_in_callback(directory, broken=True)


def evaluate_everywhere(directory: str):
    _evaluate_in_callback(directory, broken=False)


def _metric_in_callback(directory: str, broken: bool):
    import tensorflow as tf

    class LogMetric(tf.keras.callbacks.Callback):
        """Logs the running mean absolute error every few batches."""

        def on_train_batch_end(self, batch, logs=None):
            if batch % 2 == 1 and (is_chief() or not broken):
                value = float(self.model.metrics[-1].result())
                if is_chief():
                    print(f"batch {batch}: mae {value:.4f}")

    _, model = fitted(tf, metrics=["mae"])
    model.fit(repeated(tf), epochs=2, steps_per_epoch=4, callbacks=[LogMetric()], verbose=0)


def metric_result_on_chief(directory: str):
    """Reading a sync-on-read metric outside fit's step all-reduces it, on the
    chief alone (TensorFlow 2.21: InvalidArgumentError, a shape mismatch)."""
    _metric_in_callback(directory, broken=True)


def metric_result_everywhere(directory: str):
    _metric_in_callback(directory, broken=False)


def _checkpoint_callback(directory: str, broken: bool):
    import tensorflow as tf
    _, model = fitted(tf, metrics=["mae"])
    checkpoint = tf.keras.callbacks.ModelCheckpoint(os.path.join(directory, "model.keras"))
    # The broken script gives the callback to the chief alone, the one that should write.
    callbacks = [checkpoint] if is_chief() or not broken else []
    model.fit(repeated(tf), epochs=3, steps_per_epoch=4, callbacks=callbacks, verbose=0)


def checkpoint_callback_on_chief(directory: str):
    """The chief's save reads the metrics' sync-on-read variables, an
    all-reduce the workers meet with their next step (TensorFlow 2.21:
    InvalidArgumentError, a shape mismatch)."""
    _checkpoint_callback(directory, broken=True)


def checkpoint_callback_everywhere(directory: str):
    _checkpoint_callback(directory, broken=False)



def _chief_callback(directory: str, broken: bool, make):
    import tensorflow as tf
    _, model = fitted(tf, metrics=["mae"])
    # The broken script gives the callback to the chief alone.
    callbacks = [make(tf, directory)] if is_chief() or not broken else []
    model.fit(repeated(tf), epochs=3, steps_per_epoch=4, callbacks=callbacks, verbose=0)


def _backup(tf, directory):
    return tf.keras.callbacks.BackupAndRestore(os.path.join(directory, "backup"))


def backup_on_chief(directory: str):
    """The chief's backup runs collectives the workers do not (TensorFlow 2.21:
    InternalError on the workers)."""
    _chief_callback(directory, True, _backup)


def backup_everywhere(directory: str):
    _chief_callback(directory, False, _backup)


CASES = (
    Case("callback_stops_on_local_loss", "callbacks",
         "DeepRec-AI/HybridBackend#88 (early stopping without agreement hangs the others)",
         "a callback stops fit when this worker's own held-out loss gets worse: worker 1's does.",
         stop_on_local_loss, early_stopping_on_val_loss,
         truth=at_fault(1), sizes=(2, 3, 4), keras="tf_keras", timeout=12),
    Case("callback_stops_on_chief_only", "callbacks",
         "DeepRec-AI/HybridBackend#88; the MWMS Keras tutorial (chief-only work)",
         "a callback that logs on the chief also decides there that the target loss is met.",
         stop_at_target_on_chief, stop_at_target_everywhere,
         truth=at_fault(0), sizes=(2, 3, 4), chief=True, keras="tf_keras", timeout=12),
    Case("callback_evaluates_on_chief_only", "callbacks",
         "tensorflow/tensorflow#36515 (how to run evaluation under MWMS)",
         "a callback runs model.evaluate at each epoch's end on the chief only.",
         evaluate_on_chief, evaluate_everywhere,
         truth=at_fault(0), sizes=(2, 3), chief=True, keras="tf_keras", timeout=12),
    Case("callback_reads_metric_on_chief_only", "callbacks",
         "tensorflow/tensorflow#33531 (a compiled metric under MWMS fit)",
         "a logging callback reads a compiled metric's result() on the chief only.",
         metric_result_on_chief, metric_result_everywhere,
         truth=at_fault(0), sizes=(2, 3, 4), keras="tf_keras", timeout=12),
    Case("callback_model_checkpoint_on_chief_only", "callbacks",
         "tensorflow/tensorflow#31070 (ModelCheckpoint under MWMS)",
         "ModelCheckpoint is given to the chief's fit only, the one that should write.",
         checkpoint_callback_on_chief, checkpoint_callback_everywhere,
         truth=at_fault(0), sizes=(2, 3), chief=True, keras="tf_keras", timeout=12),
    Case("callback_backup_and_restore_on_chief_only", "callbacks",
         "tensorflow/tensorflow#35705 (writing a checkpoint under MWMS fit)",
         "BackupAndRestore is given to the chief's fit only.",
         backup_on_chief, backup_everywhere,
         truth=at_fault(0), sizes=(2, 3), chief=True, keras="tf_keras", timeout=12),
)
