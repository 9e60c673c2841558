"""Summaries (TensorBoard's event files) from every worker: each worker of
an MWMS job runs the same code, so a summary writer the job makes is made
on every worker.  Where they all point at one run directory, TensorBoard
reads the workers' event files as one run's, a point per worker at each
step.  The job completes: only the log is wrong.
"""
import os

import pytest

from scenarios.meta import scenario

STEPS = 5
EVENTS = "events.out.tfevents"


def train_with_summaries(folder, chief_only=False):
    """The variable loop, writing its sum to ``folder`` every step; with
    ``chief_only``, the other workers write to ``folder/worker-INDEX``, as
    TensorFlow's multi-worker guide says for checkpoints.  Returns the
    steps run."""
    import tensorflow as tf

    import harness
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = tf.Variable(1.0)

    @tf.function
    def step():
        return strategy.reduce("SUM", strategy.run(lambda: w * 1.0), axis=None)

    logdir = folder if ctx.is_chief or not chief_only else os.path.join(
        folder, f"worker-{ctx.index}")
    writer = tf.summary.create_file_writer(logdir)
    ran = 0
    with writer.as_default():
        for k in ctx.steps(STEPS):
            # tf.summary.write: the op under tf.summary.scalar, which needs
            # the tensorboard package (TensorFlow 2.21 does not install it).
            tf.summary.write("sum", step(), step=k)
            ran += 1
    writer.close()
    return ran


def _event_files(folder):
    return sorted(f for f in os.listdir(folder) if f.startswith(EVENTS))


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="tensorboard#1011",
          fixed_by="test_summaries_of_the_chief_in_the_run_directory")
def test_every_worker_writes_summaries_to_one_run_directory(mwms_cluster, tmp_path):
    """Every worker's writer points at the same run directory.

    TensorFlow: 2.21, measured: the directory holds one event file per
    worker (each named by its host, pid and time), each a writer of its own;
    TensorBoard shows them as one run.  The job completes.

    Source: tensorboard#1011 (several writers in one run directory).

    Fix: the chief writes to the run directory, the others to a directory
    of their own or not at all
    (``test_summaries_of_the_chief_in_the_run_directory``).
    """
    result = mwms_cluster.run(train_with_summaries, args=(str(tmp_path),), timeout=30)
    result.assert_completed()
    assert result.return_values == [STEPS] * mwms_cluster.num_workers
    assert len(_event_files(tmp_path)) == mwms_cluster.num_workers, _event_files(tmp_path)


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="tensorboard#1011")
def test_summaries_of_the_chief_in_the_run_directory(mwms_cluster, tmp_path):
    """The chief writes to the run directory, worker i to ``worker-i``.

    TensorFlow: 2.21, measured: one event file in the run directory, one
    in each worker's own.

    Source: tensorboard#1011.

    Fix: this is the fix.
    """
    result = mwms_cluster.run(train_with_summaries, args=(str(tmp_path), True), timeout=30)
    result.assert_completed()
    assert len(_event_files(tmp_path)) == 1, _event_files(tmp_path)
    for i in range(1, mwms_cluster.num_workers):
        assert len(_event_files(tmp_path / f"worker-{i}")) == 1
