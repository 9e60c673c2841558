"""``explore``: is there a fault, at any worker and any step, that the
job does not survive, or that the diagnosis gets wrong?

:func:`explore_cluster` is what ``mwms_cluster.explore(...)``
(:meth:`harness.controller.cluster.Cluster.explore`) and ``harness
explore`` call: it checks its arguments, then runs the search
(:mod:`harness.explore.search`) with each plan run on the cluster and
judged by the property (:mod:`harness.explore.properties`).  A failure is
the smallest plan found (:mod:`harness.explore.shrink`), saved so the next
search of the same job tries it first.

The subpackage imports the fault vocabulary (:mod:`harness.faults`,
:mod:`harness.faults_text`, :mod:`harness.strategies`), the errors and
the diagnosis's observations; it reaches the cluster only through the
object it is handed, never :mod:`harness.controller`, which imports it.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

from harness import faults as F
from harness import plan as plan_module
from harness.errors import ExplorationFailed, SettingError
from harness.explore.properties import PROPERTIES
from harness.explore.search import Exploration, BreakingPlan, SavedPlans
from harness.explore.search import explore as run_search

__all__ = ["Exploration", "BreakingPlan", "explore_cluster", "DEFAULT_KINDS"]

# The kinds a plan draws from when explore is given none: for "survives",
# what a job can be expected to survive (a crash, an error, a preemption
# notice, a pause that ends, a slow step), not the stand-ins for bugs in
# its own code (a skipped step, an extra collective) nor a pause for ever;
# for "detected", every step-keyed kind.
DEFAULT_KINDS = {
    "survives": ("Crash", "RaiseError", "Delay", "Pause", "Preempt"),
    "detected": None,   # every one of harness.strategies.STEP_KINDS
}


def _number(value, name: str, least: float, none: bool = False):
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= least:
        raise SettingError(f"explore({name}={value!r}): a number of seconds above {least:g}")
    return float(value)


def _whole(value, name: str, least: int, none: bool = False):
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise SettingError(f"explore({name}={value!r}): a whole number, {least} or more")
    return value


def _kinds(kinds, property: str) -> tuple:
    from hypothesis.errors import InvalidArgument

    from harness import strategies
    try:
        return strategies.chosen_kinds(DEFAULT_KINDS[property] if kinds is None else kinds)
    except InvalidArgument as e:
        raise SettingError(f"explore(kinds=...): {e}") from None


def job_key(fn: Callable, args: Sequence = (), kwargs: Optional[dict] = None) -> str:
    """What names a job in the saved plans: where its function is defined,
    and its arguments (a broken and a fixed variant of one function are two
    jobs: the fixed one's search must not drop the broken one's plan)."""
    where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    call = ", ".join([repr(a) for a in args]
                     + [f"{k}={v!r}" for k, v in sorted((kwargs or {}).items())])
    return f"{where}({call})"


def explore_cluster(cluster, fn: Callable, args: Sequence = (), kwargs: Optional[dict] = None, *,
                    property: str = "survives", invariant: Optional[Callable] = None,
                    kinds: Optional[Sequence[str]] = None, max_faults: int = 1,
                    restarts: int = 0, restart_policy: Optional[str] = None,
                    budget: float = 60, shrink_budget: Optional[float] = None,
                    seed: Optional[int] = None, timeout: Optional[float] = None,
                    check: bool = True, key: Optional[str] = None, **run_options) -> Exploration:
    """See :meth:`harness.controller.cluster.Cluster.explore`."""
    from harness import strategies
    if property not in PROPERTIES:
        raise SettingError(f"explore(property={property!r}): one of {', '.join(PROPERTIES)}")
    if invariant is not None and not callable(invariant):
        raise SettingError(f"explore(invariant={invariant!r}): a function of the run's result "
                           f"that raises when the job's promise is broken, or None")
    chosen = _kinds(kinds, property)
    max_faults = _whole(max_faults, "max_faults", 1)
    restarts = _whole(restarts, "restarts", 0)
    budget = _number(budget, "budget", 0)
    shrink_budget = budget if shrink_budget is None else _number(shrink_budget,
                                                                 "shrink_budget", 0)
    seed = _whole(seed, "seed", 0, none=True)
    timeout = _number(timeout, "timeout", 0, none=True)
    if not isinstance(check, bool):
        raise SettingError(f"explore(check={check!r}): True or False")
    settings = cluster.settings
    workers = settings.shape.training
    # A fault in a later attempt acts only once an earlier one has failed:
    # drawn only where a plan holds more than one fault.
    attempts = restarts + 1 if max_faults > 1 else 1

    # Which collective a worker waits on proves more deadlocks certain (an
    # extra collective's), for a fraction of a millisecond per collective.
    run_options.setdefault("ledger", "collectives")

    def run(plan, plan_timeout):
        result = cluster.run(fn, args, kwargs, faults=plan, restarts=restarts,
                             restart_policy=restart_policy, timeout=plan_timeout,
                             end_when_certain=True, **run_options)
        cluster.runs.pop()   # the search's runs are not the test's: its failure is
        return result

    def judge(result, plan):
        return PROPERTIES[property](result, plan, invariant)

    def is_valid(plan, steps) -> bool:
        try:
            plan_module.validate(plan, settings.workers, restarts, settings.shape)
        except (F.FaultError, SettingError):
            return False
        return all(type(f).__name__ in chosen and f.worker < workers
                   and getattr(f, "step", 0) < steps for f in plan)

    def strategy_for(steps: int):
        return strategies.plans(workers, steps, chosen, min_faults=1, max_faults=max_faults,
                                attempts=attempts, for_ever=property != "survives")

    saved = SavedPlans(f"{key or job_key(fn, args, kwargs)} property={property} "
                       f"workers={settings.workers} restarts={restarts}")
    found = run_search(run, judge, strategy_for=strategy_for, kinds=chosen, property=property,
                   budget=budget, shrink_budget=shrink_budget, seed=seed, timeout=timeout,
                   most_timeout=settings.timeout, saved=saved, is_valid=is_valid)
    if found.failure is not None:
        cluster.runs.append(found.failure.result)
        if check:
            raise ExplorationFailed(found.summary() + "\n\nthe run of that plan:\n"
                                    + found.failure.result.diagnosis, found)
    return found
