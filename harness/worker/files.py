"""Worker side: the file faults (:class:`~harness.faults.DiskFull`,
:class:`~harness.faults.TornWrite`, :class:`~harness.faults.LostRename`,
:class:`~harness.faults.SlowWrite`), acted through an audit hook (PEP 578)
on the worker's own file operations under the run's directory.

A fault is armed at its step's boundary and reports itself (a
:data:`~harness.core.protocol.FAULT` message) only when it acts on a file:
a fault armed in a job that writes nothing after it never acted.  The hook
reads the events ``open`` (``open()``, ``os.open``) and ``os.rename``
(``os.rename``, ``os.replace``); an exception it raises is the caller's,
as the operating system's error would be.  An audit hook cannot be
removed; it does nothing once no fault is armed.
"""
from __future__ import annotations

import errno
import os
import sys
import time
from typing import TYPE_CHECKING, Any, List, Optional

from harness.core import protocol
from harness.faults import DiskFull, LostRename, SlowWrite, StepFault, TornWrite
from harness.worker.process import flush_output

if TYPE_CHECKING:
    from harness.worker.context import WorkerContext

# The open flags that write.
WRITING = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class _Armed:
    """This process's armed file faults, and the file a torn write waits on."""

    def __init__(self) -> None:
        self.ctx: Optional[WorkerContext] = None
        self.faults: List[StepFault] = []
        self.torn: Optional[str] = None    # the file a TornWrite will cut
        self.hooked = False


ARMED = _Armed()


def arm(fault: StepFault, ctx: WorkerContext) -> None:
    """From now on ``fault`` acts on this worker's writes under its run directory."""
    if not ctx.run_dir:
        raise RuntimeError(f"{fault!r}: the run has no directory for the job's files")
    ARMED.ctx = ctx
    ARMED.faults.append(fault)
    if not ARMED.hooked:
        sys.addaudithook(_hook)
        ARMED.hooked = True


def _path(value: Any) -> Optional[str]:
    if isinstance(value, int):
        return None   # an open file descriptor: not a path
    try:
        text = os.fsdecode(value)
    except TypeError:
        return None
    return os.path.abspath(text)


def _under_run_dir(path: Optional[str], ctx: WorkerContext) -> bool:
    if path is None or not ctx.run_dir:
        return False
    root = os.path.abspath(ctx.run_dir)
    return path == root or path.startswith(root + os.sep)


def _writes(mode: Any, flags: Any) -> bool:
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and bool(flags & WRITING)


def _truncates(mode: Any, flags: Any) -> bool:
    if isinstance(mode, str):
        return "w" in mode
    return isinstance(flags, int) and bool(flags & os.O_TRUNC)


def _acted(fault: StepFault, ctx: WorkerContext) -> None:
    """Report ``fault`` as acted, once."""
    if fault not in ctx.acted:
        ctx.acted.add(fault)
        ctx.send(protocol.FAULT, step=ctx.current_step, data=fault)


def _hook(event: str, args: tuple) -> None:
    ctx = ARMED.ctx
    if ctx is None or not ARMED.faults or event not in ("open", "os.rename"):
        return
    if event == "os.rename":
        if ARMED.torn is not None:
            tear(ctx)
        lost = next((f for f in ARMED.faults if isinstance(f, LostRename)), None)
        if lost is not None and any(_under_run_dir(_path(p), ctx) for p in args[:2]):
            _acted(lost, ctx)
            flush_output()
            os._exit(1)
        return
    path, mode, flags = args
    path = _path(path)
    if not _writes(mode, flags) or not _under_run_dir(path, ctx):
        return
    assert path is not None
    for fault in ARMED.faults:
        if isinstance(fault, SlowWrite) and fault not in ctx.acted:
            _acted(fault, ctx)
            time.sleep(fault.seconds)
        if isinstance(fault, DiskFull):
            _acted(fault, ctx)
            if _truncates(mode, flags) and os.path.isfile(path):
                os.truncate(path, 0)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        if isinstance(fault, TornWrite) and ARMED.torn is None:
            ARMED.torn = path


def tear(ctx: WorkerContext) -> None:
    """Cut the file a torn write waits on, report the fault and die, as a
    kill in the middle of the write leaves the file."""
    path = ARMED.torn
    fault = next(f for f in ARMED.faults if isinstance(f, TornWrite))
    try:
        size = os.path.getsize(path) if path is not None else 0
        if path is not None:
            os.truncate(path, int(size * fault.fraction))
    except OSError:
        pass   # the job removed it: nothing left to tear, the kill stands
    _acted(fault, ctx)
    flush_output()
    os._exit(1)


def at_boundary(ctx: WorkerContext) -> None:
    """A step boundary: a torn write that waited for a rename acts now."""
    if ARMED.torn is not None and ARMED.faults:
        tear(ctx)
