"""What the two sides of the harness share: message kinds, signals, specs.

The parent (pytest's process) creates a duplex OS pipe per worker.  The
worker sends :class:`Message` values up it, one at a time; the parent sends
two things down it, :data:`APPLIED` and :data:`RELEASE`.  The channel is an OS pipe, so it keeps
working when TensorFlow's own gRPC channels are wedged, and the parent wakes
the instant a message (or the worker's death) arrives: there is no polling
interval in the hang detector.

Nothing here imports TensorFlow: both sides, and the pure diagnosis, use it.
"""
from __future__ import annotations

import dataclasses
import enum
import signal
from typing import Any, Optional

class TextEnum(str, enum.Enum):
    """An enum whose members are their text: they compare equal to it,
    print as it and travel as it (JSON, a recorded run), so a value read
    back as a plain string is the same kind."""

    __str__ = str.__str__
    __repr__ = str.__repr__

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)


class Kind(TextEnum):
    """``Message.kind``, worker -> parent.  The phases a worker goes
    through come first, in this order (:data:`PHASES`), then the events."""

    STARTED = "started"                      # worker set up, about to call fn
    STRATEGY_CREATING = "strategy_creating"  # entered MultiWorkerMirroredStrategy()
    STRATEGY_CREATED = "strategy_created"    # data: num_replicas_in_sync
    STEP = "step"               # step: the step index about to run (in the progress map)
    STEPS_DONE = "steps_done"   # step: how many steps the loop ran; data: how many asked for
    FAULT = "fault"             # data: the fault being applied (the record keeps its repr)
    RETURNED = "returned"       # data: dill bytes of fn's return value
    RAISED = "raised"           # data: WorkerError
    REPLICAS = "replicas"       # data: tuple of VariablePrint, before RETURNED (check_replicas)
    # The collective ledger (see harness.worker.ledger), told once, at trace time:
    LEDGER_FUNCTION = "ledger_function"      # data: {"id", "name"} of a function
    # data: {"function", "trace", "index", "kind", "shape", "dtype", "label", "timeout"}
    LEDGER_COLLECTIVE = "ledger_collective"
    LEDGER_OFF = "ledger_off"   # data: why the ledger could not be recorded
    # data: {"id", "site"}: a line of the user's code that launched an eager
    # collective, told once per line (calls name it by id in the progress map)
    LEDGER_SITE = "ledger_site"
    # The progress map (harness.core.progress) is half full: read it now.
    DRAIN = "drain"
    # A host name of TF_CONFIG's cluster, as this worker's own lookups see it
    # (harness.worker.names): data {"address": "HOST:PORT", "error": text}.
    NAME_UNRESOLVED = "name_unresolved"
    NAME_RESOLVED = "name_resolved"
    # A checkpoint restore fn asked of TensorFlow (harness.worker.checkpoints):
    # data {"path": the checkpoint read, or None: nothing to restore};
    # step: the step whose boundary was reported last (None: before the first).
    RESTORED = "restored"
    # The run's directory changed since the last step boundary (with
    # run(watch_state=True)): data {"files": the names written, up to 8};
    # step: the boundary where it was seen (the write was in the step before).
    SAVED = "saved"
    # A dataset fn distributed (harness.worker.datasets): data
    # {"cardinality": its length, -1 for ever, -2 unknown}.
    DATASET = "dataset"
    # The chief's ClusterCoordinator put a function back in its queue after
    # the worker running it failed (it runs again elsewhere, or there once
    # the worker is back): data {"task": "worker", "index": the worker's
    # index among the workers, "error": the error's type name}.
    RESCHEDULED = "rescheduled"
    # A Keras fit began an epoch after its first (the Keras callback):
    # step: the step that begins it; data: the epoch's number.
    EPOCH = "epoch"


STARTED, STRATEGY_CREATING, STRATEGY_CREATED = Kind.STARTED, Kind.STRATEGY_CREATING, Kind.STRATEGY_CREATED
STEP, STEPS_DONE, FAULT, RETURNED, RAISED = Kind.STEP, Kind.STEPS_DONE, Kind.FAULT, Kind.RETURNED, Kind.RAISED
REPLICAS, DRAIN, LEDGER_OFF = Kind.REPLICAS, Kind.DRAIN, Kind.LEDGER_OFF
LEDGER_FUNCTION, LEDGER_COLLECTIVE = Kind.LEDGER_FUNCTION, Kind.LEDGER_COLLECTIVE
LEDGER_SITE = Kind.LEDGER_SITE
NAME_UNRESOLVED, NAME_RESOLVED = Kind.NAME_UNRESOLVED, Kind.NAME_RESOLVED
RESTORED, DATASET, SAVED, RESCHEDULED = Kind.RESTORED, Kind.DATASET, Kind.SAVED, Kind.RESCHEDULED
EPOCH = Kind.EPOCH
PHASES = (STARTED, STRATEGY_CREATING, STRATEGY_CREATED, STEP, STEPS_DONE)
LEDGER_KINDS = (LEDGER_FUNCTION, LEDGER_COLLECTIVE, LEDGER_SITE, LEDGER_OFF)

