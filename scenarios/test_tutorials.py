"""Jobs written the way TensorFlow's multi-worker tutorials write theirs
(``scenarios/tutorial_jobs/``), run unchanged: as a function (their
``main(argv)``) and as a script (``run_script``), with faults on the custom
loop, and with the tutorials' warning ignored (saving on the chief only).

The jobs know nothing of the harness: their steps are the harness's
automatic ones, each call of a ``tf.function`` that launches collectives
(``train_step`` in the custom loop, ``train_function`` in ``fit``).  Both run
3 epochs of 5 steps, so steps 0-14; the custom loop saves a checkpoint at
the end of each epoch, after steps 4, 9 and 14, and reads its accuracy
metric (an all-reduce, outside any ``tf.function``) just before.

The custom loop runs on Keras 3 unless a test says tf_keras; ``fit`` needs
tf_keras (``TF_USE_LEGACY_KERAS=1``, given with ``env=``).
"""
import os
import re

import pytest

from harness.faults import Crash, SkipStep
from scenarios.meta import KERAS_2, culprit_from_three, scenario
from scenarios.tutorial_jobs import ctl_checkpoint, keras_fit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CTL_SCRIPT = os.path.join(ROOT, "scenarios", "tutorial_jobs", "ctl_checkpoint.py")
KERAS_MODULE = "scenarios.tutorial_jobs.keras_fit"
TF_KERAS = KERAS_2
EPOCHS, STEPS_PER_EPOCH = 3, 5
AT = 7      # a fault's step: the third step of epoch 1, after the first checkpoint
CHECKPOINT_AFTER_3_EPOCHS = ["checkpoint", "ckpt-3.data-00000-of-00001", "ckpt-3.index"]
EPOCH_LINE = re.compile(r"^Epoch: \d+, accuracy: [0-9.]+, train_loss: [0-9.]+\.$", re.M)


@pytest.fixture
def keras3(monkeypatch):
    """The custom loop on Keras 3, whatever the environment pytest started with."""
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)


def _argv(model_dir, *extra, epochs=EPOCHS):
    return ["--model-dir", str(model_dir), "--epochs", str(epochs),
            "--steps-per-epoch", str(STEPS_PER_EPOCH), *extra]


def _last(mwms_cluster):
    return mwms_cluster.num_workers - 1


def _chief_files(model_dir):
    return sorted(os.listdir(os.path.join(model_dir, "ckpt")))


def _files_under(directory):
    return [os.path.join(parent, f) for parent, _, files in os.walk(directory) for f in files]


def _files_in_worker_temp_dirs(model_dir):
    """Every file under the non-chief workers' ``workertemp_<i>`` directories."""
    found = []
    for name in os.listdir(model_dir):
        if name.startswith("workertemp_"):
            for parent, _, files in os.walk(os.path.join(model_dir, name)):
                found.extend(os.path.join(parent, f) for f in files)
    return found


def _epoch_lines(worker):
    return EPOCH_LINE.findall(worker.log)


# -- the custom training loop with a CheckpointManager ----------------------------------

