"""The harness as a launcher of the comparison: ``Cluster.run`` in the
benchmark's process, on the local backend and on Ray's.

The interface every launcher has: :mod:`harness.bench.launchers.measure`.
"""
from __future__ import annotations

import time
from typing import Optional

from harness.bench.launchers.measure import (completed_figures, detection_figures,
                                             marked_pids, pss_of, run_timeout, wait_gone,
                                             worker_kwargs)
from harness.bench.launchers.plan import Workload
from harness.bench.launchers.workers import measured_run
from harness.controller import Cluster
from harness.launch.local import forkserver_pid
from harness.launch.ray.launcher import BACKEND as RAY
from harness.settings import RunSettings


class HarnessLauncher:
    """``harness.controller.Cluster.run`` in this process.

    Its forkserver (which imports TensorFlow once) starts with the first run,
    so the first run is the cold-start figure and later ones are warm.
    """

    name = "harness"
    note = ("harness: `Cluster.run` in the benchmark's process; workers forked from a "
            "forkserver that imported TensorFlow once (its first run is the cold one).")

    settings = RunSettings()

    def run(self, workload: Workload, stamp_dir: str) -> dict:
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
            out["named_culprit"] = tuple(result.culprits) == (workload.skipper,)
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

    name = RAY.name
    note = ("ray: the same `Cluster.run` with `--mwms-backend=ray` on a local Ray cluster of 2 "
            "simulated nodes, one agent per node forking the workers from its own forkserver; "
            "the cluster and its agents start before the first run (the start-up below), the "
            "forkservers' TensorFlow import overlapping it, so its first run is already warm.")
    settings = RunSettings(backend=RAY.name, ray_nodes=2)

    def __init__(self) -> None:
        from harness.launch.backends import launcher_for
        from harness.settings import check_backend
        check_backend(self.settings)
        t0 = time.monotonic()
        launcher_for(self.settings).prewarm()
        self.startup_s = time.monotonic() - t0

    def overhead_pss(self) -> Optional[int]:
        return None    # the Ray cluster's processes are not the harness's to count

    def close(self) -> None:
        RAY.close_session()
