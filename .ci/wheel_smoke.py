"""Run by .ci/run from a folder outside the checkout, against the built wheel
installed in the venv: the plugin registers through its entry point, a
2-worker cluster runs, and the benchmark is not in the wheel.  An editable
install would hide a subpackage missing from the wheel; this does not."""
import importlib.util

import harness
from harness.workloads import allreduce_loop


def test_installed_from_the_wheel_not_the_checkout():
    assert "site-packages" in harness.__file__, harness.__file__
    assert importlib.util.find_spec("harness.bench") is None


def test_two_worker_cluster(mwms_cluster):
    assert mwms_cluster.num_workers == 2
    result = mwms_cluster.run(allreduce_loop, args=(5,), timeout=60)
    result.assert_completed()
    assert result.return_values == [2.0, 2.0]
