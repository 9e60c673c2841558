"""Node side of the Ray backend: one agent per Ray node, a threaded actor.

The agent runs no TensorFlow.  It starts the run's workers on its node
with the local launcher (:class:`harness.launcher.LocalLauncher`, so a
forkserver that imported TensorFlow once keeps start-up warm, and a
worker is the same process it is locally), and carries each worker's
channel to the controller over a TCP connection of its own (the harness's
channel, never TensorFlow's gRPC): bytes from the worker's pipe to the
socket and back, unread.  Signals, exit statuses and the kill of a
worker's process tree are done here, on the node, when the controller asks.

An actor blocked inside TensorFlow could not answer; this one never is:
TensorFlow runs in the workers, its children.  When the agent dies (the
run is over, the driver died, the node went), its forkserver sees its pipe
close and exits, and the workers die with their parent.

The worker's files (log, stack dump, progress map) are written where the
controller named them, so the node must see the controller's temp
directory: true for the simulated nodes of one machine; a node that does
not is refused with the reason.  Ray is imported by whoever makes this an
actor (:mod:`harness.raylaunch`), not here.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Dict, List, Optional

from multiprocess import connection, spawn

from .launcher import LocalLauncher
from .ports import reserve_ports
from .protocol import WorkerSpec


class NodeAgent:
    def __init__(self, preload: tuple, sys_path: List[str], cwd: str) -> None:
        self.launcher = LocalLauncher("forkserver", preload)
        self.handles: Dict[str, object] = {}
        self.relays: Dict[str, threading.Thread] = {}
        self.reservations: Dict[str, object] = {}
        self.known: Dict[str, list] = {}
        self.lock = threading.Lock()
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
        reservation = reserve_ports(count, state_dir=state_dir)
        self.reservations[key] = reservation
        return list(reservation.ports)

    def release(self, key: str) -> None:
        reservation = self.reservations.pop(key, None)
        if reservation is not None:
            reservation.close()

    def start(self, key: str, spec: WorkerSpec, address: tuple, authkey: bytes) -> int:
        """Start worker ``spec`` here; its channel connects to ``address``
        (the controller's listener), announcing ``key``.  Returns its pid."""
        folder = os.path.dirname(spec.log_path)
        if not os.path.isdir(folder):
            raise RuntimeError(f"node {self.node()[0]} cannot see the run's directory {folder}: "
                               f"the Ray backend needs the controller's temp directory on "
                               f"every node (one machine, or a shared filesystem)")
        with self.lock:   # the forkserver's start-up is not to be raced
            [handle] = self.launcher.start([spec])
        self.handles[key] = handle
        relay = threading.Thread(target=_relay, args=(handle.conn, address, authkey, key),
                                 name=f"relay-{key}", daemon=True)
        relay.start()
        self.relays[key] = relay
        return handle.pid

    def wait(self, key: str, timeout: Optional[float] = None) -> Optional[int]:
        """The worker's exit status, once it exits (None if ``timeout`` ran
        out), and once its relay passed on all it sent: the controller must
        read a worker's last message before it reads its death."""
        handle = self.handles.get(key)
        if handle is None:
            return None
        handle.join(timeout)
        relay = self.relays.get(key)
        if handle.exitcode is not None and relay is not None:
            relay.join(5)
        return handle.exitcode

    def signal(self, key: str, sig: int) -> bool:
        handle = self.handles.get(key)
        return handle is not None and handle.send_signal(sig)

    def is_stopped(self, key: str) -> bool:
        handle = self.handles.get(key)
        return handle is not None and handle.is_stopped()

    def remember_descendants(self, key: str) -> int:
        """List the worker's descendants now, while it lives, for :meth:`kill_tree`."""
        handle = self.handles.get(key)
        self.known[key] = handle.descendants() if handle is not None else []
        return len(self.known[key])

    def kill_tree(self, key: str) -> None:
        """SIGKILL the worker and all it started; return once they are gone."""
        from .linux import wait_gone
        handle = self.handles.get(key)
        if handle is None:
            return
        known = self.known.pop(key, [])
        handle.kill_tree(known)
        handle.join(5)
        wait_gone([p.pid for p in known], 5.0)

    def close(self, key: str) -> None:
        handle = self.handles.pop(key, None)
        if handle is not None:
            handle.close()
        relay = self.relays.pop(key, None)
        if relay is not None:
            relay.join(5)


def _relay(pipe, address: tuple, authkey: bytes, key: str) -> None:
    """Carry a worker's channel: its pipe <-> a connection to the controller."""
    try:
        sock = connection.Client(address, authkey=authkey)
    except OSError:
        pipe.close()
        return
    try:
        sock.send_bytes(key.encode())
        while True:
            for end in connection.wait([pipe, sock]):
                other = sock if end is pipe else pipe
                other.send_bytes(end.recv_bytes())
    except (EOFError, OSError):
        pass
    finally:
        sock.close()


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
