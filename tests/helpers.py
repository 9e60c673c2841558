"""Shared helpers for the harness's own tests (no TensorFlow at import)."""
import os
import time

import psutil

from harness.core import linux
from harness.launch.local import forkserver_pid
# The canonical small workload (n all-reduce steps on one scalar) and the
# standard faulted one (one all-reduce of a scope-made variable per step).
from harness.workloads import allreduce_loop as allreduce_steps, variable_loop  # noqa: F401


_SESSION_START = time.time()


def _ours(proc):
    """Started by this pytest process: a descendant of it, or an orphan
    (re-parented to init) born since this test session began.  Other pytest
    sessions running beside this one are not ours."""
    try:
        if os.getpid() in {p.pid for p in proc.parents()}:
            return True
        return proc.ppid() == 1 and proc.create_time() >= _SESSION_START - 1
    except psutil.Error:
        return False


def tensorflow_pids(exclude=()):
    """Pids of live processes this session started that have TensorFlow
    loaded, but the forkserver (which lives as long as pytest, by design).

    A forked worker's TF_CONFIG does not show in /proc/PID/environ, so the
    TensorFlow library in its memory maps is what gives it away.
    """
    skip = {os.getpid(), forkserver_pid(), *exclude}
    return linux.tensorflow_pids(p for p in psutil.process_iter(["pid"])
                                 if p.pid not in skip and _ours(p))


def wait_gone(pids, seconds=10.0):
    """Wait until none of ``pids`` is alive (zombies count as gone); return the survivors."""
    return linux.wait_gone(pids, seconds)