# -- parent -> worker ----------------------------------------------------------
# A worker that returned may exit now.  It waits for it so that a worker which
# returned early stays in its cluster until the whole run is decided.  (A
# worker that raised exits at once, as a process whose main raised does.)
RELEASE = "release"
# A network fault's first change to the worker's link is in place.  The
# worker waits for it at the fault's step boundary, so the step the fault is
# keyed to is the one that runs into it, however busy the machine.
APPLIED = "applied"
# How long a worker waits for APPLIED: the parent carries out a command in
# milliseconds, so this is only a bound on a parent that is stuck.
APPLIED_WAIT = 30.0

# faulthandler in every worker dumps all its threads' Python stacks to its
# stack file on this signal: a C-level handler, so it works while the main
# thread is blocked inside a TensorFlow collective.
DUMP_SIGNAL = signal.SIGUSR1


@dataclasses.dataclass(frozen=True)
class WorkerError:
    """An exception raised in a worker, reduced to data.

    TensorFlow's exceptions hold C++ op state and do not pickle reliably, so
    what crosses the process boundary is the type name, the message, the
    formatted traceback and, for the harness's own errors that carry data
    (see :mod:`harness.errors`), that data as ``fields``.
    """

    type_name: str
    message: str
    traceback: str = ""
    fields: Optional[dict] = None

    def __str__(self) -> str:
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return f"{self.type_name}: {first}" if first else self.type_name


@dataclasses.dataclass(frozen=True)
class VariablePrint:
    """One strategy variable as a worker holds it when ``fn`` has returned.

    ``name`` is the name it was created with, ``number`` its place in the
    order of creation; ``digest`` the SHA-256 of its value's bytes.  The
    value itself is array ``v<number>`` of the worker's replica file, read
    only where digests differ.
    """

    number: int
    name: str
    shape: tuple
    dtype: str
    digest: str

    @property
    def label(self) -> str:
        return f"{self.name!r} (variable #{self.number}, shape {tuple(self.shape)}, {self.dtype})"


@dataclasses.dataclass(frozen=True)
class Message:
    """One report from worker ``worker``.

    ``time`` is the worker's ``time.time()`` when it sent the message; the
    parent also stamps the arrival time in its progress record.
    """

    worker: int
    kind: str
    time: float
    step: Optional[int] = None
    data: Any = None


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What the parent hands a worker process at start.

    ``payload`` is ``dill.dumps((fn, args, kwargs))``, made in the parent so
    that an unserializable ``fn`` is reported before any process starts.
    ``env`` is applied to ``os.environ`` before TensorFlow is touched;
    ``tf_config`` is the worker's ``TF_CONFIG`` (None: left unset).
    ``progress_path`` is the file the parent made for its progress map
    (:mod:`harness.core.progress`); ``ledger`` the ledger level, or None for off.
    ``attempt`` counts the restarts of the run so far (``ctx.attempt``);
    ``replicas_path`` is set when the run checks its replicas; ``run_dir``
    is the run's own directory, the same in every attempt.
    """

    index: int
    num_workers: int
    payload: bytes
    tf_config: Optional[dict]
    env: dict
    log_path: str
    stack_path: str
    faults: tuple = ()
    sync_check: bool = False
    progress_path: str = ""
    ledger: Optional[str] = "calls"
    step_function: Optional[str] = None
    attempt: int = 0
    replicas_path: str = ""   # where to write the replica file; "" when the check is off
    reference_workers: int = 0   # in a single-worker reference: the N it stands in for
    exit_on_return: bool = False   # exit once fn returned, as a script ends (on_return="exit")
    netns: Optional[tuple] = None  # (user ns path, net ns path) to join first; None: the host's
    run_dir: str = ""   # the run's directory, kept across its attempts (ctx.run_dir)
    watch_state: bool = False   # report where run_dir changes (protocol.SAVED)
    # A server of a parameter-server cluster: it runs a tf.distribute.Server,
    # not fn, and its steps are read from the progress map of its
    # coordinator, at this path (harness.worker.servers).
    serves_for: str = ""
    # The chief of a parameter-server cluster: fn runs the job's coordinator.
    coordinates: bool = False
    # The coordinator's (worker index, step) pairs at which a fault ends
    # that worker: the function that reaches the step there has its result
    # held until the worker is gone.
    holds: tuple = ()


# A worker's process name carries its log's path after this mark, so that
# the forkserver's child writes to the log from the fork on (see
# harness.worker.preload), before worker_main redirects its output.
PROCESS_LOG_MARK = " log="


def process_name(spec: WorkerSpec) -> str:
    return f"mwms-worker-{spec.index}{PROCESS_LOG_MARK}{spec.log_path}"


def log_path_of(process_name: str) -> str:
    """The log path a :func:`process_name` carries; "" when none."""
    return process_name.partition(PROCESS_LOG_MARK)[2]
