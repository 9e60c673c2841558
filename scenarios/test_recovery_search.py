"""Recovery bugs a fixed test misses: each job recovers from a crash at
almost any step and loses work only when the crash falls in a window of one
step, which is what a fault search (``mwms_cluster.explore``) is for.

Each job runs under ``run(restarts=1)`` (the whole cluster restarted, as a
cluster manager would), keeps its checkpoints in ``harness.context().run_dir``
and has an invariant, the promise its recovery must keep, that checks the
run's final result and raises ``AssertionError`` when it is broken.  A
``Crash(w, s)`` kills worker ``w`` at the boundary of step ``s``: every worker
has finished step ``s - 1``; the others run step ``s`` up to its first
collective and wait there until the harness ends them.

Every single-crash plan (``Crash(w, s)`` in attempt 0, for each worker and
step) was run at 3 workers with ``restarts=1`` on the broken and the fixed
job, TensorFlow 2.21.0 and tf_keras 2.21.0, 2026-12-03, on 2 shared cores:

=====================  =====  =====  =================================  =====
job                    steps  plans  plans that break it (broken job)   fixed
=====================  =====  =====  =================================  =====
``accumulating_loop``  20     60     ``Crash(0..2, 10)``: 3             none
``fit_with_backup``    16     48     ``Crash(0..2, 12)``: 3             none
``pointer_loop``       20     60     ``Crash(1..2, 12)``: 2             none
=====================  =====  =====  =================================  =====

Every one of those runs completed: the restart always succeeds, and only
the invariant tells.  (``fit_with_backup``'s sweep fed batches of 6
examples; the plans at steps 11-13 ran again with 12, as the job now feeds:
the same.)  With other sessions' TensorFlow clusters on the same cores, a
run took 0.9-4.3 s clean and warm and a median of 3.0-5.3 s with a crash
and its restart (``grace=1``): 3-5 minutes for a job's 48-60 plans.

The scenarios run the window's plan on the last worker.  The searches
(``test_search_*``, culprit checks of the broken scenarios) run
``mwms_cluster.explore(..., kinds=["Crash"], restarts=1)`` with a seed whose
first plan falls in the window at 2, 3 and 4 workers (the accumulation,
which writes at every step, so no step stands out), or with the crashes
the search tries first around the job's one write (the pointer).  The
draws are the harness's own (:mod:`harness.explore.space`), so a seed
draws the same plans whatever hypothesis is installed.  A fresh seed needs
a median of 12 plans (31 at most, seeds 0-99) for the accumulation and 3 for
the pointer at 2 and 3 workers (``python -m harness.bench.explore draws``), and the
searches' budget of 120 s covers that.  A search over the
``BackupAndRestore`` job (seed 26, the same budget) found a crash at step
12 at 2, 3 and 4 workers, measured 2026-12-03; it is left out of the suite
for CI's time (a Keras restart a plan), as is a search of the fixed
pointer loop (no failure in 10 s; tests/test_explore.py checks a fixed
job's search).
"""
import json
import os

import pytest

from harness.faults import Crash
from scenarios.meta import KERAS_2, culprit_check, scenario


# A crashed attempt ends once it is certain (the survivors wait for ever on
# the dead worker), or a second after the crash: the survivors' own errors
# are not what these scenarios are about.
_ENDS = dict(end_when_certain=True, grace=1)

# The searches' settings: a plan's run gets the grace above and a hang
# timeout of 30 s (not explore's five times the fault-free run's longest
# wait: a restarted Keras job traces for seconds before its first step, and
# longer under load).
_SEARCH = dict(grace=1, timeout=30, budget=120)


def _last(mwms_cluster):
    return mwms_cluster.num_workers - 1


def _checkpoints(checkpoint, strategy, run_dir):
    """The MWMS tutorials' pattern: every worker saves, the chief into
    ``run_dir/checkpoints``, the others into a temporary directory of their
    own that they delete after each save; every worker restores the chief's
    newest checkpoint, when there is one.  Returns ``save(number=None)``."""
    import tensorflow as tf

    from scenarios.mnist_like import is_chief
    chief_dir = os.path.join(run_dir, "checkpoints")
    chief = is_chief(strategy)
    write_dir = chief_dir if chief else os.path.join(
        run_dir, f".worker-{strategy.cluster_resolver.task_id}-tmp")
    manager = tf.train.CheckpointManager(checkpoint, write_dir, max_to_keep=1)
    latest = tf.train.latest_checkpoint(chief_dir)
    if latest:
        checkpoint.restore(latest).assert_existing_objects_matched()

    def save(number=None):
        manager.save(checkpoint_number=number)
        if not chief:
            tf.io.gfile.rmtree(write_dir)
    return save


