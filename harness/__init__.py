"""pytest-mwms: run a function on an N-worker MultiWorkerMirroredStrategy
cluster of real TensorFlow processes, inject faults, and tell completion from
a hang, an error or a crash, naming the culprit.

Parent side (pytest process): :mod:`harness.plugin` (options, marker,
fixture), :mod:`harness.controller` (launch, watch, collect),
:mod:`harness.launcher` (how processes start), :mod:`harness.diagnosis`
(pure verdict).  Worker side: :mod:`harness.worker` and
:mod:`harness.context`.  Between them: :mod:`harness.protocol`.

Importing this package does not import TensorFlow.
"""
from .worker_context import context, WorkerContext, NotInWorkerError
from .protocol import WorkerError
from . import faults

__all__ = ["context", "WorkerContext", "NotInWorkerError", "WorkerError", "faults",
           "RunResult", "WorkerResult", "Cluster"]


def __getattr__(name):
    # RunResult and the cluster pull in the diagnosis and launcher; import
    # them lazily so a worker that only needs context() stays light.
    if name in ("RunResult", "WorkerResult"):
        from . import result
        return getattr(result, name)
    if name == "Cluster":
        from .controller import Cluster
        return Cluster
    raise AttributeError(name)
