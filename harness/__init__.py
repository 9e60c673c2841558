"""pytest-mwms: run a function on an N-worker MultiWorkerMirroredStrategy
cluster of real TensorFlow processes, inject faults, and tell completion from
a hang, an error or a crash, naming the culprit.

The layout is drawn in README.md ("How it works").  What a user touches:
``harness.context()`` inside a worker, :mod:`harness.faults`, the results
(``RunResult``, ``WorkerResult``), the errors below, and
:mod:`harness.workloads` (known-good MWMS jobs to try the harness on).

Importing this package does not import TensorFlow.
"""
from . import faults
from .errors import (FaultError, HarnessError, InjectedFault, NotInWorkerError,
                     SecondStrategyError, SerializationError, SettingError, StateDirError,
                     StepDesyncError)
from .protocol import WorkerError
from .worker.context import WorkerContext, context

__all__ = ["context", "WorkerContext", "WorkerError", "faults", "RunResult", "WorkerResult",
           "Cluster", "HarnessError", "SettingError", "FaultError", "SerializationError",
           "StateDirError", "NotInWorkerError", "InjectedFault", "SecondStrategyError",
           "StepDesyncError", "ReplicaCheck", "ReplicaDivergence"]


def __getattr__(name):
    # RunResult and the cluster pull in the diagnosis and launcher; import
    # them lazily so a worker that only needs context() stays light.
    if name in ("RunResult", "WorkerResult"):
        from . import result
        return getattr(result, name)
    if name in ("ReplicaCheck", "ReplicaDivergence"):
        from . import record
        return getattr(record, name)
    if name == "Cluster":
        from .controller import Cluster
        return Cluster
    raise AttributeError(name)
