"""Linux process primitives both sides of the harness use: no TensorFlow.

The harness is Linux-only: it relies on ``prctl`` (a parent-death signal, a
child subreaper), on ``/proc`` and on process groups.  These few calls are
the whole of that dependence that is not ``psutil``'s.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from typing import IO, Iterable, List, Optional

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# The shared library every TensorFlow process maps: how a worker (or a
# forkserver) is recognised from outside, whatever its command line says.
TENSORFLOW_LIBRARY = "libtensorflow_framework"


def prctl(option: int, value: int) -> bool:
    """``prctl(option, value)``; False where the call is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, int(value), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send ``sig`` to this process when the *thread* that
    forked it ends (``PR_SET_PDEATHSIG``)."""
    prctl(PR_SET_PDEATHSIG, sig)


def die_with_parent(exit_code: int = 70) -> None:
    """Tie this process's life to its parent's with SIGKILL; exit at once if
    the parent died before the tie took effect."""
    parent = os.getppid()
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(exit_code)


def exit_when_gone(pid: int, every: float = 0.5, exit_code: int = 70) -> None:
    """End this process (``os._exit``) once ``pid``, which need not be its
    parent, is gone: a daemon thread looks every ``every`` seconds.  For a
    process that a forkserver started, whose parent may outlive the process
    it serves."""
    import threading
    try:
        created = psutil.Process(pid).create_time()
    except psutil.Error:
        os._exit(exit_code)

    def watch():
        while True:
            try:
                process = psutil.Process(pid)
                if process.create_time() != created or \
                        process.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.Error:
                break
            time.sleep(every)
        os._exit(exit_code)

    threading.Thread(target=watch, name="exit-when-gone", daemon=True).start()


def become_subreaper() -> None:
    """Orphans of this process's descendants are re-parented to it, not to
    init, so they can still be found (and killed) from it."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)


CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000


def enter_namespaces(user_ns: str, net_ns: str, mount_ns: Optional[str] = None) -> None:
    """Join the user namespace at path ``user_ns``, then the network
    namespace at ``net_ns`` (``/proc/PID/ns/user`` and ``.../net`` of the
    process that holds them), then, if given, the mount namespace at
    ``mount_ns`` (``.../mnt``: a run's own ``/etc/hosts``): ``setns(2)``
    through libc, as Python 3.11 has no ``os.setns``.  Joining a user or a
    mount namespace needs a single-threaded process, so a worker does it
    first thing.  Joining a mount namespace moves the process to its root
    directory; the working directory is kept (the namespace is a copy of
    the host's mounts).  Raises ``OSError``."""
    cwd = os.getcwd()
    joins = [(user_ns, CLONE_NEWUSER), (net_ns, CLONE_NEWNET)]
    if mount_ns is not None:
        joins.append((mount_ns, CLONE_NEWNS))
    for path, kind in joins:
        join_namespace(path, kind)
    if mount_ns is not None:
        os.chdir(cwd)


def join_namespace(path: str, kind: int) -> None:
    """``setns(2)`` into the namespace at ``path`` (``/proc/PID/ns/...``) of
    ``kind`` (``CLONE_NEWUSER``, ``CLONE_NEWNET``, ``CLONE_NEWNS``): a
    network namespace is the calling thread's own, a user or mount
    namespace the process's (joined while single-threaded).  Raises ``OSError``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, kind) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie counts as gone."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_gone(pids: Iterable[int], seconds: float) -> List[int]:
    """Wait until none of ``pids`` is alive (zombies count as gone), at most
    ``seconds``; return the survivors."""
    deadline = time.monotonic() + seconds
    left = list(pids)
    while True:
        left = [p for p in left if alive(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.01)


def has_tensorflow(pid: int) -> bool:
    """Whether live process ``pid`` has TensorFlow loaded (a zombie has not)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            if TENSORFLOW_LIBRARY not in f.read():
                return False
    except OSError:
        return False
    return alive(pid)


def tensorflow_pids(processes: Iterable[psutil.Process]) -> List[int]:
    """The pids among ``processes`` that have TensorFlow loaded."""
    return [p.pid for p in processes if has_tensorflow(p.pid)]


PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# This process's /proc/self/statm, kept open: (pid, fd).  A forked child
# reopens it, since the parent's descriptor reads the parent's.
_statm = (-1, -1)


def resident_bytes() -> int:
    """This process's resident set in bytes, read in a few microseconds (a
    ``pread`` of ``/proc/self/statm``); 0 where it cannot be read."""
    global _statm
    try:
        if _statm[0] != os.getpid():
            _statm = (os.getpid(), os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC))
        return int(os.pread(_statm[1], 96, 0).split()[1]) * PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return 0


def pipe(stream: Optional[IO[bytes]]) -> IO[bytes]:
    """``stream``: a ``subprocess.Popen``'s ``stdin``, ``stdout`` or
    ``stderr`` opened with ``subprocess.PIPE`` (its type leaves it
    optional); an OSError where the process has no such pipe."""
    if stream is None:
        raise OSError("the process was not started with this pipe")
    return stream


# multiprocessing's temp directories (``pymp-*``) this process inherited: a
# worker's process object carries its parent's, which holds the parent's
# forkserver socket and is the parent's to remove.
_inherited_mp_temp_dirs: set = set()


def note_inherited_mp_temp_dirs() -> None:
    """Note each ``multiprocessing`` library's temp directory this process
    has now (a worker, at its start: its parent's)."""
    for library in ("multiprocess", "multiprocessing"):
        process = sys.modules.get(f"{library}.process")
        path = process.current_process()._config.get("tempdir") if process else None
        if path:
            _inherited_mp_temp_dirs.add(path)


def inherited_mp_temp_dir(path: str) -> bool:
    """Whether ``path`` is a temp directory this process inherited
    (:func:`note_inherited_mp_temp_dirs`)."""
    return path in _inherited_mp_temp_dirs