@pytest.mark.timeout(60)
@scenario(outcome="completed", source="MWMS custom-training-loop tutorial")
def test_ctl_job_as_a_function(mwms_cluster, tmp_path, keras3):
    """Fixed: the tutorial-style custom loop, every worker saving its
    checkpoint (non-chief ones into temporary directories they delete), run
    as a function: ``run(main, args=(argv,))``.

    TensorFlow: every worker trains 3 epochs of 5 steps and prints the same
    all-reduced loss and accuracy; the chief's directory holds the last
    checkpoint; the other workers' temporary directories are left empty.

    Source: the MWMS custom-training-loop tutorial (its ``write_filepath``,
    ``CheckpointManager`` and ``rmtree`` of the non-chief copies).

    Fix: this.
    """
    result = mwms_cluster.run(ctl_checkpoint.main, args=(_argv(tmp_path),), timeout=20)
    result.assert_completed()
    lines = result.return_values[0]
    assert len(lines) == EPOCHS and all(EPOCH_LINE.match(line) for line in lines)
    assert all(v == lines for v in result.return_values)
    assert all(w.last_step == EPOCHS * STEPS_PER_EPOCH - 1 for w in result.workers)
    assert _chief_files(tmp_path) == CHECKPOINT_AFTER_3_EPOCHS
    assert _files_in_worker_temp_dirs(tmp_path) == []


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="MWMS custom-training-loop tutorial")
def test_ctl_job_as_a_script(mwms_cluster, tmp_path, keras3):
    """Fixed: the same job run as a script, ``python ctl_checkpoint.py
    --model-dir DIR ...`` on every worker (``run_script``).

    TensorFlow: as for the function: each worker's log has the same three
    epoch lines, the chief's directory the last checkpoint, the others'
    temporary directories nothing.

    Source: the MWMS custom-training-loop tutorial (its job is a
    ``main.py`` started on each worker with its ``TF_CONFIG``).

    Fix: this.
    """
    result = mwms_cluster.run_script(CTL_SCRIPT, _argv(tmp_path), timeout=20)
    result.assert_completed()
    lines = _epoch_lines(result.workers[0])
    assert len(lines) == EPOCHS
    assert all(_epoch_lines(w) == lines for w in result.workers)
    assert _chief_files(tmp_path) == CHECKPOINT_AFTER_3_EPOCHS
    assert _files_in_worker_temp_dirs(tmp_path) == []


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="MWMS custom-training-loop tutorial",
          fixed_by="test_ctl_job_as_a_function")
def test_ctl_job_saving_on_the_chief_only(mwms_cluster, tmp_path, keras3):
    """The tutorial-style custom loop, but only the chief calls
    ``checkpoint_manager.save()``.

    TensorFlow: the checkpoint holds the model and a plain epoch counter;
    reading mirrored variables is local, so saving runs no collective and
    every worker completes, on Keras 3 and tf_keras alike: the mistake is
    silent until the checkpoint holds something sync-on-read (see
    ``test_ctl_job_saving_on_the_chief_only_a_checkpointed_metric``).

    Source: the MWMS custom-training-loop tutorial ("all workers need to
    save", because saving may run collectives).

    Fix: every worker saves, non-chief ones into temporary directories.
    """
    result = mwms_cluster.run(ctl_checkpoint.main,
                              args=(_argv(tmp_path, "--save-on", "chief"),), timeout=20)
    result.assert_completed()
    assert result.culprits == () and not result.ambiguous
    assert all(v == result.return_values[0] for v in result.return_values)
    assert _chief_files(tmp_path) == CHECKPOINT_AFTER_3_EPOCHS
    assert _files_in_worker_temp_dirs(tmp_path) == []


_METRIC_RUN = dict(timeout=6, grace=5, env=TF_KERAS)


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="InvalidArgumentError",
          source="MWMS custom-training-loop tutorial",
          fixed_by="test_ctl_job_saving_everywhere_a_checkpointed_metric")
