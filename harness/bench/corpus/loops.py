"""Users' bugs in custom training loops (``tf.data`` pipelines: :mod:`.data`).

Each job is a user's script as a function: it reads ``TF_CONFIG``, builds
its strategy, a small regression model and its data (made in the job), and
trains in a plain Python loop (``for step in range(n)`` or ``for batch in
dist_dataset``) around a ``tf.function`` step that calls ``strategy.run``
and ``strategy.reduce``.  Each broken job's docstring says what TensorFlow
does with it.
"""
from __future__ import annotations

import os

from harness.bench.corpus import Case, at_fault, no_single
from harness.bench.corpus.loop_parts import (GLOBAL_BATCH, STEPS, arrays, build, is_chief,
                                             last_task, local_dataset, make_replica_step,
                                             make_train_step, num_tasks, replica_loss, run_steps,
                                             setup,
                                             task_index)

# -- custom loops ---------------------------------------------------------------------

def _chief_reduce_for_logging(directory: str, broken: bool):
    """The step returns the per-replica losses; every 2 steps the loss is
    reduced for a log line.

    TensorFlow 2.21.0: the chief's eager all-reduce (a scalar) meets the
    others' next gradient all-reduce (41 floats): InvalidArgumentError,
    a shape mismatch, on every task."""
    tf, strategy, model, optimizer, iterator = setup()
    replica_step = make_replica_step(tf, model, optimizer)

    @tf.function
    def train_step(batch):
        return strategy.run(replica_step, args=batch)

    for step in range(STEPS):
        per_replica_loss = train_step(next(iterator))
        if step % 2 == 0 and (is_chief() or not broken):
            loss = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)
            if is_chief():
                print(f"step {step}: loss {float(loss):.4f}")


def chief_reduce_for_logging(directory: str):
    _chief_reduce_for_logging(directory, broken=True)


def every_task_reduces_for_logging(directory: str):
    _chief_reduce_for_logging(directory, broken=False)


def _chief_reads_metric(directory: str, broken: bool):
    """A ``Mean`` metric of the training loss, made in scope and updated in
    the step; at each epoch's end its ``result()`` is logged.

    TensorFlow 2.21.0 (Keras 3): the metric's variables are sync-on-read,
    so ``result()`` all-reduces; on the chief alone it meets the others'
    next gradient all-reduce: InvalidArgumentError, a shape mismatch."""
    tf, strategy, model, optimizer, iterator = setup()
    with strategy.scope():
        train_loss = tf.keras.metrics.Mean("train_loss")
    replica_step = make_replica_step(tf, model, optimizer)

    @tf.function
    def train_step(batch):
        loss = strategy.run(replica_step, args=batch)
        strategy.run(train_loss.update_state, args=(loss,))

    for epoch in range(2):
        for _ in range(3):
            train_step(next(iterator))
        if is_chief() or not broken:
            value = float(train_loss.result())
            if is_chief():
                print(f"epoch {epoch}: loss {value:.4f}")
        train_loss.reset_state()


def chief_reads_metric(directory: str):
    _chief_reads_metric(directory, broken=True)


def every_task_reads_metric(directory: str):
    _chief_reads_metric(directory, broken=False)


def _branch_on_task(directory: str, broken: bool):
    """The chief logs the global gradient norm, all-reduced inside the
    replica function.

    TensorFlow 2.21.0: the chief's trace has one all-reduce more; its norm
    (a scalar) meets the others' gradients: InvalidArgumentError, a shape
    mismatch, in step 0."""
    tf, strategy, model, optimizer, iterator = setup()
    chief = is_chief()

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            _, loss = replica_loss(tf, model, x, y)
        grads = tape.gradient(loss, model.trainable_variables)
        if chief or not broken:
            squared = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, tf.add_n([tf.reduce_sum(g * g) for g in grads]))
            if chief:
                tf.print("global gradient norm", tf.sqrt(squared))
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    run_steps(tf, strategy, replica_step, iterator)


def branch_on_task(directory: str):
    _branch_on_task(directory, broken=True)


def every_task_all_reduces(directory: str):
    _branch_on_task(directory, broken=False)


