"""``python -m harness.bench.recorder.cost``: what the job recorder
(``harness record``, :mod:`harness.record`) costs a training step.

Runs one job of N (2) plain ``python`` processes, each with its own
``TF_CONFIG`` on reserved ports, as a job's pods would run it, in two
variants: ``without`` (``python train.py``) and ``with`` (``python -m
harness record --dir DIR train.py``, the default ``--timeout``, so no dump
is written in practice), alternating A B A B for R rounds (5) so that
drift on a shared machine hits both alike.  The job script (written to a
temporary directory that is removed afterwards) runs the seed training
loop's train step (:func:`harness.workloads.make_training` on the seed's
sharded data), its steps from :func:`harness.workloads.steps`: under the
recorder that is ``harness.context().steps(n)``, which is part of what the
recorder costs.  Each process times its own loop from step ``--warmup`` to
the end (start-up, the tracing and the first collectives left out) and
prints the time; a run's figure is the slowest process's time per step.
It prints a markdown table and writes the figures, every run's raw numbers
included, as JSON.  What each figure is: ``docs/benchmark.md``.

Whole runs differ from one another by more than the 1% the recorder may
cost, so ``--probe`` adds one more run under the recorder that switches its
per-step hooks on and off in blocks of steps inside the job
(:mod:`harness.bench.recorder.probe`).

Every process a run starts (and the recorder's watchers) is ended on every
path (:mod:`harness.bench.recorder.job`), and the temporary directory is
removed.
"""
from __future__ import annotations

import argparse
import datetime
import os
import shutil
import signal
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

from harness.bench.common import (log, machine_info, machine_line, on_sigterm, run_and_write,
                                  stats)
from harness.bench.recorder.job import JOB_SCRIPT, WITH, WITHOUT, run_job
from harness.bench.recorder.probe import BLOCK

VARIANTS = (WITHOUT, WITH)          # the first is the reference
DEFAULT_ROUNDS = 5
DEFAULT_WORKERS = 2
DEFAULT_STEPS = 2000
DEFAULT_WARMUP = 20
DEFAULT_RUN_TIMEOUT = 300.0
# -- the plan and the figures (pure) --------------------------------------------------

def schedule(rounds: int) -> List[tuple]:
    """The run order, ``(round, variant)``: A B A B ..."""
    return [(r, name) for r in range(rounds) for name in VARIANTS]


def paired(runs: Sequence[dict], key: str = "ms_per_step", percent: bool = False) -> List[float]:
    """Round by round, ``with`` minus ``without`` (or that in per cent of
    ``without``), over the rounds where both ran ok."""
    by_round: Dict[int, Dict[str, float]] = {}
    for r in runs:
        if r.get("ok") and r.get(key) is not None:
            by_round.setdefault(r["round"], {})[r["variant"]] = r[key]
    out = []
    for _, v in sorted(by_round.items()):
        if WITH in v and WITHOUT in v:
            d = v[WITH] - v[WITHOUT]
            out.append(100.0 * d / v[WITHOUT] if percent else d)
    return out


def summarize(runs: Sequence[dict]) -> dict:
    """``{variant: figures}``, and ``overhead``: the paired differences."""
    out: dict = {}
    for name in VARIANTS:
        mine = [r for r in runs if r["variant"] == name]
        ok = [r for r in mine if r.get("ok")]
        out[name] = {"runs": len(mine), "failed": len(mine) - len(ok)}
        for key in ("ms_per_step", "median_step_ms", "workers_cpu_ms_per_step", "wall_s"):
            out[name][key] = stats([r.get(key) for r in ok])
    out["overhead"] = {"ms_per_step": stats(paired(runs)),
                       "percent": stats(paired(runs, percent=True)),
                       "median_step_percent": stats(paired(runs, "median_step_ms", True)),
                       "workers_cpu_ms_per_step": stats(paired(runs, "workers_cpu_ms_per_step"))}
    return out


# -- the table (pure) --------------------------------------------------------------------

def _num(x: Optional[float], fmt: str = ".3f") -> str:
    return "–" if x is None else format(x, fmt)


def _spread(st: Optional[dict], fmt: str = ".3f") -> str:
    if not st:
        return "–"
    if st["n"] == 1:
        return f"{_num(st['median'], fmt)} (1 run)"
    return f"{_num(st['median'], fmt)} ({_num(st['min'], fmt)} to {_num(st['max'], fmt)})"


TABLE_HEADER = ("| recorder | ms/step, slowest worker (median; min to max) | "
                "median single step, ms | workers' CPU ms/step | runs ok |")
ROUNDS_HEADER = ("| round | without, ms/step | with, ms/step | with − without | overhead | "
                 "machine busy, without / with |")


