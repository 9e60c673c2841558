"""The seed article's example loop (see ``scenarios/mnist_like.py``): fixed, and each of its
three bugs put back on its own."""
import pytest

from scenarios.meta import scenario
from scenarios.mnist_like import seed_training_loop


@pytest.mark.timeout(90)
@scenario(outcome="completed", source="seed article, example loop")
def test_seed_loop_fixed(mwms_cluster):
    """Fixed: the seed's loop with its three bugs fixed trains on every worker.

    TensorFlow: every worker runs the same 30 steps; the loss, reduced across
    the cluster, is the same number on every worker at every step, and it
    goes down.  The replicas (model weights and Adam's slots) are equal bit
    for bit at the end (the replica check, tolerance 0).

    Source: seed article, example loop (rules 1-5).

    Fix: ``input_context.num_input_pipelines`` (not ``num_inputpipelines``);
    the chief from ``strategy.cluster_resolver.task_id == 0`` (not
    ``get_replica_context().is_chief``); arrays made in place of the MNIST
    download.
    """
    result = mwms_cluster.run(seed_training_loop, timeout=20, check_replicas=0)
    result.assert_completed()
    assert result.replicas.divergence is None and result.replicas.variables[0] >= 12
    losses = result.return_values
    assert all(len(run) == 30 for run in losses)
    assert all(run == losses[0] for run in losses), "the reduced loss differs between workers"
    assert sum(losses[0][-5:]) < sum(losses[0][:5]), f"the loss did not go down: {losses[0]}"
    assert "Starting distributed training..." in result.workers[0].log
    assert all("Starting distributed training..." not in w.log for w in result.workers[1:])


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="AttributeError", source="seed article, bug 1",
          fixed_by="test_seed_loop_fixed")
def test_seed_bug_num_inputpipelines(mwms_cluster):
    """The seed's ``dataset_fn`` reads ``input_context.num_inputpipelines``, a typo.

    TensorFlow: ``distribute_datasets_from_function`` calls ``dataset_fn`` on
    every worker, each raises ``AttributeError: 'InputContext' object has no
    attribute 'num_inputpipelines'`` before the first step.

    Source: seed article, bug 1 (its rule 4 example).

    Fix: ``input_context.num_input_pipelines``, or better
    ``input_context.get_per_replica_batch_size(GLOBAL_BATCH_SIZE)``.
    """
    result = mwms_cluster.run(seed_training_loop, kwargs={"bug": "num_inputpipelines"},
                              timeout=20)
    n = mwms_cluster.num_workers
    result.assert_failed(culprits=range(n), error="AttributeError")
    for w in result.workers:
        assert w.exception.type_name == "AttributeError"
        assert "num_inputpipelines" in w.exception.message
        assert w.last_step is None


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="AttributeError", source="seed article, bug 2",
          fixed_by="test_seed_loop_fixed")
def test_seed_bug_replica_context_is_chief(mwms_cluster):
    """The seed picks the chief with ``tf.distribute.get_replica_context().is_chief``.

    TensorFlow: outside ``strategy.run`` the replica context is the default
    one, never None, and no replica context has ``is_chief``: every worker
    raises ``AttributeError: '_DefaultReplicaContext' object has no attribute
    'is_chief'`` at its first log line, before any step.

    Source: seed article, bug 2 (its rule 5 example).

    Fix: with a cluster of workers only, the chief is
    ``strategy.cluster_resolver.task_id == 0`` (``task_type == "chief"``
    when the cluster has a chief task).
    """
    result = mwms_cluster.run(seed_training_loop, kwargs={"bug": "replica_context_is_chief"},
                              timeout=20)
    n = mwms_cluster.num_workers
    result.assert_failed(culprits=range(n), error="AttributeError")
    for w in result.workers:
        assert "has no attribute 'is_chief'" in w.exception.message


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="Exception", source="seed article, bug 3",
          fixed_by="test_seed_loop_fixed")
def test_seed_bug_mnist_download(mwms_cluster):
    """The seed loads its data with ``tf.keras.datasets.mnist.load_data()``, a download.

    TensorFlow: on a worker without Internet access (emulated here with a
    cache miss and an HTTPS proxy on a closed port, so nothing is ever
    downloaded) Keras raises ``Exception: URL fetch failure on
    https://storage.googleapis.com/...`` on every worker, after the strategy
    is built and before any step.  (With access, N workers would download
    into one shared cache at once.)

    Source: seed article, bug 3 (its ``create_datasets``).

    Fix: read data the workers already have, or, as in this catalogue, make
    arrays of the same shape (784 float32 features, int64 labels 0-9).
    """
    result = mwms_cluster.run(seed_training_loop, kwargs={"bug": "mnist_download"}, timeout=20)
    n = mwms_cluster.num_workers
    result.assert_failed(culprits=range(n), error="Exception")
    for w in result.workers:
        assert "URL fetch failure" in w.exception.message
