"""``python -m harness.bench``: the harness against the other ways to launch MWMS workers.

The same workloads (:mod:`harness.bench.launchers.plan`, functions of
:mod:`harness.workloads` measured by :mod:`harness.bench.launchers.workers`)
run under the launchers of :data:`LAUNCHERS` (the floor, the harness, a
fresh ``python`` per worker, TensorFlow's ``multi_process_runner``, the
harness on Ray), alternating run by run so that drift on a shared machine
hits all alike.  It prints a markdown table (ratios against the harness,
:mod:`harness.bench.launchers.table`) and writes the figures, with every
run's raw numbers, as JSON.  What each launcher, workload and figure is:
``docs/benchmark.md``.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import shutil
import signal
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Type

from harness.bench.common import (log, machine_info, machine_line, on_sigterm, parse_list,
                                  run_and_write)
from harness.bench.launchers.cluster import HarnessLauncher, RayLauncher
from harness.bench.launchers.floor import FloorLauncher
from harness.bench.launchers.measure import Launcher
from harness.bench.launchers.plan import ALL_WORKLOADS, make_workloads, schedule
from harness.bench.launchers.runner import RunnerLauncher
from harness.bench.launchers.spawn import SpawnLauncher
from harness.bench.launchers.table import (MIB, fmt_over_t, fmt_seconds, render_notes,
                                           render_table, summarize)

LAUNCHERS: Dict[str, Type[Launcher]] = {
    cls.name: cls for cls in (FloorLauncher, HarnessLauncher, SpawnLauncher, RunnerLauncher,
                              RayLauncher)}
ALL_LAUNCHERS = tuple(LAUNCHERS)
NOTES = {name: cls.note for name, cls in LAUNCHERS.items()}
# The launchers whose start-up before the first run the notes give (not in
# their 'cold' figure).
STARTUP_NOTED = (RunnerLauncher.name, RayLauncher.name)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m harness.bench",
        description="Benchmark the harness against spawn-per-worker and TensorFlow's "
                    "multi_process_runner on the same MWMS workloads.")
    p.add_argument("--repeats", type=int, default=5, help="warm runs per launcher and workload (5)")
    p.add_argument("--hang-repeats", type=int, default=2,
                   help="runs of workloads 4 and 5 at most (each costs >= T; the runner's T + 30 s) (2)")
    p.add_argument("--launchers", default=",".join(ALL_LAUNCHERS),
                   type=lambda s: parse_list(s, ALL_LAUNCHERS),
                   help="subset of " + ",".join(ALL_LAUNCHERS))
    p.add_argument("--workloads", default="1,2,3,4,5",
                   type=lambda s: parse_list(s, ALL_WORKLOADS, int), help="subset of 1,2,3,4,5")
    p.add_argument("--hang-timeout", type=float, default=10.0, help="T for workloads 4 and 5 (10 s)")
    p.add_argument("--json", default="bench-results.json", help="where to write the figures")
    p.add_argument("--markdown", default=None,
                   help="also write the machine line, table and notes here (for docs/benchmark.md)")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.hang_repeats < 1:
        p.error("--repeats and --hang-repeats must be at least 1")
    if args.hang_timeout <= 0:
        p.error("--hang-timeout must be greater than 0")
    return args


def _describe(r: dict) -> str:
    txt = f"{r['outcome']}, {fmt_seconds(r.get('wall_s'))}"
    if r.get("fn_s") is not None:
        txt += f" ({r['fn_s']:.2f} s in fn)"
    if r.get("pss_bytes"):
        txt += f", PSS {r['pss_bytes'] / MIB:.0f} MiB"
    if "detection_over_T_s" in r:
        txt += f", reported {fmt_over_t(r['detection_over_T_s'])} after the hang began"
    if "gone_after_report_s" in r:
        txt += f", gone {fmt_seconds(r['gone_after_report_s'])} after"
    if not r.get("ok"):
        txt += " [NOT OK]"
    return txt


def run_bench(args: argparse.Namespace) -> dict:
    workloads = make_workloads(args.hang_timeout)
    machine = machine_info()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    runs: List[dict] = []
    launchers: Dict[str, Launcher] = {}
    startup: Dict[str, float] = {}
    broken: Dict[str, str] = {}
    overhead: Dict[str, Optional[float]] = {}
    plan = schedule(args.launchers, args.workloads, args.repeats, args.hang_repeats)
    old_term = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        for name in args.launchers:
            t0 = time.monotonic()
            try:
                launchers[name] = LAUNCHERS[name]()
            except Exception as e:  # record it, go on with the others
                broken[name] = f"{type(e).__name__}: {e}"
                log(f"launcher {name} could not start: {broken[name]}")
                continue
            startup[name] = getattr(launchers[name], "startup_s", time.monotonic() - t0)
        for i, (name, w, rep, cold) in enumerate(plan, 1):
            if name not in launchers:
                continue
            stamp_dir = tempfile.mkdtemp(prefix="mwms-bench-")
            try:
                r = launchers[name].run(workloads[w], stamp_dir)
            except Exception as e:
                r = {"outcome": "bench_error", "ok": False, "wall_s": None,
                     "error": f"{type(e).__name__}: {e}"}
            finally:
                shutil.rmtree(stamp_dir, ignore_errors=True)
            r.update(launcher=name, workload=w, repeat=rep, cold=cold)
            runs.append(r)
            log(f"[{i}/{len(plan)}] {name} w{w} {'cold' if cold else f'rep {rep}'}: {_describe(r)}")
        for name, launcher in launchers.items():
            pss = launcher.overhead_pss()
            overhead[name] = None if pss is None else pss / MIB
    finally:
        for launcher in launchers.values():
            with contextlib.suppress(Exception):
                launcher.close()
        signal.signal(signal.SIGTERM, old_term)
    summary = summarize(runs, [n for n in args.launchers if n in launchers], args.workloads)
    extra = {"overhead_pss_mib": overhead,
             "launcher_startup_s": {k: v for k, v in startup.items() if k in STARTUP_NOTED}}
    machine["load_avg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    table = render_table(summary, workloads)
    markdown = (machine_line(machine) + "\n\n" + table + "\n\n"
                + render_notes(summary, extra, NOTES) + "\n")
    return {
        "machine": machine,
        "settings": {"repeats": args.repeats, "hang_repeats": args.hang_repeats,
                     "hang_timeout": args.hang_timeout, "launchers": args.launchers,
                     "workloads": args.workloads},
        "workloads": {str(k): dataclasses.asdict(v) for k, v in workloads.items()
                      if k in args.workloads},
        "started": started,
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "launcher_errors": broken,
        "launcher_startup_s": startup,
        "overhead_pss_mib": overhead,
        "summary": summary,
        "runs": runs,
        "markdown": markdown,
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    return run_and_write(
        lambda: run_bench(args), args.json, args.markdown,
        lambda r: all(x.get("ok") for x in r["runs"]) and not r["launcher_errors"])
