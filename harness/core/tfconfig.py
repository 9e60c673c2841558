"""``TF_CONFIG`` generation: pure functions, no TensorFlow.

Every worker of a cluster gets the same ``cluster`` section, listing all
workers on loopback, and its own ``task`` index.  Worker 0 is the chief:
with a cluster of workers only, MWMS treats ``worker`` index 0 as chief.
"""
from __future__ import annotations

import json
from typing import Optional, Sequence

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
                    hosts: Optional[Sequence[str]] = None) -> list[dict]:
    """One ``TF_CONFIG`` dict per worker, in index order."""
    return [tf_config(ports, i, host, hosts) for i in range(len(ports))]


def host_name(worker: int) -> str:
    """The host name by which :func:`name_worker` lists worker ``worker``."""
    return f"mwms-worker-{worker}"


def name_worker(configs: Sequence[Optional[dict]], worker: int, name: str) -> list:
    """``configs`` with worker ``worker`` listed as ``name:PORT`` in every
    cluster list that has it (a Service name in place of an address)."""
    import copy
    out = [copy.deepcopy(c) for c in configs]
    for cfg in out:
        workers = (cfg or {}).get("cluster", {}).get("worker")
        if isinstance(workers, list) and worker < len(workers):
            workers[worker] = f"{name}:{workers[worker].rpartition(':')[2]}"
    return out


def dumps(config: dict | None) -> str | None:
    return None if config is None else json.dumps(config, sort_keys=True)


def apply_bad_config(configs: Sequence[dict], worker: int, kind: str,
                     spare_port: int, host: str = HOST) -> list:
    """Return ``configs`` with worker ``worker``'s ``TF_CONFIG`` made wrong.

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
    n = len(out)
    cfg = out[worker]
    workers = cfg["cluster"]["worker"]
    if kind == "missing":
        out[worker] = None
    elif kind == "wrong_size":
        workers.append(f"{host}:{spare_port}")
    elif kind == "duplicate_index":
        cfg["task"]["index"] = 0 if worker != 0 else 1
    elif kind == "swapped":
        workers.reverse()
        if n % 2 == 1 and worker == n // 2:
            # the middle of an odd list stays put when reversed; rotate instead
            workers.append(workers.pop(0))
    elif kind == "wrong_port":
        workers[worker] = f"{host}:{spare_port}"
    else:
        raise ValueError(f"unknown bad TF_CONFIG kind {kind!r}")
    return out
