"""Choosing the ports a cluster listens on, safely on a machine many users share.

Two pytest processes side by side (``pytest -n 2``), of one user or of
several, must never hand the same port to two clusters, and a port must stay
ours between choosing it and the worker's gRPC server binding it.  Binding to
port 0 and closing does not give that: the kernel may hand the port to anyone
the moment it is closed, and it comes from the ephemeral range that every
outgoing connection (including the workers' own gRPC clients) draws from.

So a port is taken only when all of these hold:

* it lies below the kernel's ephemeral range (``ip_local_port_range``), so no
  outgoing connection is ever given it;
* this process holds the port's claim, an abstract Unix socket name
  (:func:`_claim`), which the kernel gives one process of any user at a
  time and takes back when it dies, even by SIGKILL, so a crashed pytest
  never leaks reservations and nobody can squat one with files;
* it holds an exclusive ``flock`` on the lock file ``<state dir>/<port>``
  where that is a regular file it owns or can make (what older versions of
  the harness go by); another user's file under that name, or a full
  directory, leaves the port to the claim alone;
* a test ``bind`` on all interfaces succeeds (TensorFlow's server binds
  ``*:PORT``), so a port some unrelated program uses is skipped.

The lock files live in the state directory (:mod:`harness.launch.state_dir`).
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
import time
from typing import Callable, Dict, Iterator, List, Optional, Set, Tuple, Union

from harness.errors import PortsUnavailableError
from harness.launch.state_dir import FILE_MODE, open_state_dir, resolve_state_dir, state_dir_error

DEFAULT_RANGE = (20000, 32768)


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


def bindable(port: int, reuse_address: bool = False) -> bool:
    """Whether a server could bind ``port`` on every interface now; with
    ``reuse_address``, as TensorFlow's server binds (``SO_REUSEADDR``: a port
    left in TIME_WAIT counts as free, one something listens on does not)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if reuse_address:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


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


def _lock(dirfd: int, name: str, path: str, source: str,
          create: bool = True) -> Union[int, str]:
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
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    return _FOREIGN  # a full directory: the claim alone holds the port
                raise state_dir_error(
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
# Claims: the kernel's own exclusive names

CLAIM_PREFIX = b"\0pytest-mwms-port-"


def _claim(port: int) -> Optional[socket.socket]:
    """Bind the abstract Unix socket name of ``port``: a socket holding the
    claim, or None when some process (of any user) holds it.

    The name is the kernel's, not a file's: nobody can squat it without a
    live process holding a socket per port (as they could bind the ports
    themselves), it needs no directory, and it goes with its holder, even on
    SIGKILL.  Abstract names are per network namespace, as ports are.
    """
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.bind(CLAIM_PREFIX + str(port).encode())
    except OSError as e:
        s.close()
        if e.errno == errno.EADDRINUSE:
            return None
        raise
    return s


# --------------------------------------------------------------------------
# Reservations

def _candidates(lo: int, hi: int, wait: Callable[[], bool]) -> Iterator[int]:
    """Ports of ``[lo, hi)`` in random order, pass after pass; between two
    passes, a millisecond's pause when ``wait()`` (some port was held)."""
    rng = random.Random(os.urandom(16))
    while True:
        seen: Set[int] = set()
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
                 path: str = "", claims: Optional[List[socket.socket]] = None):
        self.ports = ports
        self.path = path
        self._lock_fds = lock_fds
        self._dir_fd = dir_fd
        self._claims = claims or []

    def close(self) -> None:
        fds, self._lock_fds = self._lock_fds, []
        for port, fd in zip(self.ports, fds):
            if fd < 0:
                continue   # its name was another user's file: the claim alone held it
            if self._dir_fd >= 0:
                _unlock(self._dir_fd, str(port), fd)
            else:
                with contextlib.suppress(OSError):
                    os.close(fd)
        claims, self._claims = self._claims, []
        for claim in claims:
            claim.close()
        if self._dir_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._dir_fd)
            self._dir_fd = -1

    def __enter__(self) -> PortReservation:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PortReservation({self.ports})"


def reserve_ports(n: int, attempts: int = 2000, *, state_dir: Optional[str] = None,
                  port_range: Optional[Tuple[int, int]] = None,
                  tempdir: Optional[str] = None) -> PortReservation:
    """Reserve ``n`` distinct free ports.

    ``state_dir``: the directory the lock files live in (else
    ``$MWMS_STATE_DIR``, else the default; see the module docstring).
    ``tempdir``: the machine's temp directory the default is in, for a
    process whose own ``tempfile.tempdir`` was moved (a Ray agent's).
    ``port_range``: the half-open ``(lo, hi)`` to draw from, instead of the
    one below the ephemeral range.  At most ``attempts`` ports are tried.
    Raises :class:`~harness.errors.StateDirError` when the directory cannot be
    used safely, :class:`~harness.errors.PortsUnavailableError` when too few
    ports are free.
    """
    lo, hi = port_range if port_range is not None else _system_port_range()
    if not 0 < lo < hi <= 65536:
        raise ValueError(f"port_range must be (lo, hi) with 0 < lo < hi <= 65536, not {(lo, hi)}")
    if n > hi - lo:
        raise ValueError(f"cannot reserve {n} ports in [{lo}, {hi}): it has only {hi - lo}")
    path, source = resolve_state_dir(state_dir, tempdir)
    dirfd = open_state_dir(path, source)
    ports: List[int] = []
    fds: List[int] = []
    claims: List[socket.socket] = []
    skipped: Dict[int, str] = {}  # port -> why, as last seen
    tried = 0
    try:
        _sweep(dirfd, path, source)
        for port in _candidates(lo, hi, lambda: _BUSY in skipped.values()):
            if len(ports) == n or tried >= attempts:
                break
            tried += 1
            if port in ports:
                continue
            claim = _claim(port)
            if claim is None:
                skipped[port] = _BUSY
                continue
            fd = _lock(dirfd, str(port), path, source)
            if fd == _BUSY or (fd != _FOREIGN and not bindable(port)):
                if isinstance(fd, int):
                    _unlock(dirfd, str(port), fd)
                claim.close()
                skipped[port] = _BUSY if fd == _BUSY else "unbindable"
                continue
            if fd == _FOREIGN and not bindable(port):
                claim.close()
                skipped[port] = "unbindable"
                continue
            # Another user's file under the port's name (planted, or of a
            # killed run) cannot lock anyone out: the claim holds the port.
            ports.append(port)
            fds.append(fd if isinstance(fd, int) else -1)
            claims.append(claim)
            skipped.pop(port, None)
        if len(ports) < n:
            why = list(skipped.values())
            raise PortsUnavailableError(
                f"could not reserve {n} free ports in [{lo}, {hi}) ({tried} tries): of the ports "
                f"tried, {why.count(_BUSY)} were held by other runs and "
                f"{why.count('unbindable')} in use by other programs")
    except BaseException:
        PortReservation(ports, fds, dirfd, path, claims).close()
        raise
    return PortReservation(ports, fds, dirfd, path, claims)
