"""The three launchers :mod:`harness.bench` compares (see ``docs/benchmark.md``).

Each launcher has ``run(workload, stamp_dir) -> dict`` (one run, its raw
figures), ``overhead_pss()`` and ``close()`` (nothing it started may
outlive it).  The workload is a :class:`harness.bench.Workload`;
``stamp_dir`` is an empty directory where the workers leave their pid and
loop-end marks (:mod:`harness.bench.workers`).  A run's dict always has
``outcome``, ``wall_s`` and ``ok``; the rest is filled in where the
launcher can tell.

Clocks: every time stamp is ``time.monotonic()``, which on Linux is one
clock for all processes of the machine, so a stamp written by a worker (or
by TensorFlow's runner process) compares directly with the benchmark's.
"""
from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from typing import List, Optional

import psutil

from harness.core import tfconfig
from harness.controller import Cluster
from harness.launch.devices import worker_environments
from harness.launch.local import forkserver_pid, kill_tree
from harness.core.linux import alive, set_parent_death_signal
from harness.launch.ports import reserve_ports
from harness.settings import RunSettings

from .workers import RESULT_MARK, measured_run

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


# -- shared helpers ----------------------------------------------------------

def read_marks(stamp_dir: Optional[str], prefix: str) -> dict:
    """``{worker index: value}`` of the ``<prefix>.<index>`` marks in ``stamp_dir``."""
    out = {}
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


def worker_kwargs(workload, stamp_dir: str) -> dict:
    """:func:`harness.bench.workers.measured_run`'s keyword arguments.  Under
    every launcher alike, the skipping worker's own loop leaves its step out
    (a user's ``continue``, no fault injected), then lingers or returns."""
    kwargs = {"fn": workload.fn, "kwargs": dict(workload.kwargs), "stamp_dir": stamp_dir}
    if workload.skip:
        kwargs.update(skip=list(workload.skip), linger=LINGER if workload.linger else 0.0)
    return kwargs


def pss_total(return_values, num_workers: int) -> Optional[int]:
    """The workers' PSS summed, None unless every worker reported its own."""
    pss = [r.get("pss") for r in return_values if isinstance(r, dict)]
    if len(pss) != num_workers or any(p is None for p in pss):
        return None
    return int(sum(pss))


def fn_seconds(return_values) -> Optional[float]:
    """The slowest worker's time inside the workload function, up to its
    loop's end (``fn_s`` of :func:`harness.bench.workers.measured_run`)."""
    times = [r.get("fn_s") for r in return_values if isinstance(r, dict)]
    times = [t for t in times if t is not None]
    return max(times) if times else None


def completed_ok(workload, return_values) -> bool:
    """Every worker returned, and for the all-reduce the sum is N."""
    if len(return_values) != workload.workers:
        return False
    if workload.fn == "allreduce":
        return all(isinstance(r, dict) and r.get("value") == float(workload.workers)
                   for r in return_values)
    return all(isinstance(r, dict) and r.get("value") is not None for r in return_values)


def completed_figures(workload, completed: bool, return_values) -> dict:
    """A completing workload's figures: ``ok``, ``pss_bytes`` and ``fn_s``."""
    return {"ok": completed and completed_ok(workload, return_values),
            "pss_bytes": pss_total(return_values, workload.workers),
            "fn_s": fn_seconds(return_values)}


def detection_figures(stamp_dir: str, report_time: float, timeout: float) -> dict:
    """Workloads 4 and 5: when the report came, measured from the hang's start."""
    start = hang_start(stamp_dir)
    out = {"hang_start_seen": start is not None}
    if start is not None:
        out["report_after_hang_s"] = report_time - start
        out["detection_over_T_s"] = report_time - start - timeout
    return out


def run_timeout(workload) -> float:
    """T for the hang workload; a safety net for completing ones (whose cold
    run waits for a TensorFlow import before any progress)."""
    return workload.hang_timeout if workload.expect_hang else SAFETY_TIMEOUT


# -- 1. the harness ------------------------------------------------------------

