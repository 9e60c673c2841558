"""Shared helpers for the harness's own tests (no TensorFlow at import)."""
import os
import time

import psutil

from harness.launcher import forkserver_pid


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

    A forked worker's TF_CONFIG does not show in /proc/PID/environ, so look
    for the TensorFlow library in the memory maps instead.
    """
    skip = {os.getpid(), forkserver_pid(), *exclude}
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid in skip or not _ours(proc):
            continue
        try:
            with open(f"/proc/{proc.pid}/maps") as f:
                if "libtensorflow_framework" in f.read():
                    if proc.status() != psutil.STATUS_ZOMBIE:
                        found.append(proc.pid)
        except (OSError, psutil.Error):
            continue
    return found


def wait_gone(pids, seconds=10.0):
    """Wait until none of ``pids`` is alive (zombies count as gone); return the survivors."""
    deadline = time.monotonic() + seconds
    alive = list(pids)
    while True:
        alive = [p for p in alive if _alive(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def allreduce_steps(n_steps=20):
    """The canonical small workload: n all-reduce steps on one scalar."""
    import tensorflow as tf
    import harness
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    @tf.function
    def step():
        value = strategy.run(lambda: tf.constant(1.0))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)

    total = None
    for _ in ctx.steps(n_steps):
        total = step()
    return float(total)


def variable_loop(n_steps):
    """The standard faulted workload: a variable made in ``strategy.scope()``
    and one all-reduce of it per step.  Returns the sum of the reductions."""
    import tensorflow as tf
    import harness
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = tf.Variable(1.0)

    @tf.function
    def step():
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: w * 1.0), axis=None)

    total = 0.0
    for _ in ctx.steps(n_steps):
        total += float(step())
    return total
