"""A run's fault plan: the faults of ``run(faults=...)`` checked against
the cluster, which of them act in which attempt, worker and step, what
they need of the network, and which of them acted.  Internal: users build
plans from the classes of :mod:`harness.faults`; the controller, the
workers and the search read them through these functions.

A fault *acts in a worker* when it is keyed by a step (a
:class:`~harness.faults.StepFault`): the worker reports it as it acts, by
its printed form (``protocol.FAULT``).  Any other fault (a ``TF_CONFIG``
edit, a late start, an unresolved name) acts before the worker's code
runs, so it always acts in an attempt that ran.  :func:`acted` is the one
answer to "did this fault act?".
"""
from __future__ import annotations

import copy
from typing import Iterable, List, Optional, Sequence, Tuple, TypeGuard

from harness.core import protocol, tfconfig
from harness.errors import FaultError, hide_in_setup_errors
from harness.faults import (FAULT_TYPES, UNRESOLVED, BadTFConfig, Fault, StartDelay, StepFault,
                            UnresolvedHost)

# pytest leaves this module's frames out of a setup error's traceback.
__tracebackhide__ = hide_in_setup_errors


def resolve(fault: Fault, shape: tfconfig.ClusterShape) -> Fault:
    """``fault`` with its ``worker`` worked out from its ``task=`` in a cluster
    of ``shape``, or a FaultError; ``worker=`` counts the training tasks only."""
    if fault.task is None:
        if isinstance(fault.worker, int) and shape.training <= fault.worker < shape.total:
            other = "a parameter server is task=('ps', 0)" if shape.ps else \
                "the evaluator is task=('evaluator', 0)"
            raise FaultError(f"{fault!r}: worker= counts the chief and the workers (0.."
                             f"{shape.training - 1} in {shape}); {other}")
        return fault
    if tuple(fault.task) not in shape.tasks:
        raise FaultError(f"{fault!r}: no task {fault.task!r} in the cluster {shape}")
    index = shape.index_of(fault.task)
    if fault.worker not in (UNRESOLVED, index):
        raise FaultError(f"{fault!r}: give worker= or task=, not both")
    if shape.evaluator and index == shape.training \
            and isinstance(fault, (BadTFConfig, UnresolvedHost)):
        raise FaultError(f"{fault!r}: the evaluator is in no TF_CONFIG's cluster")
    resolved = copy.copy(fault)
    object.__setattr__(resolved, "worker", index)
    return resolved


def validate(faults: Iterable, num_workers: int, restarts: int = 0,
             shape: Optional[tfconfig.ClusterShape] = None) -> Tuple[Fault, ...]:
    """Check a fault plan against a cluster of ``num_workers`` (of ``shape``,
    when it has a chief or an evaluator) restarted up to ``restarts`` times;
    return it as a tuple, each fault's ``task=`` resolved to its worker.

    Each fault checks its own fields (:meth:`Fault.check`); across the plan,
    a worker may have one ``BadTFConfig`` and one ``StartDelay`` per attempt at most.
    """
    if faults is None:
        return ()
    if isinstance(faults, Fault):
        faults = (faults,)
    shape = shape or tfconfig.ClusterShape(worker=num_workers)
    plan = tuple(faults)
    for f in plan:
        if not isinstance(f, Fault):
            raise FaultError(f"{f!r} is not a fault; use one of "
                             f"{', '.join(t.__name__ for t in FAULT_TYPES)} from harness.faults")
    plan = tuple(resolve(f, shape) for f in plan)
    seen_config = set()
    seen_start = set()
    for f in plan:
        f.check(num_workers, restarts)
        if shape.coordinated:
            check_coordinated(f, shape)
        if isinstance(f, BadTFConfig):
            if (f.worker, f.attempt) in seen_config:
                raise FaultError(f"{f!r}: worker {f.worker} already has a BadTFConfig"
                                 + (f" in attempt {f.attempt}" if restarts else ""))
            seen_config.add((f.worker, f.attempt))
        if isinstance(f, StartDelay):
            if (f.worker, f.attempt) in seen_start:
                raise FaultError(f"{f!r}: worker {f.worker} already has a StartDelay"
                                 + (f" in attempt {f.attempt}" if restarts else ""))
            seen_start.add((f.worker, f.attempt))
    return plan


