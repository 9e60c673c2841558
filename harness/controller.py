"""Parent side: launch a cluster, watch it, decide, clean up.

:class:`Cluster` is what the ``mwms_cluster`` fixture hands a test.  Each
``run`` reserves ports, builds every worker's ``TF_CONFIG``, starts the
workers through a :class:`~harness.launcher.Launcher`, and then watches them
in :class:`WatchLoop`: one ``wait()`` on all the workers' channels and process
sentinels, so a report or a death wakes it at once and a hang is declared
exactly ``timeout`` seconds after the last progress.  Whatever happens,
including Ctrl-C, every worker and all it started is killed before ``run``
returns.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shutil
import signal
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple


from multiprocess import connection

from . import faults as faults_module
from . import linux, progress, protocol, serialize, tfconfig
from .diagnosis import diagnose
from .errors import SerializationError, SettingError
from .ledger_view import LedgerView
from .launcher import Launcher, WorkerHandle, launcher_for, worker_environments
from .netns import Namespace, Switch, needs_proxy, resolve as resolve_network, switch_available
from .replicas import (compare as compare_replicas, compare_reference, parse_check_replicas,
                       parse_reference)
from .record import ALL_FINISHED, GRACE_EXPIRED, HANG, Event, RunObservation, WorkerObservation
from .result import RunResult, WorkerResult
from .scripts import check_import_time_env
from .settings import (DEFAULT_RESTART_ON, RunSettings, check_backend, parse_restart_on,
                       parse_restarts, parse_seconds)

# How long a finished worker gets to exit by itself once released, and how
# long a live one gets to write its faulthandler dump, before SIGKILL.
RELEASE_WAIT = 0.5
STACK_WAIT = 0.5
# How long the processes of a run get to be gone once SIGKILLed.
STOP_WAIT = 5.0
# Logs past this are kept as head + tail, so a worker that prints without end
# cannot swallow the parent's memory.
LOG_HEAD = 64 * 1024
LOG_TAIL = 1024 * 1024


def serialize_call(fn: Callable, args: Sequence, kwargs: Optional[dict]) -> bytes:
    if not callable(fn):
        raise SerializationError(f"mwms_cluster.run: fn must be callable, got {fn!r}")
    try:
        return serialize.dumps((fn, tuple(args), dict(kwargs or {})))
    except Exception as e:
        raise SerializationError(
            f"mwms_cluster.run: cannot serialize {getattr(fn, '__qualname__', fn)!r} or its "
            f"arguments for the worker processes ({type(e).__name__}: {e}). Objects such as "
            f"open files, locks, sockets or TensorFlow tensors made in the parent cannot be "
            f"sent; create them inside fn.") from e


def read_capped(path: str, head: int = LOG_HEAD, tail: int = LOG_TAIL) -> str:
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if size <= head + tail:
                data = f.read()
            else:
                first = f.read(head)
                f.seek(size - tail)
                data = (first + f"\n[... pytest-mwms: {size - head - tail} bytes of log cut; "
                        f"first {head} and last {tail} bytes kept ...]\n".encode() + f.read())
    except OSError:
        return ""
    return data.decode("utf-8", errors="backslashreplace")


@dataclasses.dataclass
class _TrackedWorker:
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
    replica_prints: Any = None

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
        return not self.finished and self.seen.exit_code is None

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

    def observation(self, stack: str) -> WorkerObservation:
        self.stop_reading()
        # Steps come from the map, phases from the pipe: one time line.
        events = sorted(self.events + self.ledger.step_events, key=lambda e: e.time)
        return dataclasses.replace(
            self.seen, events=tuple(events), stack=stack, functions=self.ledger.functions(),
            calls=self.ledger.call_records(), ledger_note="; ".join(self.ledger.notes),
            variables=self.replica_prints if isinstance(self.replica_prints, tuple) else ())


# run(on_return=...): a worker whose fn returned stays until the run is
# decided, or exits as a script does.
ON_RETURN = ("stay", "exit")

# How often a run with a progress callback reports to it.
PROGRESS_EVERY = 0.5


@dataclasses.dataclass(frozen=True)
class Progress:
    """What the watch loop sees now, for a live status line
    (``run(progress=...)``): ``elapsed`` seconds since the attempt started,
    ``idle`` seconds since the last progress (a hang is declared when it
    reaches ``timeout``), and per worker its last reported step (None: none
    yet) and its state: ``running``, ``returned``, ``raised`` or ``exited``."""

    attempt: int
    elapsed: float
    idle: float
    timeout: float
    steps: Tuple[Optional[int], ...]
    states: Tuple[str, ...]


class WatchLoop:
    """The watch loop of one run; see the module docstring.  With
    ``on_progress``, it also wakes every :data:`PROGRESS_EVERY` seconds to
    hand it a :class:`Progress`."""

    def __init__(self, workers: List[_TrackedWorker], settings: RunSettings, start: float,
                 on_progress: Optional[Callable[[Progress], None]] = None, attempt: int = 0,
                 switch=None):
        self.on_progress = on_progress
        self.switch = switch   # the run's harness.netns.Switch, for network faults
        self.attempt = attempt
        self.next_report = start + PROGRESS_EVERY if on_progress else math.inf
        self.workers = workers
        self.timeout = settings.timeout
        self.run_grace = settings.grace
        self.grace = min(settings.grace, settings.timeout)
        self.start = start
        self.last_progress = start
        self.first_failure: Optional[float] = None   # when a worker first raised or died
        # What faults asked the parent to do: (monotonic time, worker index, a
        # signal to send, or a network command for its link).
        self.signals: List[tuple] = []

    def _failure_at(self, now: float) -> None:
        """A worker raised or died: its peers' grace starts now, if it has not yet."""
        if self.first_failure is None:
            self.first_failure = now

    def _receive(self, tw: _TrackedWorker, msg: protocol.Message, now: float) -> None:
        t = now - self.start
        # What the worker recorded before it sent this comes first.
        tw.read_records()
        if tw.ledger.message(msg.kind, msg.data) or msg.kind == protocol.DRAIN:
            if msg.kind == protocol.LEDGER_OFF:
                tw.note(ledger=None)
        elif msg.kind == protocol.RETURNED:
            tw.return_payload = msg.data
            tw.note(returned=True, finish_time=t)
        elif msg.kind == protocol.REPLICAS:
            tw.replica_prints = msg.data
        elif msg.kind == protocol.RAISED:
            tw.note(error=msg.data, finish_time=t)
            self._failure_at(now)
        elif msg.kind == protocol.FAULT:
            fault = msg.data
            # The record keeps plain text: it must load without harness.faults.
            tw.events.append(Event(t, msg.kind, msg.step, repr(fault)))
            for delay, sig in fault.parent_signals(self.run_grace):
                self.signals.append((now + delay, tw.index, sig))
            for delay, command in fault.network_commands():
                self.signals.append((now + delay, tw.index, command))
        else:
            if msg.kind == protocol.STRATEGY_CREATING and msg.data is not None:
                # The TF_CONFIG the worker really had: fn may have set it.
                tw.note(tf_config=logical_config(self.switch, msg.data.get("tf_config")))
            data = None if msg.kind == protocol.STRATEGY_CREATING else msg.data
            tw.events.append(Event(t, msg.kind, msg.step, data))
        self.last_progress = now

    def _read_all_records(self) -> None:
        """Read every worker's progress map; its newest record is progress."""
        for tw in self.workers:
            tw.read_records()
            if tw.ledger.latest is not None and tw.ledger.latest > self.last_progress:
                self.last_progress = tw.ledger.latest

    def _drain(self, tw: _TrackedWorker, now: float) -> None:
        try:
            while tw.channel_open and tw.handle.conn.poll(0):
                self._receive(tw, tw.handle.conn.recv(), now)
        except (EOFError, OSError):
            tw.channel_open = False

    def _collect_exit(self, tw: _TrackedWorker, now: float) -> None:
        tw.handle.join(0)
        code = tw.handle.exitcode
        if code is None:
            return
        self._drain(tw, now)
        tw.note(exit_code=code, exit_time=now - self.start)
        tw.channel_open = False
        if not tw.finished:
            self._failure_at(now)
        self.last_progress = now

    def _signals_due(self, now: float) -> None:
        due = [r for r in self.signals if r[0] <= now]
        self.signals = [r for r in self.signals if r[0] > now]
        for when, index, sig in due:
            tw = self.workers[index]
            if isinstance(sig, str):     # a network command, for the worker's link
                if self.switch is not None:
                    self.switch.command(sig, index)
                continue
            if tw.seen.exit_code is not None:
                continue
            if sig == signal.SIGKILL:
                # A preempted worker that outlived its grace: the cluster
                # manager takes the machine away, with all that runs on it.
                tw.handle.kill_tree(tw.handle.descendants())
            elif sig != signal.SIGCONT or tw.handle.is_stopped():
                tw.handle.send_signal(sig)
            elif now - when < 1.0:  # it has not stopped itself yet; look again soon
                self.signals.append((now + 0.02, index, sig))

    def _report_progress(self, now: float) -> None:
        self._read_all_records()
        steps, states = [], []
        for tw in self.workers:
            stepped = tw.ledger.step_events
            steps.append(stepped[-1].step if stepped else None)
            states.append("raised" if tw.seen.error is not None else "returned"
                          if tw.seen.returned else "exited" if tw.seen.exit_code is not None
                          else "running")
        self.next_report = now + PROGRESS_EVERY
        self.on_progress(Progress(self.attempt, now - self.start, now - self.last_progress,
                                  self.timeout, tuple(steps), tuple(states)))

    def loop(self) -> str:
        while True:
            pending = [w for w in self.workers if w.pending]
            if not pending:
                return ALL_FINISHED
            now = time.monotonic()
            if now >= self.next_report:
                self._report_progress(now)
            hang_at = self.last_progress + self.timeout
            grace_at = (self.first_failure + self.grace if self.first_failure is not None
                        else math.inf)
            signal_at = min((r[0] for r in self.signals), default=math.inf)
            if now >= signal_at:
                self._signals_due(now)
                continue
            if now >= hang_at:
                # Steps and calls are in the progress maps, read only now:
                # the parent does not wake for each of them.
                self._read_all_records()
                hang_at = self.last_progress + self.timeout
            if now >= hang_at or now >= grace_at:
                return GRACE_EXPIRED if grace_at <= hang_at else HANG
            waitables: Dict[Any, tuple] = {}
            for w in self.workers:
                if w.channel_open and not w.finished:
                    waitables[w.handle.conn] = ("conn", w)
                if w.pending:
                    waitables[w.handle.sentinel] = ("sentinel", w)
            wake = min(hang_at, grace_at, signal_at, self.next_report)
            ready = connection.wait(list(waitables), timeout=max(0.0, wake - now))
            now = time.monotonic()
            for obj in ready:
                what, tw = waitables[obj]
                if what == "conn":
                    self._drain(tw, now)
                else:
                    self._collect_exit(tw, now)


