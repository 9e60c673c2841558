"""pytest-mwms: run a function on an N-worker MultiWorkerMirroredStrategy
cluster of real TensorFlow processes, inject faults, and tell completion from
a hang, an error or a crash, naming the culprit.

What a user touches (the documentation's "How it works" draws the rest):
``harness.context()`` inside a worker, :mod:`harness.faults`, the results
(``RunResult``, ``WorkerResult``), the errors below, and
:mod:`harness.workloads` (known-good MWMS jobs to try the harness on).

Importing this package does not import TensorFlow.
"""
from harness import faults
from harness.errors import (FaultError, HarnessError, InjectedFault, NotInWorkerError,
                            SecondStrategyError, SerializationError, SettingError, StateDirError,
                            StepDesyncError)
from harness.core.protocol import WorkerError
from harness.worker.context import WorkerContext, context

__all__ = ["context", "WorkerContext", "WorkerError", "faults", "RunResult", "WorkerResult",
           "Cluster", "HarnessError", "SettingError", "FaultError", "SerializationError",
           "StateDirError", "NotInWorkerError", "InjectedFault", "SecondStrategyError",
           "StepDesyncError", "ReplicaCheck", "DivergentVariable"]


def __getattr__(name):
    # RunResult and the cluster pull in the diagnosis and launcher; import
    # them lazily so a worker that only needs context() stays light.
    if name in ("RunResult", "WorkerResult"):
        from harness import result
        return getattr(result, name)
    if name in ("ReplicaCheck", "DivergentVariable"):
        from harness.diagnosis import observations
        return getattr(observations, name)
    if name == "Cluster":
        from harness.controller import Cluster
        return Cluster
    raise AttributeError(name)