def test_ctl_job_saving_on_the_chief_only_a_checkpointed_metric(mwms_cluster, tmp_path):
    """Only the chief saves, and the checkpoint also holds the tf_keras
    accuracy metric (``--checkpoint-metric``).

    TensorFlow: the metric's variables are sync-on-read, so the chief's save
    after epoch 0 all-reduces them (float32 scalars) while the others
    already run step 5's gradient all-reduce (float32[43706]): every worker
    raises ``InvalidArgumentError`` "Shape mismatch in the collective
    instance" (the chief, in 3 of 10 runs with 2 workers and none of 6 with
    3, stays blocked in its save until the grace runs out and is killed: the
    outcome is ``failed`` either way).
    (With one epoch, the save comes after the others returned, and the chief
    hangs in it instead.)  The culprit is the chief from 3
    workers up; with 2, one worker launched a collective more than the other
    in step 4, and nothing says which count is wrong: it cannot tell.

    Source: the MWMS custom-training-loop tutorial ("all workers need to
    save").

    Fix: every worker saves, non-chief ones into temporary directories.
    """
    result = mwms_cluster.run(
        ctl_checkpoint.main,
        args=(_argv(tmp_path, "--save-on", "chief", "--checkpoint-metric"),), **_METRIC_RUN)
    result.assert_failed(error="InvalidArgumentError")
    raised = [w.exception for w in result.workers if w.exception is not None]
    assert all(e.type_name == "InvalidArgumentError" for e in raised)
    assert any("Shape mismatch" in e.message for e in raised)
    assert all(w.exception is not None for w in result.workers[1:])
    assert result.workers[0].last_step == STEPS_PER_EPOCH - 1
    culprit_from_three(result, 0)


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="MWMS custom-training-loop tutorial")
def test_ctl_job_saving_everywhere_a_checkpointed_metric(mwms_cluster, tmp_path):
    """Fixed: the checkpoint holds the tf_keras accuracy metric too, and
    every worker saves.

    TensorFlow: the metric's all-reduces at each save pair up; every worker
    completes with the same losses; the chief's directory holds the last
    checkpoint and the others' temporary directories nothing.

    Source: the MWMS custom-training-loop tutorial.

    Fix: this.
    """
    result = mwms_cluster.run(ctl_checkpoint.main,
                              args=(_argv(tmp_path, "--checkpoint-metric"),), timeout=20,
                              env=TF_KERAS)
    result.assert_completed()
    assert all(v == result.return_values[0] for v in result.return_values)
    assert _chief_files(tmp_path) == CHECKPOINT_AFTER_3_EPOCHS
    assert _files_in_worker_temp_dirs(tmp_path) == []


@pytest.mark.timeout(60)
@scenario(outcome="crashed", source="MWMS custom-training-loop tutorial; fault tolerance",
          fixed_by="test_ctl_job_resumes_from_its_checkpoint_after_a_crash")
def test_ctl_job_worker_crashes(mwms_cluster, tmp_path, keras3):
    """A worker of the unmodified custom loop dies at step 7 (epoch 1), after
    the first checkpoint.

    TensorFlow: the survivors are in step 7's gradient all-reduce and raise
    ``UnavailableError`` at once (the dead peer's sockets closed); the
    chief's directory keeps the checkpoint of epoch 0.  Under load (two runs
    sharing 2 cores: 1 of 16) a survivor raises while still in step 6: the
    dead worker had finished step 6's all-reduce, the survivor had not yet
    received its last piece.  The outcome and the culprit are the same.

    Source: the MWMS custom-training-loop tutorial (fault tolerance:
    "restart the job and resume from the checkpoint").

    Fix: start the whole job again; it restores the chief's latest
    checkpoint and resumes at the next epoch.
    """
    last = _last(mwms_cluster)
    result = mwms_cluster.run(ctl_checkpoint.main, args=(_argv(tmp_path),), timeout=20,
                              grace=5, faults=[Crash(last, AT)])
    result.assert_crashed().assert_culprit(last)
    assert result.faults_never_acted == ()
    assert all(w.exception.type_name == "UnavailableError" for w in result.workers[:last])
    assert result.workers[last].last_step == AT
    # Under load a survivor may get the news while still finishing step 6 (see the docstring).
    assert all(w.last_step in (AT - 1, AT) for w in result.workers[:last])
    assert _chief_files(tmp_path) == ["checkpoint", "ckpt-1.data-00000-of-00001",
                                      "ckpt-1.index"]


