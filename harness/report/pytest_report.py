"""What pytest shows of the runs a test made: pure functions the plugin calls.

* :func:`junit_properties`: the ``<property>`` elements of a test that ran a
  cluster (its last run's verdict), for ``item.user_properties``: JUnit XML
  gets them, under xdist too, and CI dashboards can chart hangs by culprit.
* :func:`report_sections`: each run that did not complete, as report
  sections with their own headers: its diagnosis and timeline files, each
  unfinished worker's log tail, each dumped stack.  They stay out of the
  AssertionError, which says the diagnosis first and nothing else.
* :func:`run_summary` and :func:`summary_lines`: one plain dict per run,
  which travels on the test report (``report.mwms_runs``) from an xdist
  worker to the controller, and the session summary made from them.

No pytest and no TensorFlow here: the plugin glues these to its hooks.
"""
from __future__ import annotations

import collections
import os
import re
from typing import Dict, List, Optional, Sequence, Tuple

from harness import validators
from harness.diagnosis.observations import OUTCOMES, Outcome

SLOWEST_SHOWN = 5
# --mwms-report: which runs get a timeline in --mwms-report-dir.
REPORT_MODES = validators.REPORT_MODES


def junit_properties(runs: Sequence) -> List[Tuple[str, str]]:
    """``(name, value)`` pairs for the test's last run (``mwms_runs`` counts them all)."""
    last = runs[-1]
    step = last.step
    return [("mwms_outcome", str(last.outcome)),
            ("mwms_culprits", ",".join(map(str, last.culprits))),
            ("mwms_step", "" if step is None else str(step)),
            ("mwms_ambiguous", "true" if last.ambiguous else "false"),
            ("mwms_rule", last.verdict.rule),
            ("mwms_duration", f"{last.duration:.2f}"),
            ("mwms_workers", str(len(last.workers))),
            ("mwms_runs", str(len(runs)))]


def wants_timeline(run, mode: str) -> bool:
    """Whether ``--mwms-report=mode`` writes a timeline for ``run``."""
    return mode == "all" or run.outcome != Outcome.COMPLETED


def timeline_stem(directory: str, nodeid: str, number: int) -> str:
    """Where run ``number`` (from 1) of test ``nodeid`` writes its timeline:
    the node id made a file name, so each test's files sort together."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", nodeid).strip("_")[:150]
    return os.path.join(directory, f"{safe}-run{number}")


def report_sections(runs: Sequence, timelines: Dict[int, Tuple[str, ...]],
                    test_failed: bool = False) -> List[Tuple[str, str]]:
    """``(title, content)`` sections for the runs that did not complete, or
    that have a timeline (``timelines`` maps a run's number, from 1, to its
    files).  When the test failed, its last run's diagnosis is already the
    head of the failure, so that run's section only names the files."""
    out = []
    for number, run in enumerate(runs, 1):
        files = timelines.get(number, ())
        if run.outcome == Outcome.COMPLETED and not files:
            continue
        tag = f"mwms run {number}" if len(runs) > 1 else "mwms run"
        said = test_failed and number == len(runs)
        text = "\n".join(([] if said else [run.diagnosis]) + [f"timeline: {p}" for p in files])
        if text:
            out.append((f"{tag}: {run.outcome}", text))
        if run.outcome == Outcome.COMPLETED:
            continue
        for w in run.workers:
            if w.returned and not w.died_at_exit:
                continue
            out.append((f"{tag}: worker {w.index} log tail (exit code {w.exit_code})",
                        w.log_tail() or "(empty log)"))
            if w.stack.strip():
                out.append((f"{tag}: worker {w.index} stack", w.stack.rstrip()))
    return out


