"""One job of ``python -m harness.bench.recorder.cost``: its script, and
starting, waiting for, ending and reading a run of it.

The job is N plain ``python`` processes, each with its own ``TF_CONFIG`` on
ports reserved for the run (:func:`harness.launch.ports.reserve_ports`),
started as a job's pods would start them: ``python train.py`` or ``python
-m harness record --dir DIR -- train.py``.  Each process prints one result
line (:data:`RESULT_MARK`); :func:`run_job` ends every process of the job
(its process groups, and the recorder's watchers, which run in sessions of
their own) on every path.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, TypedDict

from harness.bench.common import machine_busy_seconds

WITHOUT, WITH = "without", "with"

RESULT_MARK = "RECORD_COST_RESULT "

# The job's script: the seed loop's train step for WARMUP + STEPS steps,
# timed inside the process from step WARMUP on; one result line.
JOB_SCRIPT = '''
import json, os, sys, time
script_start = time.time()
import tensorflow as tf
from harness import workloads


def timed_loop(step, iterator, warmup, n_steps):
    durations = []
    for k in workloads.steps(warmup + n_steps):
        if k == warmup:
            t0, cpu0, loop_start = time.perf_counter(), time.process_time(), time.time()
        t = time.perf_counter()
        float(step(next(iterator)))
        if k >= warmup:
            durations.append(time.perf_counter() - t)
    timed_s, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    durations.sort()
    return {"index": json.loads(os.environ["TF_CONFIG"])["task"]["index"], "pid": os.getpid(),
            "timed_s": timed_s, "cpu_s": cpu_s, "steps": n_steps,
            "median_step_s": durations[len(durations) // 2], "loop_start": loop_start}


warmup, n_steps = int(sys.argv[1]), int(sys.argv[2])
strategy = tf.distribute.MultiWorkerMirroredStrategy()
_, _, step = workloads.make_training(strategy)
x, y = workloads.make_data()
iterator = iter(workloads.distributed_dataset(strategy, x, y))
if os.environ.get("RECORD_COST_PROBE"):
    from harness.bench.recorder.probe import probed_loop
    loop_start = time.time()
    result = dict(probed_loop(step, iterator, warmup, n_steps), loop_start=loop_start)
else:
    result = timed_loop(step, iterator, warmup, n_steps)
result.update(script_start=script_start, loop_end=time.time())
print(os.environ["RECORD_COST_MARK"] + json.dumps(result), flush=True)
'''


# -- a job's results (pure) ----------------------------------------------------------

def parse_result(text: str) -> Optional[dict]:
    """The result line a job process printed, decoded; None without one."""
    for line in reversed(text.splitlines()):
        if line.startswith(RESULT_MARK):
            try:
                return json.loads(line[len(RESULT_MARK):])
            except ValueError:
                return None
    return None


def run_figures(rows: Sequence[Optional[dict]], workers: int) -> Optional[dict]:
    """A run's figures from its processes' results: the slowest process's
    ms per step (loop time / steps), every process's, the slowest median
    single step, and the CPU ms per step summed over the processes.  None
    unless every process printed its result."""
    good = [r for r in rows if isinstance(r, dict) and r.get("timed_s") is not None]
    if len(good) != workers or len(rows) != workers:
        return None
    per_step = [1000.0 * r["timed_s"] / r["steps"] for r in good]
    return {"ms_per_step": max(per_step), "ms_per_step_workers": per_step,
            "median_step_ms": max(1000.0 * r["median_step_s"] for r in good),
            "workers_cpu_ms_per_step": sum(1000.0 * r["cpu_s"] / r["steps"] for r in good)}


def phases(rows: Sequence[dict], launched: float, ended: float) -> Optional[dict]:
    """Where a run's wall time went, in seconds, the slowest process's:
    from launch to its script's first line (the interpreter, and under the
    recorder ``harness record``'s set-up), to the timed loop (TensorFlow's
    import, the strategy, tracing, the warm-up), the loop, and from its end
    to the last process's exit."""
    if not rows or any(r.get("loop_end") is None for r in rows):
        return None
    return {"to_script": max(r["script_start"] for r in rows) - launched,
            "to_loop": max(r["loop_start"] - r["script_start"] for r in rows),
            "loop": max(r["loop_end"] - r["loop_start"] for r in rows),
            "after_loop": ended - max(r["loop_end"] for r in rows)}


# -- running one job --------------------------------------------------------------------

def job_command(variant: str, script: str, record_dir: str, warmup: int, steps: int) -> list:
    args = [script, str(warmup), str(steps)]
    if variant == WITH:
        return [sys.executable, "-m", "harness", "record", "--dir", record_dir, "--"] + args
    return [sys.executable] + args


def job_env(ports: Sequence[int], index: int, probe: bool = False) -> dict:
    import harness
    root = os.path.dirname(os.path.dirname(os.path.abspath(harness.__file__)))
    cluster = [f"127.0.0.1:{p}" for p in ports]
    path = os.pathsep.join(x for x in (root, os.environ.get("PYTHONPATH")) if x)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=path,
               RECORD_COST_MARK=RESULT_MARK, TF_CONFIG=json.dumps(
                   {"cluster": {"worker": cluster}, "task": {"type": "worker", "index": index}}))
    env.pop("RECORD_COST_PROBE", None)
    if probe:
        env["RECORD_COST_PROBE"] = "1"
    return env


def watcher_pids(record_dir: str) -> List[int]:
    """The recorder's watcher processes of this run (their own sessions,
    so outside the job's process groups): their command line names the
    run's record directory."""
    import psutil
    out = []
    for p in psutil.process_iter(["cmdline"]):
        line = " ".join(p.info["cmdline"] or ())
        if "harness.record.watcher" in line and record_dir in line:
            out.append(p.pid)
    return out


