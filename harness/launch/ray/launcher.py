"""Parent side of the Ray backend (``--mwms-backend=ray``): workers on the
nodes of a Ray cluster, behind the same :class:`~harness.launch.local.Launcher`
interface as local processes.

How a run goes:

* **The cluster.**  With no ``--mwms-ray-address``, the session starts a
  local Ray cluster of ``--mwms-ray-nodes`` simulated nodes, held by a
  process of its own (:mod:`harness.launch.ray.holder`) so that nothing of it
  outlives pytest, SIGKILL included; with ``auto`` or ``HOST:PORT`` it
  joins that cluster instead (and leaves it running).
* **Placement.**  One agent per node (:class:`harness.launch.ray.agent.NodeAgent`,
  a threaded actor pinned to its node); worker ``i`` goes to node ``i mod
  K``, so workers spread one per node where there are enough nodes.  Each
  agent reserves its workers' ports on its own node, and ``TF_CONFIG``
  lists each worker at its node's address.
* **Processes.**  The agent starts each worker with its node's local
  launcher (a forkserver that imported TensorFlow once), so a worker is
  the same process as locally: same entry point, same faults, progress
  map, ledger and stack dumps, its files in a directory of its node.
* **Link.**  Each worker reaches the controller over a TCP connection
  its agent opens to a listener here (authenticated with a per-run key;
  :mod:`harness.launch.ray.link`): the messages of the pipe it has locally, its
  progress records as they are written, its log, stack dump and replica
  file as they grow, in order; a thread here writes them into the files
  the controller reads and hands the messages on as the worker's channel.
  The harness's own channel, never TensorFlow's gRPC.  Exit statuses,
  signals and kills go through the agent.

What Ray does not give, and docs/backends.md's table says: no
network namespace (every run is on the nodes' host network), so no
network faults.
"""
from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Protocol, Sequence, Tuple, cast

from multiprocess import connection

from harness.launch.ray.link import ControllerLink
from harness.errors import HarnessError, SettingError
from harness.launch import memory, scratch
from harness.launch.devices import uses_gpus
from harness.launch.base import Backend, Launcher, Placement
from harness.core.linux import pipe
from harness.core.protocol import WorkerSpec

if TYPE_CHECKING:
    from ray.actor import ActorHandle

INSTALL = "pip install -e '.[ray]' (or pip install ray)"
START_TIMEOUT = 120.0   # the holder's cluster, ray.init, an agent's first answer
CALL_TIMEOUT = 30.0     # an agent's answer to anything else
CONNECT_TIMEOUT = 60.0  # a started worker's channel reaching the listener


class RemoteMethod(Protocol):
    def remote(self, *args: Any) -> Any:
        """Call the method in the actor; an ObjectRef to read with ``ray.get``."""


class AgentHandle(Protocol):
    """A :class:`~harness.launch.ray.agent.NodeAgent` actor as this side calls
    it, each method through ``.remote`` (Ray's types give ``.remote`` to
    methods decorated with ``@ray.method`` only)."""

    node: RemoteMethod
    prewarm: RemoteMethod
    reserve: RemoteMethod
    release: RemoteMethod
    start: RemoteMethod
    wait: RemoteMethod
    signal: RemoteMethod
    is_stopped: RemoteMethod
    remember_descendants: RemoteMethod
    kill_tree: RemoteMethod
    close: RemoteMethod
    shutdown: RemoteMethod


def available() -> Tuple[bool, str]:
    """Whether Ray is installed here, and what to do when not."""
    if importlib.util.find_spec("ray") is None:
        return False, f"Ray is not installed; install it with {INSTALL}"
    return True, ""


