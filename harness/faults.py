"""The fault vocabulary: plain frozen data, validated before any process starts.

A fault names the worker it acts in (or its ``task=``) and, for step-keyed
faults, the step at whose boundary it acts (``context().steps()`` or the
Keras callback).  Faults print as their constructor call and compare equal
by value, so a plan can be generated, printed in a failure and pasted back.
The diagnosis never reads the fault plan: it works out the culprit from
what it observed, as it must for a user's real bug.

Adding a fault kind is three edits: its class here (fields, and ``check``
for what its fields must hold), its name in :data:`FAULT_TYPES`, and, for a
step-keyed fault, a row in :data:`harness.worker.actions.ACTIONS` saying
what it does there.  What a fault does in the parent is declared on the
class: ``edit_configs`` (a ``TF_CONFIG`` fault), ``parent_signals`` (a
pause the parent ends, a preempted worker it kills when its grace is
over), ``network_commands`` (a link cut or throttled, see
:mod:`harness.network.namespace`) and ``host_names`` (a name in
``TF_CONFIG`` that resolves when the parent says).  Every fault acts in one
attempt of a run (``attempt=``, keyword only, 0 by default).
"""
from __future__ import annotations

import dataclasses
import functools
import signal
from typing import TYPE_CHECKING, Callable, List, Optional, Tuple

from harness import validators
from harness.core import tfconfig
# InjectedFault: RaiseError raises it.
from harness.errors import FaultError, InjectedFault, hide_in_setup_errors  # noqa: F401

# pytest leaves this module's frames out of a setup error's traceback.
__tracebackhide__ = hide_in_setup_errors

CRASH_HOW = ("exit", "kill", "abort")
BAD_CONFIG_KINDS = tfconfig.BAD_CONFIG_KINDS


# The most each argument can mean, and how it is said: beyond it a value
# makes no sense for a test (and a worker's sleep or the kernel's queue
# discipline would overflow, to be read as the worker's error).
NUMBER_LIMITS = {
    "seconds": (validators.MAX_SECONDS, "a day"),
    "grace": (validators.MAX_SECONDS, "a day"),
    "after": (validators.MAX_SECONDS, "a day"),
    "ms": (600_000, "ten minutes"),
    "jitter_ms": (600_000, "ten minutes"),
    "kbps": (100_000_000, "100 Gbit/s"),
    "fraction": (1, "the whole file"),
}
MAX_STEP = 10**9


def _check_number(fault, name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FaultError(f"{fault!r}: {name} must be a number, got {value!r}")
    if value < 0 or value != value:
        raise FaultError(f"{fault!r}: {name} must be 0 or more, got {value!r}")
    most, said = NUMBER_LIMITS[name]
    if value > most:
        raise FaultError(f"{fault!r}: {name} must be at most {most:g} ({said}), got {value!r}")


# The worker index of a fault keyed by task=, until the plan is checked
# against the cluster's shape (see validate).
UNRESOLVED = -1


if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_: object) -> Callable[[Callable], Callable]:
        """Tells a type checker what a decorator makes; nothing at run time."""
        return lambda decorator: decorator


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def _fault_class(cls):
    """A frozen dataclass whose constructor also takes ``task=(type, index)``
    in place of ``worker``: ``SkipStep(task=("worker", 1), step=4)``."""
    cls = dataclasses.dataclass(frozen=True, repr=False)(cls)
    fields_init = cls.__init__

    @functools.wraps(fields_init)
    def __init__(self, *args, task=None, **kwargs):
        if task is not None:
            if args:
                raise FaultError(f"{cls.__name__}(task={task!r}): give the rest by keyword")
            kwargs.setdefault("worker", UNRESOLVED)
            task = tuple(task) if isinstance(task, (list, tuple)) else task
        fields_init(self, *args, task=task, **kwargs)

    cls.__init__ = __init__
    return cls