def _local_early_stop(directory: str, broken: bool, steps: int = 24, every: int = 2):
    """Early stopping on a validation loss, every 2 steps, patience 1.  Each
    worker holds its own validation data; the last one's labels are noise,
    so its validation loss stops going down at once.

    TensorFlow 2.21.0: the last worker leaves the loop after 4 steps; the
    others wait in step 4's all-reduce for ever."""
    tf, strategy, model, optimizer, iterator = setup()
    train_step = make_train_step(tf, strategy, model, optimizer)
    vx, vy = arrays(64, seed=100 + task_index())
    if task_index() == last_task():
        vy = arrays(64, seed=999)[1]

    def local_val_loss():
        return tf.reduce_mean(tf.square(model(vx) - vy))

    @tf.function
    def agreed_val_loss():
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(local_val_loss),
                               axis=None)

    best = float("inf")
    for step in range(steps):
        train_step(next(iterator))
        if (step + 1) % every:
            continue
        val = float(local_val_loss() if broken else agreed_val_loss())
        if val >= best:
            print(f"early stop at step {step}: val loss {val:.4f}, best {best:.4f}")
            return step
        best = val
    return None


def local_early_stop(directory: str):
    return _local_early_stop(directory, broken=True)


def agreed_early_stop(directory: str):
    return _local_early_stop(directory, broken=False)


def _skip_bad_batch(directory: str, broken: bool, bad_step: int = 2):
    """Batches with a non-finite feature are skipped.  Worker 1's data has
    a corrupt record in its batch of step 2.

    TensorFlow 2.21.0: worker 1's next step pairs with the others' step 2,
    and so on; at the end its iterator's end-of-data all-reduce (int64)
    meets their last gradient all-reduce: InternalError on every task."""
    import numpy as np
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model, optimizer = build(tf, strategy)
    train_step = make_train_step(tf, strategy, model, optimizer)
    x, y = arrays(1024)
    per_replica = GLOBAL_BATCH // num_tasks()
    if task_index() == 1:
        x = x.copy()
        x[bad_step * per_replica] = np.nan   # its own copy of the file: one bad row

    def dataset_fn(context):
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(per_replica)
        return ds   # each worker reads its own copy, no shard

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

    @tf.function
    def any_bad(batch):
        local = strategy.run(lambda x, y: tf.cast(
            tf.logical_not(tf.reduce_all(tf.math.is_finite(x))), tf.float32), args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, local, axis=None)

    ran = 0
    for _ in range(STEPS):
        batch = next(iterator)
        if broken:
            local_x = strategy.experimental_local_results(batch)[0][0]
            bad = not bool(tf.reduce_all(tf.math.is_finite(local_x)))
        else:
            bad = bool(any_bad(batch) > 0)
        if bad:
            print("skipping a batch with non-finite features")
            continue
        train_step(batch)
        ran += 1
    return ran


def skip_bad_batch_locally(directory: str):
    return _skip_bad_batch(directory, broken=True)


def skip_bad_batch_everywhere(directory: str):
    return _skip_bad_batch(directory, broken=False)


def _gradient_accumulation(directory: str, broken: bool, micro_batches: int = 8):
    """Gradients of 2 micro-batches are summed locally (sync-on-read
    variables, as accumulators do), then applied (an all-reduce).  The
    broken script reads the number of micro-batches from the host's own
    setting, and worker 1's says 4.

    TensorFlow 2.21.0: worker 1 applies twice and returns; the others wait
    in their third update's all-reduce for ever."""
    tf, strategy, model, optimizer, iterator = setup()
    accumulate = 4 if broken and task_index() == 1 else 2
    with strategy.scope():
        sums = [tf.Variable(tf.zeros(v.shape), trainable=False,
                            synchronization=tf.VariableSynchronization.ON_READ,
                            aggregation=tf.VariableAggregation.SUM)
                for v in model.trainable_variables]

    def replica_accumulate(x, y):
        with tf.GradientTape() as tape:
            _, loss = replica_loss(tf, model, x, y, GLOBAL_BATCH * accumulate)
        for total, grad in zip(sums, tape.gradient(loss, model.trainable_variables)):
            total.assign_add(grad)

    def replica_apply():
        optimizer.apply_gradients(zip([tf.identity(t) for t in sums],
                                      model.trainable_variables))
        for total in sums:
            total.assign(tf.zeros(total.shape))

    @tf.function
    def micro_step(batch):
        strategy.run(replica_accumulate, args=batch)

    @tf.function
    def apply_step():
        strategy.run(replica_apply)

    applied = 0
    for micro in range(micro_batches):
        micro_step(next(iterator))
        if (micro + 1) % accumulate == 0:
            apply_step()
            applied += 1
    return applied


