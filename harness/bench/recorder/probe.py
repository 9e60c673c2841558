"""The probed run of ``python -m harness.bench.recorder.cost --probe``: the
recorder's per-step hooks switched on and off inside one recorded job.

Whole runs with and without the recorder differ by more than 1% from run
to run on a shared machine, so a cost below that is lost in their noise.
Here one job under ``harness record`` runs its timed steps in blocks, the
two hooks a step goes through on in one block and off in the next (the
ledger's ``tf.function`` call hook, :mod:`harness.worker.ledger`, and the
step boundary ``ctx.steps()`` reports): every process switches at the same
step, and pairs alternate on-off, off-on, so drift within a pair cancels.
A pair's difference is what the hooks cost, seconds apart rather than runs
apart.  While on, each hook's CPU time on the main thread is timed too
(``time.thread_time()``, a call at a time).  The recorder's threads
(``mwms-*``: the watchdog) and its watcher process run all along: their
CPU time over the loop is read from their clocks instead.

Imported in the job's process (by the script
:mod:`harness.bench.recorder.cost` writes), after ``harness record`` has
installed the recorder.
"""
from __future__ import annotations

import contextlib
import inspect
import json
import os
import threading
import time
from typing import Callable, Dict, List, Optional

BLOCK = 25      # steps a block: a few tenths of a second of the seed loop


class HookSwitch:
    """Turns this process's per-step recorder hooks on and off, and times
    the main thread's CPU in each while on (``cpu_s``: seconds a call, the
    ledger's less the call of the ``tf.function`` itself; the timer's own
    clock reads count in)."""

    def __init__(self) -> None:
        from tensorflow.python.eager.polymorphic_function import polymorphic_function
        from harness import context
        from harness.worker.context import WorkerContext
        from harness.worker.ledger import Ledger
        self.cls = polymorphic_function.Function
        self.hooked = self.cls.__call__
        if not getattr(self.hooked, "_mwms_ledger", False):
            raise RuntimeError("the recorder's ledger hook is not installed in this process")
        self.original = inspect.getclosurevars(self.hooked).nonlocals["original_call"]
        self.ctx = context()
        self.ctx.explicit_steps = True      # as ctx.steps() sets it
        self.on = True
        self.cpu_s: Dict[str, List[float]] = {"ledger": [], "step_boundary": []}
        # Timed in place: this process is the probe's alone.
        Ledger.call = self._timed_ledger(Ledger.call)  # type: ignore[method-assign]
        WorkerContext.step_boundary = self._timed_boundary(  # type: ignore[method-assign]
            WorkerContext.step_boundary)

    def _timed_ledger(self, call):
        spent = self.cpu_s["ledger"]

        def timed(ledger, function, inner, args, kwargs):
            inside = [0.0]

            def timed_inner(*a, **k):
                c = time.thread_time()
                try:
                    return inner(*a, **k)
                finally:
                    inside[0] += time.thread_time() - c
            c = time.thread_time()
            try:
                return call(ledger, function, timed_inner, args, kwargs)
            finally:
                spent.append(time.thread_time() - c - inside[0])
        return timed

    def _timed_boundary(self, boundary):
        spent = self.cpu_s["step_boundary"]

        def timed(ctx, step):
            c = time.thread_time()
            try:
                return boundary(ctx, step)
            finally:
                spent.append(time.thread_time() - c)
        return timed

    def set(self, on: bool) -> None:
        self.on = on
        self.cls.__call__ = self.hooked if on else self.original

    def boundary(self, step: int) -> None:
        if self.on:
            self.ctx.step_boundary(step)


def _ticks_s(pid: int) -> Optional[float]:
    """CPU seconds (user + system) of process ``pid``, from ``/proc`` (10 ms ticks)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _watcher_pid() -> Optional[int]:
    """The recorder's watcher: the child of this process that runs
    ``harness.record.watcher`` (the recorder gives no public handle on it)."""
    import psutil
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if "harness.record.watcher" in child.cmdline():
                return child.pid
    return None


def recorder_clocks() -> Dict[str, float]:
    """CPU seconds so far of the recorder's threads and of its watcher."""
    out = {}
    for t in threading.enumerate():
        if t.name.startswith("mwms-") and t.ident is not None:
            out[t.name] = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
    watcher = _watcher_pid()
    seconds = None if watcher is None else _ticks_s(watcher)
    if seconds is not None:
        out["watcher"] = seconds
    return out


