"""Parent side: launch a cluster, watch it, decide, clean up.

:class:`Cluster` is what the ``mwms_cluster`` fixture hands a test.  Each
``run`` reserves ports, builds every worker's ``TF_CONFIG``, starts the
workers through a :class:`~harness.launcher.Launcher`, and then watches them
in :class:`_Watch`: one ``wait()`` on all the workers' channels and process
sentinels, so a report or a death wakes it at once and a hang is declared
exactly ``timeout`` seconds after the last progress.  Whatever happens,
including Ctrl-C, every worker and all it started is killed before ``run``
returns.
"""
from __future__ import annotations

import dataclasses
import math
import os
import shutil
import signal
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence


from multiprocess import connection

from . import faults as faults_module
from . import protocol, serialize, tfconfig
from .diagnosis import diagnose
from .launcher import Launcher, LocalLauncher, WorkerHandle
from .ports import reserve_ports
from .record import ALL_FINISHED, GRACE_EXPIRED, HANG, Event, RunObservation, WorkerObservation
from .result import RunResult, WorkerResult
from .settings import RunSettings, gpu_assignment, parse_seconds, visible_gpus
from .worker import DUMP_SIGNAL

# How long a finished worker gets to exit by itself once released, and how
# long a live one gets to write its faulthandler dump, before SIGKILL.
RELEASE_WAIT = 0.5
STACK_WAIT = 0.5
# Logs past this are kept as head + tail, so a worker that prints without end
# cannot swallow the parent's memory.
LOG_HEAD = 64 * 1024
LOG_TAIL = 1024 * 1024


class SerializationError(TypeError):
    """``fn``, its arguments or its result cannot cross a process boundary."""


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
class _WorkerState:
    handle: WorkerHandle
    tf_config: Optional[dict]
    events: List[Event] = dataclasses.field(default_factory=list)
    returned: bool = False
    return_payload: Optional[bytes] = None
    error: Optional[protocol.WorkerError] = None
    finish_time: Optional[float] = None
    exit_code: Optional[int] = None
    exit_time: Optional[float] = None
    channel_open: bool = True
    killed_by_harness: bool = False
    stopped: bool = False

    @property
    def finished(self) -> bool:
        return self.returned or self.error is not None

    @property
    def pending(self) -> bool:
        return not self.finished and self.exit_code is None


class _Watch:
    """The watch loop of one run; see the module docstring."""

    def __init__(self, states: List[_WorkerState], settings: RunSettings, start: float):
        self.states = states
        self.timeout = settings.timeout
        self.grace = min(settings.grace, settings.timeout)
        self.start = start
        self.last_progress = start
        self.trouble_at: Optional[float] = None
        self.resumes: List[tuple] = []  # (monotonic time, worker index)

    def _trouble(self, now: float) -> None:
        if self.trouble_at is None:
            self.trouble_at = now

    def _receive(self, st: _WorkerState, msg: protocol.Message, now: float) -> None:
        t = now - self.start
        if msg.kind == protocol.RETURNED:
            st.returned, st.return_payload, st.finish_time = True, msg.data, t
        elif msg.kind == protocol.RAISED:
            st.error, st.finish_time = msg.data, t
            self._trouble(now)
        elif msg.kind == protocol.FAULT:
            fault = msg.data
            # The record keeps plain text: it must load without harness.faults.
            st.events.append(Event(t, msg.kind, msg.step, repr(fault)))
            if isinstance(fault, faults_module.Pause) and fault.seconds is not None:
                self.resumes.append((now + fault.seconds, st.handle.index))
        else:
            st.events.append(Event(t, msg.kind, msg.step, msg.data))
        self.last_progress = now

    def _drain(self, st: _WorkerState, now: float) -> None:
        try:
            while st.channel_open and st.handle.conn.poll(0):
                self._receive(st, st.handle.conn.recv(), now)
        except (EOFError, OSError):
            st.channel_open = False

    def _reap(self, st: _WorkerState, now: float) -> None:
        st.handle.join(0)
        code = st.handle.exitcode
        if code is None:
            return
        self._drain(st, now)
        st.exit_code, st.exit_time = code, now - self.start
        st.channel_open = False
        if not st.finished:
            self._trouble(now)
        self.last_progress = now

    def _resume_due(self, now: float) -> None:
        due = [r for r in self.resumes if r[0] <= now]
        self.resumes = [r for r in self.resumes if r[0] > now]
        for when, index in due:
            st = self.states[index]
            if st.exit_code is not None:
                continue
            if st.handle.is_stopped():
                st.handle.send_signal(signal.SIGCONT)
            elif now - when < 1.0:  # it has not stopped itself yet; look again soon
                self.resumes.append((now + 0.02, index))

    def loop(self) -> str:
        while True:
            pending = [s for s in self.states if s.pending]
            if not pending:
                return ALL_FINISHED
            now = time.monotonic()
            hang_at = self.last_progress + self.timeout
            grace_at = self.trouble_at + self.grace if self.trouble_at is not None else math.inf
            resume_at = min((r[0] for r in self.resumes), default=math.inf)
            if now >= resume_at:
                self._resume_due(now)
                continue
            if now >= hang_at or now >= grace_at:
                return GRACE_EXPIRED if grace_at <= hang_at else HANG
            waitables: Dict[Any, tuple] = {}
            for s in self.states:
                if s.channel_open and not s.finished:
                    waitables[s.handle.conn] = ("conn", s)
                if s.pending:
                    waitables[s.handle.sentinel] = ("sentinel", s)
            ready = connection.wait(list(waitables), timeout=min(hang_at, grace_at, resume_at) - now)
            now = time.monotonic()
            for obj in ready:
                what, st = waitables[obj]
                if what == "conn":
                    self._drain(st, now)
                else:
                    self._reap(st, now)