class Cluster:
    """The ``mwms_cluster`` fixture: runs functions on an N-worker MWMS cluster.

    ``num_workers`` is N.  :meth:`run` calls ``fn(*args, **kwargs)`` in each
    of N fresh worker processes whose ``TF_CONFIG`` makes them one cluster,
    and returns a :class:`~harness.result.RunResult`.  Each call is a new
    cluster on new ports: one strategy per process is all TensorFlow allows.
    ``runs`` lists the results of every call so far.
    """

    def __init__(self, settings: RunSettings, launcher: Optional[Launcher] = None):
        self.settings = settings
        self.launcher = launcher or launcher_for(settings)
        self.runs: List[RunResult] = []

    @property
    def num_workers(self) -> int:
        return self.settings.workers

    def __repr__(self) -> str:
        s = self.settings
        return (f"Cluster(workers={s.workers}, timeout={s.timeout:g}, devices={s.devices!r}, "
                f"start_method={s.start_method!r}"
                + (f", backend={s.backend!r})" if s.backend != "local" else ")"))

    def run(self, fn: Callable, args: Sequence = (), kwargs: Optional[dict] = None, *,
            timeout: Optional[float] = None, faults: Sequence = (),
            grace: Optional[float] = None, sync_check: bool = False,
            env: Optional[dict] = None, ledger=True,
            step_fn: Optional[str] = None, restarts: Optional[int] = None,
            restart_on=DEFAULT_RESTART_ON, check_replicas=False, reference=False,
            on_return: str = "stay",
            progress: Optional[Callable[[Progress], None]] = None) -> RunResult:
        """Run ``fn(*args, **kwargs)`` on every worker and return the verdict.

        ``timeout`` overrides the hang timeout (seconds without progress);
        ``grace`` how long peers get once one worker has raised or died;
        ``faults`` a plan of :mod:`harness.faults` values, checked before any
        process starts.  ``sync_check=True`` makes every ``steps()`` boundary
        all-reduce the workers' step numbers, so a divergence fails at once
        with ``StepDesyncError`` naming the worker instead of hanging at the
        end (one extra tiny all-reduce per step).  ``env`` adds environment
        variables for the workers only (each worker starts from the parent's
        environment as it is at the call, whatever the start method).
        ``ledger`` is the collective ledger's level (see
        :mod:`harness.worker.ledger`): ``True`` or ``"calls"`` (the default:
        which call of which ``tf.function`` each worker is in, and the
        collectives it launches), ``"collectives"`` (also which collective
        is pending, at a fraction of a millisecond per collective), or
        ``False`` (none; step boundaries are still recorded).

        Steps: where ``fn`` reports none of its own (``context().steps()``,
        the Keras callback), each call of a ``tf.function`` that launches
        collectives is a step, so progress and step-keyed faults work on
        unmodified code; evaluation functions count too, unless ``step_fn``
        names the one function whose calls are steps (``"train_step"``; a
        Keras ``fit`` runs ``"train_function"`` or ``"one_step_on_iterator"``).
        This needs the ledger.

        Restarts: with ``restarts=K`` (default: the ``--mwms-restarts``
        option), a run that ends in one of the outcomes ``restart_on`` names
        (``"crash,fail"`` by default; add ``hang`` to restart hangs too) is
        started again, whole, up to K times, as a cluster manager would: the
        same ports (kept reserved, not probed again) and ``TF_CONFIG``, a
        fresh process per worker, once every process of the attempt before
        is gone.  ``fn`` reads ``context().attempt``; a fault acts in the
        attempt it names (``attempt=0`` by default).  The result is the last
        attempt's, with every attempt's in ``RunResult.attempts``.

        ``check_replicas=True`` (or a tolerance: a number used as ``atol``
        and ``rtol``; ``True`` is 1e-6, ``0`` bit for bit) fingerprints the
        strategy's mirrored variables on every worker when ``fn`` returns;
        a run whose workers disagree fails with ``ReplicaDivergence`` naming
        the first variable that differs (see :mod:`harness.replicas`).

        ``reference=True`` (or a tolerance, used as ``atol`` and ``rtol``;
        ``True`` is 1e-3, as Keras's own correctness tests use) runs ``fn``
        once more, when the run completed, on a single worker that stands in
        for the whole cluster, and compares its variables (and its return
        value) with worker 0's: a run that differs fails with
        ``ReferenceMismatch``.  ``fn`` must train on the same global batch
        there: it takes it from ``context().global_batch_size(per_worker)``
        (per-worker batch times N, in the reference too), not from the
        number of workers in ``TF_CONFIG``.  See :mod:`harness.replicas`.

        ``on_return``: what a worker does once ``fn`` returned.  ``"stay"``
        (the default) keeps it in the cluster until the run is decided, so a
        peer still in a collective waits for it (a hang the diagnosis
        explains); ``"exit"`` ends its process at once, as a training script
        ends: its peers then see it leave, as in a real cluster (TensorFlow
        fails a collective that needs it with ``UnavailableError``).

        Each run's workers share a network namespace of their own when the
        ``network`` setting (``--mwms-network``, the marker's ``network=``)
        allows it: see :mod:`harness.netns`.

        ``progress``, a callable, gets a :class:`Progress` every half second
        while the run lasts (``harness run``'s status line): each worker's
        step and state, and the seconds since the last progress.  It runs in
        the watch loop, so it must be quick.
        """
        if progress is not None and not callable(progress):
            raise ValueError(f"run(progress=...): a callable, got {progress!r}")
        if on_return not in ON_RETURN:
            raise ValueError(f"run(on_return=...): one of {', '.join(map(repr, ON_RETURN))}, "
                             f"got {on_return!r}")
        settings = self.settings.with_overrides(
            timeout=None if timeout is None else parse_seconds(timeout, "run(timeout=...)"),
            grace=None if grace is None else parse_seconds(grace, "run(grace=...)", allow_zero=True),
            restarts=None if restarts is None else parse_restarts(restarts, "run(restarts=...)"))
        n = settings.workers
        level = parse_ledger(ledger)
        if step_fn is not None and (not isinstance(step_fn, str) or not step_fn):
            raise ValueError(f"run(step_fn=...): the name of a tf.function, got {step_fn!r}")
        restart_after = parse_restart_on(restart_on)
        tolerance = parse_check_replicas(check_replicas)
        ref_tolerance = parse_reference(reference)
        plan = faults_module.validate(faults, n, settings.restarts)
        payload = serialize_call(fn, args, kwargs)
        envs = worker_environments(n, settings.devices)
        if env:
            bad = [k for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)]
            if bad or "TF_CONFIG" in env:
                raise ValueError("run(env=...): give str names and str values, and no TF_CONFIG "
                                 "(the harness sets it; use faults=[BadTFConfig(...)] to break it)")
            check_import_time_env(env, getattr(self.launcher, "start_method", None),
                                  "run(env=...)")
        check_backend(settings, "backend")
        isolate, why = (resolve_network(settings.network) if settings.backend == "local" else
                        (False, f"--mwms-backend={settings.backend}: the nodes' own network"))
        if settings.network == "isolated" and not isolate:
            raise SettingError(f"network='isolated': this machine cannot give a cluster a "
                               f"network namespace of its own ({why})")
        switched = faults_module.needs_network(plan)
        proxied = needs_proxy(command for fault in plan for _, command in fault.network_commands())
        if switched:
            able, why = switch_available() if isolate else (False, why)
            if not able:
                raise SettingError(f"network faults need a network namespace per worker, and "
                                   f"this run has none ({why})")
        launched = time.monotonic()
        attempts: List[RunResult] = []
        with self.launcher.place(n, settings.state_dir) as placement, \
                (Switch(n, placement.ports if proxied else None) if switched
                 else Namespace() if isolate
                 else contextlib.nullcontext()) as namespace:
            ports, spare = placement.ports, placement.spare
            # 0700, holds the logs; removed after the run.  It is also the
            # workers' TMPDIR (unless env= sets one), so what TensorFlow and fn
            # leave in the temp directory (autograph's generated files: one
            # per traced function per worker) goes with it.
            tmpdir = tempfile.mkdtemp(prefix="pytest-mwms-")
            envs = [{**e, "TMPDIR": tmpdir, **(env or {})} for e in envs]
            job = _Job(payload, settings, envs, bool(sync_check), level, step_fn, tolerance,
                       progress, fingerprint=tolerance is not None or ref_tolerance is not None,
                       exit_on_return=on_return == "exit",
                       netns=_worker_namespaces(namespace, n), switch=namespace if switched else None)
            try:
                for attempt in range(settings.restarts + 1):
                    # Every attempt on the ports reserved once: a restarted
                    # cluster is found at the same addresses, and a port of
                    # the last attempt in TIME_WAIT is not probed (the probe
                    # binds without SO_REUSEADDR; TensorFlow's server binds with it).
                    attempt_plan = faults_module.in_attempt(plan, attempt)
                    configs = faults_module.configs_under(attempt_plan, tfconfig.cluster_configs(
                        ports, hosts=namespace.hosts if switched else placement.hosts), spare)
                    if switched:
                        configs = namespace.route(configs)
                        namespace.reset()    # a new attempt: every link up, unthrottled
                    files = os.path.join(tmpdir, f"attempt-{attempt}")
                    os.mkdir(files, 0o700)
                    result = self._run(job, attempt, configs, attempt_plan, files)
                    attempts.append(result)
                    if result.verdict.outcome not in restart_after:
                        break
                if ref_tolerance is not None and attempts[-1].outcome == "completed":
                    attempts[-1] = self._against_reference(job, attempts[-1], files, tmpdir,
                                                           ports[0], ref_tolerance)
            finally:
                shutil.rmtree(tmpdir, ignore_errors=True)
        result = combine_attempts(attempts, plan, time.monotonic() - launched)
        self.runs.append(result)
        return result

    def run_script(self, path=None, argv: Sequence[str] = (), *, module: Optional[str] = None,
                   env: Optional[dict] = None, faults: Sequence = (),
                   timeout: Optional[float] = None, grace: Optional[float] = None,
                   ledger=True, restarts: Optional[int] = None,
                   restart_on=DEFAULT_RESTART_ON, check_replicas=False,
                   reference=False, on_return: str = "stay") -> RunResult:
        """Run a script on every worker as ``python path argv...`` would, or
        ``python -m module argv...`` with ``module=``; see :mod:`harness.scripts`.

        It completes when the script returns or exits with status 0, fails on
        an uncaught exception, and crashes on ``sys.exit(n)``, n != 0.  The
        path, module, ``argv`` (a sequence of str) and ``env`` are checked
        before any process starts; the other arguments are :meth:`run`'s.
        """
        from .scripts import script_main
        main = script_main(path, argv, module=module, env=env,
                           start_method=getattr(self.launcher, "start_method", None))
        return self.run(main, env=env, faults=faults, timeout=timeout, grace=grace,
                        ledger=ledger, restarts=restarts, restart_on=restart_on,
                        check_replicas=check_replicas, reference=reference,
                        on_return=on_return)

    def _against_reference(self, job: "_Job", result: RunResult, files: str, tmpdir: str,
                           port: int, tolerance: float) -> RunResult:
        """Run ``fn`` on one worker standing in for the cluster, on the
        run's first port (its processes are gone), and judge ``result``
        again with the comparison in its record."""
        n = job.settings.workers
        ref_files = os.path.join(tmpdir, "reference")
        os.mkdir(ref_files, 0o700)
        ref_job = dataclasses.replace(job, settings=job.settings.with_overrides(workers=1),
                                      envs=job.envs[:1], sync_check=False, fingerprint=True,
                                      reference_workers=n,
                                      netns=job.netns[:1] if job.netns else None)
        ref = self._run(ref_job, 0, tfconfig.cluster_configs([port]), (), ref_files)
        check = compare_reference(
            result.observation.workers[0], result.workers[0].return_value,
            lambda k: _load_value(os.path.join(files, "worker-0.npz"), k),
            ref.outcome, ref.diagnosis, ref.observation.workers[0] if ref.workers else None,
            ref.workers[0].return_value if ref.workers else None,
            lambda k: _load_value(os.path.join(ref_files, "worker-0.npz"), k), tolerance)
        obs = dataclasses.replace(result.observation, reference=check)
        verdict = diagnose(obs)
        # What the first verdict's text was followed by (faults that did not act) stays.
        text = verdict.text + result.diagnosis[len(result.verdict.text):]
        return dataclasses.replace(result, outcome=verdict.outcome, culprits=verdict.culprits,
                                   diagnosis=text, observation=obs, verdict=verdict)

    def _run(self, job: "_Job", attempt: int, configs, plan, files: str) -> RunResult:
        """One attempt: start the workers, watch them, stop them, decide."""
        settings, level = job.settings, job.ledger
        n = settings.workers
        specs = [protocol.WorkerSpec(
            index=i, num_workers=n, payload=job.payload, tf_config=configs[i], env=job.envs[i],
            log_path=os.path.join(files, f"worker-{i}.log"),
            stack_path=os.path.join(files, f"worker-{i}.stack"),
            faults=faults_module.for_worker(plan, i), sync_check=job.sync_check,
            progress_path=os.path.join(files, f"worker-{i}.progress"), ledger=level,
            step_function=job.step_fn, attempt=attempt,
            replicas_path=os.path.join(files, f"worker-{i}.npz") if job.fingerprint else "",
            reference_workers=job.reference_workers, exit_on_return=job.exit_on_return,
            netns=job.netns[i] if job.netns else None)
            for i in range(n)]
        readers = []
        for spec in specs:
            progress.create(spec.progress_path)
            readers.append(progress.Reader(spec.progress_path))
        launched = start = time.monotonic()
        handles: List[WorkerHandle] = []
        tracked: List[_TrackedWorker] = []
        ended_by = HANG
        try:
            handles = self.launcher.start(specs)
            # The clock of the run starts once the workers exist: a forkserver
            # still importing TensorFlow (the first run of a session) is no
            # hang of theirs.
            start = time.monotonic()
            tracked = [_TrackedWorker(h, WorkerObservation(index=h.index,
                                                           tf_config=logical_config(
                                                               job.switch, configs[h.index]),
                                                           ledger=level),
                                      LedgerView(start), readers[h.index])
                       for h in handles]
            ended_by = WatchLoop(tracked, settings, start, job.progress, attempt,
                                 job.switch).loop()
            # The run's clock (events, hang detection) and the user's (the
            # whole call, a cold forkserver's wait included).
            duration = time.monotonic() - start
            total = time.monotonic() - launched
            for tw in tracked:
                tw.stop_reading()
            if ended_by != ALL_FINISHED:
                _dump_stacks(tracked, specs)
        finally:
            _stop(tracked, handles, start)
        obs = RunObservation(
            num_workers=n, timeout=settings.timeout, grace=settings.grace, ended_by=ended_by,
            duration=duration, workers=tuple(
                tw.observation(stack=read_capped(specs[tw.index].stack_path)) for tw in tracked),
            replicas=_check_replicas(tracked, specs, job.tolerance))
        for reader in readers:
            reader.close()
        verdict = diagnose(obs)
        never, ended_first = faults_module.not_acted(plan, obs.workers)
        outcome, text = verdict.outcome, verdict.text
        if never:
            # A run that was asked for a fault and did not get it is not a
            # pass: the test would believe its job survives what never happened.
            if outcome in ("completed", "hang"):
                outcome = "failed"
            text = "\n".join([f"FAILED: {f!r} never acted: {why}" for f, why in never]
                              + [text])
        text += "".join(f"\nnot acted: {f!r}: {why}" for f, why in ended_first)
        workers = tuple(
            WorkerResult(index=w.index, return_value=_load_return(tw), exception=w.error,
                         exit_code=w.exit_code, log=read_capped(specs[w.index].log_path),
                         last_step=w.last_step, stack=w.stack, observation=w)
            for w, tw in zip(obs.workers, tracked))
        return RunResult(outcome=outcome, workers=workers, culprits=tuple(verdict.culprits),
                         diagnosis=text, duration=total, observation=obs, verdict=verdict,
                         faults_never_acted=tuple((repr(f), why) for f, why in never),
                         attempt=attempt)


