"""What every launcher of the comparison reads alike (``docs/benchmark.md``).

A launcher (:mod:`~harness.bench.launchers.floor`,
:mod:`~harness.bench.launchers.cluster`, :mod:`~harness.bench.launchers.spawn`,
:mod:`~harness.bench.launchers.runner`) has ``run(workload, stamp_dir) ->
dict`` (one run, its raw figures), ``overhead_pss()`` and ``close()``
(nothing it started may outlive it).  The workload is a
:class:`harness.bench.launchers.plan.Workload`; ``stamp_dir`` is an empty
directory where the workers leave their pid and loop-end marks
(:mod:`harness.bench.launchers.workers`).  A run's dict always has
``outcome``, ``wall_s`` and ``ok``; the rest is filled in where the
launcher can tell.  Here: those marks read back, the workers' PSS, and a
run's figures from what its workers returned.

Clocks: every time stamp is ``time.monotonic()``, which on Linux is one
clock for all processes of the machine, so a stamp written by a worker (or
by TensorFlow's runner process) compares directly with the benchmark's.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import time
from typing import Dict, Iterable, List, Optional, Protocol, Sequence, Union

import psutil

from harness.bench.launchers.plan import Workload
from harness.core.linux import alive
from harness.launch.local import kill_tree


# How long a completing workload may take before the benchmark gives up on
# it (a safety net only; no figure depends on it).
SAFETY_TIMEOUT = 600.0
# How often the benchmark looks whether a worker pid is gone after a report.
GONE_POLL = 0.005
# How long the benchmark waits for a launcher's workers to disappear after
# it reported a hang before it records "still alive" and kills them itself.
GONE_WAIT = 60.0
# Outside the harness, how long the worker that skipped a step stays alive.
LINGER = 3600.0


class Launcher(Protocol):
    """What the comparison asks of a launcher (this module's docstring)."""

    name: str
    note: str       # its line in the notes under the table

    def run(self, workload: Workload, stamp_dir: str) -> dict: ...

    def overhead_pss(self) -> Optional[int]: ...

    def close(self) -> None: ...


def read_marks(stamp_dir: Optional[str], prefix: str) -> Dict[int, float]:
    """``{worker index: value}`` of the ``<prefix>.<index>`` marks in ``stamp_dir``."""
    out: Dict[int, float] = {}
    if not stamp_dir:
        return out
    try:
        names = os.listdir(stamp_dir)
    except OSError:
        return out
    for name in names:
        if name.startswith(prefix + ".") and not name.endswith(".tmp"):
            try:
                with open(os.path.join(stamp_dir, name)) as f:
                    out[int(name.rsplit(".", 1)[1])] = float(f.read())
            except (OSError, ValueError):
                continue
    return out


def marked_pids(stamp_dir: Optional[str]) -> List[int]:
    """The pids the workers of a run wrote first thing."""
    return [int(p) for p in read_marks(stamp_dir, "pid").values()]


def hang_start(stamp_dir: str) -> Optional[float]:
    """When the hang of workload 4 or 5 began: the skipping worker's loop end (the
    only worker that gets there).  None if no worker got there."""
    ends = read_marks(stamp_dir, "loop_end")
    return min(ends.values()) if ends else None


def wait_gone(pids: List[int], since: float, limit: float = GONE_WAIT) -> Optional[float]:
    """Seconds from ``since`` until none of ``pids`` is alive (zombies count
    as gone), or None if some outlived ``limit``.  Survivors are then killed,
    so a launcher's leftovers never outlive the benchmark."""
    deadline = time.monotonic() + limit
    left = list(pids)
    while True:
        left = [p for p in left if alive(p)]
        if not left:
            return max(0.0, time.monotonic() - since)
        if time.monotonic() > deadline:
            for p in left:
                kill_tree(p)
            return None
        time.sleep(GONE_POLL)


def kill_all(procs: List[subprocess.Popen], wait: bool = False) -> None:
    """SIGKILL every one of ``procs`` still running (and with ``wait``, reap them)."""
    for p in procs:
        with contextlib.suppress(OSError):
            p.kill()
        if wait:
            p.wait()


def pss_of(pids) -> Optional[int]:
    """Summed PSS of ``pids`` (bytes), None if none could be read."""
    total, seen = 0, False
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_full_info().pss
            seen = True
    return total if seen else None


def worker_kwargs(workload: Workload, stamp_dir: str) -> dict:
    """:func:`harness.bench.launchers.workers.measured_run`'s keyword
    arguments.  Under every launcher alike, the skipping worker's own loop
    leaves its step out (a user's ``continue``, no fault injected), then
    lingers or returns."""
    kwargs: Dict[str, object] = {"fn": workload.fn, "kwargs": dict(workload.kwargs),
                                 "stamp_dir": stamp_dir}
    if workload.skip:
        kwargs.update(skip=list(workload.skip), linger=LINGER if workload.linger else 0.0)
    return kwargs


def pss_total(return_values: Iterable[object], num_workers: int) -> Optional[int]:
    """The workers' PSS summed, None unless every worker reported its own."""
    pss = [r.get("pss") for r in return_values if isinstance(r, dict)]
    known = [p for p in pss if p is not None]
    if len(pss) != num_workers or len(known) != len(pss):
        return None
    return int(sum(known))


def fn_seconds(return_values: Iterable[object]) -> Optional[float]:
    """The slowest worker's time inside the workload function, up to its
    loop's end (``fn_s`` of
    :func:`harness.bench.launchers.workers.measured_run`)."""
    times = [t for t in (r.get("fn_s") for r in return_values if isinstance(r, dict))
             if t is not None]
    return max(times) if times else None


def completed_ok(workload: Workload, return_values: Sequence[object]) -> bool:
    """Every worker returned, and for the all-reduce the sum is N."""
    if len(return_values) != workload.workers:
        return False
    if workload.fn == "allreduce":
        return all(isinstance(r, dict) and r.get("value") == float(workload.workers)
                   for r in return_values)
    return all(isinstance(r, dict) and r.get("value") is not None for r in return_values)


def completed_figures(workload: Workload, completed: bool,
                      return_values: Sequence[object]) -> dict:
    """A completing workload's figures: ``ok``, ``pss_bytes`` and ``fn_s``."""
    return {"ok": completed and completed_ok(workload, return_values),
            "pss_bytes": pss_total(return_values, workload.workers),
            "fn_s": fn_seconds(return_values)}


def detection_figures(stamp_dir: str, report_time: float, timeout: float) -> dict:
    """Workloads 4 and 5: when the report came, measured from the hang's start."""
    start = hang_start(stamp_dir)
    out: Dict[str, Union[bool, float]] = {"hang_start_seen": start is not None}
    if start is not None:
        out["report_after_hang_s"] = report_time - start
        out["detection_over_T_s"] = report_time - start - timeout
    return out


def run_timeout(workload: Workload) -> float:
    """T for the hang workload; a safety net for completing ones (whose cold
    run waits for a TensorFlow import before any progress)."""
    return workload.hang_timeout if workload.expect_hang else SAFETY_TIMEOUT
