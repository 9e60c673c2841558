"""``python -m harness.bench.cost.step``: what progress reporting costs per step.

Runs :func:`harness.bench.cost.workers.timed_allreduce` (``allreduce_loop``, a
scalar all-reduce a step) on N workers (2) under
``harness.controller.Cluster.run``, in several variants that differ only in
where the loop's step numbers come from and in ``Cluster.run``'s keyword
arguments (:data:`VARIANTS`), alternating run by run (A B C A B C ...) so
that drift on a shared machine hits all alike.  The time per step is
measured inside the workers, around the loop (slowest worker), not from
launch to return; the benchmark's own CPU time (the watch loop, which
competes with the workers for the cores) is measured around ``Cluster.run``.
It prints a markdown table and writes the figures, with every run's raw
numbers, as JSON.  What each figure is: ``docs/benchmark.md``.

A variant is one line of :data:`VARIANTS`; one whose keyword arguments
``Cluster.run`` does not accept (yet) is skipped with a message.
"""
from __future__ import annotations

import argparse
import datetime
import inspect
import os
import resource
import signal
import sys
import time
from typing import Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence

from harness.bench.common import (log, machine_busy_seconds, machine_info, machine_line,
                                  on_sigterm, parse_list, run_and_write, stats)


class Variant(NamedTuple):
    """How one variant runs the loop: where its step numbers come from
    (``"range"`` or ``"steps"``, :data:`harness.bench.cost.workers.STEP_KINDS`) and
    the keyword arguments given to ``Cluster.run``."""

    steps: str
    run_kwargs: Mapping[str, object] = {}


# name -> (steps kind, Cluster.run keyword arguments).  The first is the
# reference the others are compared with.  Add a line to add a variant.
VARIANTS: Dict[str, Variant] = {
    "range": Variant("range", {}),                      # no progress reporting at all
    "steps": Variant("steps", {}),                      # harness.context().steps(n)
    "sync_check": Variant("steps", {"sync_check": True}),
    "ledger_off": Variant("steps", {"ledger": False}),
    "ledger_collectives": Variant("steps", {"ledger": "collectives"}),
}
REFERENCE = "range"

DEFAULT_ROUNDS = 5
DEFAULT_STEPS = 600
DEFAULT_WARMUP = 10
DEFAULT_WORKERS = 2
DEFAULT_TIMEOUT = 60.0


# -- the variant table (pure) ------------------------------------------------------

def unsupported_kwargs(fn: Callable, kwargs: Mapping[str, object]) -> List[str]:
    """The names among ``kwargs`` that ``fn`` does not accept as keywords."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    keyword_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [k for k in kwargs if k not in params or params[k].kind not in keyword_kinds]


def split_supported(variants: Mapping[str, Variant], run: Callable):
    """``(runnable names, {skipped name: why})`` for ``run`` (``Cluster.run``)."""
    runnable, skipped = [], {}
    for name, v in variants.items():
        bad = unsupported_kwargs(run, v.run_kwargs)
        if bad:
            skipped[name] = f"Cluster.run does not accept {', '.join(bad)} yet"
        else:
            runnable.append(name)
    return runnable, skipped


def schedule(variants: Sequence[str], rounds: int) -> List[tuple]:
    """The run order, ``(round, variant)``: every round runs each variant
    once, in the same order (A B C A B C ...)."""
    return [(r, name) for r in range(rounds) for name in variants]


# -- figures (pure) ------------------------------------------------------------------

def worker_figures(return_values: Sequence, steps: int, warmup: int,
                   workers: int) -> Optional[dict]:
    """Per-step times from what the workers returned
    (:func:`~harness.bench.cost.workers.timed_allreduce`): the slowest worker's,
    in ms, and every worker's.  None unless every worker returned its own."""
    rows = [r for r in return_values if isinstance(r, dict) and r.get("timed_s") is not None]
    if len(rows) != workers or len(return_values) != workers:
        return None
    timed = [1000.0 * r["timed_s"] / (steps - warmup) for r in rows]
    loop = [1000.0 * r["loop_s"] / steps for r in rows]
    out = {"ms_per_step": max(timed), "ms_per_step_workers": timed,
           "loop_ms_per_step": max(loop)}
    if all(r.get("cpu_timed_s") is not None for r in rows):
        out["workers_cpu_ms_per_step"] = 1000.0 * sum(r["cpu_timed_s"] for r in rows) / (
            steps - warmup)
        out["workers_cpu_total_s"] = sum(r.get("cpu_total_s") or 0.0 for r in rows)
    return out


