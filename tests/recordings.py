"""Valid recordings written by hand, file by file, in the recorder's format
(harness.record.files): for the analyzer's tests, without a Recorder (no
TF_CONFIG in the environment, no watcher) and without TensorFlow."""
from __future__ import annotations

import json
import os
from typing import Optional

from harness.core import progress, protocol
from harness.record import files

STACK = """\
Current thread 0x00007f2b6d1f7740 (most recent call first):
  File "/job/train.py", line 23 in train_step
  File "/job/train.py", line 40 in main
"""


def config(i: int, n: int) -> dict:
    return {"cluster": {"worker": [f"host{k}:2222" for k in range(n)]},
            "task": {"type": "worker", "index": i}}


def _line(obj: dict) -> str:
    return json.dumps(obj) + "\n"


def write_task(folder: str, i: int, n: int, calls: int, *, blocked: bool = False,
               end: Optional[str] = None, dump: bool = True, code: Optional[int] = None,
               t0: float = 1000.0) -> str:
    """Worker ``i`` of ``n``'s files in ``folder``: a strategy made at t0,
    ``calls`` calls of `step` (one all-reduce) that ended, one a second
    from t0 + 1, and with ``blocked`` one more that did not; then an exit
    record (``end``: its ``how``) or a "no progress" dump (``dump``), 3 s
    after the last call began; ``code``: the watcher saw it end with it.
    Returns the files' base path (``STEM``)."""
    base = os.path.join(folder, files.stem(config(i, n), "host", 4000 + i))
    files.write_meta(base + files.META, {
        "format": files.FORMAT, "version": files.VERSION,
        "task": {"type": "worker", "index": i}, "host": "host", "pid": 4000 + i,
        "clock": {"wall": t0, "monotonic": t0}, "tf_config": config(i, n), "timeout": 2.0,
        "harness": "test"})
    progress.create(base + files.PROGRESS)
    writer = progress.Writer(base + files.PROGRESS)
    for k in range(calls + blocked):
        at = t0 + 1 + k
        writer.copy(progress.STEP, -1, k, 0, at)
        writer.copy(progress.CALL_BEGAN, 0, k + 1, k, at)
        if k < calls:
            writer.copy(progress.CALL_ENDED, 0, k + 1, progress.CALL_RETURNED, at + 0.01)
    del writer
    last = t0 + calls + blocked + 3
    events = [
        {"kind": protocol.STARTED, "time": t0, "step": None, "data": None},
        {"kind": protocol.STRATEGY_CREATING, "time": t0 + 0.001, "step": None,
         "data": {"tf_config": config(i, n)}},
        {"kind": protocol.STRATEGY_CREATED, "time": t0 + 0.002, "step": None, "data": n},
        {"kind": protocol.LEDGER_FUNCTION, "time": t0 + 0.003, "step": None,
         "data": {"id": 0, "name": "step"}},
        {"kind": protocol.LEDGER_COLLECTIVE, "time": t0 + 0.004, "step": None,
         "data": {"function": 0, "trace": 0, "index": 0, "kind": "all-reduce", "shape": [1],
                  "dtype": "float32", "label": ["dense/kernel"], "timeout": 0.0}}]
    stacks = ""
    if end is not None:
        error = ({"type_name": "UnavailableError", "message": "peer gone", "traceback": "",
                  "fields": None} if end == files.RAISED else None)
        events.append({"kind": files.EXIT, "time": last, "step": None, "data": {
            "how": end, "status": 0 if end == files.RETURNED else 1, "error": error}})
    elif dump:
        stacks = f"--- dump: no progress for 2 s ---\n{STACK}"
        events.append({"kind": files.DUMP, "time": last, "step": None, "data": {
            "reason": "no progress for 2 s", "offset": 0, "length": len(stacks.encode())}})
    with open(base + files.EVENTS, "w") as f:
        f.writelines(map(_line, events))
    with open(base + files.STACKS, "w") as f:
        f.write(stacks)
    if code is not None:
        with open(base + files.WATCH, "w") as f:
            f.write(_line({"state": "ended", "time": last + 0.5, "exit_code": code}))
    return base


def write_hang(folder: str, n: int = 2) -> None:
    """Worker 1 of ``n`` skipped a call the others wait in."""
    for i in range(n):
        write_task(folder, i, n, calls=5, blocked=i != 1)
