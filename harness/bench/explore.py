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
Each search starts from nothing: no plan saved by an earlier search (a
hypothesis profile without a database) runs first.

``draws``: the draw order alone, without TensorFlow, in seconds: for jobs
whose every single-crash plan was run (the sweeps of
``scenarios/test_recovery_search.py`` and ``tests/jobs/unseen_recovery.py``,
3 workers, TensorFlow 2.21.0), how many plans a search draws before the
first that breaks the job, over ``--seeds`` seeds at 2 and 3 workers: the
seeded random draws by hypothesis the search used before
(``harness.strategies.plans``), the draws spread over the space, and the
spread with the job's state points (its fault-free run's writes, measured
with ``run(watch_state=True)``).  Plans, not seconds: each costs one run.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Tuple

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


# Jobs whose every single-crash plan was run at 3 workers: (steps, which
# plans break the job, the boundaries where the fault-free run saw a write
# under run_dir at 2 and 3 workers).  A window of a step holds at 2 workers
# too: the step is the job's, the worker only where the truth names one.
SWEPT: Dict[str, Tuple[int, Callable[[tuple], bool], Dict[int, Tuple[int, ...]]]] = {
    "accumulating_loop": (20, lambda p: p[0].step == 10, {2: (), 3: ()}),   # writes every step
    "pointer_loop": (20, lambda p: p[0].step == 12 and p[0].worker >= 1, {2: (13,), 3: (13,)}),
    "unseen_recovery": (20, lambda p: p[0].step in (10, 11),
                        {2: (4, 8, 10, 12, 16, 17), 3: (4, 8, 10, 12, 16)}),
}


class _Found(Exception):
    pass


def random_draws(workers: int, steps: int, breaks: Callable[[tuple], bool], seed: int,
                 most: int) -> int:
    """Plans the seeded random search (hypothesis drawing
    ``strategies.plans``, each plan run once) ran up to its first break."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as seeded

    from harness import strategies
    seen: List[tuple] = []

    @seeded(seed)
    @settings(database=None, max_examples=1_000_000, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet,
              report_multiple_bugs=False, print_blob=False)
    @given(strategies.plans(workers, steps, ["Crash"], min_faults=1, max_faults=1))
    def draw(plan):
        plan = tuple(plan)
        if seen and (breaks(seen[-1]) or len(seen) >= most):
            raise _Found
        if plan not in seen:
            seen.append(plan)
        if breaks(plan) or len(seen) >= most:
            raise _Found

    try:
        draw()
    except _Found:
        pass
    return len(seen) if seen and breaks(seen[-1]) else most


def spread_draws(workers: int, steps: int, breaks: Callable[[tuple], bool], seed: int,
                 most: int, state_steps: Tuple[int, ...] = ()) -> int:
    """Plans the search's draws (:class:`harness.explore.space.Draws`) ran
    up to the first break; every crash makes a restart happen."""
    from harness.explore.space import Draws, Space, kind_weights
    draws = Draws(Space(workers, steps, ("Crash",), state_steps=state_steps), seed,
                  kind_weights(("Crash",), "survives"))
    ran: List[tuple] = []
    while len(ran) < most:
        plan = draws.next(set(ran), ran)
        if plan is None:
            break
        ran.append(plan)
        if breaks(plan):
            return len(ran)
    return most


def draws(seeds: int, most: int = 300) -> int:
    print("| job | workers | random (hypothesis) | spread | spread, state points first |")
    print("|---|---|---|---|---|")

    def said(xs: List[int]) -> str:
        xs = sorted(xs)
        return f"{statistics.median(xs):g} ({xs[len(xs) * 9 // 10 - 1]}, {xs[-1]})"
    for name, (steps, breaks, state) in SWEPT.items():
        for n in (2, 3):
            runs = [[f(n, steps, breaks, s, most) for s in range(seeds)]
                    for f in (random_draws, spread_draws)]
            runs.append([spread_draws(n, steps, breaks, s, most, state[n]) for s in range(seeds)])
            print(f"| {name} | {n} | " + " | ".join(said(r) for r in runs) + " |", flush=True)
    print(f"plans drawn to the first that breaks the job over seeds 0-{seeds - 1}: median "
          f"(90th percentile, most)")
    return 0


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
    d = sub.add_parser("draws")
    d.add_argument("--seeds", type=int, default=100)
    args = ap.parse_args(argv)
    if args.what == "draws":
        return draws(args.seeds)
    from hypothesis import settings
    settings.register_profile("pytest-mwms bench", database=None)
    settings.load_profile("pytest-mwms bench")
    print(machine_line(machine_info()), flush=True)
    if args.what == "rate":
        return rate([int(w) for w in args.workers.split(",")], args.budget, args.steps,
                    args.seed)
    return recovery(args.workers, args.job, args.invariant, json.loads(args.broken),
                    json.loads(args.fixed), args.budget, args.seed)


if __name__ == "__main__":
    sys.exit(main())