def block_order(pairs: int) -> List[bool]:
    """Hooks on (True) or off, block by block: on-off, off-on, on-off, ..."""
    out: List[bool] = []
    for i in range(pairs):
        out += [True, False] if i % 2 == 0 else [False, True]
    return out


def probed_loop(step: Callable, iterator, warmup: int, n_steps: int,
                block: int = BLOCK) -> dict:
    """``warmup`` steps with the hooks on, then ``n_steps`` (rounded down to
    whole pairs of blocks) in blocks; returns the job script's result, with
    ``probe``: each block's seconds, on or off, and the recorder's clocks."""
    switch = HookSwitch()
    for k in range(warmup):
        switch.boundary(k)
        float(step(next(iterator)))
    for times in switch.cpu_s.values():
        times.clear()
    order = block_order(max(1, n_steps // (2 * block)))
    blocks, k = [], warmup
    clocks0, cpu0, t0 = recorder_clocks(), time.process_time(), time.perf_counter()
    blocks_cpu: List[float] = []
    for on in order:
        switch.set(on)
        t, c = time.perf_counter(), time.thread_time()
        for _ in range(block):
            switch.boundary(k)
            float(step(next(iterator)))
            k += 1
        blocks.append(time.perf_counter() - t)
        blocks_cpu.append(time.thread_time() - c)
    timed_s, cpu_s, clocks = time.perf_counter() - t0, time.process_time() - cpu0, recorder_clocks()
    switch.set(True)
    hook_cpu = {name: {"median": sorted(v)[len(v) // 2], "mean": sum(v) / len(v),
                       "calls": len(v)} for name, v in switch.cpu_s.items() if v}
    return {"index": json.loads(os.environ["TF_CONFIG"])["task"]["index"], "pid": os.getpid(),
            "timed_s": timed_s, "cpu_s": cpu_s, "steps": len(order) * block,
            "median_step_s": sorted(blocks)[len(blocks) // 2] / block,
            "probe": {"block": block, "on": order, "block_s": blocks,
                      "block_cpu_s": blocks_cpu, "hook_cpu_s": hook_cpu,
                      "cpu_s": {name: clocks[name] - v for name, v in clocks0.items()
                                if name in clocks}}}


def _pairs(order: List[bool], values: List[float]) -> List[tuple]:
    """``(on, off)`` values of each pair of blocks."""
    return [(values[i], values[i + 1]) if order[i] else (values[i + 1], values[i])
            for i in range(0, len(order) - 1, 2)]


def probe_figures(rows: List[dict]) -> Optional[dict]:
    """The probed run's figures: per pair of blocks, the slowest process's
    on-block minus its off-block, in per cent of the off-block; and the
    recorder's threads' and watcher's CPU in microseconds a step (the most
    of any process).  None unless every process probed alike."""
    probes = [r["probe"] for r in rows if r.get("probe")]
    if not probes or len(probes) != len(rows) or len({len(p["block_s"]) for p in probes}) != 1:
        return None
    order, block = probes[0]["on"], probes[0]["block"]
    slowest = [max(p["block_s"][i] for p in probes) for i in range(len(order))]
    percent = [100.0 * (on - off) / off for on, off in _pairs(order, slowest)]
    steps = len(order) * block
    # The main thread's CPU, on-block minus off-block, µs a step, pair by
    # pair: the mean over the processes.
    main_cpu = []
    if all(p.get("block_cpu_s") for p in probes):
        per_process = [[1e6 * (on - off) / block for on, off in _pairs(order, p["block_cpu_s"])]
                       for p in probes]
        main_cpu = [sum(d) / len(d) for d in zip(*per_process)]
    cpu: Dict[str, float] = {}
    for p in probes:
        for name, seconds in p["cpu_s"].items():
            cpu[name] = max(cpu.get(name, 0.0), 1e6 * seconds / steps)
    hooks: Dict[str, Dict[str, float]] = {}
    for p in probes:
        for name, fig in p.get("hook_cpu_s", {}).items():
            mine = hooks.setdefault(name, {"median": 0.0, "mean": 0.0})
            for key in mine:
                mine[key] = max(mine[key], 1e6 * fig[key])
    return {"pairs_percent": percent, "pairs_main_cpu_us": main_cpu,
            "block": block, "pairs": len(percent),
            "cpu_us_per_step": cpu, "hook_cpu_us_per_call": hooks}
