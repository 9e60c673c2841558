"""Cluster specs: TensorFlow's ``create_cluster_spec``, and what maps onto
the harness (``worker`` tasks only, worker 0 the chief).

Pure functions and the standard library: no TensorFlow, no processes.
"""
from __future__ import annotations

import socket
from typing import Mapping, Optional

from harness.compat.errors import UnsupportedClusterError

# Why each task type the harness does not run is refused.
UNSUPPORTED = {
    "chief": "a separate 'chief' task: the harness's clusters are 'worker' tasks only, "
             "worker 0 being the chief (as MultiWorkerMirroredStrategy treats worker 0 "
             "when there is no chief); use create_cluster_spec(num_workers=N+1) instead of "
             "has_chief=True, num_workers=N",
    "ps": "'ps' tasks: parameter servers belong to ParameterServerStrategy, which the "
          "harness does not run",
    "evaluator": "an 'evaluator' task: a side task outside the collective, which the "
                 "harness does not run",
}


def pick_unused_port() -> int:
    """A port nobody listens on now.  The addresses of a spec are not the
    ones the workers use (the harness reserves its own), so this is only
    for code that reads them."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def create_cluster_spec(has_chief: bool = False, num_workers: int = 1, num_ps: int = 0,
                        has_eval: bool = False) -> dict:
    """TensorFlow's ``multi_worker_test_base.create_cluster_spec``: a dict of
    task type to ``localhost:port`` addresses."""
    spec: dict = {}
    if has_chief:
        spec["chief"] = [f"localhost:{pick_unused_port()}"]
    if num_workers:
        spec["worker"] = [f"localhost:{pick_unused_port()}" for _ in range(num_workers)]
    if num_ps:
        spec["ps"] = [f"localhost:{pick_unused_port()}" for _ in range(num_ps)]
    if has_eval:
        spec["evaluator"] = [f"localhost:{pick_unused_port()}"]
    return spec


def num_workers(cluster_spec: Optional[Mapping]) -> int:
    """How many harness workers ``cluster_spec`` is, or the reason it cannot run."""
    if cluster_spec is None or not hasattr(cluster_spec, "items"):
        raise ValueError(f"cluster_spec: a dict of task type to addresses, got {cluster_spec!r}")
    if "chief" in cluster_spec and len(cluster_spec["chief"]) > 1:
        raise ValueError("If chief exists in the cluster, there must be at most one chief. "
                         f"Current `cluster_spec` has {len(cluster_spec['chief'])} chiefs.")
    for task_type, addresses in cluster_spec.items():
        if task_type != "worker" and addresses:
            why = UNSUPPORTED.get(task_type, f"a {task_type!r} task: the harness runs "
                                             f"'worker' tasks only")
            raise UnsupportedClusterError(f"pytest-mwms cannot run {why} (cluster_spec "
                                          f"{dict(cluster_spec)!r})")
    n = len(cluster_spec.get("worker", ()))
    if n < 1:
        raise ValueError(f"cluster_spec has no 'worker' task: {dict(cluster_spec)!r}")
    return n


def check_task(task_type: str, task_id: int, n: int) -> None:
    """A task of the runner's cluster, or a clear error."""
    if task_type != "worker":
        raise UnsupportedClusterError(
            f"pytest-mwms cannot run {UNSUPPORTED.get(task_type, repr(task_type))}")
    if not isinstance(task_id, int) or not 0 <= task_id < n:
        raise ValueError(f"worker-{task_id} is not a task of this {n}-worker cluster")
