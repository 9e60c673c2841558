"""Users' bugs in restarts and checkpoints: jobs that resume after a
preemption from the wrong past, or save where only some workers are.

A restart is the job's own exit: :func:`preempt` ends one task with
``os._exit(1)`` the first time it reaches a step (a marker file in the
run's ``directory`` remembers it), as a preempted pod ends, and the case's
``run`` asks for the restart (``restart_policy`` ``cluster``: every task
again; ``task``: the failed ones).  The checkpoint code follows the
TensorFlow tutorials' ``write_filepath`` / ``_is_chief`` pattern (every
worker saves, the chief to the real directory, the others to a temporary
one they delete), and the bugs are the ways users misread it.
"""
from __future__ import annotations

import json
import os

from harness.bench.corpus import Case, at_fault, no_single
from harness.bench.corpus.fit import arrays, small_model, task_index

STEPS = 6
AT = 3          # the preempted task ends at this step's boundary, the first time

TUTORIAL_CTL = ("TensorFlow tutorial 'Custom training loop with Keras and "
                "MultiWorkerMirroredStrategy' (tensorflow.org/tutorials/distribute/multi_worker_with_ctl)")
TUTORIAL_KERAS = ("TensorFlow tutorial 'Multi-worker training with Keras', its BackupAndRestore "
                  "section (tensorflow.org/tutorials/distribute/multi_worker_with_keras)")


# -- the tutorial's helpers, as users copy them ---------------------------------
def task_of() -> tuple:
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    return task["type"], int(task["index"])


def is_chief(task_type: str, task_id: int) -> bool:
    """The tutorial's ``_is_chief``: the chief, or worker 0 where there is none."""
    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    return task_type == "chief" or (task_type == "worker" and task_id == 0
                                    and "chief" not in cluster)


def write_dirpath(dirpath: str, task_type: str, task_id: int) -> str:
    """The tutorial's ``write_filepath`` for a directory: the chief writes
    to ``dirpath``, every other task to a temporary directory of its own."""
    if is_chief(task_type, task_id):
        return dirpath
    return os.path.join(dirpath, f"workertemp_{task_id}")


def preempt(directory: str, task: int, step: int, at: int = AT) -> None:
    """Task ``task`` ends at step ``at`` the first time it gets there, as a
    preempted pod does (no error, no cleanup)."""
    marker = os.path.join(directory, f"preempted-{task}")
    if task_index() == task and step == at and not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(1)


def _counter_loop(tf, strategy, counter, start: int, directory: str, after_step=None):
    """All-reduce steps from ``start`` to :data:`STEPS`, the counter kept
    in ``counter``; ``after_step(step)`` runs after each (the saving)."""
    with strategy.scope():
        w = tf.Variable(1.0)

    @tf.function
    def train_step():
        return strategy.reduce("SUM", strategy.run(lambda: w * 1.0), axis=None)

    for step in range(start, STEPS):
        preempt(directory, 1, step)
        train_step()
        counter.assign(step + 1)
        if after_step is not None:
            after_step(step)


def tutorial_checkpoint(tf, directory: str):
    """The tutorial's set-up: the strategy, a step counter in its scope, a
    checkpoint of it and a manager saving into this task's write directory.
    Returns ``(strategy, counter, checkpoint, checkpoint_dir, save)``:
    ``save(step)`` saves, and a non-chief deletes its temporary copy."""
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task_type, task_id = task_of()
    with strategy.scope():
        counter = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(counter=counter)
    checkpoint_dir = os.path.join(directory, "ckpt")
    write_dir = write_dirpath(checkpoint_dir, task_type, task_id)
    manager = tf.train.CheckpointManager(checkpoint, write_dir, max_to_keep=1)

    def save(step):
        manager.save()
        if not is_chief(task_type, task_id):
            tf.io.gfile.rmtree(write_dir)

    return strategy, counter, checkpoint, checkpoint_dir, save


# -- 1. restore from the temporary write directory ---------------------------------
def _own_write_dir(directory: str, broken: bool):
    """The tutorial's loop: every worker saves, the non-chief to its
    temporary directory that it then deletes; each restores from
    ``latest_checkpoint``.  The broken job looks in its own write directory."""
    import tensorflow as tf
    strategy, counter, checkpoint, checkpoint_dir, save = tutorial_checkpoint(tf, directory)
    task_type, task_id = task_of()
    write_dir = write_dirpath(checkpoint_dir, task_type, task_id)
    latest = tf.train.latest_checkpoint(write_dir if broken else checkpoint_dir)
    if latest:
        checkpoint.restore(latest)
    _counter_loop(tf, strategy, counter, int(counter.numpy()), directory, save)


def restore_own_write_dir(directory: str):
    _own_write_dir(directory, broken=True)


def restore_chief_dir(directory: str):
    _own_write_dir(directory, broken=False)


