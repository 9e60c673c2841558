"""Fault plans as values, and hypothesis strategies that draw them.

A :class:`Plan` is everything a generated run needs: the cluster size, the
faults and the hang timeout.  It prints as a constructor call, so a failing
example that hypothesis prints can be pasted back (``eval`` it with
``harness.faults`` in scope) and replayed with :func:`replay`.

The strategies are small and composable, in hypothesis's style:
``faults_for(n, steps)`` draws one fault valid for a cluster of ``n``
running ``steps`` steps; ``fault_plans()`` draws whole plans.  Importing
this module needs hypothesis, but not TensorFlow.
"""
from __future__ import annotations

import dataclasses
from typing import Tuple

from hypothesis import strategies as st

from harness.faults import (BAD_CONFIG_KINDS, CRASH_HOW, BadTFConfig, Crash, Delay,
                            ExtraCollective, Fault, Pause, RaiseError, SkipStep, StepFault)

PLAN_STEPS = 6


@dataclasses.dataclass(frozen=True)
class Plan:
    workers: int
    faults: Tuple[Fault, ...] = ()
    timeout: float = 3.0
    steps: int = PLAN_STEPS


def faults_for(n: int, steps: int = PLAN_STEPS, timeout: float = 3.0) -> st.SearchStrategy:
    """One fault for a cluster of ``n`` workers running ``steps`` steps.

    Pauses and delays that should be survived last well under ``timeout``
    (at most a third of it), so "completed" stays the only right answer.
    """
    worker = st.integers(0, n - 1)
    step = st.integers(0, steps - 1)
    short = st.sampled_from([0.2, 0.5, round(timeout / 3, 2)])
    return st.one_of(
        st.builds(SkipStep, worker, step),
        st.builds(ExtraCollective, worker, step),
        st.builds(Crash, worker, step, st.sampled_from(CRASH_HOW)),
        st.builds(RaiseError, worker, step, st.just("generated fault")),
        st.builds(Pause, worker, step, st.one_of(st.none(), short)),
        st.builds(Delay, worker, step, short),
        st.builds(BadTFConfig, worker, st.sampled_from(BAD_CONFIG_KINDS)),
    )


def _desync(f) -> bool:
    return isinstance(f, (SkipStep, ExtraCollective))


def well_formed(plan: Plan) -> bool:
    """The plans whose outcome the oracle can state exactly.

    Excluded, and why: a ``BadTFConfig`` with any other fault (whether a step
    fault fires then depends on which worker trained alone); two desync
    faults (a skip and an extra collective can cancel out); two step faults
    at one step (which acts first is a race between processes).
    """
    fs = plan.faults
    if any(isinstance(f, BadTFConfig) for f in fs) and len(fs) > 1:
        return False
    if sum(_desync(f) for f in fs) > 1:
        return False
    steps = [f.step for f in fs if isinstance(f, StepFault)]
    return len(steps) == len(set(steps))


@st.composite
def fault_plans(draw, min_workers: int = 2, max_workers: int = 4, max_faults: int = 2,
                timeout: float = 3.0, steps: int = PLAN_STEPS) -> Plan:
    """A well-formed :class:`Plan` of ``0..max_faults`` faults."""
    n = draw(st.integers(min_workers, max_workers))
    fs = draw(st.lists(faults_for(n, steps, timeout), max_size=max_faults))
    plan = Plan(workers=n, faults=tuple(fs), timeout=timeout, steps=steps)
    if not well_formed(plan):
        # Resolve by dropping faults rather than hypothesis.assume(), which
        # would throw whole draws away and starve the search.
        plan = dataclasses.replace(plan, faults=plan.faults[:1])
    return plan


def replay(plan: Plan, fn, grace: float = 2.0):
    """Run ``fn`` on a fresh cluster under ``plan``; return the RunResult."""
    from harness.controller.cluster import Cluster
    from harness.settings import RunSettings
    cluster = Cluster(RunSettings(workers=plan.workers, timeout=plan.timeout, grace=grace))
    return cluster.run(fn, args=(plan.steps,), faults=plan.faults)
