"""The process beside a recorded job's process that watches it from outside.

``python -m harness.record.watcher PID BASE [REASON=FD ...]``: every
:data:`LOOK_EVERY` seconds it reads ``/proc/PID/stat`` and appends a line to
``BASE.watch.jsonl`` (:mod:`harness.record.files`) when what it sees
changes: ``stopped`` (SIGSTOP: the job cannot say so itself), ``running``
again, or ``ended``, with the exit status when it caught the process
before its parent reaped it (else null).  It then exits: it never
outlives the job by more than a look.

Each ``REASON=FD`` is the read end of a pipe that ``faulthandler`` writes a
dump into, from C, when the job gets that signal (SIGUSR2, SIGTERM).  The
watcher copies each dump into ``BASE.stacks.txt`` after a header line
(``--- dump: SIGTERM ---``), as one write under the file's lock, and notes
it in ``BASE.events.jsonl``: the job's own process cannot, when the signal
is about to end it (SIGTERM's default), or while its main thread is
blocked.  A job ended right after the signal leaves the dump in the pipe,
read here after the end.

Its own session, and SIGINT and SIGTERM ignored, keep it watching while
the job's process group is told to stop.  Standard library only.
"""
from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import sys
import time
from typing import Dict, List, Optional, Tuple

LOOK_EVERY = 0.2
# A dump that faulthandler writes in pieces is whole once its pipe has been
# quiet this long.
DUMP_SETTLES = 0.05
STACKS, EVENTS, WATCH = ".stacks.txt", ".events.jsonl", ".watch.jsonl"


def read_stat(pid: int) -> Optional[Tuple[str, int, Optional[int]]]:
    """(state letter, start time in clock ticks, exit status or None) of
    ``pid``; None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    status = None
    if fields[0] == "Z" and len(fields) >= 50:
        try:
            status = wait_status_code(int(fields[49]))
        except ValueError:
            status = None
    return fields[0], int(fields[19]), status


def wait_status_code(status: int) -> int:
    """A wait status as ``multiprocessing`` gives an exit code: negative
    for death by a signal."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def state_of(stat: Optional[Tuple[str, int, Optional[int]]], started: int) -> str:
    if stat is None or stat[1] != started or stat[0] in ("Z", "X", "x"):
        return "ended"
    return "stopped" if stat[0] in ("T", "t") else "running"


def append_dump(base: str, reason: str, text: bytes, at: float) -> None:
    """``text`` into the stack file after its header, as one write under the
    file's lock (the job's own dumps take it too), and its place in the
    events file."""
    header = f"--- dump: {reason} ---\n".encode()
    fd = os.open(base + STACKS, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        offset = os.fstat(fd).st_size
        os.write(fd, header + text)
    finally:
        os.close(fd)   # and the lock with it
    line = {"kind": "dump", "time": at, "step": None,
            "data": {"reason": reason, "offset": offset, "length": len(header) + len(text)}}
    fd = os.open(base + EVENTS, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def _read_dump(fd: int, settle: float) -> Tuple[bytes, bool]:
    """What the pipe holds until it has been quiet ``settle`` s; and
    whether its writer is gone (end of file)."""
    chunks: List[bytes] = []
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            data = None
        if data == b"":
            return b"".join(chunks), True
        if data:
            chunks.append(data)
            continue
        if not select.select([fd], [], [], settle)[0]:
            return b"".join(chunks), False


def copy_dumps(base: str, pipes: Dict[int, str], timeout: float) -> Dict[int, str]:
    """Wait up to ``timeout`` s for a dump in any of ``pipes`` (fd ->
    reason) and copy what came; the pipes still open."""
    if not pipes:
        time.sleep(timeout)
        return pipes
    ready, _, _ = select.select(list(pipes), [], [], timeout)
    for fd in ready:
        at = time.monotonic()
        text, gone = _read_dump(fd, DUMP_SETTLES)
        if text:
            append_dump(base, pipes[fd], text, at)
        if gone:
            os.close(fd)
            pipes = {k: v for k, v in pipes.items() if k != fd}
    return pipes


def watch(pid: int, base: str, pipes: Optional[Dict[int, str]] = None) -> None:
    pipes = dict(pipes or {})
    for fd in pipes:
        os.set_blocking(fd, False)
    first = read_stat(pid)
    if first is None:
        return
    started = first[1]
    seen = "running"
    with open(base + WATCH, "a") as out:
        while True:
            stat = read_stat(pid)
            state = state_of(stat, started)
            if state == "ended":
                # The dump a signal wrote just before the end is still in its pipe.
                pipes = copy_dumps(base, pipes, 0.0)
            if state != seen:
                line = {"state": state, "time": time.monotonic()}
                if state == "ended":
                    line["exit_code"] = stat[2] if stat is not None and stat[1] == started else None
                out.write(json.dumps(line) + "\n")
                out.flush()
                seen = state
            if state == "ended":
                return
            pipes = copy_dumps(base, pipes, LOOK_EVERY)


def parse_pipes(words) -> Dict[int, str]:
    """``REASON=FD`` words as {fd: reason}."""
    out = {}
    for word in words:
        reason, _, fd = word.partition("=")
        out[int(fd)] = reason
    return out


def main(argv) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    watch(int(argv[0]), argv[1], parse_pipes(argv[2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
