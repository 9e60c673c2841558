"""``python -m harness.bench``: the harness against the other ways to launch MWMS workers.

The same workloads (functions of :mod:`harness.workloads`, measured by
:mod:`harness.bench.workers`) run under three launchers
(:mod:`harness.bench.launchers`: the harness, a fresh ``python`` per worker,
TensorFlow's ``multi_process_runner``), alternating run by run so that drift
on a shared machine hits all alike.  It prints a markdown table (ratios
against the harness) and writes the figures, with every run's raw numbers,
as JSON.  What each launcher, workload and figure is: ``docs/benchmark.md``.

This subpackage is a development tool, not part of the installed plugin.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence

ALL_LAUNCHERS = ("floor", "harness", "spawn", "runner", "ray")
ALL_WORKLOADS = (1, 2, 3, 4, 5)
# The workloads that hang: 4's skipper lingers, so only the hang timer can
# tell; 5's returns, so the ledgers prove the deadlock at once.
HANG_WORKLOADS = (4, 5)
MIB = float(1 << 20)


@dataclasses.dataclass(frozen=True)
class Workload:
    """One benchmark workload: which function, on how many workers, with what."""

    number: int
    title: str
    fn: str                     # a key of harness.bench.workers.WORKLOAD_FNS
    workers: int
    kwargs: dict
    skip: Optional[tuple] = None  # (worker, step) that worker leaves out
    hang_timeout: float = 10.0
    linger: bool = True           # the skipping worker stays after its loop

    @property
    def expect_hang(self) -> bool:
        return self.skip is not None


def make_workloads(hang_timeout: float = 10.0) -> Dict[int, Workload]:
    return {
        1: Workload(1, "2 workers, 20 all-reduce steps", "allreduce", 2, {"n_steps": 20}),
        2: Workload(2, "4 workers, 20 all-reduce steps", "allreduce", 4, {"n_steps": 20}),
        3: Workload(3, "seed training loop, 2 workers, 100 steps", "seed_training", 2,
                    {"epochs": 10, "steps_per_epoch": 10}),
        4: Workload(4, f"2 workers, worker 1 skips step 5 (T={hang_timeout:g} s)", "allreduce", 2,
                    {"n_steps": 20}, skip=(1, 5), hang_timeout=hang_timeout),
        5: Workload(5, f"2 workers, worker 1 skips step 5 and returns (T={hang_timeout:g} s)",
                    "allreduce", 2, {"n_steps": 20}, skip=(1, 5), hang_timeout=hang_timeout,
                    linger=False),
    }


# -- statistics and formatting (pure) ------------------------------------------

def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of already sorted values (numpy's default)."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def stats(values: Sequence[Optional[float]]) -> Optional[dict]:
    """Median, min, max and quartiles of the values that are not None."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    return {"n": len(v), "median": quantile(v, 0.5), "min": v[0], "max": v[-1],
            "q1": quantile(v, 0.25), "q3": quantile(v, 0.75)}


def ratio(value: Optional[float], reference: Optional[float]) -> Optional[float]:
    if value is None or not reference:
        return None
    return value / reference


def fmt_seconds(s: Optional[float]) -> str:
    if s is None:
        return "–"
    return f"{s:.2f} s" if s < 100 else f"{s:.0f} s"


def fmt_spread(st: Optional[dict]) -> str:
    if not st:
        return "–"
    if st["n"] == 1:
        return "(1 run)"
    return f"{st['min']:.2f}–{st['max']:.2f} s"


def fmt_ratio(r: Optional[float]) -> str:
    if r is None:
        return "–"
    return f"{r:.1f}×" if r < 100 else f"{r:.0f}×"


def fmt_mib(b: Optional[float]) -> str:
    return "–" if b is None else f"{b:.0f}"


def fmt_over_t(x: Optional[float], seen: bool = True) -> str:
    """A detection time past T as ``T + 0.05 s`` (or ``T − 1.20 s``)."""
    if not seen:
        return "before the hang began"
    if x is None:
        return "–"
    sign = "+" if x >= 0 else "−"
    return f"T {sign} {abs(x):.2f} s"


