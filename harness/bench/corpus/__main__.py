"""``python -m harness.bench.corpus``: the corpus of users' bugs
(:mod:`harness.bench.corpus`), each broken job and its fixed twin on every
cluster its case names, each verdict set against the truth.

It prints each run as it goes, then the tables; ``--write-docs`` writes
``docs/corpus.json`` and the corpus section of ``docs/accuracy.md``, which
``tests/unit/test_corpus_table.py`` makes again from that JSON
(``--redraw`` rewrites it from the JSON, running nothing).  Exits 1 when a
run was wrong, a broken job completed or a fixed twin did not.
"""
from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

from harness.bench import accuracy
from harness.bench.common import machine_info, machine_line
from harness.bench.corpus import ERRORS, Answer, Case, cases, judge
from harness.bench.corpus import table as corpus_table

ROOT = accuracy.ROOT
DOC_JSON = os.path.join(ROOT, "docs", "corpus.json")
START, END = corpus_table.START, corpus_table.END


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


def run_all(chosen: Sequence[Case], sizes: Optional[Sequence[int]], out=sys.stdout) -> List[dict]:
    """Every case on every size it names (within ``sizes``), broken then fixed."""
    from harness.controller.cluster import Cluster
    from harness.core import versions
    minor = versions.installed_minor()
    planned = [(c, n, v) for c in chosen for n in c.sizes if not sizes or n in sizes
               for v in ("broken", "fixed")]
    clusters: Dict[Tuple[int, bool], Cluster] = {}
    rows: List[dict] = []
    for i, (case, size, variant) in enumerate(planned, 1):
        key = (size, case.chief)
        if key not in clusters:
            clusters.clear()
            clusters[key] = Cluster(cluster=_shape(case, size).spec(), workers=size)
        directory = tempfile.mkdtemp(prefix="mwms-corpus-")
        try:
            t0 = time.monotonic()
            result = clusters[key].run(
                getattr(case, variant), args=(directory,), kwargs=dict(case.kwargs),
                env=_env(case, minor), timeout=case.timeout, grace=case.grace, **case.run)
            seconds = time.monotonic() - t0
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        clusters[key].runs.clear()
        row = record(case, size, variant, result, seconds)
        rows.append(row)
        loud = Answer(row["answer"]) in ERRORS
        print(f"[{i:3d}/{len(planned)}] {size}{'c' if case.chief else 'w'} {case.name:44s} "
              f"{variant:6s} {row['outcome']:9s} {tuple(row['culprits'])!s:10s}"
              f"{' ambiguous' if row['ambiguous'] else ''} -> {row['answer']}"
              f"{'  <<<<<<<<' if loud else ''} ({seconds:.1f} s)", file=out, flush=True)
        if loud:
            print(f"!!! {row['answer'].upper()}: {case.name} ({variant}) on {size} tasks, "
                  f"truth {row['truth']}\n{row['report']}\n!!!", file=out, flush=True)
    return rows


def _select(names: Optional[str]) -> List[Case]:
    every = cases()
    if not names:
        return list(every)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if not any(n in (c.name, c.family) for c in every)]
    if unknown:
        raise SystemExit(f"no case or family {', '.join(unknown)}; cases: "
                         f"{', '.join(c.name for c in every)}")
    return [c for c in every if c.name in wanted or c.family in wanted]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.bench.corpus", description=__doc__)
    p.add_argument("--cases", help="case names or families, comma-separated (default: all)")
    p.add_argument("--workers", help="cluster sizes, comma-separated (default: each case's)")
    p.add_argument("--json", help="write every run as JSON here")
    p.add_argument("--write-docs", action="store_true",
                   help="write docs/corpus.json and the corpus section of docs/accuracy.md")
    p.add_argument("--redraw", action="store_true",
                   help="rewrite docs/accuracy.md's corpus section from docs/corpus.json")
    args = p.parse_args(argv)
    if args.redraw:
        doc = corpus_table.load(DOC_JSON)
        accuracy.write_region(accuracy.DOC, corpus_table.markdown(doc), START, END)
        return 0
    chosen = _select(args.cases)
    sizes = [int(s) for s in args.workers.split(",")] if args.workers else None
    machine = machine_info()
    print(machine_line(machine), flush=True)
    t0 = time.monotonic()
    rows = run_all(chosen, sizes)
    machine["load_avg_end"] = list(os.getloadavg())
    doc = {"command": "python -m harness.bench.corpus" + (" " + " ".join(argv or sys.argv[1:])
                                                          if (argv or sys.argv[1:]) else ""),
           "date": datetime.date.today().isoformat(), "machine": machine,
           "wall_seconds": round(time.monotonic() - t0, 1),
           "cases": [corpus_table.case_entry(c) for c in chosen], "runs": rows}
    print(corpus_table.markdown(doc))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(accuracy.dump(doc))
    if args.write_docs:
        with open(DOC_JSON, "w", encoding="utf-8") as f:
            f.write(accuracy.dump(doc))
        accuracy.write_region(accuracy.DOC, corpus_table.markdown(doc), START, END)
    return 1 if any(Answer(r["answer"]) in ERRORS for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