def accumulation_from_host_setting(directory: str):
    return _gradient_accumulation(directory, broken=True)


def accumulation_from_one_setting(directory: str):
    return _gradient_accumulation(directory, broken=False)


def _variable_on_chief(directory: str, broken: bool):
    """The best loss so far, kept in a variable for the checkpoint; the
    broken script makes it lazily, at the chief's first log line.

    TensorFlow 2.21.0: making a variable in scope broadcasts its initial
    value from the chief, a collective the others never join: the chief
    blocks in step 1, the others fail (InternalError) in step 2."""
    tf, strategy, model, optimizer, iterator = setup()
    train_step = make_train_step(tf, strategy, model, optimizer)
    best = None
    if not broken:
        with strategy.scope():
            best = tf.Variable(float("inf"), trainable=False)
    for step in range(STEPS):
        loss = train_step(next(iterator))
        if step % 2 == 1 and is_chief():
            if best is None:
                with strategy.scope():
                    best = tf.Variable(float("inf"), trainable=False)
            print(f"step {step}: loss {float(loss):.4f}")
        if best is not None:
            best.assign(tf.minimum(best, loss))


def variable_made_on_chief(directory: str):
    _variable_on_chief(directory, broken=True)


def variable_made_on_every_task(directory: str):
    _variable_on_chief(directory, broken=False)


def _trace_on_chief(directory: str, broken: bool):
    """TensorBoard's graph: the chief traces one step before training (the
    TensorBoard graph guide's ``trace_on``/``trace_export``).

    TensorFlow 2.21.0: the chief's extra step pairs with the others' first,
    silently; the others return after 6 steps and the chief waits in its
    7th for ever."""
    tf, strategy, model, optimizer, iterator = setup()
    train_step = make_train_step(tf, strategy, model, optimizer)
    logdir = directory if is_chief() else os.path.join(directory, f"worker-{task_index()}-tmp")
    writer = tf.summary.create_file_writer(logdir)
    if broken:   # an extra step, before the loop, on the chief alone
        if is_chief():
            tf.summary.trace_on(graph=True)
            train_step(next(iterator))
            with writer.as_default():
                tf.summary.trace_export("train_step", step=0)
        steps = range(STEPS)
    else:        # the loop's first step, traced on every worker
        tf.summary.trace_on(graph=True)
        train_step(next(iterator))
        with writer.as_default():
            tf.summary.trace_export("train_step", step=0)
        steps = range(1, STEPS)
    for _ in steps:
        train_step(next(iterator))


def trace_on_chief(directory: str):
    _trace_on_chief(directory, broken=True)


def trace_on_every_task(directory: str):
    _trace_on_chief(directory, broken=False)


