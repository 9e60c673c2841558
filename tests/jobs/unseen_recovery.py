"""A training job with a recovery bug in one place: user code for a fault search.

An epoch loop under MultiWorkerMirroredStrategy: 2 epochs of 10 batches,
each batch's value all-reduced and added to ``weight`` at the epoch's
learning rate, which halves at the end of every epoch.  The batches of an
epoch come from a dataset shuffled with the epoch as its seed, and resuming
within an epoch skips the batches already trained.  A checkpoint (``weight``,
``learning_rate`` and ``trained``, the batches trained so far) is written
every 4 batches and at every epoch's end, into ``harness.context().run_dir``
(the chief's directory; the others write to one of their own and delete
it), and every worker restores the chief's newest one.

``train(fixed=False)`` works out where to resume from the last batch the
checkpoint holds, ``divmod(trained - 1, batches)`` plus one: right inside an
epoch, but a checkpoint taken at an epoch's end (trained = 10) gives "epoch
0, position 10", so the restarted job runs epoch 0's end again, an empty
epoch that halves the learning rate a second time, and trains epoch 1 at a
quarter instead of a half.  ``train(fixed=True)`` resumes at
``divmod(trained, batches)``.  Each batch is a step
(``harness.context().steps()``); ``invariant(result)`` holds when every
worker ends with the fault-free ``weight``.

Every single-crash plan, ``Crash(w, s)`` in attempt 0 for each of the 3
workers and 20 steps, was run with ``restarts=1`` (TensorFlow 2.21.0,
2026-12-03, 2 shared cores, ``grace=1``): the broken job breaks the
invariant at 6 of the 60 plans, ``Crash(0..2, 10)`` and ``Crash(0..2, 11)``
(weight 262911 instead of 524799, learning rate 0.125 instead of 0.25; the
epoch-end checkpoint is the newest until the save at 12 batches), and
recovers exactly from the other 54; the fixed job breaks it at none of the
60.  Every run completed.  A run took 1.3-2.0 s clean and warm, and a median
of 3.7 s (2.0-6.4 s) with a crash and its restart, with other sessions'
TensorFlow clusters on the same cores: the sweep of 60 plans took about 4
minutes per job.
"""
import os

EPOCHS = 2
BATCHES = 10          # batches per epoch
SAVE_EVERY = 4        # batches between checkpoints, besides one at every epoch's end


def _is_chief(resolver) -> bool:
    if resolver.task_type in (None, "chief"):
        return True
    return (resolver.task_type == "worker" and resolver.task_id == 0
            and "chief" not in resolver.cluster_spec().as_dict())


def train(fixed=False, epochs=EPOCHS, batches=BATCHES, save_every=SAVE_EVERY):
    """Train, resuming from the newest checkpoint in the run's directory.
    Returns (the batches the restored checkpoint held, ``weight``, the
    learning rate, the batches trained)."""
    import tensorflow as tf

    import harness
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        weight = tf.Variable(0.0)
        learning_rate = tf.Variable(1.0)
        trained = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(weight=weight, learning_rate=learning_rate,
                                     trained=trained)
    resolver = strategy.cluster_resolver
    chief = _is_chief(resolver)
    chief_dir = os.path.join(ctx.run_dir, "ckpt")
    write_dir = chief_dir if chief else os.path.join(ctx.run_dir, f"tmp-{resolver.task_id}")
    manager = tf.train.CheckpointManager(checkpoint, write_dir, max_to_keep=2)
    latest = tf.train.latest_checkpoint(chief_dir)
    if latest:
        checkpoint.restore(latest)

    def save():
        manager.save()
        if not chief:
            tf.io.gfile.rmtree(write_dir)

    done = int(trained.numpy())
    if fixed:
        epoch, position = divmod(done, batches)
    elif done == 0:
        epoch, position = 0, 0
    else:
        last = done - 1                       # the last batch the checkpoint holds
        epoch, position = divmod(last, batches)
        position += 1                         # resume after it

    @tf.function
    def train_batch(x):
        per_replica = strategy.run(lambda v: v * learning_rate, args=(x,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica,
                               axis=None) / strategy.num_replicas_in_sync

    boundaries = ctx.steps()                  # one step per batch, over all epochs
    for e in range(epoch, epochs):
        data = (tf.data.Dataset.range(batches)
                .shuffle(batches, seed=e, reshuffle_each_iteration=False)
                .map(lambda j: tf.pow(2.0, tf.cast(j + e * batches, tf.float32)))
                .skip(position))
        for x, _ in zip(data, boundaries):
            weight.assign_add(train_batch(x))
            trained.assign_add(1)
            if int(trained.numpy()) % save_every == 0:
                save()
        learning_rate.assign(learning_rate * 0.5)     # the epoch's end
        save()
        position = 0
    return done, float(weight.numpy()), float(learning_rate.numpy()), int(trained.numpy())


def expected_weight(epochs=EPOCHS, batches=BATCHES) -> float:
    """``weight`` after a fault-free run: every batch once, at its epoch's rate."""
    return float(sum(0.5 ** e * 2 ** (e * batches + j)
                     for e in range(epochs) for j in range(batches)))


def invariant(result):
    """Every worker ends with the fault-free ``weight``: each batch trained
    exactly once, at the learning rate of its epoch."""
    want = expected_weight()
    got = [v[1] for v in result.return_values]
    assert got == [want] * len(got), (
        f"weight {got}, not {want:g} (learning rate {[v[2] for v in result.return_values]}, "
        f"not {0.5 ** EPOCHS})")
