"""The floor: the least a launcher of warm MWMS workers can cost.

A bare fork server, a ``python`` that has imported TensorFlow and then, for
each run, forks N children.  Each child sets its ``TF_CONFIG``, runs the
workload function and writes back its value; once every child has, the
server lets them exit, waits for them and answers.  No progress channel,
no monitoring, no diagnosis, no clean-up guarantee beyond dying with its
parent: what is left of any launcher once everything a harness adds is
taken away.  :class:`FloorServer` is it, for :mod:`harness.bench.warm`;
:class:`FloorLauncher` is it as a launcher of the comparison
(:mod:`harness.bench.launchers.measure`; completing workloads only: it
cannot tell a hang).
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING, List, Optional

from harness.core import tfconfig

if TYPE_CHECKING:
    from harness.bench.launchers.plan import Workload

SERVE_CODE = "from harness.bench.launchers.floor import serve; serve()"


def _child(request: dict, config: dict, out: int, release: int) -> None:
    """In a forked child: run the workload, write its JSON answer to
    ``out``, then exit once ``release`` closes: a worker that left at once
    could cut off a peer still reading its last all-reduce's data."""
    forked = time.monotonic()
    try:
        os.environ["TF_CONFIG"] = json.dumps(config)
        module, name = request["fn"].split(":")
        fn = getattr(importlib.import_module(module), name)
        began = time.monotonic()
        value = fn(**request["kwargs"])
        answer = {"ok": True, "value": value, "forked": forked, "began": began,
                  "ended": time.monotonic()}
    except BaseException as e:   # whatever it was, the server must hear of it
        answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    with os.fdopen(out, "w") as f:
        f.write(json.dumps(answer, default=repr))
    os.read(release, 1)
    os._exit(0)


def serve() -> None:
    """The server: one request per line on stdin (``fn``: ``module:name``,
    ``kwargs``, ``configs``: a ``TF_CONFIG`` per worker), one answer per
    line on stdout (each child's answer, in order)."""
    from harness.core.linux import set_parent_death_signal
    set_parent_death_signal()
    replies = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.environ["CUDA_VISIBLE_DEVICES"] = "-1"
    import tensorflow  # noqa: F401  (the import every fork shares)
    replies.write("ready\n")
    replies.flush()
    for line in sys.stdin:
        request = json.loads(line)
        children = []
        hold, release = os.pipe()
        for config in request["configs"]:
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                os.close(release)
                set_parent_death_signal()
                _child(request, config, write, hold)
            os.close(write)
            children.append((pid, read))
        os.close(hold)
        answers = []
        for _pid, read in children:
            with os.fdopen(read) as f:
                text = f.read()
            answers.append(json.loads(text) if text else {"ok": False, "error": "no answer"})
        os.close(release)
        for pid, _ in children:
            os.waitpid(pid, 0)
        replies.write(json.dumps(answers) + "\n")
        replies.flush()


def free_ports(n: int) -> List[int]:
    """``n`` ports the kernel has free now (bound to port 0, then closed)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class FloorServer:
    """The fork server, started at once; :meth:`run` is one run on it."""

    def __init__(self) -> None:
        from harness.core.linux import set_parent_death_signal
        t0 = time.monotonic()
        # Its temporary directory, removed on close: TensorFlow's autograph
        # leaves a generated file per traced function in each child's.
        self.tmpdir = tempfile.mkdtemp(prefix="mwms-floor-")
        self.proc = subprocess.Popen([sys.executable, "-c", SERVE_CODE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True,
                                     env=dict(os.environ, TMPDIR=self.tmpdir),
                                     preexec_fn=set_parent_death_signal)  # noqa: PLW1509 - no threads yet
        # Both asked for with PIPE, so Popen made both.
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._requests, self._answers = self.proc.stdin, self.proc.stdout
        if self._answers.readline().strip() != "ready":
            self.close()
            raise RuntimeError("the floor's fork server did not start")
        self.startup_s = time.monotonic() - t0

    def run(self, fn: str, kwargs: dict, workers: int) -> list:
        """Each worker's answer (``{"ok": ..., "value" or "error": ...}``)."""
        self._requests.write(json.dumps({"fn": fn, "kwargs": kwargs,
                                         "configs": tfconfig.cluster_configs(free_ports(workers))}) + "\n")
        self._requests.flush()
        line = self._answers.readline()
        if not line:
            raise RuntimeError("the floor's fork server died")
        return json.loads(line)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.tmpdir, ignore_errors=True)


class FloorLauncher:
    """:class:`FloorServer` as a launcher of the comparison."""

    name = "floor"
    note = ("floor: a bare fork server that imported TensorFlow forks the workers; each sets "
            "its `TF_CONFIG`, runs the workload and sends back its value (no progress, "
            "monitoring, diagnosis or clean-up guarantee: the least a warm launcher costs; "
            "completing workloads only).")

    def __init__(self) -> None:
        self.server = FloorServer()
        self.startup_s = self.server.startup_s

    def run(self, workload: Workload, stamp_dir: str) -> dict:
        # Imported here, not above: the fork server imports this module, and
        # stays as bare as the floor it is.
        from harness.bench.launchers.measure import completed_figures, worker_kwargs
        if workload.expect_hang:
            return {"outcome": "not run", "ok": False, "wall_s": None,
                    "error": "the floor cannot tell a hang"}
        t0 = time.monotonic()
        answers = self.server.run("harness.bench.launchers.workers:measured_run",
                                  worker_kwargs(workload, stamp_dir), workload.workers)
        wall = time.monotonic() - t0
        ok = all(a["ok"] for a in answers)
        out = {"outcome": "completed" if ok else "failed", "wall_s": wall}
        out.update(completed_figures(workload, ok, [a.get("value") for a in answers]))
        if not ok:
            out["error"] = "; ".join(a.get("error", "") for a in answers if not a["ok"])
        return out

    def overhead_pss(self) -> Optional[int]:
        from harness.bench.launchers.measure import pss_of
        return pss_of([self.server.proc.pid])

    def close(self) -> None:
        self.server.close()