# -- 2. restore only on the chief ----------------------------------------------------
def _restore_on(directory: str, chief_only: bool):
    import tensorflow as tf
    strategy, counter, checkpoint, checkpoint_dir, save = tutorial_checkpoint(tf, directory)
    # The broken job reads the checkpoint where it saves it: on the chief.
    if is_chief(*task_of()) or not chief_only:
        latest = tf.train.latest_checkpoint(checkpoint_dir)
        if latest:
            checkpoint.restore(latest)
    _counter_loop(tf, strategy, counter, int(counter.numpy()), directory, save)


def restore_on_chief_only(directory: str):
    _restore_on(directory, chief_only=True)


def restore_on_every_worker(directory: str):
    _restore_on(directory, chief_only=False)


# -- 3. each worker keeps its own checkpoints, and restores its own --------------------
def _own_checkpoints(directory: str, own: bool):
    """Every worker saves after each step into its own directory and keeps
    it; the preempted one ends after its step, before its save, so its own
    latest checkpoint is a step older than its peers'."""
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task_type, task_id = task_of()
    with strategy.scope():
        counter = tf.Variable(0, dtype=tf.int64)
        w = tf.Variable(1.0)
    checkpoint = tf.train.Checkpoint(counter=counter)
    checkpoint_dir = os.path.join(directory, "ckpt")
    write_dir = (os.path.join(directory, f"ckpt-{task_type}-{task_id}") if own
                 else write_dirpath(checkpoint_dir, task_type, task_id))
    manager = tf.train.CheckpointManager(checkpoint, write_dir, max_to_keep=1)
    latest = tf.train.latest_checkpoint(write_dir if own else checkpoint_dir)
    if latest:
        checkpoint.restore(latest)

    @tf.function
    def train_step():
        return strategy.reduce("SUM", strategy.run(lambda: w * 1.0), axis=None)

    for step in range(int(counter.numpy()), STEPS):
        train_step()
        counter.assign(step + 1)
        preempt(directory, 1, step)   # after the step, before the save
        manager.save()
        if not own and not is_chief(task_type, task_id):
            tf.io.gfile.rmtree(write_dir)


def restore_own_checkpoints(directory: str):
    _own_checkpoints(directory, own=True)


def restore_shared_checkpoints(directory: str):
    _own_checkpoints(directory, own=False)


# -- 4. a step counter kept outside the checkpoint, by the chief only ------------------
def _step_file(directory: str, shared: bool):
    """The checkpoint is the tutorial's; the loop's position is a file the
    chief writes.  The broken job reads a file of its own task, which only
    the chief's exists."""
    import tensorflow as tf
    strategy, counter, checkpoint, checkpoint_dir, save_checkpoint = tutorial_checkpoint(
        tf, directory)
    task_type, task_id = task_of()
    latest = tf.train.latest_checkpoint(checkpoint_dir)
    if latest:
        checkpoint.restore(latest)
    cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
    chief = ("chief", 0) if "chief" in cluster else ("worker", 0)
    chief_file = os.path.join(directory, "step-{}-{}.txt".format(*chief))
    mine = chief_file if shared else os.path.join(directory, f"step-{task_type}-{task_id}.txt")
    start = 0
    if os.path.exists(mine):
        with open(mine) as f:
            start = int(f.read())

    def save(step):
        save_checkpoint(step)
        if is_chief(task_type, task_id):
            with open(chief_file, "w") as f:
                f.write(str(step + 1))

    _counter_loop(tf, strategy, counter, start, directory, save)


def step_file_per_task(directory: str):
    _step_file(directory, shared=False)


def step_file_of_the_chief(directory: str):
    _step_file(directory, shared=True)


# -- 5. BackupAndRestore with a backup directory per worker ---------------------------
EPOCHS = 4