@_fault_class
class Fault:
    """Base of every fault: the worker it acts in, and the attempt.

    ``worker`` is the index of a task in the collectives, in MWMS's order
    (the chief, when the cluster has one, is 0); ``task=("worker", 1)``
    (keyword only) names the task as its ``TF_CONFIG`` does instead, and is
    the only way to name an evaluator.  A fault takes one of the two.

    ``attempt`` (keyword only) is the attempt of a run with restarts
    (``run(restarts=K)``) that the fault acts in: 0, the first, by default,
    so a restarted cluster runs clean and can show that the job recovers.
    It prints only when it is not 0.
    """
    worker: int
    attempt: int = dataclasses.field(default=0, kw_only=True)
    task: Optional[Tuple[str, int]] = dataclasses.field(default=None, kw_only=True)

    def __repr__(self) -> str:
        shown = ([f"task={tuple(self.task)!r}"] if self.task is not None else []) + [
            f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
            if f.name not in ("attempt", "task") and not (f.name == "worker" and self.task)]
        if self.attempt != 0:   # last, as it is passed: by keyword
            shown.append(f"attempt={self.attempt!r}")
        return f"{type(self).__name__}({', '.join(shown)})"

    def check(self, num_workers: int, restarts: int = 0) -> None:
        """Raise :class:`FaultError` unless this fault can act in a cluster of
        ``num_workers`` that is restarted up to ``restarts`` times."""
        if isinstance(self.worker, bool) or not isinstance(self.worker, int) \
                or not 0 <= self.worker < num_workers:
            raise FaultError(f"{self!r}: worker {self.worker!r} does not exist in a cluster of "
                             f"{num_workers} workers (0..{num_workers - 1})")
        if isinstance(self.attempt, bool) or not isinstance(self.attempt, int) \
                or not 0 <= self.attempt <= restarts:
            raise FaultError(f"{self!r}: attempt {self.attempt!r} never runs: a run with "
                             f"restarts={restarts} has attempts 0..{restarts}")

    def edit_configs(self, configs: List[Optional[dict]],
                     spare_port: int) -> List[Optional[dict]]:
        """The workers' ``TF_CONFIG`` dicts as this fault leaves them (most leave them be)."""
        return configs

    def parent_signals(self, run_grace: float) -> Tuple[Tuple[float, int], ...]:
        """What the parent sends the worker once this fault acted: ``(seconds
        after, signal)`` pairs.  ``run_grace`` is the run's grace setting."""
        return ()

    def network_commands(self) -> Tuple[Tuple[float, str], ...]:
        """What the parent does to the worker's link once this fault acted:
        ``(seconds after, command)`` pairs for :meth:`harness.network.namespace.
        Switch.command`.  Any puts the workers in network namespaces."""
        return ()

    def host_names(self) -> Tuple[Tuple[str, Optional[float]], ...]:
        """The host names this fault lists in ``TF_CONFIG`` and when each
        resolves: ``(name, seconds after the attempt starts or None: never)``;
        any gives the cluster an ``/etc/hosts`` of its own."""
        return ()


@_fault_class
class StepFault(Fault):
    """A fault that acts at the boundary of step ``step`` of the worker's loop."""
    step: int

    def check(self, num_workers: int, restarts: int = 0) -> None:
        super().check(num_workers, restarts)
        if isinstance(self.step, bool) or not isinstance(self.step, int) \
                or not 0 <= self.step <= MAX_STEP:
            raise FaultError(f"{self!r}: step must be an integer from 0 to {MAX_STEP:g}, "
                             f"got {self.step!r}")


@_fault_class
class SkipStep(StepFault):
    """The worker does not run ``step``: its step count diverges by one."""


@_fault_class
class ExtraCollective(StepFault):
    """At ``step`` the worker runs one all-reduce the others do not."""


@_fault_class
class Crash(StepFault):
    """At ``step`` the worker dies: ``os._exit(1)``, SIGKILL of itself, or ``abort()``."""
    how: str = "exit"

    def check(self, num_workers: int, restarts: int = 0) -> None:
        super().check(num_workers, restarts)
        if self.how not in CRASH_HOW:
            raise FaultError(f"{self!r}: how must be one of {', '.join(CRASH_HOW)}")


