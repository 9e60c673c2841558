"""The recorder's files: what each task of a job writes, and reading them back.

Each task (one process of the job) writes four files into the directory it
was given, all named ``STEM.*`` with ``STEM`` = ``TYPE-INDEX.HOST.PID``
(``worker-1.node-b.4242``), so that the directories of every host can be
gathered into one without a clash, and a restarted task's files sit beside
its earlier process's:

``STEM.meta.json``
    Written once, at start: ``{"format": FORMAT, "version": VERSION,
    "task": {"type", "index"}, "host", "pid", "clock": {"wall", "monotonic"},
    "tf_config", "timeout", "harness"}``.  ``clock`` pairs ``time.time()``
    with ``time.monotonic()`` read together: every other time in the files
    is on the monotonic clock, and this pair puts it on the wall clock.
``STEM.progress``
    The progress map of :mod:`harness.core.progress`: step boundaries and
    calls of collective-launching functions, a ring of the latest 65536.
``STEM.events.jsonl``
    One JSON object per line, ``{"kind", "time", "step", "data"}``
    (``time`` monotonic): the messages a worker sends the harness's parent
    (:class:`harness.core.protocol.Kind`), and the recorder's own:
    ``dump`` (``data``: ``reason``, and where in the stack file the dump
    is, ``offset`` and ``length``) and ``exit`` (``data``: ``how``, one of
    ``returned``, ``raised``, ``exit``; ``status``, the exit status when
    known; ``error`` for ``raised``).
``STEM.stacks.txt``
    Every thread's Python stack at each dump (``faulthandler``'s text),
    and a fatal signal's report ("Fatal Python error: Segmentation fault").
``STEM.watch.jsonl``
    Written by a small process beside the task that watches it from
    outside (:mod:`harness.record.watcher`): ``{"state", "time"}`` lines
    as it sees the task ``stopped`` (SIGSTOP), ``running`` again, or
    ``ended`` (``exit_code`` when it saw it).

Nothing here imports TensorFlow.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import socket
import stat
import time
from typing import Iterator, List, Optional, Tuple

from harness.core import progress
from harness.errors import RecordFormatError
from harness.record import checks

FORMAT = "pytest-mwms-record"
VERSION = 1

META, PROGRESS, EVENTS, STACKS, WATCH = (".meta.json", ".progress", ".events.jsonl",
                                         ".stacks.txt", ".watch.jsonl")

# The recorder's own event kinds, beside the protocol's, and how its main ended.
DUMP, EXIT = checks.DUMP, checks.EXIT
RETURNED, RAISED, EXITED = checks.RETURNED, checks.RAISED, checks.EXITED


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text) or "_"


def task_of(tf_config: Optional[dict]) -> Tuple[str, Optional[int]]:
    """(type, index) of this process's task in ``TF_CONFIG``; ("task", None)
    when it has none (the stem then says ``task-pidPID``)."""
    try:
        task = (tf_config or {})["task"]
        return str(task["type"]), int(task["index"])
    except (TypeError, KeyError, ValueError):
        return "task", None


def stem(tf_config: Optional[dict], host: str, pid: int) -> str:
    kind, index = task_of(tf_config)
    task = f"{_safe(kind)}-{index}" if index is not None else f"task-pid{pid}"
    return f"{task}.{_safe(host)}.{pid}"


def hostname() -> str:
    return socket.gethostname()


def write_meta(path: str, meta: dict) -> None:
    """Write the meta file whole or not at all (a rename)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(tmp, path)


class Lines:
    """A JSON-lines file appended to from any thread, one ``os.write`` a
    line (``O_APPEND``), so a process killed between two lines leaves no
    torn one."""

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)

    def write(self, obj: dict) -> None:
        data = (json.dumps(obj, default=_plain) + "\n").encode()
        try:
            os.write(self._fd, data)
        except OSError:
            pass    # a full disk never fails the job

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass


