"""What every program of the benchmark shares: statistics, the machine it
ran on, and a program's plumbing (its log, SIGTERM, list options, results).

Not a program.  It imports no TensorFlow and nothing of the benchmark, so
every module of ``harness.bench`` may import it, on either side of a run
(:func:`worker_index` is the workers').
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
from typing import Callable, Optional, Sequence

from harness import NotInWorkerError, context


# -- statistics (pure) ----------------------------------------------------------

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
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    ram = None
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as f:
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


def machine_busy_seconds() -> Optional[float]:
    """CPU seconds the whole machine has been busy since boot, all cores
    (``/proc/stat``: every field but idle and iowait), None where unreadable."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None
    busy = sum(fields[:8]) - fields[3] - fields[4]  # user..steal, less idle, iowait
    return busy / ticks


# -- a program's plumbing ---------------------------------------------------------

def parse_list(text: str, allowed: Sequence, kind=str) -> list:
    items = [kind(x.strip()) for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise argparse.ArgumentTypeError(
            f"{text!r}: choose from {', '.join(str(a) for a in allowed)}")
    return list(dict.fromkeys(items))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def on_sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


def run_and_write(run_bench: Callable[[], dict], json_path: str, markdown_path: Optional[str],
                  ok: Callable[[dict], bool]) -> int:
    """A program's end: run it, write its results, and exit 0 when ``ok``
    says they hold; 130, writing nothing, when interrupted (the program
    has stopped what it started by then)."""
    try:
        results = run_bench()
    except KeyboardInterrupt:
        log("interrupted; nothing written")
        return 130
    write_results(results, json_path, markdown_path)
    return 0 if ok(results) else 1


def write_results(results: dict, json_path: str, markdown_path: Optional[str]) -> None:
    """Print the table; write the figures as JSON (and the table, if asked)."""
    print(results["markdown"])
    with open(json_path, "w") as f:
        json.dump(results, f, indent=1, default=str)
    log(f"figures written to {os.path.abspath(json_path)}")
    if markdown_path:
        with open(markdown_path, "w") as f:
            f.write(results["markdown"])


# -- the worker side -------------------------------------------------------------

def worker_index() -> int:
    """This worker's index: from the harness context, else from ``TF_CONFIG``
    (every launcher sets it)."""
    try:
        return context().index
    except NotInWorkerError:
        return int(json.loads(os.environ["TF_CONFIG"])["task"]["index"])


# -- a generated page's region and its JSON ---------------------------------------

def write_region(path: str, region: str, start: str, end: str) -> bool:
    """Put ``region`` between the markers ``start`` and ``end`` of the page at
    ``path``; True when it changed."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if start not in text or end not in text:
        raise SystemExit(f"{path} has no {start} ... {end} region")
    head, rest = text.split(start, 1)
    new = f"{head}{start}\n{region}\n{end}{rest.split(end, 1)[1]}"
    with open(path, "w", encoding="utf-8") as f:
        f.write(new)
    return new != text


def region_of(text: str, start: str, end: str) -> str:
    """What the page holds between its markers (the newlines next to them excluded)."""
    return text.split(start + "\n", 1)[1].split("\n" + end, 1)[0]


def dump(doc: dict) -> str:
    """The JSON document, one run a line (diffs stay readable)."""
    head = {k: v for k, v in doc.items() if k != "runs"}
    text = json.dumps(head, indent=1, sort_keys=True)
    runs = ",\n".join("  " + json.dumps(r, sort_keys=True) for r in doc["runs"])
    return text[:-2] + ',\n "runs": [\n' + runs + "\n ]\n}\n"


def made_on(doc: dict) -> str:
    """How long a benchmark's runs took and on what: ``12 min 03 s on 2
    cores (1-min load 1.5 at the start, 2.1 at the end)``."""
    m = doc["machine"]
    minutes, seconds = divmod(round(doc["wall_seconds"]), 60)
    load, end = m.get("load_avg"), m.get("load_avg_end")
    load_txt = (f" (1-min load {load[0]:.1f} at the start, {end[0]:.1f} at the end)"
                if load and end else "")
    return f"{minutes} min {seconds:02d} s on {m['cores']} cores{load_txt}"
