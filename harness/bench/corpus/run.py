"""Running the corpus's cases: a case, broken or fixed, on one cluster, and
its row of the JSON document (:mod:`harness.bench.corpus.table` makes the
tables from those rows)."""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

from harness.bench.corpus import ERRORS, Answer, Case, judge


def _env(case: Case, minor) -> dict:
    from harness.core import versions
    return versions.keras2_env(minor) if case.keras == "tf_keras" else {}


def _shape(case: Case, size: int):
    from harness.core.tfconfig import ClusterShape
    return ClusterShape(chief=1, worker=size - 1) if case.chief else ClusterShape(worker=size)


def record(case: Case, size: int, variant: str, result, seconds: float) -> dict:
    """One run's row of the JSON."""
    truth = case.truth_at(size)
    answer = judge(variant, str(result.outcome) == "completed", result.culprits,
                   bool(result.ambiguous), truth)
    row = {"case": case.name, "family": case.family, "workers": size, "chief": case.chief,
           "variant": variant, "truth": str(truth), "truth_tasks": sorted(truth.tasks),
           "outcome": str(result.outcome), "culprits": list(result.culprits),
           "ambiguous": bool(result.ambiguous), "answer": answer.value,
           "rule": getattr(result.verdict, "rule", None),
           "headline": result.diagnosis.splitlines()[0] if result.diagnosis else "",
           "seconds": round(seconds, 2)}
    if answer in ERRORS:
        row["report"] = result.report()
    return row


def cluster_for(case: Case, size: int):
    """A cluster of ``size`` tasks shaped as ``case`` needs."""
    from harness.controller.cluster import Cluster
    return Cluster(cluster=_shape(case, size).spec(), workers=size)


def run_one(cluster, case: Case, size: int, variant: str, minor) -> dict:
    """``case``'s ``variant`` ("broken" or "fixed") once on ``cluster``, in a
    directory of its own removed after; its row."""
    directory = tempfile.mkdtemp(prefix="mwms-corpus-")
    try:
        t0 = time.monotonic()
        result = cluster.run(getattr(case, variant), args=(directory,), kwargs=dict(case.kwargs),
                             env=_env(case, minor), timeout=case.timeout, grace=case.grace,
                             **case.run)
        seconds = time.monotonic() - t0
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    cluster.runs.clear()
    return record(case, size, variant, result, seconds)


def run_all(chosen: Sequence[Case], sizes: Optional[Sequence[int]], out=sys.stdout) -> List[dict]:
    """Every case on every size it names (within ``sizes``), broken then fixed."""
    from harness.core import versions
    minor = versions.installed_minor()
    planned = [(c, n, v) for c in chosen for n in c.sizes if not sizes or n in sizes
               for v in ("broken", "fixed")]
    clusters: Dict[Tuple[int, bool], object] = {}
    rows: List[dict] = []
    for i, (case, size, variant) in enumerate(planned, 1):
        key = (size, case.chief)
        if key not in clusters:
            clusters.clear()
            clusters[key] = cluster_for(case, size)
        row = run_one(clusters[key], case, size, variant, minor)
        rows.append(row)
        loud = Answer(row["answer"]) in ERRORS
        print(f"[{i:3d}/{len(planned)}] {size}{'c' if case.chief else 'w'} {case.name:44s} "
              f"{variant:6s} {row['outcome']:9s} {tuple(row['culprits'])!s:10s}"
              f"{' ambiguous' if row['ambiguous'] else ''} -> {row['answer']}"
              f"{'  <<<<<<<<' if loud else ''} ({row['seconds']:.1f} s)", file=out, flush=True)
        if loud:
            print(f"!!! {row['answer'].upper()}: {case.name} ({variant}) on {size} tasks, "
                  f"truth {row['truth']}\n{row['report']}\n!!!", file=out, flush=True)
    return rows