def _ledger_step(strategy, extra=None):
    """``step(k)``: a ``tf.function`` of one collective, in which every
    replica contributes ``2**k`` and the all-reduced mean comes back (exact
    in float32 up to k = 23), so that a sum of steps says which were
    applied.  ``extra``, when given, also runs in each replica."""
    import tensorflow as tf

    def replica_fn(k):
        if extra is not None:
            extra()
        return tf.pow(2.0, tf.cast(k, tf.float32))

    @tf.function
    def step(k):
        per_replica = strategy.run(replica_fn, args=(k,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica,
                               axis=None) / strategy.num_replicas_in_sync
    return lambda k: step(tf.constant(k, tf.int64))


def _ledger_text(got, expected, n):
    """Which steps a ledger of ``2**k`` terms lacks, or by how much it is off."""
    got, expected = int(got), int(expected)
    lost = [k for k in range(n) if expected >> k & 1 and not got >> k & 1]
    if got < expected and got + sum(2 ** k for k in lost) == expected:
        return f"the updates of steps {lost[0]}-{lost[-1]} lost" if len(lost) > 1 else \
            f"the update of step {lost[0]} lost"
    return f"off by {got - expected:+d}"


# -- the checkpoint written before the update ---------------------------------------

MICRO_BATCHES = 20
PER_UPDATE = 10       # micro-batches accumulated into one update
AFTER_AN_UPDATE = 10  # the window: the step after a window's last micro-batch


def accumulating_loop(fixed=False, micro_batches=MICRO_BATCHES, per_update=PER_UPDATE):
    """Gradient accumulation in a custom loop, checkpointed after every
    micro-batch (each one a step).  Micro-batch ``k``'s all-reduced gradient
    (``2**k``) is added to ``accumulated``; after every ``per_update``
    micro-batches the sum is applied to ``weight``, the update; a window
    starts by zeroing ``accumulated``.  The checkpoint holds ``weight``,
    ``accumulated`` and ``done`` (micro-batches done), so that a restarted
    job resumes at any micro-batch.  ``fixed=False`` saves a window's last
    micro-batch before applying the update, ``fixed=True`` applies, then
    saves.  Returns (the micro-batch this attempt started at, ``weight``)."""
    import tensorflow as tf

    import harness
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        weight = tf.Variable(0.0)
        accumulated = tf.Variable(0.0)
        done = tf.Variable(0, dtype=tf.int64)
    save = _checkpoints(tf.train.Checkpoint(weight=weight, accumulated=accumulated, done=done),
                        strategy, ctx.run_dir)
    gradient = _ledger_step(strategy)
    start = int(done.numpy())
    for i in ctx.steps(micro_batches - start):
        k = start + i
        if k % per_update == 0:
            accumulated.assign(0.0)                  # a new window
        accumulated.assign_add(gradient(k))
        update = (k + 1) % per_update == 0
        if update and fixed:
            weight.assign_add(accumulated)           # apply, then save
        done.assign(k + 1)
        save()
        if update and not fixed:
            weight.assign_add(accumulated)           # the mistake: saved before this
    return start, float(weight.numpy())


def every_update_applied_once(result, micro_batches=MICRO_BATCHES):
    """``accumulating_loop``'s promise: every micro-batch's gradient reached
    ``weight`` exactly once, on every worker."""
    expected = float(2 ** micro_batches - 1)
    weights = [w for _, w in result.return_values]
    assert weights == [expected] * len(weights), (
        f"weight {weights}, not {expected:g}: {_ledger_text(weights[0], expected, micro_batches)}")


def _accumulation_run(mwms_cluster, fixed):
    last = _last(mwms_cluster)
    result = mwms_cluster.run(accumulating_loop, kwargs={"fixed": fixed}, restarts=1,
                              faults=[Crash(last, AFTER_AN_UPDATE)], **_ENDS)
    result.assert_completed()
    crashed, resumed = result.attempts
    crashed.assert_crashed().assert_culprit(last)
    assert [start for start, _ in resumed.return_values] == \
        [AFTER_AN_UPDATE] * mwms_cluster.num_workers
    return result


@pytest.mark.timeout(120)
@scenario(outcome="completed", source="custom loop with CheckpointManager; gradient "
          "accumulation (the sum check of TensorFlow's failure_handler_test)",
          fixed_by="test_accumulated_update_applied_then_saved")
def test_checkpoint_saved_before_the_accumulated_update(mwms_cluster):
    """Gradient accumulation checkpointed every micro-batch, the window's last
    micro-batch saved before its update is applied: a crash at the next step
    loses the update.

    TensorFlow: ``CheckpointManager.save`` on each worker writes its files
    without a collective, and ``weight.assign_add`` outside ``strategy.run``
    updates each worker's copy on its own.  A crash at micro-batch 10's
    boundary comes after every worker saved micro-batch 9 (``done`` 10,
    ``accumulated`` holding micro-batches 0-9, ``weight`` without them) and
    applied the update in memory only; the restarted cluster restores that
    checkpoint, starts a new window at micro-batch 10 by zeroing
    ``accumulated``, and completes with ``weight`` = 2**20 - 2**10 on every
    worker: the first update is lost, silently.  A crash anywhere else is
    recovered exactly (mid-window, ``accumulated`` in the checkpoint carries
    the partial window): of the 60 single-crash plans at 3 workers, the 3 at
    step 10 break it (see the module's table).  With an update at every
    micro-batch (``per_update=1``) the same mistake loses the previous
    step's update at every crash (measured at steps 1, 3, 7, 15 and 19): no
    window there, and any test with a crash finds it.

    Source: custom training loops that checkpoint with ``tf.train.Checkpoint``
    and ``CheckpointManager`` and accumulate gradients over micro-batches;
    the invariant is the sum TensorFlow's own ``failure_handler_test`` checks
    after a restart (each step's update applied exactly once).

    Fix: apply the update, then save (``test_accumulated_update_applied_then_saved``).
    """
    result = _accumulation_run(mwms_cluster, fixed=False)
    with pytest.raises(AssertionError, match=r"the updates of steps 0-9 lost"):
        every_update_applied_once(result)


@pytest.mark.timeout(120)
@scenario(outcome="completed", source="custom loop with CheckpointManager; gradient "
          "accumulation (the sum check of TensorFlow's failure_handler_test)")
def test_accumulated_update_applied_then_saved(mwms_cluster):
    """Fixed: the same loop applies the accumulated update, then saves.

    TensorFlow: every checkpoint now holds what the job has done: after the
    same crash the restarted cluster resumes at micro-batch 10 with the
    first update in ``weight``, and ends with 2**20 - 1 on every worker.
    None of the 60 single-crash plans at 3 workers breaks it.

    Source: as for the broken variant.

    Fix: this.
    """
    every_update_applied_once(_accumulation_run(mwms_cluster, fixed=True))


@pytest.mark.timeout(240)
@culprit_check("test_checkpoint_saved_before_the_accumulated_update")
def test_search_finds_the_accumulation_window(mwms_cluster):
    """``explore`` over single crashes finds the window and shrinks it to
    ``Crash(0, 10)``: step 10 at every N, and the lowest worker, since every
    worker's crash there loses the update.  Seed 18 draws a plan of the
    window first at 2, 3 and 4 workers (3 of 60 plans break it at 3
    workers, whichever way the crash kills)."""
    found = mwms_cluster.explore(accumulating_loop, invariant=every_update_applied_once,
                                 kinds=["Crash"], restarts=1, seed=18, check=False, **_SEARCH)
    assert found.failure is not None, found.summary()
    assert found.failure.plan == (Crash(0, AFTER_AN_UPDATE),), found.summary()
    assert found.failure.signature.broken == "invariant: AssertionError"


# -- BackupAndRestore and an epoch-end update --------------------------------------

EPOCHS, BATCHES = 4, 4
HALVE_AFTER = 2                                # the epoch at whose end the rate halves
FIRST_AT_HALF_RATE = (HALVE_AFTER + 1) * BATCHES   # the window: step 12


def fit_with_backup(save_freq="epoch", epochs=EPOCHS, batches=BATCHES, halve_after=HALVE_AFTER,
                    data="constant", backup_first=False):
    """tf_keras ``fit`` under MWMS with ``BackupAndRestore(save_freq=...)``
    in ``run_dir/backup`` and, listed before it (after it with
    ``backup_first=True``), a callback that halves the learning rate at the
    end of epoch ``halve_after``.  The model is one
    weight ``w`` (no bias, zeros) on an input of ones with the loss
    ``mean(prediction)`` and plain SGD at 1.0: each step subtracts the
    learning rate from ``w``.  Every batch is the same (``data="ramp"``
    feeds ``2**j`` at the ``j``-th batch of an epoch instead, and each step
    subtracts that much); a batch is 12 examples, which 2, 3 and 4 workers
    split evenly (of 6, the fourth worker's share is empty and a step
    subtracts three quarters).  Returns (``w``, the learning rate, the
    optimizer's iterations, the epochs this attempt fitted)."""
    import tensorflow as tf

    import harness
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input(shape=(1,)),
            tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
        model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=1.0),
                      loss=lambda y_true, y_pred: tf.reduce_mean(y_pred))
    if data == "constant":
        dataset = tf.data.Dataset.from_tensors((tf.ones((12, 1)), tf.zeros((12, 1)))).repeat()
    else:
        dataset = tf.data.Dataset.range(batches).map(lambda j: (
            tf.fill((12, 1), tf.pow(2.0, tf.cast(j, tf.float32))), tf.zeros((12, 1)))).repeat()

    class HalveLearningRate(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == halve_after:
                rate = self.model.optimizer.learning_rate
                rate.assign(rate * 0.5)

    backup = tf.keras.callbacks.BackupAndRestore(os.path.join(ctx.run_dir, "backup"),
                                                 save_freq=save_freq)
    callbacks = [backup, HalveLearningRate()] if backup_first else [HalveLearningRate(), backup]
    history = model.fit(dataset, epochs=epochs, steps_per_epoch=batches, verbose=0,
                        callbacks=callbacks + [ctx.keras_callback()])
    return (float(model.layers[0].kernel.numpy()[0, 0]),
            float(model.optimizer.learning_rate.numpy()),
            int(model.optimizer.iterations.numpy()), len(history.history.get("loss", [])))


def every_step_at_its_rate(result, epochs=EPOCHS, batches=BATCHES, halve_after=HALVE_AFTER):
    """``fit_with_backup``'s promise (constant data): every step applied
    once, at the learning rate of its epoch."""
    expected = -sum(1.0 if e <= halve_after else 0.5 for e in range(epochs) for _ in range(batches))
    got = [v[0] for v in result.return_values]
    rates = [v[1] for v in result.return_values]
    assert got == [expected] * len(got) and rates == [0.5] * len(rates), (
        f"w {got}, not {expected:g}; learning rate {rates}, not 0.5")


def _backup_run(mwms_cluster, save_freq):
    last = _last(mwms_cluster)
    result = mwms_cluster.run(fit_with_backup, kwargs={"save_freq": save_freq}, env=KERAS_2,
                              restarts=1, faults=[Crash(last, FIRST_AT_HALF_RATE)], **_ENDS)
    result.assert_completed()
    crashed, resumed = result.attempts
    crashed.assert_crashed().assert_culprit(last)
    # fit resumed at the last epoch, with the iterations of the first three.
    assert [v[2:] for v in resumed.return_values] == \
        [(EPOCHS * BATCHES, 1)] * mwms_cluster.num_workers
    return result


@pytest.mark.timeout(120)
@scenario(outcome="completed", source="tf.keras.callbacks.BackupAndRestore(save_freq=...)",
          fixed_by="test_backup_every_epoch_keeps_the_epoch_end_update")
def test_backup_every_batch_misses_the_epoch_end_update(mwms_cluster):
    """``BackupAndRestore(save_freq=1)`` with a callback that halves the
    learning rate at an epoch's end: a crash at the next epoch's first step
    loses the halving.

    TensorFlow: tf_keras 2.21's ``BackupAndRestore`` with an integer
    ``save_freq`` saves in ``on_train_batch_end``, before any callback's
    ``on_epoch_end``: the backup of epoch 2's last batch (step 11) holds the
    rate of 1.0, and the halving lives in memory until step 12's backup.  A
    crash at step 12's boundary restarts ``fit`` from step 11's backup at
    epoch 3, whose start never runs epoch 2's end again: it trains at 1.0
    and ends with ``w`` = -16, not -14; the job completes.  Every other
    crash is recovered exactly: of the 48 single-crash plans at 3 workers,
    the 3 at step 12 break it.  The batches are all alike because a resume
    within an epoch starts the dataset's iterator over, a second bug
    (``fit_with_backup(save_freq=1, data="ramp", batches=5, halve_after=99)``
    ends at -124 fault-free and after a crash at step 10, an epoch's start,
    but at -103 after one at step 12); ``save_freq="epoch"`` only ever
    resumes at an epoch's start.

    Source: ``tf.keras.callbacks.BackupAndRestore`` (``save_freq`` an
    integer: back up every N batches) and the epoch-end callbacks that change
    training state (a step decay of the learning rate written as a callback).

    Fix: ``save_freq="epoch"`` with ``BackupAndRestore`` listed after the
    callbacks that change state at an epoch's end
    (``test_backup_every_epoch_keeps_the_epoch_end_update``), or a learning
    rate schedule of the optimizer's own, which follows its iterations.
    """
    result = _backup_run(mwms_cluster, save_freq=1)
    with pytest.raises(AssertionError, match=r"learning rate \[1\.0"):
        every_step_at_its_rate(result)


@pytest.mark.timeout(120)
@scenario(outcome="completed", source="tf.keras.callbacks.BackupAndRestore(save_freq=...)")
def test_backup_every_epoch_keeps_the_epoch_end_update(mwms_cluster):
    """Fixed: ``BackupAndRestore(save_freq="epoch")``, listed after the
    callback that halves the rate.

    TensorFlow: the backup is written in ``on_epoch_end``, after the
    callbacks listed before it, so epoch 2's backup holds the halved rate:
    after the same crash ``fit`` resumes at epoch 3 at 0.5 and ends at -14.
    None of the 48 single-crash plans at 3 workers breaks it.  Listed before
    the halving callback (``fit_with_backup(backup_first=True)``), the epoch
    backup misses it as well, and then a crash anywhere in the next epoch
    loses it (measured at steps 12, 14 and 15: -16; at 11, -14).

    Source: as for the broken variant.

    Fix: this.
    """
    every_step_at_its_rate(_backup_run(mwms_cluster, save_freq="epoch"))


# -- the chief names a checkpoint before it exists ----------------------------------

POINTER_STEPS = 20
SAVE_EVERY = 12           # the job's one checkpoint, at the top of step 12


def pointer_loop(fixed=False, steps=POINTER_STEPS, every=SAVE_EVERY):
    """A custom loop that checkpoints at the top of every ``every``-th step:
    every worker saves (the checkpoint holds an "examples seen" counter kept
    per replica and summed when read, as Keras metrics are, so saving is an
    all-reduce) and the chief writes ``run_dir/latest.json``, the step the
    newest checkpoint holds, from which a restarted job starts (restoring
    the newest checkpoint there is).  ``fixed=False`` writes the pointer
    before saving, ``fixed=True`` after.  Returns (the step this attempt
    started at, ``weight``)."""
    import tensorflow as tf

    import harness
    from scenarios.mnist_like import is_chief
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        weight = tf.Variable(0.0)
        seen = tf.Variable(0.0, trainable=False,
                           synchronization=tf.VariableSynchronization.ON_READ,
                           aggregation=tf.VariableAggregation.SUM)
    save = _checkpoints(tf.train.Checkpoint(weight=weight, seen=seen), strategy, ctx.run_dir)
    pointer = os.path.join(ctx.run_dir, "latest.json")
    start = 0
    if os.path.exists(pointer):
        with open(pointer) as f:
            start = json.load(f)["step"]
    chief = is_chief(strategy)

    def point_at(k):
        # Written whole or not at all: a restarted chief writes it again
        # while its peers read it (a plain rewrite was seen empty by a peer,
        # 1 run in 4, when a search crashed a worker at step 13).
        if chief:
            with open(pointer + ".tmp", "w") as f:
                json.dump({"step": k}, f)
            os.replace(pointer + ".tmp", pointer)

    step = _ledger_step(strategy, extra=lambda: seen.assign_add(1.0))
    for i in ctx.steps(steps - start):
        k = start + i
        if k and k % every == 0:
            if not fixed:
                point_at(k)          # the mistake: the pointer before the checkpoint
            save(k)
            if fixed:
                point_at(k)
        weight.assign_add(step(k))
    return start, float(weight.numpy())


def every_step_applied_once(result, steps=POINTER_STEPS):
    """``pointer_loop``'s promise: every step's update reached ``weight``
    exactly once, on every worker."""
    expected = float(2 ** steps - 1)
    weights = [w for _, w in result.return_values]
    assert weights == [expected] * len(weights), (
        f"weight {weights}, not {expected:g}: {_ledger_text(weights[0], expected, steps)}")


def _pointer_run(mwms_cluster, fixed):
    last = _last(mwms_cluster)      # not the chief: its crash at step 12 writes no pointer
    # The chief must reach its pointer write after its peer died: the
    # certain end comes once it blocks in save; a longer grace only keeps a
    # loaded machine from ending the run before the chief gets there (CI
    # once saw the restart start at 0 with grace=1).
    result = mwms_cluster.run(pointer_loop, kwargs={"fixed": fixed}, restarts=1,
                              faults=[Crash(last, SAVE_EVERY)], **{**_ENDS, "grace": 10})
    result.assert_completed()
    result.attempts[0].assert_crashed().assert_culprit(last)
    return result


@pytest.mark.timeout(120)
@scenario(outcome="completed", source="MWMS docs: save on every worker; a pointer written "
          "before the checkpoint it names",
          fixed_by="test_chief_names_the_checkpoint_once_saved")
def test_chief_names_the_checkpoint_before_it_is_saved(mwms_cluster):
    """The chief writes the pointer to step 12's checkpoint, then every worker
    saves it: a peer's crash at step 12 leaves a pointer to nothing, and the
    restart skips 12 steps.

    TensorFlow: saving a checkpoint that holds a sync-on-read variable
    all-reduces its value, so a save needs every worker; a peer that died at
    step 12's boundary never joins, and the chief, which had already
    written ``latest.json`` = 12, blocks in ``save`` until the harness ends
    it.  The restarted job reads step 12 from the pointer, restores the
    newest checkpoint there is (none: this was the job's first) and trains
    steps 12-19 only: ``weight`` = 2**20 - 2**12 on every worker, and the
    job completes.  A crash of the chief at step 12 dies before the pointer
    and is recovered, as is a crash at any other step: of the 60
    single-crash plans at 3 workers, ``Crash(1, 12)`` and ``Crash(2, 12)``
    break it (1 of 40 at 2 workers).

    Source: the MWMS tutorials (every worker saves, because saving can run
    collectives) and jobs that keep the newest checkpoint's step in a file
    of the chief's, for the job's own restart or a cluster manager.

    Fix: write the pointer once the checkpoint is saved
    (``test_chief_names_the_checkpoint_once_saved``), or start from the step
    counter inside the checkpoint.
    """
    result = _pointer_run(mwms_cluster, fixed=False)
    assert [start for start, _ in result.return_values] == \
        [SAVE_EVERY] * mwms_cluster.num_workers
    with pytest.raises(AssertionError, match=r"the updates of steps 0-11 lost"):
        every_step_applied_once(result)


@pytest.mark.timeout(120)
@scenario(outcome="completed", source="MWMS docs: save on every worker; a pointer written "
          "before the checkpoint it names")
def test_chief_names_the_checkpoint_once_saved(mwms_cluster):
    """Fixed: every worker saves step 12's checkpoint, then the chief writes
    the pointer to it.

    TensorFlow: after the same crash the chief is still blocked in the save
    when the harness ends it, so no pointer names the checkpoint that was
    never written: the restarted job starts at step 0 and ends with
    2**20 - 1.  None of the 60 single-crash plans at 3 workers breaks it.

    Source: as for the broken variant.

    Fix: this.
    """
    result = _pointer_run(mwms_cluster, fixed=True)
    assert [start for start, _ in result.return_values] == [0] * mwms_cluster.num_workers
    every_step_applied_once(result)


@pytest.mark.timeout(240)
@culprit_check("test_chief_names_the_checkpoint_before_it_is_saved")
def test_search_finds_the_pointer_window(mwms_cluster):
    """``explore`` over single crashes finds a crash of a worker other than
    the chief at step 12 (the chief's crash there comes before the pointer
    and is survived).  The fault-free run sees the job's one write at the
    boundary of step 13, so the search first crashes each role at steps 12
    and 13: the window is among its first four plans, whatever the seed
    (1 of 40 plans breaks it at 2 workers); the shrink, which would only
    lower the worker to 1, is cut to a second."""
    found = mwms_cluster.explore(pointer_loop, invariant=every_step_applied_once,
                                 kinds=["Crash"], restarts=1, seed=233, shrink_budget=1,
                                 check=False, **_SEARCH)
    assert found.failure is not None, found.summary()
    (crash,) = found.failure.plan
    assert isinstance(crash, Crash) and crash.step == SAVE_EVERY and crash.worker >= 1, \
        found.summary()
