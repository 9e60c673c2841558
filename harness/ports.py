"""Choosing the ports a cluster listens on.

Two pytest processes side by side (``pytest -n 2``) must never hand the same
port to two clusters, and a port must stay ours between choosing it and the
worker's gRPC server binding it.  Binding to port 0 and closing does not give
that: the kernel may hand the port to anyone the moment it is closed, and it
comes from the ephemeral range that every outgoing connection (including the
workers' own gRPC clients) draws from.

So a port is taken only when all three hold:

* it lies below the kernel's ephemeral range (``ip_local_port_range``), so no
  outgoing connection is ever given it;
* this process holds an exclusive ``flock`` on ``<tmp>/pytest-mwms-ports/<port>``;
  the lock is released when the reservation is closed or the process dies,
  even by SIGKILL, so a crashed pytest never leaks reservations;
* a test ``bind`` on all interfaces succeeds (TensorFlow's server binds
  ``*:PORT``), so a port some unrelated program uses is skipped.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import random
import socket
import tempfile
from typing import List

LOCK_DIR = os.path.join(tempfile.gettempdir(), "pytest-mwms-ports")
DEFAULT_RANGE = (20000, 32768)


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_range() -> tuple[int, int]:
    """The half-open range ``[lo, hi)`` ports are drawn from."""
    lo, hi = DEFAULT_RANGE
    hi = min(hi, _ephemeral_start())
    if hi - lo < 1000:  # an unusual kernel setting: fall back to a low band
        lo, hi = 15000, 20000
    return lo, hi


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


class PortReservation:
    """N ports held for one cluster; ``close()`` gives them back."""

    def __init__(self, ports: List[int], lock_fds: List[int]):
        self.ports = ports
        self._lock_fds = lock_fds

    def close(self) -> None:
        for fd in self._lock_fds:
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the descriptor drops the flock
        self._lock_fds = []

    def __enter__(self) -> "PortReservation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PortReservation({self.ports})"


def reserve_ports(n: int, attempts: int = 2000) -> PortReservation:
    """Reserve ``n`` distinct free ports; raise ``RuntimeError`` if it can't."""
    os.makedirs(LOCK_DIR, exist_ok=True)
    lo, hi = port_range()
    rng = random.SystemRandom()
    ports: List[int] = []
    fds: List[int] = []
    try:
        for _ in range(attempts):
            if len(ports) == n:
                break
            port = rng.randrange(lo, hi)
            if port in ports:
                continue
            fd = os.open(os.path.join(LOCK_DIR, str(port)), os.O_CREAT | os.O_RDWR, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    continue
                raise
            if not _bindable(port):
                os.close(fd)
                continue
            ports.append(port)
            fds.append(fd)
        if len(ports) < n:
            raise RuntimeError(f"could not reserve {n} free ports in [{lo}, {hi})")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return PortReservation(ports, fds)