@dataclasses.dataclass(frozen=True)
class _Job:
    """What every attempt of one ``run`` call shares."""

    payload: bytes
    settings: RunSettings
    envs: List[dict]
    sync_check: bool
    ledger: Optional[str]
    step_fn: Optional[str]
    tolerance: Optional[float]   # the replica check's; None when it is off
    progress: Optional[Callable[[Progress], None]] = None
    fingerprint: bool = False    # the workers fingerprint their variables
    reference_workers: int = 0   # the single-worker reference's N (0: not one)
    exit_on_return: bool = False
    netns: Optional[tuple] = None   # per worker, the namespaces it joins (harness.netns)
    switch: Any = None              # the run's Switch, when faults act on the network


def logical_config(switch, config):
    """A worker's ``TF_CONFIG`` with the proxy's addresses mapped back (when
    the run has a :class:`Switch`): the harness's plumbing must never read
    as a wrong port."""
    return switch.logical(config) if switch is not None else config


def _check_replicas(tracked: List[_TrackedWorker], specs, tolerance: Optional[float]):
    """The replica check's finding, when it is on and every worker returned."""
    if tolerance is None or not tracked or not all(
            tw.seen.returned and tw.seen.error is None for tw in tracked):
        return None
    prints, notes = {}, []
    for tw in tracked:
        if isinstance(tw.replica_prints, tuple):
            prints[tw.index] = tw.replica_prints
        else:
            notes.append(f"worker {tw.index}: {tw.replica_prints or 'sent no fingerprints'}")
    files: Dict[int, Any] = {}

    def load(worker: int, number: int):
        import numpy as np
        if worker not in files:
            files[worker] = np.load(specs[worker].replicas_path)
        return files[worker][f"v{number}"]

    try:
        return compare_replicas(prints, load, tolerance, notes)
    finally:
        for f in files.values():
            f.close()


