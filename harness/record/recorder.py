"""The recorder in a job's own process: the harness's worker-side ledger,
writing to files instead of to a parent.

:func:`install` (or ``harness record``, which calls it before it runs the
script) makes the files of :mod:`harness.record.files`, hooks TensorFlow as
a harness worker is hooked (strategy creation, the collective ledger,
automatic steps), and starts:

- a watchdog thread, which writes a dump when the job has made no progress
  (no step, no call of a collective-launching function, no strategy event)
  for ``timeout`` seconds, once per quiet spell.  ``faulthandler`` writes
  the stacks from C, so it works while the main thread is blocked inside a
  collective;
- a watcher process beside the job (:mod:`harness.record.watcher`), which
  sees from outside what the job cannot tell of itself: that it was
  stopped, or that it ended (and, when it can, its exit status).  The
  dumps SIGUSR2 and SIGTERM ask for are written by ``faulthandler``, from
  C, into a pipe to it, and it files them under their header: the job may
  be blocked, or about to die of the signal.

SIGTERM (a cluster manager's "stop") is a dump, then whatever would have
happened without the recorder: TensorFlow's default (the process ends), or
the job's own handler (``PreemptionCheckpointHandler`` saves its
checkpoint), or TensorFlow's own when the job's coordination service set
one (:mod:`harness.record.signals` keeps the dump in front of handlers set
later).

Nothing else about the job changes: ``TF_CONFIG`` is the job's own, its
output and exit status are the script's, a second strategy is not refused,
no worker waits for the chief's port, and a dump lets the job go on.
"""
from __future__ import annotations

import atexit
import faulthandler
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, Optional, Tuple

from harness.core import progress, protocol
from harness.errors import SettingError
from harness.record import files, signals

# No progress for this long writes a dump: long enough that an evaluation
# or a checkpoint written between steps rarely trips it, short enough that a
# hung job has its dump long before anyone looks.  0 turns it off.
DEFAULT_TIMEOUT = 300.0
# The signal that asks for a dump now.  TensorFlow installs no handler for
# it (2.15 to 2.21); SIGUSR1 is left to the harness's own workers.
DUMP_SIGNAL = signal.SIGUSR2
# The signals a manager stops a job with that also write a dump: the dump
# comes first, then the job's own handling (by default the job ends).
STOP_SIGNALS = (signal.SIGTERM,)
# How often the watchdog looks.
WATCH_EVERY = 0.5
# A dump into the watcher's pipe never blocks the job (the pipe does not
# block); this much room keeps the stacks of a job with many threads whole.
PIPE_ROOM = 1 << 20
_F_SETPIPE_SZ = 1031

_installed: Optional[Recorder] = None


def cluster_position(tf_config: Optional[dict]) -> Tuple[int, int]:
    """(index, number of workers) of this task among the tasks that join
    MWMS's collectives (the chief first, then the workers); (0, 1) without
    a cluster."""
    try:
        config = tf_config or {}
        cluster = config["cluster"]
        order = [("chief", i) for i in range(len(cluster.get("chief", ())))] + \
                [("worker", i) for i in range(len(cluster.get("worker", ())))]
        task = (config["task"]["type"], int(config["task"]["index"]))
        return order.index(task), len(order)
    except (TypeError, KeyError, ValueError, AttributeError):
        return 0, 1