def _backup_and_restore(directory: str, per_worker: bool):
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = small_model(tf)
    x, y = arrays(tf, 64)
    backup = (os.path.join(directory, f"backup-{task_index()}") if per_worker
              else os.path.join(directory, "backup"))

    class Preempted(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            preempt(directory, 1, epoch, at=2)

    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    model.fit(data, epochs=EPOCHS, verbose=0,
              callbacks=[tf.keras.callbacks.BackupAndRestore(backup_dir=backup), Preempted()])


def backup_dir_per_worker(directory: str):
    _backup_and_restore(directory, per_worker=True)


def backup_dir_shared(directory: str):
    _backup_and_restore(directory, per_worker=False)


# -- 6. a checkpoint saved only on the chief, with a sync-on-read variable ------------
def _save_on(directory: str, chief_only: bool):
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task_type, task_id = task_of()
    with strategy.scope():
        w = tf.Variable(1.0)
        # A metric's state: saving it reads its value across the workers.
        total = tf.Variable(0.0, synchronization=tf.VariableSynchronization.ON_READ,
                            aggregation=tf.VariableAggregation.SUM)
    checkpoint = tf.train.Checkpoint(w=w, total=total)
    checkpoint_dir = os.path.join(directory, "ckpt")
    write_dir = write_dirpath(checkpoint_dir, task_type, task_id)
    manager = tf.train.CheckpointManager(checkpoint, write_dir, max_to_keep=1)

    @tf.function
    def train_step():
        def replica():
            total.assign_add(1.0)
            return w * 1.0
        return strategy.reduce("SUM", strategy.run(replica), axis=None)

    for step in range(STEPS):
        train_step()
        if step % 2 == 1 and (is_chief(task_type, task_id) or not chief_only):
            manager.save()
            if not is_chief(task_type, task_id):
                tf.io.gfile.rmtree(write_dir)


def save_on_chief_only(directory: str):
    _save_on(directory, chief_only=True)


def save_on_every_worker(directory: str):
    _save_on(directory, chief_only=False)


def _non_chiefs(size: int):
    """The tasks that are not the chief (task 0) of ``size``: one is at fault
    alone at two tasks; from three, no single one is."""
    return at_fault(1) if size == 2 else no_single(range(1, size))


# On TensorFlow 2.21.0 each broken custom loop's last attempt hangs, the
# workers that started again from step 0 waiting in a step the others never
# launch; backup_dir_per_worker's fit and save_on_chief_only_sync_on_read fail
# (InvalidArgumentError: collectives that do not match); each fixed twin completes.
CASES = (
    Case("restore_from_own_write_dir", "restarts and checkpoints",
         TUTORIAL_CTL + ": its non-chief workers write to a temporary directory they delete",
         "after a restart each worker restores from the directory it writes to, so the "
         "non-chief finds no checkpoint and starts again from step 0 while the chief resumes.",
         restore_own_write_dir, restore_chief_dir, truth=_non_chiefs,
         sizes=(2, 3), timeout=10, run={"restarts": 1, "restart_policy": "cluster"}),
    Case("restore_from_own_write_dir_task_restart", "restarts and checkpoints",
         TUTORIAL_CTL + ", restarted one task at a time (Kubernetes restartPolicy: OnFailure)",
         "as restore_from_own_write_dir, with a chief, each failed task restarted alone.",
         restore_own_write_dir, restore_chief_dir, truth=_non_chiefs,
         sizes=(2, 3), chief=True, timeout=10,
         run={"restarts": 2, "restart_policy": "task"}),
    Case("restore_on_chief_only", "restarts and checkpoints",
         TUTORIAL_CTL + ": the chief saves the checkpoint, so users restore it there only",
         "only the chief restores the latest checkpoint after a restart; the other workers "
         "start again from step 0.",
         restore_on_chief_only, restore_on_every_worker, truth=_non_chiefs,
         sizes=(2, 3, 4), timeout=10, run={"restarts": 1, "restart_policy": "cluster"}),
    Case("restore_own_checkpoints", "restarts and checkpoints",
         TUTORIAL_CTL + ": every worker must restore the chief's checkpoint",
         "each worker keeps and restores its own checkpoints; the preempted one ended before "
         "its last save, so it resumes a step behind its peers.",
         restore_own_checkpoints, restore_shared_checkpoints, truth=at_fault(1),
         sizes=(2, 3), timeout=10, run={"restarts": 1, "restart_policy": "cluster"}),
    Case("step_counter_outside_checkpoint", "restarts and checkpoints",
         TUTORIAL_CTL + ": the loop's position is restored from the checkpoint on every worker",
         "the loop's step is kept in a file only the chief writes, and each worker reads a file "
         "of its own task: the others start again from step 0.",
         step_file_per_task, step_file_of_the_chief, truth=_non_chiefs,
         sizes=(2, 3), chief=True, timeout=10,
         run={"restarts": 1, "restart_policy": "cluster"}),
    Case("backup_dir_per_worker", "restarts and checkpoints",
         TUTORIAL_KERAS + "; tf.keras.callbacks.BackupAndRestore: backup_dir is shared by "
         "the workers",
         "BackupAndRestore's backup_dir differs per worker, so after a restart the non-chief "
         "finds no backup and fits from epoch 0 while the chief resumes.",
         backup_dir_per_worker, backup_dir_shared, truth=_non_chiefs,
         sizes=(2, 3), keras="tf_keras", timeout=15,
         run={"restarts": 1, "restart_policy": "cluster"}),
    Case("save_on_chief_only_sync_on_read", "restarts and checkpoints",
         TUTORIAL_CTL + ": every worker saves, since saving may run collectives",
         "only the chief calls CheckpointManager.save; saving a sync-on-read variable "
         "all-reduces it, so the chief waits in a collective its peers never join.",
         save_on_chief_only, save_on_every_worker, truth=at_fault(0),
         sizes=(2, 3), timeout=10),
)
