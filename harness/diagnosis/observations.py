"""What the parent observed during a run: plain data, no TensorFlow.

The controller fills these in while it watches the workers; the diagnosis
(:mod:`harness.diagnosis`) reads them and nothing else.  Keeping them plain
frozen data means a run can be recorded (``to_dict``), and the diagnosis
tested and improved on recorded runs, without starting a process.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from harness.core import protocol
from harness.core.protocol import TextEnum, WorkerError
from harness.core.tfconfig import task_label

class Outcome(TextEnum):
    """What a run ends as, the diagnosis's first answer (precedence, from
    the highest: crashed, failed, hang, crashed_at_exit).  Each equals its
    text: ``result.outcome == "hang"`` holds.

    ``CRASHED_AT_EXIT``: every worker returned its value (training
    completed, ``return_values`` hold them all), but one or more of their
    processes then ended by a signal or a non-zero status, as at the exit
    of a script (``on_return="exit"``): what a cluster manager sees as a
    failed job (tensorflow#56684).  Not a pass, and not a crash during
    training."""

    COMPLETED = "completed"
    FAILED = "failed"
    CRASHED = "crashed"
    HANG = "hang"
    CRASHED_AT_EXIT = "crashed_at_exit"


OUTCOMES = tuple(Outcome)


class EndedBy(TextEnum):
    """How a run's watch loop ended."""

    ALL_FINISHED = "all_finished"    # every worker returned, raised or died
    HANG = "hang"                    # no progress for ``timeout`` seconds
    GRACE_EXPIRED = "grace_expired"  # a worker raised/died; its peers stayed blocked
    DEADLOCK = "deadlock"            # the ledgers proved it can never complete


ALL_FINISHED, HANG, GRACE_EXPIRED = EndedBy.ALL_FINISHED, EndedBy.HANG, EndedBy.GRACE_EXPIRED
# The exit code of a process seen to end whose status nobody could read: a
# recorded job's task killed by a signal, or ended by os._exit, that its
# own parent reaped (harness.record).  No real exit code is this.
EXIT_STATUS_UNKNOWN = 256


@dataclasses.dataclass(frozen=True)
class Event:
    """One progress report, stamped with the parent's clock.

    ``time`` is seconds since the run started (parent's monotonic clock);
    ``kind`` is one of :mod:`harness.core.protocol`'s phase/event kinds.
    """

    time: float
    kind: str
    step: Optional[int] = None
    data: object = None


@dataclasses.dataclass(frozen=True)
class CollectiveOp:
    """One collective a traced function launches, as it was traced.

    In a graph TensorFlow packs tensors before it all-reduces them, so
    ``shape`` is the shape of the pack (the gradients of a small model,
    flattened and joined, say), not of one variable.  -1 is a dimension
    unknown at trace time.

    ``label`` says what it reduces, one name per packed part, learnt when
    it was traced (the ops that produce its input, through TensorFlow's
    packing: see :mod:`harness.worker.ledger`); () for an eager
    collective, which has no graph to read.  ``timeout`` is its
    ``timeout`` argument in seconds (``CommunicationOptions(timeout_seconds=...)``
    under MWMS), 0.0 when none: a collective with one ends by raising."""

    kind: str                 # "all-reduce", "all-gather" or "broadcast"
    shape: Tuple[int, ...]
    dtype: str
    label: Tuple[str, ...] = ()
    timeout: float = 0.0

    def __str__(self) -> str:
        return f"{self.kind} {self.dtype}[{','.join(map(str, self.shape))}]"


@dataclasses.dataclass(frozen=True)
class TracedFunction:
    """A ``tf.function`` (or ``<eager KIND>``, one eager collective) and the
    collectives its latest trace launches, in order."""

    id: int
    name: str
    collectives: Tuple[CollectiveOp, ...] = ()


@dataclasses.dataclass(frozen=True)
class Call:
    """One call of a function that launches collectives, from the ledger.

    ``number`` counts the calls of that function in this worker, from 1;
    ``step`` is the step whose boundary was reported last when it began
    (None outside ``steps()`` and the Keras callback); ``ended`` is None
    while it has not returned (the worker is blocked in it).  At
    ``ledger="collectives"``, ``launched`` and ``done`` list the indexes of
    its collectives that were launched and that completed.  ``site`` is
    the line of the user's code that made an eager collective's call
    (``train.py:57 in train: ckpt.save(path)``), "" when not known and for
    a ``tf.function``'s (its name says which)."""

    function: int
    number: int
    step: Optional[int]
    began: float
    ended: Optional[float] = None
    raised: bool = False
    launched: Tuple[int, ...] = ()
    done: Tuple[int, ...] = ()
    site: str = ""


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective a worker launched, from its ledger: the plain record
    ``WorkerResult.collectives`` lists, for a test to assert on.

    ``state`` is ``completed``; ``failed`` (its call raised); ``pending``
    (its call had not returned when the run was decided: at the default
    ledger level every collective of that call reads ``pending``, at
    ``ledger="collectives"`` only the one launched and not completed);
    or ``not launched`` (a later collective of a pending call, at
    ``ledger="collectives"``).  ``site``: the line of the user's code that
    launched an eager one (see :class:`Call`), else ""."""

    function: str
    call: int
    index: int                # its place among its function's collectives
    step: Optional[int]
    kind: str
    shape: Tuple[int, ...]
    dtype: str
    state: str
    site: str = ""


@dataclasses.dataclass(frozen=True)
class WorkerObservation:
    """Everything the parent saw of one worker.

    ``exit_code`` follows ``multiprocessing``: negative for death by a signal
    (``-9`` for SIGKILL).  ``killed_by_harness`` is True when that signal came
    from the harness's own cleanup after a hang or grace expiry, or when a
    worker still running at that moment ended by itself during the cleanup,
    so it is not mistaken for a crash.  ``stopped`` is True when the worker was found
    stopped (SIGSTOP) at the end of the run: it could not dump a stack.
    ``tf_config`` is the ``TF_CONFIG`` the worker had when it built its
    strategy (what it was given, if it never did).  ``functions`` and
    ``calls`` are its collective ledger; ``ledger`` the level it was kept at
    (None: not kept), ``ledger_note`` why not, or what was lost.
    ``variables`` are the fingerprints of its strategy's variables when
    ``fn`` returned, when the run checked replicas or a reference.
    ``memory`` is what the parent sampled of its memory while it ran
    (:mod:`harness.controller.memory`): ``(seconds since the run started,
    bytes)`` pairs, on the clock of its events; empty where its backend
    cannot read it.
    """

    index: int
    tf_config: Optional[dict] = None
    events: Tuple[Event, ...] = ()
    returned: bool = False
    error: Optional[WorkerError] = None
    finish_time: Optional[float] = None   # when RETURNED or RAISED arrived
    exit_code: Optional[int] = None
    exit_time: Optional[float] = None     # when the parent saw the process end
    killed_by_harness: bool = False
    stopped: bool = False
    stack: str = ""
    functions: Tuple[TracedFunction, ...] = ()
    calls: Tuple[Call, ...] = ()
    ledger: Optional[str] = None
    ledger_note: str = ""
    variables: Tuple[protocol.VariablePrint, ...] = ()   # its fingerprints, when taken
    memory: Tuple[Tuple[float, int], ...] = ()

    @property
    def steps(self) -> Tuple[int, ...]:
        """The step boundaries the worker reported, in order."""
        return tuple(e.step for e in self.events
                     if e.kind == protocol.STEP and isinstance(e.step, int))

    def collectives(self) -> Tuple[Collective, ...]:
        """Every collective in the ledger, in launch order (see :class:`Collective`)."""
        functions = {f.id: f for f in self.functions}
        out = []
        for c in self.calls:
            f = functions.get(c.function)
            if f is None:
                continue
            for i, op in enumerate(f.collectives):
                if c.ended is not None:
                    state = "failed" if c.raised else "completed"
                elif self.ledger != "collectives":
                    state = "pending"
                else:
                    state = ("completed" if i in c.done else "pending" if i in c.launched
                             else "not launched")
                out.append(Collective(f.name, c.number, i, c.step, op.kind, op.shape, op.dtype,
                                      state, c.site))
        return tuple(out)

    @property
    def last_seen(self) -> float:
        """When the parent last saw this worker make progress (0.0: never):
        an event, a call of its ledger, or its finishing."""
        times = [0.0, *(e.time for e in self.events),
                 *(t for c in self.calls for t in (c.began, c.ended) if t is not None)]
        if self.finish_time is not None:
            times.append(self.finish_time)
        if self.died and self.exit_time is not None:
            times.append(self.exit_time)
        return max(times)

    @property
    def last_step(self) -> Optional[int]:
        steps = self.steps
        return steps[-1] if steps else None

    @property
    def finished(self) -> bool:
        return self.returned or self.error is not None

    @property
    def died(self) -> bool:
        """Ended without returning or raising, and not by the harness's hand."""
        return (not self.finished and self.exit_code is not None
                and not self.killed_by_harness)

    @property
    def died_at_exit(self) -> bool:
        """Returned its value, then its process ended by a signal or a
        non-zero status (an atexit handler, teardown), not by the harness's
        hand."""
        return (self.returned and self.error is None and self.exit_code not in (None, 0)
                and not self.killed_by_harness)

    def left_during(self, obs: RunObservation) -> bool:
        """Returned, and its process ended by itself, as a script's does
        (``obs.exit_on_return``), or while the run was still watched: its
        peers saw it leave.  A worker that stays (``on_return="stay"``) ends
        only once the run is decided and it is released."""
        return (self.returned and self.error is None and self.exit_code is not None
                and not self.killed_by_harness
                and (obs.exit_on_return or (self.exit_time is not None
                                            and self.exit_time <= obs.duration)))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def error_of(w: WorkerObservation) -> WorkerError:
    """The error of a worker known to have raised (one of ``Facts.errors``,
    say); a ValueError for one that did not."""
    if w.error is None:
        raise ValueError(f"worker {w.index} did not raise")
    return w.error


@dataclasses.dataclass(frozen=True)
class DivergentVariable:
    """The first variable on which the workers disagree.

    ``sides`` groups the workers that agree with each other on it (within
    the tolerance), largest group first; ``max_difference`` is the largest
    absolute difference between any worker's value and the first side's
    (None when the variables do not even have the same shape or are
    missing on some workers); ``detail`` says what differs, naming no
    worker (the diagnosis names the sides); ``layouts``, when the workers
    created different variables, each side's variable, side by side."""

    variable: str
    sides: Tuple[Tuple[int, ...], ...]
    max_difference: Optional[float]
    detail: str
    layouts: Tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ReplicaCheck:
    """What the replica check found: how many variables each worker
    fingerprinted, the tolerance, the divergence if any, and notes (a
    worker that could not fingerprint)."""

    variables: Tuple[int, ...]
    tolerance: float
    divergence: Optional[DivergentVariable] = None
    notes: Tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ReferenceCheck:
    """What the single-worker reference check found (``run(reference=...)``):
    the reference run's outcome, how many variables were compared, the
    tolerance, and, when the run differs from the reference, what differs
    (``what``: a variable, or fn's return value), by how much, and a
    sentence for a person (``detail``)."""

    reference_outcome: str
    variables: int
    tolerance: float
    what: Optional[str] = None
    max_difference: Optional[float] = None
    detail: str = ""

    @property
    def differs(self) -> bool:
        return self.reference_outcome != Outcome.COMPLETED or self.what is not None


@dataclasses.dataclass(frozen=True)
class LinkProbe:
    """One link tried when a run ended without completing, in a cluster
    whose workers each have a network namespace: a TCP connect from
    ``source`` (a worker's index, or None: the switch the workers hang on)
    to worker ``target``'s port, and what came back within the probes'
    limit (``how``: ``connected``, ``refused``, ``timed out``,
    ``unreachable``, or ``not tried: ...``), after ``ms`` milliseconds;
    ``rtt``: the faster of two one-byte round trips to an
    echo in the target's namespace, the way the workers' traffic goes
    (through the proxy where the run has one), in milliseconds (None: none
    came back, or none was tried); ``bulk``: 64 kB sent there and back
    the same way after it, in milliseconds (None: not all came back within
    the probes' limit, or none was tried)."""

    source: Optional[int]
    target: int
    how: str
    ms: float
    rtt: Optional[float] = None
    bulk: Optional[float] = None

    @property
    def answered(self) -> bool:
        """The target's end of the link answered: its process listens, or
        its kernel reset the connect (the process has ended)."""
        return self.how in ("connected", "refused")

    @property
    def tried(self) -> bool:
        return not self.how.startswith("not tried")


@dataclasses.dataclass(frozen=True)
class RunObservation:
    """What the parent saw of one run (one attempt of a run with restarts).
    ``replicas`` is the replica check's finding (``run(check_replicas=...)``),
    None when the check was off or the workers did not all return;
    ``reference`` the single-worker reference check's (``run(reference=...)``);
    ``exit_on_return`` whether a worker whose ``fn`` returned ended its
    process at once (``on_return="exit"``, as a script ends), so that its
    peers saw it leave, however late the parent saw its exit."""

    num_workers: int
    timeout: float
    grace: float
    ended_by: str
    duration: float
    workers: Tuple[WorkerObservation, ...]
    replicas: Optional[ReplicaCheck] = None
    reference: Optional[ReferenceCheck] = None
    exit_on_return: bool = False
    # (type, index) of each process, in order, in a cluster with a chief or
    # an evaluator (the chief first, the evaluator last); () for workers only.
    tasks: Tuple[Tuple[str, int], ...] = ()
    # The links tried as the run ended without completing (LinkProbe), and
    # why none were, when none were.
    links: Tuple[LinkProbe, ...] = ()
    links_note: str = ""
    # In a parameter-server cluster, the processes that serve (its workers
    # and parameter servers; the chief runs the job); () otherwise.
    serving: Tuple[int, ...] = ()

    def task(self, index: int) -> Tuple[str, int]:
        if not self.tasks:
            return ("worker", index)
        kind, number = self.tasks[index]
        return (kind, number)

    @property
    def evaluator(self) -> Optional[int]:
        """The evaluator's index, when the cluster has one."""
        found = [i for i, (kind, _) in enumerate(self.tasks) if kind == "evaluator"]
        return found[0] if found else None

    @property
    def training(self) -> Tuple[WorkerObservation, ...]:
        """The workers in the collectives: every one but an evaluator."""
        evaluator = self.evaluator
        return tuple(w for w in self.workers if w.index != evaluator)

    def label(self, index: int) -> str:
        return task_label(*self.task(index))

    def labels(self) -> Optional[Tuple[str, ...]]:
        """Each process's name, when the cluster has a chief or an evaluator."""
        return tuple(self.label(i) for i in range(len(self.tasks))) if self.tasks else None

    @property
    def last_progress_time(self) -> float:
        """When the parent last saw progress from any worker (0.0: never)."""
        return max([0.0, *(w.last_seen for w in self.workers)])

    @property
    def detection_delay(self) -> Optional[float]:
        """For a run that ended as hung: seconds past ``timeout`` it took to
        declare the hang (the watch loop's own latency)."""
        if self.ended_by != HANG:
            return None
        return self.duration - self.last_progress_time - self.timeout

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RunObservation:
        workers = []
        for recorded in d["workers"]:
            w = dict(recorded)
            w["events"] = tuple(Event(**e) for e in w.get("events", ()))
            if w.get("error") is not None:
                w["error"] = WorkerError(**w["error"])
            w["functions"] = tuple(
                TracedFunction(f["id"], f["name"], tuple(
                    CollectiveOp(c["kind"], tuple(c["shape"]), c["dtype"],
                                 tuple(c.get("label", ())), float(c.get("timeout", 0.0)))
                    for c in f.get("collectives", ())))
                for f in w.get("functions", ()))
            w["calls"] = tuple(Call(**{**c, "launched": tuple(c.get("launched", ())),
                                       "done": tuple(c.get("done", ()))})
                               for c in w.get("calls", ()))
            w["variables"] = tuple(protocol.VariablePrint(**{**v, "shape": tuple(v["shape"])})
                                   for v in w.get("variables", ()))
            w["memory"] = tuple((float(t), int(b)) for t, b in w.get("memory", ()))
            workers.append(WorkerObservation(**w))
        replicas = d.get("replicas")
        if replicas is not None:
            div = replicas.get("divergence")
            replicas = ReplicaCheck(**{
                **replicas, "variables": tuple(replicas["variables"]),
                "notes": tuple(replicas.get("notes", ())),
                "divergence": None if div is None else DivergentVariable(**{
                    **div, "sides": tuple(tuple(s) for s in div["sides"]),
                    "layouts": tuple(div.get("layouts", ()))})})
        reference = d.get("reference")
        if reference is not None:
            reference = ReferenceCheck(**reference)
        return cls(**{**d, "workers": tuple(workers), "replicas": replicas,
                      "reference": reference,
                      "tasks": tuple(tuple(t) for t in d.get("tasks", ())),
                      "serving": tuple(d.get("serving", ()))})
