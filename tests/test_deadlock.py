"""A deadlock the ledgers prove is reported at once, on real workers
(TensorFlow 2.21, measured: the skipper returns, its peer blocks in the
call the skipper never makes; the verdict comes 0.7-0.8 s after the
skipper's loop ended, on a 2-core machine under load, with ``timeout=30``).
With ``end_when_certain``, a worker that exits, stops itself or runs one
all-reduce more than its peers (each in its own code, and each as the
fault that stands in for it) ends the run as soon as that is certain
(TensorFlow 2.21.0 and 2.15.1, measured: 0.7-4.7 s against a grace and
timeout of 30 s).  The rules themselves are tested on hand-made ledgers in
tests/unit/test_deadlock.py."""
from __future__ import annotations

import time

import pytest

from harness import context
from harness.faults import Crash, ExtraCollective, Pause, SkipStep

STEPS, SKIPPED = 10, 5


def skipping_loop(skip_on=None, linger=0.0):
    """All-reduce steps; worker ``skip_on`` leaves out step SKIPPED itself
    (the user-code twin of SkipStep), then stays ``linger`` seconds."""
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    @tf.function
    def step():
        return strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)

    ctx = context()
    for s in ctx.steps(STEPS):
        if ctx.index == skip_on and s == SKIPPED:
            continue
        step()
    time.sleep(linger)


def _last(mwms_cluster):
    return mwms_cluster.num_workers - 1


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["fault", "twin"])
def test_a_skipper_that_returns_is_reported_at_once(mwms_cluster, how):
    last = _last(mwms_cluster)
    if how == "fault":
        result = mwms_cluster.run(skipping_loop, timeout=30, faults=[SkipStep(last, SKIPPED)])
    else:
        result = mwms_cluster.run(skipping_loop, kwargs={"skip_on": last}, timeout=30)
    result.assert_hang(culprits=[last])
    obs = result.observation
    assert obs.ended_by == "deadlock", result.diagnosis
    returned = obs.workers[last].finish_time
    # Within about 1 s of the return; generous here, for a busy machine.
    assert obs.duration - returned < 10.0, (obs.duration, returned)
    assert (f"certain deadlock (worker {last} returned after {STEPS - 1} calls of `step`; "
            f"worker 0 waits in call {STEPS})") in result.diagnosis.splitlines()[0]


@pytest.mark.timeout(60)
def test_a_skipper_that_lingers_keeps_the_timeout(mwms_cluster):
    """Still in Python after its loop, the skipper might yet make the call:
    nothing is certain, and the hang timer decides."""
    last = _last(mwms_cluster)
    result = mwms_cluster.run(skipping_loop, kwargs={"linger": 60}, timeout=3,
                              faults=[SkipStep(last, SKIPPED)])
    result.assert_hang(culprits=[last])
    assert result.observation.ended_by == "hang"
    assert "certain deadlock" not in result.diagnosis


# -- run(end_when_certain=True): a failure, a stopped worker, an extra
# collective end the run once certain, for the fault and its user-code twin.

AT = 3


def troubled_loop(trouble=None, on=None):
    """All-reduce steps; at step AT worker ``on`` (its own code, no fault)
    exits, stops itself, or runs one all-reduce more than its peers."""
    import os
    import signal
    import sys

    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    @tf.function
    def step():
        return strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)

    @tf.function
    def metric():   # a chief-only metric, say: a collective its peers never run
        return strategy.reduce("SUM", strategy.run(lambda: tf.constant(2.0)), axis=None)

    ctx = context()
    for s in ctx.steps(STEPS):
        if ctx.index == on and s == AT:
            if trouble == "exit":
                sys.exit(3)
            if trouble == "stop":
                os.kill(os.getpid(), signal.SIGSTOP)
            if trouble == "extra":
                metric()
        step()


TROUBLES = {   # the twin's trouble, its fault, the outcome, how the run may end
    # A dead peer ends the run as certain unless the survivor's pending
    # receive sees the socket close and raises first (TensorFlow 2.15.1 did
    # in a CI run on a loaded machine): then every worker has finished.
    "exit": (lambda w: Crash(w, AT), "crashed", ("grace_expired", "all_finished")),
    "stop": (lambda w: Pause(w, AT, None), "hang", ("deadlock",)),
    "extra": (lambda w: ExtraCollective(w, AT), "hang", ("deadlock",)),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["fault", "twin"])
@pytest.mark.parametrize("trouble", sorted(TROUBLES))
def test_a_certain_end_comes_without_the_grace_or_the_timeout(mwms_cluster, trouble, how):
    fault, outcome, ended_by = TROUBLES[trouble]
    last = _last(mwms_cluster)
    kwargs = {"trouble": trouble, "on": last} if how == "twin" else {}
    result = mwms_cluster.run(troubled_loop, kwargs=kwargs, timeout=30, grace=30,
                              faults=[fault(last)] if how == "fault" else [],
                              ledger="collectives", end_when_certain=True)
    assert result.outcome == outcome, result.diagnosis
    assert result.culprits == (last,), result.diagnosis
    assert result.observation.ended_by in ended_by, result.diagnosis
    # Far below the 30 s grace and timeout; generous, for a busy machine.
    assert result.observation.duration < 20.0, result.diagnosis
