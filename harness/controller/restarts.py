"""What a restart starts again: the policy table, and one task's restart.

``run(restarts=K, restart_policy=...)`` picks a row of :data:`POLICIES`:

- ``cluster``: an attempt that ends in an outcome of ``restart_on`` is
  started again whole, up to K times (:mod:`harness.controller.cluster`).
- ``task``: within the one attempt, a worker that crashed or failed gets a
  fresh process, up to K times per worker, on its own address and
  ``TF_CONFIG``, while the others keep theirs, as Kubernetes restarts one
  pod (``restartPolicy: OnFailure``).  :class:`TaskRestarter` does it for
  the watch loop.  A restarted worker's failure starts no grace for its
  peers; ``restart_on`` may not name ``hang`` (a hang has no one task).
  ``fn`` reads the task's own restart count as ``context().attempt``, and
  a fault's ``attempt`` is its worker's restart count.  Each task's
  processes are in ``result.workers[i].attempts``; the diagnosis tells the
  restarts first, causes before echoes, and a run that does not complete
  after one is blamed on the task restarted first
  (the stages ``task_restarts`` and ``task_restart`` of
  :mod:`harness.diagnosis.stages`).

A restart that TensorFlow answers by aborting the peers is handled as a
gang scheduler handles a job's failure: JobSet's ``failurePolicy``
(kubernetes-sigs/jobset) recreates every child job when one fails, and a
rule matching the failure's reason can restart them without spending
``maxRestarts`` (``RestartJobSetAndIgnoreMaxRestarts``).  Here the failed
task is restarted alone first, as Kubernetes restarts one pod; a worker
that then raises an echo (:func:`~harness.diagnosis.echoes.is_restart_echo`:
TensorFlow reporting a peer's failure or restart) within
:data:`ECHO_WINDOW` seconds stops every task and starts them all
together, one fresh cluster, using none of their restarts
(:meth:`TaskRestarter.echoes`).  Restarted one by one, each peer's new
process would join a group that another's old process still holds, and
they would abort each other again.  A TFJob (Kubeflow) does restart its
failed pods one by one, each restart counted against its
``backoffLimit``: ``restart_echoes_together=False``, which TensorFlow's own
runner does too.

Which end of one worker a restart follows is :func:`task_outcome`, a plain
function of its observation.
"""
from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence

from harness.controller.outcome import certain_to_recur
from harness.diagnosis.echoes import is_restart_echo
from harness.diagnosis.observations import Outcome, WorkerObservation
from harness.diagnosis.story import USED_UP, NotRestarted
from harness.errors import SettingError
from harness.result import WorkerResult

if TYPE_CHECKING:
    from harness.controller.watch import TrackedWorker
    from harness.launch.base import WorkerHandle


# How long after a task's restart a peer's echo counts as one of its
# failure: past TensorFlow's ~10 s of heartbeats in which a peer learns of a
# dead task, with room for a loaded machine.
ECHO_WINDOW = 30.0
# How many times the echoes of one failure may restart every task together.
TOGETHER_PER_FAILURE = 2


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """One row of :data:`POLICIES`: from ``restarts=K``, how many whole
    attempts a run may have and how many times each task may be restarted
    within one, and which ``restart_on`` outcomes make sense."""

    name: str
    cluster_attempts: Callable[[int], int]
    task_restarts: Callable[[int], int]
    restartable: frozenset

    @property
    def restarts_tasks(self) -> bool:
        """Whether one task can be started again into its running attempt
        (automatically, K times; or when asked, through a :class:`Steer`)."""
        return self.cluster_attempts(1) == 1


POLICIES: Dict[str, RestartPolicy] = {
    "cluster": RestartPolicy("cluster", cluster_attempts=lambda k: k + 1,
                             task_restarts=lambda k: 0,
                             restartable=frozenset({Outcome.CRASHED, Outcome.FAILED,
                                                    Outcome.HANG})),
    # A hang has no one task to restart: the run ends as a hang.
    "task": RestartPolicy("task", cluster_attempts=lambda k: 1, task_restarts=lambda k: k,
                          restartable=frozenset({Outcome.CRASHED, Outcome.FAILED})),
}


def check_restart_on(policy: str, restart_on: frozenset) -> None:
    """A SettingError when ``restart_on`` names an outcome ``policy`` cannot restart."""
    extra = restart_on - POLICIES[policy].restartable
    if extra:
        raise SettingError(
            f"run(restart_on=...): {', '.join(sorted(extra))} cannot restart one task "
            f"(restart_policy={policy!r}): a hang has no one task to restart; use "
            f"restart_policy='cluster' to restart a hung cluster")


