"""Parent side: a network namespace per cluster (``--mwms-network``).

TensorFlow's gRPC server listens on every interface whatever ``TF_CONFIG``
says, so a worker on the host's network is an unauthenticated TensorFlow
server for as long as a run lasts.  Isolated, a run's workers share a
network namespace of their own, holding only a loopback interface: they
reach each other on ``127.0.0.1`` as before, and nothing outside reaches
them (the host gets "connection refused" on those ports).

The namespace is made without privileges: ``unshare -Urn`` starts an
*anchor* process in a new user and network namespace, which brings ``lo``
up and then waits on its stdin.  Workers join both namespaces at the top
of their entry point (:func:`harness.core.linux.enter_namespaces`), while still
single-threaded, so the forkserver's warm start is kept.  The anchor holds
the namespace for the run; the run closes its stdin at the end, and if
pytest dies the pipe closes all the same: the anchor exits, and the
namespace goes with the last process in it (the workers die with their
parent).  Nothing named is created, so nothing can be left behind.

Where user namespaces are not allowed (some distributions restrict them;
containers often block ``unshare``), ``auto`` runs on the host's loopback
and says why once; ``isolated`` is then a usage error.
"""
from __future__ import annotations

import copy
import json
import os
import select
import shutil
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

from harness.core.linux import pipe

# The anchor: bring lo up, say so, then hold the namespaces until stdin closes.
ANCHOR = "ip link set lo up && echo ready && exec cat >/dev/null"
START_WAIT = 5.0
# How long a command to the switch or the proxy may take (milliseconds, as a rule).
COMMAND_WAIT = 10.0
# How long a probe of a link waits for an answer: a link that answers does
# in well under a millisecond on one machine.
PROBE_SECONDS = 0.5

def start_anchor(script: str, env: Optional[dict] = None,
                 flags: str = "-Urn") -> subprocess.Popen[bytes]:
    """``script`` (sh) in a new user and network namespace (``flags``:
    ``unshare``'s, ``-Urnm`` for a mount namespace too), its stdin, stdout
    and stderr pipes to this process."""
    return subprocess.Popen(["unshare", flags, "sh", "-c", script], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, close_fds=True)


def end_anchor(anchor: subprocess.Popen[bytes]) -> None:
    """Close its stdin (it exits, and what it holds with it); kill it if it lingers."""
    if anchor.poll() is None:
        try:
            pipe(anchor.stdin).close()
            anchor.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            anchor.kill()
            anchor.wait()
    for stream in (anchor.stdin, anchor.stdout, anchor.stderr):
        if stream is not None and not stream.closed:
            stream.close()


def await_done(process: subprocess.Popen[bytes]) -> None:
    """Wait for ``process`` (the switch's anchor, the proxy) to end the line
    that says it carried out the command it was sent; not past its end, nor
    past :data:`COMMAND_WAIT` (a run that is ending)."""
    fd = pipe(process.stdout).fileno()
    deadline = time.monotonic() + COMMAND_WAIT
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return
        byte = os.read(fd, 1)   # unbuffered: the next line is the next command's
        if byte in (b"", b"\n"):
            return


def anchor_failed(anchor: subprocess.Popen[bytes], default: str) -> OSError:
    """An anchor that did not say "ready": ended first (a live one could hold
    stderr open for ever), then the last line of what it said, as an error."""
    anchor.kill()
    anchor.wait()
    why = (pipe(anchor.stderr).read() or b"").decode(errors="replace").strip()
    end_anchor(anchor)
    return OSError(why.splitlines()[-1] if why else default)


