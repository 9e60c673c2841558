"""The process beside a recorded job's process that watches it from outside.

``python -m harness.record.watcher PID PATH``: every :data:`LOOK_EVERY`
seconds it reads ``/proc/PID/stat`` and appends a line to ``PATH`` (the
task's ``.watch.jsonl``, :mod:`harness.record.files`) when what it sees
changes: ``stopped`` (SIGSTOP: the job cannot say so itself), ``running``
again, or ``ended``, with the exit status when it caught the process
before its parent reaped it (else null).  It then exits: it never
outlives the job by more than a look.  Its own session, and SIGINT and
SIGTERM ignored, keep it watching while the job's process group is told
to stop.  Standard library only.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Optional, Tuple

LOOK_EVERY = 0.2


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


def watch(pid: int, path: str) -> None:
    first = read_stat(pid)
    if first is None:
        return
    started = first[1]
    seen = "running"
    with open(path, "a") as out:
        while True:
            stat = read_stat(pid)
            state = state_of(stat, started)
            if state != seen:
                line = {"state": state, "time": time.monotonic()}
                if state == "ended":
                    line["exit_code"] = stat[2] if stat is not None and stat[1] == started else None
                out.write(json.dumps(line) + "\n")
                out.flush()
                seen = state
            if state == "ended":
                return
            time.sleep(LOOK_EVERY)


def main(argv) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    watch(int(argv[0]), argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
