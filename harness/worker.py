"""Worker side: the entry point of every worker process.

``worker_main`` sets the process up, runs ``fn`` and reports to the parent
over the channel of :mod:`harness.protocol`:

1. ties its life to its parent's (``PR_SET_PDEATHSIG``) and becomes a
   process-group leader with a tiny *reaper* child that SIGKILLs the group
   when the worker dies, so nothing ``fn`` starts outlives it, even when
   pytest itself is SIGKILLed;
2. sends stdout and stderr, at the file-descriptor level, to a log file, so
   TensorFlow's C++ logging is captured too;
3. arms ``faulthandler``: SIGUSR1 dumps every thread's Python stack to the
   stack file (a C-level handler, so it works while the main thread is
   blocked inside a TensorFlow collective), and fatal signals dump to the log;
4. sets ``TF_CONFIG`` and the environment, then runs ``fn`` with
   ``harness.context()`` available;
5. reports RETURNED or RAISED, then waits for the parent's RELEASE (or its
   SIGKILL) so a finished worker stays in the cluster until the run is decided.
"""
from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback

from . import worker_context as context_module
from . import protocol
from .protocol import Message, WorkerError, WorkerSpec

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
DUMP_SIGNAL = signal.SIGUSR1


def _prctl(option: int, value: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(option, int(value), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _prctl_pdeathsig(sig: int) -> None:
    _prctl(PR_SET_PDEATHSIG, sig)


def _die_with_parent() -> None:
    parent = os.getppid()
    _prctl_pdeathsig(signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(70)


def _start_group_reaper() -> None:
    """Fork a child that SIGKILLs this process group when this worker dies.

    The worker's own children inherit its process group; a parent-death
    signal reaches only direct children, so this reaper is what takes down
    grandchildren when the worker is SIGKILLed (by the harness, by a
    ``Crash`` fault or by its own parent's death).
    """
    try:
        os.setpgid(0, 0)
    except OSError:
        return
    # Orphans of fn's children (a double fork, a daemon) are re-parented to
    # this worker rather than to init, so the parent can still find them
    # among the worker's descendants when it cleans up.
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    worker = os.getpid()
    pid = os.fork()
    if pid != 0:
        return
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGUSR2, lambda *_: os.killpg(worker, signal.SIGKILL))
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.closerange(3, 65536)  # hold no pipe, lock or socket of the worker
        _prctl_pdeathsig(signal.SIGUSR2)
        if os.getppid() != worker:
            os.killpg(worker, signal.SIGKILL)
        while True:
            signal.pause()
    finally:
        os._exit(0)


def _redirect_output(log_path: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(devnull)
    sys.stdout = open(1, "w", buffering=1, closefd=False, errors="backslashreplace")
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


def worker_error(exc: BaseException) -> WorkerError:
    name = type(exc).__name__
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable>"
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return WorkerError(name, message, tb)


class _Channel:
    def __init__(self, conn, index: int):
        self._conn = conn
        self._index = index
        self._lock = threading.Lock()

    def send(self, kind: str, step=None, data=None) -> None:
        msg = Message(self._index, kind, time.time(), step, data)
        with self._lock:
            try:
                self._conn.send(msg)
            except (OSError, EOFError):
                os._exit(71)  # the parent is gone: nobody to report to

    def wait_release(self) -> None:
        try:
            self._conn.recv()
        except (OSError, EOFError):
            pass


def worker_main(spec: WorkerSpec, conn) -> None:
    _die_with_parent()
    _start_group_reaper()
    _redirect_output(spec.log_path)
    stack_file = open(spec.stack_path, "w")
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(DUMP_SIGNAL, file=stack_file, all_threads=True)

    os.environ.update(spec.env)
    if spec.tf_config is None:
        os.environ.pop("TF_CONFIG", None)
    else:
        os.environ["TF_CONFIG"] = json.dumps(spec.tf_config)

    channel = _Channel(conn, spec.index)
    ctx = context_module.WorkerContext(spec.index, spec.num_workers, spec.tf_config,
                                       channel.send, spec.faults, spec.sync_check)
    context_module._current = ctx
    code = 1
    try:
        from .inject import install_strategy_hook
        install_strategy_hook(ctx, channel.send)
        from . import serialize
        fn, args, kwargs = serialize.loads(spec.payload)
        channel.send(protocol.STARTED)
        value = fn(*args, **(kwargs or {}))
        _flush()
        try:
            payload = serialize.dumps(value)
        except Exception as e:
            raise TypeError(f"fn returned a value that cannot be sent to the parent "
                            f"({type(value).__name__}): {e}") from e
        channel.send(protocol.RETURNED, data=payload)
        code = 0
    except (SystemExit, KeyboardInterrupt):
        _flush()
        raise  # exiting without returning or raising: the parent calls it a crash
    except BaseException as e:
        traceback.print_exc()
        _flush()
        channel.send(protocol.RAISED, data=worker_error(e))
    channel.wait_release()
    _flush()
    os._exit(code)
