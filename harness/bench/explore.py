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

``corpus``: the recovery bugs of :data:`BUGS`, each searched at each worker
count of ``--workers`` for ``--seeds`` seeds, ``--budget`` seconds each, by
each draw order of ``--orders`` (``guided``, the search's own; ``uniform``,
each plan drawn uniformly, the search as it drew before), one restart,
``grace=1``: the seconds and plans to the first failure, the plan it shrank
to, the seconds to shrink and replay it and how often it reproduced; the
uniform order is not shrunk nor replayed (the same code would do it). Then
each fixed twin is searched once at each worker count over the whole budget
(where ``--orders`` has ``guided``): none may break. Each search starts with no plan saved. ``--out`` keeps a
JSON line per search.

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
import dataclasses
import importlib.util
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from harness.bench.common import machine_info, machine_line
from harness.validators import DEFAULT_MAX_FAULTS


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


# -- the recovery bugs ----------------------------------------------------------
# Jobs that survive a fault-free run and break only when a fault falls in
# the wrong place, each with its fixed twin: from users' reports (the
# corpus of harness.bench.corpus.restarts, the MWMS tutorials' checkpoint
# pattern misread) and the catalogue's and the tests' recovery jobs.  A job
# is named ``module:function`` or ``path/to/file.py:function`` (:func:`load`).
@dataclasses.dataclass(frozen=True)
class Bug:
    """One recovery bug: ``job`` called with ``broken`` keyword arguments
    breaks ``invariant`` (``module:function``; None: the run must
    complete) under some plan of ``kinds`` (None: the search's default)
    with one restart; with ``fixed`` it breaks it under none."""
    name: str
    source: str
    what: str
    job: str
    broken: Dict[str, Any]
    fixed: Dict[str, Any]
    invariant: Optional[str] = None
    kinds: Optional[Tuple[str, ...]] = None
    run: Dict[str, Any] = dataclasses.field(default_factory=dict)
    keras2: bool = False   # runs with tf_keras (TF_USE_LEGACY_KERAS=1)


def corpus_job(name: str, **kwargs) -> None:
    """``harness.bench.corpus.restarts.<name>(run_dir, **kwargs)`` with its
    built-in preemption (a task's own exit at a fixed step) taken out."""
    import harness
    from harness.bench.corpus import restarts
    restarts.preempt = lambda *args, **kw: None
    getattr(restarts, name)(harness.context().run_dir, **kwargs)


def _corpus(name: str, broken: str, fixed: str, what: str, **run) -> Bug:
    from harness.bench.corpus.restarts import TUTORIAL_CTL
    return Bug(name, TUTORIAL_CTL + " (harness.bench.corpus.restarts)", what,
               "harness.bench.explore:corpus_job", {"name": broken}, {"name": fixed},
               run={"step_fn": "train_step", **run})


SCENARIOS = "scenarios/test_recovery_search.py"

