"""A local Ray cluster whose nodes share nothing but the code:
``python -m harness.launch.ray.hosts NODES TMPDIR``.

For the test that the Ray backend needs no shared loopback, ``/tmp`` or
address (``tests/test_ray.py``): each of ``NODES`` nodes runs in a network
namespace of its own on a bridge (:class:`harness.network.namespace.Switch`:
node ``i`` at ``10.77.0.(i+1)``, no loopback shared with anyone) and a
mount namespace of its own with a private ``/tmp`` (a tmpfs, its Ray
session directory in it).  The head node (the GCS, no CPUs) runs in the
bridge's namespace at ``10.77.0.254``, where the driver must join it: a Ray
driver needs a raylet on its own host, sharing its ``/tmp`` (the head's
session directory is ``TMPDIR``).  The launcher puts worker ``i`` on the
``i``-th node in address order, and ``10.77.0.254`` sorts after
``10.77.0.2`` but before ``10.77.0.3``: with up to 2 nodes and as many
workers, none is on the head.

Like :mod:`harness.launch.ray.holder`, this process owns all of it: a child
subreaper, it prints ``ready GCS_ADDRESS USER_NS NET_NS`` (the namespaces a
driver joins, :func:`harness.core.linux.enter_namespaces`), reads stdin, and
when stdin closes or its parent dies it kills every descendant, removes
``TMPDIR`` and exits.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from harness.launch.ray import holder
from harness.network.namespace import BRIDGE_HOST, Switch

GCS_PORT = 6379
OBJECT_STORE = 80 * 1024 * 1024
START_WAIT = 100.0   # below the launcher's START_TIMEOUT, so a cluster that fails says so


def ray_command(*args: str) -> list:
    # The bin directory's real path: a virtual environment reached through a
    # link in /tmp is not there on a node with a /tmp of its own.
    return [os.path.join(os.path.realpath(os.path.dirname(sys.executable)), "ray"),
            "start", "--block",
            "--disable-usage-stats", f"--object-store-memory={OBJECT_STORE}", *args]


def start_head(switch: Switch, tmpdir: str, env: dict) -> subprocess.Popen:
    """The head node, in the bridge's namespace, its session in ``tmpdir``."""
    return subprocess.Popen(
        ["nsenter", "-t", str(switch.anchor.pid), "-U", "-n", "--preserve-credentials", "--",
         *ray_command("--head", f"--node-ip-address={BRIDGE_HOST}", f"--port={GCS_PORT}",
                      "--num-cpus=0", "--include-dashboard=false")],
        env={**env, "RAY_TMPDIR": tmpdir}, stdin=subprocess.DEVNULL,
        stdout=sys.stderr, stderr=sys.stderr)


def start_node(switch: Switch, index: int, env: dict) -> subprocess.Popen:
    """Node ``index`` in its own network namespace, with a private /tmp."""
    host = switch.hosts[index]
    command = " ".join(ray_command(f"--address={BRIDGE_HOST}:{GCS_PORT}",
                                   f"--node-ip-address={host}", "--num-cpus=1",
                                   f"--resources='{{\"mwms_node_{index}\": 1}}'"))
    return subprocess.Popen(
        ["nsenter", "-t", str(switch.holders[index]), "-U", "-n", "--preserve-credentials",
         "--", "unshare", "-m", "sh", "-c",
         f"mount -t tmpfs tmpfs /tmp && mkdir /tmp/ray && exec {command}"],
        env={**env, "RAY_TMPDIR": "/tmp/ray", "TMPDIR": "/tmp"}, stdin=subprocess.DEVNULL,
        stdout=sys.stderr, stderr=sys.stderr)


def wait_for_nodes(switch: Switch, tmpdir: str, env: dict, count: int) -> None:
    """Until ``count`` nodes are alive, asked from the bridge's namespace."""
    probe = ("import ray, sys, time\n"
             f"ray.init(address='{BRIDGE_HOST}:{GCS_PORT}', log_to_driver=False)\n"
             "said = None\n"
             f"while True:\n"
             "    alive = sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive'])\n"
             "    if alive != said:\n"
             "        print('alive:', alive, file=sys.stderr, flush=True); said = alive\n"
             f"    if len(alive) >= {count}: break\n"
             "    time.sleep(0.2)\n")
    subprocess.run(["nsenter", "-t", str(switch.anchor.pid), "-U", "-n",
                    "--preserve-credentials", "--", sys.executable, "-c", probe],
                   env={**env, "RAY_TMPDIR": tmpdir}, stdout=sys.stderr, stderr=sys.stderr,
                   timeout=START_WAIT, check=True)


def main(argv) -> None:
    from harness.core import linux
    nodes, tmpdir = int(argv[0]), argv[1]
    holder.remove_at_end(tmpdir)
    linux.become_subreaper()
    signal.signal(signal.SIGTERM, holder.end)
    linux.set_parent_death_signal(signal.SIGTERM)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    try:
        switch = Switch(nodes)
        start_head(switch, tmpdir, env)
        time.sleep(1.0)
        for i in range(nodes):
            start_node(switch, i, env)
        wait_for_nodes(switch, tmpdir, env, nodes + 1)
    except BaseException as e:   # said to the caller, then cleaned
        print(f"failed {type(e).__name__}: {e}".replace("\n", " "), flush=True)
        holder.end()
    user_ns, net_ns = switch.paths(0)[0], f"/proc/{switch.anchor.pid}/ns/net"
    print(f"ready {BRIDGE_HOST}:{GCS_PORT} {user_ns} {net_ns}", flush=True)
    while sys.stdin.buffer.read(65536):
        pass
    holder.end()


if __name__ == "__main__":
    main(sys.argv[1:])