class Cluster:
    """The ``mwms_cluster`` fixture: runs functions on an N-worker MWMS cluster.

    ``num_workers`` is N.  ``run(fn, args, kwargs, timeout=, faults=, grace=)``
    calls ``fn(*args, **kwargs)`` in each of N fresh worker processes whose
    ``TF_CONFIG`` makes them one cluster, and returns a :class:`RunResult`.
    Each call is a new cluster on new ports: one strategy per process is all
    TensorFlow allows.
    """

    def __init__(self, settings: RunSettings, launcher: Optional[Launcher] = None):
        self.settings = settings
        self.launcher = launcher or LocalLauncher(settings.start_method)
        self.runs: List[RunResult] = []

    @property
    def num_workers(self) -> int:
        return self.settings.workers

    def __repr__(self) -> str:
        s = self.settings
        return (f"Cluster(workers={s.workers}, timeout={s.timeout:g}, devices={s.devices!r}, "
                f"start_method={s.start_method!r})")

    def _worker_envs(self) -> List[dict]:
        base = dict(os.environ)
        base.pop("TF_CONFIG", None)
        n = self.settings.workers
        if self.settings.devices == "gpu":
            shares = gpu_assignment(n, visible_gpus())
            return [{**base, "CUDA_VISIBLE_DEVICES": share} for share in shares]
        return [{**base, "CUDA_VISIBLE_DEVICES": "-1"} for _ in range(n)]

    def run(self, fn: Callable, args: Sequence = (), kwargs: Optional[dict] = None, *,
            timeout: Optional[float] = None, faults: Sequence = (),
            grace: Optional[float] = None, sync_check: bool = False,
            env: Optional[dict] = None) -> RunResult:
        """Run ``fn`` on every worker; see the class docstring.

        ``timeout`` overrides the hang timeout (seconds without progress);
        ``grace`` how long peers get once one worker has raised or died;
        ``faults`` a plan of :mod:`harness.faults` values, checked before any
        process starts.  ``sync_check=True`` makes every ``steps()`` boundary
        all-reduce the workers' step numbers, so a divergence fails at once
        with ``StepDesyncError`` naming the worker instead of hanging at the
        end (one extra tiny all-reduce per step).  ``env`` adds environment
        variables for the workers only (each worker starts from the parent's
        environment as it is at the call, whatever the start method).
        """
        settings = self.settings.with_overrides(
            timeout=None if timeout is None else parse_seconds(timeout, "run(timeout=...)"),
            grace=None if grace is None else parse_seconds(grace, "run(grace=...)", allow_zero=True))
        n = settings.workers
        plan = faults_module.validate(faults, n)
        payload = serialize_call(fn, args, kwargs)
        envs = self._worker_envs()
        if env:
            bad = [k for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)]
            if bad or "TF_CONFIG" in env:
                raise ValueError("run(env=...): give str names and str values, and no TF_CONFIG "
                                 "(the harness sets it; use faults=[BadTFConfig(...)] to break it)")
            envs = [{**e, **env} for e in envs]
        with reserve_ports(n + 1) as reservation:
            ports, spare = reservation.ports[:n], reservation.ports[n]
            configs: List[Optional[dict]] = tfconfig.cluster_configs(ports)
            for f in plan:
                if isinstance(f, faults_module.BadTFConfig):
                    configs = tfconfig.apply_bad_config(configs, f.worker, f.kind, spare)
            tmpdir = tempfile.mkdtemp(prefix="pytest-mwms-")
            try:
                result = self._run(payload, settings, configs, envs, plan, tmpdir,
                                   bool(sync_check))
            finally:
                shutil.rmtree(tmpdir, ignore_errors=True)
        self.runs.append(result)
        return result

    def _run(self, payload, settings, configs, envs, plan, tmpdir, sync_check) -> RunResult:
        n = settings.workers
        specs = [protocol.WorkerSpec(
            index=i, num_workers=n, payload=payload, tf_config=configs[i], env=envs[i],
            log_path=os.path.join(tmpdir, f"worker-{i}.log"),
            stack_path=os.path.join(tmpdir, f"worker-{i}.stack"),
            faults=faults_module.for_worker(plan, i), sync_check=sync_check)
            for i in range(n)]
        start = time.monotonic()
        handles: List[WorkerHandle] = []
        states: List[_WorkerState] = []
        ended_by = HANG
        try:
            handles = self.launcher.start(specs)
            states = [_WorkerState(h, configs[h.index]) for h in handles]
            ended_by = _Watch(states, settings, start).loop()
            duration = time.monotonic() - start
            if ended_by != ALL_FINISHED:
                _dump_stacks(states, specs)
        finally:
            _stop(states, handles, start)
        obs = RunObservation(
            num_workers=n, timeout=settings.timeout, grace=settings.grace, ended_by=ended_by,
            duration=duration, workers=tuple(
                WorkerObservation(
                    index=s.handle.index, tf_config=s.tf_config, events=tuple(s.events),
                    returned=s.returned, error=s.error, finish_time=s.finish_time,
                    exit_code=s.exit_code, exit_time=s.exit_time,
                    killed_by_harness=s.killed_by_harness, stopped=s.stopped,
                    stack=read_capped(specs[s.handle.index].stack_path))
                for s in states))
        verdict = diagnose(obs)
        workers = tuple(
            WorkerResult(index=w.index, return_value=_load_return(s), exception=w.error,
                         exit_code=w.exit_code, log=read_capped(specs[w.index].log_path),
                         last_step=w.last_step, stack=w.stack, observation=w)
            for w, s in zip(obs.workers, states))
        return RunResult(outcome=verdict.outcome, workers=workers, culprits=tuple(verdict.culprits),
                         diagnosis=verdict.text, duration=duration, observation=obs,
                         verdict=verdict)


