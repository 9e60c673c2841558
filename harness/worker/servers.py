"""Worker side: a server of a parameter-server cluster.

A worker or parameter server of a ``ParameterServerStrategy`` job runs none
of the job's code: it starts a ``tf.distribute.Server`` on its
``TF_CONFIG``, as TensorFlow's own multi-process tests start theirs, and
serves until the harness ends it.  Its steps are read from its
coordinator's (the chief's) progress map: a parameter server's are the
functions the chief has scheduled so far; a worker's, every step up to
that of the latest function that has run on it (so a fault at step k acts
once a function scheduled at step k or later ran there, before the
coordinator has its result: :mod:`harness.worker.coordinator`).  Its
faults act at those steps, from a thread of their own, since the main
thread waits inside the server's ``join`` in C++.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from harness.core import progress

# How often a server looks at its coordinator's progress map.
FOLLOW_EVERY = 0.01


def serve(ctx, tf_config: dict, coordinator_progress: str, started: Callable[[], None],
          fail: Callable[[BaseException], None]) -> None:
    """Start this task's server, follow the coordinator's steps, serve
    until the process is ended (it never returns).  ``started`` is called
    once the server listens; ``fail`` with what a fault raised (it ends
    the process)."""
    import tensorflow as tf
    cluster, task = tf_config["cluster"], tf_config["task"]
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=task["type"],
                                  task_index=int(task["index"]),
                                  protocol=tf_config.get("rpc_layer") or "grpc", start=True)
    started()
    worker = int(task["index"]) if task["type"] == "worker" else None
    threading.Thread(target=follow, args=(ctx, coordinator_progress, fail, worker),
                     name="mwms-coordinator-steps", daemon=True).start()
    server.join()
    raise RuntimeError(f"the {task['type']} {task['index']} server stopped serving")


def follow(ctx, path: str, fail: Callable[[BaseException], None],
           worker: Optional[int] = None) -> None:
    """Take this server's steps from the coordinator's progress map, in
    order (its faults act there): the coordinator's own steps, or for
    ``worker`` (its index among the workers) each step up to the latest
    function run on it.  What a fault raises goes to ``fail``."""
    try:
        reader = progress.Reader(path, writable=False)
        taken = -1
        while True:
            for record in reader.drain():
                if worker is None and record.kind == progress.STEP:
                    ctx.step_boundary(record.number)
                elif (worker is not None and record.kind == progress.RAN
                      and record.detail == worker):
                    for step in range(taken + 1, record.number + 1):
                        ctx.step_boundary(step)
                    taken = max(taken, record.number)
            time.sleep(FOLLOW_EVERY)
    except BaseException as e:
        fail(e)