# The anchor of a cluster whose host names the run decides (UnresolvedHost):
# it also holds a mount namespace in which /etc/hosts is its own (a copy of
# the host's) and names are looked up in it alone (nsswitch "hosts: files":
# a name it lacks fails at once, "Name or service not known", as a name
# the cluster's DNS does not know yet).  The copies are bind-mounted, then
# unlinked, so nothing of them is left outside.  It then reads commands:
# "resolve NAME ADDRESS" (NAME resolves to ADDRESS from now on; written in
# place, so the bind mount sees it) and "forget" (every name unresolved
# again: a new attempt).  When is the parent's business (a timer thread,
# so no process of the anchor's outlives it).
NAMED_ANCHOR = r"""
ip link set lo up || exit 1
d=$(mktemp -d) || exit 1
cp /etc/hosts "$d/hosts" && printf 'hosts: files\n' > "$d/nsswitch" \
  && mount --bind "$d/hosts" /etc/hosts && mount --bind "$d/nsswitch" /etc/nsswitch.conf
ok=$?
rm -rf "$d"
[ $ok -eq 0 ] || exit 1
base=$(cat /etc/hosts)
echo ready
while read -r cmd name address; do
  case "$cmd" in
    resolve) echo "$address $name" >> /etc/hosts ;;
    forget) printf '%s\n' "$base" > /etc/hosts ;;
  esac
done
"""