@_fault_class
class RaiseError(StepFault):
    """At ``step`` the worker's training loop raises :class:`~harness.errors.InjectedFault`."""
    message: str = "injected fault"

    def check(self, num_workers: int, restarts: int = 0) -> None:
        super().check(num_workers, restarts)
        if not isinstance(self.message, str):
            raise FaultError(f"{self!r}: message must be a string")


@_fault_class
class Pause(StepFault):
    """At ``step`` the worker is stopped (SIGSTOP); the parent sends SIGCONT
    after ``seconds``, or never (None)."""
    seconds: Optional[float] = None

    def check(self, num_workers: int, restarts: int = 0) -> None:
        super().check(num_workers, restarts)
        _check_number(self, "seconds", self.seconds, allow_none=True)

    def parent_signals(self, run_grace: float) -> Tuple[Tuple[float, int], ...]:
        # A stopped process cannot wake itself: the parent, which saw the
        # fault's message first, sends SIGCONT.
        return () if self.seconds is None else ((self.seconds, signal.SIGCONT),)


@_fault_class
class Preempt(StepFault):
    """At ``step`` the worker gets SIGTERM, a cluster manager's preemption
    notice; if it is still alive ``grace`` seconds later (the run's grace
    setting when None), the parent SIGKILLs it with all it started.

    What the worker does with the notice is its own code's business:
    ``PreemptionCheckpointHandler`` saves a checkpoint on every worker and
    exits them all; without one, MWMS's own preemption notifier catches
    SIGTERM and the worker is killed when the grace runs out (TensorFlow
    2.21, measured).  The worker raises the signal itself at the step's
    boundary: the same point on every replay, and no handler can tell."""
    grace: Optional[float] = None

    def check(self, num_workers: int, restarts: int = 0) -> None:
        super().check(num_workers, restarts)
        _check_number(self, "grace", self.grace, allow_none=True)

    def parent_signals(self, run_grace: float) -> Tuple[Tuple[float, int], ...]:
        return ((run_grace if self.grace is None else self.grace, signal.SIGKILL),)


@_fault_class
class Delay(StepFault):
    """At ``step`` the worker sleeps ``seconds``: a straggler that should
    still complete when ``seconds`` is below the hang timeout."""
    seconds: float

    def check(self, num_workers: int, restarts: int = 0) -> None:
        super().check(num_workers, restarts)
        _check_number(self, "seconds", self.seconds)


@_fault_class
class Partition(StepFault):
    """At ``step`` the worker's network link goes down: it is cut off from
    every peer (its process runs on); healed after ``seconds``, or never
    when None.  Needs network namespaces (``--mwms-network``)."""
    seconds: Optional[float] = None

    def check(self, num_workers: int, restarts: int = 0) -> None:
        super().check(num_workers, restarts)
        _check_number(self, "seconds", self.seconds, allow_none=True)

    def network_commands(self) -> Tuple[Tuple[float, str], ...]:
        return ((0.0, "down"),) + (() if self.seconds is None else ((self.seconds, "up"),))


@_fault_class
class Bandwidth(StepFault):
    """From ``step`` on, the worker's link carries at most ``kbps`` kilobits
    a second each way (a token bucket on each end of its link).  Needs
    network namespaces (``--mwms-network``)."""
    kbps: float

    def check(self, num_workers: int, restarts: int = 0) -> None:
        super().check(num_workers, restarts)
        _check_number(self, "kbps", self.kbps)
        if self.kbps < 8:
            raise FaultError(f"{self!r}: kbps must be 8 or more (a token bucket needs a rate)")

    def network_commands(self) -> Tuple[Tuple[float, str], ...]:
        return ((0.0, f"rate {self.kbps:g}"),)


