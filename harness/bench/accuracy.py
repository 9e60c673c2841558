"""``python -m harness.bench.accuracy``: how often the diagnosis names the
worker a fault was injected in.

Every fault kind of :mod:`harness.faults`, each alone, at the first, a
middle and the last worker (deduplicated: 2 workers have no middle) and,
for a step-keyed kind, at the first, a middle and the last step, on 2, 3
and 4 workers, on two jobs: the standard workload
(:func:`harness.workloads.variable_loop`, 6 steps) and the seed training
loop (:func:`harness.workloads.seed_training_loop`, 2 epochs of 3 steps).
One :class:`~harness.controller.cluster.Cluster` per size, reused (warm),
with a short hang timeout.

Each run is judged by :func:`harness.explore.attribution.attribute`:
*named* (the culprits are the faulted worker), *cannot tell* (ambiguous,
the faulted worker among the candidates), *wrong* (a culprit no fault
acted in, or none), *survived* (the job completed: nothing to name) or
*never acted* (the fault did not act, an error of this bench's plan: it
is printed with the run's report and never counted as a pass).  The
network kinds need a namespace per worker, and ``UnresolvedHost`` a hosts
file of the run's own (:mod:`harness.network.namespace`); where this
machine cannot make them they are left out, with the reason.

It prints each run as it goes, then a markdown table per kind, and writes
every run as JSON (``--json``).  ``--write-docs`` writes
``docs/accuracy.json`` and the table in ``docs/accuracy.md``, which
``tests/unit/test_accuracy_table.py`` makes again from that JSON
(``--redraw`` rewrites the table from it, running nothing).  Exits 1 when
a run was wrong, a fault never acted, or a straggler report named a
worker that was not slowed.

Runs of the kinds that slow a worker without stopping it (``Delay``,
``Latency``) that complete are also scored on their straggler report
(:func:`harness.diagnosis.stragglers.stragglers`): the column "straggler
named" counts those that name the slowed worker and no other.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from harness import faults as F
from harness.bench.common import dump, machine_info, machine_line, made_on
from harness.bench.common import region_of as region_between
from harness.bench.common import write_region as write_between
from harness.explore.attribution import Attribution

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "accuracy.md")
DOC_JSON = os.path.join(ROOT, "docs", "accuracy.json")
START, END = "<!-- accuracy:start -->", "<!-- accuracy:end -->"

ALL_WORKERS = (2, 3, 4)
TIMEOUT = 3.0       # the hang timeout: a hang is certain after it
GRACE = 1.0         # how long peers get once a worker has raised or died
# The table's columns, in order.
ATTRIBUTIONS = (Attribution.NAMED, Attribution.CANNOT_TELL, Attribution.WRONG,
                Attribution.SURVIVED, Attribution.NOT_ACTED)


@dataclasses.dataclass(frozen=True)
class Workload:
    """A job each fault is injected into: ``harness.workloads.<name>(*args)``."""
    name: str
    args: tuple
    steps: int          # the steps it runs: where a step-keyed fault can act


WORKLOADS = (Workload("variable_loop", (6,), 6),
             Workload("seed_training_loop", (2, 3), 6))


@dataclasses.dataclass(frozen=True)
class Kind:
    """One row of the table: a fault class with fixed parameters.

    ``make(worker, step)`` is the fault (``step`` None for a kind that is not
    step-keyed); ``needs`` names the probe of
    :mod:`harness.network.namespace` the kind needs (``"switch"``: a
    namespace per worker; ``"names"``: a hosts file of the run's own)."""
    label: str
    cls: type
    make: Callable[[int, Optional[int]], F.Fault]
    needs: Optional[str] = None

    @property
    def step_keyed(self) -> bool:
        return issubclass(self.cls, F.StepFault)


def _at_step(make: Callable[[int, int], F.Fault]) -> Callable[[int, Optional[int]], F.Fault]:
    def at_step(worker: int, step: Optional[int]) -> F.Fault:
        if step is None:
            raise ValueError("a step-keyed fault needs a step (plan() gives one)")
        return make(worker, step)
    return at_step


def _bad_config(kind: str) -> Callable[[int, Optional[int]], F.Fault]:
    return lambda w, s: F.BadTFConfig(w, kind)


def _kinds() -> Tuple[Kind, ...]:
    kinds = [Kind(cls.__name__, cls, _at_step(cls)) for cls in (F.SkipStep, F.ExtraCollective)]
    kinds += [Kind(f"Crash(how={how!r})", F.Crash, _at_step(functools.partial(F.Crash, how=how)))
              for how in F.CRASH_HOW]
    kinds += [
        Kind("RaiseError", F.RaiseError, _at_step(F.RaiseError)),
        Kind("Pause(seconds=None)", F.Pause, _at_step(lambda w, s: F.Pause(w, s, None))),
        # Killed when the run's grace is over, unless the job is done first.
        Kind("Preempt", F.Preempt, _at_step(F.Preempt)),
        # Killed as soon as the notice is given: a preemption that takes the worker.
        Kind("Preempt(grace=0)", F.Preempt, _at_step(lambda w, s: F.Preempt(w, s, grace=0))),
        Kind("Delay(seconds=0.5)", F.Delay, _at_step(lambda w, s: F.Delay(w, s, 0.5))),
        Kind("Partition(seconds=None)", F.Partition, _at_step(F.Partition), "switch"),
        # Too slow for the seed loop's gradients (about 31 kB a step) within
        # the hang timeout; the standard workload's scalars still pass.
        Kind("Bandwidth(kbps=32)", F.Bandwidth,
             _at_step(lambda w, s: F.Bandwidth(w, s, kbps=32)), "switch"),
        Kind("Latency(ms=50)", F.Latency, _at_step(lambda w, s: F.Latency(w, s, ms=50)), "switch"),
        Kind("ResetPeers(after=0)", F.ResetPeers, _at_step(F.ResetPeers), "switch"),
    ]
    kinds += [Kind(f"BadTFConfig(kind={k!r})", F.BadTFConfig, _bad_config(k))
              for k in F.BAD_CONFIG_KINDS]
    kinds += [
        Kind("UnresolvedHost(seconds=None)", F.UnresolvedHost,
             lambda w, s: F.UnresolvedHost(w), "names"),
        # A worker that never starts (a pod left Pending); one that starts
        # late within the timeout is waited for and survives, naming no one.
        Kind("StartDelay(seconds=None)", F.StartDelay, lambda w, s: F.StartDelay(w, None)),
    ]
    return tuple(kinds)


KINDS = _kinds()
# Fault classes of harness.faults this bench does not run, with the reason
# (tests/unit/test_accuracy_table.py checks that every other one has a row).
NOT_IN_BENCH: Dict[str, str] = {
    "DiskFull": "acts on a job's own files; the bench's workloads write none "
                "(tests/test_file_faults.py runs it with its twin)",
    "TornWrite": "acts on a job's own files; the bench's workloads write none "
                 "(tests/test_file_faults.py runs it with its twin)",
    "LostRename": "acts on a job's own files; the bench's workloads write none "
                  "(tests/test_file_faults.py runs it with its twin)",
    "SlowWrite": "acts on a job's own files; the bench's workloads write none "
                 "(tests/test_file_faults.py runs it with its twin)",
}


def positions(count: int) -> Tuple[int, ...]:
    """The first, a middle and the last of ``0..count-1``, deduplicated."""
    return tuple(sorted({0, (count - 1) // 2, count - 1}))


@dataclasses.dataclass(frozen=True)
class Planned:
    workers: int
    workload: Workload
    kind: Kind
    fault: F.Fault


def plan(workers: Sequence[int], workloads: Sequence[Workload], kinds: Sequence[Kind],
         quick: bool = False) -> List[Planned]:
    """Every run, in order: by cluster size, then workload, then kind.
    ``quick``: the last worker only, at the middle step."""
    runs = []
    for n in workers:
        for wl in workloads:
            for kind in kinds:
                who = (n - 1,) if quick else positions(n)
                when = ((((wl.steps - 1) // 2),) if quick else positions(wl.steps)) \
                    if kind.step_keyed else (None,)
                runs += [Planned(n, wl, kind, kind.make(w, s)) for w in who for s in when]
    return runs


def left_out(kinds: Sequence[Kind]) -> Dict[str, str]:
    """The kinds this machine cannot run, each with the reason."""
    from harness.network import namespace as netns
    probes = {"switch": netns.switch_available, "names": netns.names_available}
    out = {}
    for kind in kinds:
        if kind.needs:
            ok, why = probes[kind.needs]()
            if not ok:
                what = ("network faults need a network namespace per worker" if kind.needs ==
                        "switch" else "it needs a hosts file of the run's own")
                out[kind.label] = f"{what}, and this machine gives none: {why}"
    return out


# -- one run ---------------------------------------------------------------------------

# The kinds that slow a worker without stopping it: a run of theirs that
# completes is scored on its straggler report (the column "straggler named").
SLOWING = ("Delay", "Latency")


def slowed(result) -> List[int]:
    """The workers a completed run's straggler report names as making the
    others wait: the straggler's pattern, a worker late once, or the one
    end every slow link shares."""
    from harness.diagnosis.stragglers import stragglers
    report = stragglers(result.observation)
    return sorted(set(report.stragglers) | set(report.late_workers) | set(report.slow_link))


def straggler_answer(row: dict) -> Optional[str]:
    """A row's answer in the straggler column: ``named`` (the report names
    the slowed worker, and no other), ``wrong`` (it names another), ``none``
    (it names no one); None for a run the column does not score (not a
    slowing kind, or not completed)."""
    if row["kind"] not in SLOWING or row["outcome"] != "completed" or "slowed" not in row:
        return None
    named = set(row["slowed"])
    return "none" if not named else "named" if named == {row["worker"]} else "wrong"


def record(p: Planned, result, seconds: float, tensorflow: Optional[str]) -> dict:
    """One run's row of the JSON."""
    from harness.explore.attribution import attribute
    attribution = attribute(result, (p.fault,))
    row = {"kind": type(p.fault).__name__, "label": p.kind.label, "fault": repr(p.fault),
           "worker": p.fault.worker, "step": getattr(p.fault, "step", None),
           "workers": p.workers, "workload": p.workload.name,
           "outcome": str(result.outcome), "culprits": list(result.culprits),
           "ambiguous": bool(result.ambiguous), "attribution": attribution.value,
           "rule": getattr(result.verdict, "rule", None), "error": result.error,
           "seconds": round(seconds, 2), "tensorflow": tensorflow}
    if str(result.outcome) == "completed":
        row["slowed"] = slowed(result)
    if attribution in (Attribution.WRONG, Attribution.NOT_ACTED):
        row["report"] = result.report()
    return row


def run_all(planned: Sequence[Planned], timeout: float, grace: float,
            tensorflow: Optional[str], out=sys.stdout) -> List[dict]:
    """Run every planned fault, one warm cluster per size; print each as it goes."""
    from harness import workloads
    from harness.controller.cluster import Cluster
    from harness.settings import RunSettings
    rows: List[dict] = []
    clusters: Dict[int, Cluster] = {}
    for i, p in enumerate(planned, 1):
        cluster = clusters.get(p.workers)
        if cluster is None:
            clusters.clear()
            cluster = clusters[p.workers] = Cluster(
                RunSettings(workers=p.workers, timeout=timeout, grace=grace))
            # The cold start (the forkserver's TensorFlow), not counted.
            cluster.run(workloads.variable_loop, args=(2,)).assert_completed()
        fn = getattr(workloads, p.workload.name)
        t0 = time.monotonic()
        result = cluster.run(fn, args=p.workload.args, faults=(p.fault,))
        seconds = time.monotonic() - t0
        cluster.runs.clear()        # hundreds of results: keep none
        row = record(p, result, seconds, tensorflow)
        rows.append(row)
        loud = row["attribution"] in (Attribution.WRONG.value, Attribution.NOT_ACTED.value)
        late = straggler_answer(row)
        loud = loud or late == "wrong"
        said = f"; straggler {late} {tuple(row['slowed'])}" if late else ""
        print(f"[{i:4d}/{len(planned)}] {p.workers}w {p.workload.name:18s} {row['fault']:52s} "
              f"{row['outcome']:9s} {tuple(row['culprits'])!s:10s}"
              f"{' ambiguous' if row['ambiguous'] else ''} -> {row['attribution']}{said}"
              f"{'  <<<<<<<<' if loud else ''} ({seconds:.1f} s)", file=out, flush=True)
        if loud and "report" not in row:
            row["report"] = result.report()
        if loud:
            print(f"!!! {row['attribution'].upper()}: plan faults=[{row['fault']}] on "
                  f"{p.workers} workers, {p.workload.name}{p.workload.args}\n"
                  f"{row['report']}\n!!!", file=out, flush=True)
    return rows


# -- the table (pure) --------------------------------------------------------------------

def _order(labels: Sequence[str]) -> List[str]:
    known = [k.label for k in KINDS]
    return sorted(set(labels), key=lambda s: (known.index(s) if s in known else len(known), s))


def _counts(rows: Sequence[dict]) -> Dict[str, int]:
    return {a.value: sum(1 for r in rows if r["attribution"] == a.value) for a in ATTRIBUTIONS}


def straggler_cell(rows: Sequence[dict]) -> str:
    """``named of scored`` for the rows the straggler column scores (and
    how many named another worker), or a dash where it scores none."""
    answers = [a for a in map(straggler_answer, rows) if a is not None]
    if not answers:
        return "–"
    wrong = answers.count("wrong")
    return f"{answers.count('named')} of {len(answers)}" + (f", {wrong} wrong" if wrong else "")


def _cells(rows: Sequence[dict]) -> List[str]:
    c = _counts(rows)
    failed = c["named"] + c["cannot tell"] + c["wrong"]
    share = f"{100 * c['named'] / failed:.0f} %" if failed else "–"
    return [str(len(rows))] + [str(c[a.value]) for a in ATTRIBUTIONS] + [share,
                                                                          straggler_cell(rows)]


HEAD = ("| {} | runs | named exactly | cannot tell (truth among the candidates) | wrong "
        "| survived | never acted | named, of the runs that failed "
        "| straggler named, of the slowed runs that completed |")
RULE = "|---|---:|---:|---:|---:|---:|---:|---:|---:|"


def table(rows: Sequence[dict]) -> str:
    """The markdown table: a row per kind (its ``label``), then all together."""
    lines = [HEAD.format("fault"), RULE]
    for label in _order([r["label"] for r in rows]):
        mine = [r for r in rows if r["label"] == label]
        lines.append(f"| `{label}` | " + " | ".join(_cells(mine)) + " |")
    lines.append("| **all** | " + " | ".join(_cells(rows)) + " |")
    return "\n".join(lines)


def size_table(rows: Sequence[dict]) -> str:
    """The same columns by job and cluster size."""
    lines = [HEAD.format("job, workers"), RULE]
    names = [w.name for w in WORKLOADS]
    keys = sorted({(r["workload"], r["workers"]) for r in rows},
                  key=lambda k: (names.index(k[0]) if k[0] in names else len(names), k))
    for wl, n in keys:
        mine = [r for r in rows if (r["workload"], r["workers"]) == (wl, n)]
        lines.append(f"| `{wl}`, {n} | " + " | ".join(_cells(mine)) + " |")
    return "\n".join(lines)


def markdown(doc: dict) -> str:
    """The region of docs/accuracy.md, made from the JSON document alone."""
    rows = doc["runs"]
    m = doc["machine"]
    s = doc["settings"]
    lines = [f"Made by `{doc['command']}` on {doc['date']}: {len(rows)} runs in "
             f"{made_on(doc)}, the workers on CPU; Python {m['python']}, TensorFlow "
             f"{m['tensorflow']}; hang timeout "
             f"{s['timeout']:g} s, grace {s['grace']:g} s.", "",
             table(rows), "", "By job and cluster size:", "", size_table(rows)]
    if doc.get("left_out"):
        lines += ["", "Left out:", ""]
        lines += [f"- `{label}`: {why}" for label, why in sorted(doc["left_out"].items())]
    bad = [r for r in rows if r["attribution"] in (Attribution.WRONG.value,
                                                   Attribution.NOT_ACTED.value)]
    late = [r for r in rows if straggler_answer(r) in ("wrong", "none")]
    if late:
        lines += ["", "Slowed runs that completed and whose straggler report did not name "
                  "the slowed worker:", ""]
        lines += [f"- `{r['fault']}`, `{r['workload']}`, {r['workers']} workers: "
                  + (f"named {', '.join(map(str, r['slowed']))}" if r["slowed"] else "named none")
                  for r in late]
    if bad:
        lines += ["", "Wrong, or never acted (each run's report is in the JSON):", ""]
        for r in bad:
            named = (f"worker{'s' if len(r['culprits']) > 1 else ''} "
                     f"{','.join(map(str, r['culprits']))} named"
                     + (" as candidates" if r["ambiguous"] else "")) if r["culprits"] \
                else "no worker named"
            lines.append(f"- `{r['fault']}`, `{r['workload']}`, {r['workers']} workers: "
                         f"{r['attribution']}: {r['outcome']}, {named}"
                         + (f" (rule `{r['rule']}`)" if r.get("rule") else ""))
    cannot = [r for r in rows if r["attribution"] == Attribution.CANNOT_TELL.value]
    if cannot:
        lines += ["", "Where it could not tell:", ""]
        groups: Dict[tuple, List[dict]] = {}
        for r in cannot:
            groups.setdefault((r["label"], r["workload"], r["workers"]), []).append(r)
        labels = _order([r["label"] for r in cannot])
        names = [w.name for w in WORKLOADS]
        for (label, wl, n), rs in sorted(groups.items(), key=lambda kv: (
                labels.index(kv[0][0]), names.index(kv[0][1]) if kv[0][1] in names else
                len(names), kv[0][1], kv[0][2])):
            sizes = sorted({len(r["culprits"]) for r in rs})
            lines.append(f"- `{label}`, `{wl}`, {n} workers: {len(rs)} "
                         f"run{'s' if len(rs) > 1 else ''}, "
                         f"{' or '.join(map(str, sizes))} of {n} workers named as candidates")
    return "\n".join(lines)


def write_region(path: str, region: str) -> bool:
    """Put ``region`` between the accuracy table's markers of ``path``."""
    return write_between(path, region, START, END)


def region_of(text: str) -> str:
    """What the page holds between the accuracy table's markers."""
    return region_between(text, START, END)


# -- the command -------------------------------------------------------------------------

def _select(kinds: Sequence[Kind], names: Optional[str]) -> List[Kind]:
    if not names:
        return list(kinds)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if not any(n in (k.cls.__name__, k.label) for k in kinds)]
    if unknown:
        raise SystemExit(f"no kind {', '.join(unknown)}; kinds: "
                         f"{', '.join(dict.fromkeys(k.cls.__name__ for k in kinds))}")
    return [k for k in kinds if k.cls.__name__ in wanted or k.label in wanted]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.bench.accuracy",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default=",".join(map(str, ALL_WORKERS)),
                    help="cluster sizes (2,3,4)")
    ap.add_argument("--kinds", default=None,
                    help="fault classes or row labels, comma-separated (all)")
    ap.add_argument("--workloads", default=None,
                    help=f"jobs, comma-separated ({','.join(w.name for w in WORKLOADS)})")
    ap.add_argument("--quick", action="store_true",
                    help="the last worker at the middle step only (about a sixth of the runs)")
    ap.add_argument("--timeout", type=float, default=TIMEOUT, help=f"hang timeout ({TIMEOUT:g} s)")
    ap.add_argument("--grace", type=float, default=GRACE, help=f"grace ({GRACE:g} s)")
    ap.add_argument("--json", default="accuracy.json", help="where to write every run")
    ap.add_argument("--write-docs", action="store_true",
                    help="write docs/accuracy.json and docs/accuracy.md's table "
                         "(the full bench only)")
    ap.add_argument("--redraw", action="store_true",
                    help="run nothing: make docs/accuracy.md's table again from "
                         "docs/accuracy.json (after a change to the table's code)")
    args = ap.parse_args(argv)
    if args.redraw:
        with open(DOC_JSON, encoding="utf-8") as f:
            changed = write_region(DOC, markdown(json.load(f)))
        print(f"{os.path.relpath(DOC, ROOT)} {'redrawn' if changed else 'unchanged'}")
        return 0
    filtered = bool(args.quick or args.kinds or args.workloads
                    or args.workers != ",".join(map(str, ALL_WORKERS)))
    if args.write_docs and filtered:
        ap.error("--write-docs publishes the full bench: no --quick, --kinds, --workers "
                 "or --workloads")
    workers = [int(w) for w in args.workers.split(",")]
    kinds = _select(KINDS, args.kinds)
    names = args.workloads.split(",") if args.workloads else [w.name for w in WORKLOADS]
    unknown = [n for n in names if n not in [w.name for w in WORKLOADS]]
    if unknown:
        ap.error(f"no workload {', '.join(unknown)}")
    jobs = [w for w in WORKLOADS if w.name in names]

    out_of_reach = left_out(kinds)
    planned = plan(workers, jobs, [k for k in kinds if k.label not in out_of_reach], args.quick)
    machine = machine_info()
    print(machine_line(machine), flush=True)
    for label, why in out_of_reach.items():
        print(f"left out {label}: {why}", flush=True)
    print(f"{len(planned)} runs planned", flush=True)
    t0 = time.monotonic()
    rows = run_all(planned, args.timeout, args.grace, machine["tensorflow"])
    wall = time.monotonic() - t0
    machine["load_avg_end"] = list(os.getloadavg())
    command = "python -m harness.bench.accuracy" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]) if a != "--write-docs")
    doc = {"command": command.strip(), "date": datetime.date.today().isoformat(),
           "machine": machine, "wall_seconds": round(wall, 1),
           "settings": {"timeout": args.timeout, "grace": args.grace, "workers": workers,
                        "workloads": {w.name: {"args": list(w.args), "steps": w.steps}
                                      for w in jobs},
                        "kinds": [k.label for k in kinds], "quick": args.quick},
           "left_out": out_of_reach, "runs": rows}
    region = markdown(doc)
    print()
    print(region)
    if args.write_docs:
        with open(DOC_JSON, "w", encoding="utf-8") as f:
            f.write(dump(doc))
        write_region(DOC, region)
        print(f"\nwrote {os.path.relpath(DOC_JSON, ROOT)} and {os.path.relpath(DOC, ROOT)}")
    else:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(dump(doc))
        print(f"\nwrote {args.json}")
    bad = [r for r in rows if r["attribution"] in (Attribution.WRONG.value,
                                                   Attribution.NOT_ACTED.value)
           or straggler_answer(r) == "wrong"]
    for r in bad:
        print(f"\n!!! {r['attribution'].upper()}: faults=[{r['fault']}], {r['workers']} workers, "
              f"{r['workload']}\n{r['report']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
