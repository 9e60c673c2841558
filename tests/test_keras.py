"""Step progress and step faults through context().keras_callback() on
Keras 2, the one where model.fit runs under MWMS: tf_keras
(TF_USE_LEGACY_KERAS=1) from TensorFlow 2.16, tf.keras itself on 2.15."""
import pytest

import harness
from harness import faults as F
from harness.core import versions

MINOR = versions.installed_minor()

pytestmark = pytest.mark.timeout(120)

BATCHES = 12


def fit_with_callback():
    import numpy as np
    import tensorflow as tf
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rng = np.random.default_rng(0)
    x = rng.random((BATCHES * 16, 784), dtype=np.float32)
    y = rng.integers(0, 10, BATCHES * 16).astype("int64")
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).repeat()
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(10, activation="relu", input_shape=(784,)),
                                     tf.keras.layers.Dense(10)])
        model.compile(optimizer="adam",
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(ds, epochs=2, steps_per_epoch=BATCHES // 2, verbose=0,
                        callbacks=[ctx.keras_callback()])
    return type(model).__module__.split(".")[0], len(history.history["loss"])


@pytest.fixture
def legacy_keras(monkeypatch):
    import importlib.util
    env = versions.keras2_env(MINOR)
    if env and importlib.util.find_spec("tf_keras") is None:  # not imported: keep TF out
        pytest.skip("tf_keras is not installed: pip install \"$(python -m harness keras2)\"")
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_fit_reports_batches_as_steps(mwms_cluster, legacy_keras):
    result = mwms_cluster.run(fit_with_callback, timeout=30).assert_completed()
    assert result.return_values == [(versions.keras2_package(MINOR), 2)] * mwms_cluster.num_workers
    assert [w.last_step for w in result.workers] == [BATCHES - 1] * mwms_cluster.num_workers


def test_fit_pause_fault_is_a_hang_naming_the_worker(mwms_cluster, legacy_keras):
    last = mwms_cluster.num_workers - 1
    result = mwms_cluster.run(fit_with_callback, timeout=4, faults=[F.Pause(last, 7)])
    result.assert_hang(culprits=[last])
    assert result.workers[last].last_step == 7


def test_fit_crash_fault(mwms_cluster, legacy_keras):
    result = mwms_cluster.run(fit_with_callback, timeout=20, grace=1, faults=[F.Crash(0, 3, "kill")])
    result.assert_crashed(culprits=[0])


def test_skip_step_is_rejected_for_keras(mwms_cluster, legacy_keras):
    result = mwms_cluster.run(fit_with_callback, timeout=20, grace=1, faults=[F.SkipStep(0, 3)])
    assert result.outcome == "failed"
    assert "SkipStep cannot act through keras_callback()" in result.workers[0].exception.message
