"""A test file written as TensorFlow's own distribute tests are: its
combinations start the tasks, through ``combinations``' and
``strategy_combinations``' bound references to TensorFlow's runner.
``tests/test_compat.py`` runs it under pytest, with a conftest that only
calls ``harness.compat.install()`` and pytest's options on the command line."""
import json
import os

from absl.testing import parameterized
import tensorflow as tf
from tensorflow.python.distribute import combinations
from tensorflow.python.distribute import strategy_combinations as presets

two_workers = combinations.NamedDistribution(
    "TwoWorkers", presets._get_multi_worker_mirrored_creator(required_gpus=0),
    has_chief=False, num_workers=2)


class CombinationsCase(tf.test.TestCase, parameterized.TestCase):

    @combinations.generate(combinations.combine(
        strategy=[two_workers, presets.multi_worker_mirrored_2x1_cpu,
                  presets.multi_worker_mirrored_2x1_gpu,
                  presets.parameter_server_strategy_1worker_2ps_cpu],
        mode=["eager"]))
    def test_sum(self, strategy):
        total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
        # Two replicas of MultiWorkerMirroredStrategy; one of a parameter-server
        # preset, whose chief alone runs the test past the strategy's creation
        # (its workers and parameter servers serve there until it ends).
        self.assertEqual(float(total), float(strategy.num_replicas_in_sync))
        self.assertEqual(strategy.num_replicas_in_sync,
                         1 if "ps" in json.loads(os.environ["TF_CONFIG"])["cluster"] else 2)
        # Each task is a process of its own, with the TF_CONFIG the preset asks for.
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        self.assertFalse(combinations.in_main_process())
        self.assertIn(task["type"], ("chief", "worker"))