@_fault_class
class Latency(StepFault):
    """From ``step`` on, every byte to and from the worker arrives ``ms``
    milliseconds late (± a uniform ``jitter_ms``), each way: a far or
    congested node.  Done by a TCP proxy between the workers
    (:mod:`harness.network.proxy`); needs network namespaces (``--mwms-network``)."""
    ms: float
    jitter_ms: float = 0.0

    def check(self, num_workers: int, restarts: int = 0) -> None:
        super().check(num_workers, restarts)
        _check_number(self, "ms", self.ms)
        _check_number(self, "jitter_ms", self.jitter_ms)
        if self.jitter_ms > self.ms:
            raise FaultError(f"{self!r}: jitter_ms must not exceed ms (a delay is never negative)")

    def network_commands(self) -> Tuple[Tuple[float, str], ...]:
        return ((0.0, f"delay {self.ms:g} {self.jitter_ms:g}"),)


@_fault_class
class ResetPeers(StepFault):
    """``after`` seconds past the worker's ``step`` boundary, every open
    connection to and from it is reset (both ends get RST, as when a NAT or
    a load balancer drops its state); new connections are accepted.  A
    reset fails only the RPCs in flight (gRPC reconnects for the next), so
    ``after`` places it inside the step, where its peers wait.  Done by a
    TCP proxy between the workers (:mod:`harness.network.proxy`); needs network
    namespaces (``--mwms-network``)."""
    after: float = 0.0

    def check(self, num_workers: int, restarts: int = 0) -> None:
        super().check(num_workers, restarts)
        _check_number(self, "after", self.after)

    def network_commands(self) -> Tuple[Tuple[float, str], ...]:
        return ((self.after, "reset"),)


@_fault_class
class BadTFConfig(Fault):
    """The worker's ``TF_CONFIG`` is wrong from the start, by ``kind``:

    * ``missing``: no ``TF_CONFIG`` at all (the worker forms a 1-replica
      "cluster" of its own);
    * ``wrong_size``: its cluster list has one extra worker, where nobody
      listens;
    * ``duplicate_index``: it claims the index of another worker (worker
      0's, or worker 1's when it is worker 0);
    * ``swapped``: its cluster list is in reverse order, so it takes the
      address of another worker as its own;
    * ``wrong_port``: its own address in its cluster list has a port where
      no peer looks for it.
    """
    kind: str

    def check(self, num_workers: int, restarts: int = 0) -> None:
        super().check(num_workers, restarts)
        if self.kind not in BAD_CONFIG_KINDS:
            raise FaultError(f"{self!r}: kind must be one of {', '.join(BAD_CONFIG_KINDS)}")
        if self.kind in ("duplicate_index", "swapped") and num_workers < 2:
            raise FaultError(f"{self!r}: needs at least 2 workers")

    def edit_configs(self, configs: List[Optional[dict]],
                     spare_port: int) -> List[Optional[dict]]:
        return tfconfig.apply_bad_config(configs, self.worker, self.kind, spare_port)


@_fault_class
class UnresolvedHost(Fault):
    """Every worker's ``TF_CONFIG`` lists worker ``worker`` by a host name
    (``mwms-worker-W``, see :func:`harness.core.tfconfig.host_name`) that
    resolves to its address only ``seconds`` after the attempt starts, or
    never when None: a peer's Service name that the cluster's DNS does not
    know yet (tensorflow#53098, kubeflow/trainer#1458).  A lookup before
    then fails at once, "Name or service not known".  Needs a network
    namespace (``--mwms-network``): the run's own ``/etc/hosts``, see
    :class:`harness.network.namespace.Namespace`."""
    seconds: Optional[float] = None

    def check(self, num_workers: int, restarts: int = 0) -> None:
        super().check(num_workers, restarts)
        _check_number(self, "seconds", self.seconds, allow_none=True)

    def edit_configs(self, configs: List[Optional[dict]],
                     spare_port: int) -> List[Optional[dict]]:
        return tfconfig.name_worker(configs, self.worker, tfconfig.host_name(self.worker))

    def host_names(self) -> Tuple[Tuple[str, Optional[float]], ...]:
        return ((tfconfig.host_name(self.worker), self.seconds),)