def other_cpu_share(busy_s: Optional[float], own_cpu_s: Optional[float], wall_s: float,
                    cores: int) -> Optional[float]:
    """The share of the machine's cores busy with something other than the
    benchmark and its workers over a run: (machine busy - own) / (wall * cores).
    Well above a few per cent: another process competed for the cores."""
    if busy_s is None or own_cpu_s is None or wall_s <= 0 or cores < 1:
        return None
    return max(0.0, busy_s - own_cpu_s) / (wall_s * cores)


def values_ok(return_values: Sequence, workers: int) -> bool:
    """Every worker returned and its last all-reduce summed to N."""
    return (len(return_values) == workers
            and all(isinstance(r, dict) and r.get("value") == float(workers)
                    for r in return_values))


def paired_differences(runs: Sequence[dict], name: str, reference: str = REFERENCE,
                       key: str = "ms_per_step") -> List[float]:
    """``name``'s ``key`` minus ``reference``'s, round by round, over the
    rounds where both ran ok."""
    by_round: Dict[int, Dict[str, float]] = {}
    for r in runs:
        if r.get("ok") and not r.get("cold") and r.get(key) is not None:
            by_round.setdefault(r["round"], {})[r["variant"]] = r[key]
    return [v[name] - v[reference] for _, v in sorted(by_round.items())
            if name in v and reference in v]


def summarize(runs: Sequence[dict], variants: Sequence[str],
              reference: str = REFERENCE) -> dict:
    """``{variant: figures}`` from the warm runs (the cold one is left out)."""
    out = {}
    for name in variants:
        mine = [r for r in runs if r["variant"] == name and not r.get("cold")]
        ok = [r for r in mine if r.get("ok")]
        fig = {
            "runs": len(mine), "failed": len(mine) - len(ok),
            "ms_per_step": stats([r.get("ms_per_step") for r in ok]),
            "loop_ms_per_step": stats([r.get("loop_ms_per_step") for r in ok]),
            "parent_cpu_ms_per_step": stats([r.get("parent_cpu_ms_per_step") for r in ok]),
            "workers_cpu_ms_per_step": stats([r.get("workers_cpu_ms_per_step") for r in ok]),
            "other_cpu_share": stats([r.get("other_cpu_share") for r in ok]),
            "wall_s": stats([r.get("wall_s") for r in ok]),
        }
        if name != reference:
            for key in ("ms_per_step", "parent_cpu_ms_per_step", "workers_cpu_ms_per_step"):
                fig["diff_" + key] = stats(paired_differences(runs, name, reference, key))
        out[name] = fig
    return out


# -- table (pure) ----------------------------------------------------------------------