def fmt_culprits(per_run: Sequence[Optional[Sequence[int]]], expected: int) -> str:
    """Whom the reports blamed, over the runs: ``yes (worker 1)`` when every
    run named exactly the worker at fault, ``ambiguous (workers 0,1)`` when it
    was among several named, ``no`` when nobody was named."""
    runs = [tuple(sorted(c)) for c in per_run if c is not None]
    if not runs:
        return "–"
    if all(c == (expected,) for c in runs):
        return f"yes (worker {expected})"
    if all(expected in c for c in runs) and len(set(runs)) == 1:
        return f"ambiguous (workers {','.join(map(str, runs[0]))})"
    if not any(runs):
        return "no"
    exact = sum(1 for c in runs if c == (expected,))
    among = sum(1 for c in runs if expected in c and c != (expected,))
    return f"exact {exact}/{len(runs)}, among several {among}/{len(runs)}"


def fmt_bool_runs(values: Sequence[Optional[bool]]) -> str:
    """``yes``/``no`` when all runs agree, else ``2/3``."""
    v = [x for x in values if x is not None]
    if not v:
        return "–"
    if all(v):
        return "yes"
    if not any(v):
        return "no"
    return f"{sum(v)}/{len(v)}"


# -- summary and table (pure) ---------------------------------------------------

def summarize(runs: List[dict], launchers: Sequence[str], workloads: Sequence[int]) -> dict:
    """``{launcher: {str(workload): figures}}`` from the raw runs.

    Warm figures come from the ok, non-cold runs; a launcher's cold run is
    reported as ``cold_s`` under the workload it ran.
    """
    out: dict = {}
    for name in launchers:
        out[name] = {}
        for w in workloads:
            mine = [r for r in runs if r["launcher"] == name and r["workload"] == w]
            warm = [r for r in mine if not r.get("cold") and r.get("ok")]
            cold = [r for r in mine if r.get("cold")]
            if not mine:
                continue
            fig = {
                "runs": len([r for r in mine if not r.get("cold")]),
                "failed": len([r for r in mine if not r.get("ok")]),
                "wall": stats([r.get("wall_s") for r in warm]),
                "cold_s": cold[0].get("wall_s") if cold else None,
                "cold_ok": cold[0].get("ok") if cold else None,
            }
            # Time inside the workload function (slowest worker): the same work
            # under every launcher; wall minus this is the launcher's own cost.
            fig["fn"] = stats([r.get("fn_s") for r in warm])
            pss = stats([r["pss_bytes"] / MIB for r in warm if r.get("pss_bytes")])
            fig["pss_mib"] = pss["median"] if pss else None
            if any("gone_after_report_s" in r for r in mine):
                fig["detection_over_T"] = stats([r.get("detection_over_T_s") for r in warm])
                fig["report_after_hang"] = stats([r.get("report_after_hang_s") for r in warm])
                fig["hang_start_seen"] = [r.get("hang_start_seen") for r in warm]
                fig["named_culprit"] = [r.get("named_culprit") for r in warm]
                fig["culprits"] = [r.get("culprits") for r in warm]
                fig["stack_dumped"] = [r.get("stack_dumped") for r in warm]
                fig["gone_after_report"] = stats([r.get("gone_after_report_s") for r in warm])
                fig["gone_never"] = len([r for r in warm if r.get("gone_after_report_s") is None])
                delays = [r.get("detection_delay_s") for r in warm if "detection_delay_s" in r]
                if delays:
                    fig["detection_delay"] = stats(delays)
            out[name][str(w)] = fig
    for name in launchers:
        for w, fig in out[name].items():
            ref = out.get("harness", {}).get(w, {}).get("wall")
            mine = fig.get("wall")
            fig["ratio_vs_harness"] = ratio(mine and mine["median"], ref and ref["median"])
            ref_cold = out.get("harness", {}).get(w, {}).get("cold_s")
            fig["cold_ratio_vs_harness"] = ratio(fig.get("cold_s"), ref_cold)
    return out


TABLE_HEADER = ("| launcher | workload | median | spread (min–max) | vs harness | cold | "
                "workers' PSS MiB | hang reported | culprit named | stack | gone after report |")