BUGS: Tuple[Bug, ...] = (
    _corpus("restore_from_own_write_dir", "restore_own_write_dir", "restore_chief_dir",
            "each worker restores from the directory it writes to: a non-chief finds none"),
    _corpus("restore_on_chief_only", "restore_on_chief_only", "restore_on_every_worker",
            "only the chief restores the checkpoint"),
    _corpus("step_counter_outside_checkpoint", "step_file_per_task", "step_file_of_the_chief",
            "the loop's step is kept in a file only the chief writes, read per task"),
    Bug("backup_dir_per_worker",
        "TensorFlow tutorial 'Multi-worker training with Keras', BackupAndRestore "
        "(harness.bench.corpus.restarts)",
        "BackupAndRestore's backup_dir differs per worker",
        "harness.bench.explore:corpus_job", {"name": "backup_dir_per_worker"},
        {"name": "backup_dir_shared"}, keras2=True),
    Bug("checkpoint_before_accumulated_update",
        "custom loop with gradient accumulation (scenarios)",
        "a window's last micro-batch is saved before its update is applied",
        f"{SCENARIOS}:accumulating_loop", {}, {"fixed": True},
        invariant=f"{SCENARIOS}:every_update_applied_once"),
    Bug("pointer_before_checkpoint", "MWMS docs: save on every worker (scenarios)",
        "the chief names the newest checkpoint in a file before saving it",
        f"{SCENARIOS}:pointer_loop", {}, {"fixed": True},
        invariant=f"{SCENARIOS}:every_step_applied_once"),
    Bug("backup_every_batch", "tf.keras.callbacks.BackupAndRestore(save_freq=1) (scenarios)",
        "a backup every batch misses an epoch-end learning-rate update",
        f"{SCENARIOS}:fit_with_backup", {"save_freq": 1}, {"save_freq": "epoch"},
        invariant=f"{SCENARIOS}:every_step_at_its_rate", keras2=True),
    Bug("data_position", "a job written outside the project (tests/jobs)",
        "the resume position is one past an epoch-end checkpoint",
        "tests/jobs/unseen_recovery.py:train", {}, {"fixed": True},
        invariant="tests/jobs/unseen_recovery.py:invariant"),
    Bug("next_step_saved_every_other", "tests/test_explore.py",
        "the total is saved every step, the next step every other one",
        "tests/test_explore.py:resumable", {}, {"fixed": True},
        invariant="tests/test_explore.py:each_step_once"),
    Bug("state_written_in_place", "tests/test_file_faults.py",
        "the state file is rewritten in place, not written whole and renamed",
        "tests/test_file_faults.py:state_loop", {"in_place": True}, {},
        invariant="tests/test_file_faults.py:every_step_once",
        kinds=("Crash", "TornWrite", "DiskFull")),
)


def _search_line(bug, workers: int, order: str, seed: int, twin: str, found, took: float,
                 max_faults: int) -> dict:
    f = found.failure
    line = dict(bug=bug.name, workers=workers, order=order, seed=seed, job=twin,
                max_faults=max_faults,
                found=f is not None, plans=found.runs, search_seconds=round(found.search_seconds, 1),
                seconds=round(took, 1), hang_timeout=found.timeout, steps=found.steps)
    if f is not None:
        line.update(first=repr(f.found), shrunk=f.line, broke=f.how,
                    shrink_seconds=round(f.shrink_seconds, 1), shrink_runs=f.shrink_runs,
                    replays=f.replays, reproduced=f.reproduced)
    else:
        line.update(covered=found.coverage.lines() if found.coverage else [])
    return line


def corpus(workers: List[int], orders: List[str], seeds: int, budget: float, names: List[str],
           out: str, max_faults: int = DEFAULT_MAX_FAULTS) -> int:
    from harness.core import versions
    keras2 = versions.keras2_env(versions.installed_minor())
    bugs = [b for b in BUGS if not names or b.name in names]
    unknown = set(names) - {b.name for b in BUGS}
    if unknown:
        raise SystemExit(f"--bugs: no bug named {sorted(unknown)}; the bugs: "
                         f"{', '.join(b.name for b in BUGS)}")
    wrong = 0
    with open(out, "a") as log:
        def keep(line: dict) -> None:
            log.write(json.dumps(line) + "\n")
            log.flush()
            print(json.dumps(line), flush=True)

        for n in workers:
            c = cluster(n)
            for bug in bugs:
                fn = load(bug.job)
                check = load(bug.invariant) if bug.invariant else None
                options = dict(invariant=check, kinds=bug.kinds, restarts=1, grace=1,
                               max_faults=max_faults,
                               check=False, env=keras2 if bug.keras2 else None, **bug.run)
                c.run(fn, kwargs=bug.fixed, timeout=60, env=options["env"],
                      step_fn=bug.run.get("step_fn"))   # the forkserver's start, not counted
                for order in orders:
                    for seed in range(seeds):
                        shrink = dict(shrink_budget=budget) if order == "guided" else \
                            dict(shrink_budget=0.001, reproduce=0)
                        t0 = time.monotonic()
                        found = c.explore(fn, kwargs=bug.broken, budget=budget, seed=seed,
                                          order=order, **shrink, **options)
                        keep(_search_line(bug, n, order, seed, "broken", found,
                                          time.monotonic() - t0, max_faults))
                if "guided" not in orders:
                    continue   # the fixed twin is searched with the search's own draws
                t0 = time.monotonic()
                clean = c.explore(fn, kwargs=bug.fixed, budget=budget, seed=0, **options)
                wrong += clean.failure is not None
                keep(_search_line(bug, n, "guided", 0, "fixed", clean, time.monotonic() - t0,
                                  max_faults))
    return 1 if wrong else 0