class Recorder:
    """One job process's recorder; see the module docstring."""

    def __init__(self, folder: str, timeout: Optional[float] = DEFAULT_TIMEOUT):
        from harness.worker.strategy_hook import tf_config_from_env
        os.makedirs(folder, exist_ok=True)
        self.timeout = float(timeout or 0.0)
        tf_config = tf_config_from_env()
        pid = os.getpid()
        self.base = _claim(os.path.join(folder, files.stem(tf_config, files.hostname(), pid)))
        self.writer = progress.Writer(self.base + files.PROGRESS)
        self.events = files.Lines(self.base + files.EVENTS)
        self.stack_file = open(self.base + files.STACKS, "a")  # noqa: SIM115 - the process's life
        self._sent = 0
        # signal -> where faulthandler writes its dump
        self._signal_files: Dict[int, signals.DumpFile] = {}
        self.front: Optional[signals.Front] = None
        self._dump_lock = threading.Lock()
        self._stop = threading.Event()
        self._exited = False
        self.watcher: Optional[subprocess.Popen[bytes]] = None
        files.write_meta(self.base + files.META, {
            "format": files.FORMAT, "version": files.VERSION,
            "task": dict(zip(("type", "index"), files.task_of(tf_config))),
            "host": files.hostname(), "pid": pid, "clock": files.now_pair(),
            "tf_config": tf_config, "timeout": self.timeout or None,
            "harness": _harness_version()})
        self.tf_config = tf_config

    # -- what the harness's worker sends its parent goes to the events file
    def send(self, kind: str, step=None, data=None) -> None:
        self._sent += 1
        self._event(str(kind), step, data)

    def _event(self, kind: str, step=None, data=None) -> None:
        self.events.write({"kind": kind, "time": time.monotonic(), "step": step, "data": data})

    # -- set-up ------------------------------------------------------------
    def start(self) -> None:
        from harness.worker import context as context_module
        from harness.worker import ledger as ledger_module
        from harness.worker.strategy_hook import install_strategy_hook
        from harness.worker.checkpoints import watch_restores
        from harness.worker.datasets import watch_datasets
        index, workers = cluster_position(self.tf_config)
        ctx = context_module.WorkerContext(index, workers, self.tf_config, self.send,
                                           progress_map=self.writer)
        ctx.observe_only = True
        context_module.activate(ctx)
        try:
            install_strategy_hook(ctx)
            why = ledger_module.install(ledger_module.Ledger(self.writer, self.send, "calls", ctx))
        except Exception as e:   # a TensorFlow whose internals moved: record, never fail
            why = f"{type(e).__name__}: {e}"
        if why is not None:
            self.send(protocol.LEDGER_OFF, data=why)
        watch_restores(ctx)
        watch_datasets(ctx)
        self._start_watcher()
        self._arm_faulthandler()
        threading.Thread(target=self._watch, name="mwms-recorder", daemon=True).start()
        atexit.register(self.at_exit)
        self.send(protocol.STARTED)

    def _start_watcher(self) -> None:
        """The watcher, with a pipe for each signal's dump; without a
        watcher, faulthandler writes those dumps to the stack file itself,
        with no header."""
        pipes = {}
        for sig in (DUMP_SIGNAL, *STOP_SIGNALS):
            read, write = os.pipe()
            os.set_blocking(write, False)
            try:
                fcntl.fcntl(write, _F_SETPIPE_SZ, PIPE_ROOM)
            except OSError:
                pass     # the default 64 KiB
            pipes[sig] = (read, write)
        self.watcher = _start_watcher(self.base, {signal.Signals(sig).name: r
                                                  for sig, (r, _) in pipes.items()})
        for sig, (read, write) in pipes.items():
            os.close(read)
            if self.watcher is None:
                os.close(write)
            self._signal_files[sig] = write if self.watcher is not None else self.stack_file

    def _arm_faulthandler(self) -> None:
        # A fatal signal's report goes to the stack file, unless the job
        # asked for faulthandler itself (PYTHONFAULTHANDLER, -X faulthandler).
        if not faulthandler.is_enabled():
            faulthandler.enable(file=self.stack_file, all_threads=True)
        self.front = signals.Front(self._signal_files, always_chain=STOP_SIGNALS)
        self.front.arm_all()
        signal.signal = signals.wrap_signal(signal.signal, self.front)

    # -- dumps -------------------------------------------------------------
    def dump(self, reason: str) -> None:
        """Write every thread's stack to the stack file, and say so in the
        events.  The file's lock keeps a dump the watcher files (a
        signal's) from landing inside this one."""
        with self._dump_lock:
            fd = self.stack_file.fileno()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                try:
                    offset = os.fstat(fd).st_size
                    os.write(fd, f"--- dump: {reason} ---\n".encode())
                    faulthandler.dump_traceback(file=self.stack_file, all_threads=True)
                    length = os.fstat(fd).st_size - offset
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            except (OSError, ValueError):
                return
            self._event(files.DUMP, data={"reason": reason, "offset": offset, "length": length})

    def _progress_mark(self):
        return self.writer.written, self._sent

    def _watch(self) -> None:
        mark, quiet_since, dumped = self._progress_mark(), time.monotonic(), False
        while not self._stop.wait(WATCH_EVERY):
            now = time.monotonic()
            if self._progress_mark() != mark:
                mark, quiet_since, dumped = self._progress_mark(), now, False
            elif self.timeout and not dumped and now - quiet_since >= self.timeout:
                self.dump(f"no progress for {self.timeout:g} s")
                dumped = True
            if self.front is not None:   # armed before this thread starts
                self.front.check()

    # -- the end -----------------------------------------------------------
    def exited(self, how: str, status: Optional[int], error=None) -> None:
        """Record how the job's main ended (once: the first word stands)."""
        if self._exited:
            return
        self._exited = True
        self._event(files.EXIT, data={"how": how, "status": status, "error": error})

    def at_exit(self) -> None:
        # install(): the interpreter is exiting, and no exception reached
        # the top: main returned or called sys.exit (whose status it
        # cannot see here).
        self.exited(files.RETURNED, None)
        self.dump("at exit")
        self._stop.set()
        self.events.close()


