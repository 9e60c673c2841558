"""Worker side: what ``fn`` sees of the harness while it runs in a worker.

``harness.context()`` returns the :class:`WorkerContext` of the worker it is
called in.  Its ``steps(n)`` loop is where progress is reported to the parent
and where step-keyed faults act; a Keras ``fit`` gets the same through
``keras_callback()``.
"""
from __future__ import annotations

import itertools
import operator
from typing import Callable, Dict, Iterator, Optional, Tuple

from harness.core import linux, progress, protocol
from harness.errors import NotInWorkerError
from harness.faults import Fault
from harness.plan import at_step
from harness.worker.checkpoints import state_of
from harness.worker.actions import act_out, replaces_step, reports_itself

_current: Optional[WorkerContext] = None


def activate(ctx: WorkerContext) -> None:
    """Make ``ctx`` what :func:`context` returns in this process (the worker's entry point does)."""
    global _current
    _current = ctx


def context() -> WorkerContext:
    """The context of the worker this code runs in.

    Raises :class:`~harness.errors.NotInWorkerError` when called in the
    pytest process or any process the harness did not start as a worker.
    """
    if _current is None:
        raise NotInWorkerError(
            "harness.context() is only available inside a function run by "
            "mwms_cluster.run(); here there is no MWMS worker")
    return _current


