"""Worker side: which checkpoint ``fn`` restored, told to the parent; and
what the run's directory holds, for a run that reports where it changes.

Every way a job restores a checkpoint in TensorFlow 2 goes through one
method, ``TrackableSaver.restore``: ``tf.train.Checkpoint.restore`` and
``read``, ``CheckpointManager.restore_or_initialize``, Keras's
``BackupAndRestore`` (through the manager) and ``load_weights`` of a
TensorFlow checkpoint.  Wrapping it, each worker reports the path it read
(None: ``restore(None)``, nothing), with the step it had reached, so the
diagnosis can tell the past each worker resumed from without the user's
help: a worker that reports none before its first step restored nothing.
The patch lives only in this process.
"""
from __future__ import annotations

import os
from typing import Dict

from harness.core import protocol

# A job that restores in a loop reports its first restores only: the past
# it resumed from is told by those before its first step.
MOST = 16


def state_of(run_dir: str) -> Dict[str, tuple]:
    """Each file under ``run_dir`` (relative name) with its size and
    modification time: a change in either is a write."""
    out: Dict[str, tuple] = {}
    for root, _dirs, files in os.walk(run_dir):
        for name in files:
            path = os.path.join(root, name)
            try:
                st = os.stat(path)
            except OSError:   # removed while walking: a rename's old name
                continue
            out[os.path.relpath(path, run_dir)] = (st.st_size, st.st_mtime_ns)
    return out


def checkpoint_path(save_path) -> object:
    """The path as the job gave it, as text (None stays None)."""
    if save_path is None:
        return None
    try:
        return os.fspath(save_path)
    except TypeError:
        return str(save_path)


def install_restore_hook(ctx) -> None:
    """Report each outermost restore of a checkpoint as a
    :data:`~harness.core.protocol.RESTORED` event."""
    from tensorflow.python.checkpoint import checkpoint

    cls = checkpoint.TrackableSaver
    original = cls.restore
    if getattr(original, "_mwms_hooked", False):
        return
    state = {"depth": 0, "sent": 0}

    def restore(self, save_path, *args, **kwargs):
        if state["depth"] == 0 and state["sent"] < MOST:
            state["sent"] += 1
            ctx.send(protocol.RESTORED, step=ctx.current_step,
                     data={"path": checkpoint_path(save_path)})
        state["depth"] += 1
        try:
            return original(self, save_path, *args, **kwargs)
        finally:
            state["depth"] -= 1

    restore._mwms_hooked = True   # type: ignore[attr-defined]  # read back above
    cls.restore = restore


def watch_restores(ctx) -> None:
    """:func:`install_restore_hook`, never failing the run for it.  A
    TensorFlow whose internals moved leaves every worker without restore
    events: the same past on each, which changes no verdict."""
    try:
        install_restore_hook(ctx)
    except Exception:
        pass