def combine_attempts(attempts: Sequence[RunResult], plan, total: float) -> RunResult:
    """The result of a run from its attempts' results: the last attempt's,
    with every attempt kept.  A fault planned for an attempt that never ran
    never acted, and a run with such a fault fails, as one whose worker
    never reached it does."""
    last = attempts[-1]
    unreached = [(repr(f), f"attempt {f.attempt} never ran: the run ended after attempt "
                           f"{len(attempts) - 1} ({last.outcome})")
                 for f in plan if f.attempt >= len(attempts)]
    never = tuple(x for a in attempts for x in a.faults_never_acted) + tuple(unreached)
    outcome, text = last.outcome, last.diagnosis
    if unreached:
        if outcome in ("completed", "hang"):
            outcome = "failed"
        text = "\n".join([f"FAILED: {f} never acted: {why}" for f, why in unreached] + [text])
    if len(attempts) > 1:
        story = ", ".join(f"attempt {a.attempt} {a.outcome.upper()}" for a in attempts)
        parts = [f"{outcome.upper()} after {len(attempts) - 1} restart"
                 f"{'s' if len(attempts) > 2 else ''}: {story}",
                 f"--- attempt {last.attempt} (last) ---", text]
        for a in reversed(attempts[:-1]):
            parts += [f"--- attempt {a.attempt} ---", a.diagnosis]
        text = "\n".join(parts)
    return dataclasses.replace(last, outcome=outcome, diagnosis=text, duration=total,
                               faults_never_acted=never, attempts=tuple(attempts))


