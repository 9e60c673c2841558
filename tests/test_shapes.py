"""A chief, workers and an evaluator, as Kubeflow's TFJob deploys them, on
real TensorFlow workers: the seed's loop completes, a skipped step is the
worker's that skipped it (never the chief's), and an evaluator's crash is
the evaluator's while training completes."""
import json
import os
import time

import pytest

import harness
from harness.faults import SkipStep
from harness.workloads import seed_training_loop

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leftover_workers"),
              pytest.mark.mwms(cluster={"chief": 1, "worker": 2, "evaluator": 1}, timeout=20)]

TRAINING = (("chief", 0), ("worker", 0), ("worker", 1))


def job(skip=None, evaluator_exits=None):
    """The seed's loop on the chief and the workers; the evaluator waits a
    moment (it would read the checkpoints) and returns, or exits with
    ``evaluator_exits``.  ``skip``: ``(type, index, step)`` whose loop
    leaves that step out, as a user's ``continue`` would."""
    ctx = harness.context()
    seen = (ctx.task_type, ctx.task_index, json.loads(os.environ["TF_CONFIG"]))
    if ctx.task_type == "evaluator":
        time.sleep(0.3)
        if evaluator_exits is not None:
            os._exit(evaluator_exits)
        return seen

    def steps(n):
        for k in ctx.steps(n):
            if skip is None or (ctx.task_type, ctx.task_index, k) != skip:
                yield k

    return seen, seed_training_loop(epochs=1, steps_per_epoch=10, steps=steps)


def test_the_seed_loop_completes_on_a_chief_two_workers_and_an_evaluator(mwms_cluster):
    result = mwms_cluster.run(job).assert_completed()
    assert list(result.tasks) == [*TRAINING, ("evaluator", 0)]
    cluster = result.tasks[("chief", 0)].return_value[0][2]["cluster"]
    assert sorted(cluster) == ["chief", "worker"] and len(cluster["worker"]) == 2
    for task, worker in result.tasks.items():
        seen = worker.return_value if task[0] == "evaluator" else worker.return_value[0]
        assert (seen[0], seen[1]) == task and seen[2]["cluster"] == cluster
    losses = [result.tasks[t].return_value[1] for t in TRAINING]
    assert len(losses[0]) == 10 and losses[0] == losses[1] == losses[2]
    assert result.diagnosis.startswith("COMPLETED: all 4 tasks returned")


@pytest.mark.parametrize("how", ["fault", "user code"])
def test_a_step_skipped_by_worker_1_is_worker_1_s_never_the_chief_s(mwms_cluster, how):
    if how == "fault":
        result = mwms_cluster.run(job, faults=[SkipStep(task=("worker", 1), step=4)])
    else:
        result = mwms_cluster.run(job, kwargs={"skip": ("worker", 1, 4)})
    result.assert_hang()
    assert result.culprit_tasks == (("worker", 1),) and not result.ambiguous
    assert "culprit: worker 1" in result.diagnosis.splitlines()[0]


def test_an_evaluator_that_crashes_is_blamed_and_training_completes(mwms_cluster):
    result = mwms_cluster.run(job, kwargs={"evaluator_exits": 3})
    assert (result.outcome, result.culprit_tasks) == ("crashed", (("evaluator", 0),))
    assert result.diagnosis.startswith("CRASHED: the evaluator died; the training tasks")
    assert all(len(result.tasks[t].return_value[1]) == 10 for t in TRAINING)
