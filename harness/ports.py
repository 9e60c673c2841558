"""Choosing the ports a cluster listens on, safely on a machine many users share.

Two pytest processes side by side (``pytest -n 2``), of one user or of
several, must never hand the same port to two clusters, and a port must stay
ours between choosing it and the worker's gRPC server binding it.  Binding to
port 0 and closing does not give that: the kernel may hand the port to anyone
the moment it is closed, and it comes from the ephemeral range that every
outgoing connection (including the workers' own gRPC clients) draws from.

So a port is taken only when all three hold:

* it lies below the kernel's ephemeral range (``ip_local_port_range``), so no
  outgoing connection is ever given it;
* this process holds an exclusive ``flock`` on the lock file
  ``<state dir>/<port>``, a regular file it owns; the lock is released when
  the reservation is closed or the process dies, even by SIGKILL, so a crashed
  pytest never leaks reservations;
* a test ``bind`` on all interfaces succeeds (TensorFlow's server binds
  ``*:PORT``), so a port some unrelated program uses is skipped.

Design: one directory shared by every user, made like ``/tmp`` itself
---------------------------------------------------------------------
The state directory is the ``state_dir`` argument (what the ini option
``mwms_state_dir`` sets), else ``$MWMS_STATE_DIR``, else
``<tempfile.gettempdir()>/pytest-mwms-ports-v2``.  The harness creates it
(0700, then ``fchmod`` to 1777: world-writable and sticky, like ``/tmp``), so
every user can create lock files in it and nobody but a file's owner (and the
directory's owner, and root) can remove or replace them.  A per-user
directory was rejected: the runs of two users would not see each other's
locks and would rely on the test bind alone, which races the bind TensorFlow
makes in the worker seconds later, so two users' clusters could be handed
the same port.  (Where ``$TMPDIR`` differs between users, point
``MWMS_STATE_DIR`` of all of them at one directory.)

A process opens, locks or removes only lock files of its own uid.  A name in
the directory that is anything else (another user's lock file, a symbolic or
hard link, a FIFO, a directory) is left alone and its port skipped for this
reservation: its owner holds that port, or held it when their run died and
will sweep the file at their next reservation.  Skipping cannot lock anyone
out while the range has free ports, and cannot collide, because two users
never share a lock file; the alternative, locking another user's file, would
let its owner delete it under us.  Names are examined with ``lstat`` and
opened with ``O_NOFOLLOW | O_NONBLOCK`` without ``O_CREAT`` (so
``fs.protected_regular`` never applies and a planted link is never followed),
checked again with ``fstat`` (a regular file we own, one link); a missing file
is created with ``O_CREAT | O_EXCL`` (never through a link, never truncating
anything), mode 0600.  The directory itself is opened ``O_NOFOLLOW`` and used
through its descriptor; a symbolic link, or a directory that is not safe (see
:func:`_problem`), raises :class:`~harness.errors.StateDirError` naming the
path, its owner and mode, and the settings that choose another.

No litter: a lock file is removed when its reservation is released, with the
classic protocol: take the lock, then check that the name still denotes the
inode locked (``fstat`` vs ``lstat``: ``st_dev``/``st_ino``), else start over;
unlink only while holding the lock.  So a process that opened the file just
before it was removed finds out and creates a fresh one instead of "holding"
a deleted inode.  Each reservation first sweeps the user's own stale files
(left by a run that was SIGKILLed), under the same protocol.  Bound: the
directory holds one file per port currently reserved, plus the files of runs
that died holding ports, until their owner's next reservation; never more
than one per port of the range.

What the design does not defend against: a user who holds or pre-creates lock
files for every port, or binds them, denies the others ports (they get a
clear error); the directory's owner, when not root, can remove other users'
lock files and so break coordination.  ``pytest-mwms-ports`` (without
``-v2``), the directory of earlier versions, is not used any more; runs of an
earlier version do not coordinate with this one.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import re
import socket
import stat
import tempfile
import time
from typing import Iterator, List, Optional, Tuple

from .errors import StateDirError

ENV_VAR = "MWMS_STATE_DIR"
INI_OPTION = "mwms_state_dir"
DIR_NAME = "pytest-mwms-ports-v2"
DIR_MODE = 0o1777
FILE_MODE = 0o600
DEFAULT_RANGE = (20000, 32768)


def default_state_dir() -> str:
    """The state directory when neither ``state_dir`` nor ``$MWMS_STATE_DIR`` says."""
    return os.path.join(tempfile.gettempdir(), DIR_NAME)


# The default directory as it was at import (kept for callers of earlier versions).
LOCK_DIR = default_state_dir()


def ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_range() -> Tuple[int, int]:
    """The half-open range ``[lo, hi)`` ports are drawn from."""
    lo, hi = DEFAULT_RANGE
    hi = min(hi, ephemeral_start())
    if hi - lo < 1000:  # an unusual kernel setting: fall back to a low band
        lo, hi = 15000, 20000
    return lo, hi


_system_port_range = port_range  # reserve_ports has a parameter of that name


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


# --------------------------------------------------------------------------
# The state directory

def _resolve(state_dir: Optional[str]) -> Tuple[str, str]:
    """(path, where the path came from)."""
    if state_dir:
        return os.path.abspath(os.fspath(state_dir)), (
            f"the ini option {INI_OPTION} (or reserve_ports(state_dir=...))")
    env = os.environ.get(ENV_VAR)
    if env:
        return os.path.abspath(env), f"the environment variable {ENV_VAR}"
    return default_state_dir(), "the default"


def _user(uid: int) -> str:
    try:
        import pwd
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _describe(st: os.stat_result) -> str:
    return (f"owner {_user(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o} "
            f"({stat.filemode(st.st_mode)})")


def _state_dir_error(path: str, source: str, problem: str,
                     st: Optional[os.stat_result] = None) -> StateDirError:
    """The error for an unusable state directory: what, why, what to do."""
    if st is None:
        with contextlib.suppress(OSError):
            st = os.lstat(path)
    what = f" ({_describe(st)})" if st is not None else ""
    if st is not None and stat.S_ISDIR(st.st_mode):
        fix = f"Or have its owner run `chmod 1777 {path}` (or remove it)."
    elif st is not None:
        fix = f"Or have its owner remove {path}."
    else:
        fix = ""
    return StateDirError(
        f"pytest-mwms cannot use {path}{what} to coordinate ports with other runs: {problem}. "
        f"The path comes from {source}. Set the environment variable {ENV_VAR} (or the ini "
        f"option {INI_OPTION}) to another directory: a new path (the harness creates it, mode "
        f"1777 like /tmp), a directory shared like /tmp (mode 1777), or a private one of "
        f"yours; every user whose runs may overlap on this machine must use the same one, or "
        f"their ports may collide. {fix}".rstrip())


def _writable(path: str) -> bool:
    effective = os.access in os.supports_effective_ids
    return os.access(path, os.W_OK | os.X_OK, effective_ids=effective)


def _problem(st: os.stat_result, path: str) -> Optional[str]:
    """Why a directory (its ``fstat``) is no place for lock files, or None.

    Accepted: a sticky directory we can write in (shared like /tmp, whoever
    owns it), or a directory of ours that nobody else can write in.
    """
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    me = os.geteuid()
    sticky = bool(st.st_mode & stat.S_ISVTX)
    if not _writable(path):
        return f"you ({_user(me)}) cannot create files in it"
    if not sticky and st.st_mode & 0o022:
        return ("others can write in it but it is not sticky (like /tmp, mode 1777), so "
                "anyone could remove or replace the lock files")
    if not sticky and st.st_uid != me:
        return (f"it belongs to another user, who could replace the lock files, and it is not "
                f"shared like /tmp (mode 1777); you are {_user(me)}")
    return None


def _being_made(path: str, me: int, opening: bool = False) -> bool:
    """Whether another user may be creating the directory this moment (the
    harness makes it 0700, then chmods it 1777).  ``opening``: our open just
    failed with EACCES, and a mode that lets us in now says it was chmod-ed
    in between."""
    try:
        st = os.lstat(path)
    except OSError:
        return opening
    mode = stat.S_IMODE(st.st_mode)
    return stat.S_ISDIR(st.st_mode) and st.st_uid != me and (
        mode == 0o700 or opening and mode & 0o005 == 0o005)


def _open_state_dir(path: str, source: str) -> int:
    """A descriptor of the state directory, created if missing; or StateDirError."""
    default = source == "the default"
    me = os.geteuid()
    deadline = None
    made = False
    for _ in range(1000):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            try:
                # 0700 until it is ours and chmod-ed: umask cannot spoil the mode,
                # and nobody can slip anything in before it is 1777.
                os.mkdir(path, 0o700)
                made = True
            except FileExistsError:
                pass
            except OSError as e:
                raise _state_dir_error(
                    path, source, f"it does not exist and cannot be created ({e.strerror}; "
                    f"only the last component is created)") from None
            continue
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISLNK(st.st_mode):
                    target = ""
                    with contextlib.suppress(OSError):
                        target = f" to {os.readlink(path)}"
                    raise _state_dir_error(
                        path, source, f"it is a symbolic link{target}, which the harness "
                        f"does not follow", st) from None
                raise _state_dir_error(path, source, "it is not a directory", st) from None
            if e.errno == errno.EACCES and _being_made(path, me, opening=True):
                deadline = deadline or time.monotonic() + 1.0
                if time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
            raise _state_dir_error(path, source, f"it cannot be opened ({e.strerror})") from None
        try:
            st = os.fstat(fd)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == me and mode != DIR_MODE and (
                    made or default):  # made just now, or the default left in another mode
                os.fchmod(fd, DIR_MODE)
                st = os.fstat(fd)
            problem = _problem(st, path)
        except BaseException:
            os.close(fd)
            raise
        if problem is None:
            return fd
        os.close(fd)
        if _being_made(path, me):
            deadline = deadline or time.monotonic() + 1.0
            if time.monotonic() < deadline:
                time.sleep(0.02)
                continue
        raise _state_dir_error(path, source, problem, st)
    raise _state_dir_error(path, source, "it keeps disappearing while being opened")


def check_state_dir(state_dir: Optional[str] = None) -> str:
    """The state directory :func:`reserve_ports` would use, created if
    missing and checked: its path, or :class:`~harness.errors.StateDirError`
    (for the plugin to report once, at the start of a session)."""
    path, source = _resolve(state_dir)
    os.close(_open_state_dir(path, source))
    return path


# --------------------------------------------------------------------------
# Lock files

_PORT_NAME = re.compile(r"[0-9]{1,5}\Z")
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_BUSY, _FOREIGN = "busy", "foreign"


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _ours(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def _lstat(dirfd: int, name: str) -> Optional[os.stat_result]:
    try:
        return os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _lock(dirfd: int, name: str, path: str, source: str, create: bool = True):
    """Lock ``name``: a descriptor holding the lock, or _BUSY / _FOREIGN.

    Only a regular file of ours with one link is ever opened; a missing one is
    created (``O_EXCL``).  After the lock is taken the name must still denote
    the locked inode (else whoever removed it was releasing it): start over.
    """
    for _ in range(16):
        st = _lstat(dirfd, name)
        if st is None:
            if not create:
                return _FOREIGN
            try:
                fd = os.open(name, _OPEN | os.O_CREAT | os.O_EXCL, FILE_MODE, dir_fd=dirfd)
            except OSError as e:
                if isinstance(e, FileExistsError) or _lstat(dirfd, name) is not None:
                    continue  # made by someone else meanwhile
                raise _state_dir_error(
                    path, source, f"a lock file cannot be created in it ({e.strerror})") from None
            with contextlib.suppress(OSError):
                os.fchmod(fd, FILE_MODE)  # whatever the umask
        elif not _ours(st) or st.st_nlink != 1:
            return _FOREIGN  # another user's lock file, or something planted: leave it be
        else:
            try:
                fd = os.open(name, _OPEN, dir_fd=dirfd)  # no O_CREAT: see the module docstring
            except FileNotFoundError:
                continue
            except OSError:
                return _FOREIGN  # replaced under us by a link, a FIFO, ...
        try:
            fst = os.fstat(fd)
            if fst.st_nlink == 0:
                os.close(fd)
                continue  # removed between open and fstat
            if not _ours(fst) or fst.st_nlink != 1:
                os.close(fd)
                return _FOREIGN
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                    return _BUSY
                raise
            now = _lstat(dirfd, name)
            if now is None or not _same(now, fst):
                os.close(fd)
                continue  # its holder removed it as it released it
            return fd
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
    return _BUSY


def _unlock(dirfd: int, name: str, fd: int) -> None:
    """Remove the lock file (while still holding its lock), then drop the lock."""
    try:
        with contextlib.suppress(OSError):
            now = _lstat(dirfd, name)
            if now is not None and _same(now, os.fstat(fd)):
                os.unlink(name, dir_fd=dirfd)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def _sweep(dirfd: int, path: str, source: str) -> int:
    """Remove our own lock files nobody holds (left by runs that were killed)."""
    removed = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(dirfd):
            if not _PORT_NAME.match(entry.name):
                continue
            st = _lstat(dirfd, entry.name)
            if st is None or not _ours(st) or st.st_nlink != 1:
                continue
            fd = _lock(dirfd, entry.name, path, source, create=False)
            if isinstance(fd, int):
                _unlock(dirfd, entry.name, fd)
                removed += 1
    return removed


# --------------------------------------------------------------------------
# Reservations

def _candidates(lo: int, hi: int, wait) -> Iterator[int]:
    """Ports of ``[lo, hi)`` in random order, pass after pass; between two
    passes, a millisecond's pause when ``wait()`` (some port was held)."""
    rng = random.Random(os.urandom(16))
    while True:
        seen = set()
        while len(seen) < hi - lo:
            port = rng.randrange(lo, hi)
            if port not in seen:
                seen.add(port)
                yield port
        if wait():
            time.sleep(0.001)