@pytest.mark.timeout(90)
@scenario(outcome="completed", source="MWMS custom-training-loop tutorial; fault tolerance")
def test_ctl_job_resumes_from_its_checkpoint_after_a_crash(mwms_cluster, tmp_path, keras3):
    """Fixed: after the crash at step 7, the same job is started again on a
    new cluster and resumes from the chief's checkpoint.

    TensorFlow: the first run crashes as in ``test_ctl_job_worker_crashes``;
    in the second every worker restores the epoch counter (1) and the model
    from the chief's directory and trains epochs 1 and 2 only, to the same
    losses on every worker.

    Source: the MWMS custom-training-loop tutorial (its epoch counter in the
    checkpoint, ``tf.train.latest_checkpoint`` on restart).

    Fix: this.
    """
    last = _last(mwms_cluster)
    crashed = mwms_cluster.run(ctl_checkpoint.main, args=(_argv(tmp_path),), timeout=20,
                               grace=5, faults=[Crash(last, AT)])
    crashed.assert_crashed().assert_culprit(last)
    assert crashed.faults_never_acted == ()
    resumed = mwms_cluster.run(ctl_checkpoint.main, args=(_argv(tmp_path),), timeout=20)
    resumed.assert_completed()
    lines = resumed.return_values[0]
    assert [line.split(",")[0] for line in lines] == ["Epoch: 1", "Epoch: 2"]
    assert all(v == lines for v in resumed.return_values)
    # 2 epochs' steps: the harness numbers each run's steps from 0.
    assert all(w.last_step == 2 * STEPS_PER_EPOCH - 1 for w in resumed.workers)
    assert _chief_files(tmp_path) == CHECKPOINT_AFTER_3_EPOCHS
    assert _files_in_worker_temp_dirs(tmp_path) == []


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="InvalidArgumentError",
          source="seed article (the deadlock it describes)",
          fixed_by="test_ctl_job_as_a_function")
def test_ctl_job_worker_skips_a_step(mwms_cluster, tmp_path, keras3):
    """A worker of the unmodified custom loop skips step 7 (a ``continue``
    on a bad local batch, say); the others run it.

    TensorFlow: not a hang: the skipping worker reaches the end of epoch 1
    one step early and reads the accuracy metric (an all-reduce of float32
    scalars) while the others run step 9's gradient all-reduce
    (float32[43706]): every worker raises ``InvalidArgumentError`` "Shape
    mismatch".  From 3 workers the skipping worker is the culprit: its step
    launched one collective more than the majority's same step.  With 2, a
    worker one step short looks the same as a peer with one step more
    (uneven data): the verdict cannot tell, and names both.

    Source: the seed article (the deadlock it describes); the same bug as
    ``test_control_flow.py::test_worker_skips_a_step``, in a tutorial's loop.

    Fix: every worker runs every step (skip a batch on all workers alike, or
    filter bad examples in the input pipeline).
    """
    last = _last(mwms_cluster)
    result = mwms_cluster.run(ctl_checkpoint.main, args=(_argv(tmp_path),), timeout=6,
                              grace=5, faults=[SkipStep(last, AT)])
    culprit_from_three(result.assert_failed(error="InvalidArgumentError"), last)
    assert result.faults_never_acted == ()
    assert "Shape mismatch" in result.workers[last].exception.message


# -- tf_keras model.fit with BackupAndRestore --------------------------------------------

