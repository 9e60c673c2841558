"""The watch loop of one attempt, and what it knows of each worker.

:class:`WatchLoop` waits on all the workers' channels and process sentinels
at once, so a report or a death wakes it at once and a hang is declared
exactly ``timeout`` seconds after the last progress; it also carries out,
at their time, what faults ask of the parent (a signal, a network command).
Each message kind has one small handler (:data:`RECEIVERS`).
"""
from __future__ import annotations

import dataclasses
import math
import signal
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple, Union

from multiprocess import connection

from harness.controller.ledger_view import LedgerView
from harness.controller.memory import MemorySampler
from harness.core import progress, protocol
from harness.core.protocol import VariablePrint
from harness.controller.proof import Proofs
from harness.diagnosis.echoes import is_restart_echo
from harness.diagnosis.observations import EndedBy, Event, WorkerObservation
from harness.plan import changes_the_network_at_once
from harness.launch.base import WorkerHandle
from harness.network import RunNetwork
from harness.settings import RunSettings

if TYPE_CHECKING:
    from harness.controller.restarts import TaskRestarter


@dataclasses.dataclass(frozen=True)
class ParentAction:
    """What a fault asked the parent to do to worker ``worker`` at
    ``when`` (monotonic): send ``signal``, or run network ``command``."""

    when: float
    worker: int
    signal: Optional[int] = None
    command: Optional[str] = None


@dataclasses.dataclass
class TrackedWorker:
    """What the parent knows of one worker while the run lasts.

    ``seen`` is the worker's observation so far (a frozen record, replaced
    as news arrives); its events are gathered apart, in ``events``, and put
    in when the run ends.
    """

    handle: WorkerHandle
    seen: WorkerObservation
    ledger: LedgerView
    reader: Optional[progress.Reader] = None
    events: List[Event] = dataclasses.field(default_factory=list)
    return_payload: Optional[bytes] = None
    channel_open: bool = True
    # The replica check's fingerprints (a tuple of VariablePrint), or the
    # text of why the worker could not make them.
    replica_prints: Union[Tuple[VariablePrint, ...], str, None] = None
    # The process id, read at its start (None where the backend does not say).
    pid: Optional[int] = None
    # A server of a parameter-server cluster: it serves until the run ends,
    # so the run never waits for it to finish.
    serves: bool = False

    def note(self, **changes: Any) -> None:
        self.seen = dataclasses.replace(self.seen, **changes)

    @property
    def index(self) -> int:
        return self.handle.index

    @property
    def finished(self) -> bool:
        return self.seen.finished

    @property
    def pending(self) -> bool:
        return not self.serves and not self.finished and self.seen.exit_code is None

    def read_records(self) -> None:
        """Take in what the worker wrote to its progress map since last time."""
        if self.reader is not None:
            self.ledger.records(self.reader.drain())

    def stop_reading(self) -> None:
        """The run is decided: what the worker records from now on is the
        harness's own clean-up (a peer released, a socket closed), not
        evidence, so the picture is taken here."""
        if self.reader is not None:
            self.read_records()
            self.ledger.lost(self.reader.lost)
            self.reader = None

    def snapshot(self) -> WorkerObservation:
        """What is known of the worker now, its ledger included."""
        notes = self.ledger.notes + (["records were lost"] if self.reader and self.reader.lost else [])
        return dataclasses.replace(self.seen, functions=self.ledger.functions(),
                                   calls=self.ledger.call_records(), ledger_note="; ".join(notes))

    def observation(self, stack: str) -> WorkerObservation:
        self.stop_reading()
        # Steps come from the map, phases from the pipe: one time line.
        events = sorted(self.events + self.ledger.step_events, key=lambda e: e.time)
        return dataclasses.replace(
            self.seen, events=tuple(events), stack=stack, functions=self.ledger.functions(),
            calls=self.ledger.call_records(), ledger_note="; ".join(self.ledger.notes),
            variables=self.replica_prints if isinstance(self.replica_prints, tuple) else ())


# restart_policy="task": how long a worker that raised gets to exit by
# itself before the harness kills it to start its next process.
RAISED_EXIT_WAIT = 5.0
# How often a run with a progress callback reports to it.
PROGRESS_EVERY = 0.5
# on_return="exit": how long after its return a worker's process is given
# to end before the run is decided without it.  When it left is evidence
# (left_early), and a peer can fail on its closed socket, and end the run,
# before the parent sees the exit.
LEAVE_WAIT = 5.0


