"""More than one strategy in a process: a hyper-parameter search (Keras
Tuner's, a loop of the user's) builds a strategy and a model per trial.

On the process's one cluster that works: TensorFlow's own continuous-run
test builds 20 strategies per worker.  On a cluster that changed (a tuner
handing out new ports, a ``TF_CONFIG`` rewritten between trials),
TensorFlow configures collective ops once per process, for the first
cluster, and the new strategy waits for ever, with only a warning
("Enabling collective ops after program startup may cause error").  The
harness refuses that strategy with ``SecondStrategyError`` rather than let
it hang.  TensorFlow 2.21, measured.
"""
import json
import os

import pytest

from scenarios.meta import scenario

TRIALS = 3
STEPS = 3


def search(move_cluster=False):
    """A strategy, a model and a few steps per trial (learning rates 0.1,
    0.2, 0.3); with ``move_cluster``, trial 1 onwards runs with every port
    of ``TF_CONFIG`` moved by one, as a tuner that starts each trial on a
    cluster of its own would.  Returns each trial's last loss."""
    import tensorflow as tf

    import harness
    from scenarios import mnist_like
    ctx = harness.context()
    losses = []
    for trial in range(TRIALS):
        if move_cluster and trial > 0:
            config = json.loads(os.environ["TF_CONFIG"])
            config["cluster"]["worker"] = [f"{a.rsplit(':', 1)[0]}:{int(a.rsplit(':', 1)[1]) + 1}"
                                           for a in config["cluster"]["worker"]]
            os.environ["TF_CONFIG"] = json.dumps(config)
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        _, _, step = mnist_like.make_training(strategy, global_batch_size=32 * ctx.num_workers,
                                              learning_rate=0.1 * (trial + 1))
        x, y = mnist_like.make_data(32 * STEPS, seed=ctx.index)
        batches = iter(strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(32 * ctx.num_workers).repeat()))
        for _ in ctx.steps(STEPS):
            loss = float(step(next(batches)))
        losses.append(loss)
    return losses


@pytest.mark.timeout(90)
@scenario(outcome="completed", source="keras-tuner#531, tensorflow#121429")
def test_a_strategy_per_trial_on_one_cluster(mwms_cluster):
    """A new strategy and model per trial, ``TF_CONFIG`` untouched.

    TensorFlow: every trial trains on the whole cluster; each trial's loss
    is the same on every worker.

    Source: keras-tuner#531, tensorflow#121429.

    Fix: this.
    """
    result = mwms_cluster.run(search, timeout=30)
    result.assert_completed()
    values = result.return_values
    assert all(len(v) == TRIALS and v == values[0] for v in values), values


@pytest.mark.timeout(90)
@scenario(outcome="failed", error="SecondStrategyError", source="keras-tuner#531",
          fixed_by="test_a_strategy_per_trial_on_one_cluster")
def test_a_strategy_per_trial_on_a_moved_cluster(mwms_cluster):
    """Trial 1 moves the cluster to other ports before its strategy.

    TensorFlow: the second strategy would wait for ever in its
    construction; the harness refuses it: every worker raises
    ``SecondStrategyError`` at trial 1, after trial 0 trained.

    Source: keras-tuner#531.

    Fix: every trial on the process's first cluster.
    """
    result = mwms_cluster.run(search, kwargs={"move_cluster": True}, timeout=30, grace=3)
    result.assert_failed(error="SecondStrategyError")
    assert all(w.exception is not None and w.exception.type_name == "SecondStrategyError"
               for w in result.workers)
    assert all(w.last_step == STEPS - 1 for w in result.workers)
