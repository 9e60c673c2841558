"""A sample of the corpus of users' bugs on real workers, one case of each
family at its smallest cluster: the broken job does not complete and its
verdict is right or says it cannot tell with the truth among the
candidates; the fixed twin completes.  The whole corpus is the benchmark's
(``python -m harness.bench.corpus``, docs/accuracy.md)."""
import pytest

from harness.bench.corpus import ERRORS, FAMILIES, Answer, cases
from harness.bench.corpus.run import cluster_for, run_one
from harness.core import versions

# One case per family; the benchmark runs them all.
SAMPLE = ("fit_uneven_batch_per_worker", "keras3_fit_under_mwms", "callback_stops_on_chief_only",
          "loop_chief_only_reduce_for_logging", "data_steps_from_local_cardinality",
          "restore_from_own_write_dir")
BY_NAME = {c.name: c for c in cases()}


def test_the_sample_holds_a_case_of_every_family():
    assert sorted(BY_NAME[n].family for n in SAMPLE) == sorted(FAMILIES)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", SAMPLE)
def test_a_users_bug_is_told_and_its_fix_completes(name):
    case = BY_NAME[name]
    size = min(case.sizes)
    cluster = cluster_for(case, size)
    minor = versions.installed_minor()
    broken = run_one(cluster, case, size, "broken", minor)
    assert Answer(broken["answer"]) not in ERRORS, broken.get("report")
    assert broken["answer"] in (Answer.NAMED.value, Answer.CANNOT_TELL.value)
    fixed = run_one(cluster, case, size, "fixed", minor)
    assert fixed["answer"] == Answer.TWIN_COMPLETED.value, fixed.get("report")


@pytest.mark.timeout(120)
def test_workers_whose_datasets_differ_in_length_are_told_so(tmp_path):
    """The uneven batch through tf_keras's fit (TensorFlow 2.21): each worker
    reports the length of the dataset fit distributes, 8 batches on worker 0
    and 16 on worker 1, and the report says so beside its verdict."""
    case = BY_NAME["fit_uneven_batch_per_worker"]
    cluster = cluster_for(case, 2)
    env = versions.keras2_env(versions.installed_minor())
    result = cluster.run(case.broken, args=(str(tmp_path),), env=env, timeout=case.timeout,
                         grace=case.grace)
    assert result.outcome != "completed"
    assert ("data: the workers distributed datasets of different lengths (worker 0: 8 "
            "elements; worker 1: 16 elements)") in result.diagnosis, result.diagnosis
    fixed = cluster.run(case.fixed, args=(str(tmp_path),), env=env, timeout=case.timeout)
    fixed.assert_completed()