class HeldCluster:
    """A local Ray cluster of ``nodes`` simulated nodes, owned by a holder
    process (see :mod:`harness.launch.ray.holder`)."""

    def __init__(self, nodes: int) -> None:
        # Short: Ray's unix socket paths under it must fit in 107 bytes.
        self.tmpdir = tempfile.mkdtemp(prefix="mwms-ray-", dir="/tmp")
        scratch.remove_at_end(self.tmpdir)
        self.log = open(os.path.join(self.tmpdir, "holder.log"), "wb")  # noqa: SIM115 - closed in close()
        self.holder = subprocess.Popen(
            [sys.executable, "-m", "harness.launch.ray.holder", str(nodes), self.tmpdir],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, close_fds=True,
            env={**os.environ, "MWMS_HOLDER_PARENT": str(os.getpid())})
        line = _readline(self.holder.stdout, START_TIMEOUT)
        if not line.startswith("ready "):
            self.close()
            raise HarnessError(f"the local Ray cluster did not start ({line or 'no answer'}); "
                               f"its log: {self._tail()}")
        self.address = line.split(" ", 1)[1]

    def _tail(self) -> str:
        try:
            with open(os.path.join(self.tmpdir, "holder.log"), "rb") as f:
                return f.read()[-2000:].decode(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        if self.holder.poll() is None:
            with contextlib.suppress(OSError):
                pipe(self.holder.stdin).close()
            try:
                self.holder.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.holder.kill()
                self.holder.wait()
        for stream in (self.holder.stdin, self.holder.stdout, self.log):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def _readline(stream, timeout: float) -> str:
    """One line of ``stream`` within ``timeout`` seconds ("" if none came)."""
    out: List[bytes] = []
    reader = threading.Thread(target=lambda: out.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return out[0].decode(errors="replace").strip() if out else ""


class RaySession:
    """This process's connection to a Ray cluster, and its agents (one per
    node); one per process, as ``ray.init`` allows."""

    def __init__(self, address: Optional[str], nodes: int, preload: Sequence[str]) -> None:
        ok, why = available()
        if not ok:
            raise SettingError(f"--mwms-backend=ray: {why}")
        import ray
        self.key = (address, nodes, tuple(preload))
        # Before anything that can fail: close() reads them.
        self.agents: Dict[str, AgentHandle] = {}     # node id -> agent
        self.hosts: Dict[str, str] = {}         # node id -> its address
        self.held = HeldCluster(nodes) if address is None else None
        target = self.held.address if self.held else address
        done: List[Optional[BaseException]] = []

        def connect():
            try:
                ray.init(address=target, log_to_driver=False, namespace="pytest-mwms",
                         include_dashboard=False)
            except BaseException as e:   # re-raised below
                done.append(e)
            else:
                done.append(None)

        # ray.init can retry for ever (an address it rewrites and cannot reach).
        connecting = threading.Thread(target=connect, daemon=True)
        connecting.start()
        connecting.join(START_TIMEOUT)
        if not done or done[0] is not None:
            self.close()
            raise HarnessError(f"could not join the Ray cluster at {target}: "
                               f"{done[0] if done else f'no answer in {START_TIMEOUT:g} s'}")
        self.preload: Tuple[str, ...] = tuple(preload)
        self.listen_host: str = ray.util.get_node_ip_address()

    def nodes(self) -> List[str]:
        """The alive nodes' ids, in a stable order (the head node first)."""
        import ray
        alive = [n for n in ray.nodes() if n.get("Alive")]
        alive.sort(key=lambda n: (not n.get("Resources", {}).get("mwms_node_0"),
                                  n["NodeManagerAddress"], n["NodeID"]))
        return [n["NodeID"] for n in alive]

    def agent(self, node: str) -> AgentHandle:
        """The agent on ``node``, started the first time it is needed."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        if node not in self.agents:
            from harness.launch.ray.agent import NodeAgent
            actor = cast(AgentHandle, ray.remote(NodeAgent).options(
                num_cpus=0, max_concurrency=64,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            ).remote(self.preload, list(sys.path), os.getcwd()))
            host, _, _ = ray.get(actor.node.remote(), timeout=START_TIMEOUT)
            actor.prewarm.remote()
            self.agents[node], self.hosts[node] = actor, host
        return self.agents[node]

    def agent_pids(self) -> List[int]:
        """The pids of this session's agents (on their nodes)."""
        import ray
        return [pid for _, _, pid in ray.get([a.node.remote() for a in self.agents.values()],
                                             timeout=CALL_TIMEOUT)]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            import ray
            with contextlib.suppress(Exception):
                ray.get([a.shutdown.remote() for a in self.agents.values()],
                        timeout=CALL_TIMEOUT)
            for actor in self.agents.values():
                ray.kill(cast("ActorHandle", actor))
            ray.shutdown()
        self.agents.clear()
        if self.held is not None:
            self.held.close()


_session: Optional[RaySession] = None


def session(address: Optional[str], nodes: int, preload: Sequence[str]) -> RaySession:
    """This process's :class:`RaySession`, started on first use and closed at exit."""
    global _session
    if _session is None:
        _session = RaySession(address, nodes, preload)
        atexit.register(close_session)
    elif _session.key != (address, nodes, tuple(preload)):
        raise SettingError(f"one Ray cluster per pytest process: this one is "
                           f"{_session.key[0] or 'the local one'} with {_session.key[1]} nodes")
    return _session


def close_session() -> None:
    global _session
    if _session is not None:
        _session.close()
        _session = None


class RayWorkerHandle:
    """One worker on a Ray node, as :class:`~harness.launch.local.WorkerHandle`
    is one here: its agent answers for it."""

    def __init__(self, index: int, agent: AgentHandle, key: str, pid: int, link: ControllerLink,
                 local: bool = False):
        self.index, self.agent, self.key, self.pid, self.link = index, agent, key, pid, link
        self.local_pid = pid if local else None   # its pid is one of this machine's
        self.conn = link.conn
        self.exitcode: Optional[int] = None
        self._exited = threading.Event()
        self._read_fd, self._write_fd = os.pipe()
        threading.Thread(target=self._watch, name=f"ray-exit-{key}", daemon=True).start()

    def _watch(self) -> None:
        import ray
        try:
            code = ray.get(self.agent.wait.remote(self.key))
        except Exception:   # the agent (or its node) is gone
            code = -9
        self.link.join(5)   # what the worker sent before it died is read first
        self.exitcode = code if code is not None else -9
        self._exited.set()
        with contextlib.suppress(OSError):
            os.write(self._write_fd, b"x")

    @property
    def sentinel(self) -> int:
        """Readable once the worker exited (what the watch loop waits on)."""
        return self._read_fd

    def join(self, timeout: Optional[float] = None) -> None:
        self._exited.wait(timeout)

    def _call(self, method: str, *args):
        import ray
        try:
            return ray.get(getattr(self.agent, method).remote(self.key, *args),
                           timeout=CALL_TIMEOUT)
        except Exception:   # the agent is gone: nothing left to act on
            return None

    def send_signal(self, sig: int) -> bool:
        return bool(self._call("signal", int(sig)))

    def is_stopped(self) -> bool:
        return bool(self._call("is_stopped"))

    def descendants(self) -> list:
        """Listed on the node (by the agent, for :meth:`kill_tree`); none here."""
        self._call("remember_descendants")
        return []

    def kill_tree(self, known: Sequence = ()) -> None:
        self._call("kill_tree")

    def memory_bytes(self) -> Optional[int]:
        """The worker's resident set when its node is this machine (a local
        cluster's simulated node: ``local_pid``); None on a cluster at an
        address, whose pids are their nodes' (no samples there)."""
        return memory.READ(self.local_pid) if self.local_pid is not None else None

    def close(self) -> None:
        self._call("close")
        self.link.close()
        self._exited.wait(5)
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


class RayLauncher(Launcher):
    """Workers on a Ray cluster; see the module docstring."""

    start_method = "forkserver"   # on each node

    def __init__(self, address: Optional[str] = None, nodes: int = 2,
                 preload: Sequence[str] = ()) -> None:
        self.address, self.nodes, self.preload = address, nodes, tuple(preload)
        self._agents: List[AgentHandle] = []   # the last placement's agent per worker
        self._runs = 0

    def _session(self) -> RaySession:
        return session(self.address, self.nodes, self.preload)

    def prewarm(self) -> None:
        s = self._session()
        for node in s.nodes():
            s.agent(node)

    @contextlib.contextmanager
    def place(self, num_workers: int, state_dir: Optional[str] = None):
        import ray
        s = self._session()
        nodes = s.nodes()
        if not nodes:
            raise HarnessError("the Ray cluster has no alive node")
        on = [nodes[i % len(nodes)] for i in range(num_workers)]
        self._runs += 1
        key = f"{os.getpid()}-{self._runs}"
        counts = {node: on.count(node) + (node == on[0]) for node in dict.fromkeys(on)}
        agents = {node: s.agent(node) for node in counts}
        try:
            got = dict(zip(counts, ray.get([agents[n].reserve.remote(key, c, state_dir)
                                            for n, c in counts.items()], timeout=CALL_TIMEOUT)))
            spare = got[on[0]].pop()
            ports = tuple(got[node].pop(0) for node in on)
            self._agents = [agents[node] for node in on]
            yield Placement(ports, spare, tuple(s.hosts[node] for node in on))
        finally:
            for agent in agents.values():
                agent.release.remote(key)

    def start(self, specs: Sequence[WorkerSpec]) -> List[RayWorkerHandle]:
        import ray
        s = self._session()
        authkey = secrets.token_bytes(32)
        listener = socket.create_server((s.listen_host, 0))
        listener.settimeout(CONNECT_TIMEOUT)
        keys = [f"{os.getpid()}-{self._runs}-{time.monotonic_ns()}-{spec.index}"
                for spec in specs]
        handles: List[RayWorkerHandle] = []
        try:
            pids = ray.get([self._agents[spec.index].start.remote(
                key, spec, listener.getsockname()[:2], authkey, time.monotonic())
                for key, spec in zip(keys, specs)], timeout=START_TIMEOUT)
            conns: Dict[str, connection.Connection] = {}
            while len(conns) < len(specs):
                sock, _ = listener.accept()
                sock.settimeout(None)
                conn = connection.Connection(sock.detach())
                connection.deliver_challenge(conn, authkey)
                connection.answer_challenge(conn, authkey)
                conns[conn.recv_bytes().decode()] = conn
            for key, spec, pid in zip(keys, specs, pids):
                link = ControllerLink(conns[key], spec.index, spec.progress_path, {
                    "log": spec.log_path, "stack": spec.stack_path,
                    "replicas": spec.replicas_path})
                handles.append(RayWorkerHandle(spec.index, self._agents[spec.index], key, pid,
                                               link, local=self.address is None))
        except BaseException:
            for spec, key in zip(specs, keys):
                with contextlib.suppress(Exception):
                    self._agents[spec.index].kill_tree.remote(key)
            raise
        finally:
            listener.close()
        return handles


def _launcher(settings) -> RayLauncher:
    return RayLauncher(settings.ray_address, settings.ray_nodes, settings.preload)


def _check(settings, option: str) -> None:
    ok, why = available()
    if not ok:
        raise SettingError(f"{option}=ray: {why}")
    if settings.network == "isolated":
        raise SettingError(f"{option}=ray: workers run on the Ray nodes' own network, so "
                           f"network='isolated' cannot be had; use auto or host")
    if uses_gpus(settings.devices):
        raise SettingError(f"{option}=ray: GPUs are not handed out on Ray yet; use "
                           f"--mwms-devices=cpu")
    if settings.shape.coordinated:
        # A server follows its coordinator's steps in a file of the chief's machine.
        raise SettingError(f"{option}=ray: a cluster with parameter servers "
                           f"({settings.shape}) runs on the local backend only")


def _where(settings) -> str:
    where = settings.ray_address or f"a local cluster of {settings.ray_nodes} nodes"
    return f"backend ray ({where}); network: the nodes' own"


BACKEND = Backend(
    name="ray",
    launcher=_launcher,
    check=_check,
    no_network_namespace="--mwms-backend=ray: the nodes' own network",
    where=_where,
    # The session's cluster is started by the first run that needs one.
    prewarm=lambda settings: None,
    close_session=close_session)
