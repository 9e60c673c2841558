"""A test file written as TensorFlow's own multi-worker tests are, with the
runner and the test base imported from ``harness.compat`` in place of
TensorFlow's, and no conftest.  ``tests/test_compat.py`` runs it under
pytest with pytest's options on the command line: TensorFlow's
``combinations`` read an absl flag in the test process, which parses
``sys.argv`` unless the flags are parsed already."""
import json
import os

from absl.testing import parameterized
import tensorflow as tf
from tensorflow.python.distribute import combinations

from harness.compat import multi_process_runner
from harness.compat import multi_worker_test_base as test_base

NUM_WORKERS = 2


def _index():
    return json.loads(os.environ["TF_CONFIG"])["task"]["index"]


class ImportCase(tf.test.TestCase, parameterized.TestCase):

    @combinations.generate(combinations.combine(mode=["eager"]))
    def test_all_reduce_after_the_barrier(self, mode):
        def worker_fn():
            strategy = tf.distribute.MultiWorkerMirroredStrategy()
            multi_process_runner.get_barrier().wait()
            value = strategy.run(lambda: tf.constant(float(_index())))
            return float(strategy.reduce("SUM", value, axis=None))

        result = multi_process_runner.run(
            worker_fn, cluster_spec=test_base.create_cluster_spec(num_workers=NUM_WORKERS))
        self.assertEqual(result.return_value, [1.0] * NUM_WORKERS)

    @combinations.generate(combinations.combine(mode=["eager", "graph"]))
    def test_cluster_spec_in_each_mode(self, mode):
        self.assertEqual(tf.executing_eagerly(), mode == "eager")
        spec = test_base.create_cluster_spec(num_workers=3)
        self.assertEqual(len(spec["worker"]), 3)

    def test_deselected_by_k(self):
        self.fail("the run's -k deselects this test")
