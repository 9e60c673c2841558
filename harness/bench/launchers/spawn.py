"""A fresh ``python`` per worker as a launcher of the comparison: what a
hand-rolled script does.

The interface every launcher has: :mod:`harness.bench.launchers.measure`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import IO, Dict, List, Optional

from harness.bench.launchers.measure import (completed_figures, detection_figures, kill_all,
                                             run_timeout, wait_gone, worker_kwargs)
from harness.bench.launchers.plan import Workload
from harness.bench.launchers.workers import RESULT_MARK
from harness.core import tfconfig
from harness.core.linux import set_parent_death_signal
from harness.launch.devices import worker_environments
from harness.launch.ports import reserve_ports

SPAWN_CODE = "from harness.bench.launchers.workers import spawn_entry; spawn_entry()"


class SpawnLauncher:
    """A fresh ``python -c`` per worker, each with its own ``TF_CONFIG``,
    each importing TensorFlow: what a hand-rolled script does.

    It has no progress channel.  For a hang it can only apply a whole-run
    wall-clock timeout, counted from launch, then kill; it names nobody and
    dumps no stack.
    """

    name = "spawn"
    note = ("spawn: a fresh `python -c` per worker, each importing TensorFlow. No progress "
            "channel: a hang can only be caught by a whole-run timeout of T counted from launch, "
            "which cannot tell a hang from a slow start (it may fire before the hang begins, and "
            "would kill a healthy run slower than T); it names nobody and dumps no stack.")

    def __init__(self) -> None:
        self._procs: List[subprocess.Popen] = []

    def run(self, workload: Workload, stamp_dir: str) -> dict:
        n = workload.workers
        spec = json.dumps(worker_kwargs(workload, stamp_dir))
        budget = run_timeout(workload)
        envs = worker_environments(n)
        outs: List[IO[str]] = []
        logs: List[IO[str]] = []
        with reserve_ports(n) as reservation:
            for env, config in zip(envs, tfconfig.cluster_configs(reservation.ports)):
                env["TF_CONFIG"] = tfconfig.dumps(config)
                env["TMPDIR"] = stamp_dir   # removed after the run, autograph's files with it
            t0 = time.monotonic()
            try:
                for i in range(n):
                    # Each worker's output, closed once the workers have ended.
                    stdout = open(os.path.join(stamp_dir, f"stdout.{i}"), "w+")  # noqa: SIM115
                    stderr = open(os.path.join(stamp_dir, f"stderr.{i}"), "w+")  # noqa: SIM115
                    outs.append(stdout)
                    logs.append(stderr)
                    # The worker gets SIGKILL if the benchmark dies, even by
                    # SIGKILL, so an orphan never blocks for ever in a collective.
                    self._procs.append(subprocess.Popen(
                        [sys.executable, "-c", SPAWN_CODE, spec], env=envs[i],
                        stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr,
                        preexec_fn=set_parent_death_signal))  # noqa: PLW1509 - no threads
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
        out: Dict[str, object] = {
            "outcome": "timeout" if timed_out else
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