@_fault_class
class StartDelay(Fault):
    """The worker's process starts ``seconds`` later than the others', or
    never when ``seconds`` is None: a pod that is scheduled late, or stays
    Pending.  Nothing of it runs before, and it reports nothing.  Its peers
    wait for it as long as TensorFlow's registration timeout says
    (``cluster_register_timeout_in_ms``, an hour unless the job sets it;
    docs/faults.md, "A worker that starts late")."""
    seconds: Optional[float]

    def check(self, num_workers: int, restarts: int = 0) -> None:
        super().check(num_workers, restarts)
        _check_number(self, "seconds", self.seconds, allow_none=True)


@_fault_class
class DiskFull(StepFault):
    """From ``step`` on, in its attempt, the worker's disk under the run's
    directory (``harness.context().run_dir``) is full: a file it opens
    there for writing fails with ``OSError`` ``ENOSPC``, and one it opens
    to truncate is left empty, as a full disk leaves it (the truncation
    frees the space, the write then fails).  It acts on the worker's own
    Python file operations (``open``, ``os.open``); TensorFlow's C++ file
    writes (its checkpoints' own) are not reached."""


@_fault_class
class TornWrite(StepFault):
    """From ``step`` on, in its attempt, the first file the worker writes
    under the run's directory is cut to ``fraction`` of its bytes and the
    worker dies (``os._exit(1)``), as a kill in the middle of the write
    leaves it: when the job renames a file (``os.replace``, ``os.rename``:
    the rename does not happen), else at its next step boundary.  As
    :class:`DiskFull`, it acts on the worker's Python file operations."""
    fraction: float = 0.5

    def check(self, num_workers: int, restarts: int = 0) -> None:
        super().check(num_workers, restarts)
        _check_number(self, "fraction", self.fraction)
        if self.fraction >= 1:
            raise FaultError(f"{self!r}: fraction must be below 1 (a part of the file), "
                             f"got {self.fraction!r}")


@_fault_class
class LostRename(StepFault):
    """From ``step`` on, in its attempt, the first rename the worker makes
    under the run's directory (``os.replace``, ``os.rename``) does not
    happen and the worker dies (``os._exit(1)``): the new file is whole
    beside the old one, as a kill between the write and the rename, or a
    machine that lost power before the rename reached its disk, leaves
    them.  As :class:`DiskFull`, it acts on the worker's Python file
    operations."""


@_fault_class
class SlowWrite(StepFault):
    """From ``step`` on, in its attempt, the first file the worker opens
    for writing under the run's directory takes ``seconds`` to open, as a
    slow or saturated disk holds a checkpoint's write; the job goes on
    after it.  As :class:`DiskFull`, it acts on the worker's Python file
    operations."""
    seconds: float = 1.0

    def check(self, num_workers: int, restarts: int = 0) -> None:
        super().check(num_workers, restarts)
        _check_number(self, "seconds", self.seconds)


FAULT_TYPES = (SkipStep, ExtraCollective, Crash, RaiseError, Pause, Delay, Preempt, Partition,
               Bandwidth, Latency, ResetPeers, DiskFull, TornWrite, LostRename, SlowWrite,
               BadTFConfig,
               StartDelay,
               UnresolvedHost)

# The vocabulary a plan is written in (every class of FAULT_TYPES:
# tests/unit/test_settings.py holds the two together); checking and
# resolving a plan is harness.plan's, internal.
__all__ = [
    "Fault", "StepFault", "SkipStep", "ExtraCollective", "Crash", "RaiseError", "Pause",
    "Delay", "Preempt", "Partition", "Bandwidth", "Latency", "ResetPeers", "DiskFull",
    "TornWrite", "LostRename", "SlowWrite", "BadTFConfig",
    "StartDelay", "UnresolvedHost", "FAULT_TYPES", "CRASH_HOW", "BAD_CONFIG_KINDS",
]
