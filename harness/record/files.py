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

import dataclasses
import glob
import json
import math
import os
import re
import socket
import time
from typing import List, Optional, Tuple

from harness.core import progress
from harness.errors import RecordFormatError

FORMAT = "pytest-mwms-record"
VERSION = 1

META, PROGRESS, EVENTS, STACKS, WATCH = (".meta.json", ".progress", ".events.jsonl",
                                         ".stacks.txt", ".watch.jsonl")

# The recorder's own event kinds, beside the protocol's.
DUMP, EXIT = "dump", "exit"
RETURNED, RAISED, EXITED = "returned", "raised", "exit"


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

@dataclasses.dataclass(frozen=True)
class TaskFiles:
    """One process's files, read back.  ``records`` are its progress map's
    (the latest, when the ring went round: ``overwritten`` says how many
    were lost), ``events`` and ``watch`` its lines as dicts, ``stacks`` the
    stack file's text."""

    stem: str
    folder: str
    meta: dict
    records: Tuple[progress.Record, ...]
    overwritten: int
    events: Tuple[dict, ...]
    stacks: str
    watch: Tuple[dict, ...]

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


def _read_meta(path: str) -> dict:
    try:
        with open(path) as f:
            meta = json.load(f)
    except ValueError as e:
        raise RecordFormatError(f"{path}: torn or not a recorder's file ({e})") from None
    except OSError as e:
        raise RecordFormatError(f"{path}: cannot be read ({e.strerror})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise RecordFormatError(f"{path}: not a pytest-mwms recorder's file")
    if meta.get("version") != VERSION:
        raise RecordFormatError(f"{path}: written by another version of the recorder "
                                f"(format version {meta.get('version')!r}; this one reads "
                                f"{VERSION})")
    clock = meta.get("clock")
    if not (isinstance(clock, dict) and all(isinstance(clock.get(k), (int, float))
                                            for k in ("wall", "monotonic"))):
        raise RecordFormatError(f"{path}: no clock pair (\"clock\": wall and monotonic)")
    return meta


def _read_lines(path: str, required: bool = True) -> Tuple[dict, ...]:
    if not os.path.exists(path):
        if required:
            raise RecordFormatError(f"{path}: missing (its task's other files are here)")
        return ()
    out = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            try:
                obj = json.loads(line)
            except ValueError:
                raise RecordFormatError(f"{path}: line {number} is torn or not JSON") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("time", 0.0), (int, float)):
                raise RecordFormatError(f"{path}: line {number} is not a recorder's event")
            out.append(obj)
    return tuple(out)


# The size of every progress file the recorder writes: one torn short (a
# copy cut off) would read slots past its end as records.
PROGRESS_SIZE = progress.HEADER_SIZE + progress.DEFAULT_CAPACITY * progress.RECORD.size


def _read_progress(path: str) -> Tuple[Tuple[progress.Record, ...], int]:
    if not os.path.exists(path):
        raise RecordFormatError(f"{path}: missing (its task's other files are here)")
    size = os.path.getsize(path)
    if size != PROGRESS_SIZE:
        raise RecordFormatError(f"{path}: torn or not a progress map ({size} bytes, not the "
                                f"{PROGRESS_SIZE} of the recorder's)")
    try:
        reader = progress.Reader(path, writable=False)
    except (ValueError, OSError) as e:
        raise RecordFormatError(f"{path}: torn or not a progress map ({e})") from None
    try:
        records = tuple(reader.drain())
        lost = reader.lost
    finally:
        reader.close()
    bad = next((r for r in records if r.kind not in progress.KIND_NAMES
                or not math.isfinite(r.time)), None)
    if bad is not None:
        raise RecordFormatError(f"{path}: torn or not a progress map (a record of kind "
                                f"{bad.kind} at time {bad.time})")
    return records, lost


def read_task(meta_path: str) -> TaskFiles:
    """One task's files, from its meta file's path; a missing, torn or
    foreign file is a :class:`RecordFormatError` naming it."""
    meta = _read_meta(meta_path)
    base = meta_path[: -len(META)]
    records, overwritten = _read_progress(base + PROGRESS)
    events = _read_lines(base + EVENTS)
    watch = _read_lines(base + WATCH, required=False)
    try:
        with open(base + STACKS, errors="replace") as f:
            stacks = f.read()
    except OSError:
        stacks = ""
    return TaskFiles(os.path.basename(base), os.path.dirname(meta_path), meta, records,
                     overwritten, events, stacks, watch)


def read_dirs(folders: List[str]) -> Tuple[List[TaskFiles], List[str]]:
    """Every task's files in ``folders`` (one, or one per host), and a line
    for each folder or file that could not be read."""
    tasks, problems = [], []
    for folder in folders:
        if not os.path.isdir(folder):
            problems.append(f"{folder}: " + ("not a directory" if os.path.exists(folder)
                                             else "no such directory"))
            continue
        metas = sorted(glob.glob(os.path.join(glob.escape(folder), "*" + META)))
        if not metas:
            problems.append(f"{folder}: no recorder's files in it (no *{META})")
        for m in metas:
            try:
                tasks.append(read_task(m))
            except RecordFormatError as e:
                problems.append(str(e))
    return tasks, problems


def now_pair() -> dict:
    """The clock pair of a meta file."""
    return {"wall": time.time(), "monotonic": time.monotonic()}
