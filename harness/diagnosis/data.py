"""The length of the dataset each worker distributed (a ``dataset`` event,
:mod:`harness.worker.datasets`): workers whose datasets differ in length
run different numbers of steps, the way an uneven batch or file list
breaks a job.  It explains a verdict; it decides none, since which length
is the wrong one is the job's to say."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from harness.core import protocol
from harness.diagnosis.observations import WorkerObservation
from harness.diagnosis.words import names


def length(w: WorkerObservation) -> Optional[int]:
    """The cardinality of the first dataset ``w`` distributed; None when it
    distributed none or TensorFlow could not say (-2)."""
    for e in w.events:
        if e.kind == protocol.DATASET and isinstance(e.data, dict):
            n = e.data.get("cardinality")
            return n if isinstance(n, int) and n != -2 else None
    return None


def _said(n: int) -> str:
    return "repeated for ever" if n == -1 else f"{n} element{'s' if n != 1 else ''}"


def data_lines(ws: Sequence[WorkerObservation]) -> List[str]:
    """A line when the workers' first datasets differ in length, grouping
    the workers by length."""
    groups: Dict[int, List[int]] = {}
    for w in ws:
        n = length(w)
        if n is not None:
            groups.setdefault(n, []).append(w.index)
    if len(groups) < 2:
        return []
    told = "; ".join(f"{names(indexes)}: {_said(n)}"
                     for n, indexes in sorted(groups.items(), key=lambda kv: kv[1][0]))
    return [f"data: the workers distributed datasets of different lengths ({told}), so they "
            f"run different numbers of steps"]
