"""A sample of the corpus of users' bugs on real workers, one case of each
family at its smallest cluster: the broken job does not complete and its
verdict is right or says it cannot tell with the truth among the
candidates; the fixed twin completes.  The whole corpus is the benchmark's
(``python -m harness.bench.corpus``, docs/accuracy.md)."""
import pytest

from harness.bench.corpus import ERRORS, Answer, cases
from harness.bench.corpus.run import cluster_for, run_one
from harness.core import versions

# One case per family; the benchmark runs them all.
SAMPLE = ("fit_uneven_batch_per_worker",)
BY_NAME = {c.name: c for c in cases()}


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
