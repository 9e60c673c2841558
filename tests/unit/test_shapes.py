"""Clusters with a chief and an evaluator, without TensorFlow: the shape
setting, each task's TF_CONFIG, faults keyed by task, and verdicts that
name tasks as TF_CONFIG does."""
import dataclasses

import pytest

from harness import faults
from harness import plan as plan_module
from harness.core import tfconfig
from harness.core.tfconfig import ClusterShape
from harness.diagnosis import diagnose
from harness.diagnosis.configs import config_issues
from harness.errors import FaultError, SettingError
from harness.result import RunResult, WorkerResult
from harness.settings import RunSettings, apply_marker, read_settings
from harness.validators import parse_cluster
from observations import blocked, died, events, returned, run, with_ledger

SHAPE = ClusterShape(chief=1, worker=2, evaluator=1)


# ---------------------------------------------------------------- the setting

@pytest.mark.parametrize("value", ["chief:1,worker:2,evaluator:1", " chief:1 , worker:2, evaluator:1",
                                   {"chief": 1, "worker": 2, "evaluator": 1}, SHAPE])
def test_a_shape_is_typed_as_text_a_mapping_or_a_shape(value):
    assert parse_cluster(value, limit=16) == SHAPE


def test_an_empty_shape_is_workers_only_and_worker_counts_default_to_zero():
    assert parse_cluster("", limit=16) is None and parse_cluster(None, limit=16) is None
    assert parse_cluster({"chief": 1}, limit=16) == ClusterShape(chief=1, worker=0)


@pytest.mark.parametrize("value,words", [
    ("chief:2,worker:1", "2 chiefs; a cluster has at most one chief"),
    ("worker:2,evaluator:2", "2 evaluators"),
    ("evaluator:1", "no training task"),
    ("chief:0,worker:0", "no training task"),
    ("ps:1,worker:2", "ParameterServerStrategy"),
    ("master:1,worker:1", "'master' is TensorFlow 1's name for the chief"),
    ("trainer:1", "task type 'trainer' is not one the harness runs"),
    ("worker=2", "is not TYPE:COUNT"),
    ("worker:two", "is not TYPE:COUNT"),
    ("worker:1,worker:2", "given twice"),
    ({"worker": -1}, "whole number 0 or more"),
    ({"worker": 1.5}, "whole number 0 or more"),
    ("worker:40", "40 tasks; this machine holds 1 to 16"),
    (3, "is not a cluster shape"),
])
def test_a_bad_shape_is_one_setting_error_naming_the_argument(value, words):
    with pytest.raises(SettingError) as e:
        parse_cluster(value, "--mwms-cluster", limit=16)
    assert str(e.value).startswith("--mwms-cluster: ") and words in str(e.value)


def test_the_shape_sets_the_number_of_tasks_and_workers_sets_a_cluster_of_workers():
    s = RunSettings().with_overrides(cluster={"chief": 1, "worker": 2, "evaluator": 1})
    assert (s.workers, s.shape, s.shape.training) == (4, SHAPE, 3)
    assert s.with_overrides(workers=3).shape == ClusterShape(worker=3)
    assert s.with_overrides(cluster="worker:3").cluster is None   # workers only, said either way
    with pytest.raises(SettingError, match="^cluster: "):
        RunSettings().with_overrides(cluster={"chief": 2, "worker": 1})


@pytest.mark.parametrize("place,named", [("command line", "--mwms-cluster"),
                                         ("ini", "ini mwms_cluster"), ("cli", "--cluster")])
def test_the_option_is_read_from_every_place_and_wins_over_workers(place, named):
    def lookup(option, value="chief:1,worker:2"):
        return (value if option.name == "cluster" else "4" if option.name == "workers"
                else option.default), place
    assert read_settings(lookup).shape == ClusterShape(chief=1, worker=2)
    with pytest.raises(SettingError, match=f"^{named}: 2 chiefs"):
        read_settings(lambda o: lookup(o, "chief:2"))