# What a fault can do to a parameter-server cluster.  A server runs none of
# the job's Python: it can stop (a crash, an error, a preemption, a pause)
# or start late at the coordinator's steps, and its link can go down or
# slow (on the link itself).  No task of it runs collectives, and the
# chief's steps are the functions it schedules (a step skipped would leave
# the job's RemoteValue unmade).  Latency and ResetPeers act through the
# proxy, which carries the traffic to the workers' addresses of an MWMS
# cluster only.
SERVER_FAULTS = ("Crash", "RaiseError", "Pause", "Preempt", "StartDelay", "Partition",
                 "Bandwidth")
NOT_COORDINATED = ("SkipStep", "ExtraCollective", "BadTFConfig", "UnresolvedHost", "Latency",
                   "ResetPeers")


def check_coordinated(fault: Fault, shape: tfconfig.ClusterShape) -> None:
    """A FaultError unless ``fault`` can act in the parameter-server
    cluster ``shape`` (:data:`SERVER_FAULTS`, :data:`NOT_COORDINATED`)."""
    kind = type(fault).__name__
    label = shape.label(fault.worker)
    if kind in NOT_COORDINATED:
        raise FaultError(f"{fault!r}: {kind} acts in MultiWorkerMirroredStrategy clusters "
                         f"only, not in a parameter-server cluster ({shape}), which runs no "
                         f"collectives, whose TF_CONFIG is the harness's and whose traffic "
                         f"the proxy does not carry")
    if shape.serves(fault.worker) and kind not in SERVER_FAULTS:
        raise FaultError(f"{fault!r}: {label} runs a server, none of the job's code, so a "
                         f"{kind} has nothing to act on there; a server can take "
                         f"{', '.join(SERVER_FAULTS)}")


# The faults that end a server: a parameter-server cluster's coordinator
# holds the result of the function that reached such a fault's step on its
# worker until that worker is gone (see harness.worker.coordinator).
ENDS_A_SERVER = ("Crash", "RaiseError", "Preempt")


def coordinator_holds(plan: Iterable[Fault],
                      shape: tfconfig.ClusterShape) -> Tuple[Tuple[int, int], ...]:
    """``(worker's index among the workers, step)`` for each fault of
    ``plan`` that ends a worker of the parameter-server cluster ``shape``."""
    holds = set()
    for f in plan:
        if isinstance(f, StepFault) and type(f).__name__ in ENDS_A_SERVER:
            kind, index = shape.task(f.worker)
            if kind == "worker":
                holds.add((index, f.step))
    return tuple(sorted(holds))


def needs_network(plan: Iterable[Fault]) -> bool:
    """Whether a fault of ``plan`` acts on the network (a namespace per worker)."""
    return any(f.network_commands() for f in plan)


def changes_the_network_at_once(fault: Fault) -> bool:
    """Whether ``fault`` changes the network as it acts (not only seconds
    later): the worker then waits at its step until the change is made."""
    return any(after <= 0 for after, _ in fault.network_commands())


def needs_host_names(plan: Iterable[Fault]) -> bool:
    """Whether a fault of ``plan`` lists a worker by a host name the run resolves."""
    return any(f.host_names() for f in plan)


def in_attempt(plan: Iterable[Fault], attempt: int) -> Tuple[Fault, ...]:
    return tuple(f for f in plan if f.attempt == attempt)


def for_worker(plan: Iterable[Fault], index: int) -> Tuple[Fault, ...]:
    return tuple(f for f in plan if f.worker == index)


def at_step(plan: Iterable[Fault], step: int) -> Tuple[StepFault, ...]:
    return tuple(f for f in plan if isinstance(f, StepFault) and f.step == step)


def configs_under(plan: Sequence[Fault], configs: Sequence[Optional[dict]],
                  spare_port: int) -> List[Optional[dict]]:
    """The workers' ``TF_CONFIG`` dicts once every fault of ``plan`` has edited them."""
    edited = list(configs)
    for f in plan:
        edited = f.edit_configs(edited, spare_port)
    return edited


def acts_in_worker(fault: Fault) -> TypeGuard[StepFault]:
    """Whether ``fault`` acts inside its worker's code, at a step (and is
    reported there as it acts), rather than before the worker starts."""
    return isinstance(fault, StepFault)


def acted(fault: Fault, events: Iterable) -> bool:
    """Whether ``fault`` acted, given the events its worker reported in an
    attempt that ran (``WorkerObservation.events``)."""
    if not acts_in_worker(fault):
        return True
    printed = repr(fault)
    return any(e.kind == protocol.FAULT and e.data == printed for e in events)