@pytest.mark.timeout(60)
@scenario(outcome="completed", source="MWMS Keras tutorial")
def test_keras_fit_job_as_a_function(mwms_cluster, tmp_path):
    """Fixed: the tutorial-style tf_keras ``fit`` with ``BackupAndRestore``,
    then ``model.save`` on every worker, run as a function.

    TensorFlow: every worker fits 3 epochs of 5 steps to the same losses;
    ``BackupAndRestore`` deletes its backup when ``fit`` ends; the chief's
    directory holds ``model.keras`` and the others' temporary directories
    are gone.

    Source: the multi-worker Keras tutorial (``BackupAndRestore``, model
    saving with ``write_filepath``).

    Fix: this.
    """
    result = mwms_cluster.run(keras_fit.main, args=(_argv(tmp_path),), timeout=20,
                              env=TF_KERAS)
    result.assert_completed()
    losses = result.return_values[0]
    assert len(losses) == EPOCHS and losses[-1] < losses[0]
    assert all(v == losses for v in result.return_values)
    assert all(w.last_step == EPOCHS * STEPS_PER_EPOCH - 1 for w in result.workers)
    assert sorted(os.listdir(tmp_path)) == ["backup", "model.keras"]
    assert os.listdir(tmp_path / "backup") == []


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="MWMS Keras tutorial")
def test_keras_fit_job_as_a_script(mwms_cluster, tmp_path, monkeypatch):
    """Fixed: the same ``fit`` job run as ``python -m
    scenarios.tutorial_jobs.keras_fit --model-dir DIR ...`` on every worker
    (``run_script(module=...)``).

    TensorFlow: as for the function: the same losses in every worker's log,
    ``model.keras`` in the chief's directory, nothing left of the others'.

    Source: the multi-worker Keras tutorial (its job is a ``main.py``
    started on each worker).

    Fix: this.
    """
    monkeypatch.chdir(ROOT)   # python -m finds the module from the current directory
    result = mwms_cluster.run_script(module=KERAS_MODULE, argv=_argv(tmp_path), timeout=20,
                                     env=TF_KERAS)
    result.assert_completed()
    printed = [re.findall(r"^losses: .*$", w.log, re.M) for w in result.workers]
    assert len(printed[0]) == 1 and all(p == printed[0] for p in printed)
    assert sorted(os.listdir(tmp_path)) == ["backup", "model.keras"]


@pytest.mark.timeout(90)
@scenario(outcome="completed", source="MWMS Keras tutorial; fault tolerance")
def test_keras_fit_job_resumes_with_backup_and_restore(mwms_cluster, tmp_path):
    """Fixed: a worker of the ``fit`` job dies at step 7 (epoch 1); the
    cluster is restarted (``restarts=1``) and ``BackupAndRestore`` resumes it.

    TensorFlow: the first attempt crashes with the backup of epoch 0 on disk
    (the survivors block, then raise ``UnavailableError``); the second
    restores it on every worker and fits epochs 1 and 2 only (2 entries in
    the history), then saves the model.  After the successful ``fit`` the
    backup is deleted: its directory is left, empty.

    Source: the multi-worker Keras tutorial (fault tolerance with
    ``BackupAndRestore``).

    Fix: this.
    """
    last = _last(mwms_cluster)
    result = mwms_cluster.run(keras_fit.main, args=(_argv(tmp_path),), timeout=20, grace=5,
                              env=TF_KERAS, faults=[Crash(last, AT)], restarts=1)
    result.assert_completed()
    crashed, resumed = result.attempts
    crashed.assert_crashed().assert_culprit(last)
    assert all(len(v) == EPOCHS - 1 for v in resumed.return_values)
    assert all(v == resumed.return_values[0] for v in resumed.return_values)
    assert sorted(os.listdir(tmp_path)) == ["backup", "model.keras"]
    assert _files_under(tmp_path / "backup") == []


@pytest.mark.timeout(90)
@scenario(outcome="completed", source="MWMS Keras tutorial; fault tolerance",
          fixed_by="test_keras_fit_job_resumes_with_backup_and_restore")
def test_keras_fit_job_without_backup_starts_over(mwms_cluster, tmp_path):
    """The same crash and restart, without ``BackupAndRestore``.

    TensorFlow: the restarted job has nothing to resume from and fits all 3
    epochs again: it completes, and the work before the crash is lost
    (here 1 epoch and 2 steps, in a long job hours).

    Source: the multi-worker Keras tutorial (fault tolerance).

    Fix: ``tf.keras.callbacks.BackupAndRestore(backup_dir=...)`` in ``fit``'s
    callbacks, on every worker.
    """
    last = _last(mwms_cluster)
    result = mwms_cluster.run(keras_fit.main, args=(_argv(tmp_path, "--no-backup"),),
                              timeout=20, grace=5, env=TF_KERAS, faults=[Crash(last, AT)],
                              restarts=1)
    result.assert_completed()
    crashed, restarted = result.attempts
    crashed.assert_crashed().assert_culprit(last)
    assert all(len(v) == EPOCHS for v in restarted.return_values)   # started over