def corpus_table(path: str, budget: float) -> str:
    """The docs' table from ``corpus``'s JSON lines."""
    rows: Dict[tuple, List[dict]] = {}
    with open(path) as f:
        lines = [json.loads(text) for text in f]
    for line in lines:
        rows.setdefault((line["bug"], line["workers"], line["order"], line["job"]), []).append(line)
    names = list(dict.fromkeys(k[0] for k in rows))
    sizes = sorted({k[1] for k in rows})

    def med(xs: List[float]) -> str:
        return f"{statistics.median(xs):.0f}" if xs else "-"
    out = ["| bug | workers | guided: found | seconds to find, median (most) | "
           f"found and shrunk within {budget:g} s | shrunk to | reproduced | "
           "uniform: found | seconds to find, median (most) | fixed twin |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for name in names:
        for n in sizes:
            g = rows.get((name, n, "guided", "broken"), [])
            u = rows.get((name, n, "uniform", "broken"), [])
            fixed = rows.get((name, n, "guided", "fixed"), [])
            if not g and not u:
                continue
            gf = [x for x in g if x["found"]]
            uf = [x for x in u if x["found"]]
            within = sum(x["seconds"] <= budget for x in gf)
            shrunk = ", ".join(sorted({x["shrunk"].removeprefix("faults=") for x in gf})) or "-"
            rep = f"{sum(x['reproduced'] for x in gf)} of {sum(x['replays'] for x in gf)}"
            fx = "; ".join(("BROKE: " + x["shrunk"]) if x["found"] else
                           f"clean, {x['plans']} plans in {x['seconds']:.0f} s" for x in fixed) or "-"
            out.append(
                f"| {name} | {n} | {len(gf)} of {len(g)} | "
                f"{med([x['search_seconds'] for x in gf])} "
                f"({max((x['search_seconds'] for x in gf), default=0):.0f}) | "
                f"{within} of {len(g)} | {shrunk} | {rep} | "
                + (f"{len(uf)} of {len(u)} | {med([x['search_seconds'] for x in uf])} "
                   f"({max((x['search_seconds'] for x in uf), default=0):.0f})" if u else
                   "not run | -")
                + f" | {fx} |")
    return "\n".join(out)


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
    k = sub.add_parser("corpus")
    k.add_argument("--workers", default="2,3")
    k.add_argument("--orders", default="guided,uniform")
    k.add_argument("--seeds", type=int, default=5)
    k.add_argument("--budget", type=float, default=90.0)
    k.add_argument("--bugs", default="", help="the bugs to search, by name (default all)")
    k.add_argument("--out", default="explore-corpus.jsonl")
    k.add_argument("--table", action="store_true", help="print the table of --out and stop")
    k.add_argument("--max-faults", type=int, default=DEFAULT_MAX_FAULTS,
                   help=f"explore's max_faults (default {DEFAULT_MAX_FAULTS}, explore's own)")
    d = sub.add_parser("draws")
    d.add_argument("--seeds", type=int, default=100)
    args = ap.parse_args(argv)
    if args.what == "draws":
        return draws(args.seeds)
    if args.what == "corpus" and args.table:
        print(corpus_table(args.out, args.budget))
        return 0
    from hypothesis import settings
    settings.register_profile("pytest-mwms bench", database=None)
    settings.load_profile("pytest-mwms bench")
    print(machine_line(machine_info()), flush=True)
    if args.what == "rate":
        return rate([int(w) for w in args.workers.split(",")], args.budget, args.steps,
                    args.seed)
    if args.what == "corpus":
        return corpus([int(w) for w in args.workers.split(",")], args.orders.split(","),
                      args.seeds, args.budget, [b for b in args.bugs.split(",") if b], args.out,
                      args.max_faults)
    return recovery(args.workers, args.job, args.invariant, json.loads(args.broken),
                    json.loads(args.fixed), args.budget, args.seed)


if __name__ == "__main__":
    sys.exit(main())