def test_the_marker_sets_a_shape_or_a_cluster_of_workers():
    s = apply_marker(RunSettings(), {"cluster": {"chief": 1, "worker": 1}})
    assert (s.workers, s.shape) == (2, ClusterShape(chief=1, worker=1))
    assert apply_marker(s, {"workers": 3}).shape == ClusterShape(worker=3)
    with pytest.raises(SettingError, match=r"^@pytest.mark.mwms\(cluster=...\): "):
        apply_marker(RunSettings(), {"cluster": {"evaluator": 1}})


# ---------------------------------------------------------------- TF_CONFIG

def test_each_task_gets_the_tf_config_tfjob_gives_it():
    configs = tfconfig.cluster_configs([1, 2, 3, 4], shape=SHAPE)
    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}
    assert configs == [{"cluster": cluster, "task": {"type": t, "index": i}}
                       for t, i in SHAPE.tasks]
    assert SHAPE.tasks == (("chief", 0), ("worker", 0), ("worker", 1), ("evaluator", 0))
    assert [SHAPE.label(i) for i in range(4)] == ["chief", "worker 0", "worker 1", "evaluator"]
    assert SHAPE.index_of(("worker", 1)) == 2 and str(SHAPE) == "chief:1,worker:2,evaluator:1"
    # Workers only: as before, no chief list.
    assert tfconfig.cluster_configs([1, 2], shape=ClusterShape(worker=2)) == \
        tfconfig.cluster_configs([1, 2])


def test_a_bad_tf_config_of_a_training_task_edits_its_place_in_the_chief_and_worker_lists():
    configs = tfconfig.cluster_configs([1, 2, 3], shape=ClusterShape(chief=1, worker=2))
    wrong = tfconfig.apply_bad_config(configs, 0, "wrong_port", 9)
    assert wrong[0]["cluster"] == {"chief": ["127.0.0.1:9"],
                                   "worker": ["127.0.0.1:2", "127.0.0.1:3"]}
    swapped = tfconfig.apply_bad_config(configs, 2, "swapped", 9)
    assert tfconfig.training_list(swapped[2]) == ["127.0.0.1:3", "127.0.0.1:2", "127.0.0.1:1"]
    named = tfconfig.name_worker(configs, 1, "mwms-worker-1")
    assert all(c["cluster"]["worker"][0] == "mwms-worker-1:2" for c in named)
    with pytest.raises(ValueError, match="another 'chief' task"):
        tfconfig.apply_bad_config(configs, 0, "duplicate_index", 9)


def test_config_issues_read_the_chief_list_first_and_find_none_in_a_good_shape():
    configs = tfconfig.cluster_configs([1, 2, 3], shape=ClusterShape(chief=1, worker=2))
    ws = [returned(i, 3, tf_config=c) for i, c in enumerate(configs)]
    assert config_issues(run(*ws)) == ({}, False)
    # The chief's own list names another chief: its list differs from the others'.
    other = dict(configs[0], cluster={**configs[0]["cluster"], "chief": ["127.0.0.1:7"]})
    issues, _ = config_issues(run(returned(0, 3, tf_config=other), *ws[1:]))
    assert list(issues) == [0] and "port 7 instead of 1 for task 0" in issues[0][0]


# ---------------------------------------------------------------- faults

def test_a_fault_is_keyed_by_task_or_by_its_place_among_the_training_tasks():
    by_task = faults.SkipStep(task=["worker", 1], step=4)
    assert repr(by_task) == "SkipStep(task=('worker', 1), step=4)"
    plan = plan_module.validate([by_task, faults.Crash(0, 2), faults.Pause(task=("evaluator", 0), step=1)],
                           4, 0, SHAPE)
    assert [f.worker for f in plan] == [2, 0, 3]
    assert repr(plan[0]) == repr(by_task)   # the worker reports the fault as it prints