def fmt_kwargs(kwargs: Mapping[str, object]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "–"


def fmt_steps(kind: str) -> str:
    return "`range(n)`" if kind == "range" else "`context().steps(n)`"


def fmt_ms(x: Optional[float], signed: bool = False) -> str:
    if x is None:
        return "–"
    return f"{x:+.2f}" if signed else f"{x:.2f}"


def fmt_ms_spread(st: Optional[dict], signed: bool = False) -> str:
    if not st:
        return "–"
    if st["n"] == 1:
        return "(1 run)"
    return f"{fmt_ms(st['min'], signed)} to {fmt_ms(st['max'], signed)}"


def table_header(reference: str = REFERENCE) -> str:
    return ("| variant | steps from | `Cluster.run` kwargs | ms/step (median) | min–max | "
            f"vs {reference}, paired (median; min–max) | workers' CPU ms/step | "
            f"parent CPU ms/step | parent CPU vs {reference} | runs ok |")


TABLE_HEADER = table_header()


def render_table(summary: dict, variants: Mapping[str, Variant], reference: str = REFERENCE,
                 skipped: Optional[Mapping[str, str]] = None) -> str:
    header = table_header(reference)
    lines = [header, "|" + "---|" * (header.count(" | ") + 1)]
    for name, fig in summary.items():
        v = variants[name]
        ms, cpu = fig.get("ms_per_step"), fig.get("parent_cpu_ms_per_step")
        wcpu = fig.get("workers_cpu_ms_per_step")
        if name == reference:
            diff_txt = cpu_diff_txt = "(reference)"
        else:
            d, cd = fig.get("diff_ms_per_step"), fig.get("diff_parent_cpu_ms_per_step")
            diff_txt = fmt_ms(d and d["median"], True)
            if d and d["n"] > 1:
                diff_txt += f" ({fmt_ms_spread(d, True)})"
            cpu_diff_txt = fmt_ms(cd and cd["median"], True)
        cells = (name, fmt_steps(v.steps), fmt_kwargs(v.run_kwargs), fmt_ms(ms and ms["median"]),
                 fmt_ms_spread(ms), diff_txt, fmt_ms(wcpu and wcpu["median"]),
                 fmt_ms(cpu and cpu["median"]), cpu_diff_txt,
                 f"{fig['runs'] - fig['failed']}/{fig['runs']}")
        lines.append("| " + " | ".join(cells) + " |")
    for name, why in (skipped or {}).items():
        v = variants[name]
        cells = (name, fmt_steps(v.steps), fmt_kwargs(v.run_kwargs), f"skipped: {why}",
                 "", "", "", "", "", "0/0")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_notes(settings: dict, reference: str = REFERENCE,
                 summary: Optional[dict] = None) -> str:
    n, steps, warmup = settings["workers"], settings["steps"], settings["warmup"]
    rounds = settings["rounds"]
    lines = [
        f"- {n} workers, {steps} steps of a scalar all-reduce (`allreduce_loop`), "
        f"{rounds} round{'s' if rounds != 1 else ''}, the variants alternating within each "
        "round; a cold run (the forkserver's TensorFlow import) first, left out.",
        f"- ms/step: timed inside each worker with `time.perf_counter()` around its loop, "
        f"from step {warmup} to the loop's end (the first {warmup} steps trace and set the "
        f"collectives up), divided by {steps - warmup}; the slowest worker's.",
        f"- vs {reference}, paired: per round, the variant's ms/step minus the `{reference}` "
        "run's of the same round; the median (and spread) of those differences.",
        f"- parent CPU ms/step: the benchmark process's CPU time (`time.process_time()`) "
        f"across `Cluster.run`, divided by {steps}: launch, watch loop, clean-up and "
        "diagnosis, so it includes a fixed per-run part; the paired difference against "
        f"`{reference}` cancels that part.",
        "- workers' CPU ms/step: the workers' own CPU time (`time.process_time()`, all "
        "threads) over the timed steps, summed over the workers.",
    ]
    shares = [r for fig in (summary or {}).values() for r in [fig.get("other_cpu_share")] if r]
    if shares:
        worst = max(s["max"] for s in shares)
        median = sorted(s["median"] for s in shares)[len(shares) // 2]
        lines.append(
            f"- other load: the cores' time busy with anything but the benchmark and its "
            f"workers (`/proc/stat`), over each run: median {100 * median:.0f}%, at most "
            f"{100 * worst:.0f}% of the {settings.get('cores') or '?'} cores (more than a few "
            "per cent: another process competed, and the figures are not clean).")
    return "\n".join(lines)


# -- running -----------------------------------------------------------------------------

def _cpu() -> tuple:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return time.process_time(), ru.ru_utime, ru.ru_stime


def run_once(cluster, name: str, variant: Variant, args: argparse.Namespace) -> dict:
    """One ``Cluster.run`` of a variant, and its raw figures."""
    from harness.bench.cost.workers import timed_allreduce
    kwargs = {"n_steps": args.steps, "steps_kind": variant.steps, "warmup": args.warmup}
    busy0, cpu0, t0 = machine_busy_seconds(), _cpu(), time.monotonic()
    result = cluster.run(timed_allreduce, kwargs=kwargs, timeout=args.timeout,
                         **dict(variant.run_kwargs))
    t1, cpu1, busy1 = time.monotonic(), _cpu(), machine_busy_seconds()
    parent_cpu = cpu1[0] - cpu0[0]
    out = {"variant": name, "outcome": result.outcome, "wall_s": t1 - t0,
           "harness_duration_s": result.duration, "parent_cpu_s": parent_cpu,
           "parent_user_s": cpu1[1] - cpu0[1], "parent_sys_s": cpu1[2] - cpu0[2],
           "parent_cpu_ms_per_step": 1000.0 * parent_cpu / args.steps}
    values = result.return_values
    figs = worker_figures(values, args.steps, args.warmup, args.workers)
    out["ok"] = result.outcome == "completed" and values_ok(values, args.workers) and bool(figs)
    out.update(figs or {})
    out["workers"] = [r for r in values if isinstance(r, dict)]
    busy = None if busy0 is None or busy1 is None else busy1 - busy0
    own = None if "workers_cpu_total_s" not in out else parent_cpu + out["workers_cpu_total_s"]
    out["machine_busy_s"] = busy
    out["other_cpu_share"] = other_cpu_share(busy, own, t1 - t0, os.cpu_count() or 1)
    if not out["ok"]:
        out["error"] = result.report()[-4000:]
    return out


def _describe(r: dict) -> str:
    if not r.get("ok"):
        return f"{r['outcome']} [NOT OK]"
    return (f"{r['ms_per_step']:.3f} ms/step (workers "
            + ", ".join(f"{x:.3f}" for x in r["ms_per_step_workers"])
            + f"), parent CPU {r['parent_cpu_ms_per_step']:.3f} ms/step, wall {r['wall_s']:.2f} s"
            + ("" if r.get("other_cpu_share") is None
               else f", other load {100 * r['other_cpu_share']:.0f}%"))


def run_bench(args: argparse.Namespace) -> dict:
    from harness.controller import Cluster
    from harness.settings import RunSettings
    variants = {name: VARIANTS[name] for name in args.variants}
    runnable, skipped = split_supported(variants, Cluster.run)
    for name, why in skipped.items():
        log(f"skipping variant {name} ({fmt_kwargs(variants[name].run_kwargs)}): {why}")
    machine = machine_info()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    cluster = Cluster(RunSettings(workers=args.workers, timeout=args.timeout))
    runs: List[dict] = []
    cold: Optional[dict] = None
    plan = schedule(runnable, args.rounds)
    old_term = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        if runnable:
            # The forkserver imports TensorFlow on the first run: not a figure.
            cold = run_once(cluster, runnable[0], variants[runnable[0]], args)
            cold.update(round=-1, cold=True)
            log(f"cold {runnable[0]}: {_describe(cold)}")
        for i, (rnd, name) in enumerate(plan, 1):
            r = run_once(cluster, name, variants[name], args)
            r.update(round=rnd, cold=False)
            runs.append(r)
            log(f"[{i}/{len(plan)}] round {rnd} {name}: {_describe(r)}")
    finally:
        signal.signal(signal.SIGTERM, old_term)
    machine["load_avg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    reference = runnable[0] if runnable and REFERENCE not in runnable else REFERENCE
    summary = summarize(runs, runnable, reference)
    settings = {"workers": args.workers, "steps": args.steps, "warmup": args.warmup,
                "rounds": args.rounds, "timeout": args.timeout, "variants": args.variants,
                "cores": os.cpu_count()}
    markdown = (machine_line(machine) + "\n\n"
                + render_table(summary, variants, reference, skipped) + "\n\n"
                + render_notes(settings, reference, summary) + "\n")
    return {
        "machine": machine,
        "settings": settings,
        "variants": {name: {"steps": v.steps, "run_kwargs": dict(v.run_kwargs)}
                     for name, v in variants.items()},
        "reference": reference,
        "skipped": skipped,
        "started": started,
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "summary": summary,
        "cold": cold,
        "runs": runs,
        "markdown": markdown,
    }


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m harness.bench.cost.step",
        description="What progress reporting costs per training step: an all-reduce loop "
                    "under the harness, with range(n), context().steps(n) and other variants "
                    "run alternately, timed inside the workers.")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                   help=f"rounds; each runs every variant once ({DEFAULT_ROUNDS})")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                   help=f"all-reduce steps per run ({DEFAULT_STEPS})")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP,
                   help=f"first steps of each run left out of the timing ({DEFAULT_WARMUP})")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                   help=f"workers per cluster ({DEFAULT_WORKERS})")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   type=lambda s: parse_list(s, tuple(VARIANTS)),
                   help=f"subset of {','.join(VARIANTS)}; the first given is the reference "
                        f"when {REFERENCE} is left out")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help=f"the runs' hang timeout, a safety net ({DEFAULT_TIMEOUT:g} s)")
    p.add_argument("--json", default="step-cost-results.json", help="where to write the figures")
    p.add_argument("--markdown", default=None, help="also write the machine line, table and notes")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.workers < 1:
        p.error("--workers must be at least 1")
    if args.timeout <= 0:
        p.error("--timeout must be greater than 0")
    if not 0 <= args.warmup < args.steps:
        p.error("--warmup must be 0 or more and less than --steps")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)

    def ok(results: dict) -> bool:
        runs = results["runs"] + ([results["cold"]] if results["cold"] else [])
        return bool(runs) and all(r.get("ok") for r in runs)
    return run_and_write(lambda: run_bench(args), args.json, args.markdown, ok)


if __name__ == "__main__":
    sys.exit(main())
