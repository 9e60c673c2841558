"""pytest-mwms: run a function on an N-worker MultiWorkerMirroredStrategy
cluster of real TensorFlow processes, inject faults, and tell completion from
a hang, an error or a crash, naming the culprit.

What a user touches (the documentation's "How it works" draws the rest):
``harness.context()`` inside a worker, :mod:`harness.faults`, the results
(``RunResult``, ``WorkerResult``), the errors below, and
:mod:`harness.workloads` (known-good MWMS jobs to try the harness on).

Importing this package imports nothing else: each name loads its module
when first used, so that the pytest plugin costs a session that does not
use the harness nothing, and a worker that only needs ``context()`` stays
light.  It never imports TensorFlow.
"""
import importlib

# Each public name and the module that defines it.
_HOME = {
    "context": "harness.worker.context", "WorkerContext": "harness.worker.context",
    "WorkerError": "harness.core.protocol",
    "RunResult": "harness.result", "WorkerResult": "harness.result",
    "Cluster": "harness.controller",
    "ReplicaCheck": "harness.diagnosis.observations",
    "DivergentVariable": "harness.diagnosis.observations",
    **{name: "harness.errors" for name in (
        "HarnessError", "SettingError", "FaultError", "SerializationError", "StateDirError",
        "NotInWorkerError", "InjectedFault", "SecondStrategyError", "StepDesyncError")},
}

__all__ = ["context", "WorkerContext", "WorkerError", "faults", "RunResult", "WorkerResult",
           "Cluster", "HarnessError", "SettingError", "FaultError", "SerializationError",
           "StateDirError", "NotInWorkerError", "InjectedFault", "SecondStrategyError",
           "StepDesyncError", "ReplicaCheck", "DivergentVariable"]


def __getattr__(name):
    if name == "faults":
        return importlib.import_module("harness.faults")
    if name not in _HOME:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
