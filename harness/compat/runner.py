"""TensorFlow's ``MultiProcessRunner``, on the harness's workers.

Each cluster the runner starts is one ``Cluster.run`` in a thread
(:class:`~harness.compat.incarnation.Incarnation`): ``start()`` starts it,
``join()`` waits for it and turns its :class:`~harness.result.RunResult`
into TensorFlow's result or error (:mod:`harness.compat.verdict`).  As
TensorFlow's runner does, ``auto_restart`` starts again only the task that
exited non-zero, while the others run on (the harness's
``restart_policy="task"``), and ``start_single_process`` starts a task
whose process has ended again into its running cluster; once every task
of a cluster has exited, it starts a new cluster when each of its tasks
is asked for.
"""
from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.util
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import unittest
import weakref
from multiprocessing.managers import SyncManager
from typing import Dict, List, Optional, Tuple

from harness.compat import originals, spec, verdict
from harness.compat.errors import (OneTaskRestartError, SubprocessTimeoutError,
                                   UnexpectedSubprocessExitError)
from harness.compat.incarnation import Incarnation
from harness.compat.task import Payload, Shared, run_task
from harness.controller import Cluster
from harness.core import linux, serialize
from harness.core.tfconfig import ClusterShape
from harness.launch import scratch
from harness.settings import RunSettings, session_settings

DEFAULT_TIMEOUT_SEC = 200
# auto_restart: how many times each task is restarted, at most (TensorFlow's
# runner restarts until join's timeout; a bound keeps a task that always
# fails from restarting for the whole timeout).
AUTO_RESTARTS = 5
# How long a failed task's peers get to fail too before the harness ends
# them: above MultiWorkerMirroredStrategy's default health check (30 s
# between checks, 10 s each), which is how a peer learns of the failure.
GRACE_SEC = 45.0
# After join's deadline, how long the harness gets to dump the stacks and
# stop the cluster before the runner kills what is left.
STOP_MARGIN_SEC = 60.0

_manager = None
_manager_dir: Optional[str] = None
_manager_lock = threading.Lock()
_pickling_lock = threading.Lock()
_live: weakref.WeakSet[MultiProcessRunner] = weakref.WeakSet()


def manager():
    """The session's ``multiprocessing`` manager (``multi_process_runner.manager()``),
    from a forkserver: its server never holds a copy of this process's threads."""
    global _manager, _manager_dir
    with _manager_lock:
        if _manager is None:
            # Its socket in a directory of ours, removed with it: left to
            # itself the server makes a pymp-* directory that outlives it.
            _manager_dir = tempfile.mkdtemp(prefix="pytest-mwms-manager-")
            scratch.remove_at_end(_manager_dir)
            # The forkserver's socket is in this process's pymp-* directory,
            # which only this process's exit removes.
            scratch.remove_mp_temp_dir_at_end(multiprocessing.util)
            _manager = SyncManager(address=os.path.join(_manager_dir, "socket"),
                                   ctx=multiprocessing.get_context("forkserver"))
            # A manager's server outlives a SIGKILLed pytest, and so did the
            # forkserver that started it (measured): it watches this process.
            _manager.start(linux.exit_when_gone, (os.getpid(),))
        return _manager


def shutdown_manager() -> None:
    """End the session's manager (a test suite's last clean-up; also at exit)."""
    global _manager, _manager_dir
    with _manager_lock:
        if _manager is not None:
            _manager.shutdown()
            _manager = None
        if _manager_dir is not None:
            shutil.rmtree(_manager_dir, ignore_errors=True)
            _manager_dir = None


@contextlib.contextmanager
def light_testcases():
    """A ``TestCase`` in ``fn``'s closure or arguments (TensorFlow's tests pass
    ``self``) travels without ``_outcome``, the running test's record: under
    pytest it holds pytest's own test item, which does not pickle, and the
    worker's copy runs no test."""
    with _pickling_lock:
        if "__getstate__" in unittest.TestCase.__dict__:
            yield
            return

        def state(self):
            return {k: v for k, v in self.__dict__.items() if k != "_outcome"}

        setattr(unittest.TestCase, "__getstate__", state)  # noqa: B010 - not a method mypy knows
        try:
            yield
        finally:
            delattr(unittest.TestCase, "__getstate__")


