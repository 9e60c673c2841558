"""Worker side: watching ``fn`` create its MultiWorkerMirroredStrategy."""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Optional

from harness.core import protocol
from harness.errors import SecondStrategyError, SettingError
from harness.worker import names

# How long a non-chief worker waits for the chief's port before it joins.
CHIEF_WAIT = 1.0


def tf_config_from_env() -> Optional[dict]:
    """The ``TF_CONFIG`` this process runs with now (``fn`` may have changed it)."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return {"unparsable": raw}


def wait_for_chief(tf_config, limit: float = CHIEF_WAIT) -> None:
    """Give worker 0's gRPC server a moment to listen before joining.

    A worker that reaches the coordination service before the chief's
    server is up backs off for about a second before it retries, which
    made one 4-worker start-up in three take ~1 s longer.  Waiting here
    until the chief's port accepts a TCP connection (at most ``limit``
    seconds, then carry on as TensorFlow would) removes that back-off
    without changing what happens: a chief that never listens still hangs
    the cluster, a second later.
    """
    try:
        task = tf_config["task"]
        if task.get("type") != "worker" or int(task.get("index", 0)) == 0:
            return
        host, port = tf_config["cluster"]["worker"][0].rsplit(":", 1)
        port = int(port)
    except (TypeError, KeyError, ValueError, IndexError, AttributeError):
        return
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.05):
                return
        except OSError:
            time.sleep(0.005)


def cluster_of(tf_config: Optional[dict]) -> tuple:
    """What makes two ``TF_CONFIG`` values the same cluster to TensorFlow:
    the cluster's tasks and this process's place in it."""
    config = tf_config or {}
    return (json.dumps(config.get("cluster"), sort_keys=True),
            json.dumps(config.get("task"), sort_keys=True))


def refuse_changed_cluster(first: Optional[dict], now: Optional[dict]) -> None:
    """A strategy after the first, on a cluster other than the first's, or
    a SecondStrategyError: TensorFlow configures collective ops once per
    process, for the first strategy's cluster, and a strategy on another
    waits for ever (with nothing but a warning, "Enabling collective ops
    after program startup may cause error").  On the same cluster a new
    strategy works, and the harness follows it."""
    if cluster_of(first) != cluster_of(now):
        raise SecondStrategyError(
            "a second MultiWorkerMirroredStrategy on a changed cluster: TF_CONFIG's "
            "cluster or task differs from the first strategy's, and TensorFlow configures "
            "collective ops once per process, for the first cluster, so this one would hang "
            "silently. Keep TF_CONFIG as it was for every strategy of the process.")


def refuse_parameter_servers(tf_config: Optional[dict]) -> None:
    """A SettingError for MultiWorkerMirroredStrategy in the chief of a
    parameter-server cluster: TensorFlow would start its collectives on a
    cluster whose workers and ``ps`` tasks run servers, never joining them."""
    cluster = (tf_config or {}).get("cluster")
    if isinstance(cluster, dict) and cluster.get("ps"):
        raise SettingError(
            "a MultiWorkerMirroredStrategy on a parameter-server cluster (TF_CONFIG lists ps "
            "tasks): its workers and parameter servers run servers, not this function. Run "
            "a ParameterServerStrategy job on it, or give the run a cluster without ps.")


def adopt(ctx, strategy, tf_config: Optional[dict]) -> None:
    """``strategy`` is the worker's strategy from now on: the fault actions'
    and sync check's functions are traced again for it, and the replica
    check fingerprints its variables, not an earlier strategy's."""
    ctx.strategy = strategy
    ctx.strategy_tf_config = tf_config
    ctx.traced.clear()
    if ctx.replica_variables is not None:
        from harness.worker.replicas import watch_variables
        ctx.replica_variables.clear()
        watch_variables(strategy, ctx.replica_variables)


def install_strategy_hook(ctx) -> None:
    """Report strategy creation to the parent and keep the instance on ``ctx``.

    Wrapping ``__init__`` of the class behind ``tf.distribute.MultiWorkerMirroredStrategy``
    (and its ``experimental`` alias, a subclass) tells the parent that a
    worker is blocked *in strategy creation*, which is where a bad
    ``TF_CONFIG`` hangs, and how many replicas the worker ended up with.
    A later strategy on the same cluster is followed (:func:`adopt`); one
    on a changed cluster is refused (:func:`refuse_changed_cluster`).  In a
    job's own process (``ctx.observe_only``, :mod:`harness.record`) nothing
    is refused or waited for.  The patch lives only in this process.
    """
    from tensorflow.python.distribute import collective_all_reduce_strategy

    cls = collective_all_reduce_strategy.CollectiveAllReduceStrategy
    original = cls.__init__
    if getattr(original, "_mwms_hooked", False):
        return

    def __init__(self, *args, **kwargs):
        outermost = not ctx.creating_strategy
        used = tf_config_from_env() if outermost else None
        if outermost and ctx.coordinates:
            refuse_parameter_servers(used)
        if outermost and ctx.strategy is not None and not ctx.observe_only:
            refuse_changed_cluster(ctx.strategy_tf_config, used)
        if outermost:
            ctx.creating_strategy = True
            ctx.send(protocol.STRATEGY_CREATING, data={"tf_config": used})
            names.watch(used, ctx.send)
            if not ctx.observe_only:
                wait_for_chief(used)
        try:
            original(self, *args, **kwargs)
        finally:
            if outermost:
                ctx.creating_strategy = False
        if outermost:
            adopt(ctx, self, used)
            ctx.send(protocol.STRATEGY_CREATED, data=int(self.num_replicas_in_sync))

    __init__._mwms_hooked = True   # type: ignore[attr-defined]  # read back above
    cls.__init__ = __init__