def render_table(summary: dict) -> str:
    lines = [TABLE_HEADER, "|---|---|---|---|---|"]
    for name in VARIANTS:
        fig = summary[name]
        med, cpu = fig["median_step_ms"], fig["workers_cpu_ms_per_step"]
        lines.append(f"| {name} | {_spread(fig['ms_per_step'])} | "
                     f"{_num(med and med['median'])} | {_num(cpu and cpu['median'], '.2f')} | "
                     f"{fig['runs'] - fig['failed']}/{fig['runs']} |")
    over = summary["overhead"]
    lines += ["", "| overhead, paired by round | median (min to max) |", "|---|---|",
              f"| ms/step | {_spread(over['ms_per_step'], '+.3f')} |",
              f"| per cent of the step | {_spread(over['percent'], '+.2f')} |",
              f"| per cent, median single step | {_spread(over['median_step_percent'], '+.2f')} |",
              f"| workers' CPU ms/step | {_spread(over['workers_cpu_ms_per_step'], '+.2f')} |"]
    return "\n".join(lines)


def _share(run: dict) -> str:
    share = run.get("machine_busy_share")
    return "–" if share is None else f"{100 * share:.0f}%"


def render_rounds(runs: Sequence[dict]) -> str:
    """One line a round: both runs' ms/step and their difference."""
    by_round: Dict[int, Dict[str, dict]] = {}
    for r in runs:
        by_round.setdefault(r["round"], {})[r["variant"]] = r
    lines = [ROUNDS_HEADER, "|---|---|---|---|---|---|"]
    for rnd, v in sorted(by_round.items()):
        a, b = (v.get(n, {}) for n in VARIANTS)
        ms_a = a.get("ms_per_step") if a.get("ok") else None
        ms_b = b.get("ms_per_step") if b.get("ok") else None
        diff = percent = "–"
        if ms_a is not None and ms_b is not None:
            diff = _num(ms_b - ms_a, "+.3f")
            percent = _num(100 * (ms_b - ms_a) / ms_a, "+.2f") + "%"
        lines.append(f"| {rnd} | {_num(ms_a)} | {_num(ms_b)} | {diff} | {percent} | "
                     f"{_share(a)} / {_share(b)} |")
    return "\n".join(lines)


HOOK_NAMES = {"ledger": "ledger hook on the step's `tf.function` call (less the call)",
              "step_boundary": "`ctx.steps()`'s step boundary"}
PROBE_NAMES = {"mwms-recorder": "watchdog thread", "mwms-names": "name-lookup thread",
               "watcher": "watcher process (10 ms ticks)"}


def render_probe(run: dict) -> str:
    """The probed run: the hooks' cost from its pairs of blocks, and the
    recorder's threads' and watcher's CPU."""
    fig, ms = run.get("probe_figures"), run.get("ms_per_step")
    if not fig or not ms:
        return "(the probed run gave no figures)"
    pct = stats(fig["pairs_percent"])
    if pct is None:
        return "(the probed run gave no pair of blocks)"
    lines = [f"| probed run, {ms:.3f} ms/step | per step | share of the step |",
             "|---|---|---|",
             f"| per-step hooks (ledger, `ctx.steps()`), on minus off, {fig['pairs']} pairs "
             f"of {fig['block']}-step blocks: median (quartiles) | – | "
             f"{pct['median']:+.2f}% ({pct['q1']:+.2f}% to {pct['q3']:+.2f}%) |"]
    share = lambda us: f"{100 * us / (1000 * ms):.2f}%"     # noqa: E731
    main = stats(fig.get("pairs_main_cpu_us") or [])
    if main:
        lines.append(f"| the same pairs, main thread's CPU a step, on minus off: median "
                     f"(quartiles) | {main['median']:+.1f} µs ({main['q1']:+.1f} to "
                     f"{main['q3']:+.1f}) | {share(main['median'])} |")
    for name, us in fig.get("hook_cpu_us_per_call", {}).items():
        lines.append(f"| {HOOK_NAMES.get(name, name)}, main thread's CPU a call: median "
                     f"(mean) | {us['median']:.1f} µs ({us['mean']:.1f}) | "
                     f"{share(us['median'])} ({share(us['mean'])}) |")
    for name, us in fig["cpu_us_per_step"].items():
        lines.append(f"| {PROBE_NAMES.get(name, name)}, CPU | {us:.1f} µs | {share(us)} |")
    return "\n".join(lines)


def render_notes(settings: dict) -> str:
    n, steps, warmup = settings["workers"], settings["steps"], settings["warmup"]
    return "\n".join([
        f"- {n} plain `python` processes a job, each with its own `TF_CONFIG`; the seed "
        f"loop's train step (`make_training`, 784-10-10, Adam, global batch 64) for "
        f"{warmup} + {steps} steps; {settings['rounds']} rounds, `without` then `with` "
        "`harness record --dir DIR` (default `--timeout`) in each.",
        f"- ms/step: each process's `time.perf_counter()` around its steps {warmup} to "
        f"{warmup + steps - 1}, divided by {steps}; the slowest process's.  Median single "
        "step: each process's median step, the slowest process's.",
        "- overhead: per round, `with` minus `without`; the median over the rounds "
        "(and the spread).",
        *([f"- probed run: one more job under the recorder, {settings['probe_steps']} timed "
           f"steps in blocks of {BLOCK}, its per-step hooks on in one block and off in the "
           "next (pairs on-off, off-on); a pair's difference in per cent of its off-block; "
           "the hooks' CPU timed a call at a time while on; the recorder's threads' and "
           "watcher's CPU over the loop, per step."] if settings.get("probe") else []),
        f"- machine busy: the share of all {settings['cores']} cores busy over the run "
        "(`/proc/stat`, the job itself and its start-up included); a round whose two "
        "shares differ much had another process competing in one run only.",
    ])


