"""Shared helpers for the harness's own tests (no TensorFlow at import)."""
import os
import textwrap
import uuid

import psutil

from harness.core import linux
from harness.launch.local import forkserver_pid
# The canonical small workload (n all-reduce steps on one scalar) and the
# standard faulted one (one all-reduce of a scope-made variable per step).
from harness.workloads import allreduce_loop as allreduce_steps, variable_loop  # noqa: F401


# Every process this pytest process starts inherits the mark, forked
# workers included (the forkserver starts after this module is imported),
# and keeps it when it is orphaned: "ours" means started by this session,
# whoever its parent is now.  Each process sets its own (pytest-xdist's
# workers import this file too), so sessions side by side never count
# each other's workers.
SESSION_MARK = "MWMS_TEST_SESSION"
os.environ[SESSION_MARK] = uuid.uuid4().hex


def _ours(proc: psutil.Process) -> bool:
    try:
        return proc.environ().get(SESSION_MARK) == os.environ[SESSION_MARK]
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


def tutorial_loop(steps=10, pause=0.0, evaluate_every=0):
    """A custom training loop the way TensorFlow's tutorials write one: it
    reads TF_CONFIG through the strategy and knows nothing of the harness."""
    import time

    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = tf.Variable(1.0)

    @tf.function
    def train_step():
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: w * 1.0),
                               axis=None)

    @tf.function
    def eval_step():
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(lambda: w * 0.5),
                               axis=None)

    total = 0.0
    for k in range(steps):
        total += float(train_step())
        if evaluate_every and k % evaluate_every == evaluate_every - 1:
            float(eval_step())
        time.sleep(pause)   # data loading, logging: time between collectives
    return total


# Prepended to a script whose run must complete.  Leave together: a worker whose process
# ends right after the last all-reduce can cut a peer's read of its data,
# so every worker first waits at the coordination service's barrier; and
# the chief, which hosts that service, ends only once each peer has its
# answer from the barrier (a peer still waiting for it when the chief's
# process ended got "UnavailableError: Socket closed", seen in CI on
# TensorFlow 2.15.1).  A peer says so with a file in `where`, the chief
# waits for them all and removes them.
LEAVE_TOGETHER = textwrap.dedent('''\
    def leave_together(strategy, where):
        import glob, os, time
        from tensorflow.python.eager import context
        context.context().wait_at_barrier("training-done", 60000)
        task_id = strategy.cluster_resolver.task_id
        if task_id:
            open(os.path.join(where, f"left-{task_id}"), "w").close()
            return
        peers = strategy.cluster_resolver.cluster_spec().num_tasks("worker") - 1
        deadline = time.monotonic() + 60
        while len(glob.glob(os.path.join(where, "left-*"))) < peers:
            if time.monotonic() > deadline:
                raise TimeoutError("the chief's peers never said they left")
            time.sleep(0.01)
        for path in glob.glob(os.path.join(where, "left-*")):
            os.remove(path)


''')
