"""``TF_CONFIG`` generation: pure functions, no TensorFlow.

A cluster's shape (:class:`ClusterShape`) is how many tasks of each type it
has: ``worker`` tasks, at most one ``chief`` and at most one ``evaluator``,
and ``ps`` tasks for a parameter-server cluster.  Every task gets the
``TF_CONFIG`` Kubeflow's TFJob gives it: the same ``cluster`` section,
listing the chief, the workers and the parameter servers (the evaluator is
not part of the training cluster, so no list names it), and its own
``task``.  Without a chief, MWMS treats ``worker`` index 0 as the chief.

The harness numbers the processes in MWMS's order: the chief first, then
the workers, then the evaluator, then the parameter servers; the first
``training`` of them are the tasks in the collectives, numbered as MWMS
numbers their replicas.  In a parameter-server cluster (``coordinated``)
the chief runs the job (its ``ClusterCoordinator``) and the workers and
parameter servers are servers (``serving``) the job's functions run on.
"""
from __future__ import annotations

import dataclasses
import json
from typing import List, Optional, Sequence, Tuple

TASK_TYPES = ("chief", "worker", "evaluator", "ps")
# The task types that run a tf.distribute.Server in a parameter-server cluster.
SERVER_TYPES = ("worker", "ps")
Task = Tuple[str, int]


def task_label(kind: str, index: int) -> str:
    """``chief``, ``worker 1``, ``ps 0`` or ``evaluator``: a task as its
    ``TF_CONFIG`` names it (the single chief or evaluator without a number)."""
    return f"{kind} {index}" if kind in ("worker", "ps") else kind


@dataclasses.dataclass(frozen=True)
class ClusterShape:
    """How many tasks of each type a cluster has."""

    chief: int = 0
    worker: int = 2
    evaluator: int = 0
    ps: int = 0
    # With ps tasks: the workers and parameter servers run the harness's
    # servers and the chief the job (a ParameterServerStrategy job); False:
    # every task runs fn, as every task of TensorFlow's runner does.
    servers: bool = True

    @property
    def training(self) -> int:
        """The tasks in the collectives: the chief and the workers."""
        return self.chief + self.worker

    @property
    def total(self) -> int:
        return self.training + self.evaluator + self.ps

    @property
    def workers_only(self) -> bool:
        return not self.chief and not self.evaluator and not self.ps

    @property
    def coordinated(self) -> bool:
        """A parameter-server cluster: the chief coordinates, the rest serve."""
        return self.ps > 0 and self.servers

    def counts(self) -> dict:
        """How many tasks of each type, by type."""
        return {kind: getattr(self, kind) for kind in TASK_TYPES}

    def serves(self, index: int) -> bool:
        """Whether process ``index`` runs a server rather than the job."""
        return self.coordinated and self.tasks[index][0] in SERVER_TYPES

    @property
    def tasks(self) -> Tuple[Task, ...]:
        """``(type, index)`` of each process, in the harness's order."""
        return (tuple(("chief", i) for i in range(self.chief))
                + tuple(("worker", i) for i in range(self.worker))
                + tuple(("evaluator", i) for i in range(self.evaluator))
                + tuple(("ps", i) for i in range(self.ps)))

    def index_of(self, task: Task) -> int:
        """The process index of ``task``, or a ValueError naming the shape."""
        try:
            return self.tasks.index((task[0], task[1]))
        except (ValueError, TypeError, IndexError):
            raise ValueError(f"{task!r} is not a task of the cluster {self}") from None

    def task(self, index: int) -> Task:
        return self.tasks[index]

    def label(self, index: int) -> str:
        """Process ``index``'s :func:`task_label`."""
        return task_label(*self.tasks[index])

    def spec(self) -> str:
        """``chief:1,worker:2,evaluator:1`` or ``chief:1,worker:2,ps:1``, as
        the option is typed."""
        return ",".join(f"{k}:{getattr(self, k)}" for k in TASK_TYPES if getattr(self, k))

    def __str__(self) -> str:
        return self.spec()


HOST = "127.0.0.1"
# The ways apply_bad_config can break one worker's TF_CONFIG.
BAD_CONFIG_KINDS = ("missing", "wrong_size", "duplicate_index", "swapped", "wrong_port")


def cluster_addresses(ports: Sequence[int], host: str = HOST,
                      hosts: Optional[Sequence[str]] = None) -> list[str]:
    """``host:port`` per worker; ``hosts`` gives each worker its own address
    (workers in network namespaces of their own, see :mod:`harness.network.namespace`)."""
    hosts = hosts if hosts is not None else [host] * len(ports)
    return [f"{h}:{p}" for h, p in zip(hosts, ports)]


def tf_config(ports: Sequence[int], index: int, host: str = HOST,
              hosts: Optional[Sequence[str]] = None) -> dict:
    """The ``TF_CONFIG`` dict for worker ``index`` of a cluster on ``ports``."""
    if not 0 <= index < len(ports):
        raise ValueError(f"worker index {index} out of range for {len(ports)} workers")
    return {
        "cluster": {"worker": cluster_addresses(ports, host, hosts)},
        "task": {"type": "worker", "index": index},
    }