def _plain(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return repr(value)


# ---------------------------------------------------------------- reading
#
# A recording comes from wherever the user gathered it, so it is read as
# untrusted input: only regular files directly in the directory (never a
# link, a FIFO, a device), each read bounded by what its kind can hold, and
# every value checked (harness.record.checks) before the analyzer sees it.
# Anything else is a RecordFormatError naming the file.

# The size of every progress file the recorder writes: one torn short (a
# copy cut off) would read slots past its end as records.
PROGRESS_SIZE = progress.HEADER_SIZE + progress.DEFAULT_CAPACITY * progress.RECORD.size

# The most each kind of file is read of.  A meta file is a few KiB (its
# TF_CONFIG's cluster the most of it); events are a few lines per traced
# function and collective, plus one a dump; the watcher writes a line a
# change of state; the stack file grows a dump at a time without end, so
# only its latest bytes are read (the dumps before them are out of reach).
LIMITS = {META: 1 << 20, PROGRESS: PROGRESS_SIZE, EVENTS: 8 << 20, WATCH: 4 << 20,
          STACKS: 16 << 20}
# And the most lines of a lines file, and JSON values of a JSON file: each
# value is an object in memory, tens of times its bytes, so a file of short
# lines or tiny values within the byte limit alone could take GiBs.
MAX_LINES = {EVENTS: 1 << 16, WATCH: 1 << 16}
MAX_VALUES = 1 << 19
# A progress record's integers, as the recorder writes them.
_RECORD_FIELDS = (("function", -1, 2 ** 31 - 1), ("number", -1, checks.COUNT_MAX),
                  ("detail", -1, checks.COUNT_MAX))
# A stem as files.stem makes it (_safe's characters).
_STEM = re.compile(r"[A-Za-z0-9_.-]+")


@dataclasses.dataclass(frozen=True)
class TaskFiles:
    """One process's files, read back.  ``records`` are its progress map's
    (the latest, when the ring went round: ``overwritten`` says how many
    were lost), ``events`` and ``watch`` its lines as dicts, ``stacks`` the
    stack file's text from byte ``stacks_from`` on (its last
    ``LIMITS[STACKS]`` bytes; undecodable bytes kept as surrogates, so that
    its offsets hold)."""

    stem: str
    folder: str
    meta: dict
    records: Tuple[progress.Record, ...]
    overwritten: int
    events: Tuple[dict, ...]
    stacks: str
    watch: Tuple[dict, ...]
    stacks_from: int = 0

    @property
    def task(self) -> Tuple[str, Optional[int]]:
        kind, index = task_of(self.meta.get("tf_config"))
        if index is None:   # no TF_CONFIG at start: the one its strategy saw
            for e in self.events:
                if e.get("kind") == "strategy_creating" and isinstance(e.get("data"), dict):
                    kind, index = task_of(e["data"].get("tf_config"))
        return kind, index

    def to_wall(self, t: float) -> float:
        """A time of these files (monotonic) on their host's wall clock."""
        clock = self.meta["clock"]
        return t + clock["wall"] - clock["monotonic"]


class _Missing(Exception):
    pass


def _read(folder: int, path: str, kind: str, tail: bool = False) -> Tuple[bytes, int]:
    """The bytes of ``path`` (its name in the directory open as
    ``folder``) and the offset they start at: a regular file only, opened
    without following a link or waiting on a FIFO, read up to
    ``LIMITS[kind]`` (its last bytes with ``tail``; else a longer file is
    refused).  :class:`_Missing` when there is none."""
    name, limit = os.path.basename(path), LIMITS[kind]
    try:
        if not stat.S_ISREG(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
            raise RecordFormatError(f"{path}: not a regular file ({_file_type(name, folder)}); "
                                    f"the analyzer reads only the recorder's own files")
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                     | os.O_CLOEXEC, dir_fd=folder)
    except FileNotFoundError:
        raise _Missing() from None
    except OSError as e:
        raise RecordFormatError(f"{path}: cannot be read ({e.strerror})") from None
    try:
        info = os.fstat(fd)    # what was opened, if the name changed since
        if not stat.S_ISREG(info.st_mode):
            raise RecordFormatError(f"{path}: not a regular file; the analyzer reads only "
                                    f"the recorder's own files")
        if info.st_size > limit and not tail:
            raise RecordFormatError(f"{path}: {info.st_size} bytes, more than a recorder's "
                                    f"{kind} file holds ({limit})")
        start = max(0, info.st_size - limit) if tail else 0
        chunks, got = [], 0
        while got < limit:   # never past the limit, however the file grows
            chunk = os.pread(fd, min(1 << 20, limit - got), start + got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks), start
    except OSError as e:
        raise RecordFormatError(f"{path}: cannot be read ({e.strerror})") from None
    finally:
        os.close(fd)


def _file_type(name: str, folder: int) -> str:
    mode = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
    return next((words for test, words in (
        (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
        (stat.S_ISSOCK, "a socket")) if test(mode)), "not a file")


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number the recorder writes")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is beyond a float")
    return value


def _json(data: bytes):
    """A JSON value, NaN and infinities refused; any error of any kind
    (bad UTF-8, nesting past the parser's depth) a ValueError."""
    try:
        return json.loads(data, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ValueError("nested too deep") from None


def _check_values(path: str, kind: str, data: bytes) -> None:
    """Refuse JSON text of more values than a recorder's file holds,
    before it is parsed: each value needs a comma, a colon or a bracket
    (or a line) of its own, so their count bounds the values'."""
    most = sum(map(data.count, (b",", b":", b"[", b"{"))) + data.count(b"\n")
    if most > MAX_VALUES:
        raise RecordFormatError(f"{path}: about {most} JSON values, more than a recorder's "
                                f"{kind} file holds ({MAX_VALUES})")


def _read_meta(folder: int, path: str) -> dict:
    try:
        data, _ = _read(folder, path, META)
    except _Missing:
        raise RecordFormatError(f"{path}: cannot be read (it is gone)") from None
    _check_values(path, META, data)
    try:
        meta = _json(data)
    except ValueError as e:
        raise RecordFormatError(f"{path}: torn or not a recorder's file ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise RecordFormatError(f"{path}: not a pytest-mwms recorder's file")
    if meta.get("version") != VERSION:
        raise RecordFormatError(f"{path}: written by another version of the recorder "
                                f"(format version {checks.shown(meta.get('version'))}; "
                                f"this one reads {VERSION})")
    try:
        return checks.meta(meta)
    except checks.Bad as e:
        raise RecordFormatError(f"{path}: not a recorder's file ({e})") from None


def _read_lines(folder: int, path: str, check, required: bool = True) -> Tuple[dict, ...]:
    kind = EVENTS if path.endswith(EVENTS) else WATCH
    try:
        data, _ = _read(folder, path, kind)
    except _Missing:
        if required:
            raise RecordFormatError(f"{path}: missing (its task's other files are here)") from None
        return ()
    lines = data.splitlines()
    if len(lines) > MAX_LINES[kind]:
        raise RecordFormatError(f"{path}: {len(lines)} lines, more than a recorder's {kind} "
                                f"file holds ({MAX_LINES[kind]})")
    _check_values(path, kind, data)
    out = []
    for number, line in enumerate(lines, 1):
        try:
            obj = _json(line)
        except ValueError:
            raise RecordFormatError(f"{path}: line {number} is torn or not JSON") from None
        try:
            out.append(check(obj))
        except checks.Bad as e:
            raise RecordFormatError(f"{path}: line {number} is not a recorder's ({e})") from None
    return tuple(out)


def _records(data: bytes) -> Tuple[Tuple[progress.Record, ...], int]:
    """The records of a progress map's bytes, as :class:`progress.Reader`
    drains them (the latest ``capacity`` when the ring went round), and how
    many were lost; ValueError names what is wrong."""
    magic, version, written, _, _ = progress.HEADER.unpack_from(data, 0)
    if magic != progress.MAGIC or version != progress.VERSION:
        raise ValueError(f"not a pytest-mwms progress file of version {progress.VERSION}")
    capacity = progress.DEFAULT_CAPACITY
    if written > checks.COUNT_MAX:
        raise ValueError(f"{written} records written, more than 2**53")
    start = max(0, written - capacity)
    out = []
    for i in range(start, written):
        r = progress.Record(*progress.RECORD.unpack_from(
            data, progress.HEADER_SIZE + (i % capacity) * progress.RECORD.size))
        _check_record(r)
        out.append(r)
    return tuple(out), start


def _check_record(r: progress.Record) -> None:
    if r.kind not in progress.KIND_NAMES:
        raise ValueError(f"a record of kind {r.kind} at time {r.time}")
    try:
        checks.number(r.time, "a record's time")
    except checks.Bad as e:
        raise ValueError(str(e)) from None
    for name, low, high in _RECORD_FIELDS:
        value = getattr(r, name)
        if not low <= value <= high:
            raise ValueError(f"a {progress.KIND_NAMES[r.kind]} record's {name} is {value}, "
                             f"not from {low} to {high}")


def _read_progress(folder: int, path: str) -> Tuple[Tuple[progress.Record, ...], int]:
    try:
        data, _ = _read(folder, path, PROGRESS)
    except _Missing:
        raise RecordFormatError(f"{path}: missing (its task's other files are here)") from None
    if len(data) != PROGRESS_SIZE:
        raise RecordFormatError(f"{path}: torn or not a progress map ({len(data)} bytes, not "
                                f"the {PROGRESS_SIZE} of the recorder's)")
    try:
        return _records(data)
    except ValueError as e:
        raise RecordFormatError(f"{path}: torn or not a progress map ({e})") from None


def _read_stacks(folder: int, path: str) -> Tuple[str, int]:
    try:
        data, start = _read(folder, path, STACKS, tail=True)
    except _Missing:
        return "", 0
    return data.decode(errors="surrogateescape"), start


def read_task(meta_path: str, folder: Optional[int] = None) -> TaskFiles:
    """One task's files, from its meta file's path (its directory open as
    ``folder``, else opened here); a missing, torn or foreign file, or one
    that is not a regular file of the recording, is a
    :class:`RecordFormatError` naming it."""
    if folder is None:
        with _opened(os.path.dirname(meta_path) or ".") as fd:
            return read_task(meta_path, fd)
    stem_ = os.path.basename(meta_path)[: -len(META)]
    if not _STEM.fullmatch(stem_):
        raise RecordFormatError(f"{meta_path}: not a recorder's file name (a recorder's "
                                f"are STEM{META}, STEM of letters, digits, '_', '.', '-')")
    meta = _read_meta(folder, meta_path)
    base = meta_path[: -len(META)]
    records, overwritten = _read_progress(folder, base + PROGRESS)
    events = _read_lines(folder, base + EVENTS, checks.event)
    watch = _read_lines(folder, base + WATCH, checks.watch, required=False)
    stacks, stacks_from = _read_stacks(folder, base + STACKS)
    return TaskFiles(stem_, os.path.dirname(meta_path), meta, records, overwritten, events,
                     stacks, watch, stacks_from)


@contextlib.contextmanager
def _opened(folder: str) -> Iterator[int]:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def read_dirs(folders: List[str]) -> Tuple[List[TaskFiles], List[str]]:
    """Every task's files in ``folders`` (one, or one per host), and a line
    for each folder or file that could not be read."""
    tasks, problems = [], []
    for folder in folders:
        if not os.path.isdir(folder):
            problems.append(f"{folder}: " + ("not a directory" if os.path.exists(folder)
                                             else "no such directory"))
            continue
        try:
            with _opened(folder) as fd:
                names = sorted(n for n in os.listdir(fd) if n.endswith(META))
                if not names:
                    problems.append(f"{folder}: no recorder's files in it (no *{META})")
                for name in names:
                    try:
                        tasks.append(read_task(os.path.join(folder, name), fd))
                    except RecordFormatError as e:
                        problems.append(str(e))
        except OSError as e:
            problems.append(f"{folder}: cannot be read ({e.strerror})")
    return tasks, problems


def now_pair() -> dict:
    """The clock pair of a meta file."""
    return {"wall": time.time(), "monotonic": time.monotonic()}
