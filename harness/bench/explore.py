"""``python -m harness.bench.explore``: how fast ``explore`` runs plans, and
whether it finds and shrinks a recovery bug in a job it has not seen.

``rate``: ``explore(property="detected")`` over the standard workload
(:func:`harness.workloads.variable_loop`, ``--steps`` steps) for
``--budget`` seconds at each worker count of ``--workers``, every
step-keyed kind drawn: plans run per minute, how they ended, and whether
any verdict was wrong (none may be).

``recovery --job PATH:FUNCTION --invariant PATH:FUNCTION``: the job
broken (``--broken`` keyword arguments, JSON) and fixed (``--fixed``) at
``--workers`` workers with ``restarts=1`` and single crashes: the time to
find and shrink a failure on the broken job, the plan it shrank to, and on
the fixed job the number of plans run in the same budget with none broken.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from typing import Callable, List

from harness.bench.common import machine_info, machine_line


def load(spec: str) -> Callable:
    """``path/to/file.py:name`` (or ``module:name``) to the object."""
    where, _, name = spec.rpartition(":")
    if where.endswith(".py"):
        module_name = os.path.splitext(os.path.basename(where))[0]
        found = importlib.util.spec_from_file_location(module_name, os.path.abspath(where))
        if found is None or found.loader is None:
            raise SystemExit(f"{where}: cannot be loaded as a module")
        module = importlib.util.module_from_spec(found)
        sys.modules[module_name] = module
        found.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    return getattr(module, name)


def cluster(workers: int):
    from harness.controller import Cluster
    from harness.settings import RunSettings
    return Cluster(RunSettings(workers=workers, timeout=30))


def rate(workers: List[int], budget: float, steps: int, seed: int) -> int:
    from harness.workloads import variable_loop
    print("| workers | plans run | per minute | outcomes | wrong verdicts | hang timeout |")
    print("|---|---|---|---|---|---|")
    wrong = 0
    for n in workers:
        c = cluster(n)
        c.run(variable_loop, args=(2,))   # the forkserver's start, not counted
        found = c.explore(variable_loop, args=(steps,), property="detected", budget=budget,
                          seed=seed, check=False)
        seen = ", ".join(f"{k} {v}" for k, v in sorted(found.outcomes.items()))
        bad = found.failure is not None
        wrong += bad
        print(f"| {n} | {found.runs} | {found.runs_per_minute:.0f} | {seen} | "
              f"{found.failure.line if bad else 0} | {found.timeout:g} s |", flush=True)
    return 1 if wrong else 0


def recovery(workers: int, job: str, invariant: str, broken: dict, fixed: dict,
             budget: float, seed: int) -> int:
    fn, check = load(job), load(invariant)
    c = cluster(workers)
    c.run(fn, kwargs=broken, timeout=60)   # the forkserver's start, not counted
    t0 = time.monotonic()
    found = c.explore(fn, kwargs=broken, invariant=check, kinds=["Crash"], restarts=1,
                      budget=budget, seed=seed, check=False)
    took = time.monotonic() - t0
    print(f"broken: {found.summary()}")
    print(f"broken: found and shrunk in {took:.1f} s")
    t0 = time.monotonic()
    clean = c.explore(fn, kwargs=fixed, invariant=check, kinds=["Crash"], restarts=1,
                      budget=budget, seed=seed, check=False)
    print(f"fixed: {clean.summary()}")
    print(f"fixed: {time.monotonic() - t0:.1f} s")
    return 0 if found.failure is not None and clean.failure is None else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.bench.explore",
                                 description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("rate")
    r.add_argument("--workers", default="2,3,4")
    r.add_argument("--budget", type=float, default=60.0)
    r.add_argument("--steps", type=int, default=10)
    r.add_argument("--seed", type=int, default=1)
    v = sub.add_parser("recovery")
    v.add_argument("--job", required=True)
    v.add_argument("--invariant", required=True)
    v.add_argument("--broken", default="{}")
    v.add_argument("--fixed", default="{}")
    v.add_argument("--workers", type=int, default=3)
    v.add_argument("--budget", type=float, default=90.0)
    v.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    print(machine_line(machine_info()), flush=True)
    if args.what == "rate":
        return rate([int(w) for w in args.workers.split(",")], args.budget, args.steps,
                    args.seed)
    return recovery(args.workers, args.job, args.invariant, json.loads(args.broken),
                    json.loads(args.fixed), args.budget, args.seed)


if __name__ == "__main__":
    sys.exit(main())