@pytest.mark.parametrize("plan,words", [
    ([faults.Crash(3, 1)], "the evaluator is task=('evaluator', 0)"),
    ([faults.SkipStep(task=("chief", 1), step=1)], "no task ('chief', 1)"),
    ([faults.SkipStep(task=("worker", 0), worker=2, step=1)], "give worker= or task=, not both"),
    ([faults.BadTFConfig(task=("evaluator", 0), kind="missing")], "the evaluator is in no"),
])
def test_a_fault_on_a_task_the_cluster_lacks_is_a_fault_error(plan, words):
    with pytest.raises(FaultError, match=words.replace("(", r"\(").replace(")", r"\)")):
        plan_module.validate(plan, 4, 0, SHAPE)


def test_task_takes_the_other_fields_by_keyword():
    with pytest.raises(FaultError, match="give the rest by keyword"):
        faults.SkipStep(4, task=("worker", 1))


# ---------------------------------------------------------------- verdicts

def _shaped(obs, shape=SHAPE):
    return dataclasses.replace(obs, tasks=shape.tasks)


def _skip_on_worker_1(evaluator):
    """Worker 1 (index 2) skipped step 4 and returned; the chief and worker
    0 wait in their last call; the evaluator as given."""
    waiting = [with_ledger(blocked(i, 3), blocked=True) for i in (0, 1)]
    skipper = with_ledger(returned(2, 3), {s: (0 if s == 4 else 1) for s in range(10)})
    return _shaped(run(*waiting, skipper, evaluator, ended_by="hang"))


@pytest.mark.parametrize("evaluator", [
    returned(3, 4, steps=[]),
    blocked(3, 4, steps=[], events=events([], 4, creating_only=True)),
    died(3, 4, 1, 5.0, steps=[]),
])
def test_a_skipped_step_in_training_is_the_worker_s_whatever_the_evaluator_did(evaluator):
    v = diagnose(_skip_on_worker_1(evaluator))
    assert (v.outcome, v.culprits) == ("hang", (2,))
    assert "culprit: worker 1" in v.text and "chief: " not in v.text.split("\n")[0]
    assert "evaluator (outside the collectives): " in v.text


def test_a_crash_of_the_evaluator_alone_is_the_evaluator_s_and_training_completed():
    ws = [returned(i, 4) for i in range(3)] + [died(3, 4, -9, 1.0, steps=[])]
    v = diagnose(_shaped(run(*ws)))
    assert (v.outcome, v.culprits, v.ambiguous) == ("crashed", (3,), False)
    assert v.text.startswith("CRASHED: the evaluator died; the training tasks "
                             "(chief, worker 0, worker 1) completed")
    # A hung evaluator, training done: the hang is the evaluator's.
    hung = diagnose(_shaped(run(*ws[:3], blocked(3, 4, steps=[]), ended_by="hang")))
    assert (hung.outcome, hung.culprits) == ("hang", (3,))
    done = diagnose(_shaped(run(*ws[:3], returned(3, 4, steps=[]))))
    assert done.outcome == "completed" and done.text.startswith("COMPLETED: all 4 tasks")


def test_results_name_tasks_as_tf_config_does():
    obs = _skip_on_worker_1(returned(3, 4, steps=[]))
    v = diagnose(obs)
    result = RunResult(tuple(WorkerResult(i) for i in range(4)), 1.0, obs, v)
    assert result.culprit_tasks == (("worker", 1),)
    assert list(result.tasks) == list(SHAPE.tasks)
    assert result.tasks[("worker", 1)] is result.workers[2]
    plain = run(returned(0, 2), returned(1, 2))
    two = RunResult((WorkerResult(0), WorkerResult(1)), 1.0, plain, diagnose(plain))
    assert list(two.tasks) == [("worker", 0), ("worker", 1)] and two.culprit_tasks == ()


def test_run_takes_a_shape_of_its_own_checked_before_any_process_starts():
    from harness.controller.request import make_request
    request = make_request(RunSettings(), "forkserver", print, cluster={"chief": 1, "worker": 1},
                           faults=[faults.SkipStep(task=("chief", 0), step=1)])
    assert request.settings.shape == ClusterShape(chief=1, worker=1) and request.plan[0].worker == 0
    with pytest.raises(SettingError, match=r"^run\(cluster=...\): 2 evaluators"):
        make_request(RunSettings(), "forkserver", print, cluster="worker:1,evaluator:2")
