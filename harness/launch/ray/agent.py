"""Node side of the Ray backend: one agent per Ray node, a threaded actor.

The agent runs no TensorFlow.  It starts the run's workers on its node
with the local launcher (:class:`harness.launch.local.LocalLauncher`, so a
forkserver that imported TensorFlow once keeps start-up warm, and a
worker is the same process it is locally), and gives each two connections
to the controller of its own (the harness's channel, never TensorFlow's
gRPC): the worker's pipe, carried both ways unread, and its files (the
progress map record by record, its log, stack dump and replica file as
they grow; see :mod:`harness.launch.ray.link`), which the worker writes into a
directory on its node.  Signals, exit statuses and the kill of a worker's
process tree are done here, on the node, when the controller asks.

An actor blocked inside TensorFlow could not answer; this one never is:
TensorFlow runs in the workers, its children.  When the agent dies (the
driver died, the node went), its forkserver sees its pipe close and
exits, and the workers die with their parent.  Ray is imported by whoever
makes this an actor (:mod:`harness.launch.ray.launcher`), and here only to name the
node.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional

from multiprocess import connection, spawn

from harness.launch.ray.link import NodeLink
from harness.core import progress
from harness.launch.local import LocalLauncher, ProcessHandle
from harness.launch.ports import PortReservation, reserve_ports
from harness.core.protocol import WorkerSpec


@dataclasses.dataclass
class _Worker:
    handle: ProcessHandle
    folder: str
    link: Optional[NodeLink] = None   # None until it reached the controller
    connecting: Optional[threading.Thread] = None
    known: list = dataclasses.field(default_factory=list)


class NodeAgent:
    def __init__(self, preload: tuple, sys_path: List[str], cwd: str) -> None:
        self.launcher = LocalLauncher("forkserver", preload)
        self.workers: Dict[str, _Worker] = {}
        self.reservations: Dict[str, PortReservation] = {}
        self.lock = threading.Lock()
        # The workers' directories, in Ray's temp directory where it has
        # one (a local cluster's holder removes it whatever happens).  So
        # is everything else this process puts in the temp directory (the
        # forkserver's socket and preload report): the holder ends by
        # killing every descendant, this process's scratch sweeper too.
        # Port locks stay in the machine's temp directory, beside those
        # of every other user of the machine's ports.
        self.machine_tempdir = tempfile.gettempdir()
        ray_tmp = os.environ.get("RAY_TMPDIR")
        if ray_tmp and os.path.isdir(ray_tmp):
            tempfile.tempdir = ray_tmp
        self.base = tempfile.mkdtemp(prefix="mwms-agent-")
        _prepare_like_the_driver(sys_path, cwd)

    def node(self) -> tuple:
        """(this node's IP, its Ray node id, this agent's pid)."""
        import ray
        return (ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id(),
                os.getpid())

    def prewarm(self) -> None:
        self.launcher.prewarm()

    def reserve(self, key: str, count: int, state_dir: Optional[str]) -> List[int]:
        """Reserve ``count`` ports on this node, held until :meth:`release`."""
        reservation = reserve_ports(count, state_dir=state_dir, tempdir=self.machine_tempdir)
        self.reservations[key] = reservation
        return list(reservation.ports)

    def release(self, key: str) -> None:
        reservation = self.reservations.pop(key, None)
        if reservation is not None:
            reservation.close()

    def start(self, key: str, spec: WorkerSpec, address: tuple, authkey: bytes,
              clock: float) -> int:
        """Start worker ``spec`` here, its files in a directory of this
        node; its link (:class:`harness.launch.ray.link.NodeLink`) connects to
        ``address`` (the controller's listener), announcing ``key``.
        ``clock`` is the controller's ``time.monotonic()`` as it called.
        Returns the worker's pid."""
        offset = clock - time.monotonic()
        folder = tempfile.mkdtemp(prefix="worker-", dir=self.base)
        here = {name: os.path.join(folder, os.path.basename(getattr(spec, f"{name}_path")))
                for name in ("log", "stack", "progress", "replicas")
                if getattr(spec, f"{name}_path")}
        local = dataclasses.replace(
            spec, log_path=here["log"], stack_path=here["stack"],
            progress_path=here["progress"], replicas_path=here.get("replicas", ""),
            env={**spec.env, "TMPDIR": folder})
        progress.create(local.progress_path)
        with self.lock:   # the forkserver's start-up is not to be raced
            [handle] = self.launcher.start([local])
        worker = _Worker(handle, folder)
        self.workers[key] = worker
        # Connected from a thread of its own: the controller accepts only
        # once every start() has returned.
        worker.connecting = threading.Thread(
            target=self._connect, args=(worker, key, address, authkey, here, offset),
            name=f"connect-{key}", daemon=True)
        worker.connecting.start()
        return handle.pid

    def _connect(self, worker: _Worker, key: str, address: tuple, authkey: bytes,
                 here: Dict[str, str], offset: float) -> None:
        try:
            sock = connection.Client(address, authkey=authkey)
            sock.send_bytes(key.encode())
        except OSError:
            worker.handle.conn.close()    # the worker finds its parent gone
            return
        worker.link = NodeLink(sock, worker.handle.conn, here["progress"],
                                      {n: p for n, p in here.items() if n != "progress"},
                                      offset)

    def _link_done(self, worker: _Worker) -> None:
        """Once the worker is gone: its link's last frames sent."""
        if worker.connecting is not None:
            worker.connecting.join(5)
        if worker.link is not None:
            worker.link.join(5)

    def wait(self, key: str, timeout: Optional[float] = None) -> Optional[int]:
        """The worker's exit status, once it exits (None if ``timeout`` ran
        out), and once all it sent and wrote reached the controller: the
        controller must read a worker's last message before its death."""
        worker = self.workers.get(key)
        if worker is None:
            return None
        worker.handle.join(timeout)
        if worker.handle.exitcode is not None:
            self._link_done(worker)
        return worker.handle.exitcode

    def signal(self, key: str, sig: int) -> bool:
        worker = self.workers.get(key)
        return worker is not None and worker.handle.send_signal(sig)

    def is_stopped(self, key: str) -> bool:
        worker = self.workers.get(key)
        return worker is not None and worker.handle.is_stopped()

    def remember_descendants(self, key: str) -> int:
        """List the worker's descendants now, while it lives, for :meth:`kill_tree`."""
        worker = self.workers.get(key)
        if worker is None:
            return 0
        worker.known = worker.handle.descendants()
        return len(worker.known)

    def kill_tree(self, key: str) -> None:
        """SIGKILL the worker and all it started; return once they are gone
        and what they wrote was sent."""
        from harness.core.linux import wait_gone
        worker = self.workers.get(key)
        if worker is None:
            return
        worker.handle.kill_tree(worker.known)
        worker.handle.join(5)
        wait_gone([p.pid for p in worker.known], 5.0)
        self._link_done(worker)

    def close(self, key: str) -> None:
        """Forget the worker: its link ended, its directory removed."""
        worker = self.workers.pop(key, None)
        if worker is None:
            return
        worker.handle.close()
        self._link_done(worker)
        shutil.rmtree(worker.folder, ignore_errors=True)

    def shutdown(self) -> None:
        """The session ends: every worker killed and forgotten, the directory gone."""
        for key in list(self.workers):
            self.kill_tree(key)
            self.close(key)
        shutil.rmtree(self.base, ignore_errors=True)


def _prepare_like_the_driver(sys_path: List[str], cwd: str) -> None:
    """Workers started here get the controller's ``sys.path`` and working
    directory (they unpickle ``fn`` by module name, as locally), and not
    this actor's ``__main__``: it is Ray's worker script, which each worker
    would otherwise run again as ``__mp_main__``."""
    original = spawn.get_preparation_data

    def prepared(name):
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        data["sys_path"] = list(sys_path) + [p for p in data.get("sys_path", [])
                                             if p not in sys_path]
        if os.path.isdir(cwd):
            data["dir"] = cwd
        return data

    spawn.get_preparation_data = prepared
    for path in reversed(sys_path):      # and the forkserver, when it starts
        if path not in sys.path:
            sys.path.insert(0, path)
