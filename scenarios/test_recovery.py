"""Recovery: a preempted job that comes back on a restarted cluster, and one
that comes back wrong.

The harness restarts the whole cluster as a cluster manager would
(``run(restarts=1)``: the same addresses, a fresh process per worker), so
each scenario is one run whose ``attempts`` tell the story.
"""
import pytest

from harness.faults import Preempt
from scenarios.meta import scenario

STEPS = 20
AT = 8       # the step whose boundary brings worker 1 the preemption notice


def train_with_preemption_handler(directory, steps=STEPS, resume=True):
    """The seed's loop under ``PreemptionCheckpointHandler``: every step goes
    through ``handler.run``, which saves a checkpoint on every worker and
    exits them all when one is told it is preempted; a restarted job's
    handler restores it.  ``done`` counts the steps trained, in the checkpoint.
    With ``resume=False`` the loop starts at step 0 again, the mistake.
    Returns (the step the loop started at, ``done`` at the end)."""
    import tensorflow as tf

    import harness
    from scenarios import mnist_like
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    _, _, step, done, checkpoint = mnist_like.checkpointed_training(strategy)
    handler = tf.distribute.experimental.PreemptionCheckpointHandler(
        strategy.cluster_resolver, checkpoint, directory)
    x, y = mnist_like.make_data()
    iterator = iter(mnist_like.distributed_dataset(strategy, x, y))

    def train_one(batch):
        step(batch)
        done.assign_add(1)

    # The counter the checkpoint restored (TensorFlow 2.21 deprecates
    # handler.total_run_calls for this).
    first = int(done.numpy()) if resume else 0
    for _ in ctx.steps(steps - first):
        handler.run(train_one, next(iterator))
    return first, int(done.numpy())


def _preempted(result, num_workers):
    preempted, resumed = result.attempts
    # The handler saves on every worker and exits them all with status 42
    # (its default off Google Cloud): a crash, to a cluster manager.
    # Every worker exits alike: nothing in what was observed names the one
    # that got the notice.
    preempted.assert_crashed().assert_cannot_tell(range(num_workers))
    assert [w.exit_code for w in preempted.workers] == [42] * num_workers
    reached = max(w.last_step for w in preempted.workers)
    assert AT <= reached < STEPS
    return resumed


@pytest.mark.timeout(120)
@scenario(outcome="completed", source="tf.distribute.experimental.PreemptionCheckpointHandler "
          "(its failure_handler_test)")
def test_preemption_handler_resumes_without_losing_a_step(mwms_cluster, tmp_path):
    """Fixed: a custom loop under ``PreemptionCheckpointHandler``, worker 1
    preempted (SIGTERM) at step 8, the cluster restarted.

    Each step goes through ``handler.run``, and the loop starts at the step
    count the checkpoint restored (a variable of the checkpoint, as
    TensorFlow 2.21 advises over the deprecated ``handler.total_run_calls``).

    TensorFlow: the notice reaches the handler's signal handler; at the next
    ``handler.run`` the workers agree on a step, every worker saves a
    checkpoint (the non-chief into a temporary directory it deletes) and
    exits with status 42.  The restarted job restores it and trains the
    rest: the step counter in the checkpoint ends at exactly 20, no step
    lost or repeated.

    Source: ``PreemptionCheckpointHandler``'s documentation and TensorFlow's
    own ``failure_handler_test`` (which asserts the same count).

    Fix: this.
    """
    result = mwms_cluster.run(train_with_preemption_handler, args=(str(tmp_path),),
                              timeout=30, restarts=1, faults=[Preempt(1, AT)])
    result.assert_completed()
    resumed = _preempted(result, mwms_cluster.num_workers)
    first, done = resumed.return_values[0]
    assert resumed.return_values == [(first, STEPS)] * mwms_cluster.num_workers
    assert AT < first < STEPS


@pytest.mark.timeout(120)
@scenario(outcome="completed", source="tf.distribute.experimental.PreemptionCheckpointHandler",
          fixed_by="test_preemption_handler_resumes_without_losing_a_step")
def test_preemption_handler_loop_restarts_at_zero(mwms_cluster, tmp_path):
    """The same job, but its loop runs ``range(steps)`` again after the
    restart instead of starting at the restored step count.

    TensorFlow: the handler restores the checkpoint (model, optimizer, step
    counter) and the loop then trains 20 steps more: the job completes, with
    every step before the preemption trained twice.  Nothing fails; only the
    counter shows it (20 + the steps restored).

    Source: ``PreemptionCheckpointHandler``'s documentation (the loop must
    start from the restored count).

    Fix: ``for step in range(int(done.numpy()), steps)`` with ``done`` in
    the checkpoint.
    """
    result = mwms_cluster.run(train_with_preemption_handler, args=(str(tmp_path),),
                              kwargs={"resume": False}, timeout=30, restarts=1,
                              faults=[Preempt(1, AT)])
    result.assert_completed()
    resumed = _preempted(result, mwms_cluster.num_workers)
    restored = [done - STEPS for _, done in resumed.return_values]
    assert all(r > AT for r in restored), resumed.return_values   # steps trained twice