def render_table(summary: dict, workloads: Dict[int, Workload]) -> str:
    lines = [TABLE_HEADER, "|" + "---|" * TABLE_HEADER.count(" | ") + "---|"]
    numbers = sorted({int(w) for per in summary.values() for w in per})
    for w in numbers:
        for name, per in summary.items():
            fig = per.get(str(w))
            if fig is None:
                continue
            wall = fig.get("wall")
            wl = workloads.get(w)
            title = f"{w}: {wl.title}" if wl else str(w)
            if fig["failed"]:
                title += f" ({fig['failed']} failed)"
            if "gone_after_report" in fig:
                seen_runs = fig["hang_start_seen"]
                seen = any(seen_runs)
                det = fig.get("detection_over_T")
                gone = fig.get("gone_after_report")
                gone_txt = fmt_seconds(gone and gone["max"]) + (" (max)" if gone and gone["n"] > 1 else "")
                if fig.get("gone_never"):
                    gone_txt = f"{fig['gone_never']} run(s) left workers alive"
                hang_txt = fmt_over_t(det and det["median"], seen)
                if seen and not all(seen_runs):
                    hang_txt += (f" ({len(seen_runs) - sum(map(bool, seen_runs))}/{len(seen_runs)}"
                                 f" before the hang began)")
                delay = fig.get("detection_delay")
                if delay:
                    # The harness's own figure: declared this long past T after
                    # the last progress it saw.
                    hang_txt += f" (declared T + {delay['median']:.2f} s)"
                hang = (hang_txt,
                        fmt_culprits(fig["culprits"], wl.skip[0] if wl and wl.skip else 1),
                        fmt_bool_runs(fig["stack_dumped"]),
                        gone_txt)
            else:
                hang = ("", "", "", "")
            cells = (name, title, fmt_seconds(wall and wall["median"]), fmt_spread(wall),
                     fmt_ratio(fig.get("ratio_vs_harness")), fmt_seconds(fig.get("cold_s")),
                     fmt_mib(fig.get("pss_mib"))) + hang
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


NOTES = {
    "floor": "floor: a bare fork server that imported TensorFlow forks the workers; each sets "
             "its `TF_CONFIG`, runs the workload and sends back its value (no progress, "
             "monitoring, diagnosis or clean-up guarantee: the least a warm launcher costs; "
             "completing workloads only).",
    "harness": "harness: `Cluster.run` in the benchmark's process; workers forked from a "
               "forkserver that imported TensorFlow once (its first run is the cold one).",
    "spawn": "spawn: a fresh `python -c` per worker, each importing TensorFlow. No progress "
             "channel: a hang can only be caught by a whole-run timeout of T counted from launch, "
             "which cannot tell a hang from a slow start (it may fire before the hang begins, and "
             "would kill a healthy run slower than T); it names nobody and dumps no stack.",
    "runner": "runner: `tf.__internal__.distribute.multi_process_runner.run` from a generated "
              "`test_main()` script kept running (its forkserver warm). Its parent polls once a "
              "second; on a timeout it sends SIGTERM, waits 30 s for stacks, then SIGKILLs.",
    "ray": "ray: the same `Cluster.run` with `--mwms-backend=ray` on a local Ray cluster of 2 "
           "simulated nodes, one agent per node forking the workers from its own forkserver; "
           "the cluster and its agents start before the first run (the start-up below), the "
           "forkservers' TensorFlow import overlapping it, so its first run is already warm.",
}


def render_notes(summary: dict, extra: dict) -> str:
    out = [f"- {NOTES[name]}" for name in summary if name in NOTES]
    out.append("- median/spread: warm runs only; workloads 4 and 5's are launch to report. "
               "hang reported: from the moment the hang began (the skipping worker's loop end). "
               "PSS: summed over the workers, each measured as its loop ends "
               "(forkserver/runner-process share not included: "
               + ", ".join(f"{k} {fmt_mib(v)} MiB" for k, v in extra.get("overhead_pss_mib", {}).items())
               + ").")
    if extra.get("launcher_startup_s"):
        out.append("- start-up before the first run, not in 'cold': " + ", ".join(
            f"{k} {fmt_seconds(v)}" for k, v in extra["launcher_startup_s"].items()) + ".")
    return "\n".join(out)


# -- the machine ----------------------------------------------------------------