def _executing_eagerly() -> bool:
    if "tensorflow" not in sys.modules:
        return True
    from tensorflow.python.eager import context
    return context.executing_eagerly()


class TaskProcess:
    """One task of a :class:`MultiProcessRunner`, as much of a
    ``multiprocessing.Process`` as TensorFlow's test utilities use."""

    def __init__(self, runner: MultiProcessRunner, task_type: str, task_id: int):
        self._runner, self._task = runner, (task_type, task_id)

    @property
    def pid(self) -> Optional[int]:
        return self._runner.get_process_id(*self._task)

    @property
    def exitcode(self) -> Optional[int]:
        return self._runner.get_process_exit_code(*self._task)

    def is_alive(self) -> bool:
        return self.exitcode is None

    def join(self, timeout: Optional[float] = None) -> None:
        until = None if timeout is None else time.monotonic() + timeout
        while self.is_alive() and (until is None or time.monotonic() < until):
            time.sleep(0.05)


class MultiProcessRunner:
    """TensorFlow's ``MultiProcessRunner`` (same arguments), on the harness.

    Besides TensorFlow's: ``hang_timeout`` (seconds without progress before
    the harness declares a hang, until ``join`` gives its own; TensorFlow's
    default 200 s; ``join(timeout=None)`` turns it off unless it was
    given), ``settings`` (a :class:`~harness.settings.RunSettings` for the
    cluster; its ``workers`` comes from ``cluster_spec``; by
    default the pytest session's ``--mwms-*`` options), and
    ``results``, the ``RunResult`` of each cluster started.  Where
    ``settings`` gives the workers GPUs, ``share_gpu`` chooses between
    ``gpu-shared`` (every task sees every GPU, TensorFlow's default) and
    ``gpu`` (each its own); with ``devices='cpu'`` (the default) it has no
    effect.  ``at_spec_addresses``: each task's ``TF_CONFIG`` lists the
    cluster spec's own addresses, and the cluster runs on the host's
    network, so that the test process reaches servers the tasks start
    there (a ``MultiProcessCluster``, :mod:`harness.compat.routes`).
    ``rpc_layer`` is written into each task's ``TF_CONFIG``, as
    TensorFlow's runner writes it (``grpc`` by default; the workers speak
    gRPC whatever it says).  ``use_dill_for_args`` and ``daemon`` have no
    effect: the harness always pickles with dill and ends every process
    itself.
    """

    def __init__(self, fn, cluster_spec, rpc_layer=None, max_run_time=None,
                 grpc_fail_fast=None, stream_output=True, return_output=False,
                 use_dill_for_args=True, daemon=False, dependence_on_chief=True,
                 auto_restart=False, share_gpu=True, args=None, kwargs=None, *,
                 hang_timeout: Optional[float] = None, settings: Optional[RunSettings] = None,
                 at_spec_addresses: bool = False):
        counts = spec.shape(cluster_spec)
        self._order = spec.tasks(counts)
        self._names = [spec.label(*task) for task in self._order]
        self._n = len(self._order)
        if not callable(fn):
            raise ValueError("fn is not a callable")
        self._fn, self._args, self._kwargs = fn, tuple(args or ()), dict(kwargs or {})
        self._cluster_spec = cluster_spec
        self._max_run_time = max_run_time
        self._grpc_fail_fast = grpc_fail_fast
        self._rpc_layer = rpc_layer or "grpc"   # TensorFlow's runner's default
        self._stream_output, self._return_output = stream_output, return_output
        self._auto_restart = auto_restart
        self._dependence_on_chief = dependence_on_chief
        self._hang_timeout = float(hang_timeout or DEFAULT_TIMEOUT_SEC)
        self._hang_timeout_given = hang_timeout is not None
        # Every task runs fn, parameter servers included, as under TensorFlow's runner.
        shape = ClusterShape(**counts, servers=False)
        settings = (settings or session_settings()).with_overrides(
            **({"workers": self._n} if counts["worker"] == self._n else {"cluster": shape}))
        if settings.devices != "cpu":
            settings = settings.with_overrides(devices="gpu-shared" if share_gpu else "gpu")
        self._addresses = None
        if at_spec_addresses:
            self._addresses = {kind: list(cluster_spec[kind]) for kind in counts
                               if counts[kind]}
            settings = settings.with_overrides(network="host")
        self._cluster = Cluster(settings)
        self._eager = _executing_eagerly()
        self._lock = threading.RLock()
        self._incarnations: List[Incarnation] = []
        self._pending: Dict[int, tuple] = {}
        self._joined = False
        self._printed = 0
        self._timer: Optional[threading.Timer] = None
        _live.add(self)

    @property
    def results(self) -> list:
        """The ``RunResult`` of each cluster started so far that has ended."""
        return [inc.result for inc in self._incarnations if inc.result is not None]

    def set_args(self, args=None, kwargs=None):
        self._args = tuple(args or self._args)
        self._kwargs = dict(kwargs or self._kwargs)

    # -- starting ---------------------------------------------------------
    def start(self):
        """Start every task of the cluster spec, as one harness cluster."""
        with self._lock:
            if self._incarnations or self._pending:
                raise ValueError("MultiProcessRunner already started.")
            if self._joined:
                raise ValueError("cannot start new processes after MultiProcessRunner.join() "
                                 "is called")
            self._launch(dict.fromkeys(range(self._n), (self._fn, self._args, self._kwargs)))
        if self._max_run_time is not None:
            self._timer = threading.Timer(self._max_run_time, self.terminate_all)
            self._timer.daemon = True
            self._timer.start()

    def start_in_process_as(self, as_task_type, as_task_id):
        raise NotImplementedError(
            "start_in_process_as: pytest-mwms runs every task in a worker process of its own "
            "(for a debugger, run the task's function in the test itself)")

    def start_single_process(self, task_type, task_id, cluster_spec=None, fn=None, args=None,
                             kwargs=None):
        """Start one task.  Into a running cluster whose task ``task_id`` has
        exited, it is started again at once, its peers keeping their
        processes (a pod restart); otherwise the cluster starts once every
        task is asked for, after every task of the one before has exited."""
        index = spec.check_task(task_type, task_id, self._order)
        if cluster_spec is not None and spec.tasks(spec.shape(cluster_spec)) != self._order:
            raise OneTaskRestartError(
                f"start_single_process with a cluster_spec of "
                f"{', '.join(spec.label(*t) for t in spec.tasks(spec.shape(cluster_spec)))} "
                f"into a cluster of {', '.join(self._names)}: pytest-mwms cannot change a "
                f"running cluster's shape")
        call = ((self._fn, self._args, self._kwargs) if fn is None
                else (fn, tuple(args or ()), dict(kwargs or {})))
        with self._lock:
            if self._joined:
                raise ValueError("cannot start new processes after MultiProcessRunner.join() "
                                 "is called")
            if self._into_running_cluster(index, call):
                return
            if index in self._pending:
                raise ValueError(f"{self._names[index]} was already started")
            self._pending[index] = call
            if len(self._pending) == self._n:
                tasks, self._pending = self._pending, {}
                self._launch(tasks)

    def _into_running_cluster(self, index: int, call: tuple) -> bool:
        """Start task ``index`` (the harness's) again into the last cluster
        while another of its tasks runs (True), or wait for the last cluster
        to end (False)."""
        last = self._current()
        if last is None or not last.running:
            return False
        if last.all_exited():
            last.wait(time.monotonic() + STOP_MARGIN_SEC)
            return False
        if last.exit_code(index) is None:
            raise ValueError(f"start_single_process: {self._names[index]} is still running")
        last.shared.payloads[index] = payload_of(*call)
        if not last.start_again(index, STOP_MARGIN_SEC):
            raise SubprocessTimeoutError(
                f"start_single_process: {self._names[index]} did not start again "
                f"within {STOP_MARGIN_SEC:g} s (its cluster ended meanwhile?)", None,
                last.result)
        return True

    def _launch(self, tasks: Dict[int, tuple]) -> None:
        # auto_restart: as TensorFlow's runner does, only the task that exited
        # non-zero is started again, while the others run on.
        restarts = AUTO_RESTARTS if self._auto_restart else 0
        payloads = {i: payload_of(*call) for i, call in tasks.items()}
        m = manager()
        # One barrier, as TensorFlow's runner has: a restarted task comes back
        # to the barrier its peers are at.
        shared = Shared(statuses=m.dict(), starts=m.dict(), barriers=(m.Barrier(self._n),),
                        payloads=m.dict(), order=self._order, on_start=originals.installed,
                        eager=self._eager, grpc_fail_fast=self._grpc_fail_fast,
                        rpc_layer=self._rpc_layer, addresses=self._addresses)
        chief = self._order.index(("chief", 0)) \
            if self._dependence_on_chief and ("chief", 0) in self._order else None
        inc = Incarnation(self._cluster, run_task, (payloads, shared), shared,
                          chief=chief, chief_restarts=bool(restarts),
                          timeout=self._hang_timeout, grace=GRACE_SEC, restarts=restarts,
                          restart_on="crash,fail", restart_policy="task", on_return="exit",
                          restart_echoes_together=False)
        self._incarnations.append(inc)
        inc.start()

    def _current(self) -> Optional[Incarnation]:
        return self._incarnations[-1] if self._incarnations else None

    # -- for the pool (harness.compat.pool) ---------------------------------
    def without_hang_timer(self) -> None:
        """No hang timer for the running cluster until ``join`` (a pool's
        tasks wait for calls as long as the test takes)."""
        current = self._current()
        if current is not None:
            current.forever = True

    def is_running(self) -> bool:
        current = self._current()
        return current is not None and current.running

    def any_task_ended(self) -> bool:
        """Whether the running cluster has ended, or any of its tasks has."""
        current = self._current()
        if current is None or not current.running:
            return True
        p = current.progress
        return p is not None and any(code is not None for code in p.exit_codes)

    # -- the tasks --------------------------------------------------------
    def _started(self, task_type, task_id) -> Tuple[Incarnation, int]:
        index = spec.check_task(task_type, task_id, self._order)
        inc = self._current()
        if inc is None:
            raise KeyError((task_type, task_id))
        return inc, index

    def get_process_id(self, task_type, task_id):
        """The task's pid (None before it starts), once its cluster runs."""
        index = spec.check_task(task_type, task_id, self._order)
        current = self._current()
        if index in self._pending or current is None:
            return None
        return current.pid(index)

    def get_process_exit_code(self, task_type, task_id):
        """The task's exit code; None while it runs.  KeyError if never started."""
        if spec.check_task(task_type, task_id, self._order) in self._pending:
            return None
        inc, index = self._started(task_type, task_id)
        return inc.exit_code(index)

    def process_exists(self, task_type, task_id):
        return self.get_process_exit_code(task_type, task_id) is None

    @property
    def _processes(self) -> Dict[Tuple[str, int], TaskProcess]:
        """Each started task as a process to wait on, by ``(type, index)``:
        TensorFlow's ``MultiProcessCluster.kill_task`` joins the runner's
        ``_processes[task]`` once it told the task to end."""
        return {task: TaskProcess(self, *task) for task in self._order}

    def terminate(self, task_type, task_id):
        """End the task and wait for it to end: its end is no error of
        ``join``, and no failure its peers are ended for (they run on, as
        under TensorFlow's runner); with ``auto_restart`` it is started again."""
        inc, index = self._started(task_type, task_id)
        inc.terminated.add(index)
        inc.started.wait()
        before = inc.pid(index)
        inc.stop(index)
        until = time.monotonic() + STOP_MARGIN_SEC
        while inc.running and time.monotonic() < until and inc.pid(index) == before \
                and inc.exit_code(index) is None:
            time.sleep(0.05)

    def terminate_all(self, sig=None):
        """Kill every task that still runs (SIGKILL unless ``sig``)."""
        for inc in list(self._incarnations):
            inc.terminated |= inc.kill_all(sig or signal.SIGKILL)

    # -- joining ----------------------------------------------------------
    def join(self, timeout=DEFAULT_TIMEOUT_SEC):
        """Wait for the cluster; TensorFlow's result, or its error whose
        message opens with the harness's verdict."""
        if timeout and not isinstance(timeout, int):
            raise ValueError("`timeout` must be an integer or `None`.")
        with self._lock:
            if self._joined:
                raise ValueError("MultiProcessRunner can't be joined twice.")
            self._joined = True
            if self._pending:
                missing = sorted(set(range(self._n)) - set(self._pending))
                raise OneTaskRestartError(
                    f"join() with {', '.join(self._names[i] for i in missing)} not started: "
                    f"pytest-mwms starts a cluster once each of its tasks is asked for")
        inc = self._current()
        if inc is None:
            raise ValueError("MultiProcessRunner.join() before start()")
        try:
            self._wait(inc, timeout)
        finally:
            if self._timer is not None:
                self._timer.cancel()
        self._print_output()
        if inc.error is not None:
            raise inc.error
        return self._judge(inc, timeout)

    def _wait(self, inc: Incarnation, timeout) -> None:
        inc.joined = True
        # join(timeout=None) never times out, as TensorFlow's: no hang timer
        # unless the test asked the harness for one (hang_timeout=).
        inc.forever = timeout is None and not self._hang_timeout_given
        inc.deadline = time.monotonic() + timeout if timeout else None
        try:
            done = inc.wait(None if inc.deadline is None else inc.deadline + STOP_MARGIN_SEC)
        except BaseException:
            inc.deadline = time.monotonic()   # the harness ends the run now, cleanly
            inc.wait(time.monotonic() + STOP_MARGIN_SEC)
            raise
        if not done:
            self.terminate_all()
            inc.wait(time.monotonic() + STOP_MARGIN_SEC)

    def _print_output(self) -> None:
        if self._stream_output:
            for inc in self._incarnations[self._printed:]:
                if inc.result is not None:
                    sys.stdout.write("".join(verdict.output_lines([inc.result], self._names)))
            sys.stdout.flush()
        self._printed = len(self._incarnations)

    def _judge(self, inc: Incarnation, timeout):
        result = inc.result
        stdout = verdict.output_lines(self.results, self._names) if self._return_output else []
        if result is None:
            # join()'s deadline passed and the run did not end even with its
            # tasks killed: nothing to judge.
            raise SubprocessTimeoutError(
                f"pytest-mwms: the cluster did not end within {2 * STOP_MARGIN_SEC:g} s of "
                f"join's deadline, even with its tasks killed\n\n"
                f"{verdict.TIMEOUT_TEXT.format(timeout)}",
                verdict.MultiProcessRunnerResult([], stdout))
        mpr_result = verdict.MultiProcessRunnerResult(verdict.return_values(result), stdout)
        kind, index = verdict.decide(result, inc.terminated)
        if kind == "ok":
            return mpr_result
        if kind == "timeout":
            raise SubprocessTimeoutError(
                f"{result.diagnosis}\n\n{verdict.TIMEOUT_TEXT.format(timeout)}", mpr_result, result)
        assert index is not None   # "raise" and "exit" name their task
        if kind == "raise":
            process = verdict.last_raised(result.workers[index])
            assert process is not None   # "raise" names a task whose last status raised
            error = process.exception
            exc = verdict.rebuild_exception(
                verdict.status_of(dict(inc.shared.statuses), index, process.attempt), error)
            # Set on whatever the task raised, as TensorFlow's runner sets mpr_result.
            exc.mpr_result, exc.run_result = mpr_result, result  # type: ignore[attr-defined]
            if error is not None and hasattr(exc, "add_note"):
                exc.add_note(f"{self._names[index]}'s traceback:\n{error.traceback}")
            raise verdict.with_verdict(exc, result.diagnosis)
        raise UnexpectedSubprocessExitError(
            f"{result.diagnosis}\n\n{verdict.exit_text(result, index, self._names)}", mpr_result,
            result)


def payload_of(fn, args, kwargs) -> Payload:
    """A task's call as its worker takes it (:data:`~harness.compat.task.Payload`)."""
    module = getattr(fn, "__module__", None)
    with light_testcases():
        return (module if module not in ("__main__", None) else None,
                serialize.dumps((fn, args, kwargs)))


def end_all_runners(wait: float = STOP_MARGIN_SEC) -> None:
    """End every cluster a runner started that still runs, as a hang ends
    (stacks, verdict, every process gone), and wait for them: a test's
    teardown, for a test that failed between ``start()`` and ``join()``."""
    incarnations = [inc for runner in list(_live) for inc in runner._incarnations
                    if inc.running]
    for inc in incarnations:
        inc.deadline = time.monotonic()
    until = time.monotonic() + wait
    for inc in incarnations:
        if not inc.wait(until):
            inc.kill_all()


atexit.register(shutdown_manager)
atexit.register(end_all_runners, 5.0)
