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

import dataclasses
import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from harness import faults as F
from harness import plan as plan_module
from harness.errors import ExplorationFailed, SettingError
from harness.explore.properties import PROPERTIES
from harness.explore.coverage import Coverage, PlanRun
from harness.explore.results import BreakingPlan, Exploration, SearchProgress
from harness.explore.search import REPRODUCE, SavedPlans
from harness.explore.search import explore as run_search
from harness.explore.space import ORDERS, Space, kind_weights
from harness.validators import (DEFAULT_MAX_FAULTS, parse_choice, parse_cluster, parse_restarts,
                                parse_seconds, parse_seed, parse_whole)

__all__ = ["Exploration", "BreakingPlan", "Coverage", "PlanRun", "SearchProgress",
           "explore_cluster", "DEFAULT_KINDS", "SETTINGS", "check_settings", "check_kinds"]

# The kinds a plan draws from when explore is given none: for "survives",
# what a job can be expected to survive (a crash, an error, a preemption
# notice, a pause that ends, a slow step), not the stand-ins for bugs in
# its own code (a skipped step, an extra collective) nor a pause for ever;
# for "detected", every step-keyed kind but those on the job's files
# (harness.strategies.FILE_KINDS: they act only where a job writes under
# its run directory, so they are named).
DEFAULT_KINDS = {
    "survives": ("Crash", "RaiseError", "Delay", "Pause", "Preempt"),
    "detected": None,   # harness.strategies.chosen_kinds(None)
}


def _optional_seconds(value: Any, where: str) -> Optional[float]:
    return None if value is None else parse_seconds(value, where)


# explore's own settings, one validator each, (value, where) -> the value
# checked; ``where`` names how the caller set it: ``explore(budget=...)``,
# or ``--budget`` from ``harness explore``.
SETTINGS: Dict[str, Callable[[Any, str], Any]] = {
    "property": lambda value, where: parse_choice(value, where, tuple(PROPERTIES)),
    "max_faults": lambda value, where: parse_whole(value, where, 1),
    "restarts": parse_restarts,
    "budget": parse_seconds,
    "shrink_budget": _optional_seconds,
    "seed": parse_seed,
    "timeout": _optional_seconds,
    "reproduce": lambda value, where: parse_whole(value, where, 0),
    "order": lambda value, where: parse_choice(value, where, tuple(ORDERS)),
}


def check_settings(values: Dict[str, Any], where: Callable[[str], str]) -> Dict[str, Any]:
    """``values`` by setting name, each checked by :data:`SETTINGS`;
    ``where(name)`` names the setting in an error."""
    return {name: SETTINGS[name](value, where(name)) for name, value in values.items()}


def check_kinds(kinds: Any, property: str, where: str = "explore(kinds=...)") -> tuple:
    """The fault kinds to draw: names of :data:`harness.strategies.KINDS`
    or the fault classes themselves (``[Crash, "Pause"]``), as a list or
    comma-separated; None: :data:`DEFAULT_KINDS` of ``property``."""
    from hypothesis.errors import InvalidArgument

    from harness import strategies
    if isinstance(kinds, str):
        kinds = [k.strip() for k in kinds.split(",") if k.strip()]
    elif isinstance(kinds, type) and issubclass(kinds, F.Fault):
        kinds = [kinds]
    if kinds is not None and not isinstance(kinds, (str, bytes)):
        try:
            kinds = [k.__name__ if isinstance(k, type) and issubclass(k, F.Fault) else k
                     for k in kinds]
        except TypeError:
            pass   # not a list: chosen_kinds names the value
    unknown = [k for k in kinds or () if isinstance(k, str) and k not in strategies.STEP_KINDS]
    if unknown:
        raise SettingError(f"{where}: {unknown[0]!r} is not a kind of fault explore draws; "
                           f"name one or more of {', '.join(strategies.STEP_KINDS)}")
    try:
        return strategies.chosen_kinds(DEFAULT_KINDS[property] if kinds is None else kinds)
    except InvalidArgument as e:
        raise SettingError(f"{where}: {e}") from None


def _api(name: str) -> str:
    return f"explore({name}=...)"