@dataclasses.dataclass(frozen=True)
class Progress:
    """What the watch loop sees now, for a live status line
    (``run(progress=...)``): ``elapsed`` seconds since the attempt started,
    ``idle`` seconds since the last progress (a hang is declared when it
    reaches ``timeout``), and per worker its last reported step (None: none
    yet) and its state: ``running``, ``returned``, ``raised`` or ``exited``;
    ``pids`` its process id (a restarted worker's newest; None where the
    backend does not say) and ``exit_codes`` its exit code (None while it
    runs).

    The callback may return a number: the hang timeout from then on, for
    this attempt (an outside deadline, such as :mod:`harness.compat`'s
    ``join(timeout)``, is met through the hang timer, so the run ends with
    the stacks and the verdict a hang gets); or a :class:`Steer`."""

    attempt: int
    elapsed: float
    idle: float
    timeout: float
    steps: Tuple[Optional[int], ...]
    states: Tuple[str, ...]
    pids: Tuple[Optional[int], ...] = ()
    exit_codes: Tuple[Optional[int], ...] = ()


@dataclasses.dataclass(frozen=True)
class Steer:
    """What a progress callback may return besides a number: the hang
    timeout from then on (None: unchanged); under
    ``restart_policy="task"`` the workers whose ended process is to be
    started again now (:mod:`harness.compat`'s ``start_single_process``);
    and the workers to end now, on purpose (``terminate``): no failure,
    so their peers run on with no grace, and where ``restart_policy="task"``
    restarts tasks (``restarts`` ≥ 1) a fresh process in their place, using
    none of their restarts (TensorFlow's runner's ``auto_restart`` restarts
    a terminated task)."""

    timeout: Optional[float] = None
    start: Tuple[int, ...] = ()
    stop: Tuple[int, ...] = ()


# A progress callback (run(progress=...)): it may return a hang timeout or a Steer.
OnProgress = Callable[[Progress], Union[float, Steer, None]]


