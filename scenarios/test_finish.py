"""How a job ends: workers that finish at different times.

A training script ends when its main returns, and its process goes with
it.  These runs ask the harness for the same (``on_return="exit"``), so
the other workers see the worker leave, as they would in a real cluster.
"""
import textwrap

import pytest

from scenarios.meta import scenario

STEPS = 6
EVAL_STEPS = 3


def train_then_evaluate(uneven_tail=False):
    """The seed's loop for 6 steps, then an evaluation whose every step
    all-reduces its metric; with ``uneven_tail`` worker 0 evaluates one
    batch fewer than the others (its own count of validation batches)."""
    import tensorflow as tf

    import harness
    from scenarios import mnist_like
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model, _, step = mnist_like.make_training(strategy)
    x, y = mnist_like.make_data()
    iterator = iter(mnist_like.distributed_dataset(strategy, x, y))
    for _ in ctx.steps(STEPS):
        step(next(iterator))

    @tf.function
    def evaluate(inputs):
        def replica(images, labels):
            hits = tf.cast(tf.equal(tf.argmax(model(images), axis=1), labels), tf.float32)
            return tf.reduce_sum(hits)
        return strategy.reduce("SUM", strategy.run(replica, args=inputs), axis=None)

    eval_steps = EVAL_STEPS - 1 if (uneven_tail and ctx.index == 0) else EVAL_STEPS
    return [float(evaluate(next(iterator))) for _ in range(eval_steps)]


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="UnavailableError", source="tensorflow#58434",
          fixed_by="test_workers_run_the_same_tail")
def test_worker_leaves_while_others_evaluate(mwms_cluster):
    """Worker 0 evaluates one batch fewer than the others, returns and its
    process ends while the others still evaluate.

    TensorFlow: the others' last evaluation all-reduce needs a peer that is
    gone: they raise ``UnavailableError`` (its connection refused, or its
    heartbeats stopped), echoes the harness reads as such: worker 0 is
    named as the worker that left while they still needed it, at every
    size (the ``left_early`` rule).  Kept in the cluster instead
    (``on_return="stay"``), the same job hangs in that all-reduce.

    Source: tensorflow#58434 (workers that finish at different times; the
    coordination service's errors at shutdown).

    Fix: every worker runs the same tail (the same number of evaluation
    steps, agreed before the loop), so none leaves while a collective still
    needs it.
    """
    result = mwms_cluster.run(train_then_evaluate, kwargs={"uneven_tail": True},
                              timeout=30, grace=20, on_return="exit")
    result.assert_failed(error="UnavailableError")
    assert result.workers[0].returned and result.workers[0].exit_code == 0
    assert all(w.exception is not None and w.exception.type_name == "UnavailableError"
               for w in result.workers[1:])
    result.assert_culprit(0)   # it left; the others failed because it did
    assert result.verdict.rule == "left_early"
    assert result.diagnosis.startswith(
        "FAILED: worker 0 returned and its process ended after 2 calls of `evaluate`"), \
        result.diagnosis


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="tensorflow#58434")
def test_workers_run_the_same_tail(mwms_cluster):
    """Fixed: every worker evaluates the same number of batches, then ends.

    TensorFlow: the evaluation's all-reduces pair up; each worker's process
    ends when its main returns, after the last collective: nothing waits for
    a worker that left.

    Source: tensorflow#58434.

    Fix: this.
    """
    result = mwms_cluster.run(train_then_evaluate, timeout=30, on_return="exit")
    result.assert_completed()
    assert all(w.exit_code == 0 for w in result.workers)
    assert all(v == result.return_values[0] for v in result.return_values)