# -- the benchmark ------------------------------------------------------------------------

def _describe(r: dict) -> str:
    if not r.get("ok"):
        return f"{r['outcome']} [NOT OK]"
    return (f"{r['ms_per_step']:.3f} ms/step (workers "
            + ", ".join(f"{x:.3f}" for x in r["ms_per_step_workers"])
            + f"), median step {r['median_step_ms']:.3f} ms, wall {r['wall_s']:.1f} s ("
            + ", ".join(f"{k} {v:.1f}" for k, v in (r.get("phases_s") or {}).items())
            + f"), machine busy {_share(r)}")


def run_all(tmp: str, args: argparse.Namespace) -> tuple:
    """The alternating runs, and the probed run (None without ``--probe``)."""
    script = os.path.join(tmp, "train.py")
    with open(script, "w") as f:
        f.write(JOB_SCRIPT)
    runs: List[dict] = []
    plan = [(rnd, variant, False) for rnd, variant in schedule(args.rounds)]
    plan += [(-1, WITH, True)] if args.probe else []
    for i, (rnd, variant, probe) in enumerate(plan, 1):
        folder = os.path.join(tmp, f"run{i}")
        os.makedirs(folder)
        r = run_job(folder, script, variant, args, probe)
        r["round"] = rnd
        runs.append(r)
        log(f"[{i}/{len(plan)}] {'probe' if probe else f'round {rnd}'} {variant}: "
            f"{_describe(r)}")
        if not r["ok"]:
            log(r.get("error", "")[-3000:])
        shutil.rmtree(folder, ignore_errors=True)
    return (runs[:-1], runs[-1]) if args.probe else (runs, None)


def run_bench(args: argparse.Namespace) -> dict:
    machine = machine_info()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    tmp = tempfile.mkdtemp(prefix="mwms-record-cost-")
    old_term = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        runs, probed = run_all(tmp, args)
    finally:
        signal.signal(signal.SIGTERM, old_term)
        shutil.rmtree(tmp, ignore_errors=True)
    machine["load_avg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    settings = {"workers": args.workers, "steps": args.steps, "warmup": args.warmup,
                "probe": args.probe, "probe_steps": args.probe_steps,
                "rounds": args.rounds, "run_timeout": args.run_timeout,
                "cores": os.cpu_count()}
    summary = summarize(runs)
    markdown = (machine_line(machine) + "\n\n" + render_table(summary) + "\n\n"
                + render_rounds(runs) + "\n\n"
                + (render_probe(probed) + "\n\n" if probed else "")
                + render_notes(settings) + "\n")
    return {"machine": machine, "settings": settings, "variants": list(VARIANTS),
            "started": started,
            "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "summary": summary, "runs": runs, "probe": probed, "markdown": markdown}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m harness.bench.recorder.cost",
        description="What `harness record` costs a training step: the seed loop's train "
                    "step as a job of plain processes, with and without the recorder, "
                    "alternating, timed inside the processes.")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                   help=f"rounds; each runs the job without, then with the recorder "
                        f"({DEFAULT_ROUNDS})")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                   help=f"processes in the job ({DEFAULT_WORKERS})")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                   help=f"timed steps per run, after the warm-up ({DEFAULT_STEPS})")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP,
                   help=f"steps before the timing starts ({DEFAULT_WARMUP})")
    p.add_argument("--run-timeout", type=float, default=DEFAULT_RUN_TIMEOUT,
                   help=f"seconds a run may take before it is killed ({DEFAULT_RUN_TIMEOUT:g})")
    p.add_argument("--probe", action="store_true",
                   help="then one more run with the recorder, its per-step hooks switched "
                        "on and off in blocks of steps inside it "
                        "(harness.bench.recorder.probe)")
    p.add_argument("--probe-steps", type=int, default=None,
                   help="timed steps of the probed run (default: --steps)")
    p.add_argument("--out", default="record-cost-results.json", help="where to write the JSON")
    p.add_argument("--markdown", default=None, help="also write the machine line and tables here")
    args = p.parse_args(argv)
    for name in ("rounds", "workers", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.probe_steps is None:
        args.probe_steps = args.steps
    if args.probe_steps < 2 * BLOCK:
        p.error(f"--probe-steps must be at least {2 * BLOCK} (a pair of blocks)")
    if args.warmup < 0:
        p.error("--warmup must be 0 or more")
    if args.run_timeout <= 0:
        p.error("--run-timeout must be greater than 0")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)

    def ok(results: dict) -> bool:
        runs = results["runs"] + ([results["probe"]] if results["probe"] else [])
        return all(r.get("ok") for r in runs)
    return run_and_write(lambda: run_bench(args), args.out, args.markdown, ok)


if __name__ == "__main__":
    sys.exit(main())
