"""This process's scratch directory, and the sweeper that removes it.

Everything the harness puts in the temp directory for one pytest process
goes in one directory, ``<tempdir>/pytest-mwms-session-XXXXXXXX``: each
run's directory (logs, the workers' ``TMPDIR``), the forkserver's preload
report.  ``multiprocess``'s own temp directory (the forkserver's socket)
stays where it makes it, since a socket's path must be short, and the
sweeper is told of it.

Removing it at exit is not enough: a pytest that is SIGKILLed (by a CI
runner, by the OOM killer, by pytest-timeout's ``thread`` method, which ends
in ``os._exit``) runs no ``atexit``.  So the first use also starts a sweeper,
``python -I harness/launch/scratch.py DIR``, standard library only: it reads
its stdin, a pipe whose write end only this process holds, and when that
closes (this process exited or died: the kernel closes it all the same)
it removes the directory (and what it was told of on that pipe), then
keeps removing what dying workers still write there, until nothing has
come back for a while.  It runs in a
session of its own, so a Ctrl-C at the terminal (SIGINT to the whole
foreground group) leaves it to do its job.

Where the sweeper dies with its owner (a cgroup killed whole: a CI job's
time-out, a container's OOM kill), the next process to make a scratch
directory removes what such a session left (:func:`sweep_stale`): each
directory holds ``owner`` (the pid and its start time, so that a reused
pid does not pass for its owner) and ``outside`` (what it was told to
remove outside it), and only the current user's directories whose owner
is gone are touched.
"""
from __future__ import annotations

import atexit
import errno
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import List, Optional

from harness.core import linux

PREFIX = "pytest-mwms-session-"
# What dying workers may still write after the sweeper first removed the
# directory: they die by PR_SET_PDEATHSIG within a fraction of a second.
QUIET_SECONDS = 1.0
GIVE_UP_SECONDS = 30.0
OWNER_FILE = "owner"
OUTSIDE_FILE = "outside"
# A directory with no owner file yet may be being made right now.
UNOWNED_GRACE_SECONDS = 60.0

_lock = threading.Lock()
_dir: Optional[str] = None
_owner = 0           # the pid that made _dir: a forked child makes its own
_sweeper: Optional[subprocess.Popen[bytes]] = None


def scratch_dir() -> str:
    """This process's scratch directory (0700), made and watched on first use."""
    with _lock:
        if _dir is not None and _owner == os.getpid():
            return _dir
        sweep_stale(tempfile.gettempdir())
        with named_if_full("make its scratch directory"):
            return _adopt(tempfile.mkdtemp(prefix=PREFIX))


def start_time(pid: int) -> Optional[str]:
    """When ``pid`` started, in clock ticks since boot (``/proc/PID/stat``
    field 22); None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces.
    return stat[stat.rindex(b")") + 2:].split()[19].decode()


def owner_alive(owner: str) -> bool:
    """``owner`` is an owner file's text: that process still runs."""
    try:
        pid, started = owner.split()
        return start_time(int(pid)) == started
    except ValueError:
        return False


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def stale(path: str, now: float) -> bool:
    """``path`` is a scratch directory of this user whose owner is gone."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    if info.st_uid != os.getuid() or not os.path.isdir(path) or os.path.islink(path):
        return False
    owner = _read(os.path.join(path, OWNER_FILE))
    if owner is None or not owner.endswith("\n"):
        return now - info.st_mtime > UNOWNED_GRACE_SECONDS
    return not owner_alive(owner)


def sweep_stale(temp_dir: str) -> List[str]:
    """Remove what sessions whose owner is gone left in ``temp_dir``: their
    scratch directories and what they named outside them (only entries of
    this user).  Returns the scratch directories removed."""
    now = time.time()
    try:
        names = [n for n in os.listdir(temp_dir) if n.startswith(PREFIX)]
    except OSError:
        return []
    removed = []
    for name in names:
        path = os.path.join(temp_dir, name)
        if not stale(path, now):
            continue
        for outside in (_read(os.path.join(path, OUTSIDE_FILE)) or "").splitlines():
            if outside and _owned(outside):
                shutil.rmtree(outside, ignore_errors=True)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _owned(path: str) -> bool:
    try:
        return os.lstat(path).st_uid == os.getuid() and not os.path.islink(path)
    except OSError:
        return False


def _adopt(path: str) -> str:
    global _dir, _sweeper, _owner
    _dir, _owner = path, os.getpid()
    # Written whole or not at all: a half-written file must not read as a dead owner.
    partial = os.path.join(path, OWNER_FILE + ".partial")
    with open(partial, "w") as f:
        f.write(f"{_owner} {start_time(_owner)}\n")
    os.replace(partial, os.path.join(path, OWNER_FILE))
    # This file run as a script, isolated (-I): it needs only the standard
    # library, so nothing of the user's environment can stop it sweeping.
    _sweeper = subprocess.Popen(
        [sys.executable, "-I", os.path.abspath(__file__), path], stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    atexit.register(close)
    return path


def __tracebackhide__(excinfo) -> bool:
    """pytest leaves this module's frames out of a full disk's traceback."""
    from harness.errors import hide_in_setup_errors
    return hide_in_setup_errors(excinfo)


# What a full file system says: no space, or no quota left.
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def full_error(what: str, error: Optional[OSError] = None):
    """The setup error (:class:`~harness.errors.TempDirFullError`) for a
    full temp directory, naming it."""
    # Not at the top: this file also runs as the sweeper, standard library only.
    from harness.errors import TempDirFullError
    why = f" ({error.strerror})" if error is not None and error.strerror else ""
    return TempDirFullError(
        f"the temp directory ({tempfile.gettempdir()}) is full{why}: pytest-mwms could not "
        f"{what}. Free space there, or point TMPDIR at a file system with room")


class named_if_full:
    """Turn a full file system met in the block into :func:`full_error`
    (a class, not a generator: no frame of :mod:`contextlib` in the error)."""

    def __init__(self, what: str):
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> None:
        if isinstance(error, OSError) and error.errno in FULL_ERRNOS:
            raise full_error(self.what, error) from None


def is_full(path: str, room: int) -> bool:
    """Whether the file system of ``path`` has less than ``room`` bytes free."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < room


