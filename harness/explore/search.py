"""The search: plans drawn by hypothesis, run one after another on the
cluster until one breaks the property or the budget (seconds) is spent;
then the failing plan shrunk while its signature stays the same.

:func:`explore` is generic over how a plan runs (``run(plan, timeout)``
returns a :class:`~harness.result.RunResult`), so
:meth:`harness.controller.cluster.Cluster.explore` and ``harness explore``
both come here.  Its steps:

1. the job runs without faults: it must complete and hold the property,
   and it says how many steps there are to draw from and how long a step
   takes (the plans' hang timeout, unless one is given, is five times the
   longest wait between two steps of that run, at least
   :data:`LEAST_TIMEOUT`, at most the cluster's);
2. the plans saved from earlier searches of the same job run first
   (hypothesis's example database, :class:`SavedPlans`);
3. plans drawn from :func:`harness.strategies.plans` run until one fails
   or the budget is spent (or hypothesis has drawn every plan there is);
4. a failing plan shrinks (:mod:`harness.explore.shrink`) within
   ``shrink_budget`` seconds: each simpler plan whose run fails with the
   same signature (:mod:`harness.explore.properties`) takes its place.

Runs are never repeated: a plan drawn twice is judged once.
"""
from __future__ import annotations

import collections
import dataclasses
import random
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from harness import faults_text
from harness.explore.properties import NEVER_ACTED, Check, Signature, headline, signature_of
from harness.explore.shrink import Plan, simpler

# The least hang timeout a plan's run gets: above the longest pause or
# delay a drawn plan holds that a job should survive (a second), with room
# for a loaded machine.
LEAST_TIMEOUT = 3.0
# A plan's hang timeout is this many times the longest wait between steps
# of the fault-free run.
TIMEOUT_FACTOR = 5.0


@dataclasses.dataclass(frozen=True)
class BreakingPlan:
    """The smallest plan found that breaks the property, and its run."""

    plan: Plan
    result: object                 # its RunResult
    signature: Signature
    how: str                       # what broke, in words
    found: Plan                    # the plan the search drew, before shrinking
    shrink_runs: int = 0
    shrink_seconds: float = 0.0

    @property
    def line(self) -> str:
        """``faults=[...]``: paste it into ``run()`` to see the failure again."""
        return faults_text.plan_line(self.plan)


@dataclasses.dataclass(frozen=True)
class Exploration:
    """What a search did: ``runs`` plans run (the fault-free run, saved
    plans and the search's draws; the shrink's are in ``failure``),
    ``outcomes`` how they ended (a histogram), ``seconds`` each run's wall
    time, ``steps`` the job's steps, ``timeout`` the plans' hang timeout,
    ``exhausted`` True when every plan there is was run, ``seed`` the
    seed that draws the same plans again, ``failure`` None or a
    :class:`BreakingPlan`."""

    property: str
    runs: int
    outcomes: Dict[str, int]
    seconds: Tuple[float, ...]
    steps: int
    timeout: float
    seed: int
    exhausted: bool
    search_seconds: float
    failure: Optional[BreakingPlan] = None

    @property
    def runs_per_minute(self) -> float:
        return 60.0 * self.runs / self.search_seconds if self.search_seconds > 0 else 0.0

    def summary(self) -> str:
        seen = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))
        head = (f"explore ({self.property}): {self.runs} runs in {self.search_seconds:.1f} s "
                f"({self.runs_per_minute:.0f}/min; {seen}); {self.steps} steps, hang timeout "
                f"{self.timeout:g} s, seed {self.seed}"
                + ("; every plan was run" if self.exhausted else ""))
        f = self.failure
        if f is None:
            return head + "\nno plan broke the property"
        return "\n".join([
            f"{f.line}",
            f"  breaks '{self.property}': {f.how}",
            f"  signature: {f.signature}",
            f"  found as {faults_text.plan_line(f.found)}; shrunk in {f.shrink_runs} runs "
            f"({f.shrink_seconds:.1f} s)",
            "  " + head])


