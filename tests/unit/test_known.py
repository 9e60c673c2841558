"""Failures TensorFlow or Keras gives for a known reason are told as such,
and an error's line is never cut before its reason.  No TensorFlow: the
messages are TensorFlow 2.21's and Keras 3.15's words, as the catalogue's
scenarios (named in each row of harness.diagnosis.known) measured them."""
import pytest

from harness.core.protocol import WorkerError
from harness.diagnosis import diagnose
from harness.diagnosis.echoes import error_text, reason_line
from harness.diagnosis.known import KNOWN, known_of
from observations import raised, run

PER_REPLICA = """Attempt to convert a value (PerReplica:{
  0: <tf.Tensor: shape=(16, 8), dtype=float32, numpy=
array([[0.5488135 , 0.71518934, 0.60276335, 0.5448832 , 0.4236548 ,
        0.6458941 , 0.4375872 , 0.891773  ],
       [0.96366274, 0.3834415 , 0.79172504, 0.5288949 , 0.56804454,
        0.92559665, 0.07103606, 0.0871293 ]], dtype=float32)>
}) with an unsupported type (<class 'tensorflow.python.distribute.values.PerReplica'>) to a Tensor.
Traceback line that is not the reason"""


def test_a_message_whose_first_line_opens_a_value_is_read_to_its_reason():
    line = reason_line(PER_REPLICA)
    assert line.startswith("Attempt to convert a value (PerReplica:{ 0: <tf.Tens")
    assert line.endswith("with an unsupported type (<class 'tensorflow.python.distribute."
                         "values.PerReplica'>) to a Tensor.")
    assert "0.96366274" not in line and "Traceback" not in line
    assert reason_line("Shape mismatch (1 vs 2)\nmore") == "Shape mismatch (1 vs 2)"
    assert reason_line("") == ""
    assert error_text(WorkerError("ValueError", PER_REPLICA)).endswith("to a Tensor.")


@pytest.mark.parametrize("known", KNOWN, ids=[k.name for k in KNOWN])
def test_each_known_failure_is_recognised_by_its_type_and_words(known):
    error = WorkerError(f"builtins.{known.type_name}", f"some context: {known.words} ...")
    assert known_of(error) is known
    assert known_of(WorkerError("builtins.TypeError", known.words)) is None
    assert known.link.startswith("https://") and known.fix


def test_keras3_fit_under_mwms_says_the_fix_and_keeps_the_reason():
    obs = run(*(raised(i, 2, "ValueError", PER_REPLICA, 1.0 + i / 100, steps=()) for i in (0, 1)))
    text = diagnose(obs).text
    assert "known: Keras 3's fit does not run under MultiWorkerMirroredStrategy (workers 0,1 " \
           "raised it): fit with tf_keras (pip install tf_keras; TF_USE_LEGACY_KERAS=1)" in text
    assert "https://github.com/keras-team/keras/issues/20585" in text
    assert "to a Tensor." in text.splitlines()[0] or any(
        ln.startswith("  workers 0,1: raised") and "to a Tensor." in ln for ln in text.splitlines())


def test_an_unknown_error_adds_no_line():
    obs = run(raised(0, 2, "ValueError", "bad batch", 1.0), raised(1, 2, "ValueError", "x", 1.1))
    assert "known:" not in diagnose(obs).text


def test_an_error_for_losing_a_race_every_task_ran_cannot_tell_who():
    """Every worker saves to one .h5 path: the one holding the file's lock
    waits in the save's all-reduce, the other raises for the lock; who
    raised is chance (tensorflow#38635, TensorFlow 2.21 in the catalogue)."""
    from harness.diagnosis.stages import conclude
    from harness.diagnosis.story import Story
    from observations import blocked
    locked = ("[Errno 11] Unable to synchronously create file (unable to lock file, "
              "errno = 11, error message = 'Resource temporarily unavailable')")
    for n in (2, 3):
        obs = run(blocked(0, n, steps=range(2)),
                  *(raised(i, n, "BlockingIOError", locked, 1.0 + i / 100, steps=range(2))
                    for i in range(1, n)), ended_by="all_finished")
        alone = diagnose(obs)
        v = conclude(alone, obs, Story())
        assert v.ambiguous and v.culprits == tuple(range(n)), v.text
        assert v.stages[-1] == "shared_cause"
        assert v.text.startswith(f"{v.outcome.upper()}: cannot tell who is to blame: the tasks "
                                 "saved to one file at once"), v.text
        assert "known: the tasks saved to one file at once" in v.text
        assert "<- culprit" not in v.text


def test_an_ordinary_error_on_one_worker_still_names_it():
    from harness.diagnosis.stages import conclude
    from harness.diagnosis.story import Story
    from observations import blocked
    obs = run(blocked(0, 2, steps=range(2)), raised(1, 2, "ValueError", "bad batch", 1.0,
                                                   steps=range(2)), ended_by="all_finished")
    v = conclude(diagnose(obs), obs, Story())
    assert "shared_cause" not in v.stages


@pytest.mark.parametrize("n", [2, 3])
def test_an_error_of_a_setting_every_task_shares_names_every_task(n):
    """FILE sharding with fewer files than workers (TensorFlow 2.21, the
    catalogue): workers 0 to N - 2 raise the sharding error, the last
    StopIteration; the job's files are at fault, not the ones that said so."""
    from harness.diagnosis.stages import conclude
    from harness.diagnosis.story import Story
    sharding = ("Could not apply FILE based sharding: the dataset only has 1 file(s), which is "
                "not enough for the required 2 shards/workers")
    obs = run(*(raised(i, n, "InvalidArgumentError", sharding, 1.0 + i / 100, steps=())
                for i in range(n - 1)),
              raised(n - 1, n, "StopIteration", "", 1.2, steps=()), ended_by="all_finished")
    v = conclude(diagnose(obs), obs, Story())
    assert v.culprits == tuple(range(n)) and not v.ambiguous, v.text
    assert v.stages[-1] == "shared_cause"
    assert v.text.startswith("FAILED: no single task is at fault: the dataset has fewer files "
                             "than the workers FILE sharding splits it among"), v.text
    assert "AutoShardPolicy.DATA" in v.text
