"""A test file written as tf-keras's parameter-server tests are: the test
process is the coordinator of a ``MultiProcessCluster`` whose workers and
parameter server it connects to at the spec's addresses.
``tests/test_compat.py`` runs it under pytest, with a conftest that only
calls ``harness.compat.install()``."""
import gc

import tensorflow as tf
from tensorflow.python.distribute import multi_worker_test_base


class ParameterServerClusterCase(tf.test.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.cluster = multi_worker_test_base.create_multi_process_cluster(
            num_workers=2, num_ps=1, rpc_layer="grpc")
        cls.resolver = cls.cluster.cluster_resolver

    @classmethod
    def tearDownClass(cls):
        # The test's coordinator is collected while its servers still serve:
        # collected later, TensorFlow 2.15's executors raise AbortedError from
        # __del__, wherever the collection falls (inside an import's parse,
        # CPython 3.11.7 then fails that import with "AST constructor
        # recursion depth mismatch").
        gc.collect()
        cls.cluster.stop()
        super().tearDownClass()

    def test_functions_run_on_the_workers_and_a_killed_one_comes_back(self):
        strategy = tf.distribute.experimental.ParameterServerStrategy(self.resolver)
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        with strategy.scope():
            counter = tf.Variable(0, dtype=tf.int64)

        @tf.function
        def step():
            counter.assign_add(1)
            return tf.constant(1, dtype=tf.int64)

        results = [coordinator.schedule(step) for _ in range(10)]
        coordinator.join()
        self.assertEqual(sum(int(r.fetch()) for r in results), 10)
        self.assertGreaterEqual(int(counter.numpy()), 10)
        self.cluster.kill_task("worker", 0)
        self.cluster.start_task("worker", 0)
        results = [coordinator.schedule(step) for _ in range(10)]
        coordinator.join()
        self.assertEqual(sum(int(r.fetch()) for r in results), 10)