def task_outcome(w: WorkerObservation) -> Optional[str]:
    """How worker ``w``'s process ended, as a restart sees it: FAILED (it
    raised), CRASHED (it exited without returning, by itself or a signal
    not the harness's), or None (it returned, or it runs on)."""
    if w.error is not None:
        return Outcome.FAILED
    if w.returned or w.exit_code is None or w.killed_by_harness:
        return None
    return Outcome.CRASHED


class TaskRestarter:
    """Restarts one worker of a running attempt (``restart_policy="task"``).

    ``start(index, incarnation)`` starts worker ``index``'s process for its
    ``incarnation``-th run (its spec's files in a directory of their own)
    and returns its :class:`~harness.controller.watch.TrackedWorker`.  What
    each ended incarnation left is kept in :attr:`history` (worker index to
    its :class:`~harness.result.WorkerResult` list, in order), and why a
    worker that ended badly was not restarted in :attr:`not_restarted`."""

    def __init__(self, num_workers: int, restarts: int, restart_on: frozenset,
                 start: Callable[[int, int], TrackedWorker],
                 result_of: Callable[[TrackedWorker, int], WorkerResult],
                 together: bool = True):
        self.left = [restarts] * num_workers
        self.restarts = restarts
        self.restart_on = restart_on
        self._start = start
        self._result_of = result_of
        self.history: Dict[int, List[WorkerResult]] = {i: [] for i in range(num_workers)}
        self.not_restarted: Dict[int, NotRestarted] = {}
        self.ended: List[WorkerHandle] = []     # the handles of the processes that ended
        self.failed_at: Optional[float] = None  # when a task was last restarted for its failure
        self.together = 0                       # restarts of every task for that failure
        self.echoes_restart_all = together      # False: an echo is a failure of its own

    def incarnation(self, index: int) -> int:
        return len(self.history[index])

    def wants(self, worker: TrackedWorker) -> bool:
        """Whether ``worker`` (a TrackedWorker whose process ended badly, or
        that raised) is to be restarted; notes why not when it is not."""
        outcome = task_outcome(worker.seen)
        if outcome is None or outcome not in self.restart_on:
            return False
        if self.left[worker.index] <= 0:
            if not self.restarts:
                return False     # only starts asked for: nothing to say
            self.not_restarted[worker.index] = NotRestarted(USED_UP, (worker.index,),
                                                            restarts=self.restarts)
            return False
        # Its phases so far (the record gets them only when the run ends).
        recur = certain_to_recur([dataclasses.replace(worker.seen, events=tuple(worker.events))])
        if recur:
            self.not_restarted[worker.index] = recur
            return False
        return True

    def echoes(self, worker: TrackedWorker, now: float) -> bool:
        """Whether ``worker``'s error is an echo of the failure a task was
        restarted for (TensorFlow reporting it, within :data:`ECHO_WINDOW`):
        then every task is to be restarted together, using none of their
        restarts.  Counts that restart."""
        if (not self.echoes_restart_all or self.failed_at is None
                or now - self.failed_at > ECHO_WINDOW
                or self.together >= TOGETHER_PER_FAILURE or not is_restart_echo(worker.seen.error)):
            return False
        self.together += 1
        return True

    def restart(self, worker: TrackedWorker, now: float, asked: bool = False) -> TrackedWorker:
        """Keep what ``worker``'s ended process left, start its next one;
        one ``asked`` for from outside (or by an echo) uses none of its
        restarts, one for its own failure opens the window of its echoes."""
        i = worker.index
        worker.handle.join(0)
        worker.handle.kill_tree()       # what the ended process started goes with it
        worker.handle.join(5)
        if worker.seen.exit_code is None:
            worker.note(exit_code=worker.handle.exitcode)
        self.history[i].append(self._result_of(worker, self.incarnation(i)))
        worker.handle.close()
        self.ended.append(worker.handle)
        if not asked:
            self.left[i] -= 1
            self.failed_at, self.together = now, 0
        return self._start(i, self.incarnation(i))


def specs_dir(files: str, index: int, incarnation: int) -> str:
    """Where worker ``index``'s ``incarnation``-th process keeps its files
    (the first one's are the attempt's own)."""
    if incarnation == 0:
        return files
    path = os.path.join(files, f"worker-{index}-restart-{incarnation}")
    os.makedirs(path, 0o700, exist_ok=True)
    return path


def incarnation_plan(plan: Sequence, incarnations: Sequence[int]) -> tuple:
    """The faults of ``plan`` that belong to each worker's current
    incarnation (a fault's ``attempt`` is its worker's restart count)."""
    return tuple(f for f in plan if f.attempt == incarnations[f.worker])
