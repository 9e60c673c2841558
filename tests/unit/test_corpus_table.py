"""The corpus of users' bugs (``python -m harness.bench.corpus``), with no
TensorFlow and no cluster: the judge on every kind of verdict, the cases as
declared, and docs/accuracy.md's corpus section as the generator makes it
from docs/corpus.json, which holds every case and no error."""
import json
from pathlib import Path

import pytest

from harness.bench.common import region_of
from harness.bench.corpus import (ERRORS, FAMILIES, Answer, Case, Truth, at_fault, cases, judge,
                                  no_single)
from harness.bench.corpus import table

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "corpus.json"

pytestmark = pytest.mark.timeout(60)


def _doc() -> dict:
    return json.loads(RESULTS.read_text(encoding="utf-8"))


# ------------------------------------------------------------------ the judge

@pytest.mark.parametrize("completed, culprits, ambiguous, truth, answer", [
    (False, (1,), False, at_fault(1), Answer.NAMED),
    (False, (0,), False, at_fault(1), Answer.WRONG),          # the healthy task named
    (False, (0, 1), False, at_fault(1), Answer.WRONG),        # more than the truth, sure of it
    (False, (0, 1), True, at_fault(1), Answer.CANNOT_TELL),
    (False, (0, 2), True, at_fault(1), Answer.WRONG),         # candidates without the truth
    (False, (), False, at_fault(1), Answer.WRONG),
    (True, (), False, at_fault(1), Answer.DID_NOT_BREAK),
    (False, (0,), False, no_single((0, 1)), Answer.WRONG),    # one of several, alone
    (False, (0, 1), False, no_single((0, 1)), Answer.NAMED),
    (False, (0, 1), True, no_single((0, 1)), Answer.CANNOT_TELL),
])
def test_a_broken_run_is_judged_against_the_truth(completed, culprits, ambiguous, truth, answer):
    assert judge("broken", completed, culprits, ambiguous, truth) is answer


def test_a_fixed_twin_is_right_only_when_it_completed():
    assert judge("fixed", True, (), False, at_fault(0)) is Answer.TWIN_COMPLETED
    assert judge("fixed", False, (0,), False, at_fault(0)) is Answer.TWIN_FAILED


def test_a_truth_and_a_case_refuse_what_cannot_be():
    with pytest.raises(ValueError):
        Truth(frozenset())
    with pytest.raises(ValueError):
        Truth(frozenset({0, 1}), single=True)
    job = lambda directory: None  # noqa: E731
    with pytest.raises(ValueError, match="family"):
        Case("x", "not a family", "s", "x", job, job, at_fault(0))
    with pytest.raises(ValueError, match="sizes"):
        Case("x", FAMILIES[0], "s", "x", job, job, at_fault(0), sizes=(1,))
    with pytest.raises(ValueError, match="outside"):
        Case("x", FAMILIES[0], "s", "x", job, job, at_fault(2), sizes=(2,)).truth_at(2)


# ------------------------------------------------------------------ the cases

def test_the_corpus_covers_what_users_write():
    every = cases()
    assert len(every) >= 30, len(every)
    assert {c.family for c in every} == set(FAMILIES)
    sizes = {n for c in every for n in c.sizes}
    assert {2, 3, 4} <= sizes
    assert sum(c.chief for c in every) >= 3
    for c in every:
        assert c.source.strip() and c.summary.strip(), c.name
        assert c.broken is not c.fixed, c.name
        for n in c.sizes:
            c.truth_at(n)


# ------------------------------------------------------------------ the page

def _row(case="a", family=FAMILIES[0], variant="broken", answer="named", workers=2, chief=False,
         culprits=(1,), truth="task 1"):
    return {"case": case, "family": family, "variant": variant, "answer": answer,
            "workers": workers, "chief": chief, "culprits": list(culprits), "truth": truth,
            "outcome": "completed" if variant == "fixed" else "hang"}


def test_the_tables_count_each_answer_by_family_and_by_cluster():
    rows = [_row(), _row(variant="fixed", answer="twin completed"),
            _row(case="b", answer="cannot tell", culprits=(0, 1), workers=3, chief=True),
            _row(case="b", variant="fixed", answer="twin did not complete", workers=3,
                 chief=True),
            _row(case="c", family="tf.data", answer="did not break")]
    assert table.family_table(rows).splitlines()[2:] == [
        "| fit (tf_keras) | 2 | 2 | 1 | 1 | 0 | 0 | 1 | 50 % |",
        "| tf.data | 1 | 1 | 0 | 0 | 0 | 1 | 0 | – |",
        "| **all** | 3 | 3 | 1 | 1 | 0 | 1 | 1 | 50 % |"]
    assert table.size_table(rows).splitlines()[2:] == [
        "| 2 | 2 | 2 | 1 | 0 | 0 | 1 | 0 | 100 % |",
        "| 3, a chief | 1 | 1 | 0 | 1 | 0 | 0 | 1 | 0 % |"]


def test_the_page_section_is_what_the_generator_makes_of_the_json():
    page = (ROOT / "docs" / "accuracy.md").read_text(encoding="utf-8")
    assert region_of(page, table.START, table.END) == table.markdown(_doc())


def test_the_published_corpus_holds_every_case_and_no_error():
    doc = _doc()
    runs = doc["runs"]
    assert {c["name"] for c in doc["cases"]} == {c.name for c in cases()}
    for c in cases():
        ran = {(r["workers"], r["variant"]) for r in runs if r["case"] == c.name}
        assert ran == {(n, v) for n in c.sizes for v in ("broken", "fixed")}, c.name
    assert [r for r in runs if Answer(r["answer"]) in ERRORS] == []
    for r in runs:
        if r["answer"] == Answer.CANNOT_TELL.value:
            assert set(r["culprits"]) & set(r["truth_tasks"]), r