def make_dir(prefix: str) -> str:
    """A new directory in the scratch directory, for its caller to remove."""
    with named_if_full("make a run's directory"):
        return tempfile.mkdtemp(prefix=prefix, dir=scratch_dir())


def remove_mp_temp_dir_at_end(util) -> None:
    """Have the sweeper remove ``util``'s temp directory (``util``:
    ``multiprocessing.util`` or ``multiprocess.util``), unless this process
    inherited it: a cluster started inside a worker must leave its
    parent's forkserver socket alone."""
    path = util.get_temp_dir()
    if not linux.inherited_mp_temp_dir(path):
        remove_at_end(path)


def remove_at_end(path: str) -> None:
    """Have the sweeper remove ``path`` too (something made outside the
    scratch directory, such as a socket's directory that must stay short)."""
    folder = scratch_dir()
    with _lock, named_if_full(f"note {path} for removal"):
        with open(os.path.join(folder, OUTSIDE_FILE), "a") as f:
            f.write(path + "\n")
        sweeper = _sweeper.stdin if _sweeper is not None else None
        if sweeper is None:   # scratch_dir() started it, its stdin a pipe
            raise OSError("the scratch directory has no sweeper")
        sweeper.write(os.fsencode(path) + b"\n")
        sweeper.flush()


def close() -> None:
    """Remove the scratch directory now.  The sweeper is left to remove
    the rest when this process has ended (its pipe closes then): what it
    was told of outside includes ``multiprocessing``'s own temp directories,
    which their exit handlers, run after this one, remove first and fail
    to find if the sweeper took them sooner."""
    global _dir
    with _lock:
        if _dir is not None and _owner == os.getpid():
            shutil.rmtree(_dir, ignore_errors=True)
        _dir = None


def sweep(paths, quiet: float = QUIET_SECONDS, give_up: float = GIVE_UP_SECONDS) -> None:
    """Remove ``paths`` until they have stayed gone for ``quiet`` seconds."""
    deadline = time.monotonic() + give_up
    gone_since = None
    while time.monotonic() < deadline:
        left = [p for p in paths if os.path.lexists(p)]
        if left:
            for path in left:
                shutil.rmtree(path, ignore_errors=True)
            gone_since = None
        elif gone_since is None:
            gone_since = time.monotonic()
        elif time.monotonic() - gone_since >= quiet:
            return
        time.sleep(0.05)


def main(argv) -> None:
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    paths = [argv[0]]
    for line in sys.stdin.buffer:
        paths.append(os.fsdecode(line.rstrip(b"\n")))
    sweep(paths)


if __name__ == "__main__":
    main(sys.argv[1:])