class WorkerContext:
    """One worker's view of its cluster.

    ``index`` is this task's place among the tasks in the collectives
    (MWMS's order: the chief first, when there is one), ``num_workers``
    their number, ``task_type`` and ``task_index`` the task as its
    ``TF_CONFIG`` names it (``("worker", 1)``), ``is_chief`` true for index
    0 (the chief, or worker 0 in a cluster of workers only), ``attempt``
    which attempt of a run with restarts this is (0, then 1 after the first
    restart, and so on), ``reference`` True in the single-worker reference
    run of ``run(reference=True)`` (where ``cluster_workers`` is still the
    N it stands in for), ``tf_config`` the dict its ``TF_CONFIG`` holds
    (None when a fault removed it) and ``strategy`` the MultiWorkerMirroredStrategy ``fn``
    created, once it has.  ``run_dir`` is a directory of the run's own,
    shared by its workers and kept across its attempts and restarts (the
    place for the job's checkpoints), removed with the run (a reference run has one of its own,
    empty); None in a job the recorder watches.

    The rest is the harness's own bookkeeping in this worker:
    ``creating_strategy`` is True while the strategy's constructor runs,
    ``keras_batches`` counts the batches the Keras callback has seen (its
    step numbers run across epochs), ``current_step`` is the step whose
    boundary was reported last (the ledger files calls under it),
    ``progress_map`` writes the progress map (:mod:`harness.core.progress`);
    ``explicit_steps`` turns True when ``fn`` reports steps itself (else
    ``automatic_steps`` counts the calls of collective-launching functions
    as steps, see :meth:`automatic_step`; ``step_function`` names the one
    function whose calls count, when given), ``in_boundary`` is True while
    a boundary's faults and sync check run, ``acted`` holds the faults that
    have acted, ``replica_variables`` the strategy's variables as they are
    created (when the run checks replicas), and ``traced`` keeps the
    ``tf.function``\\ s the harness traces once per worker (the sync check,
    an extra collective), by purpose.
    """

    def __init__(self, index: int, num_workers: int, tf_config: Optional[dict],
                 send: Callable[..., None], faults: Tuple[Fault, ...] = (),
                 sync_check: bool = False, progress_map: Optional[progress.Writer] = None,
                 step_function: Optional[str] = None, attempt: int = 0,
                 check_replicas: bool = False, reference_workers: int = 0,
                 wait_applied: Optional[Callable[[], None]] = None,
                 run_dir: Optional[str] = None, watch_state: bool = False):
        self.index = index
        self.run_dir = run_dir
        # What run_dir held at the last boundary, when the run watches it.
        self.state: Optional[Dict[str, tuple]] = {} if watch_state and run_dir else None
        self.attempt = attempt
        # A single-worker reference run stands in for a cluster of this many.
        self.reference = reference_workers > 0
        self.cluster_workers = reference_workers or num_workers
        self.num_workers = num_workers
        self.tf_config = tf_config
        self.sync_check = sync_check
        self.faults = tuple(f for f in faults if f.worker == index)
        self.strategy = None
        self.creating_strategy = False
        self.strategy_tf_config: Optional[dict] = None   # the TF_CONFIG ctx.strategy was made with
        self.keras_batches = 0
        self.traced: Dict[str, Callable] = {}
        self.current_step: Optional[int] = None
        self.explicit_steps = False
        self.automatic_steps = 0
        self.step_function = step_function
        self.in_boundary = False
        self.acted: set = set()
        self.armed: set = set()   # faults that report themselves when they act (files)
        self.send = send
        # Blocks until the parent has put a network fault in place.
        self.wait_applied = wait_applied
        self.progress_map = progress_map
        # (name, variable) for each variable the strategy creates, when the
        # run checks its replicas (see harness.worker.replicas); else None.
        self.replica_variables: Optional[list] = [] if check_replicas else None
        # In a job's own process (harness.record): watch, change nothing.
        self.observe_only = False
        # The chief of a parameter-server cluster, whose fn coordinates.
        self.coordinates = False
        # Where its coordinator waits for a worker to go (WorkerSpec.holds).
        self.holds: tuple = ()

    @property
    def is_chief(self) -> bool:
        return self.index == 0

    @property
    def task_type(self) -> str:
        """``chief``, ``worker`` or ``evaluator``: this task's type in its
        ``TF_CONFIG`` (``worker`` when a fault removed it)."""
        return self._task()[0]

    @property
    def task_index(self) -> int:
        """This task's index among the tasks of its type, as in its ``TF_CONFIG``."""
        return self._task()[1]

    def _task(self) -> Tuple[str, int]:
        task = (self.tf_config or {}).get("task") or {}
        try:
            return str(task["type"]), int(task["index"])
        except (KeyError, TypeError, ValueError):
            return "worker", self.index

    def global_batch_size(self, per_worker_batch: int) -> int:
        """``per_worker_batch`` times the workers of the run under test: the
        global batch, the same in the run (N workers) and in its
        single-worker reference (``run(reference=True)``), where the number
        of workers in ``TF_CONFIG`` is 1.  Use it where a tutorial writes
        ``per_worker_batch * num_workers``."""
        return int(per_worker_batch) * self.cluster_workers

    def __repr__(self) -> str:
        return f"WorkerContext(index={self.index}, num_workers={self.num_workers})"

    # -- progress -------------------------------------------------------
    def steps(self, n: Optional[int] = None) -> Iterator[int]:
        """Iterate over ``0..n-1``, reporting each step boundary to the parent.

        Step-keyed faults for this worker act here, after the boundary is
        reported and before the step's body runs: a ``SkipStep`` makes the
        loop not yield that step, as a ``continue`` at the top of the body
        would (the boundary is reported all the same).  With ``n=None`` it counts without
        end, for loops driven by something else:
        ``for batch, k in zip(dist_dataset, ctx.steps()):``.
        """
        if n is not None:
            asked = n
            try:   # any integer: numpy's and TensorFlow's step counts too
                n = operator.index(n) if not isinstance(n, bool) else -1
            except TypeError:
                n = -1
            if n < 0:
                raise ValueError(f"steps(n): n must be an integer 0 or more or None, "
                                 f"got {asked!r}")
        self.explicit_steps = True
        ran = 0
        for k in (range(n) if n is not None else itertools.count()):
            ran += 1
            if self.step_boundary(k):
                yield k
        self.send(protocol.STEPS_DONE, step=ran, data=n)

    def _due(self, step: int):
        """The faults at ``step`` that have not acted yet (each acts once, so
        a second loop that numbers its steps from 0 again does not repeat them)."""
        return [f for f in at_step(self.faults, step)
                if f not in self.acted and f not in self.armed]

    def _act(self, f, step: int) -> None:
        if reports_itself(f):
            self.armed.add(f)
        else:
            self.acted.add(f)
            self.send(protocol.FAULT, step=step, data=f)
        act_out(f, self)

    def step_boundary(self, step: int) -> bool:
        """Report step ``step`` and act out its faults; False when the step's
        body is not to run.  ``steps()`` and the Keras callback call it."""
        self.in_boundary = True
        try:
            if self.armed:
                from harness.worker.files import at_boundary
                at_boundary(self)
            self.current_step = step
            # The resident set at each boundary: a memory rate for a job
            # of any speed (the parent's samples are 10 a second).
            resident = linux.resident_bytes()
            if self.progress_map is not None:
                self.progress_map.write(progress.STEP, number=step, detail=resident)
            else:
                self.send(protocol.STEP, step=step, data=resident)
            if self.sync_check and self.strategy is not None:
                from harness.worker.sync import check_step_sync
                check_step_sync(self, step)
            if self.state is not None:
                self._state_changes(step)
            run_body = True
            for f in self._due(step):
                self._act(f, step)
                run_body = run_body and not replaces_step(f)
            return run_body
        finally:
            self.in_boundary = False

    def _state_changes(self, step: int) -> None:
        """Tell the parent which files of run_dir were written since the
        last boundary (:data:`~harness.core.protocol.SAVED`)."""
        assert self.run_dir is not None and self.state is not None
        now = state_of(self.run_dir)
        written = sorted(name for name, stat in now.items() if self.state.get(name) != stat)
        self.state = now
        if written:
            self.send(protocol.SAVED, step=step, data={"files": written[:8]})

    def skip_due(self) -> bool:
        """Whether the next automatic step has a SkipStep to act."""
        return not self.explicit_steps and any(
            replaces_step(f) for f in self._due(self.automatic_steps))

    def automatic_step(self, function_name: str) -> Optional[bool]:
        """Called by the ledger as a ``tf.function`` that launches collectives
        is about to run: where ``fn`` reports no steps of its own, that call
        is the next step.  None when it is not a step (explicit steps are
        in use, another function was named as the step, or the harness is
        acting a fault or checking sync); else whether the call is to run.

        A ``SkipStep`` makes the call not happen and not count, as a
        ``continue`` before the call would: no boundary is reported for it,
        and the next call is the same step number.
        """
        if self.explicit_steps or self.in_boundary:
            return None
        if self.step_function is not None and function_name != self.step_function:
            return None
        step = self.automatic_steps
        skips = [f for f in self._due(step) if replaces_step(f)]
        if skips:
            for f in skips:
                self.acted.add(f)
                self.send(protocol.FAULT, step=step, data=f)
            return False
        self.automatic_steps += 1
        return self.step_boundary(step)

    def keras_callback(self):
        """A Keras callback that counts training batches as steps.

        Batches are numbered across epochs, so step 25 of a 10-batch epoch
        is the sixth batch of the third epoch.  It works with Keras 3 and
        with tf_keras (``TF_USE_LEGACY_KERAS=1``); ``SkipStep`` cannot act
        here (``fit`` has no way to skip a batch) and is rejected.
        """
        from harness.worker.keras import make_keras_callback
        return make_keras_callback(self)