# A script that trains, then ends; the chief (worker 0) ends last, after
# --chief-lingers seconds, and with --abort-at-exit its process aborts at
# exit (an atexit handler), after its main returned.
TRAIN_AND_END = textwrap.dedent('''\
    import argparse
    import atexit
    import os
    import signal
    import time

    import tensorflow as tf

    parser = argparse.ArgumentParser()
    parser.add_argument("--chief-lingers", type=float, default=0.0)
    parser.add_argument("--abort-at-exit", action="store_true")
    parser.add_argument("--where", required=True, help="an empty directory")
    args = parser.parse_args()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = tf.Variable(1.0)


    @tf.function
    def train_step():
        return strategy.reduce("SUM", strategy.run(lambda: w * 2.0), axis=None)


    for _ in range(4):
        train_step()
    # Leave together: a worker whose process ends right after the last
    # all-reduce can cut a peer's read of that all-reduce's data (a
    # connection reset, seen once with 16 workers on 2 cores); the
    # coordination service's barrier lets nobody go before all are done.
    from tensorflow.python.eager import context
    context.context().wait_at_barrier("training-done", 60000)
    # The chief hosts that service: a peer still waiting for the barrier's
    # answer when the chief's process ends gets "Socket closed" (seen on
    # 2.15.1).  Each peer says it has its answer with a file; the chief
    # waits for them all.
    task_id = strategy.cluster_resolver.task_id
    if task_id:
        open(os.path.join(args.where, f"left-{task_id}"), "w").close()
    else:
        peers = strategy.cluster_resolver.cluster_spec().num_tasks("worker") - 1
        deadline = time.monotonic() + 60
        while len(os.listdir(args.where)) < peers and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(args.chief_lingers)   # the chief's own work after training
        if args.abort_at_exit:
            atexit.register(lambda: os.kill(os.getpid(), signal.SIGABRT))
''')


def _train_and_end(tmp_path):
    path = tmp_path / "train_and_end.py"
    path.write_text(TRAIN_AND_END)
    where = tmp_path / "left"
    where.mkdir()
    return path, ["--where", str(where)]


@pytest.mark.timeout(60)
@scenario(outcome="crashed_at_exit", source="tensorflow#56684",
          fixed_by="test_chief_ends_after_its_peers_left")
def test_chief_aborts_at_exit_after_training(mwms_cluster, tmp_path):
    """Training completes on every worker; the chief's process then aborts at exit.

    It aborts (SIGABRT) after its peers left, as tensorflow#56684's chief
    did (``F grpc_server_lib.cc ... Clean shutdown is not currently
    implemented``, then ``Fatal Python error: Aborted``): the scheduler
    sees a failed job and queues it again, though its training was done.

    TensorFlow: (2.21, measured) TensorFlow itself no longer aborts there.
    Plain ``python`` processes outside the harness, 2 workers, the chief
    ending 3 s or 15 s after its peer (15 s: past the coordination
    service's heartbeat timeout, when the chief logs its peer "unhealthy"),
    or the peer ending 15 s after the chief: every process exited 0, on
    2.21 and on 2.15.1 (one run each).  So the abort here is the user-code
    twin: an atexit handler that kills the chief with SIGABRT once its main
    returned.  The run is ``crashed_at_exit``: every worker returned (its
    value is there), and worker 0 died at exit; it is named, and the text
    says both.

    Source: tensorflow#56684 ("Master worker crashes after training
    completes; remote worker exits successfully").

    Fix: nothing in the job may end its process otherwise than by its
    main returning (no teardown that aborts): see the fixed variant.
    """
    path, where = _train_and_end(tmp_path)
    result = mwms_cluster.run_script(path, [*where, "--chief-lingers", "0.5", "--abort-at-exit"],
                                     timeout=30)
    result.assert_crashed_at_exit(culprits=[0])
    assert all(w.returned for w in result.workers)
    assert result.workers[0].exit_code == -6
    assert all(w.exit_code == 0 for w in result.workers[1:])
    assert result.diagnosis.startswith("CRASHED_AT_EXIT: training completed"), result.diagnosis


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="tensorflow#56684")
def test_chief_ends_after_its_peers_left(mwms_cluster, tmp_path):
    """Fixed: the chief works on for a second after training, while its
    peers' scripts end and their processes exit; then its own ends.

    TensorFlow: (2.21, measured) the chief tears down after its peers left
    and exits 0, as every worker does: the run completes (and so did plain
    processes outside the harness, on 2.21 and 2.15.1, with the chief
    ending up to 15 s after its peers).

    Source: tensorflow#56684.

    Fix: this.
    """
    path, where = _train_and_end(tmp_path)
    result = mwms_cluster.run_script(path, [*where, "--chief-lingers", "1"], timeout=30)
    result.assert_completed()
    assert all(w.exit_code == 0 for w in result.workers)
    chief_ended = result.workers[0].observation.exit_time
    assert all(w.observation.exit_time < chief_ended for w in result.workers[1:])
