"""Stands in for ``tensorflow.python.distribute.multi_worker_test_base``.

:func:`create_cluster_spec`, :func:`pick_unused_port` and the ``TF_CONFIG``
readers are the harness's (no TensorFlow needed), and so is
:func:`create_multi_process_cluster`, whose servers listen at ports the
harness reserved; every other name (``MultiWorkerTestBase``,
``MultiProcessCluster``, ``create_in_process_cluster``, ...) is
TensorFlow's own, looked up when first used (a ``MultiProcessCluster``
starts its tasks through the runner :mod:`harness.compat.routes` gives it).
"""
from __future__ import annotations

import json
import os

from harness.compat.spec import create_cluster_spec, pick_unused_port

__all__ = ["create_cluster_spec", "pick_unused_port", "get_tf_config_task",
           "get_tf_config_cluster_spec", "get_task_type", "get_task_index", "is_chief",
           "create_multi_process_cluster"]


def create_multi_process_cluster(num_workers, num_ps, has_chief=False, has_eval=False,
                                 rpc_layer="grpc", stream_output=False, collective_leader=None):
    """TensorFlow's ``create_multi_process_cluster``: its servers listen at
    ``localhost`` ports the harness reserved (below the ephemeral range,
    claimed against every other run on the machine), held until the
    cluster's ``stop()``; the test process connects to them there."""
    from tensorflow.python.distribute.cluster_resolver import cluster_resolver
    from tensorflow.python.training import server_lib

    from harness.compat import originals
    from harness.launch.ports import reserve_ports
    counts = {"chief": int(bool(has_chief)), "worker": num_workers, "ps": num_ps,
              "evaluator": int(bool(has_eval))}
    reservation = reserve_ports(sum(counts.values()))
    ports = iter(reservation.ports)
    spec = {kind: [f"localhost:{next(ports)}" for _ in range(n)]
            for kind, n in counts.items() if n}
    theirs = originals.tensorflows("tensorflow.python.distribute.multi_worker_test_base")
    cluster = theirs.MultiProcessCluster(
        cluster_resolver.SimpleClusterResolver(server_lib.ClusterSpec(spec),
                                               rpc_layer=rpc_layer),
        stream_output=stream_output, collective_leader=collective_leader)
    stop = cluster.stop

    def stop_then_free_the_ports():
        try:
            stop()
        finally:
            reservation.close()

    cluster.stop = stop_then_free_the_ports
    try:
        cluster.start()
    except BaseException:
        reservation.close()
        raise
    return cluster


def get_tf_config_task() -> dict:
    return json.loads(os.environ["TF_CONFIG"])["task"]


def get_tf_config_cluster_spec() -> dict:
    return json.loads(os.environ["TF_CONFIG"])["cluster"]


def get_task_type() -> str:
    return get_tf_config_task()["type"]


def get_task_index() -> int:
    return get_tf_config_task()["index"]


def is_chief() -> bool:
    """Worker 0 of a cluster without a chief task, as TensorFlow has it."""
    return ("chief" not in get_tf_config_cluster_spec() and get_task_type() == "worker"
            and get_task_index() == 0)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    # install() puts this module in the place of TensorFlow's: its own
    # comes from where install() keeps it.
    from harness.compat import originals
    return getattr(originals.tensorflows("tensorflow.python.distribute.multi_worker_test_base"),
                   name)
