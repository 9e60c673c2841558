"""pytest-mwms: run a function on an N-worker MultiWorkerMirroredStrategy
cluster of real TensorFlow processes, inject faults, and tell completion from
a hang, an error or a crash, naming the culprit.

The public line is this package's ``__all__`` (``Cluster``, ``context()``
inside a worker, the results, the errors) and the modules of
:data:`_PUBLIC`; every other module is the internal engine, which may change
between versions (docs/api.md, "The public line").

Importing this package imports nothing else: each name loads its module
when first used, so that the pytest plugin costs a session that does not
use the harness nothing, and a worker that only needs ``context()`` stays
light.  It never imports TensorFlow.
"""
import importlib
from typing import TYPE_CHECKING

# Each public name and the module that defines it: every name a user
# imports, or receives from a run.
_HOME = {
    "context": "harness.worker.context", "WorkerContext": "harness.worker.context",
    "WorkerError": "harness.core.protocol",
    "Cluster": "harness.controller", "Progress": "harness.controller.watch",
    "Steer": "harness.controller.watch", "guarded_manager": "harness.launch.manager",
    "RunResult": "harness.result", "WorkerResult": "harness.result",
    "Verdict": "harness.diagnosis.verdict",
    "ClusterShape": "harness.core.tfconfig",
    "StragglerReport": "harness.diagnosis.stragglers",
    "WorkerArrival": "harness.diagnosis.stragglers",
    "MemoryGrowth": "harness.diagnosis.memory",
    "Exploration": "harness.explore.search", "BreakingPlan": "harness.explore.search",
    "OrderDivergence": "harness.diagnosis.order",
    **dict.fromkeys((
        "Outcome", "RunObservation", "WorkerObservation", "ReplicaCheck", "DivergentVariable",
        "ReferenceCheck", "Collective", "CollectiveOp"), "harness.diagnosis.observations"),
    **dict.fromkeys((
        "HarnessError", "SettingError", "FaultError", "SerializationError", "StateDirError",
        "PortsUnavailableError", "TempDirFullError", "NotInWorkerError", "InjectedFault",
        "SecondStrategyError", "StepDesyncError",
        "RecordFormatError", "UsageError", "HarnessWarning", "PreloadWarning", "ReportWarning",
        "ExplorationFailed"), "harness.errors"),
}
# Modules of the public line, each loaded as ``harness.<name>`` when first used.
_MODULES = ("faults", "strategies", "workloads", "compat", "record", "errors")
# Every public module: those above, and the ones users import from a public
# package (harness.compat's stand-ins for TensorFlow's modules).  Each has
# an __all__; what a docs page renders or tells users to import is on this
# line (tests/unit/test_docs.py holds both).
_PUBLIC = ("harness", *(f"harness.{m}" for m in _MODULES),
           "harness.compat.multi_process_runner", "harness.compat.multi_worker_test_base")

# Made from the table above, the public line's one declaration.
__all__ = sorted([*_HOME, *_MODULES, "__version__"])  # noqa: PLE0605

if TYPE_CHECKING:   # for type checkers and the API docs: at run time, __getattr__
    from harness import compat, errors, faults, record, strategies, workloads  # noqa: F401
    from harness.controller import Cluster  # noqa: F401
    from harness.controller.watch import Progress, Steer  # noqa: F401
    from harness.core.protocol import WorkerError  # noqa: F401
    from harness.core.tfconfig import ClusterShape  # noqa: F401
    from harness.diagnosis.verdict import Verdict  # noqa: F401
    from harness.diagnosis.memory import MemoryGrowth  # noqa: F401
    from harness.diagnosis.observations import (  # noqa: F401
        Collective, CollectiveOp, DivergentVariable, Outcome, ReferenceCheck, ReplicaCheck,
        RunObservation, WorkerObservation)
    from harness.diagnosis.order import OrderDivergence  # noqa: F401
    from harness.explore.results import BreakingPlan, Exploration  # noqa: F401
    from harness.diagnosis.stragglers import StragglerReport, WorkerArrival  # noqa: F401
    from harness.launch.manager import guarded_manager  # noqa: F401
    from harness.errors import (  # noqa: F401
        ExplorationFailed, FaultError, HarnessError, HarnessWarning, InjectedFault,
        NotInWorkerError, PreloadWarning, RecordFormatError, ReportWarning,
        SecondStrategyError, SerializationError, SettingError, StateDirError, StepDesyncError,
        UsageError)
    from harness.result import RunResult, WorkerResult  # noqa: F401
    from harness.worker.context import WorkerContext, context  # noqa: F401


def __getattr__(name):
    if name in _MODULES:
        return importlib.import_module(f"harness.{name}")
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version("pytest-mwms")
        except PackageNotFoundError:   # a source tree that is not installed
            return "0+unknown"
    if name not in _HOME:
        raise AttributeError(f"module 'harness' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