def coordinated_kinds(chosen: Sequence[str], default: bool, shape) -> tuple:
    """The kinds of ``chosen`` a search draws on the parameter-server
    cluster ``shape``: those every task of it takes
    (:data:`harness.plan.SERVER_FAULTS`).  Of the default kinds the others
    are left out; a kind named that no server takes is a SettingError."""
    fits = tuple(k for k in chosen if k in plan_module.SERVER_FAULTS)
    if not default and len(fits) < len(chosen):
        other = next(k for k in chosen if k not in fits)
        raise SettingError(f"explore(kinds=...): {other!r} acts on no server of the "
                           f"parameter-server cluster {shape}; name kinds of "
                           f"{', '.join(k for k in plan_module.SERVER_FAULTS if k != 'StartDelay')}")
    if not fits:
        raise SettingError(f"explore(): none of the kinds {', '.join(chosen)} acts on the "
                           f"servers of the parameter-server cluster {shape}")
    return fits


def job_key(fn: Callable, args: Sequence = (), kwargs: Optional[dict] = None) -> str:
    """What names a job in the saved plans: where its function is defined,
    and its arguments (a broken and a fixed variant of one function are two
    jobs: the fixed one's search must not drop the broken one's plan)."""
    where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    call = ", ".join([repr(a) for a in args]
                     + [f"{k}={v!r}" for k, v in sorted((kwargs or {}).items())])
    return f"{where}({call})"


def fault_attempts(property: str, restarts: int, max_faults: int) -> int:
    """How many of a run's attempts a plan's faults may act in.  A fault in
    a later attempt acts only once an earlier one has failed: drawn only
    where a plan holds more than one fault, and under "survives" only into
    an attempt that leaves a restart after it (a fault that ends the last
    attempt breaks the property whatever the job does)."""
    if max_faults <= 1:
        return 1
    return max(1, restarts if property == "survives" else restarts + 1)