class HarnessLauncher:
    """``harness.controller.Cluster.run`` in this process.

    Its forkserver (which imports TensorFlow once) starts with the first run,
    so the first run is the cold-start figure and later ones are warm.
    """

    name = "harness"

    settings = RunSettings()

    def run(self, workload, stamp_dir: str) -> dict:
        cluster = Cluster(self.settings.with_overrides(workers=workload.workers,
                                                       timeout=run_timeout(workload)))
        t0 = time.monotonic()
        result = cluster.run(measured_run, kwargs=worker_kwargs(workload, stamp_dir))
        t1 = time.monotonic()
        out = {"outcome": result.outcome, "wall_s": t1 - t0, "harness_duration_s": result.duration,
               "culprits": list(result.culprits), "diagnosis": result.diagnosis}
        if workload.expect_hang:
            out.update(detection_figures(stamp_dir, t1, workload.hang_timeout))
            out["ok"] = result.outcome == "hang"
            # The watch loop's own latency past T, from the last progress it saw.
            out["detection_delay_s"] = result.observation.detection_delay
            # run() returns after dumping stacks and killing: the report's own cost.
            out["declared_to_return_s"] = (t1 - t0) - result.duration
            out["named_culprit"] = tuple(result.culprits) == (workload.skip[0],)
            out["stack_dumped"] = any(w.stack.strip() for w in result.workers)
            out["gone_after_report_s"] = wait_gone(marked_pids(stamp_dir), t1)
        else:
            out.update(completed_figures(workload, result.outcome == "completed",
                                         result.return_values))
            if not out["ok"]:
                out["error"] = result.report()[-4000:]
        return out

    def overhead_pss(self) -> Optional[int]:
        """PSS of what the harness keeps between runs: its forkserver."""
        pid = forkserver_pid()
        return pss_of([pid]) if pid else None

    def close(self) -> None:
        # The forkserver dies with this process (PR_SET_PDEATHSIG); nothing else lives.
        pass


class RayLauncher(HarnessLauncher):
    """The same ``Cluster.run`` on the Ray backend: a local Ray cluster of
    2 simulated nodes, started before the first run (``startup_s``), its
    agents' forkservers warm after the first run."""

    name = "ray"
    settings = RunSettings(backend="ray", ray_nodes=2)

    def __init__(self):
        from harness.launch.backends import launcher_for
        from harness.settings import check_backend
        check_backend(self.settings)
        t0 = time.monotonic()
        launcher_for(self.settings).prewarm()
        self.startup_s = time.monotonic() - t0

    def overhead_pss(self) -> Optional[int]:
        return None    # the Ray cluster's processes are not the harness's to count

    def close(self) -> None:
        from harness.launch.ray.launcher import close_session
        close_session()


# -- 2. spawn per worker -------------------------------------------------------

SPAWN_CODE = "from harness.bench.workers import spawn_entry; spawn_entry()"


