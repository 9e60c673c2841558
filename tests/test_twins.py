"""Each injected fault against its real-world twin: the same bug written in
user code, with no fault plan.

An injected fault stands in for a user's bug, so it must leave exactly the
observations the bug leaves: the verdicts (outcome, culprits, ambiguous) of
the two runs must be equal, at N = 2, 3 and 4, with the first, a middle and
the last worker at fault.  The diagnosis may list the fault as "injected";
no rule may use it.
"""
import os

import pytest

from harness import faults as F

pytestmark = pytest.mark.timeout(120)

STEPS = 8
AT = 4
TIMEOUT = 3.0


def loop(twin=None, worker=None):
    """A variable in scope and one all-reduce of it per step; with ``twin``,
    worker ``worker`` does at step ``AT`` what the fault of that name does."""
    import tensorflow as tf
    import harness
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = tf.Variable(1.0)

    @tf.function
    def step():
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: w * 1.0), axis=None)

    @tf.function
    def also_reduce():   # the user's own extra all-reduce
        return strategy.reduce(tf.distribute.ReduceOp.SUM,
                               strategy.run(lambda: tf.constant(1.0)), axis=None)

    total = 0.0
    for k in ctx.steps(STEPS):
        if ctx.index == worker and k == AT:
            if twin == "SkipStep":
                continue                  # a bad local batch, skipped
            if twin == "ExtraCollective":
                also_reduce()             # a metric reduced on this worker only
            if twin == "RaiseError":
                raise RuntimeError("the user's own error")
            if twin == "Crash":
                os._exit(1)
        total += float(step())
    return total


FAULTS = {
    "SkipStep": lambda w: F.SkipStep(w, AT),
    "ExtraCollective": lambda w: F.ExtraCollective(w, AT),
    "RaiseError": lambda w: F.RaiseError(w, AT),
    "Crash": lambda w: F.Crash(w, AT, "exit"),
}
CASES = [(n, w) for n in (2, 3, 4) for w in sorted({0, n // 2, n - 1})]


@pytest.mark.parametrize("n,worker", CASES, ids=[f"N{n}-w{w}" for n, w in CASES])
@pytest.mark.parametrize("kind", list(FAULTS))
def test_fault_and_twin_give_the_same_verdict(mwms_cluster, kind, n, worker):
    mwms_cluster.settings = mwms_cluster.settings.with_overrides(workers=n)
    injected = mwms_cluster.run(loop, faults=[FAULTS[kind](worker)], timeout=TIMEOUT, grace=2)
    twin = mwms_cluster.run(loop, kwargs={"twin": kind, "worker": worker}, timeout=TIMEOUT,
                            grace=2)
    seen = [(r.outcome, r.culprits, r.ambiguous) for r in (injected, twin)]
    assert seen[0] == seen[1], f"fault:\n{injected.diagnosis}\n\ntwin:\n{twin.diagnosis}"
    # And the verdict is the exact one: the worker at fault, alone.
    assert twin.culprits == (worker,) and not twin.ambiguous, twin.diagnosis