class SavedPlans:
    """Failing plans kept from one search to the next, in hypothesis's
    example database (``settings.default.database``: ``.hypothesis/`` by
    default, none when a profile turns it off), as their ``faults=[...]``
    lines under a key naming the job and the property."""

    def __init__(self, key: str, database=None):
        if database is None:
            from hypothesis import settings
            database = settings.default.database
        self.database = database
        self.key = f"pytest-mwms explore: {key}".encode()

    def lines(self) -> List[str]:
        if self.database is None:
            return []
        return sorted(v.decode("utf-8", "replace") for v in self.database.fetch(self.key))

    def save(self, line: str) -> None:
        if self.database is not None:
            self.database.save(self.key, line.encode())

    def drop(self, line: str) -> None:
        if self.database is not None:
            self.database.delete(self.key, line.encode())


class _Stop(Exception):
    """Ends hypothesis's drawing: a failure was found or the budget is spent."""


def each_drawn(strategy, seed: int, visit: Callable[[Plan], None]) -> bool:
    """Call ``visit`` on plans hypothesis draws from ``strategy`` (seeded:
    the same plans in the same order for the same seed) until it raises
    :class:`_Stop`; True when hypothesis ran out of plans to draw first.
    ``visit`` must give the same answer for a plan it has seen: hypothesis
    calls it once more with the plan that stopped it."""
    from hypothesis import HealthCheck, Phase, Verbosity, given, settings
    from hypothesis import seed as seeded

    @seeded(seed)
    @settings(database=None, max_examples=1_000_000, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), derandomize=False,
              verbosity=Verbosity.quiet, report_multiple_bugs=False, print_blob=False)
    @given(strategy)
    def draw(plan):
        visit(plan)

    try:
        draw()
    except _Stop:
        return False
    return True


def longest_wait(result) -> float:
    """The longest time between two successive steps of ``result`` (the
    start and the end included) on any worker, seconds."""
    longest = 0.0
    for w in result.observation.workers:
        times = [0.0] + sorted(e.time for e in w.events if e.kind == "step")
        if w.finish_time is not None:
            times.append(w.finish_time)
        longest = max([longest] + [b - a for a, b in zip(times, times[1:])])
    return longest


def job_steps(result) -> int:
    """How many steps the fault-free run took (the most any worker took)."""
    return max((w.last_step + 1 for w in result.workers if w.last_step is not None), default=0)


@dataclasses.dataclass
class _Judged:
    result: object
    check: Check
    seconds: float


class Search:
    """One exploration's state: what each plan gave, the clock, the budget."""

    def __init__(self, run: Callable[[Plan, float], object],
                 judge: Callable[[object, Plan], Check], budget: float,
                 clock: Callable[[], float] = time.monotonic):
        self.run, self.judge, self.budget, self.clock = run, judge, budget, clock
        self.judged: Dict[Plan, _Judged] = {}
        self.outcomes: Dict[str, int] = collections.Counter()
        self.seconds: List[float] = []
        self.timeout = 0.0
        self.started = clock()

    def left(self, since: float, budget: float) -> bool:
        return self.clock() - since < budget

    def try_plan(self, plan: Plan, count: bool = True) -> _Judged:
        """Run ``plan`` once (a plan seen before gives its first answer)."""
        if plan in self.judged:
            return self.judged[plan]
        t0 = self.clock()
        result = self.run(plan, self.timeout)
        judged = _Judged(result, self.judge(result, plan), self.clock() - t0)
        self.judged[plan] = judged
        if judged.check.signature is None and plan:
            judged.result = None   # only failures are kept whole: a search runs hundreds
        if count:
            self.seconds.append(judged.seconds)
            self.outcomes[_tally(result, judged.check)] += 1
        return judged

    def shrink(self, plan: Plan, target: Signature, kinds: Sequence[str],
               budget: float) -> Tuple[Plan, int, float]:
        """The simplest plan reached from ``plan`` whose run keeps
        ``target``'s signature, within ``budget`` seconds: (plan, runs, seconds)."""
        t0, runs = self.clock(), 0
        progressed = True
        while progressed and self.left(t0, budget):
            progressed = False
            for candidate in simpler(plan, kinds):
                if not self.left(t0, budget):
                    break
                fresh = candidate not in self.judged
                judged = self.try_plan(candidate, count=False)
                runs += fresh
                if judged.check.signature == target:
                    plan, progressed = candidate, True
                    break
        return plan, runs, self.clock() - t0


