"""The user-code bug whose diagnosis README.md shows (tests/test_readme.py
keeps the two in step): no fault plan, just a ``continue`` on one worker."""
import time

import harness


def train(steps=10):
    import tensorflow as tf
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = tf.Variable(1.0)

    @tf.function
    def step():
        return strategy.reduce("SUM", strategy.run(lambda: w * 2.0), axis=None)

    for i in ctx.steps(steps):
        if ctx.index == 1 and i == 4:
            continue                 # worker 1 drops a "bad batch": the bug
        step()
    time.sleep(60)                   # then saves something, in Python
    return float(w.numpy())
