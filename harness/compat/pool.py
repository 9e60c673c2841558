"""TensorFlow's ``MultiProcessPoolRunner``, on the harness: one cluster
whose tasks run call after call, keeping what each call leaves (a
strategy, collective ops enabled in a ``setUp``, a variable) for the next,
as TensorFlow's pool does.

The cluster is a :class:`~harness.compat.runner.MultiProcessRunner` whose
tasks run :func:`~harness.compat.task.pool_loop`: each takes its calls from
an inbox of its own (a queue of the session's ``manager()``) and puts its
answers in the pool's outbox.  It runs without a hang timer between calls;
each call has :data:`POOL_TIMEOUT_SEC`, as TensorFlow's, after which the
cluster ends as a hang (the stacks and the verdict, in the error raised).
A call during which a task ended ends the cluster and raises its error; the
next call starts a fresh cluster, and says why on stderr.
"""
from __future__ import annotations

import atexit
import queue
import sys
import time
import weakref
from typing import Any, Dict, List, Optional, Tuple

from harness.compat import spec
from harness.compat.runner import MultiProcessRunner, manager, payload_of
from harness.compat.task import pool_loop
from harness.core import serialize

# TensorFlow's pool waits this long for a call's answers from every task.
POOL_TIMEOUT_SEC = 300
# How often a call that waits for its answers looks whether a task has ended.
LOOK_EVERY_SEC = 0.5
# How long shutdown() gives the tasks to leave their loops.
SHUTDOWN_SEC = 60

_live: weakref.WeakSet[MultiProcessPoolRunner] = weakref.WeakSet()


class MultiProcessPoolRunner:
    """TensorFlow's pool of tasks that run function after function, in the
    same processes: ``initializer`` runs once in each, when the pool's
    cluster starts (at the first :meth:`run`, and again for a fresh
    cluster after a call during which a task ended)."""

    def __init__(self, cluster_spec, initializer=None, share_gpu=True):
        self._order = spec.tasks(spec.shape(cluster_spec))   # the spec's checks, now
        self._cluster_spec = cluster_spec
        self._initializer = initializer
        self._share_gpu = share_gpu
        self._runner: Optional[MultiProcessRunner] = None
        self._inboxes: Dict[Tuple[str, int], Any] = {}   # the manager's queue proxies
        self._outbox: Any = None
        self._calls = 0
        self._ended: Optional[str] = None    # why the last cluster ended, to say at the next start
        _live.add(self)

    def run(self, fn, args=None, kwargs=None) -> List:
        """``fn(*args, **kwargs)`` on every task; their return values, None
        left out, in task order; a task's exception is raised here."""
        runner = self._running()
        self._calls += 1
        call = (self._calls, payload_of(fn, tuple(args or ()), dict(kwargs or {})))
        for inbox in self._inboxes.values():
            inbox.put(call)
        answers = self._answers(runner, self._calls)
        shut_down_first_at_exit()
        values = []
        for task in self._order:
            ok, pickled = answers[task]
            value = serialize.loads(pickled)
            if not ok:
                raise value
            if value is not None:
                values.append(value)
        return values

    def shutdown(self) -> None:
        """End the pool's cluster: each task leaves its loop, then the
        cluster ends (its output printed, as a joined runner's)."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        for inbox in self._inboxes.values():
            inbox.put(None)
        try:
            runner.join(SHUTDOWN_SEC)
        except Exception as e:   # as TensorFlow's pool: an error at shutdown is only logged
            sys.stderr.write(f"pytest-mwms: ignoring the pool's error at shutdown: {e}\n")

    def __del__(self):
        self.shutdown()

    def __reduce__(self):
        # Sent to a task (a module-level pool a task's function uses), it is
        # that process's own pool, not started yet: its cluster is this
        # process's to run.
        return (MultiProcessPoolRunner, (self._cluster_spec, self._initializer, self._share_gpu))

    def _running(self) -> MultiProcessRunner:
        """The pool's cluster, started where it has none or its last one ended."""
        if self._runner is not None and not self._runner.is_running():
            self._note_end(self._runner)
            self._runner = None
        if self._runner is None:
            if self._ended is not None:
                sys.stderr.write(f"pytest-mwms: the pool's cluster ended ({self._ended}); "
                                 f"this call starts a fresh one, the initializer again\n")
                self._ended = None
            m = manager()
            self._inboxes = {task: m.Queue() for task in self._order}
            self._outbox = m.Queue()
            self._runner = MultiProcessRunner(
                pool_loop, self._cluster_spec, dependence_on_chief=False,
                share_gpu=self._share_gpu, args=(self._initializer, self._inboxes, self._outbox))
            self._runner.start()
            self._runner.without_hang_timer()
        return self._runner

    def _answers(self, runner: MultiProcessRunner, number: int) -> Dict[Tuple[str, int], tuple]:
        """Every task's answer to call ``number``; where a task ends first,
        or the call outlasts :data:`POOL_TIMEOUT_SEC`, the cluster ends and
        its error (with the verdict) is raised."""
        answers: Dict[Tuple[str, int], tuple] = {}
        deadline = time.monotonic() + POOL_TIMEOUT_SEC
        while len(answers) < len(self._order):
            try:
                task, which, ok, pickled = self._outbox.get(timeout=LOOK_EVERY_SEC)
            except queue.Empty:
                if runner.any_task_ended() or time.monotonic() >= deadline:
                    self._end_in_error(runner, deadline)
                continue
            if which == number:   # an earlier call's late answer is dropped
                answers[task] = (ok, pickled)
        return answers

    def _end_in_error(self, runner: MultiProcessRunner, deadline: float) -> None:
        """End the cluster as a hang now and raise what its join raises."""
        self._runner = None
        try:
            runner.join(1)
        except Exception as e:
            self._ended = f"{type(e).__name__} in the call before"
            raise
        self._ended = "a task ended in the call before"
        raise RuntimeError("Unexpected EOF. Worker process may have died: a task of the "
                           "pool ended during the call" if time.monotonic() < deadline else
                           f"Total timeout of {POOL_TIMEOUT_SEC} s exceeded while waiting "
                           f"for processes")

    def _note_end(self, runner: MultiProcessRunner) -> None:
        try:
            runner.join(1)
            self._ended = "its tasks ended between calls"
        except Exception as e:
            self._ended = f"{type(e).__name__} between calls"


def shutdown_all_pools() -> None:
    """Shut down every pool still running (at exit, before the runners are
    ended as hangs)."""
    for pool in list(_live):
        pool.shutdown()


# Before the runners still running are ended as hangs (atexit runs the last
# registered first; harness.compat.runner registers at its import, above).
atexit.register(shutdown_all_pools)
_first_at_exit = False


def shut_down_first_at_exit() -> None:
    """Shut the pools down before anything else at exit, once workers have
    started: the launcher kills every live worker at exit, a handler it
    registers as its first worker starts (after this module's import), and
    a pool's tasks killed first would be reported as crashes."""
    global _first_at_exit
    if not _first_at_exit:
        atexit.unregister(shutdown_all_pools)
        atexit.register(shutdown_all_pools)
        _first_at_exit = True