class WatchLoop:
    """The watch loop of one run; see the module docstring.  With
    ``on_progress``, it hands it a :class:`Progress` as it starts and then
    wakes every :data:`PROGRESS_EVERY` seconds to hand it another."""

    def __init__(self, workers: List[TrackedWorker], settings: RunSettings, start: float,
                 on_progress: Optional[OnProgress] = None, attempt: int = 0,
                 network: Optional[RunNetwork] = None,
                 restarter: Optional[TaskRestarter] = None,
                 exit_on_return: bool = False, end_when_certain: bool = False):
        self.on_progress = on_progress
        # on_return="exit": a worker that returned leaves the cluster.
        self.exit_on_return = exit_on_return
        # restart_policy="task": restarts a worker that crashed or failed
        # (a TaskRestarter); its failure then starts no grace.
        self.restarter = restarter
        self.restarting_together = False   # every task is being stopped and started again
        self.network = network or RunNetwork()   # for network faults' commands
        self.attempt = attempt
        # The first report at once: a run over within PROGRESS_EVERY still
        # shows it started (a script whose worker leaves early fails in 0.4 s).
        self.next_report = start if on_progress else math.inf
        self.workers = workers
        self.timeout = settings.timeout
        self.run_grace = settings.grace
        self.training = settings.shape.training
        self.grace = min(settings.grace, settings.timeout)
        self.start = start
        self.last_progress = start
        self.first_failure: Optional[float] = None   # when a worker first raised or died
        # What faults asked the parent to do, each at its time.
        self.actions: List[ParentAction] = []
        self.memory = MemorySampler(start)   # each live worker's memory, at a steady rate
        # When to look for a certain end (a deadlock; with end_when_certain,
        # a failure or a stopped worker that holds the rest up for ever):
        # never where a task's process may be started again.
        self.proofs = Proofs(start, end_when_certain and restarter is None)

    def _failure_at(self, worker: TrackedWorker, now: float) -> None:
        """A worker raised or died: its peers' grace starts now, if it has
        not yet.  An evaluator's failure starts none: the training tasks do
        not wait for it, and go on to finish; nor does a server's: its
        coordinator goes on without a worker, and raises when a parameter
        server is gone."""
        if worker.index >= self.training or worker.serves:
            return
        if self.first_failure is None:
            self.first_failure = now
        self.proofs.failed(now)

    def _receive(self, worker: TrackedWorker, msg: protocol.Message, now: float) -> None:
        # What the worker recorded before it sent this comes first.
        worker.read_records()
        RECEIVERS.get(msg.kind, WatchLoop._on_phase)(self, worker, msg, now)
        self.last_progress = now

    def _on_ledger(self, worker: TrackedWorker, msg: protocol.Message, now: float) -> None:
        worker.ledger.message(msg.kind, msg.data)
        if msg.kind == protocol.LEDGER_OFF:
            worker.note(ledger=None)

    def _on_drain(self, worker: TrackedWorker, msg: protocol.Message, now: float) -> None:
        """The worker's records were read above: nothing else to do."""

    def _on_returned(self, worker: TrackedWorker, msg: protocol.Message, now: float) -> None:
        worker.return_payload = msg.data
        worker.note(returned=True, finish_time=now - self.start)
        if self.restarter is None and not self.exit_on_return:
            self.proofs.returned(now)

    def _on_replicas(self, worker: TrackedWorker, msg: protocol.Message, now: float) -> None:
        worker.replica_prints = msg.data

    def _on_raised(self, worker: TrackedWorker, msg: protocol.Message, now: float) -> None:
        worker.note(error=msg.data, finish_time=now - self.start)
        if self.restarting_together:
            return      # its process is stopped and started again with the others
        if self.restarter is not None and is_restart_echo(worker.seen.error):
            # The failure it echoes may have ended a process the loop has
            # not looked at yet: that one is restarted first, as the cause.
            self._collect_exits(now, but=worker)
            if not self._in_place(worker):
                return      # restarted with the others meanwhile
            if self.restarter.echoes(worker, now):
                self._restart_together(now)
                return
        if self._restarts(worker):
            self._restart(worker, now)
        else:
            self._failure_at(worker, now)

    def _collect_exits(self, now: float, but: TrackedWorker) -> None:
        """Collect the exit of each worker but ``but`` whose process ended."""
        for other in list(self.workers):
            if other is not but and other.seen.exit_code is None and self._in_place(other):
                self._collect_exit(other, now)

    def _in_place(self, worker: TrackedWorker) -> bool:
        """Whether ``worker`` is still its task's current process: what the
        loop took in from it (or from a peer) may have restarted it."""
        return any(w is worker for w in self.workers)

    def _restart_together(self, now: float) -> None:
        """Stop every task that has not returned and start them all again,
        one fresh cluster, using none of their restarts: what its echoes
        ask of a task's failure (:meth:`TaskRestarter.echoes`)."""
        self.restarting_together = True
        try:
            restarting = [w for w in self.workers if not w.seen.returned]
            # Every old process ends before any new one starts: a new one
            # that met an old peer would be aborted by it again.
            for worker in restarting:
                # One that raised exits by itself; the others are stopped.
                self._end_process(worker, now,
                                  RAISED_EXIT_WAIT if worker.seen.error is not None else 0.0)
            for worker in restarting:
                self._restart(worker, now, asked=True)
        finally:
            self.restarting_together = False

    def _end_process(self, worker: TrackedWorker, now: float, wait: float = 0.0) -> None:
        """Take in what ``worker`` sent, give its process ``wait`` seconds to
        end by itself, else end it with all it started; note its exit."""
        self._drain(worker, now)
        worker.handle.join(wait)
        if worker.handle.exitcode is None:
            worker.handle.kill_tree(worker.handle.descendants())
            worker.handle.join(RAISED_EXIT_WAIT)
            worker.note(killed_by_harness=True)
        worker.note(exit_code=worker.handle.exitcode, exit_time=now - self.start)

    def _restarts(self, worker: TrackedWorker) -> bool:
        """Whether ``worker``, which ended badly, gets a fresh process."""
        return self.restarter is not None and self.restarter.wants(worker)

    def _restart(self, worker: TrackedWorker, now: float, asked: bool = False) -> None:
        """Put ``worker``'s next process in its place; what a fault asked the
        parent to signal the ended one is void.  A worker that raised exits
        by itself at once; one that does not within :data:`RAISED_EXIT_WAIT`
        is killed."""
        if not self._in_place(worker):
            return      # already restarted, while its messages were taken in
        if worker.seen.exit_code is None:
            worker.handle.join(RAISED_EXIT_WAIT)
            code = worker.handle.exitcode
            worker.note(exit_code=code, exit_time=time.monotonic() - self.start,
                        killed_by_harness=code is None)
        worker.channel_open = False
        self.actions = [a for a in self.actions if a.worker != worker.index or a.signal is None]
        if self.restarter is not None:   # it asked for this restart, or was asked
            self.workers[self.workers.index(worker)] = self.restarter.restart(worker, now, asked)

    def _on_fault(self, worker: TrackedWorker, msg: protocol.Message, now: float) -> None:
        fault = msg.data
        # The record keeps plain text: it must load without harness.faults.
        worker.events.append(Event(now - self.start, msg.kind, msg.step, repr(fault)))
        for delay, sig in fault.parent_signals(self.run_grace):
            self.actions.append(ParentAction(now + delay, worker.index, signal=sig))
        for delay, command in fault.network_commands():
            if delay > 0:
                self.actions.append(ParentAction(now + delay, worker.index, command=command))
            else:
                self.network.command(command, worker.index)
        if changes_the_network_at_once(fault):
            try:
                worker.handle.conn.send(protocol.APPLIED)   # it waits for this at its step
            except OSError:
                pass   # it is gone already

    def _on_phase(self, worker: TrackedWorker, msg: protocol.Message, now: float) -> None:
        data = msg.data
        if msg.kind == protocol.STRATEGY_CREATING:
            if data is not None:
                # The TF_CONFIG the worker really had: fn may have set it.
                worker.note(tf_config=self.network.logical(data.get("tf_config")))
            data = None
        worker.events.append(Event(now - self.start, msg.kind, msg.step, data))

    def _read_all_records(self) -> None:
        """Read every worker's progress map; its newest record is progress."""
        for worker in self.workers:
            worker.read_records()
            if worker.ledger.latest is not None and worker.ledger.latest > self.last_progress:
                self.last_progress = worker.ledger.latest

    def _drain(self, worker: TrackedWorker, now: float) -> None:
        try:
            while worker.channel_open and worker.handle.conn.poll(0):
                self._receive(worker, worker.handle.conn.recv(), now)
        except (EOFError, OSError):
            worker.channel_open = False

    def _collect_exit(self, worker: TrackedWorker, now: float) -> None:
        worker.handle.join(0)
        code = worker.handle.exitcode
        if code is None:
            return
        self._drain(worker, now)
        if not self._in_place(worker):
            return      # its last messages restarted it
        worker.note(exit_code=code, exit_time=now - self.start)
        worker.channel_open = False
        if self.restarting_together:
            return
        if self._restarts(worker):
            self._restart(worker, now)
        elif not worker.finished:
            self._failure_at(worker, now)
        self.last_progress = now

    def _actions_due(self, now: float) -> None:
        due = [a for a in self.actions if a.when <= now]
        self.actions = [a for a in self.actions if a.when > now]
        for action in due:
            if action.command is not None:
                self.network.command(action.command, action.worker)
            else:
                self._signal(action, now)

    def _signal(self, action: ParentAction, now: float) -> None:
        worker = self.workers[action.worker]
        if worker.seen.exit_code is not None or action.signal is None:
            return
        if action.signal == signal.SIGKILL:
            # A preempted worker that outlived its grace: the cluster
            # manager takes the machine away, with all that runs on it.
            worker.handle.kill_tree(worker.handle.descendants())
        elif action.signal != signal.SIGCONT or worker.handle.is_stopped():
            worker.handle.send_signal(action.signal)
        elif now - action.when < 1.0:  # it has not stopped itself yet; look again soon
            self.actions.append(dataclasses.replace(action, when=now + 0.02))

    def _proven(self, now: float) -> Optional[EndedBy]:
        """How the run ends, when its end is certain now (:mod:`.proof`)."""
        self._read_all_records()
        training = [w for w in self.workers if w.index < self.training and not w.serves]
        return self.proofs.look([w.snapshot() for w in training], training, self.actions,
                                now - self.start, now, self.first_failure is not None,
                                self.exit_on_return)

    def _sample_memory(self, now: float) -> float:
        """Sample the live workers' memory when due (from outside them: no
        cost in the workers); return when the next sample is due."""
        return self.memory.sample(self.workers, now)

    def _report_progress(self, now: float) -> None:
        if self.on_progress is None:   # never due without one
            return
        self._read_all_records()
        steps, states = [], []
        for worker in self.workers:
            stepped = worker.ledger.step_events
            steps.append(stepped[-1].step if stepped else None)
            states.append("raised" if worker.seen.error is not None else "returned"
                          if worker.seen.returned else "exited" if worker.seen.exit_code is not None
                          else "running")
        self.next_report = now + PROGRESS_EVERY
        wanted = self.on_progress(Progress(
            self.attempt, now - self.start, now - self.last_progress, self.timeout,
            tuple(steps), tuple(states), tuple(getattr(w.handle, "pid", None) for w in self.workers),
            tuple(w.seen.exit_code for w in self.workers)))
        if isinstance(wanted, Steer):
            self._stop_asked(wanted.stop, now)
            self._start_asked(wanted.start, now)
            wanted = wanted.timeout
        if isinstance(wanted, (int, float)) and not isinstance(wanted, bool):
            self.timeout = max(0.0, float(wanted))

    def _stop_asked(self, indexes: Tuple[int, ...], now: float) -> None:
        """End the running workers asked for, as the harness ends one: no
        failure of theirs."""
        for worker in [w for w in self.workers if w.index in indexes and w.pending]:
            self._end_process(worker, now)
            worker.channel_open = False
            if self.restarter is not None and self.restarter.restarts:
                self._restart(worker, now, asked=True)

    def _start_asked(self, indexes: Tuple[int, ...], now: float) -> None:
        """Start again the workers asked for whose process has ended; once
        none of the workers is a failed one, no grace runs."""
        ended = [w for w in self.workers if w.index in indexes and w.seen.exit_code is not None]
        if self.restarter is None or not ended:
            return
        for worker in ended:
            self._restart(worker, now, asked=True)
        if not any(w.seen.error is not None or w.seen.died for w in self.workers):
            self.first_failure = None

    def _leaving_until(self, worker: TrackedWorker) -> float:
        """Until when the watch waits for a returned worker's process to end
        (-inf: it does not)."""
        w = worker.seen
        if not self.exit_on_return or not w.returned or w.error is not None \
                or w.exit_code is not None or w.finish_time is None:
            return -math.inf
        return self.start + w.finish_time + LEAVE_WAIT

    def loop(self) -> EndedBy:
        while True:
            now = time.monotonic()
            pending = [w for w in self.workers if w.pending]
            leave_at = max((self._leaving_until(w) for w in self.workers), default=-math.inf)
            if not pending and now >= leave_at:
                return EndedBy.ALL_FINISHED
            if now >= self.next_report:
                self._report_progress(now)
            hang_at = self.last_progress + self.timeout
            grace_at = (self.first_failure + self.grace if self.first_failure is not None
                        else math.inf)
            action_at = min((a.when for a in self.actions), default=math.inf)
            if now >= action_at:
                self._actions_due(now)
                continue
            if now >= self.proofs.next:
                proven = self._proven(now)
                if proven is not None:
                    return proven
            if now >= hang_at:
                # Steps and calls are in the progress maps, read only now:
                # the parent does not wake for each of them.
                self._read_all_records()
                hang_at = self.last_progress + self.timeout
            if pending and (now >= hang_at or now >= grace_at):
                return EndedBy.GRACE_EXPIRED if grace_at <= hang_at else EndedBy.HANG
            waitables: Dict[Any, tuple] = {}
            for w in self.workers:
                if w.channel_open and not w.finished:
                    waitables[w.handle.conn] = ("conn", w)
                if w.pending or w.seen.exit_code is None:
                    # One that returned too: when it left (on_return="exit")
                    # and how it ended are evidence.
                    waitables[w.handle.sentinel] = ("sentinel", w)
            timers = (hang_at, grace_at, self.proofs.next) if pending else (leave_at,)
            wake = min(*timers, action_at, self.next_report)
            wake = min(wake, self._sample_memory(now))
            ready = connection.wait(list(waitables), timeout=max(0.0, wake - now))
            now = time.monotonic()
            for obj in ready:
                what, worker = waitables[obj]
                if not any(worker is w for w in self.workers):
                    continue     # restarted while this batch was handled
                if what == "conn":
                    self._drain(worker, now)
                else:
                    self._collect_exit(worker, now)


RECEIVERS: Dict[str, Callable[..., None]] = {
    **dict.fromkeys(protocol.LEDGER_KINDS, WatchLoop._on_ledger),
    protocol.DRAIN: WatchLoop._on_drain,
    protocol.RETURNED: WatchLoop._on_returned,
    protocol.REPLICAS: WatchLoop._on_replicas,
    protocol.RAISED: WatchLoop._on_raised,
    protocol.FAULT: WatchLoop._on_fault,
}
