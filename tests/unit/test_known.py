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
