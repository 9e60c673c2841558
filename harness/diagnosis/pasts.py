"""The past each worker resumed from: the checkpoint its process restored.

A worker reports each checkpoint restore it asks of TensorFlow (a
``restored`` event, :mod:`harness.worker.checkpoints`); the first that
names a path is where its process resumed from, and a process that named
none restored nothing.  Workers that resumed from different checkpoints
did not do the same work: which of them agree is no evidence of who is
right, so the stage ``different_pasts`` (:mod:`.stages`) turns a
confident verdict into "cannot tell", naming every side.

Checkpoints are compared by name (``ckpt-3``), not by directory: workers
that each read their own copy of the same save resumed from the same past.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence, Tuple

from harness.core import protocol
from harness.diagnosis.observations import WorkerObservation

Sides = Tuple[Tuple[Optional[str], Tuple[int, ...]], ...]


def restored(w: WorkerObservation) -> Optional[str]:
    """The first checkpoint path ``w``'s process restored; None: none."""
    for e in w.events:
        if e.kind == protocol.RESTORED and isinstance(e.data, dict) and e.data.get("path"):
            return str(e.data["path"])
    return None


def checkpoint_name(path: Optional[str]) -> Optional[str]:
    """``ckpt-3`` for ``/dir/ckpt-3``; None stays None."""
    if path is None:
        return None
    return os.path.basename(os.path.normpath(path)) or path


def restored_any(ws: Sequence[WorkerObservation]) -> bool:
    return any(restored(w) is not None for w in ws)


def sides(ws: Sequence[WorkerObservation]) -> Sides:
    """The workers grouped by the checkpoint each restored (None: nothing),
    the checkpoints named first in the order of their first worker, then
    nothing; one side when they all resumed alike."""
    groups: Dict[Optional[str], List[int]] = {}
    for w in ws:
        groups.setdefault(checkpoint_name(restored(w)), []).append(w.index)
    ordered = sorted(groups.items(), key=lambda kv: (kv[0] is None, kv[1][0]))
    return tuple((name, tuple(indexes)) for name, indexes in ordered)


def differ(ws: Sequence[WorkerObservation]) -> bool:
    """Whether the workers resumed from different pasts: one restored a
    checkpoint the others did not."""
    return restored_any(ws) and len(sides(ws)) > 1
