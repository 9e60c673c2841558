"""The local backend: workers are processes of this machine.

:class:`LocalLauncher` has two start methods:

``forkserver`` (default for CPU)
    A server process imports TensorFlow once (:mod:`harness.worker.preload`); each
    worker is a ``fork()`` of it.  After the first run a 2-worker cluster
    starts in a fraction of a second.  The server lives as long as the
    pytest process and exits when pytest does, even on SIGKILL (its
    "alive" pipe closes).
``spawn``
    A fresh interpreter per worker, which imports TensorFlow itself: 5-10 s
    per run, but nothing is shared.  Used for GPUs, where forking a process
    that has loaded CUDA libraries is not shown safe.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
import warnings
import weakref
from typing import Dict, List, Optional, Sequence

import multiprocess
import psutil

from harness import validators
from harness.core import interrupts, protocol
from harness.core.protocol import WorkerSpec
from harness.errors import PreloadWarning, SettingError
from harness.launch import memory, scratch
from harness.launch.base import Backend, Launcher

START_METHODS = validators.START_METHODS
# How many workers start at once (a thread each): more only queue at the
# forkserver, which forks one at a time.
MAX_STARTING = 16
# How long an interrupted start waits for the starts under way to finish (so
# that their processes are killed rather than left behind), and, for those
# still waiting on a forkserver busy importing (the session's first run),
# how long they get to fail once the harness ends the server.
START_UNDO_WAIT = 2.0
SERVER_GONE_WAIT = 3.0


def kill_tree(pid: int, known: Sequence[psutil.Process] = ()) -> None:
    """SIGKILL process ``pid``, its process group and every descendant.

    Descendants are listed before the kill (and ``known`` ones, listed
    earlier, are added): once ``pid`` is dead its children are re-parented
    and can no longer be found from it.  The process group catches those the
    listing raced with; a worker's reaper (see :mod:`harness.worker`) catches
    the rest.  The group kill only applies when ``pid`` leads its group, as
    every worker does.
    """
    try:
        descendants = list(known) + psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        descendants = list(known)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)   # no such group unless pid leads one
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    for child in descendants:
        with contextlib.suppress(psutil.Error):
            child.kill()


class ProcessHandle:
    """One worker process of this machine: a :class:`~harness.launch.base.WorkerHandle`."""

    def __init__(self, index: int, process, conn):
        self.index = index
        self.process = process
        self.conn = conn  # parent's end of the duplex channel

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def sentinel(self):
        return self.process.sentinel

    @property
    def exitcode(self) -> Optional[int]:
        return self.process.exitcode

    def join(self, timeout: Optional[float] = None) -> None:
        self.process.join(timeout)

    def send_signal(self, sig: int) -> bool:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, sig)
            return True
        return False

    def is_stopped(self) -> bool:
        """True when the worker is stopped by SIGSTOP (it cannot dump a stack)."""
        try:
            return psutil.Process(self.pid).status() == psutil.STATUS_STOPPED
        except psutil.Error:
            return False

    def descendants(self) -> List[psutil.Process]:
        """The worker's live descendants (it is a child subreaper, so orphans
        of a double fork are among them)."""
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            return []

    def kill_tree(self, known: Sequence[psutil.Process] = ()) -> None:
        """SIGKILL the worker with all it started; see :func:`kill_tree`."""
        kill_tree(self.pid, known)

    def memory_bytes(self) -> Optional[int]:
        """The worker's resident set now (:mod:`harness.launch.memory`)."""
        return memory.READ(self.pid)

    def close(self) -> None:
        _live.discard(self)
        with contextlib.suppress(OSError):
            self.conn.close()
        with contextlib.suppress(Exception):
            self.process.close()


# Every started worker not yet closed.  ``multiprocess`` joins its live
# children when the interpreter exits; a worker that an interrupt left
# running would keep that join, and so the exit, waiting for ever.  Killed
# here first (atexit runs the handlers registered last first, and this one
# is registered after ``multiprocess``'s).
_live: weakref.WeakSet[ProcessHandle] = weakref.WeakSet()
_live_lock = threading.Lock()
_kill_at_exit_registered = False


def _kill_live_at_exit() -> None:
    for h in list(_live):
        with contextlib.suppress(Exception):
            h.kill_tree()
            h.join(5)


