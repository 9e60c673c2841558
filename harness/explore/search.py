"""The search: plans drawn over the job's space (:mod:`harness.explore.space`),
run one after another on the cluster until one breaks the property or the
budget (seconds) is spent; then the failing plan shrunk while its
signature stays the same, and replayed to tell a failure that reproduces
from a race.

:func:`explore` is generic over how a plan runs (``run(plan, timeout)``
returns a :class:`~harness.result.RunResult`), so
:meth:`harness.controller.cluster.Cluster.explore` and ``harness explore``
both come here.  Its steps:

1. the job runs without faults: it must complete and hold the property,
   and it says how many steps there are to draw from and how long its
   start-up and its steps take (the plans' hang timeout, unless one is
   given: :func:`hang_timeout`);
2. the plans saved from earlier searches of the same job run first
   (hypothesis's example database, :class:`SavedPlans`);
3. plans drawn by :class:`~harness.explore.space.Draws` run until one
   fails or the budget is spent (or every plan there is has run); what
   they covered is kept (:mod:`harness.explore.coverage`);
4. a failing plan shrinks (:mod:`harness.explore.shrink`) within
   ``shrink_budget`` seconds: each simpler plan whose run fails with the
   same signature (:mod:`harness.explore.properties`) takes its place;
5. the smallest plan runs ``reproduce`` times more: a failure that does
   not come back every time is reported as racy, with its rate.

Runs are never repeated but in step 5: a plan drawn twice is judged once.  A
``progress`` callback hears of each run as it starts and as it ends
(:class:`SearchProgress`), for a live status line; the search prints
nothing.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import random
import statistics
import time
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

from harness import faults_text
from harness.explore.attribution import acted
from harness.explore.coverage import PlanRun, coverage
from harness.explore.properties import NEVER_ACTED, Check, Signature, headline, signature_of
from harness.explore.results import STAGES, BreakingPlan, Exploration, SearchProgress
from harness.explore.shrink import Plan, simpler
from harness.explore.space import ORDERS, DrawOrder, Space

if TYPE_CHECKING:
    from harness.result import RunResult

# The least hang timeout a plan's run gets: above the longest pause or
# delay a drawn plan holds that a job should survive (a second), with room
# for a loaded machine.
LEAST_TIMEOUT = 3.0
# A plan's hang timeout covers this many times the fault-free run's
# start-up (a restarted attempt starts up again), this many times its
# usual wait between steps, and this many times its longest.
STARTUP_FACTOR, STEP_FACTOR, LONGEST_FACTOR = 2.0, 5.0, 2.0
# How many times more the smallest failing plan runs, by default.
REPRODUCE = 3


class SavedPlans:
    """Failing plans kept from one search to the next, in hypothesis's
    example database (``settings.default.database``: ``.hypothesis/`` by
    default, none when a profile turns it off), as their ``faults=[...]``
    lines under a key naming the job and the property."""

    def __init__(self, key: str, database=None):
        if database is None:
            from hypothesis import settings
            assert settings.default is not None   # hypothesis loads its profile at import
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


def hang_timeout(result: RunResult, least: float, most: float) -> float:
    """The plans' hang timeout from the fault-free run ``result``: room for
    :data:`STARTUP_FACTOR` times its start-up (to its first step, the
    longest on any worker: a restarted attempt starts up again),
    :data:`STEP_FACTOR` times its median wait between steps and
    :data:`LONGEST_FACTOR` times its longest; within ``least`` and
    ``most``.  One slow gap moves it by twice itself, not five times."""
    startup, gaps = 0.0, []
    for w in result.observation.workers:
        times = sorted(e.time for e in w.events if e.kind == "step")
        if not times:
            continue
        startup = max(startup, times[0])
        ends = times + ([w.finish_time] if w.finish_time is not None else [])
        gaps += [b - a for a, b in itertools.pairwise(ends)]
    usual = statistics.median(gaps) if gaps else 0.0
    wanted = max(STARTUP_FACTOR * startup, STEP_FACTOR * usual,
                 LONGEST_FACTOR * max(gaps, default=0.0))
    return min(most, max(least, wanted))


def restarted(result: RunResult) -> bool:
    """A restart happened in ``result``: of the whole run, or of a task."""
    return len(result.attempts) > 1 or any(len(w.attempts) > 1 for w in result.workers)


def resumed_at(result: RunResult) -> Optional[int]:
    """The first step a restart attempt of ``result`` reported (after the
    job restored what it kept), or None: no restart of the whole run, or
    no step reported."""
    if len(result.attempts) < 2:
        return None
    steps = [e.step for w in result.attempts[1].observation.workers for e in w.events
             if e.kind == "step" and e.step is not None]
    return min(steps, default=None)


def state_steps(result: RunResult) -> Tuple[int, ...]:
    """The step boundaries at which a worker of ``result`` (a run with
    ``watch_state=True``) saw files written under its run directory."""
    return tuple(sorted({e.step for w in result.observation.workers for e in w.events
                         if e.kind == "saved" and e.step is not None}))


def epoch_steps(result: RunResult) -> Tuple[int, ...]:
    """The steps that began an epoch after the first in ``result`` (a Keras
    ``fit`` with the harness's callback), where the job's callbacks act."""
    return tuple(sorted({e.step for w in result.observation.workers for e in w.events
                         if e.kind == "epoch" and e.step is not None}))


def interchangeable(result: RunResult) -> bool:
    """The workers other than 0 ran alike in the fault-free ``result``:
    each took as many steps and returned the same value (by its ``repr``),
    so the job did not tell them apart."""
    return len({(w.last_step, repr(getattr(w, "return_value", None)))
                for w in result.workers[1:]}) <= 1


def job_steps(result: RunResult) -> int:
    """How many steps the fault-free run took (the most any worker took)."""
    return max((w.last_step + 1 for w in result.workers if w.last_step is not None), default=0)


@dataclasses.dataclass
class _Judged:
    result: Optional[RunResult]   # None once dropped: failures and the fault-free run are kept
    check: Check
    seconds: float


class Search:
    """One exploration's state: what each plan gave, the clock, the budget."""

    def __init__(self, run: Callable[[Plan, float], RunResult],
                 judge: Callable[[RunResult, Plan], Check], budget: float,
                 clock: Callable[[], float] = time.monotonic,
                 progress: Optional[Callable[[SearchProgress], None]] = None,
                 named: Callable[[Plan], Plan] = lambda plan: plan):
        self.run, self.judge, self.budget, self.clock = run, judge, budget, clock
        self.progress = progress
        # A plan as the cluster runs it and reports its faults (a parameter
        # server by its task=).
        self.named = named
        self.judged: Dict[Plan, _Judged] = {}
        self.outcomes: Dict[str, int] = collections.Counter()
        self.seconds: List[float] = []
        self.ran: List[PlanRun] = []
        self.replays = 0
        self.timeout = 0.0
        self.started = clock()
        self.stage, self.stage_started, self.stage_budget = STAGES[0], self.started, budget
        self.last: Optional[Tuple[Plan, str]] = None

    def left(self, since: float, budget: float) -> bool:
        return self.clock() - since < budget

    def enter(self, stage: str, budget: Optional[float] = None) -> None:
        """Start ``stage``; its budget counts from now (the search's
        stages share the search's budget, from its start)."""
        self.stage = stage
        if budget is not None:
            self.stage_started, self.stage_budget = self.clock(), budget

    def report(self, running: Optional[Plan] = None) -> None:
        if self.progress is None:
            return
        now = self.clock()
        last, ended = self.last if self.last is not None else (None, "")
        self.progress(SearchProgress(
            self.stage, len(self.judged) + self.replays, now - self.started,
            max(0.0, self.stage_budget - (now - self.stage_started)),
            None if running is None else self.named(running),
            None if last is None else self.named(last), ended))

    def try_plan(self, plan: Plan, count: bool = True) -> _Judged:
        """Run ``plan`` once (a plan seen before gives its first answer)."""
        if plan in self.judged:
            return self.judged[plan]
        self.report(running=plan)
        t0 = self.clock()
        result = self.run(plan, self.timeout)
        judged = _Judged(result, self.judge(result, plan), self.clock() - t0)
        self.judged[plan] = judged
        self.last = (plan, _tally(result, judged.check))
        if count:
            self.seconds.append(judged.seconds)
            self.outcomes[self.last[1]] += 1
            if plan:
                named = self.named(plan)
                done = acted(result, named)
                self.ran.append(PlanRun(plan, self.last[1],
                                        tuple(f for f, g in zip(plan, named) if g in done),
                                        restarted(result), judged.seconds, resumed_at(result)))
        if judged.check.signature is None and plan:
            judged.result = None   # only failures are kept whole: a search runs hundreds
        self.report()
        return judged

    def replay(self, plan: Plan, target: Signature, times: int) -> int:
        """Run ``plan`` ``times`` times more: in how many it failed with ``target``."""
        same = 0
        for _ in range(times):
            self.report(running=plan)
            result = self.run(plan, self.timeout)
            check = self.judge(result, plan)
            self.last = (plan, _tally(result, check))
            same += check.signature == target
            self.replays += 1
            self.report()
        return same

    def saved_first(self, saved: SavedPlans, is_valid: Callable[[Plan], bool]) -> Optional[Plan]:
        """Run the plans saved by earlier searches, within the budget: the
        first that still fails; one that no longer fits the job, or no
        longer fails (the bug was fixed), is dropped."""
        self.enter("saved plans")
        for line in saved.lines():
            if not self.left(self.started, self.budget):
                break
            try:
                plan = faults_text.parse_plan(line)
            except Exception:
                plan = None
            if plan is not None and is_valid(plan) \
                    and self.try_plan(plan).check.signature is not None:
                return plan
            saved.drop(line)
        return None

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


def _tally(result: RunResult, check: Check) -> str:
    """How a run counts in the histogram: its outcome, and the broken
    promise when the property broke."""
    outcome = str(result.outcome)
    if check.how == NEVER_ACTED.how:
        return NEVER_ACTED.how
    if check.signature is not None and check.signature.broken:
        return f"{outcome} ({check.signature.broken})"
    return outcome


def explore(run: Callable[[Plan, float], RunResult], judge: Callable[[RunResult, Plan], Check], *,
            space_for: Callable[[int, Tuple[int, ...], bool, Tuple[int, ...]], Space],
            kinds: Sequence[str], property: str,
            budget: float, shrink_budget: float, seed: Optional[int],
            timeout: Optional[float], most_timeout: float,
            weights: Optional[Dict[str, float]] = None, order: str = "guided",
            reproduce: int = REPRODUCE,
            saved: Optional[SavedPlans] = None,
            is_valid: Callable[[Plan, int], bool] = lambda plan, steps: True,
            clock: Callable[[], float] = time.monotonic,
            progress: Optional[Callable[[SearchProgress], None]] = None,
            named: Callable[[Plan], Plan] = lambda plan: plan) -> Exploration:
    """See the module docstring.  ``space_for(steps, state_steps,
    interchangeable)`` is the space to draw from once the job's steps, its
    state points (:func:`state_steps`; the fault-free run is asked for with
    ``watch_state``: ``run`` is told by the empty plan) and whether its
    workers other than 0 are alike (:func:`interchangeable`) are known, ``weights`` each kind's share
    of the draws (:func:`harness.explore.space.kind_weights`), ``order``
    the draws' name in :data:`harness.explore.space.ORDERS`;
    ``is_valid(plan, steps)`` says whether a saved plan still fits the
    cluster and the job (one that does not is dropped);
    ``progress(SearchProgress)`` is called as each run starts and ends;
    ``named(plan)`` is a plan as the cluster runs and reports it (the
    progress shows it so)."""
    seed = random.SystemRandom().randrange(2 ** 32) if seed is None else seed
    search = Search(run, judge, budget, clock, progress, named)
    search.timeout = most_timeout
    clean = search.try_plan(())
    clean_run = clean.result
    assert clean_run is not None   # the fault-free run is kept whole
    steps = job_steps(clean_run)
    search.timeout = timeout if timeout is not None else \
        hang_timeout(clean_run, LEAST_TIMEOUT, most_timeout)
    found: Optional[Plan] = None
    if clean.check.signature is not None:
        found = ()
    elif str(clean_run.outcome) != "completed":
        # A job that fails with no fault at all: that is the failure.
        found = ()
        search.judged[()] = _Judged(clean_run, Check(signature_of(clean_run, ()),
                                                     headline(clean_run)), clean.seconds)
    if found is None and steps == 0:
        from harness.errors import SettingError
        raise SettingError(
            "explore: the job reported no steps in its fault-free run, so no step-keyed fault "
            "can act; report them with harness.context().steps(n), the Keras callback, or "
            "step_fn= (see run())")
    space = space_for(max(steps, 1), state_steps(clean_run), interchangeable(clean_run),
                      epoch_steps(clean_run))
    if found is None and saved is not None:
        found = search.saved_first(saved, lambda plan: is_valid(plan, steps))
    exhausted = False
    if found is None:
        found, exhausted = _draw(search, ORDERS[order](space, seed, weights))
    search_seconds = clock() - search.started

    failure = None
    if found is not None:
        failure = _shrunk(search, found, kinds, shrink_budget, reproduce)
        if saved is not None and failure.plan:
            saved.save(failure.line)
    return Exploration(property, len(search.seconds), dict(search.outcomes),
                       tuple(search.seconds), steps, search.timeout, seed, exhausted,
                       search_seconds, failure, tuple(search.ran),
                       coverage(space, search.ran, exhausted))


def _draw(search: Search, draws: DrawOrder) -> Tuple[Optional[Plan], bool]:
    """Run drawn plans until one breaks the property (it, False), the
    budget is spent (None, False) or every plan the draws reach has run
    (None, True)."""
    search.enter("search")
    while search.left(search.started, search.budget):
        back = [r for r in search.ran if r.restarted]
        plan = draws.next(set(search.judged), [r.plan for r in back],
                          {r.plan: r.resumed for r in back if r.resumed is not None})
        if plan is None:
            return None, draws.space.max_faults == 1
        if search.try_plan(plan).check.signature is not None:
            return plan, False
    return None, False


def _shrunk(search: Search, found: Plan, kinds: Sequence[str], budget: float,
            reproduce: int) -> BreakingPlan:
    """``found`` shrunk within ``budget`` seconds, then replayed ``reproduce`` times."""
    target = search.judged[found].check.signature
    assert target is not None   # found broke the property
    search.enter("shrink", budget)
    plan, runs, seconds = search.shrink(found, target, kinds, budget)
    best = search.judged[plan].result
    assert best is not None   # it broke the property too: kept whole
    search.enter("replay", 0.0)
    same = search.replay(plan, target, reproduce)
    passed_over = None
    if same < reproduce and plan != found:
        # The shrink judged each candidate by one run: where its plan races,
        # the plan as found may reproduce where the shrunk one does not.
        again = search.replay(found, target, reproduce)
        if again > same:
            passed_over = (plan, same)
            plan, same, best = found, again, search.judged[found].result
            assert best is not None   # it broke the property: kept whole
    return BreakingPlan(plan, best, target, search.judged[plan].check.how, found, runs, seconds,
                        reproduce, same, passed_over)
