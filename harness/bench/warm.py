"""``python -m harness.bench.warm``: the harness's warm run against the floor, phase by phase.

The same loop (:func:`harness.workloads.allreduce_loop`, 20 all-reduce
steps) on 2, 4 and 8 workers, under the harness (``Cluster.run`` with its
default settings, as a user gets them) and under the floor
(:mod:`harness.bench.launchers.floor`: a bare fork server that has imported
TensorFlow), alternating run by run, after one cold run of each.  It prints
the medians, the ratio to the floor, and the harness's phases
(``RunResult.phases``, :mod:`harness.controller.phases`) as medians over
its runs.

``--check R`` exits 1 when the ratio at the fewest workers asked for is
above ``R`` (CI runs ``--workers 2 --check 1.5``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Dict, List, Optional, Sequence

from harness.bench.common import machine_info, machine_line
from harness.bench.launchers.floor import FloorServer

FN = "harness.workloads:allreduce_loop"
KWARGS = {"n_steps": 20}


def _assert_sums(values: list, workers: int) -> None:
    if values != [float(workers)] * workers:
        raise RuntimeError(f"{workers} workers answered {values}, not {workers} each")


def measure(workers: Sequence[int], rounds: int) -> dict:
    """Each launcher's wall times and the harness's phases, by worker count."""
    from harness.controller import Cluster
    from harness.controller.phases import ordered
    from harness.settings import RunSettings
    from harness.workloads import allreduce_loop

    floor = FloorServer()
    clusters = {n: Cluster(RunSettings(workers=n)) for n in workers}
    walls: Dict[str, Dict[int, List[float]]] = {"floor": {n: [] for n in workers},
                                               "harness": {n: [] for n in workers}}
    phases: Dict[int, List[dict]] = {n: [] for n in workers}

    def floor_run(n: int) -> float:
        t0 = time.monotonic()
        answers = floor.run(FN, KWARGS, n)
        wall = time.monotonic() - t0
        bad = [a["error"] for a in answers if not a["ok"]]
        if bad:
            raise RuntimeError(f"the floor's run failed: {bad[0]}")
        _assert_sums([a["value"] for a in answers], n)
        return wall

    def harness_run(n: int) -> float:
        t0 = time.monotonic()
        result = clusters[n].run(allreduce_loop, kwargs=KWARGS)
        wall = time.monotonic() - t0
        result.assert_completed()
        _assert_sums(result.return_values, n)
        phases[n].append(dict(result.phases))
        return wall

    try:
        cold = {"floor": floor_run(workers[0]), "harness": harness_run(workers[0])}
        phases[workers[0]].clear()
        for _ in range(rounds):
            for n in workers:
                walls["floor"][n].append(floor_run(n))
                walls["harness"][n].append(harness_run(n))
    finally:
        floor.close()
    rows = {}
    for n in workers:
        f, h = statistics.median(walls["floor"][n]), statistics.median(walls["harness"][n])
        names = ordered({k: 0.0 for p in phases[n] for k in p})
        rows[n] = {"floor_s": f, "harness_s": h, "ratio": h / f,
                   "floor_runs": walls["floor"][n], "harness_runs": walls["harness"][n],
                   "phases": {k: statistics.median(p.get(k, 0.0) for p in phases[n])
                              for k in names}}
    return {"workers": list(workers), "rounds": rounds, "cold_s": cold,
            "floor_startup_s": floor.startup_s, "rows": rows}


def render(fig: dict) -> str:
    rows = fig["rows"]
    lines = ["| workers | floor | harness | harness / floor |", "|---|---|---|---|"]
    for n, row in rows.items():
        lines.append(f"| {n} | {row['floor_s']:.3f} s | {row['harness_s']:.3f} s | "
                     f"{row['ratio']:.2f}× |")
    names = list(dict.fromkeys(k for row in rows.values() for k in row["phases"]))
    lines += ["", "The harness's phases, median seconds over its warm runs:", "",
              "| phase | " + " | ".join(f"{n} workers" for n in rows) + " |",
              "|---|" + "---|" * len(rows)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(
            f"{row['phases'].get(name, 0.0):.3f}" for row in rows.values()) + " |")
    return "\n".join(lines)


def check(fig: dict, limit: float) -> tuple:
    """``(passed, line)``: whether the ratio at the fewest workers measured
    is at most ``limit``, and the line that says so."""
    n = min(fig["rows"])
    ratio = fig["rows"][n]["ratio"]
    passed = ratio <= limit
    return passed, (f"warm run at {n} workers: {ratio:.2f}× the floor, "
                    f"{'within' if passed else 'ABOVE'} the limit of {limit:g}×")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m harness.bench.warm",
                                description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="2,4,8",
                   type=lambda s: sorted({int(x) for x in s.split(",") if x.strip()}),
                   help="cluster sizes (2,4,8)")
    p.add_argument("--rounds", type=int, default=7, help="warm runs of each (7)")
    p.add_argument("--check", type=float, default=None, metavar="R",
                   help="exit 1 when harness / floor at the fewest workers is above R")
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args(argv)
    if args.rounds < 1 or not args.workers or min(args.workers) < 1:
        p.error("--rounds and every --workers value must be at least 1")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    print(machine_line(machine_info()), flush=True)
    fig = measure(args.workers, args.rounds)
    print(render(fig), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(fig, f, indent=1)
    if args.check is not None:
        passed, line = check(fig, args.check)
        print(line, flush=True)
        return 0 if passed else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
