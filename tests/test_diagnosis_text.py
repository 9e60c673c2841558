"""The diagnosis text on real TensorFlow workers: a skipped step in a custom
loop (a collective mismatch, reported by every worker: no echo, every
worker's line whole), and a ``RaiseError`` whose step begins while a
``tf.function`` is traced (it reaches the user as ``InjectedFault``)."""
import os
import re

import pytest

from harness import faults as F
from helpers import tutorial_loop

pytestmark = pytest.mark.timeout(90)

STEPS, EPOCH, SKIPPED = 10, 5, 3
RUN = dict(timeout=10, grace=5)
# The texts TensorFlow (2.15.1 and 2.21) gives for the two mismatches the loop below makes.
MISMATCH_TEXT = {"float32": "Shape mismatch in the collective instance",
                 "int64": re.compile(r"Collective instance \d+ expected type \d+ and data_type \d+ "
                                     r"but got type \d+ and data_type \d+")}


def metric_loop(metric_dtype="float32", load=0.0):
    """A custom loop in the tutorials' shape: each step loads its batch
    (``load`` seconds) and calls a ``tf.function`` that all-reduces a
    float32[8] (the gradients), and each epoch ends with an eager read of a
    metric (an all-reduce of a ``metric_dtype`` scalar).  A worker that
    skips a step reads the metric while the others run the next step: the
    members of that collective disagree."""
    import time

    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = tf.Variable(tf.ones([8]))

    @tf.function
    def train_step():
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: w * 1.0),
                               axis=None)

    total = 0.0
    for k in range(STEPS):
        time.sleep(load)
        total += float(tf.reduce_sum(train_step()))
        if k % EPOCH == EPOCH - 1:
            metric = strategy.run(lambda: tf.constant(1, tf.as_dtype(metric_dtype)))
            total += float(strategy.reduce(tf.distribute.ReduceOp.SUM, metric, axis=None))
    return total


def _worker_line(text: str, index: int) -> str:
    for line in text.splitlines():
        found = re.match(r"  workers? ([\d,]+): ", line)
        if found and str(index) in found.group(1).split(","):
            return line
    raise AssertionError(f"no line for worker {index} in:\n{text}")


# With no load the skipper meets the mismatch and raises, the others block
# until the grace runs out; with a load the others meet it and abort the
# skipper, which raises the text relayed from a "remote target" (as in the
# tutorials' loop): measured on TensorFlow 2.21, 2 workers.
@pytest.mark.parametrize("metric_dtype,load", [("float32", 0.0), ("float32", 0.3),
                                               ("int64", 0.3)])
def test_a_skipped_step_is_a_collective_mismatch_on_every_worker_not_an_echo(mwms_cluster,
                                                                            metric_dtype, load):
    last = mwms_cluster.num_workers - 1
    result = mwms_cluster.run(metric_loop, args=(metric_dtype, load),
                              faults=[F.SkipStep(last, SKIPPED)], **RUN)
    result.assert_failed()
    # With 2 workers the skipper (its loop's end a step early) looks the same
    # as a peer with a step more: it cannot tell; from 3, the majority's.
    if mwms_cluster.num_workers == 2:
        result.assert_cannot_tell([0, 1])
    else:
        result.assert_culprit(last)
    text = result.diagnosis
    raised = [w for w in result.workers if w.exception is not None]
    assert raised, text
    for w in raised:
        assert re.search(MISMATCH_TEXT[metric_dtype], w.exception.message), w.exception.message
    for w in result.workers:
        line = _worker_line(text, w.index)
        assert re.search(r"; ran \d+ steps? \([\d,-]+\)", line), line
        assert line.endswith("  <- culprit") == (w.index in result.culprits), line
        assert "echo" not in line, line
    assert "echo" not in text and "no root error" not in text, text
    root = next(ln for ln in text.splitlines() if ln.startswith("root error: "))
    assert "the members of a collective disagree" in root, text


def step_function_per_step(steps=5):
    """A ``tf.function`` made anew for every step, as TensorFlow's
    failure-handling test makes its own: every step begins in a trace."""
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = tf.Variable(1.0)
    total = 0.0
    for _ in range(steps):
        @tf.function
        def train_step():
            return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: w * 1.0),
                                   axis=None)
        total += float(train_step())   # the user's call
    return total


@pytest.mark.parametrize("fn,step", [(tutorial_loop, 0), (step_function_per_step, 2)],
                         ids=["first-call", "function-per-step"])
def test_raise_error_in_a_trace_reaches_the_user_as_injected_fault(mwms_cluster, fn, step):
    last = mwms_cluster.num_workers - 1
    result = mwms_cluster.run(fn, faults=[F.RaiseError(last, step, "boom")], timeout=5, grace=3)
    result.assert_failed(error="InjectedFault").assert_culprit(last)
    error = result.workers[last].exception
    assert (error.type_name, error.message) == ("InjectedFault", "boom")
    tb = error.traceback
    assert "StagingError" not in tb and "in user code" not in tb, tb
    assert "# the user's call" in tb or "train_step()" in tb, tb
    # The fault's own machinery and TensorFlow's trace are not the user's frames.
    assert not re.search(r"harness/worker/(actions|context)\.py", tb), tb
    assert "__autograph_generated" not in tb and "tensorflow/" not in tb, tb
    assert tb.rstrip().endswith("harness.errors.InjectedFault: boom"), tb
    where = os.path.basename(fn.__code__.co_filename)
    assert f"root error: InjectedFault: boom at {where}:" in result.diagnosis