class SpawnLauncher:
    """A fresh ``python -c`` per worker, each with its own ``TF_CONFIG``,
    each importing TensorFlow: what a hand-rolled script does.

    It has no progress channel.  For a hang it can only apply a whole-run
    wall-clock timeout, counted from launch, then kill; it names nobody and
    dumps no stack.
    """

    name = "spawn"

    def __init__(self):
        self._procs: List[subprocess.Popen] = []

    def run(self, workload, stamp_dir: str) -> dict:
        n = workload.workers
        spec = json.dumps(worker_kwargs(workload, stamp_dir))
        budget = run_timeout(workload)
        envs = worker_environments(n)
        outs, logs = [], []
        with reserve_ports(n) as reservation:
            for env, config in zip(envs, tfconfig.cluster_configs(reservation.ports)):
                env["TF_CONFIG"] = tfconfig.dumps(config)
                env["TMPDIR"] = stamp_dir   # removed after the run, autograph's files with it
            t0 = time.monotonic()
            try:
                for i in range(n):
                    out = open(os.path.join(stamp_dir, f"stdout.{i}"), "w+")
                    log = open(os.path.join(stamp_dir, f"stderr.{i}"), "w+")
                    outs.append(out)
                    logs.append(log)
                    # The worker gets SIGKILL if the benchmark dies, even by
                    # SIGKILL, so an orphan never blocks for ever in a collective.
                    self._procs.append(subprocess.Popen(
                        [sys.executable, "-c", SPAWN_CODE, spec], env=envs[i],
                        stdin=subprocess.DEVNULL, stdout=out, stderr=log,
                        preexec_fn=set_parent_death_signal))
                timed_out = False
                for p in self._procs:
                    try:
                        p.wait(max(0.0, t0 + budget - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        timed_out = True
                        break
                t1 = time.monotonic()
                pids = [p.pid for p in self._procs]
            finally:
                procs, self._procs = self._procs, []
                kill_all(procs, wait=True)
                codes = [p.returncode for p in procs]
        results = []
        for f in outs:
            f.seek(0)
            for line in f.read().splitlines():
                if line.startswith(RESULT_MARK):
                    results.append(json.loads(line[len(RESULT_MARK):]))
            f.close()
        tails = []
        for i, f in enumerate(logs):
            f.seek(0)
            tails.append(f"--- worker {i} (exit {codes[i]}) ---\n" + f.read()[-1500:])
            f.close()
        out = {"outcome": "timeout" if timed_out else
               ("completed" if all(c == 0 for c in codes) else "failed"),
               "wall_s": t1 - t0, "exit_codes": codes}
        if workload.expect_hang:
            out.update(detection_figures(stamp_dir, t1, workload.hang_timeout))
            out["ok"] = timed_out
            out["named_culprit"] = False
            out["culprits"] = []
            out["stack_dumped"] = False
            out["gone_after_report_s"] = wait_gone(pids, t1)
        else:
            out.update(completed_figures(workload, out["outcome"] == "completed", results))
            if not out["ok"]:
                out["error"] = "\n".join(tails)[-4000:]
        return out

    def overhead_pss(self) -> Optional[int]:
        return 0  # nothing lives between runs

    def close(self) -> None:
        procs, self._procs = self._procs, []
        kill_all(procs)


# -- 3. TensorFlow's own runner ------------------------------------------------

RUNNER_MARK = "BENCH_RUNNER "

# The script the runner needs: no ``.py`` suffix (``multi_process_lib`` then
# uses the script itself as the executable of its forkserver, hence the
# shebang and the exec bit) and ``test_main()`` as its main.  It holds one
# test, which serves the benchmark's commands; the logic lives in
# ``runner_serve`` below so the script stays a stub.
_RUNNER_SCRIPT = """#!{python}
# Generated by harness.bench: TensorFlow's multi_process_runner as a launcher.
import tensorflow as tf

mpr = tf.__internal__.distribute.multi_process_runner


class BenchServe(tf.test.TestCase):
    def test_serve(self):
        from harness.bench.launchers import runner_serve
        runner_serve(mpr)


if __name__ == "__main__":
    mpr.test_main()
"""


def _watch_parent(parent: int) -> None:
    """In the runner process: if the benchmark dies, kill everything the
    runner started (its forkserver, manager and workers) and exit.  A thread,
    so it acts even while the main thread waits inside ``mpr.run``."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            me = psutil.Process()
            for child in me.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child.kill()
            os._exit(3)


def runner_serve(mpr) -> None:
    """The runner process's command loop (runs inside ``test_main``).

    Reads one JSON command per line on stdin, answers one line on stdout
    (prefixed :data:`RUNNER_MARK`).  Everything else the runner and its
    workers write (it streams the workers' output to its stdout) goes to
    stderr, which the benchmark sends to a log file.
    """
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    log_path = os.environ.get("BENCH_RUNNER_LOG")

    def answer(obj):
        proto.write(RUNNER_MARK + json.dumps(obj) + "\n")
        proto.flush()

    answer({"ready": True, "t": time.monotonic()})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("cmd") == "quit":
            break
        try:
            answer(_runner_run(mpr, cmd, log_path))
        except BaseException as e:  # keep serving; the benchmark records it
            answer({"outcome": "bench_error", "error": f"{type(e).__name__}: {e}"})
    proto.close()


def _log_size(path: Optional[str]) -> int:
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


def _runner_run(mpr, cmd: dict, log_path: Optional[str]) -> dict:
    before = _log_size(log_path)
    # ``mpr.create_cluster_spec`` would pick the ports, but it needs the
    # ``portpicker`` package, which TensorFlow does not install.  The spec
    # is the same dict, on ports chosen as for the other two launchers.
    with reserve_ports(cmd["workers"]) as reservation:
        spec = {"worker": tfconfig.cluster_addresses(reservation.ports)}
        t0 = time.monotonic()
        out = {"t_start": t0}
        try:
            res = mpr.run(measured_run, spec, timeout=int(cmd["timeout"]), return_output=False,
                          kwargs=cmd["kwargs"])
            out.update(outcome="completed", return_values=list(res.return_value))
        except mpr.SubprocessTimeoutError as e:
            out.update(outcome="timeout", message=str(e))
        except Exception as e:
            out.update(outcome="failed", message=f"{type(e).__name__}: {e}"[:4000])
        out["t_report"] = time.monotonic()
    out["wall_s"] = out["t_report"] - t0
    if out["outcome"] != "completed":
        # Checked here, at once, not after the answer's trip to the benchmark.
        out["gone_after_report_s"] = wait_gone(marked_pids(cmd["kwargs"].get("stamp_dir")),
                                               out["t_report"])
    # Did it dump any Python stack (faulthandler's header) into its output
    # during this run?  Its streaming threads may still be flushing.
    time.sleep(0.2)
    text = ""
    if log_path:
        with open(log_path, "rb") as f:
            f.seek(before)
            text = f.read().decode("utf-8", "replace")
    out["stack_dumped"] = "most recent call first" in text
    return out


class RunnerLauncher:
    """TensorFlow's ``tf.__internal__.distribute.multi_process_runner``.

    The runner works outside bazel only from a script without a ``.py``
    suffix that calls ``test_main()``.  The benchmark writes one into a
    temporary directory and keeps it running as a server: commands on its
    stdin, one JSON answer per run on its stdout.  So the runner's own
    forkserver stays warm between runs, as the harness's does, and the runs
    of all launchers can alternate.  Its first run is its cold start (its
    forkserver importing TensorFlow); starting the script itself (its own
    TensorFlow import) is recorded apart as ``startup_s``.
    """

    name = "runner"

    def __init__(self):
        self._dir = tempfile.mkdtemp(prefix="mwms-bench-runner-")
        script = os.path.join(self._dir, "mwms_bench_runner")
        with open(script, "w") as f:
            f.write(_RUNNER_SCRIPT.format(python=sys.executable))
        os.chmod(script, os.stat(script).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        self.log_path = os.path.join(self._dir, "runner.log")
        self._log = open(self.log_path, "wb")
        env = worker_environments(1)[0]
        env["BENCH_RUNNER_LOG"] = self.log_path
        # Autograph's generated files (one per traced function per worker)
        # go with the directory the launcher removes on close.
        env["TMPDIR"] = self._dir
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, script], cwd=self._dir, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1)
        self._lines: "queue.Queue[Optional[str]]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        ready = self._reply(SAFETY_TIMEOUT)
        self.startup_s = time.monotonic() - t0
        if not ready.get("ready"):
            self.close()
            raise RuntimeError(f"TensorFlow's runner did not start: {ready}")

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(RUNNER_MARK):
                self._lines.put(line[len(RUNNER_MARK):])
        self._lines.put(None)

    def _reply(self, timeout: float) -> dict:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            return {"outcome": "bench_error", "error": f"no answer from the runner in {timeout:g}s"}
        if line is None:
            return {"outcome": "bench_error",
                    "error": f"the runner exited (code {self.proc.poll()}): {self.log_tail()}"}
        return json.loads(line)

    def log_tail(self, n: int = 3000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - n))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def run(self, workload, stamp_dir: str) -> dict:
        timeout = run_timeout(workload)
        cmd = {"cmd": "run", "workers": workload.workers,
               "kwargs": worker_kwargs(workload, stamp_dir), "timeout": int(round(timeout))}
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        # Its report of a hang comes at about T + 30 s (SIGTERM, a 30 s wait
        # for stacks, SIGKILL); leave room for that and a slow machine.
        reply = self._reply(timeout + 120.0)
        received = time.monotonic()
        if reply.get("outcome") == "bench_error":
            reply.update(ok=False, wall_s=None)
            return reply
        out = {"outcome": reply["outcome"], "wall_s": reply["wall_s"],
               "stack_dumped": reply.get("stack_dumped", False)}
        if "message" in reply:
            out["message"] = reply["message"]
        if workload.expect_hang:
            out.update(detection_figures(stamp_dir, reply["t_report"], workload.hang_timeout))
            out["ok"] = reply["outcome"] == "timeout"
            # Whether its message points at the worker that skipped (it does not
            # on TF 2.21: "One or more subprocesses timed out ...").
            task = workload.skip[0]
            out["named_culprit"] = bool(re.search(rf"worker[-_ :]*{task}\b", reply.get("message", "")))
            out["culprits"] = [task] if out["named_culprit"] else []
            out["gone_after_report_s"] = reply.get("gone_after_report_s")
            # Whatever the runner said, nothing of this run may live on.
            wait_gone(marked_pids(stamp_dir), received, limit=5.0)
        else:
            out.update(completed_figures(workload, reply["outcome"] == "completed",
                                         reply.get("return_values", [])))
            if not out["ok"]:
                out["error"] = (reply.get("message", "") + "\n" + self.log_tail())[-4000:]
        return out

    def overhead_pss(self) -> Optional[int]:
        """PSS of what the runner keeps between runs: its own process (it
        imports TensorFlow), its forkserver and its manager."""
        try:
            me = psutil.Process(self.proc.pid)
            return pss_of([me.pid] + [c.pid for c in me.children(recursive=True)])
        except psutil.Error:
            return None

    def close(self) -> None:
        proc = getattr(self, "proc", None)
        family = []
        with contextlib.suppress(psutil.Error, AttributeError):
            # Listed now: once the runner has exited, its children are
            # re-parented and can no longer be found from it.
            family = psutil.Process(proc.pid).children(recursive=True)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                proc.stdin.flush()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        if proc is not None:
            # Whether it quit or not: its forkserver, manager and any worker go too.
            kill_tree(proc.pid, known=family)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        psutil.wait_procs(family, timeout=5)
        with contextlib.suppress(OSError):
            self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _floor():
    from .floor import FloorLauncher
    return FloorLauncher()


LAUNCHERS = {"floor": _floor, "harness": HarnessLauncher, "spawn": SpawnLauncher,
             "runner": RunnerLauncher, "ray": RayLauncher}
