"""``python -m harness.bench.corpus``, the program: the corpus of users' bugs
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
import sys
import time
from typing import List, Optional

from harness.bench.common import dump, machine_info, machine_line, write_region
from harness.bench.corpus import ERRORS, Answer, Case, cases
from harness.bench.corpus import table as corpus_table
from harness.bench.corpus.run import run_all

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
DOC = os.path.join(ROOT, "docs", "accuracy.md")
DOC_JSON = os.path.join(ROOT, "docs", "corpus.json")
START, END = corpus_table.START, corpus_table.END


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
        write_region(DOC, corpus_table.markdown(doc), START, END)
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
            f.write(dump(doc))
    if args.write_docs:
        with open(DOC_JSON, "w", encoding="utf-8") as f:
            f.write(dump(doc))
        write_region(DOC, corpus_table.markdown(doc), START, END)
    return 1 if any(Answer(r["answer"]) in ERRORS for r in rows) else 0