def cluster_configs(ports: Sequence[int], host: str = HOST,
                    hosts: Optional[Sequence[str]] = None,
                    shape: Optional[ClusterShape] = None) -> list[dict]:
    """One ``TF_CONFIG`` dict per process, in the harness's order: a
    cluster of ``len(ports)`` workers, or of ``shape`` (one port per task)."""
    if shape is None or shape.workers_only:
        return [tf_config(ports, i, host, hosts) for i in range(len(ports))]
    if len(ports) != shape.total:
        raise ValueError(f"{len(ports)} ports for the {shape.total} tasks of {shape}")
    addresses = cluster_addresses(ports, host, hosts)
    cluster = {}
    if shape.chief:
        cluster["chief"] = addresses[:shape.chief]
    cluster["worker"] = addresses[shape.chief:shape.training]
    if shape.ps:
        cluster["ps"] = addresses[shape.total - shape.ps:]
    return [{"cluster": {k: list(v) for k, v in cluster.items()},
             "task": {"type": kind, "index": i}} for kind, i in shape.tasks]


def training_list(config: dict) -> list:
    """The chief's and the workers' addresses in MWMS's order (chief
    first): where each training task is found."""
    cluster = config["cluster"]
    return list(cluster.get("chief", [])) + list(cluster.get("worker", []))


def host_name(worker: int) -> str:
    """The host name by which :func:`name_worker` lists worker ``worker``."""
    return f"mwms-worker-{worker}"


def _set_training_list(cluster: dict, addresses: Sequence[str]) -> None:
    """Write ``addresses`` back over the chief's and the workers' lists."""
    chief = len(cluster.get("chief", []))
    if chief:
        cluster["chief"] = list(addresses[:chief])
    cluster["worker"] = list(addresses[chief:])


def name_worker(configs: Sequence[Optional[dict]], worker: int,
                name: str) -> List[Optional[dict]]:
    """``configs`` with training task ``worker`` (MWMS's order, the chief
    first) listed as ``name:PORT`` in every cluster that has it (a Service
    name in place of an address)."""
    import copy
    out = [copy.deepcopy(c) for c in configs]
    for cfg in out:
        if cfg is None or not isinstance(cfg.get("cluster", {}).get("worker"), list):
            continue
        cluster = cfg["cluster"]
        addresses = training_list(cfg)
        if worker < len(addresses):
            addresses[worker] = f"{name}:{addresses[worker].rpartition(':')[2]}"
            _set_training_list(cluster, addresses)
    return out


def dumps(config: dict | None) -> str | None:
    return None if config is None else json.dumps(config, sort_keys=True)


def apply_bad_config(configs: Sequence[Optional[dict]], worker: int, kind: str,
                     spare_port: int, host: str = HOST) -> List[Optional[dict]]:
    """Return ``configs`` with training task ``worker``'s ``TF_CONFIG`` made
    wrong (``worker`` in MWMS's order, the chief first).

    ``kind``:

    * ``missing``: no ``TF_CONFIG`` at all (the worker forms a 1-replica
      "cluster" of its own);
    * ``wrong_size``: its cluster list has one extra worker, on
      ``spare_port`` where nobody listens;
    * ``duplicate_index``: it claims the index of another worker (worker 0's,
      or worker 1's when it is worker 0);
    * ``swapped``: its cluster list is in reverse order, so it takes the
      address of another worker as its own;
    * ``wrong_port``: in its cluster list its own address has ``spare_port``,
      so it listens where no peer looks for it.
    """
    import copy
    out = [copy.deepcopy(c) for c in configs]
    cfg = out[worker]
    if cfg is None:
        raise ValueError(f"worker {worker} has no TF_CONFIG to make wrong")
    cluster = cfg["cluster"]
    addresses = training_list(cfg)
    n = len(addresses)
    if kind == "missing":
        out[worker] = None
    elif kind == "wrong_size":
        cluster["worker"].append(f"{host}:{spare_port}")
    elif kind == "duplicate_index":
        # Another task's index among those of its own type.
        kind_of, index = cfg["task"]["type"], cfg["task"]["index"]
        if len(cluster.get(kind_of, [])) < 2:
            raise ValueError(f"duplicate_index needs another {kind_of!r} task to claim the "
                             f"index of; the cluster has one")
        cfg["task"]["index"] = 0 if index != 0 else 1
    elif kind == "swapped":
        addresses.reverse()
        if n % 2 == 1 and worker == n // 2:
            # the middle of an odd list stays put when reversed; rotate instead
            addresses.append(addresses.pop(0))
        _set_training_list(cluster, addresses)
    elif kind == "wrong_port":
        addresses[worker] = f"{host}:{spare_port}"
        _set_training_list(cluster, addresses)
    else:
        raise ValueError(f"unknown bad TF_CONFIG kind {kind!r}")
    return out
