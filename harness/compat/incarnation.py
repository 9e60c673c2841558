"""One cluster a :class:`~harness.compat.runner.MultiProcessRunner` started:
one ``Cluster.run``, in a thread of its own, so that the test goes on
while it runs (TensorFlow's ``start()`` returns at once).

The watch loop's progress callback is the only way in: it hands over the
workers' pids and exit codes every half second, and meets ``join``'s
deadline by setting the hang timeout, so a deadline ends the run with the
stacks and the verdict a hang gets.
"""
from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
from typing import Optional, Set

from harness.compat.task import Shared
from harness.controller import Cluster, Progress, Steer
from harness.result import RunResult


# How long the other tasks get to end by themselves once the chief has
# exited (dependence_on_chief), as TensorFlow's runner gives them.
CHIEF_LEFT_SEC = 3.0


class Incarnation:
    """``cluster.run(fn, args, **run_kwargs)`` in a thread; ``result`` (a
    :class:`RunResult`) or ``error`` once it ends."""

    def __init__(self, cluster: Cluster, fn, args: tuple, shared: Shared,
                 chief: Optional[int] = None, chief_restarts: bool = False, **run_kwargs):
        self.cluster, self.fn, self.args, self.shared = cluster, fn, args, shared
        self.run_kwargs = run_kwargs
        self.progress: Optional[Progress] = None
        self.deadline: Optional[float] = None     # monotonic; set by join()
        self.forever = False                      # join(timeout=None): no hang timer at all
        # dependence_on_chief: the chief's index; its end ends the cluster
        # (a non-zero one only where it is not restarted).
        self.chief, self.chief_restarts = chief, chief_restarts
        self.chief_ended: Optional[float] = None
        self.joined = False
        self.terminated: Set[int] = set()         # tasks the test ended on purpose
        self.result: Optional[RunResult] = None
        self.error: Optional[BaseException] = None
        self.started = threading.Event()          # pids known, or the run is over
        self.to_start: Set[int] = set()           # tasks to start again into the run
        self.to_stop: Set[int] = set()            # tasks the test ends (terminate)
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="mwms-compat-run", daemon=True)

    def start(self) -> None:
        # The forkserver is started here, in the caller's thread: a process
        # started from a thread dies with it (PR_SET_PDEATHSIG).
        self.cluster.launcher.prewarm()
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.cluster.run(self.fn, args=self.args, progress=self._on_progress,
                                           **self.run_kwargs)
        except BaseException as e:   # handed to join(), in the test's thread
            self.error = e
        finally:
            self.started.set()
        if self.result is not None and self.result.outcome != "completed" and not self.joined:
            # A test that waits on an event its tasks never set would wait
            # for ever, silent: the verdict goes to its captured output now.
            sys.stderr.write(f"pytest-mwms: the cluster ended before join(): "
                             f"{self.result.diagnosis}\n")

    def _on_progress(self, p: Progress) -> Steer:
        self.progress = p
        if p.pids and all(pid is not None for pid in p.pids):
            self.started.set()
        with self._lock:
            start, self.to_start = tuple(sorted(self.to_start)), set()
            stop, self.to_stop = tuple(sorted(self.to_stop)), set()
        self._follow_the_chief(p)
        if self.deadline is None:
            return Steer(math.inf if self.forever else None, start, stop)
        # The hang timer then runs out at the deadline, whatever progress is made.
        return Steer(p.idle + max(0.0, self.deadline - time.monotonic()), start, stop)

    def stop(self, index: int) -> None:
        """End task ``index`` at the watch loop's next look (within half a
        second), as the harness ends a worker: no failure of the run."""
        with self._lock:
            self.to_stop.add(index)

    def _follow_the_chief(self, p: Progress) -> None:
        """As TensorFlow's runner's watchdog: once the chief has exited
        (with 0, or at all where it is not restarted), the other tasks get
        :data:`CHIEF_LEFT_SEC` to end by themselves, then are ended, their
        ends no error of ``join``."""
        if self.chief is None or not p.exit_codes or p.exit_codes[self.chief] is None:
            return
        if p.exit_codes[self.chief] != 0 and self.chief_restarts:
            return
        now = time.monotonic()
        if self.chief_ended is None:
            self.chief_ended = now
        elif now - self.chief_ended >= CHIEF_LEFT_SEC:
            self.terminated |= {i for i in range(len(p.pids)) if self.kill(i)}

    def start_again(self, index: int, wait: float) -> bool:
        """Start task ``index``, whose process has ended, again into the
        running cluster (its peers keep theirs); True once its new process
        has started, within ``wait`` seconds."""
        before = self.progress.pids[index] if self.progress and self.progress.pids else None
        with self._lock:
            self.to_start.add(index)
        self.terminated.discard(index)
        until = time.monotonic() + wait
        while self.running and time.monotonic() < until:
            p = self.progress
            if p is not None and p.pids and p.pids[index] != before:
                return True
            time.sleep(0.05)
        return False

    @property
    def running(self) -> bool:
        return self.thread.is_alive()

    def wait(self, until: Optional[float]) -> bool:
        """Wait for the run to end, until monotonic ``until``; True if it did."""
        self.thread.join(None if until is None else max(0.0, until - time.monotonic()))
        return not self.thread.is_alive()

    def pid(self, index: int) -> Optional[int]:
        self.started.wait()
        p = self.progress
        return p.pids[index] if p is not None and p.pids else None

    def exit_code(self, index: int) -> Optional[int]:
        if not self.running and self.result is not None:
            w = self.result.workers[index]
            if w.exit_code is not None:
                return w.exit_code
            # Ended by the harness once the run was decided: a task that
            # raised exits 1 under TensorFlow's runner; any other was killed.
            return 1 if w.exception is not None else -signal.SIGKILL
        p = self.progress
        return p.exit_codes[index] if p is not None and p.exit_codes else None

    def all_exited(self) -> bool:
        """Every task's process has ended (the run may still be tearing down)."""
        p = self.progress
        return not self.running or (p is not None and bool(p.exit_codes) and all(
            code is not None or state != "running"
            for code, state in zip(p.exit_codes, p.states)))

    def kill(self, index: int, sig: int = signal.SIGKILL) -> bool:
        """Signal task ``index``'s process while it runs; False if it has ended."""
        p = self.progress
        pid = p.pids[index] if p is not None and p.pids else None
        if not self.running or p is None or pid is None or p.exit_codes[index] is not None:
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
            return True
        return False

    def kill_all(self, sig: int = signal.SIGKILL) -> Set[int]:
        """Signal every task that still runs; the ones signalled."""
        self.started.wait(5.0)
        p = self.progress
        if p is None:
            return set()
        return {i for i in range(len(p.pids)) if self.kill(i, sig)}
