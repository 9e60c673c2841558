"""Every exception the harness raises for a user to catch, in one place.

They are re-exported from :mod:`harness`.  Each says what went wrong and what
to do about it; none needs TensorFlow to import.

Errors that the diagnosis reads back from a worker carry their data as
attributes (``StepDesyncError.steps``), which travel to the parent as
:attr:`harness.WorkerError.fields`, never parsed out of the text.
"""
from __future__ import annotations

import collections
from typing import Optional, Sequence, Tuple

__all__ = ["HarnessError", "SettingError", "FaultError", "SerializationError", "StateDirError",
           "PortsUnavailableError", "TempDirFullError", "NotInWorkerError", "InjectedFault",
           "SecondStrategyError", "StepDesyncError",
           "RecordFormatError", "UsageError", "HarnessWarning", "PreloadWarning",
           "ReportWarning", "ExplorationFailed"]


class HarnessError(Exception):
    """Base of the harness's own errors."""


class SettingError(HarnessError, ValueError):
    """A bad option, ini or marker value; the plugin turns it into a usage error."""


class FaultError(HarnessError, ValueError):
    """A fault plan that cannot be applied; raised before any process starts."""


class SerializationError(HarnessError, TypeError):
    """``fn``, its arguments or its result cannot cross a process boundary."""


class StateDirError(HarnessError, OSError):
    """The directory where the harness coordinates ports cannot be used safely.

    The message names the path, its owner and mode, why it is refused, and
    the settings that choose another directory (``$MWMS_STATE_DIR``, the ini
    option ``mwms_state_dir``); see :mod:`harness.launch.ports`.
    """


class PortsUnavailableError(HarnessError, RuntimeError):
    """Too few ports were free to reserve for a cluster: held by other runs
    (of any user) or in use by other programs; the message counts each."""


class TempDirFullError(HarnessError, OSError):
    """The temp directory where the harness keeps a run's files (workers'
    logs, progress files, their ``TMPDIR``) is full: a problem of the
    machine, named as such, never a worker's crash or error."""


class NotInWorkerError(HarnessError, RuntimeError):
    """``harness.context()`` was called outside a worker process."""


class InjectedFault(HarnessError, RuntimeError):
    """What a ``RaiseError`` fault raises inside the worker's training loop."""


class SecondStrategyError(HarnessError, RuntimeError):
    """``fn`` created another MultiWorkerMirroredStrategy on a changed cluster
    (``TF_CONFIG``'s cluster or task differs from the first strategy's).
    More strategies on the same cluster run."""


def odd_ones_out(steps: Sequence[int]) -> Optional[Tuple[int, ...]]:
    """``steps[i]`` is worker i's step: the workers off the step a strict,
    unique majority agrees on, or None when there is no such majority."""
    counts = collections.Counter(steps)
    if not counts:
        return None
    (common, hits), = counts.most_common(1)
    if hits * 2 > len(steps) and list(counts.values()).count(hits) == 1:
        return tuple(i for i, s in enumerate(steps) if s != common)
    return None


class StepDesyncError(HarnessError, RuntimeError):
    """The opt-in sync check saw workers at different steps.

    ``steps[i]`` is the step worker i was at when the check ran; every worker
    raises this with the same ``steps`` (they come from one all-reduce).
    """

    def __init__(self, steps: Sequence[int]):
        self.steps = tuple(int(s) for s in steps)
        super().__init__(self._text())

    @property
    def fields(self) -> dict:
        """What the parent's diagnosis reads (see the module docstring)."""
        return {"steps": list(self.steps)}

    def _text(self) -> str:
        at = ", ".join(f"worker {i} at step {s}" for i, s in enumerate(self.steps))
        odd = odd_ones_out(self.steps)
        if odd:
            return f"step desync: {at}; odd one out: " + ", ".join(f"worker {i}" for i in odd)
        return f"step desync: {at}; no majority, so no single worker can be blamed"

    def __reduce__(self):
        return type(self), (self.steps,)


class RecordFormatError(HarnessError, ValueError):
    """A recorder's file (:mod:`harness.record.files`) that cannot be read:
    missing, torn, foreign or of another format version; the message names
    the file."""


class UsageError(HarnessError):
    """A ``harness run`` command line that cannot be run; printed with the
    usage, exit status 2."""


class HarnessWarning(UserWarning):
    """Base of the harness's own warnings: something it could not do, and
    went on without (``-W error::harness.HarnessWarning`` makes them errors;
    ``-W ignore::...`` hides them)."""


class PreloadWarning(HarnessWarning):
    """A module named in ``mwms_preload`` could not be preloaded safely."""


class ReportWarning(HarnessWarning):
    """A report of a run (its timeline, its JUnit properties, its sections
    of the test report, the session summary) could not be made; the session
    goes on without it, and its other tests run.  Warned once a session."""


# What the test asked of the harness was wrong (a setting, a fault, fn that
# cannot be pickled, the port directory): raised before any process starts.
SETUP_ERRORS = (SettingError, FaultError, SerializationError, StateDirError, TempDirFullError)


def hide_in_setup_errors(excinfo) -> bool:
    """pytest's ``__tracebackhide__`` for the modules that check a run's
    setup (set in their globals): under a setup error, the test's line and
    the one-line error say it all, and the harness's frames are left out."""
    return excinfo is not None and excinfo.errisinstance(SETUP_ERRORS)


class ExplorationFailed(HarnessError, AssertionError):
    """``explore`` found a plan of faults that breaks the property it
    checked: the message starts with the smallest such plan as a
    ``faults=[...]`` line to paste; ``exploration`` is the whole search
    (:class:`harness.explore.Exploration`)."""

    def __init__(self, message: str, exploration=None):
        super().__init__(message)
        self.exploration = exploration
