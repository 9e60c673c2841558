"""The TensorFlow installed is one of the range, and in a worker it is what
``harness.core.versions`` says it is: its version, and its ``tf.keras``.
Run on every minor CI checks (.ci/run)."""
import importlib.util

import pytest

from harness.core import versions

pytestmark = pytest.mark.timeout(120)


def keras_in_a_worker():
    import importlib

    import tensorflow as tf
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    package = type(model).__module__.split(".")[0]
    return tf.__version__, package, importlib.import_module(package).__version__


def test_the_installed_tensorflow_is_in_the_range():
    installed = versions.installed_tensorflow()
    assert installed is not None and versions.supported(versions.minor_of(installed)), installed


@pytest.mark.parametrize("keras", ["default", "keras2"])
def test_tf_keras_in_a_worker_is_the_keras_versions_says(mwms_cluster, keras):
    minor = versions.installed_minor()
    env = versions.keras2_env(minor) if keras == "keras2" else {}
    if env and importlib.util.find_spec("tf_keras") is None:
        pytest.skip(f"tf_keras is not installed: pip install "
                    f"\"{versions.keras2_requirement(versions.installed_tensorflow())}\"")
    result = mwms_cluster.run(keras_in_a_worker, env=env, timeout=60)
    result.assert_completed()
    version, package, keras_version = result.return_values[0]
    assert version == versions.installed_tensorflow()
    expected = "keras2" if keras == "keras2" else versions.keras_of(minor, legacy=False)
    assert keras_version.startswith("3.") == (expected == "keras3"), (package, keras_version)
    if keras == "keras2":
        assert package == versions.keras2_package(minor), package
