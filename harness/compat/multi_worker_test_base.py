"""Stands in for ``tensorflow.python.distribute.multi_worker_test_base``.

:func:`create_cluster_spec`, :func:`pick_unused_port` and the ``TF_CONFIG``
readers are the harness's (no TensorFlow needed); every other name
(``MultiWorkerTestBase``, ``create_in_process_cluster``, ...) is
TensorFlow's own, looked up when first used: those run TensorFlow's
servers in the test process itself, not on the harness's workers.
"""
from __future__ import annotations

import json
import os

from harness.compat.spec import create_cluster_spec, pick_unused_port

__all__ = ["create_cluster_spec", "pick_unused_port", "get_tf_config_task",
           "get_tf_config_cluster_spec", "get_task_type", "get_task_index", "is_chief"]


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