def _clip_when_local_norm_large(directory: str, broken: bool, threshold: float = 50.0):
    """Gradients are clipped to a global norm, all-reduced, when they are
    large.  Worker 1's data is in other units (100 times larger), so its
    gradients are.

    TensorFlow 2.21.0: an all-reduce inside ``tf.cond`` in the replica
    function is refused when the step is traced, on every worker alike:
    RuntimeError, ``merge_call`` called while defining a new graph."""
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model, optimizer = build(tf, strategy)
    x, y = arrays(1024)
    scale = 100.0 if task_index() == 1 else 1.0
    iterator = iter(local_dataset(tf, strategy, x * scale, y * scale,
                                  GLOBAL_BATCH // num_tasks()))

    def global_norm(grads):
        squared = tf.add_n([tf.reduce_sum(g * g) for g in grads])
        return tf.sqrt(tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, squared))

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            _, loss = replica_loss(tf, model, x, y)
        grads = tape.gradient(loss, model.trainable_variables)
        if broken:
            local_norm = tf.linalg.global_norm(grads)
            grads = tf.cond(local_norm > threshold,
                            lambda: tf.clip_by_global_norm(grads, threshold,
                                                           use_norm=global_norm(grads))[0],
                            lambda: grads)
        else:
            norm = global_norm(grads)
            grads = tf.cond(norm > threshold,
                            lambda: tf.clip_by_global_norm(grads, threshold, use_norm=norm)[0],
                            lambda: grads)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    run_steps(tf, strategy, replica_step, iterator)


def clip_on_local_norm(directory: str):
    _clip_when_local_norm_large(directory, broken=True)


def clip_on_global_norm(directory: str):
    _clip_when_local_norm_large(directory, broken=False)


CUSTOM_LOOP = "custom loop"

CASES = (
    Case("loop_chief_only_reduce_for_logging", CUSTOM_LOOP,
         "TensorFlow's MWMS custom-training-loop tutorial; seed article rule 5",
         "only the chief calls strategy.reduce on the step's per-replica loss to log it.",
         chief_reduce_for_logging, every_task_reduces_for_logging,
         truth=at_fault(0), sizes=(2, 3, 4), chief=True, timeout=10),
    Case("loop_chief_only_metric_result", CUSTOM_LOOP,
         "TensorFlow's MWMS custom-training-loop tutorial (metrics read on every worker)",
         "only the chief reads the training-loss metric's result() at the end of an epoch.",
         chief_reads_metric, every_task_reads_metric,
         truth=at_fault(0), sizes=(2, 3), chief=True, timeout=10),
    Case("loop_branch_on_task_in_replica_fn", CUSTOM_LOOP,
         "tensorflow/tensorflow#39781 (ctx.all_reduce under a condition); seed article rule 3",
         "an all-reduce of the gradient norm inside strategy.run, under `if chief:`.",
         branch_on_task, every_task_all_reduces,
         truth=at_fault(0), sizes=(2, 3), timeout=10),
    Case("loop_local_early_stop", CUSTOM_LOOP,
         "DeepRec-AI/HybridBackend#88 (early stopping on one worker's metric hangs the others)",
         "each worker stops early on its own validation loss; the last worker's stops first.",
         local_early_stop, agreed_early_stop,
         truth=lambda n: at_fault(n - 1), sizes=(2, 3), timeout=10),
    Case("loop_skip_bad_batch_locally", CUSTOM_LOOP,
         "NVIDIA-NeMo/Speech#578 (a NaN step skipped on one worker hangs the others); "
         "seed article",
         "worker 1 skips a batch with a NaN feature (`continue`); the others train on theirs.",
         skip_bad_batch_locally, skip_bad_batch_everywhere,
         truth=at_fault(1), sizes=(2, 3), timeout=10),
    Case("loop_accumulation_steps_per_host", CUSTOM_LOOP,
         "tensorflow/addons#2260 (gradient accumulation under a distribution strategy)",
         "worker 1 accumulates 4 micro-batches per update, the others 2 (a per-host setting).",
         accumulation_from_host_setting, accumulation_from_one_setting,
         truth=at_fault(1), sizes=(2, 3, 4), timeout=10),
    Case("loop_variable_made_on_chief", CUSTOM_LOOP,
         "tensorflow/recommenders#274 (a variable's creation in scope is a collective)",
         "the chief makes a variable in strategy.scope() lazily, at its first log line.",
         variable_made_on_chief, variable_made_on_every_task,
         truth=at_fault(0), sizes=(2, 3), chief=True, timeout=10),
    Case("loop_trace_graph_on_chief", CUSTOM_LOOP,
         "TensorBoard's graph guide (trace_on/trace_export); seed article rule 3",
         "the chief traces one extra train step for TensorBoard's graph before the loop.",
         trace_on_chief, trace_on_every_task,
         truth=at_fault(0), sizes=(2, 3), chief=True, timeout=10),
    Case("loop_clip_on_local_norm", CUSTOM_LOOP,
         "horovod/horovod#2327 (a collective inside tf.cond deadlocks); tensorflow/tensorflow#39781",
         "tf.cond on the local gradient norm runs an all-reduce in one branch (meant for "
         "worker 1, whose data is 100 times larger); every worker's trace refuses it.",
         clip_on_local_norm, clip_on_global_norm,
         truth=lambda n: no_single(range(n)), sizes=(2, 3), timeout=10),
)
