"""The embedded Ray cluster's holder: ``python -m harness.launch.ray.holder NODES TMPDIR``.

Measured (Ray 2.60): a driver that starts a ``ray.cluster_utils.Cluster``
itself and is SIGKILLed leaves each node's dashboard agent and runtime-env
agent alive for about 60 s (until they give up on the dead GCS).  So the
cluster belongs to this process instead, which the controller starts with
pipes: it becomes a child subreaper (orphans of the Ray tree are
re-parented to it), starts ``NODES`` simulated nodes, prints ``ready
ADDRESS`` and reads stdin.  When stdin closes (the controller ended it, or
died: the pipe closes all the same) or its parent dies (SIGTERM, by
``PR_SET_PDEATHSIG``), it SIGKILLs and reaps every descendant until none
is left, removes the cluster's directory, then exits.  Nothing of the
cluster outlives pytest.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time


def kill_descendants() -> None:
    import psutil
    me = psutil.Process()
    for _ in range(200):
        children = me.children(recursive=True)
        for child in children:
            try:
                child.kill()
            except psutil.Error:
                pass
        while True:                 # reap: orphans are ours (subreaper)
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        if not children:
            return
        time.sleep(0.02)


_ending = threading.Lock()
_tmpdir = ""


def remove_at_end(tmpdir: str) -> None:
    """:func:`end` removes ``tmpdir`` (the cluster's directory)."""
    global _tmpdir
    _tmpdir = tmpdir


def end(*_) -> None:
    """Kill the cluster, remove its directory (the controller may be dead), exit."""
    if _ending.acquire(blocking=False):
        kill_descendants()
        if _tmpdir:
            shutil.rmtree(_tmpdir, ignore_errors=True)
        os._exit(0)


def main(argv) -> None:
    global _tmpdir
    from harness.core import linux
    nodes, tmpdir = int(argv[0]), argv[1]
    _tmpdir = tmpdir
    linux.become_subreaper()
    signal.signal(signal.SIGTERM, end)
    linux.set_parent_death_signal(signal.SIGTERM)
    parent = int(os.environ.get("MWMS_HOLDER_PARENT", os.getppid()))
    if os.getppid() != parent:
        end()
    os.environ["RAY_TMPDIR"] = tmpdir
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        from ray.cluster_utils import Cluster
        cluster = Cluster(initialize_head=True, head_node_args=dict(
            num_cpus=1, include_dashboard=False, resources={"mwms_node_0": 1}))
        for i in range(1, nodes):
            cluster.add_node(num_cpus=1, resources={f"mwms_node_{i}": 1})
        cluster.wait_for_nodes()
    except BaseException as e:   # said to the controller, then cleaned
        print(f"failed {type(e).__name__}: {e}".replace("\n", " "), flush=True)
        end()
    # Ray's nodes install a SIGTERM handler of their own in this process
    # (drain, then exit, leaving the directory): ours again.
    signal.signal(signal.SIGTERM, end)
    print(f"ready {cluster.address}", flush=True)
    while sys.stdin.buffer.read(65536):
        pass
    end()


if __name__ == "__main__":
    main(sys.argv[1:])