def _tally(result, check: Check) -> str:
    """How a run counts in the histogram: its outcome, and the broken
    promise when the property broke."""
    outcome = str(result.outcome)
    if check.how == NEVER_ACTED.how:
        return NEVER_ACTED.how
    if check.signature is not None and check.signature.broken:
        return f"{outcome} ({check.signature.broken})"
    return outcome


def explore(run: Callable[[Plan, float], object], judge: Callable[[object, Plan], Check], *,
            strategy_for: Callable[[int], object], kinds: Sequence[str], property: str,
            budget: float, shrink_budget: float, seed: Optional[int],
            timeout: Optional[float], most_timeout: float,
            saved: Optional[SavedPlans] = None,
            is_valid: Callable[[Plan, int], bool] = lambda plan, steps: True,
            clock: Callable[[], float] = time.monotonic) -> Exploration:
    """See the module docstring.  ``strategy_for(steps)`` is the plans'
    strategy once the job's steps are known; ``is_valid(plan, steps)``
    says whether a saved plan still fits the cluster and the job (one that
    does not is dropped)."""
    seed = random.SystemRandom().randrange(2 ** 32) if seed is None else seed
    search = Search(run, judge, budget, clock)
    search.timeout = most_timeout
    clean = search.try_plan(())
    steps = job_steps(clean.result)
    search.timeout = timeout if timeout is not None else min(
        most_timeout, max(LEAST_TIMEOUT, TIMEOUT_FACTOR * longest_wait(clean.result)))
    found: Optional[Plan] = None
    if clean.check.signature is not None:
        found = ()
    elif str(clean.result.outcome) != "completed":
        # A job that fails with no fault at all: that is the failure.
        found = ()
        search.judged[()] = _Judged(clean.result, Check(signature_of(clean.result, ()),
                                                        headline(clean.result)), clean.seconds)
    exhausted = False
    if found is None and steps == 0:
        from harness.errors import SettingError
        raise SettingError(
            "explore: the job reported no steps in its fault-free run, so no step-keyed fault "
            "can act; report them with harness.context().steps(n), the Keras callback, or "
            "step_fn= (see run())")
    for line in (saved.lines() if saved is not None and found is None else ()):
        if not search.left(search.started, budget):
            break
        try:
            plan = faults_text.parse_plan(line)
        except Exception:
            plan = None
        if plan is None or not is_valid(plan, steps):
            saved.drop(line)
            continue
        if search.try_plan(plan).check.signature is not None:
            found = plan
            break
        saved.drop(line)   # it no longer fails: the bug was fixed

    if found is None:
        stop: List[Plan] = []

        def visit(plan: Plan) -> None:
            plan = tuple(plan)
            if stop:
                raise _Stop
            if not search.left(search.started, budget):
                raise _Stop
            if search.try_plan(plan).check.signature is not None:
                stop.append(plan)
                raise _Stop

        exhausted = each_drawn(strategy_for(steps), seed, visit)
        found = stop[0] if stop else None
    search_seconds = clock() - search.started

    failure = None
    if found is not None:
        target = search.judged[found].check.signature
        plan, runs, seconds = search.shrink(found, target, kinds, shrink_budget)
        best = search.judged[plan]
        failure = BreakingPlan(plan, best.result, target, best.check.how, found, runs, seconds)
        if saved is not None and plan:
            saved.save(failure.line)
    return Exploration(property, len(search.seconds), dict(search.outcomes),
                       tuple(search.seconds), steps, search.timeout, seed, exhausted,
                       search_seconds, failure)