LEDGER_LEVELS = ("calls", "collectives")


def parse_ledger(value) -> Optional[str]:
    """``run(ledger=...)`` as a level name, or None for off."""
    if value is True:
        return "calls"
    if value is False or value is None:
        return None
    if value in LEDGER_LEVELS:
        return value
    raise ValueError(f"run(ledger=...): {value!r} is not one of True, False, "
                     f"{', '.join(map(repr, LEDGER_LEVELS))}")


def _worker_namespaces(namespace, n: int) -> Optional[tuple]:
    """Per worker, the (user, network) namespaces it joins: one shared by
    all (:class:`Namespace`), one each (:class:`Switch`), or None (the host's)."""
    if namespace is None:
        return None
    if isinstance(namespace, Switch):
        return tuple(namespace.paths(i) for i in range(n))
    return (namespace.paths,) * n


def _load_value(path: str, number: int):
    import numpy as np
    with np.load(path) as values:
        return values[f"v{number}"]


def _load_return(tw: _TrackedWorker) -> Any:
    if not tw.seen.returned or tw.return_payload is None:
        return None
    return serialize.loads(tw.return_payload)


def _dump_stacks(tracked: List[_TrackedWorker], specs) -> None:
    """Ask every live, unfinished worker for its Python stacks (faulthandler)."""
    asked = []
    for tw in tracked:
        if not tw.pending:
            continue
        if tw.handle.is_stopped():
            tw.note(stopped=True)
            continue
        if not any(e.kind == protocol.STARTED for e in tw.events):
            # Its faulthandler may not be armed yet, and the signal's default
            # action would kill it, to be read as a crash.
            continue
        if tw.handle.send_signal(protocol.DUMP_SIGNAL):
            asked.append(specs[tw.index].stack_path)
    deadline = time.monotonic() + STACK_WAIT
    sizes: Dict[str, int] = {}
    while asked and time.monotonic() < deadline:
        time.sleep(0.02)
        now_sizes = {p: _size(p) for p in asked}
        # faulthandler writes the whole dump from its signal handler; a file
        # that has content and did not grow over one poll is complete.
        if all(now_sizes[p] > 0 and now_sizes[p] == sizes.get(p) for p in asked):
            break
        sizes = now_sizes


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _stop(tracked: List[_TrackedWorker], handles: List[WorkerHandle], start: float) -> None:
    """Release finished workers, SIGKILL the rest with all they started."""
    by_index = {tw.index: tw for tw in tracked}

    def released(h: WorkerHandle) -> bool:
        tw = by_index.get(h.index)
        return tw is not None and tw.finished and tw.seen.exit_code is None

    # Listed while the workers live: a released worker's children (a process
    # in a session of its own escapes the group kill) are found only now.
    descendants = {h.index: h.descendants() for h in handles}

    def kill(h: WorkerHandle) -> None:
        # Decide before the kill: once SIGKILL is sent the exit status can
        # arrive at once, and a worker we killed must not read as a crash.
        h.join(0)
        alive = h.exitcode is None
        h.kill_tree(descendants[h.index])
        tw = by_index.get(h.index)
        if alive and tw is not None:
            tw.note(killed_by_harness=True)

    # The unfinished first: a released worker exits and closes its
    # connections, and a peer blocked on it would then fail or die of it
    # after the verdict's moment (seen on Ray, where each kill is a call).
    for h in handles:
        if not released(h):
            kill(h)
    for h in handles:
        if released(h):
            try:
                h.conn.send(protocol.RELEASE)
            except (OSError, EOFError):
                pass
    deadline = time.monotonic() + RELEASE_WAIT
    for h in handles:
        if released(h):
            h.join(max(0.0, deadline - time.monotonic()))
            kill(h)
    for h in handles:
        h.join(5)
        tw = by_index.get(h.index)
        if tw is not None and tw.seen.exit_code is None:
            tw.note(exit_code=h.exitcode, exit_time=time.monotonic() - start)
        h.close()
    # Gone, not only signalled: the next attempt of a restarted run binds
    # the same ports, and a run's end means no process of it is left.  A
    # zombie holds nothing and counts as gone (psutil.wait_procs would wait
    # for whoever adopted it to reap it: seconds, for a worker's reaper).
    linux.wait_gone([p.pid for known in descendants.values() for p in known], STOP_WAIT)
