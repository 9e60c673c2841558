"""The end of an attempt: the stacks of the workers still running, then
every process of the attempt gone before the run returns, however it ended.
"""
from __future__ import annotations

import os
import time
from typing import Dict, List

from harness.controller.watch import TrackedWorker
from harness.core import interrupts, linux, protocol
from harness.launch.base import WorkerHandle

# How long a finished worker gets to exit by itself once released, and how
# long a live one gets to write its faulthandler dump, before SIGKILL.
RELEASE_WAIT = 0.5
STACK_WAIT = 0.5
# How long the processes of a run get to be gone once SIGKILLed.
STOP_WAIT = 5.0


def dump_stacks(tracked: List[TrackedWorker], specs) -> None:
    """Ask every live, unfinished worker for its Python stacks (faulthandler);
    note each server of a parameter-server cluster that is stopped."""
    asked = []
    for worker in tracked:
        if worker.serves and worker.seen.exit_code is None and worker.handle.is_stopped():
            worker.note(stopped=True)   # a server's stack is its join: only its state counts
        if not worker.pending:
            continue
        if worker.handle.is_stopped():
            worker.note(stopped=True)
            continue
        if not any(e.kind == protocol.STARTED for e in worker.events):
            # Its faulthandler may not be armed yet, and the signal's default
            # action would kill it, to be read as a crash.
            continue
        if worker.handle.send_signal(protocol.DUMP_SIGNAL):
            asked.append(specs[worker.index].stack_path)
    deadline = time.monotonic() + STACK_WAIT
    sizes: Dict[str, int] = {}
    while asked and time.monotonic() < deadline:
        time.sleep(0.02)
        now_sizes = {p: _size(p) for p in asked}
        # faulthandler writes the whole dump from its signal handler; a file
        # that has content and did not grow over one poll is complete.
        if all(now_sizes[p] > 0 and now_sizes[p] == sizes.get(p) for p in asked):
            break
        sizes = now_sizes


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def stop_workers(tracked: List[TrackedWorker], handles: List[WorkerHandle], start: float) -> None:
    """Release finished workers, SIGKILL the rest with all they started.
    A Ctrl-C meanwhile waits for the end: cut short, this would leave a
    worker running."""
    with interrupts.deferred():
        _stop_workers(tracked, handles, start)


def _stop_workers(tracked: List[TrackedWorker], handles: List[WorkerHandle], start: float) -> None:
    by_index = {worker.index: worker for worker in tracked}

    def released(h: WorkerHandle) -> bool:
        worker = by_index.get(h.index)
        return worker is not None and worker.finished and worker.seen.exit_code is None

    # Listed while the workers live: a released worker's children (a process
    # in a session of its own escapes the group kill) are found only now.
    descendants = {h.index: h.descendants() for h in handles}

    def kill(h: WorkerHandle) -> None:
        # Decide before the kill: once SIGKILL is sent the exit status can
        # arrive at once, and a worker we killed must not read as a crash.
        # A worker still running when the run was decided (pending) ends by
        # the harness's hand too when it ended by itself in the meantime: a
        # slow teardown (on Ray each signal and kill is a call) can outlast
        # TensorFlow's heartbeat timeout, whose error then ends a blocked
        # worker after the verdict's moment, which is not evidence.
        h.join(0)
        alive = h.exitcode is None
        h.kill_tree(descendants[h.index])
        worker = by_index.get(h.index)
        if worker is not None and (alive or worker.pending):
            worker.note(killed_by_harness=True)

    # The unfinished first: a released worker exits and closes its
    # connections, and a peer blocked on it would then fail or die of it
    # after the verdict's moment (seen on Ray, where each kill is a call).
    for h in handles:
        if not released(h):
            kill(h)
    for h in handles:
        if released(h):
            try:
                h.conn.send(protocol.RELEASE)
            except (OSError, EOFError):
                pass
    deadline = time.monotonic() + RELEASE_WAIT
    for h in handles:
        if released(h):
            h.join(max(0.0, deadline - time.monotonic()))
            kill(h)
    for h in handles:
        h.join(5)
        worker = by_index.get(h.index)
        if worker is not None and worker.seen.exit_code is None:
            worker.note(exit_code=h.exitcode, exit_time=time.monotonic() - start)
        h.close()
    # Gone, not only signalled: the next attempt of a restarted run binds
    # the same ports, and a run's end means no process of it is left.  A
    # zombie holds nothing and counts as gone (psutil.wait_procs would wait
    # for whoever adopted it to reap it: seconds, for a worker's reaper).
    linux.wait_gone([p.pid for known in descendants.values() for p in known], STOP_WAIT)