def _remember(h: ProcessHandle) -> ProcessHandle:
    global _kill_at_exit_registered
    with _live_lock:
        if not _kill_at_exit_registered:
            atexit.register(_kill_live_at_exit)
            _kill_at_exit_registered = True
    _live.add(h)
    return h


_forkserver_lock = threading.Lock()
# What the forkserver was asked to import, and where it reports what failed:
# one server per pytest process, so one of each.
_preload_report: Optional[str] = None
_preload_warned = False


def _forkserver_context(preload: Sequence[str] = ()):
    global _preload_report
    ctx = multiprocess.get_context("forkserver")
    with _forkserver_lock:
        if _preload_report is None:
            # Read by harness.worker.preload in the server, which inherits
            # this process's environment when it starts.
            _preload_report = os.path.join(scratch.scratch_dir(), "preload-report")
            with scratch.named_if_full("make the forkserver's preload report"):
                open(_preload_report, "w").close()
            os.environ["MWMS_PRELOAD_REPORT"] = _preload_report
            os.environ["MWMS_PRELOAD"] = ",".join(preload)
        ctx.set_forkserver_preload(["harness.worker.preload"])
    _sweep_multiprocess_temp_dir()
    return ctx


# Read by TensorFlow when it is imported, so it would decide for every worker
# of the session which Keras ``tensorflow.keras`` is: the server starts
# without it, and each run's workers choose with their own environment.
_KERAS_CHOICE = "TF_USE_LEGACY_KERAS"


def _ensure_forkserver() -> None:
    from multiprocess import forkserver
    with _forkserver_lock:
        saved = os.environ.pop(_KERAS_CHOICE, None)
        try:
            forkserver.ensure_running()
        finally:
            if saved is not None:
                os.environ[_KERAS_CHOICE] = saved


def _sweep_multiprocess_temp_dir() -> None:
    """``multiprocess``'s temp directory (the forkserver's socket) goes with
    the scratch directory even when this process is killed; its own
    clean-up runs only at a normal exit."""
    from multiprocess import util
    scratch.remove_mp_temp_dir_at_end(util)   # made once per process


def _warn_about_preload() -> None:
    """Once the server is up: warn of each module it could not preload."""
    global _preload_warned
    if _preload_warned or _preload_report is None:
        return
    try:
        with open(_preload_report) as f:
            problems = [line for line in f.read().splitlines() if line]
    except OSError:
        return
    _preload_warned = True
    for problem in problems:
        warnings.warn(PreloadWarning(f"mwms_preload: {problem}; the forkserver runs without "
                                     f"it (each worker imports it as usual)"), stacklevel=3)


def forkserver_pid() -> Optional[int]:
    """The pid of this process's forkserver, if one is running."""
    from multiprocess import forkserver
    return forkserver._forkserver._forkserver_pid


class LocalLauncher(Launcher):
    """``preload``: modules the forkserver imports once before it forks
    workers (``mwms_preload``), besides TensorFlow, pytest and hypothesis."""

    def __init__(self, start_method: str = "forkserver", preload: Sequence[str] = ()):
        if start_method not in START_METHODS:
            raise SettingError(f"start_method: one of {', '.join(START_METHODS)}, got {start_method!r}")
        self.start_method = start_method
        self.preload = tuple(preload)

    def _context(self):
        if self.start_method == "forkserver":
            return _forkserver_context(self.preload)
        return multiprocess.get_context("spawn")

    def prewarm(self) -> None:
        """Start the forkserver (and its TensorFlow import) in the background.

        ``ensure_running`` only spawns the server; it does not wait for the
        import, so calling it at collection time overlaps TensorFlow's
        import with the rest of pytest's start-up.
        """
        if self.start_method == "forkserver":
            self._context()
            _ensure_forkserver()

    def start(self, specs: Sequence[WorkerSpec]) -> List[ProcessHandle]:
        """Start a process per spec, all at once: each start is a round trip
        to the forkserver (or a new interpreter), and one at a time each
        waits behind the workers started before it on a busy machine."""
        ctx = self._context()
        if self.start_method == "forkserver":
            _ensure_forkserver()
        starts = Starts(ctx, specs)
        try:
            handles = starts.run()
        except BaseException:
            # Whatever stopped this one (a failed start, Ctrl-C), every
            # process that did start is undone, and a further Ctrl-C waits
            # for that: cut short, it would leave a worker running.
            with interrupts.deferred():
                starts.cancel(end_server=self.start_method == "forkserver")
            raise
        if self.start_method == "forkserver":
            _warn_about_preload()
        return handles