def run_summary(run, nodeid: str) -> dict:
    """One run as plain data for the session summary (it must survive
    xdist's JSON transport)."""
    return {"nodeid": nodeid, "outcome": str(run.outcome), "culprits": list(run.culprits),
            "ambiguous": bool(run.ambiguous), "duration": round(float(run.duration), 3),
            "workers": len(run.workers), "attempts": max(1, len(run.attempts)),
            "phases": {k: round(float(v), 4) for k, v in run.phases.items()}}


# The columns of the per-file table (``--durations``): which phases each
# adds up (harness.controller.phases).
PHASE_GROUPS = (
    ("start-up", ("request", "setup", "launch", "start", "strategy")),
    ("steps", ("steps",)),
    ("TF detects", ("wait: TensorFlow's failure detection",)),
    ("harness waits", ("wait: hang timeout", "wait: grace", "wait: deadlock proof")),
    ("finish", ("wait: finish",)),
    ("end", ("stacks", "links", "teardown", "diagnosis", "cleanup")),
)


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def phase_table(runs: Sequence[dict], test_seconds: Dict[str, float]) -> List[str]:
    """Where each test file's time went, in seconds: its tests' time
    (``test_seconds``, by file), its runs' phases grouped as
    :data:`PHASE_GROUPS`, and the rest of its tests' time outside runs."""
    by_file: Dict[str, List[dict]] = collections.defaultdict(list)
    for r in runs:
        by_file[file_of(r["nodeid"])].append(r)
    names = [g for g, _ in PHASE_GROUPS]
    head = ["file", "tests s", "runs", "restarts"] + names + ["outside runs"]
    rows = []
    for path in sorted(set(by_file) | set(test_seconds), key=lambda p: -test_seconds.get(p, 0.0)):
        mine = by_file.get(path, [])
        groups = [sum(r.get("phases", {}).get(p, 0.0) for r in mine for p in members)
                  for _, members in PHASE_GROUPS]
        total = test_seconds.get(path, 0.0)
        in_runs = sum(v for r in mine for v in r.get("phases", {}).values())
        rows.append([path, f"{total:.1f}", str(len(mine)),
                     str(sum(r.get("attempts", 1) - 1 for r in mine))]
                    + [f"{g:.1f}" for g in groups] + [f"{max(0.0, total - in_runs):.1f}"])
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
    line = lambda cells: "  ".join(   # noqa: E731
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return ["where the time went, by file (seconds; --durations):", line(head)] + \
        [line(r) for r in rows]


def summary_lines(runs: Sequence[dict], report_dir: Optional[str] = None,
                  slowest: int = SLOWEST_SHOWN,
                  test_seconds: Optional[Dict[str, float]] = None) -> List[str]:
    """The session summary's lines: runs by outcome, verdicts that named one
    culprit and that could not tell, the slowest runs, the report directory;
    with ``test_seconds`` (the tests' time by file), :func:`phase_table`."""
    if not runs:
        return []
    by_outcome = collections.Counter(r["outcome"] for r in runs)
    order = OUTCOMES
    counts = ", ".join(f"{by_outcome.get(o, 0)} {o}" for o in order
                       if by_outcome.get(o) or o != Outcome.CRASHED_AT_EXIT)   # rare: when seen
    blamed = [r for r in runs if r["outcome"] != Outcome.COMPLETED]
    one = sum(1 for r in blamed if len(r["culprits"]) == 1 and not r["ambiguous"])
    unsure = sum(1 for r in blamed if r["ambiguous"])
    lines = [f"{len(runs)} cluster run{'s' if len(runs) != 1 else ''}: {counts}",
             f"of the {len(blamed)} that did not complete: {one} named exactly one culprit, "
             f"{unsure} could not tell (named every candidate)"]
    top = sorted(runs, key=lambda r: -r["duration"])[:slowest]
    lines.append("slowest: " + "; ".join(
        f"{r['duration']:.1f}s {r['nodeid']} ({r['outcome']})" for r in top))
    if report_dir:
        lines.append(f"timelines in {report_dir}")
    if test_seconds is not None:
        lines += phase_table(runs, test_seconds)
    return lines
