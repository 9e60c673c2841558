"""Worker side: progress and faults through a Keras ``fit``."""
from __future__ import annotations

from typing import Any

from harness.core import protocol
from harness.worker.actions import replaces_step


def make_keras_callback(ctx):
    """A Keras callback whose batch boundaries are this worker's steps, and
    which tells the parent where each epoch after the first begins."""
    if any(replaces_step(f) for f in ctx.faults):
        raise ValueError("SkipStep cannot act through keras_callback(): model.fit has no "
                         "way to skip a batch; use a custom loop with context().steps()")
    ctx.explicit_steps = True
    import tensorflow as tf
    base: Any = tf.keras.callbacks.Callback  # tf_keras when TF_USE_LEGACY_KERAS=1

    class MWMSProgress(base):
        """Reports each training batch to the harness as a step."""

        def on_train_batch_begin(self, batch, logs=None):
            ctx.step_boundary(ctx.keras_batches)
            ctx.keras_batches += 1

        def on_epoch_begin(self, epoch, logs=None):
            # Where callbacks act (a checkpoint, a backup, a schedule): the
            # search tries faults around it first.
            if ctx.keras_batches:
                ctx.send(protocol.EPOCH, step=ctx.keras_batches, data=int(epoch))

        def on_train_end(self, logs=None):
            ctx.send(protocol.STEPS_DONE, step=ctx.keras_batches)

    return MWMSProgress()
