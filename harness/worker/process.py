"""Worker side: how a worker process sets itself up as a process.

It ties its life to its parent's, leads a process group that a tiny reaper
child SIGKILLs when the worker dies (so nothing ``fn`` starts outlives it,
even when pytest itself is SIGKILLed), and sends its output, at the
file-descriptor level, to its log file (so TensorFlow's C++ logging is
captured too).
"""
from __future__ import annotations

import os
import signal
import sys

from harness.core import linux


def start_group_reaper() -> None:
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
    linux.become_subreaper()
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
        linux.set_parent_death_signal(signal.SIGUSR2)
        if os.getppid() != worker:
            os.killpg(worker, signal.SIGKILL)
        while True:
            signal.pause()
    finally:
        os._exit(0)


def redirect_output(log_path: str) -> None:
    """stdin from /dev/null; stdout and stderr (fds 1 and 2) to ``log_path``.

    The log is created 0600: it holds whatever ``fn`` prints, which is no
    business of other users of a shared machine.
    """
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(devnull)
    sys.stdout = open(1, "w", buffering=1, closefd=False, errors="backslashreplace")
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")


def flush_output() -> None:
    """Flush Python's stdout and stderr (before the process exits or dies)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
