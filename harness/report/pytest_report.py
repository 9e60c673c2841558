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

from harness.diagnosis.observations import OUTCOMES, Outcome

SLOWEST_SHOWN = 5
# --mwms-report: which runs get a timeline in --mwms-report-dir.
REPORT_MODES = ("failed", "all")


def junit_properties(runs: Sequence) -> List[Tuple[str, str]]:
    """``(name, value)`` pairs for the test's last run (``mwms_runs`` counts them all)."""
    last = runs[-1]
    step = last.step
    return [("mwms_outcome", str(last.outcome)),
            ("mwms_culprits", ",".join(map(str, last.culprits))),
            ("mwms_step", "" if step is None else str(step)),
            ("mwms_ambiguous", "true" if last.ambiguous else "false"),
            ("mwms_rule", getattr(last.verdict, "rule", "") or ""),
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
            "workers": len(run.workers)}


def summary_lines(runs: Sequence[dict], report_dir: Optional[str] = None,
                  slowest: int = SLOWEST_SHOWN) -> List[str]:
    """The session summary's lines: runs by outcome, verdicts that named one
    culprit and that could not tell, the slowest runs, the report directory."""
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
    return lines
