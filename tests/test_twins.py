"""Each injected fault against its real-world twin: the same bug written in
user code, with no fault plan.

An injected fault stands in for a user's bug, so it must leave exactly the
observations the bug leaves: the verdicts (outcome, culprits, ambiguous) of
the two runs must be equal, at N = 2 with the first and the last worker at
fault, and at N = 3 and 4 with a middle one.  The diagnosis may list the fault as "injected";
no rule may use it.
"""
import os

import pytest

from harness import faults as F

pytestmark = pytest.mark.timeout(120)

STEPS = 8
AT = 4
TIMEOUT = 3.0


def loop(twin=None, worker=None, linger=False, report_steps=True):
    """A variable in scope and one all-reduce of it per step; with ``twin``,
    worker ``worker`` does at step ``AT`` what the fault of that name does.
    ``linger``: the workers stay in Python after their loop (a checkpoint
    being written, say) instead of returning; ``report_steps=False``: a
    plain ``range``, no step boundaries reported."""
    import time

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
    for k in (ctx.steps(STEPS) if report_steps else range(STEPS)):
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
    if linger:
        time.sleep(60)
    return total


FAULTS = {
    "SkipStep": lambda w: F.SkipStep(w, AT),
    "ExtraCollective": lambda w: F.ExtraCollective(w, AT),
    "RaiseError": lambda w: F.RaiseError(w, AT),
    "Crash": lambda w: F.Crash(w, AT, "exit"),
}
# The first and the last worker at N = 2, a middle one at N = 3 and 4: each
# place once, and CI's time is better spent elsewhere.
CASES = [(2, 0), (2, 1), (3, 1), (4, 2)]


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


def edit_own_config(kind):
    """What a user's own code does to this worker's TF_CONFIG before it
    builds the strategy: the twin of ``BadTFConfig(worker, kind)``."""
    import json
    config = json.loads(os.environ["TF_CONFIG"])
    if kind == "missing":
        del os.environ["TF_CONFIG"]
        return
    if kind == "swapped":
        config["cluster"]["worker"].reverse()
        if len(config["cluster"]["worker"]) % 2 == 1:   # as the fault does: rotate the middle
            index = config["task"]["index"]
            if index == len(config["cluster"]["worker"]) // 2:
                config["cluster"]["worker"].append(config["cluster"]["worker"].pop(0))
    if kind == "duplicate_index":
        config["task"]["index"] = 0 if config["task"]["index"] != 0 else 1
    os.environ["TF_CONFIG"] = json.dumps(config)


def loop_with_own_config(kind=None, worker=None):
    import harness
    if harness.context().index == worker:
        edit_own_config(kind)
    return loop()


CONFIG_KINDS = ("missing", "swapped", "duplicate_index")
CONFIG_CASES = [(2, 1), (3, 1), (3, 2)]


@pytest.mark.parametrize("n,worker", CONFIG_CASES, ids=[f"N{n}-w{w}" for n, w in CONFIG_CASES])
@pytest.mark.parametrize("kind", CONFIG_KINDS)
def test_bad_tf_config_and_a_config_set_by_hand_give_the_same_verdict(mwms_cluster, kind, n,
                                                                       worker):
    mwms_cluster.settings = mwms_cluster.settings.with_overrides(workers=n)
    injected = mwms_cluster.run(loop, faults=[F.BadTFConfig(worker, kind)], timeout=TIMEOUT,
                                grace=2)
    twin = mwms_cluster.run(loop_with_own_config, kwargs={"kind": kind, "worker": worker},
                            timeout=TIMEOUT, grace=2)
    seen = [(r.culprits, r.ambiguous) for r in (injected, twin)]
    assert seen[0] == seen[1], f"fault:\n{injected.diagnosis}\n\ntwin:\n{twin.diagnosis}"
    # Which claimant of a duplicate index fails to bind is a race: the
    # outcome may differ, the blame may not.
    if kind != "duplicate_index":
        assert injected.outcome == twin.outcome, f"{injected.diagnosis}\n\n{twin.diagnosis}"


@pytest.mark.parametrize("worker", [0, 1])
@pytest.mark.parametrize("kind", ["SkipStep", "ExtraCollective"])
def test_a_culprit_that_lingers_after_its_loop_is_still_named(mwms_cluster, kind, worker):
    """Two workers, both staying in Python after their loop: the one that
    waits in TensorFlow is not to blame for being "behind"."""
    mwms_cluster.settings = mwms_cluster.settings.with_overrides(workers=2)
    twin = mwms_cluster.run(loop, kwargs={"twin": kind, "worker": worker, "linger": True},
                            timeout=TIMEOUT, grace=2)
    twin.assert_hang().assert_culprit(worker)


@pytest.mark.parametrize("n", [2, 3])
def test_without_steps_exact_from_three_and_never_wrong_at_two(mwms_cluster, n):
    mwms_cluster.settings = mwms_cluster.settings.with_overrides(workers=n)
    skipper = n - 1
    result = mwms_cluster.run(loop, kwargs={"twin": "SkipStep", "worker": skipper,
                                            "report_steps": False}, timeout=TIMEOUT, grace=2)
    result.assert_hang()
    if n == 2:
        result.assert_cannot_tell([0, 1])
    else:
        result.assert_culprit(skipper)


@pytest.mark.parametrize("n", [2, 3])
def test_a_restore_from_the_wrong_directory_never_names_the_chief_alone(mwms_cluster, tmp_path, n):
    """The tutorial's write-directory pattern misused (issue 44): after a
    restart of the cluster each worker restores from the directory it
    writes to, so worker 0 resumes from its checkpoint at step 3 while the
    others, whose temporary directories were deleted, start again from step
    0; worker 0 returns after its 3 steps and the others wait in their 4th
    (TensorFlow 2.21.0).  Which workers agree is no evidence when their
    pasts differ: the verdict cannot tell, and says what each restored."""
    from harness.bench.corpus.restarts import restore_own_write_dir
    mwms_cluster.settings = mwms_cluster.settings.with_overrides(workers=n)
    result = mwms_cluster.run(restore_own_write_dir, args=(str(tmp_path),), timeout=10, grace=2,
                              restarts=1, restart_policy="cluster")
    result.assert_hang()
    others = "worker 1" if n == 2 else "workers 1,2"
    assert result.ambiguous and set(result.culprits) == set(range(n)), result.report()
    assert "different_pasts" in result.verdict.stages
    assert f"resumed from: worker 0 restored ckpt-3; {others} restored nothing" in result.diagnosis
