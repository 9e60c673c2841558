"""Worker side: how a worker process sets itself up as a process.

It ties its life to its parent's and leads a process group, which is
SIGKILLed when the worker dies with its parent, so nothing ``fn`` starts
outlives it, even when pytest itself is SIGKILLed: by the forkserver that
forked it, as the server ends (:func:`end_with_the_workers`), or, for a
worker started otherwise, by a tiny reaper of its own.  It sends its
output, at the file-descriptor level, to its log file (so TensorFlow's C++
logging is captured too).
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import psutil

from harness.core import linux

# True in the forkserver (harness.worker.preload) and in every worker it
# forks: the server SIGKILLs its workers' process groups when it ends, so
# they need no reaper.
SERVER_KILLS_GROUPS = False


def end_with_the_workers(signum=None, frame=None) -> None:
    """The forkserver's SIGTERM (its parent-death signal): SIGKILL each
    worker's process group (every worker leads one), then end the server.
    The workers are alive until the server ends (they die with it), so
    their groups are still there to be killed."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process().children():
            with contextlib.suppress(OSError):
                os.killpg(child.pid, signal.SIGKILL)
    os._exit(0)


# The reaper's program, run by a fresh interpreter: its parent is the worker
# (argv[1], also the process group to kill).  PR_SET_PDEATHSIG (1) sends it
# SIGUSR2 when the worker dies; it ignores SIGINT and SIGTERM, which are for
# the worker's group.
REAPER_CODE = """
import ctypes, os, signal, sys
worker = int(sys.argv[1])
kill = lambda *_: os.killpg(worker, signal.SIGKILL)
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGUSR2, kill)
ctypes.CDLL(None).prctl(1, signal.SIGUSR2, 0, 0, 0)
if os.getppid() != worker:
    kill()
while True:
    signal.pause()
"""


def lead_process_group() -> None:
    """Lead a process group of this worker's own, as a subreaper; start a
    reaper where the forkserver does not kill the group
    (:data:`SERVER_KILLS_GROUPS`).  A worker forked from the server takes
    the server's SIGTERM handler back to its default first."""
    if SERVER_KILLS_GROUPS:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        os.setpgid(0, 0)
    except OSError:
        return
    # Orphans of fn's children (a double fork, a daemon) are re-parented to
    # this worker rather than to init, so the parent can still find them
    # among the worker's descendants when it cleans up.
    linux.become_subreaper()
    if not SERVER_KILLS_GROUPS:
        start_group_reaper()


def start_group_reaper() -> None:
    """Start a child that SIGKILLs this process group when this worker dies.

    The worker's own children inherit its process group; a parent-death
    signal reaches only direct children, so this reaper is what takes down
    grandchildren when the worker is SIGKILLed (by the harness, by a
    ``Crash`` fault or by its own parent's death).

    The reaper is a new program, not a fork of the worker: a forked child
    would share every page of the worker's TensorFlow heap, and each page
    the worker then wrote, for as long as it ran, would be copied.  It is
    started without a fork's page-table copy (``subprocess`` uses vfork),
    holds none of the worker's descriptors, and inherits its process group.
    """
    subprocess.Popen([sys.executable, "-I", "-S", "-c", REAPER_CODE, str(os.getpid())],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, close_fds=True)


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
    # The process's own streams, for its whole life.
    sys.stdout = open(1, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115


def flush_output() -> None:
    """Flush Python's stdout and stderr (before the process exits or dies)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
