"""What ``mwms_cluster.run()`` returns: per-worker results and the verdict."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional, Tuple

from harness.core.protocol import WorkerError
from harness.errors import SettingError
from harness.diagnosis.observations import Outcome, RunObservation, WorkerObservation

if TYPE_CHECKING:
    from harness.diagnosis.verdict import Verdict

LOG_TAIL_LINES = 30


@dataclasses.dataclass(frozen=True)
class WorkerResult:
    """One worker's part of a run.

    ``index`` is the worker's index (its ``TF_CONFIG`` task);
    ``return_value`` is what ``fn`` returned (None if it did not);
    ``exception`` a :class:`WorkerError` (type name, message, traceback text)
    or None; ``exit_code`` is negative for death by a signal; ``log`` all the
    worker wrote to stdout and stderr, C++ logging included (head and tail
    kept when it is very long); ``last_step`` the last step boundary it
    reported; ``stack`` its Python stacks, dumped when the run was found hung
    (or its peers' grace ran out); ``collectives`` the collectives its ledger
    recorded (:class:`~harness.diagnosis.observations.Collective`: function, call, step,
    kind, shape, dtype, state), empty when the ledger was off;
    ``observation`` what the parent observed of it
    (:class:`~harness.diagnosis.observations.WorkerObservation`); ``pid`` its
    process id (None where the backend does not say); ``attempt`` which run
    of this task it is (its cluster's attempt, or under
    ``restart_policy="task"`` how many times the task was restarted before);
    ``attempts``: under ``restart_policy="task"``, each of the task's
    processes in order, this last one included (one :class:`WorkerResult`
    each: a restarted task's ended ones hold its error, exit code, log and
    steps).
    """

    index: int
    return_value: Any = None
    exception: Optional[WorkerError] = None
    exit_code: Optional[int] = None
    log: str = ""
    last_step: Optional[int] = None
    stack: str = ""
    observation: Optional[WorkerObservation] = dataclasses.field(default=None, repr=False)
    attempt: int = 0
    pid: Optional[int] = None
    attempts: Tuple[WorkerResult, ...] = dataclasses.field(default=(), repr=False)

    @property
    def restarts(self) -> int:
        """How many times this task was restarted (``restart_policy="task"``)."""
        return max(0, len(self.attempts) - 1)

    @property
    def collectives(self) -> tuple:
        """The collectives the worker's ledger recorded (see above)."""
        return self.observation.collectives() if self.observation is not None else ()

    @property
    def returned(self) -> bool:
        """Whether ``fn`` returned on this worker."""
        return self.observation.returned if self.observation else self.exception is None

    @property
    def died_at_exit(self) -> bool:
        """Whether this worker returned and its process then died, by a signal
        or a non-zero status (``Outcome.CRASHED_AT_EXIT``)."""
        return bool(self.observation and self.observation.died_at_exit)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the worker's log."""
        return "\n".join(self.log.rstrip().splitlines()[-lines:])


@dataclasses.dataclass(frozen=True, repr=False)
class RunResult:
    """The outcome of one run on the cluster: its diagnosis's
    :class:`~harness.diagnosis.Verdict` (``verdict``), and what each worker
    left.  ``outcome``, ``culprits``, ``diagnosis``, ``step``, ``error``,
    ``ambiguous`` and ``faults_never_acted`` are the verdict's, read through.

    - ``outcome``: an :class:`~harness.diagnosis.observations.Outcome`, equal
      to ``"completed"``, ``"failed"``, ``"crashed"`` or ``"hang"``
      (precedence in that reverse order: a crash outranks an error, an
      error outranks a hang), or ``"crashed_at_exit"``: every worker
      returned its value (``return_values`` hold them), then a worker's
      process died at exit (``on_return="exit"``), which a cluster manager
      reads as a failed job; not a pass, and not restarted by
      ``restart_on``, which names outcomes of training.
    - ``workers``: a :class:`WorkerResult` per worker, by index (in a
      cluster with a chief, the chief is 0 and the workers follow; an
      evaluator is last); ``tasks`` the same by ``(type, index)``.
    - ``culprits``: the worker indexes the diagnosis blames (sorted);
      ``culprit_tasks`` the same as ``(type, index)``.
    - ``diagnosis``: the text to read first.
    - ``duration``: seconds from launch to verdict, every attempt included.
    - ``observation``: what the parent observed
      (:class:`~harness.diagnosis.observations.RunObservation`), the
      diagnosis's only input; ``to_dict()`` records it.
    - ``verdict``: the diagnosis's :class:`~harness.diagnosis.Verdict`
      (outcome, culprits, step, error, ``ambiguous``, the rule that decided,
      the stages after it).
    - ``faults_never_acted``: (fault, why) for each fault asked for whose
      worker finished without reaching it: such a run is ``failed``,
      whatever its workers did, and its diagnosis says so first.
    - ``attempt``: which attempt this result is (0 unless restarted).
    - ``attempts``: with ``restarts``, every attempt's own result, in order.
    - ``phases``: where the time went, seconds by phase, in order
      (:mod:`harness.controller.phases`), every attempt added up.
    """

    workers: Tuple[WorkerResult, ...]
    duration: float
    observation: RunObservation
    verdict: Verdict
    attempt: int = 0
    attempts: Tuple[RunResult, ...] = ()
    phases: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __repr__(self) -> str:
        return (f"RunResult(outcome={self.outcome!r}, culprits={self.culprits!r}, "
                f"duration={self.duration:.1f}, attempt={self.attempt}, "
                f"workers={self.workers!r})")

    @property
    def outcome(self) -> str:
        """The verdict's outcome (see above)."""
        return self.verdict.outcome

    @property
    def culprits(self) -> Tuple[int, ...]:
        """The worker indexes the diagnosis blames, sorted."""
        return self.verdict.culprits

    @property
    def diagnosis(self) -> str:
        """The verdict's text: what to read first."""
        return self.verdict.text

    @property
    def faults_never_acted(self) -> Tuple[Tuple[str, str], ...]:
        """(fault, why) for each fault asked for that never acted."""
        return self.verdict.faults_never_acted

    @property
    def tasks(self) -> dict:
        """Each task's :class:`WorkerResult` by ``(type, index)`` as its
        ``TF_CONFIG`` names it: ``result.tasks[("worker", 1)]``; in a cluster
        of workers only, ``("worker", i)`` is ``workers[i]``."""
        return {self.observation.task(w.index): w for w in self.workers}

    @property
    def culprit_tasks(self) -> Tuple[Tuple[str, int], ...]:
        """The culprits as ``(type, index)``: ``(("worker", 1),)``."""
        return tuple(self.observation.task(i) for i in self.culprits)

    @property
    def return_values(self) -> list:
        """What ``fn`` returned on each worker (None where it did not)."""
        return [w.return_value for w in self.workers]

    @property
    def ambiguous(self) -> bool:
        """True when the diagnosis could not single out a culprit and named
        every candidate (two workers out of step, two disagreeing configs)."""
        return self.verdict.ambiguous

    @property
    def replicas(self):
        """The replica check's finding
        (:class:`~harness.diagnosis.observations.ReplicaCheck`), or None when
        it was off or not every worker returned."""
        return self.observation.replicas

    @property
    def memory(self) -> tuple:
        """Each worker's memory over the run, by index: a
        :class:`~harness.diagnosis.memory.MemoryGrowth` with the parent's
        samples of its resident set, the ``(step, bytes)`` each step ended
        with, and the rate of growth fitted past TensorFlow's warm-up
        (``mib_per_step``, None where there is too little to fit, with
        ``why_none``) and whether it grows steadily (``steady``)."""
        from harness.diagnosis.memory import memory_growth
        return memory_growth(self.observation)

    @property
    def stragglers(self) -> Tuple[int, ...]:
        """The workers the others waited for at the collectives, from the
        ledger's call times: each arrived last at most calls, milliseconds
        and a good share of a step after the others, by its own work
        between calls (see :mod:`harness.diagnosis.stragglers`).  Empty
        when none stands out, when not every worker returned, when there
        are too few calls to tell (under 8 of a function), or when the
        ledger was off; a slow link slows every worker alike and names
        none."""
        from harness.diagnosis.stragglers import stragglers
        return stragglers(self.observation).stragglers

    @property
    def restarts(self) -> int:
        """How many times the run was restarted."""
        return max(0, len(self.attempts) - 1)

    @property
    def step(self) -> Optional[int]:
        """Where things went wrong: the step the others wait in for the
        culprit, else the culprit's last step (None when completed)."""
        return self.verdict.step

    @property
    def error(self) -> Optional[str]:
        """The type name of the root error (``"StepDesyncError"``,
        ``"ReplicaDivergence"``, ``"CollectiveOrderDivergence"``, ...), when
        there is one."""
        return self.verdict.error

    def report(self) -> str:
        """The diagnosis, then the log tail of each worker that did not
        return, or died at exit."""
        parts = [self.diagnosis]
        for w in self.workers:
            if w.observation is not None and w.observation.returned and not w.died_at_exit:
                continue
            parts.append(f"--- worker {w.index} (exit code {w.exit_code}), last "
                         f"{LOG_TAIL_LINES} log lines ---\n{w.log_tail() or '(empty log)'}")
        return "\n".join(parts)

    def timeline(self, path: str) -> Tuple[str, str]:
        """Write this run's timeline (every attempt) as ``PATH.trace.json``, a
        Chrome trace for Perfetto or ``chrome://tracing``, and ``PATH.svg``,
        a picture that needs no viewer; return the two paths.  Every run
        can be drawn (no worker started, no step, several attempts); the
        two files are written whole or not at all, and an ``OSError`` (an
        unwritable folder, a full disk) leaves neither.  See
        :mod:`harness.report.timeline`."""
        from harness.report import timeline
        return timeline.write(self, str(path))

    # -- assertions ------------------------------------------------------
    def _check(self, outcome: str, culprits: Optional[Iterable[int]] = None,
               step: Optional[int] = None, error: Optional[str] = None) -> RunResult:
        __tracebackhide__ = True   # pytest shows the test's line, not this one
        problems = []
        if self.outcome != outcome:
            problems.append(f"expected outcome {outcome!r}, got {self.outcome!r}")
        if culprits is not None and tuple(sorted(culprits)) != tuple(self.culprits):
            problems.append(f"expected culprits {tuple(sorted(culprits))}, "
                            f"diagnosis blames {tuple(self.culprits)}")
        if step is not None and self.step != step:
            problems.append(f"expected step {step}, diagnosis says {self.step}")
        if error is not None and not _error_matches(self, error):
            problems.append(f"expected error {error!r}, diagnosis says {self.error!r}")
        if problems:
            self._fail("; ".join(problems))
        return self

    def _fail(self, problem: str) -> None:
        """Raise the AssertionError of a failed ``assert_*``: the diagnosis
        first, then what was expected.  The workers' log tails and stacks are
        not in it: under pytest they are report sections of their own (see
        :mod:`harness.plugin`); elsewhere :meth:`report` has them."""
        __tracebackhide__ = True
        raise AssertionError(f"{self.diagnosis}\n{problem}")

    def assert_completed(self) -> RunResult:
        """The run completed; else an AssertionError that starts with the diagnosis."""
        __tracebackhide__ = True
        return self._check(Outcome.COMPLETED)

    def assert_hang(self, culprits: Optional[Iterable[int]] = None,
                    step: Optional[int] = None) -> RunResult:
        """The run hung; with ``culprits`` and ``step``, blamed on exactly
        those workers, at that step."""
        __tracebackhide__ = True
        return self._check(Outcome.HANG, culprits, step)

    def assert_failed(self, culprits: Optional[Iterable[int]] = None,
                      error: Optional[str] = None) -> RunResult:
        """The run failed; ``error`` names the root error's type, or appears
        in a culprit's message."""
        __tracebackhide__ = True
        return self._check(Outcome.FAILED, culprits, error=error)

    def assert_crashed(self, culprits: Optional[Iterable[int]] = None) -> RunResult:
        """A worker died (not by the harness's hand); ``culprits`` as above."""
        __tracebackhide__ = True
        return self._check(Outcome.CRASHED, culprits)

    def assert_crashed_at_exit(self, culprits: Optional[Iterable[int]] = None) -> RunResult:
        """Every worker returned its value (training completed), and then
        ``culprits``' processes died at exit (``Outcome.CRASHED_AT_EXIT``)."""
        __tracebackhide__ = True
        return self._check(Outcome.CRASHED_AT_EXIT, culprits)

    def assert_no_straggler(self, max_wait: Optional[float] = None) -> RunResult:
        """No worker is a straggler (see :attr:`stragglers`).  With
        ``max_wait``, a number in (0, 1]: a straggler is allowed as long as
        the others spend at most that share of each step waiting for it
        (their median wait over the calls where it came last, divided by
        the step); ``max_wait=0.25`` fails a run whose peers wait more than
        a quarter of every step."""
        __tracebackhide__ = True
        limit = _share(max_wait, "assert_no_straggler(max_wait=...)")
        from harness.diagnosis.stragglers import stragglers
        report = stragglers(self.observation)
        over = [i for i in report.stragglers
                if limit is None or report.arrival(i).others_wait > limit]
        if over:
            waits = ", ".join(f"{report.arrival(i).others_wait:.0%} for worker {i}" for i in over)
            expected = ("no straggler" if limit is None else
                        f"the others to wait at most {limit:.0%} of each step for a straggler")
            self._fail(f"expected {expected}; the others wait {waits}")
        return self

    def assert_memory_flat(self, mib_per_step: Optional[float] = None) -> RunResult:
        """No worker's memory grows faster than ``mib_per_step`` MiB per step
        (a positive number; default
        :data:`~harness.diagnosis.memory.FLAT_MIB_PER_STEP`), by the rate
        fitted past the warm-up (:attr:`memory`).  A worker with no rate
        (no samples, too few steps) fails it too: flat was not shown."""
        __tracebackhide__ = True
        from harness.diagnosis.memory import FLAT_MIB_PER_STEP, growth_text, memory_growth
        limit = _positive(mib_per_step, "assert_memory_flat(mib_per_step=...)")
        limit = FLAT_MIB_PER_STEP if limit is None else limit
        grown = memory_growth(self.observation)
        problems = [f"worker {g.worker}: no rate ({g.why_none})" for g in grown
                    if g.mib_per_step is None] or (["no worker's memory was sampled"]
                                                   if not grown else [])
        problems += [growth_text(g) for g in grown if g.grows(limit)]
        if problems:
            self._fail(f"expected no worker's memory to grow faster than {limit:g} MiB per "
                       f"step; " + "; ".join(problems))
        return self

    def assert_culprit(self, worker: int) -> RunResult:
        """The diagnosis names ``worker``, alone and without doubt."""
        __tracebackhide__ = True
        if self.ambiguous or tuple(self.culprits) != (worker,):
            self._fail(f"expected culprit {worker} alone; diagnosis blames "
                       f"{tuple(self.culprits)}{' (ambiguous)' if self.ambiguous else ''}")
        return self

    def assert_cannot_tell(self, candidates: Iterable[int]) -> RunResult:
        """The diagnosis says it cannot tell, and names exactly ``candidates``."""
        __tracebackhide__ = True
        candidates = tuple(sorted(candidates))
        if not self.ambiguous or tuple(self.culprits) != candidates:
            self._fail(f"expected 'cannot tell' among {candidates}; diagnosis blames "
                       f"{tuple(self.culprits)}{' (ambiguous)' if self.ambiguous else ''}")
        return self


def _share(value: Optional[float], argument: str) -> Optional[float]:
    """``value`` as a share in (0, 1] (None stays None), or a SettingError naming ``argument``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise SettingError(f"{argument}: must be a number in (0, 1] (a share of each step), "
                           f"got {value!r}")
    return float(value)


def _positive(value: Optional[float], argument: str) -> Optional[float]:
    """``value`` as a positive number (None stays None), or a SettingError naming ``argument``."""
    from harness.errors import SettingError
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not 0 < value < float("inf")):
        raise SettingError(f"{argument}: must be a positive number (MiB per step), got {value!r}")
    return float(value)


def _error_matches(result: RunResult, error: str) -> bool:
    """``error`` names the root error's type, or appears in a culprit's message."""
    if result.error == error:
        return True
    for i in result.culprits:
        exc = result.workers[i].exception
        if exc is not None and (exc.type_name == error or error in exc.message):
            return True
    return False
