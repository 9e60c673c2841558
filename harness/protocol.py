"""The one message protocol between a worker and the parent.

A worker sends :class:`Message` values, one at a time, over a one-way pipe
that the parent created for it.  The channel is an OS pipe, so it keeps
working when TensorFlow's own gRPC channels are wedged, and the parent
wakes the instant a message (or the worker's death) arrives: there is no
polling interval in the hang detector.

Nothing here imports TensorFlow: both sides, and the pure diagnosis, use it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

# Phases a worker goes through, in order.  ``Message.kind`` is one of these
# or one of the event kinds below.
STARTED = "started"                    # worker set up, about to call fn
STRATEGY_CREATING = "strategy_creating"  # entered MultiWorkerMirroredStrategy()
STRATEGY_CREATED = "strategy_created"    # data: num_replicas_in_sync
STEP = "step"                          # step: the step index about to run
STEPS_DONE = "steps_done"              # step: how many steps the loop ran; data: how many it was asked for
FAULT = "fault"                        # data: the fault being applied (the record keeps its repr)
RETURNED = "returned"                  # data: dill bytes of fn's return value
RAISED = "raised"                      # data: WorkerError


@dataclasses.dataclass(frozen=True)
class WorkerError:
    """An exception raised in a worker, reduced to text.

    TensorFlow's exceptions hold C++ op state and do not pickle reliably, so
    what crosses the process boundary is the type name, the message and the
    formatted traceback.
    """

    type_name: str
    message: str
    traceback: str = ""

    def __str__(self) -> str:
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return f"{self.type_name}: {first}" if first else self.type_name


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


# Parent -> worker: a single byte on the worker's channel telling a finished
# worker to exit.  Finished workers wait for it so that a worker which
# returned early stays alive (as a real process would stay in its cluster)
# until the whole run is decided; see harness.worker.
RELEASE = "release"


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """What the parent hands a worker process at start.

    ``payload`` is ``dill.dumps((fn, args, kwargs))``, made in the parent so
    that an unserializable ``fn`` is reported before any process starts.
    ``env`` is applied to ``os.environ`` before TensorFlow is touched;
    ``tf_config`` is the worker's ``TF_CONFIG`` (None: left unset).
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
