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
of their entry point (:func:`harness.linux.enter_namespaces`), while still
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

import shutil
import subprocess
from typing import Dict, List, Optional, Tuple

# The anchor: bring lo up, say so, then hold the namespaces until stdin closes.
ANCHOR = "ip link set lo up && echo ready && exec cat >/dev/null"
START_WAIT = 5.0

_probed: Optional[Tuple[bool, str]] = None


def start_anchor(script: str, env: Optional[dict] = None) -> subprocess.Popen:
    """``script`` (sh) in a new user and network namespace, its stdin, stdout
    and stderr pipes to this process."""
    return subprocess.Popen(["unshare", "-Urn", "sh", "-c", script], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, close_fds=True)


def end_anchor(anchor: subprocess.Popen) -> None:
    """Close its stdin (it exits, and what it holds with it); kill it if it lingers."""
    if anchor.poll() is None:
        try:
            anchor.stdin.close()
            anchor.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            anchor.kill()
            anchor.wait()
    for stream in (anchor.stdin, anchor.stdout, anchor.stderr):
        if stream is not None and not stream.closed:
            stream.close()


def anchor_failed(anchor: subprocess.Popen, default: str) -> OSError:
    """An anchor that did not say "ready": ended first (a live one could hold
    stderr open for ever), then the last line of what it said, as an error."""
    anchor.kill()
    anchor.wait()
    why = (anchor.stderr.read() or b"").decode(errors="replace").strip()
    end_anchor(anchor)
    return OSError(why.splitlines()[-1] if why else default)


class Namespace:
    """A user + network namespace held by an anchor process; a context manager."""

    def __init__(self) -> None:
        self.anchor = start_anchor(ANCHOR)
        if self.anchor.stdout.readline().strip() != b"ready":
            raise anchor_failed(self.anchor, "unshare -Urn did not start")

    @property
    def paths(self) -> Tuple[str, str]:
        """Where a worker joins: the anchor's user and network namespaces."""
        return (f"/proc/{self.anchor.pid}/ns/user", f"/proc/{self.anchor.pid}/ns/net")

    def close(self) -> None:
        """End the anchor: the namespace goes with the last process in it."""
        end_anchor(self.anchor)

    def __enter__(self) -> "Namespace":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# The switched topology: the anchor's namespace holds a bridge; each worker
# gets a network namespace of its own (held by a "holder" process the
# anchor starts, which dies with the anchor), joined to the bridge by a
# veth pair, at 10.77.0.(i+1).  The anchor then reads commands on stdin:
# "down I" / "up I" (worker I's link) and "rate I KBPS" (a token bucket
# both ways), and ends its holders when stdin closes.
SUBNET = "10.77.0"
SWITCH = r"""
ip link set lo up && ip link add br0 type bridge && ip link set br0 up || exit 1
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
done
""".replace("SUBNET", SUBNET)


class Switch:
    """Workers in network namespaces of their own on one bridge, for
    network faults: a worker's link can be cut (``down``/``up``) or slowed
    (``rate``).  ``paths(i)`` is where worker ``i`` joins; ``hosts`` its
    address in ``TF_CONFIG``."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.anchor = start_anchor(SWITCH, {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                            "N": str(workers)})
        self.holders: Dict[int, int] = {}
        while True:
            line = self.anchor.stdout.readline().decode(errors="replace").split()
            if line[:1] == ["holder"]:
                self.holders[int(line[1])] = int(line[2])
                continue
            if line == ["ready"]:
                break
            raise anchor_failed(self.anchor, "the switched namespace did not start")

    @property
    def hosts(self) -> List[str]:
        return [f"{SUBNET}.{i + 1}" for i in range(self.workers)]

    def paths(self, index: int) -> Tuple[str, str]:
        return (f"/proc/{self.anchor.pid}/ns/user", f"/proc/{self.holders[index]}/ns/net")

    def command(self, command: str, index: int) -> None:
        """``down``, ``up``, ``rate KBPS`` or ``clear`` on worker ``index``'s link."""
        try:
            self.anchor.stdin.write(f"{command.split()[0]} {index} "
                                    f"{' '.join(command.split()[1:])}\n".encode())
            self.anchor.stdin.flush()
        except OSError:
            pass   # the anchor is gone: the run is ending

    def reset(self) -> None:
        """Every link up and unthrottled (a new attempt of a run)."""
        for i in range(self.workers):
            self.command("clear", i)

    def close(self) -> None:
        end_anchor(self.anchor)

    __enter__ = Namespace.__enter__
    __exit__ = Namespace.__exit__


def available() -> Tuple[bool, str]:
    """Whether this machine lets this user make a network namespace per
    cluster, and why not; tried once per process."""
    global _probed
    if _probed is None:
        if not shutil.which("unshare") or not shutil.which("ip"):
            _probed = (False, "the unshare and ip commands are not installed")
        else:
            try:
                Namespace().close()
                _probed = (True, "")
            except OSError as e:
                _probed = (False, f"unshare -Urn failed: {e}")
    return _probed


_switch_probed: Optional[Tuple[bool, str]] = None


def switch_available() -> Tuple[bool, str]:
    """Whether network faults can be done here (a namespace per worker on a
    bridge, :class:`Switch`), and why not; tried once per process."""
    global _switch_probed
    if _switch_probed is None:
        ok, why = available()
        missing = [tool for tool in ("setpriv", "nsenter", "tc") if not shutil.which(tool)]
        if not ok:
            _switch_probed = (False, why)
        elif missing:
            _switch_probed = (False, f"{', '.join(missing)} not installed")
        else:
            try:
                Switch(1).close()
                _switch_probed = (True, "")
            except OSError as e:
                _switch_probed = (False, f"a bridged namespace could not be made: {e}")
    return _switch_probed


def resolve(network: str) -> Tuple[bool, str]:
    """``(isolate?, why not)`` for a ``--mwms-network`` value."""
    if network == "host":
        return False, "--mwms-network=host"
    ok, why = available()
    return ok, why