class PortReservation:
    """N ports held for one cluster; ``close()`` gives them back."""

    def __init__(self, ports: List[int], lock_fds: List[int], dir_fd: int = -1,
                 path: str = ""):
        self.ports = ports
        self.path = path
        self._lock_fds = lock_fds
        self._dir_fd = dir_fd

    def close(self) -> None:
        fds, self._lock_fds = self._lock_fds, []
        for port, fd in zip(self.ports, fds):
            if self._dir_fd >= 0:
                _unlock(self._dir_fd, str(port), fd)
            else:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if self._dir_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._dir_fd)
            self._dir_fd = -1

    def __enter__(self) -> "PortReservation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PortReservation({self.ports})"


def reserve_ports(n: int, attempts: int = 2000, *, state_dir: Optional[str] = None,
                  port_range: Optional[Tuple[int, int]] = None) -> PortReservation:
    """Reserve ``n`` distinct free ports.

    ``state_dir``: the directory the lock files live in (else
    ``$MWMS_STATE_DIR``, else the default; see the module docstring).
    ``port_range``: the half-open ``(lo, hi)`` to draw from, instead of the
    one below the ephemeral range.  At most ``attempts`` ports are tried.
    Raises :class:`~harness.errors.StateDirError` when the directory cannot be
    used safely, ``RuntimeError`` when too few ports are free.
    """
    lo, hi = port_range if port_range is not None else _system_port_range()
    if not 0 < lo < hi <= 65536:
        raise ValueError(f"port_range must be (lo, hi) with 0 < lo < hi <= 65536, not {(lo, hi)}")
    if n > hi - lo:
        raise ValueError(f"cannot reserve {n} ports in [{lo}, {hi}): it has only {hi - lo}")
    path, source = _resolve(state_dir)
    dirfd = _open_state_dir(path, source)
    ports: List[int] = []
    fds: List[int] = []
    skipped = {}  # port -> why, as last seen
    tried = 0
    try:
        _sweep(dirfd, path, source)
        for port in _candidates(lo, hi, lambda: _BUSY in skipped.values()):
            if len(ports) == n or tried >= attempts:
                break
            tried += 1
            if port in ports:
                continue
            fd = _lock(dirfd, str(port), path, source)
            if isinstance(fd, str):
                skipped[port] = fd
            elif not _bindable(port):
                _unlock(dirfd, str(port), fd)
                skipped[port] = "unbindable"
            else:
                ports.append(port)
                fds.append(fd)
                skipped.pop(port, None)
        if len(ports) < n:
            why = list(skipped.values())
            raise RuntimeError(
                f"could not reserve {n} free ports in [{lo}, {hi}) ({tried} tries): of the ports "
                f"tried, {why.count(_BUSY)} were held by other runs, {why.count('unbindable')} "
                f"in use by other programs, and {why.count(_FOREIGN)} had another user's lock "
                f"file (or something that is not a lock file) in {path}")
    except BaseException:
        PortReservation(ports, fds, dirfd, path).close()
        raise
    return PortReservation(ports, fds, dirfd, path)