class Namespace:
    """A user + network namespace held by an anchor process; a context manager.

    With ``names``, it also holds a mount namespace with an ``/etc/hosts``
    of its own (:data:`NAMED_ANCHOR`), where :meth:`resolve` makes a host
    name resolve from a given moment on."""

    def __init__(self, names: bool = False) -> None:
        self.names = names
        self.timers: List[threading.Timer] = []
        self.anchor = (start_anchor(NAMED_ANCHOR, {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                                    flags="-Urnm") if names else start_anchor(ANCHOR))
        if pipe(self.anchor.stdout).readline().strip() != b"ready":
            raise anchor_failed(self.anchor, "unshare -Urn did not start")

    @property
    def paths(self) -> Tuple[str, ...]:
        """Where a worker joins: the anchor's user and network namespaces
        (and its mount namespace, with ``names``)."""
        ns = f"/proc/{self.anchor.pid}/ns"
        return (f"{ns}/user", f"{ns}/net") + ((f"{ns}/mnt",) if self.names else ())

    def resolve(self, name: str, address: str, seconds: float) -> None:
        """``name`` resolves to ``address`` in the namespace ``seconds`` from now."""
        timer = threading.Timer(seconds, self._command, (f"resolve {name} {address}",))
        timer.daemon = True
        self.timers.append(timer)
        timer.start()

    def forget(self) -> None:
        """No name of :meth:`resolve` resolves any more, nor will."""
        self._cancel()
        self._command("forget")

    def _cancel(self) -> None:
        for timer in self.timers:
            timer.cancel()
        for timer in self.timers:
            # A cancelled timer's thread ends at once, but not before cancel()
            # returns: joined, none is left when the namespace is closed.
            if timer is not threading.current_thread():
                timer.join(1.0)
        self.timers.clear()

    def _command(self, line: str) -> None:
        try:
            stdin = pipe(self.anchor.stdin)
            stdin.write(line.encode() + b"\n")
            stdin.flush()
        except OSError:
            pass   # it is gone: the run is ending

    def close(self) -> None:
        """End the anchor: the namespace goes with the last process in it."""
        self._cancel()
        end_anchor(self.anchor)

    def __enter__(self) -> Namespace:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# The switched topology: the anchor's namespace holds a bridge; each worker
# gets a network namespace of its own (held by a "holder" process the
# anchor starts, which dies with the anchor), joined to the bridge by a
# veth pair, at 10.77.0.(i+1).  The anchor then reads commands on stdin:
# "down I" / "up I" (worker I's link) and "rate I KBPS" (a token bucket
# both ways), and ends its holders when stdin closes.  The bridge itself is
# at SUBNET.254: where the proxy (harness.network.proxy) listens when a run has one;
# at SUBNET.253 the proxy's routes to the probes' echoes (harness.network.probe),
# the same port for each pair of workers.
SUBNET = "10.77.0"
BRIDGE_HOST = SUBNET + ".254"
ECHO_HOST = SUBNET + ".253"
# The probes' echo in each worker's namespace: a namespace the run's own,
# where nothing else binds.
ECHO_PORT = 7
SWITCH = r"""
ip link set lo up && ip link add br0 type bridge && ip link set br0 up || exit 1
ip addr add SUBNET.254/24 dev br0 && ip addr add SUBNET.253/24 dev br0 || exit 1
pids=""
trap 'kill $pids 2>/dev/null' EXIT
mine=$(readlink /proc/$$/ns/net)
i=0
while [ $i -lt $N ]; do
  setpriv --pdeathsig KILL unshare -n sh -c 'ip link set lo up; exec sleep 2147483647' &
  pid=$!
  pids="$pids $pid"
  eval "pid_$i=$pid"
  while [ "$(readlink /proc/$pid/ns/net)" = "$mine" ]; do sleep 0.005; done
  ip link add v$i type veth peer name eth0 netns $pid || exit 1
  ip link set v$i master br0 up || exit 1
  nsenter -t $pid -n sh -c "ip addr add SUBNET.$((i + 1))/24 dev eth0 && ip link set eth0 up" \
    || exit 1
  echo "holder $i $pid"
  i=$((i + 1))
done
echo ready
while read -r cmd i arg; do
  eval "pid=\$pid_$i"
  case "$cmd" in
    down) ip link set v$i down ;;
    up) ip link set v$i up ;;
    rate) tc qdisc replace dev v$i root tbf rate "${arg}kbit" burst 16kb latency 50ms
          nsenter -t $pid -n tc qdisc replace dev eth0 root tbf rate "${arg}kbit" burst 16kb \
            latency 50ms ;;
    clear) ip link set v$i up; tc qdisc del dev v$i root 2>/dev/null
           nsenter -t $pid -n tc qdisc del dev eth0 root 2>/dev/null ;;
  esac
  echo done
done
""".replace("SUBNET", SUBNET)


# Commands the proxy carries out (the rest act on a link); "clear" goes to both.
PROXY_VERBS = ("delay", "reset")
# Proxy port of the pair (src, dst): PROXY_BASE + src * MAX_WORKERS + dst.  The
# proxy listens in the bridge's namespace, where no other process binds.
PROXY_BASE = 20000
MAX_WORKERS = 200


def needs_proxy(commands) -> bool:
    """Whether any of these network commands is the proxy's."""
    return any(command.split()[0] in PROXY_VERBS for command in commands)


class Switch:
    """Workers in network namespaces of their own on one bridge, for
    network faults: a worker's link can be cut (``down``/``up``) or slowed
    (``rate``).  ``paths(i)`` is where worker ``i`` joins; ``hosts`` its
    address in ``TF_CONFIG``.

    With ``proxied_ports`` (the workers' ports), a TCP proxy
    (:mod:`harness.network.proxy`) also stands between every two workers, for
    ``delay`` and ``reset``: :meth:`route` gives each worker its view of
    the cluster (its peers at their proxy ports), :meth:`logical` maps a
    view back, so the diagnosis reads the cluster a worker was meant to
    see, never the harness's plumbing."""

    def __init__(self, workers: int, proxied_ports: Optional[Sequence[int]] = None) -> None:
        if workers > MAX_WORKERS:
            raise ValueError(f"network faults take at most {MAX_WORKERS} workers")
        self.workers = workers
        self.proxy: Optional[subprocess.Popen[bytes]] = None
        self.proxied: Dict[str, str] = {}    # proxy address -> the worker address behind it
        self.anchor = start_anchor(SWITCH, {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                            "N": str(workers)})
        self.holders: Dict[int, int] = {}
        while True:
            line = pipe(self.anchor.stdout).readline().decode(errors="replace").split()
            if line[:1] == ["holder"]:
                self.holders[int(line[1])] = int(line[2])
                continue
            if line == ["ready"]:
                break
            raise anchor_failed(self.anchor, "the switched namespace did not start")
        if proxied_ports is not None:
            try:
                self._start_proxy(list(proxied_ports))
            except BaseException:
                self.close()
                raise

    def _start_proxy(self, ports: List[int]) -> None:
        self.addresses = [f"{host}:{port}" for host, port in zip(self.hosts, ports)]
        pairs = [(src, dst) for src in range(self.workers) for dst in range(self.workers)
                 if src != dst]
        routes = [[BRIDGE_HOST, self._proxy_port(src, dst), self.hosts[dst], ports[dst], src, dst]
                  for src, dst in pairs]
        routes += [[ECHO_HOST, self._proxy_port(src, dst), self.hosts[dst], ECHO_PORT, src, dst]
                   for src, dst in pairs]
        self.proxied = {f"{BRIDGE_HOST}:{self._proxy_port(src, dst)}": self.addresses[dst]
                        for src, dst in pairs}
        self.proxy = subprocess.Popen(
            [sys.executable, "-m", "harness.network.proxy", f"/proc/{self.anchor.pid}/ns/user",
             f"/proc/{self.anchor.pid}/ns/net"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, close_fds=True)
        stdin = pipe(self.proxy.stdin)
        stdin.write((json.dumps(routes) + "\n").encode())
        stdin.flush()
        if pipe(self.proxy.stdout).readline().strip() != b"ready":
            raise anchor_failed(self.proxy, "the proxy did not start")

    @staticmethod
    def _proxy_port(src: int, dst: int) -> int:
        return PROXY_BASE + src * MAX_WORKERS + dst

    @property
    def hosts(self) -> List[str]:
        return [f"{SUBNET}.{i + 1}" for i in range(self.workers)]

    def route(self, configs: List[Optional[dict]]) -> List[Optional[dict]]:
        """Each worker's ``TF_CONFIG`` with its peers' addresses replaced by
        their proxy ports (unchanged without a proxy).  A worker's own
        address stays: it is where it listens."""
        if self.proxy is None:
            return configs
        out: List[Optional[dict]] = []
        for src, given in enumerate(configs):
            workers = (given or {}).get("cluster", {}).get("worker")
            config = given
            if given is not None and isinstance(workers, list):
                config = copy.deepcopy(given)
                config["cluster"]["worker"] = [
                    f"{BRIDGE_HOST}:{self._proxy_port(src, self.addresses.index(a))}"
                    if a in self.addresses and a != self.addresses[src] else a for a in workers]
            out.append(config)
        return out

    def logical(self, config: Optional[dict]) -> Optional[dict]:
        """A worker's ``TF_CONFIG`` as it would be without the proxy."""
        if not self.proxied or not isinstance(config, dict) \
                or not isinstance(config.get("cluster", {}).get("worker"), list):
            return config
        config = copy.deepcopy(config)
        config["cluster"]["worker"] = [self.proxied.get(a, a) for a in config["cluster"]["worker"]]
        return config

    def paths(self, index: int) -> Tuple[str, str]:
        return (f"/proc/{self.anchor.pid}/ns/user", f"/proc/{self.holders[index]}/ns/net")

    def command(self, command: str, index: int) -> None:
        """``down``, ``up``, ``rate KBPS`` or ``clear`` on worker ``index``'s
        link; ``delay MS JITTER`` or ``reset`` on its proxied connections."""
        verb, *args = command.split()
        line = f"{verb} {index} {' '.join(args)}\n".encode()
        chosen = ([self.proxy] if verb in PROXY_VERBS else
                  [self.anchor, self.proxy] if verb == "clear" else [self.anchor])
        targets = [process for process in chosen if process is not None]
        for process in targets:
            try:
                stdin = pipe(process.stdin)
                stdin.write(line)
                stdin.flush()
            except OSError:
                pass   # it is gone: the run is ending
        for process in targets:
            await_done(process)

    def probe(self, ports: Sequence[int], seconds: float = PROBE_SECONDS) -> List[list]:
        """Every link tried (:mod:`harness.network.probe`), from the bridge
        (``"switch"``) and from each worker's namespace to each worker's
        port of ``ports``: ``[[source, target, how, ms], ...]``, a worker's
        rows with a fifth field, its round trip to the target's echo
        (through the proxy where the run has one).  Raises
        ``OSError`` or ``ValueError`` when the prober fails."""
        spec = {"sources": {"switch": f"/proc/{self.anchor.pid}/ns/net",
                            **{str(i): f"/proc/{pid}/ns/net" for i, pid in self.holders.items()}},
                "targets": {str(i): [host, port] for i, (host, port)
                            in enumerate(zip(self.hosts, ports))},
                "seconds": seconds,
                # The echoes are reached the way the workers reach each other.
                "echo": {"port": ECHO_PORT, "routes": {
                    str(src): {str(dst): [ECHO_HOST, self._proxy_port(src, dst)]
                               for dst in range(self.workers) if dst != src}
                    for src in range(self.workers)} if self.proxy is not None else {}}}
        try:
            done = subprocess.run(
                [sys.executable, "-m", "harness.network.probe", f"/proc/{self.anchor.pid}/ns/user"],
                input=json.dumps(spec) + "\n", capture_output=True, text=True, check=False,
                timeout=seconds + COMMAND_WAIT, close_fds=True)
        except subprocess.TimeoutExpired as e:
            raise OSError(f"the prober did not answer within {e.timeout:g} s") from None
        lines = done.stdout.splitlines()
        if done.returncode != 0 or not lines:
            raise OSError(f"the prober failed: {done.stderr.strip()[-300:] or done.returncode}")
        return json.loads(lines[-1])

    def reset(self) -> None:
        """Every link up and unthrottled (a new attempt of a run)."""
        for i in range(self.workers):
            self.command("clear", i)

    def close(self) -> None:
        if self.proxy is not None:
            end_anchor(self.proxy)
        end_anchor(self.anchor)

    def __enter__(self) -> Switch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# Each probe's answer, once known, as JSON in this variable of the
# environment: a worker (its environment is the parent's) and a process it
# starts know it without probing again.  A test module that asks at import
# (a skip mark) is imported again by every worker of every run of its
# functions, and each probe starts processes.
PROBES_VARIABLE = "MWMS_NETWORK_PROBES"


def _probe_namespace() -> Tuple[bool, str]:
    if not shutil.which("unshare") or not shutil.which("ip"):
        return False, "the unshare and ip commands are not installed"
    try:
        Namespace().close()
    except OSError as e:
        return False, f"unshare -Urn failed: {e}"
    return True, ""


def _probe_switch() -> Tuple[bool, str]:
    ok, why = available()
    missing = [tool for tool in ("setpriv", "nsenter", "tc") if not shutil.which(tool)]
    if not ok:
        return False, why
    if missing:
        return False, f"{', '.join(missing)} not installed"
    try:
        Switch(1).close()
    except OSError as e:
        return False, f"a bridged namespace could not be made: {e}"
    return True, ""


def _probe_names() -> Tuple[bool, str]:
    ok, why = available()
    if not ok:
        return False, why
    if not shutil.which("mount"):
        return False, "the mount command is not installed"
    try:
        Namespace(names=True).close()
    except OSError as e:
        return False, f"unshare -Urnm with a bind-mounted /etc/hosts failed: {e}"
    return True, ""


PROBES = {"namespace": _probe_namespace, "switch": _probe_switch, "names": _probe_names}


def _probed(name: str) -> Tuple[bool, str]:
    """Probe ``name``'s answer: from the environment when this process or
    its parent has it, else tried now and put there."""
    try:
        known = dict(json.loads(os.environ.get(PROBES_VARIABLE) or "{}"))
    except (ValueError, TypeError):
        known = {}
    try:
        ok, why = known[name]
        return bool(ok), str(why)
    except (KeyError, TypeError, ValueError):
        answer = PROBES[name]()
    os.environ[PROBES_VARIABLE] = json.dumps({**known, name: list(answer)})
    return answer


def available() -> Tuple[bool, str]:
    """Whether this machine lets this user make a network namespace per
    cluster, and why not; tried once (:data:`PROBES_VARIABLE`)."""
    return _probed("namespace")


def switch_available() -> Tuple[bool, str]:
    """Whether network faults can be done here (a namespace per worker on a
    bridge, :class:`Switch`), and why not; tried once."""
    return _probed("switch")


def names_available() -> Tuple[bool, str]:
    """Whether a cluster namespace can have an ``/etc/hosts`` of its own
    here (``Namespace(names=True)``: a mount namespace too), and why not;
    tried once."""
    return _probed("names")
