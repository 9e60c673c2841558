"""Cluster specs: TensorFlow's ``create_cluster_spec``, and what maps onto
the harness (``worker`` tasks only, worker 0 the chief).

Pure functions and the standard library: no TensorFlow, no processes.
"""
from __future__ import annotations

import dataclasses
import socket
from typing import Dict, Mapping, Optional, Tuple

from harness.compat.errors import UnsupportedClusterError

# The task types of TensorFlow's clusters, in the order the harness numbers
# its processes.  Each runs the runner's fn, parameter servers included.
TASK_TYPES = ("chief", "worker", "evaluator", "ps")
# Why each task type the harness does not run is refused.
UNSUPPORTED = {
    "chief": "a separate 'chief' task: the harness's clusters are 'worker' tasks only, "
             "worker 0 being the chief (as MultiWorkerMirroredStrategy treats worker 0 "
             "when there is no chief); use create_cluster_spec(num_workers=N+1) instead of "
             "has_chief=True, num_workers=N",
    "ps": "'ps' tasks: this harness's settings take no parameter servers",
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


def shapes_supported() -> bool:
    """Whether the harness's settings take a cluster shape (a chief, an evaluator)."""
    from harness.settings import RunSettings
    return "cluster" in {f.name for f in dataclasses.fields(RunSettings)}


def shape(cluster_spec: Optional[Mapping]) -> Dict[str, int]:
    """``cluster_spec``'s count of each task type the harness runs
    (``chief``, ``worker``, ``evaluator``, ``ps``), or the reason it cannot run."""
    if cluster_spec is None or not hasattr(cluster_spec, "items"):
        raise ValueError(f"cluster_spec: a dict of task type to addresses, got {cluster_spec!r}")
    counts = {kind: len(cluster_spec.get(kind) or ()) for kind in TASK_TYPES}
    if counts["chief"] > 1:
        raise ValueError("If chief exists in the cluster, there must be at most one chief. "
                         f"Current `cluster_spec` has {counts['chief']} chiefs.")
    if counts["evaluator"] > 1:
        raise ValueError(f"a cluster has at most one evaluator; `cluster_spec` has "
                         f"{counts['evaluator']}")
    refused = [kind for kind, addresses in cluster_spec.items()
               if addresses and (kind not in TASK_TYPES
                                 or (kind != "worker" and not shapes_supported()))]
    if refused:
        kind = refused[0]
        why = UNSUPPORTED.get(kind, f"a {kind!r} task: TensorFlow's clusters have 'chief', "
                                    f"'worker', 'evaluator' and 'ps' tasks")
        raise UnsupportedClusterError(f"pytest-mwms cannot run {why} (cluster_spec "
                                      f"{dict(cluster_spec)!r})")
    if counts["chief"] + counts["worker"] < 1:
        raise ValueError(f"cluster_spec has no 'chief' or 'worker' task: {dict(cluster_spec)!r}")
    return counts


def tasks(counts: Mapping[str, int]) -> Tuple[Tuple[str, int], ...]:
    """``(type, index)`` of each task, in the harness's order: the chief,
    the workers, the evaluator, the parameter servers."""
    return tuple((kind, i) for kind in TASK_TYPES for i in range(counts.get(kind, 0)))


def num_workers(cluster_spec: Optional[Mapping]) -> int:
    """How many harness processes ``cluster_spec`` is, or the reason it cannot run."""
    return sum(shape(cluster_spec).values())


def label(task_type: str, task_id: int) -> str:
    """The task as TensorFlow's runner names it: ``worker-1``, ``chief-0``."""
    return f"{task_type}-{task_id}"


def check_task(task_type: str, task_id: int, order: Tuple[Tuple[str, int], ...]) -> int:
    """The harness's index of a task of the runner's cluster, or a clear error."""
    if task_type not in TASK_TYPES or (task_type != "worker" and not shapes_supported()):
        raise UnsupportedClusterError(
            f"pytest-mwms cannot run {UNSUPPORTED.get(task_type, repr(task_type))}")
    if (task_type, task_id) not in order:
        raise ValueError(f"{label(task_type, task_id)} is not a task of this cluster "
                         f"({', '.join(label(*t) for t in order)})")
    return order.index((task_type, task_id))