def _load_return(st: _WorkerState) -> Any:
    if not st.returned or st.return_payload is None:
        return None
    return serialize.loads(st.return_payload)


def _dump_stacks(states: List[_WorkerState], specs) -> None:
    """Ask every live, unfinished worker for its Python stacks (faulthandler)."""
    asked = []
    for st in states:
        if not st.pending:
            continue
        if st.handle.is_stopped():
            st.stopped = True
            continue
        if st.handle.send_signal(DUMP_SIGNAL):
            asked.append(specs[st.handle.index].stack_path)
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


def _stop(states: List[_WorkerState], handles: List[WorkerHandle], start: float) -> None:
    """Release finished workers, SIGKILL the rest with all they started."""
    by_index = {s.handle.index: s for s in states}
    # Listed while the workers live: a released worker's children (a process
    # in a session of its own escapes the group kill) are found only now.
    descendants = {h.index: h.descendants() for h in handles}
    for h in handles:
        st = by_index.get(h.index)
        if st is not None and st.finished and st.exit_code is None:
            try:
                h.conn.send(protocol.RELEASE)
            except (OSError, EOFError):
                pass
    deadline = time.monotonic() + RELEASE_WAIT
    for h in handles:
        st = by_index.get(h.index)
        if st is not None and st.finished and st.exit_code is None:
            h.join(max(0.0, deadline - time.monotonic()))
    for h in handles:
        st = by_index.get(h.index)
        # Decide before the kill: once SIGKILL is sent the exit status can
        # arrive at once, and a worker we killed must not read as a crash.
        h.join(0)
        alive = h.exitcode is None
        h.kill_tree(descendants[h.index])
        if alive and st is not None:
            st.killed_by_harness = True
    for h in handles:
        h.join(5)
        st = by_index.get(h.index)
        if st is not None and st.exit_code is None:
            st.exit_code = h.exitcode
            st.exit_time = time.monotonic() - start
        h.close()