class Starts:
    """One :meth:`LocalLauncher.start` call's starts: a few threads take the
    specs in turn.  Each process started is kept for the caller or, once the
    call is abandoned (:meth:`cancel`), killed: by the caller when it had
    started by then, else by the thread that started it.  Each process has
    one killer, whatever the moment of the interrupt."""

    def __init__(self, ctx, specs: Sequence[WorkerSpec]):
        self.ctx = ctx
        self.specs = list(specs)
        self.lock = threading.Lock()
        self.taken = 0
        self.cancelled = False
        self.handles: Dict[int, ProcessHandle] = {}   # by position in specs
        self.errors: List[BaseException] = []
        self.threads = [threading.Thread(target=self._take, name=f"mwms-start-{i}")
                        for i in range(min(len(self.specs), MAX_STARTING))]

    def _take(self) -> None:
        while True:
            with self.lock:
                if self.cancelled or self.errors or self.taken == len(self.specs):
                    return
                position, self.taken = self.taken, self.taken + 1
            try:
                handle = _start_one(self.ctx, self.specs[position])
            except BaseException as e:
                with self.lock:
                    self.errors.append(e)
                return
            with self.lock:
                kept = not self.cancelled
                if kept:
                    self.handles[position] = handle
            if not kept:
                undo([handle])

    def run(self) -> List[ProcessHandle]:
        """Every spec's handle, in order; the first failed start's error."""
        for thread in self.threads:
            thread.start()
        for thread in self.threads:
            thread.join()
        if self.errors:
            self.cancel(end_server=False)
            raise self.errors[0]
        return [self.handles[i] for i in range(len(self.specs))]

    def cancel(self, end_server: bool) -> None:
        """Abandon the call: no spec is taken any more, and the starts under
        way get :data:`START_UNDO_WAIT`; then (``end_server``) the forkserver
        they still wait on is ended, which fails them.  Every process
        started is killed."""
        with self.lock:
            self.cancelled = True
        if not self._joined(START_UNDO_WAIT) and end_server:
            end_forkserver()
            self._joined(SERVER_GONE_WAIT)
        with self.lock:
            kept, self.handles = list(self.handles.values()), {}
        undo(kept)

    def _joined(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        for thread in self.threads:
            if thread.ident is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self.threads)


def undo(handles: Sequence[ProcessHandle]) -> None:
    """Kill each worker with all it started, and wait for it to be gone."""
    for h in handles:
        h.kill_tree()
    for h in handles:
        h.join(5)
        h.close()


def end_forkserver() -> None:
    """End this process's forkserver with every worker it forked (each
    leads its process group), all by SIGKILL: the server's own SIGTERM
    handler would wait for a long import (TensorFlow's) to return first.
    The starts waiting on it fail; the next start begins a new server."""
    pid = forkserver_pid()
    if not pid:
        return
    try:
        workers = psutil.Process(pid).children()
    except psutil.Error:
        workers = []
    for worker in workers:
        kill_tree(worker.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def _start_one(ctx, spec: WorkerSpec) -> ProcessHandle:
    from harness.worker import worker_main   # the worker side's one entry point
    parent_conn, child_conn = ctx.Pipe(duplex=True)
    try:
        proc = ctx.Process(target=worker_main, args=(spec, child_conn),
                           name=protocol.process_name(spec))
        proc.start()
    except BaseException:
        parent_conn.close()
        raise
    finally:
        child_conn.close()
    return _remember(ProcessHandle(spec.index, proc, parent_conn))


def _prewarm(settings) -> None:
    LocalLauncher(settings.start_method, settings.preload).prewarm()


BACKEND = Backend(
    name="local",
    launcher=lambda settings: LocalLauncher(settings.start_method, settings.preload),
    check=lambda settings, option: None,
    no_network_namespace=None,
    where=lambda settings: None,
    prewarm=_prewarm,
    close_session=lambda: None)