def explore_cluster(cluster, fn: Callable, args: Sequence = (), kwargs: Optional[dict] = None, *,
                    property: str = "survives", invariant: Optional[Callable] = None,
                    kinds: Optional[Sequence[str]] = None, max_faults: int = DEFAULT_MAX_FAULTS,
                    restarts: int = 0, restart_policy: Optional[str] = None,
                    budget: float = 60, shrink_budget: Optional[float] = None,
                    seed: Optional[int] = None, timeout: Optional[float] = None,
                    reproduce: int = REPRODUCE, order: str = "guided",
                    check: bool = True, key: Optional[str] = None,
                    progress: Optional[Callable[[SearchProgress], None]] = None,
                    **run_options) -> Exploration:
    """See :meth:`harness.controller.cluster.Cluster.explore`; ``progress``
    hears of each plan's run as it starts and ends, and of the running
    plan's own progress (a :class:`SearchProgress` whose ``run`` is the
    run's :class:`~harness.controller.Progress`), for a live status line."""
    v = check_settings(dict(property=property, max_faults=max_faults, restarts=restarts,
                            budget=budget, shrink_budget=shrink_budget, seed=seed,
                            timeout=timeout, reproduce=reproduce, order=order), _api)
    property, max_faults, restarts, seed, timeout, reproduce, order = (
        v["property"], v["max_faults"], v["restarts"], v["seed"], v["timeout"], v["reproduce"],
        v["order"])
    budget = v["budget"]
    shrink_budget = budget if v["shrink_budget"] is None else v["shrink_budget"]
    if invariant is not None and not callable(invariant):
        raise SettingError(f"explore(invariant={invariant!r}): a function of the run's result "
                           f"that raises when the job's promise is broken, or None")
    chosen = check_kinds(kinds, property)
    if not isinstance(check, bool):
        raise SettingError(f"explore(check={check!r}): True or False")
    settings = cluster.settings
    if run_options.get("cluster") is not None:
        settings = settings.with_overrides(cluster=parse_cluster(run_options["cluster"],
                                                                 "explore(cluster=...)"))
    # A parameter-server cluster's faults fall on every task, the servers
    # included, of the kinds a server takes (the chief takes them too).
    workers = settings.shape.total if settings.shape.coordinated else settings.shape.training
    if settings.shape.coordinated:
        chosen = coordinated_kinds(chosen, kinds is None, settings.shape)
    attempts = fault_attempts(property, restarts, max_faults)

    # Which collective a worker waits on proves more deadlocks certain (an
    # extra collective's), for a fraction of a millisecond per collective.
    run_options.setdefault("ledger", "collectives")
    if progress is not None:
        progress, run_options["progress"] = _with_run_progress(progress)

    shape = settings.shape

    def named(plan):
        # A fault on a parameter-server cluster's task is given by its
        # task=, as a user gives it (worker= counts the chief and workers).
        return tuple(dataclasses.replace(f, task=shape.task(f.worker)) for f in plan) \
            if shape.coordinated else tuple(plan)

    def run(plan, plan_timeout):
        # The fault-free run tells where the job writes its state.
        result = cluster.run(fn, args, kwargs, faults=named(plan), restarts=restarts,
                             restart_policy=restart_policy, timeout=plan_timeout,
                             end_when_certain=True, watch_state=not plan, **run_options)
        cluster.runs.pop()   # the search's runs are not the test's: its failure is
        return result

    def judge(result, plan):
        return PROPERTIES[property](result, named(plan), invariant)

    def is_valid(plan, steps) -> bool:
        try:
            plan_module.validate(named(plan), settings.workers, restarts, settings.shape)
        except (F.FaultError, SettingError):
            return False
        return all(type(f).__name__ in chosen and f.worker < workers
                   and getattr(f, "step", 0) < steps for f in plan)

    def space_for(steps: int, state_steps: Tuple[int, ...], interchangeable: bool,
                  epoch_steps: Tuple[int, ...] = ()) -> Space:
        return Space(workers, steps, chosen, max_faults=max_faults, attempts=attempts,
                     for_ever=property != "survives", state_steps=state_steps,
                     interchangeable=interchangeable and not shape.coordinated,
                     epoch_steps=epoch_steps,
                     task_types=tuple(t for t, _ in shape.tasks) if shape.coordinated else ())

    saved = SavedPlans(f"{key or job_key(fn, args, kwargs)} property={property} "
                       f"workers={settings.workers} restarts={restarts}")
    found = run_search(run, judge, space_for=space_for, kinds=chosen, property=property,
                       budget=budget, shrink_budget=shrink_budget, seed=seed, timeout=timeout,
                       most_timeout=settings.timeout, weights=kind_weights(chosen, property),
                       order=order, reproduce=reproduce, saved=saved, is_valid=is_valid,
                       progress=progress, named=named)
    if shape.coordinated:
        found = _named_plans(found, named)
    if found.failure is not None:
        cluster.runs.append(found.failure.result)
        if check:
            raise ExplorationFailed(found.summary() + "\n\nthe run of that plan:\n"
                                    + found.failure.result.diagnosis, found)
    return found


def _named_plans(found: Exploration, named: Callable) -> Exploration:
    """``found`` with each plan as the cluster ran it (:func:`explore_cluster`'s ``named``)."""
    failure = found.failure
    if failure is not None:
        failure = dataclasses.replace(
            failure, plan=named(failure.plan), found=named(failure.found),
            passed_over=None if failure.passed_over is None else
            (named(failure.passed_over[0]), failure.passed_over[1]))
    return dataclasses.replace(found, failure=failure, plans=tuple(
        dataclasses.replace(r, plan=named(r.plan), acted=named(r.acted)) for r in found.plans))


def _with_run_progress(progress: Callable[[SearchProgress], None]):
    """(the search's callback, the runs' callback): between the search's
    reports, each run's own progress reaches ``progress`` as the latest
    report made that much later, so a status line keeps its clock."""
    latest: list = []

    def on_search(p: SearchProgress) -> None:
        latest[:] = [(p, time.monotonic())]
        progress(p)

    def on_run(p) -> None:
        if latest:
            seen, at = latest[0]
            progress(seen.later(time.monotonic() - at, p))
    return on_search, on_run
