"""The progress record and collective ledger a worker keeps, where its parent
can read it at any moment: a ring of fixed-size records in a memory-mapped file.

Why shared memory.  A worker reports every step boundary, every call of a
``tf.function`` that launches collectives, and (at ``ledger="collectives"``)
every collective launched and completed.  Sending each over the pipe would
wake the parent for every one of them, and on a small machine the parent
then competes with the workers for the CPU.  Written here, a record costs
the worker a ``struct.pack_into`` and the parent nothing until it looks:
when its hang timer is due, when a rare event arrives on the pipe, and at
the end of the run.  The map is readable even when the worker is stopped
(SIGSTOP), wedged inside C++, or dead, which is when it matters most: it is
the worker's flight recorder, like PyTorch's NCCL flight recorder.

Layout (little-endian).  A header, then ``capacity`` records of
:data:`RECORD` each::

    header: magic u32, version u32, written u64, read u64, nudged u64
    record: kind u8, pad[3], function i32, number i64, detail i64, time f64

``written`` counts the records the worker has written (record ``i`` lives in
slot ``i % capacity``); ``read`` is how far the parent has read.  The
worker writes a record, then publishes it by storing ``written``; on x86-64
and ARM64 Linux an aligned 8-byte store is single-copy atomic and the
stores of one thread reach another process's view of the map in order (on
ARM64, Python's own locks give the barrier).  When the parent falls half a
ring behind, the worker nudges it over the pipe (:data:`protocol.DRAIN`), so
records are lost only when the parent is stuck; a reader counts them.

``time`` is ``time.monotonic()``: on Linux one clock for every process of
the machine, so the parent compares it with its own directly.

The interface is small (:class:`Writer` in the worker, :class:`Reader` in
the parent) so that a remote backend can carry the same records another way.
Nothing here imports TensorFlow.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import mmap
import os
import struct
import threading
import time
from typing import Callable, List, Optional, Tuple

MAGIC = 0x4D574D53   # "MWMS"
VERSION = 1
HEADER = struct.Struct("<IIQQQ")
RECORD = struct.Struct("<B3xiqqd")
_WRITTEN_AT = 8      # offset of ``written`` in the header
_READ_AT = 16
HEADER_SIZE = 64
DEFAULT_CAPACITY = 1 << 16   # 2 MiB of records per worker

# Record kinds.  ``function`` is the id of a traced function (see
# FunctionInfo), or -1.  ``number`` and ``detail`` depend on the kind:
STEP = 1             # number: the step number
CALL_BEGAN = 2       # number: call number of that function (from 1); detail: the step, or -1
CALL_ENDED = 3       # number: call number; detail: CALL_RETURNED, CALL_RAISED or CALL_NOT_RUN
COLLECTIVE_LAUNCHED = 4   # number: call number; detail: the collective's index in the function
COLLECTIVE_DONE = 5       # number: call number; detail: the index
CALL_SITE = 6        # number: call number; detail: the id of the user's line that made it
# A parameter-server cluster's coordinator: a function it scheduled has run
# on a worker, its result not yet fetched.  number: the step it was
# scheduled at; detail: the worker's index among the cluster's workers.
RAN = 7
KIND_NAMES = {STEP: "step", CALL_BEGAN: "call_began", CALL_ENDED: "call_ended",
              COLLECTIVE_LAUNCHED: "collective_launched", COLLECTIVE_DONE: "collective_done",
              CALL_SITE: "call_site", RAN: "ran"}
NO_STEP = -1
CALL_RETURNED, CALL_RAISED, CALL_NOT_RUN = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class Record:
    """One record, decoded: ``time`` is the worker's ``time.monotonic()``."""

    kind: int
    function: int
    number: int
    detail: int
    time: float


def create(path: str, capacity: int = DEFAULT_CAPACITY) -> None:
    """Make the file a worker will write its records to: 0600, zero-filled,
    with its header.  The parent makes it, so it exists (and can be read)
    whatever becomes of the worker.  Its blocks are allocated now: a sparse
    file on a file system that fills up later would kill the worker writing
    into its map with SIGBUS, to be read as the worker's crash.  A full file
    system raises ``OSError`` (ENOSPC) here instead, and leaves no file."""
    size = HEADER_SIZE + capacity * RECORD.size
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        _allocate(fd, size)
        os.pwrite(fd, HEADER.pack(MAGIC, VERSION, 0, 0, 0), 0)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)


def _allocate(fd: int, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, size)   # a file system with no fallocate: sparse, as before


def _map(path: str, writable: bool = True) -> Tuple[mmap.mmap, int]:
    fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size < HEADER_SIZE:
            raise ValueError(f"{path}: {size} bytes, shorter than a progress file's header")
        view = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
    finally:
        os.close(fd)
    magic, version, *_ = HEADER.unpack_from(view, 0)
    if magic != MAGIC or version != VERSION:
        view.close()
        raise ValueError(f"{path}: not a pytest-mwms progress file of version {VERSION}")
    return view, (size - HEADER_SIZE) // RECORD.size


class Writer:
    """The worker's end: appends records; safe to use from any thread (eager
    collectives run in TensorFlow's thread pool)."""

    def __init__(self, path: str, nudge: Optional[Callable[[], None]] = None):
        self._view, self._capacity = _map(path)
        self._lock = threading.Lock()
        self._written = 0
        self._nudge = nudge
        self._half = max(1, self._capacity // 2)

    def write(self, kind: int, function: int = -1, number: int = 0, detail: int = 0) -> None:
        self.copy(kind, function, number, detail, time.monotonic())

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def written(self) -> int:
        """Records written so far."""
        return self._written

    def unread(self) -> int:
        """Records written that the reader has not taken yet."""
        read, = struct.unpack_from("<Q", self._view, _READ_AT)
        return self._written - read

    def copy(self, kind: int, function: int, number: int, detail: int, at: float) -> None:
        """Append a record made elsewhere, at its time ``at`` (:mod:`harness.launch.ray.link`)."""
        with self._lock:
            i = self._written
            RECORD.pack_into(self._view, HEADER_SIZE + (i % self._capacity) * RECORD.size,
                             kind, function, number, detail, at)
            self._written = i + 1
            struct.pack_into("<Q", self._view, _WRITTEN_AT, i + 1)
            if self._nudge is not None and (i + 1) % self._half == 0:
                read, = struct.unpack_from("<Q", self._view, _READ_AT)
                if i + 1 - read >= self._half:
                    self._nudge()


class Reader:
    """The parent's end: hands out each record once, in order."""

    def __init__(self, path: str, writable: bool = True):
        """``writable=False`` reads a file no worker writes any more (the
        recorder's, gathered from a job): it records nothing in it."""
        self._view, self._capacity = _map(path, writable)
        self._writable = writable
        self._read = 0
        self.lost = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    def written(self) -> int:
        return struct.unpack_from("<Q", self._view, _WRITTEN_AT)[0]

    def drain(self) -> List[Record]:
        """Every record written since the last call (what a slow reader lost
        is counted in ``lost``)."""
        end = self.written()
        start = self._read
        if end - start > self._capacity:
            self.lost += end - self._capacity - start
            start = end - self._capacity
        out = []
        for i in range(start, end):
            kind, function, number, detail, t = RECORD.unpack_from(
                self._view, HEADER_SIZE + (i % self._capacity) * RECORD.size)
            out.append(Record(kind, function, number, detail, t))
        self._read = end
        if self._writable:
            struct.pack_into("<Q", self._view, _READ_AT, end)
        return out

    def close(self) -> None:
        try:
            self._view.close()
        except (BufferError, ValueError):
            pass
