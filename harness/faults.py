"""The fault vocabulary: plain frozen data, validated before any process starts.

A fault names the worker it acts in and, for step-keyed faults, the step at
whose boundary it acts (``context().steps()`` or the Keras callback).  Faults
print as their constructor call, compare equal by value and hash, so a plan
can be generated (hypothesis), printed in a failure and pasted back to
replay it.

The diagnosis never reads the fault plan: it works out the culprit from
what it observed, as it must for a user's real bug.  Faults only exist to
prove that it does.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Optional, Tuple, Union

CRASH_HOW = ("exit", "kill", "abort")
BAD_CONFIG_KINDS = ("missing", "wrong_size", "duplicate_index", "swapped", "wrong_port")


class InjectedFault(RuntimeError):
    """What :class:`RaiseError` raises inside the worker's training loop."""


@dataclasses.dataclass(frozen=True)
class SkipStep:
    """The worker does not run ``step``: its step count diverges by one."""
    worker: int
    step: int


@dataclasses.dataclass(frozen=True)
class ExtraCollective:
    """At ``step`` the worker runs one all-reduce the others do not."""
    worker: int
    step: int


@dataclasses.dataclass(frozen=True)
class Crash:
    """At ``step`` the worker dies: ``os._exit(1)``, SIGKILL of itself, or ``abort()``."""
    worker: int
    step: int
    how: str = "exit"


@dataclasses.dataclass(frozen=True)
class RaiseError:
    """At ``step`` the worker's training loop raises :class:`InjectedFault`."""
    worker: int
    step: int
    message: str = "injected fault"


@dataclasses.dataclass(frozen=True)
class Pause:
    """At ``step`` the worker is stopped with SIGSTOP; the parent sends
    SIGCONT after ``seconds``, or never when ``seconds`` is None."""
    worker: int
    step: int
    seconds: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class Delay:
    """At ``step`` the worker sleeps ``seconds``: a straggler that should
    still complete when ``seconds`` is below the hang timeout."""
    worker: int
    step: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class BadTFConfig:
    """The worker's ``TF_CONFIG`` is wrong from the start (see
    :func:`harness.tfconfig.apply_bad_config` for each ``kind``)."""
    worker: int
    kind: str


Fault = Union[SkipStep, ExtraCollective, Crash, RaiseError, Pause, Delay, BadTFConfig]
STEP_FAULTS = (SkipStep, ExtraCollective, Crash, RaiseError, Pause, Delay)
FAULT_TYPES = STEP_FAULTS + (BadTFConfig,)


class FaultError(ValueError):
    """A fault plan that cannot be applied; raised before any process starts."""


def _check_number(fault, name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FaultError(f"{fault!r}: {name} must be a number, got {value!r}")
    if value < 0 or value != value:
        raise FaultError(f"{fault!r}: {name} must be 0 or more, got {value!r}")


def validate(faults: Iterable, num_workers: int) -> Tuple[Fault, ...]:
    """Check a fault plan against a cluster of ``num_workers``; return it as a tuple.

    Rejects: something that is not a fault, a worker outside
    ``0..num_workers-1``, a negative or non-integer step, a negative delay or
    pause, an unknown ``how`` or ``kind``, and two ``BadTFConfig`` for one worker.
    """
    if faults is None:
        return ()
    if isinstance(faults, FAULT_TYPES):
        faults = (faults,)
    plan = tuple(faults)
    seen_config = set()
    for f in plan:
        if not isinstance(f, FAULT_TYPES):
            raise FaultError(f"{f!r} is not a fault; use one of "
                             f"{', '.join(t.__name__ for t in FAULT_TYPES)} from harness.faults")
        if isinstance(f.worker, bool) or not isinstance(f.worker, int) \
                or not 0 <= f.worker < num_workers:
            raise FaultError(f"{f!r}: worker {f.worker!r} does not exist in a cluster of "
                             f"{num_workers} workers (0..{num_workers - 1})")
        if isinstance(f, STEP_FAULTS):
            if isinstance(f.step, bool) or not isinstance(f.step, int) or f.step < 0:
                raise FaultError(f"{f!r}: step must be an integer 0 or more, got {f.step!r}")
        if isinstance(f, Crash) and f.how not in CRASH_HOW:
            raise FaultError(f"{f!r}: how must be one of {', '.join(CRASH_HOW)}")
        if isinstance(f, Delay):
            _check_number(f, "seconds", f.seconds)
        if isinstance(f, Pause):
            _check_number(f, "seconds", f.seconds, allow_none=True)
        if isinstance(f, RaiseError) and not isinstance(f.message, str):
            raise FaultError(f"{f!r}: message must be a string")
        if isinstance(f, BadTFConfig):
            if f.kind not in BAD_CONFIG_KINDS:
                raise FaultError(f"{f!r}: kind must be one of {', '.join(BAD_CONFIG_KINDS)}")
            if f.kind in ("duplicate_index", "swapped") and num_workers < 2:
                raise FaultError(f"{f!r}: needs at least 2 workers")
            if f.worker in seen_config:
                raise FaultError(f"{f!r}: worker {f.worker} already has a BadTFConfig")
            seen_config.add(f.worker)
    return plan


def for_worker(plan: Iterable[Fault], index: int) -> Tuple[Fault, ...]:
    return tuple(f for f in plan if f.worker == index)


def at_step(plan: Iterable[Fault], step: int) -> Tuple[Fault, ...]:
    return tuple(f for f in plan if isinstance(f, STEP_FAULTS) and f.step == step)