def _version(dist: str) -> Optional[str]:
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict:
    """Cores, RAM, CPU model, load, Python and TensorFlow versions, without
    importing TensorFlow into this process."""
    cpu_model = None
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    ram = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    ram = int(line.split()[1]) * 1024
                    break
    return {
        "cores": os.cpu_count(),
        "ram_gib": None if ram is None else round(ram / (1 << 30), 1),
        "cpu_model": cpu_model or platform.processor() or "unknown",
        "python": platform.python_version(),
        "tensorflow": _version("tensorflow") or _version("tensorflow-cpu"),
        "keras": _version("keras"),
        "platform": platform.platform(),
        "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def machine_line(m: dict) -> str:
    load, end = m.get("load_avg"), m.get("load_avg_end")
    load_txt = f", 1-min load {load[0]:.1f} at start" if load else ""
    if load and end:
        load_txt += f", {end[0]:.1f} at end"
    return (f"Machine: {m['cores']} cores, {m['ram_gib']} GiB RAM, {m['cpu_model']}; "
            f"Python {m['python']}, TensorFlow {m['tensorflow']}, Keras {m['keras']}{load_txt}.")


# -- running ----------------------------------------------------------------------

def schedule(launchers: Sequence[str], workloads: Sequence[int], repeats: int,
             hang_repeats: int) -> List[tuple]:
    """The run order: ``(launcher, workload, repeat, cold)`` tuples.

    One cold run per launcher first, then rounds in which each workload runs
    under every launcher in turn (A B C A B C ...), so drift hits all alike.
    The hanging workloads run only in the first ``hang_repeats`` rounds.
    """
    completing = [w for w in workloads if w not in HANG_WORKLOADS]
    cold_workload = completing[0] if completing else 1
    plan = [(name, cold_workload, -1, True) for name in launchers]
    for rep in range(repeats):
        for w in workloads:
            if w in HANG_WORKLOADS and rep >= hang_repeats:
                continue
            # The floor cannot tell a hang: it runs the completing workloads only.
            plan.extend((name, w, rep, False) for name in launchers
                        if not (name == "floor" and w in HANG_WORKLOADS))
    return plan


def parse_list(text: str, allowed: Sequence, kind=str) -> list:
    items = [kind(x.strip()) for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise argparse.ArgumentTypeError(
            f"{text!r}: choose from {', '.join(str(a) for a in allowed)}")
    return list(dict.fromkeys(items))


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


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


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


def on_sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


def run_bench(args: argparse.Namespace) -> dict:
    from .launchers import LAUNCHERS
    workloads = make_workloads(args.hang_timeout)
    machine = machine_info()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    runs: List[dict] = []
    launchers: Dict[str, object] = {}
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
             "launcher_startup_s": {k: v for k, v in startup.items() if k in ("runner", "ray")}}
    machine["load_avg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    table = render_table(summary, workloads)
    markdown = machine_line(machine) + "\n\n" + table + "\n\n" + render_notes(summary, extra) + "\n"
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


def write_results(results: dict, json_path: str, markdown_path: Optional[str]) -> None:
    """Print the table; write the figures as JSON (and the table, if asked)."""
    print(results["markdown"])
    with open(json_path, "w") as f:
        json.dump(results, f, indent=1, default=str)
    log(f"figures written to {os.path.abspath(json_path)}")
    if markdown_path:
        with open(markdown_path, "w") as f:
            f.write(results["markdown"])


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        results = run_bench(args)
    except KeyboardInterrupt:
        # run_bench has already stopped every launcher and all they started.
        log("interrupted; nothing written")
        return 130
    write_results(results, args.json, args.markdown)
    return 0 if all(r.get("ok") for r in results["runs"]) and not results["launcher_errors"] else 1


def alternate(variants: Dict[str, Callable[[], object]], rounds: int,
              reference: str) -> dict:
    """Call each of ``variants`` once a round, in turn, for ``rounds`` rounds,
    timing each call; return each variant's :func:`stats` of wall seconds,
    and ``"paired NAME"``: its difference from ``reference``, round by round
    (alternating, so drift on a shared machine hits all alike)."""
    walls: Dict[str, List[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, call in variants.items():
            t = time.monotonic()
            call()
            walls[name].append(time.monotonic() - t)
    fig: dict = {name: stats(w) for name, w in walls.items()}
    for name in variants:
        if name != reference:
            fig["paired " + name] = stats([b - a for a, b in zip(walls[reference], walls[name])])
    return fig


def render_walls(fig: dict, names: Sequence[str], label: str) -> str:
    """:func:`alternate`'s figures as a markdown table, in milliseconds."""
    ms = lambda x: f"{1000 * x:.0f}"   # noqa: E731
    rows = [f"| {label} | wall per run, ms (median; min-max) | minus {names[0]}, paired "
            f"(median; min-max) |", "|---|---|---|"]
    for name in names:
        st, p = fig[name], fig.get("paired " + name)
        rows.append(f"| {name} | {ms(st['median'])}; {ms(st['min'])}-{ms(st['max'])} | "
                    + (f"{ms(p['median'])}; {ms(p['min'])}-{ms(p['max'])} |" if p else "– |"))
    return "\n".join(rows)


def wall_benchmark_main(doc: str, measure: Callable[[int, int], dict],
                        render: Callable[[dict], str], argv=None) -> None:
    """The command line of a wall-time benchmark: ``--rounds``, ``--workers``,
    then the machine's line and ``render(measure(rounds, workers))``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    print(machine_line(machine_info()), flush=True)
    print(render(measure(args.rounds, args.workers)))