def end_job(procs: Sequence[subprocess.Popen], record_dir: str) -> List[int]:
    """Kill what is left of the job's process groups, reap them, and wait
    for (else kill) the recorder's watchers; return the pids that outlived it all."""
    from harness.core.linux import wait_gone
    for p in procs:
        # Only a leader not yet reaped: its pid, so its group's id, is still ours.
        if p.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait()
    watchers = watcher_pids(record_dir)
    for pid in wait_gone(watchers, 5.0):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return wait_gone(watchers, 5.0)


def wait_job(procs: Sequence[subprocess.Popen], timeout: float,
             ended: Optional[Dict[int, float]] = None) -> str:
    """``"completed"`` when every process exited 0; ``"failed"`` as soon as
    one exits otherwise; ``"timeout"`` past ``timeout`` seconds.  ``ended``
    gets each process's index -> when (``time.time()``) it was seen gone."""
    deadline = time.monotonic() + timeout
    ended = {} if ended is None else ended
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        for i, c in enumerate(codes):
            if c is not None:
                ended.setdefault(i, time.time())
        if any(c not in (None, 0) for c in codes):
            return "failed"
        if all(c == 0 for c in codes):
            return "completed"
        time.sleep(0.05)
    return "timeout"


class TaskEvidence(TypedDict):
    """What the recorder left of one task of a ``with`` run."""

    task: list          # [type, index]
    steps: int          # the steps it recorded
    calls: int          # the calls of the train step it recorded
    ledger_off: bool    # it said 'ledger off': the recorder on but blind


def recorder_evidence(record_dir: str, total_steps: Optional[int]) -> dict:
    """What the recorder left of a ``with`` run: the tasks, whether each
    recorded every step and a call of the train step each, and any
    'ledger off' (the recorder on but blind).  ``total_steps`` None: any
    number of steps (the probed run reports only half its blocks')."""
    from harness.core import progress, protocol
    from harness.record import files
    tasks, problems = files.read_dirs([record_dir])
    seen: List[TaskEvidence] = []
    for t in tasks:
        steps = {r.number for r in t.records if r.kind == progress.STEP}
        calls = sum(r.kind == progress.CALL_BEGAN for r in t.records)
        seen.append({"task": list(t.task), "steps": len(steps), "calls": calls,
                     "ledger_off": any(e["kind"] == protocol.LEDGER_OFF for e in t.events)})
    return {"tasks": seen, "problems": problems,
            "ok": bool(seen) and not problems and all(
                s["steps"] > 0 and not s["ledger_off"] and (
                    total_steps is None or s["steps"] == total_steps <= s["calls"])
                for s in seen)}


def run_job(folder: str, script: str, variant: str, args: argparse.Namespace,
            probe: bool = False) -> dict:
    """One run of the job in ``variant``, and its raw figures."""
    from harness.launch.ports import reserve_ports
    record_dir = os.path.join(folder, "record")
    procs: List[subprocess.Popen] = []
    ended: Dict[int, float] = {}
    logs = [os.path.join(folder, f"worker{i}.log") for i in range(args.workers)]
    load, busy0, t0 = os.getloadavg()[0], machine_busy_seconds(), time.monotonic()
    launched = time.time()
    with reserve_ports(args.workers) as reservation:
        try:
            for i, path in enumerate(logs):
                with open(path, "w") as log:
                    procs.append(subprocess.Popen(
                        job_command(variant, script, record_dir, args.warmup,
                                    args.probe_steps if probe else args.steps),
                        env=job_env(reservation.ports, i, probe), cwd=folder, stdout=log,
                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        start_new_session=True))
            outcome = wait_job(procs, args.run_timeout, ended)
        finally:
            survivors = end_job(procs, record_dir)
    wall_s, busy1 = time.monotonic() - t0, machine_busy_seconds()
    out = job_figures(variant, outcome, wall_s, logs, record_dir, survivors, args, probe)
    out["load_avg"] = load
    out["phases_s"] = phases(out["workers"], launched, launched + wall_s)
    # How long each process took to exit after its loop (TensorFlow's and
    # the recorder's exit handlers).
    out["exit_after_loop_s"] = {str(r["index"]): ended[r["index"]] - r["loop_end"]
                                for r in out["workers"]
                                if r.get("loop_end") and r.get("index") in ended}
    out["machine_busy_share"] = (None if busy0 is None or busy1 is None
                                 else (busy1 - busy0) / (wall_s * (os.cpu_count() or 1)))
    return out


def job_figures(variant: str, outcome: str, wall_s: float, logs: Sequence[str],
                record_dir: str, survivors: Sequence[int], args: argparse.Namespace,
                probe: bool = False) -> dict:
    """A run's figures from its processes' logs and the recorder's files."""
    texts = []
    for path in logs:
        with open(path, errors="replace") as f:
            texts.append(f.read())
    rows = [parse_result(t) for t in texts]
    figs = run_figures(rows, args.workers)
    workers = [r for r in rows if r]
    out: Dict[str, object] = {"variant": variant, "outcome": outcome, "wall_s": wall_s,
                              "workers": workers, "survivors": list(survivors)}
    out.update(figs or {})
    if any(r.get("probe") for r in workers):
        from harness.bench.recorder.probe import probe_figures
        out["probe_figures"] = probe_figures(workers)
    out["ok"] = outcome == "completed" and figs is not None and not survivors
    if variant == WITH:
        evidence = recorder_evidence(record_dir, None if probe else args.warmup + args.steps)
        out["recorder"] = evidence
        out["ok"] = out["ok"] and evidence["ok"]
    if not out["ok"]:
        out["error"] = "\n".join(f"--- worker {i}\n{t[-2000:]}" for i, t in enumerate(texts))
    return out