def _claim(base: str) -> str:
    """``base``, or ``base.K`` where a process of the same pid on this host
    (an earlier container's) left its files: the progress map made here."""
    for k in range(100):
        path = base if k == 0 else f"{base}.{k}"
        try:
            progress.create(path + files.PROGRESS)
            return path
        except FileExistsError:
            continue
        except OSError as e:
            raise SettingError(f"dir: cannot write the recorder's files in "
                               f"{os.path.dirname(base)}: {e.strerror}") from None
    raise SettingError(f"dir: {os.path.dirname(base)} holds 100 recordings of {base}")


def _harness_version() -> str:
    try:
        from importlib.metadata import version
        return version("pytest-mwms")
    except Exception:
        return "unknown"


def _start_watcher(base: str, pipes) -> Optional[subprocess.Popen]:
    """The process that watches this one from outside, and files the dumps
    that come through ``pipes`` (signal name -> read end); None when it
    cannot be started (the job runs on without it)."""
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "harness.record.watcher", str(os.getpid()), base,
             *(f"{name}={fd}" for name, fd in pipes.items())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True, pass_fds=tuple(pipes.values()))
    except OSError:
        return None


def _excepthook(previous):
    def hook(kind, value, tb):
        if _installed is not None and not issubclass(kind, SystemExit):
            from harness.worker.main import worker_error
            _installed.exited(files.RAISED, 1, worker_error(value))
        previous(kind, value, tb)
    return hook


def install(dir: str, timeout: Optional[float] = DEFAULT_TIMEOUT) -> Recorder:
    """Record this process's part of an MWMS job into directory ``dir``
    (made if missing); ``timeout``: seconds without progress before a dump
    is written (0 or None: only on SIGUSR2 and at exit).  Call it before
    the strategy is created; a second call returns the first recorder."""
    global _installed
    if _installed is not None:
        return _installed
    from harness.record.settings import check_dir, check_timeout
    recorder = Recorder(check_dir(dir), check_timeout(timeout))
    _installed = recorder
    sys.excepthook = _excepthook(sys.excepthook)
    recorder.start()
    return recorder
