"""The diagnosis's accuracy table (``python -m harness.bench.accuracy``),
with no TensorFlow and no cluster: docs/accuracy.md's table is what the
generator makes of docs/accuracy.json, that JSON has no wrong answer and
no "cannot tell" without the truth, and every fault kind is in it or left
out with its reason.  The generator itself is checked on a hand-made list."""
import json
import sys
from pathlib import Path

import pytest

from harness import faults as F
from harness.bench import accuracy

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "accuracy.md"
RESULTS = ROOT / "docs" / "accuracy.json"

pytestmark = pytest.mark.timeout(60)


def _doc() -> dict:
    return json.loads(RESULTS.read_text(encoding="utf-8"))


def _row(label="SkipStep", attribution="named", worker=1, culprits=(1,), ambiguous=False,
         workers=3, workload="variable_loop", outcome="hang"):
    return {"kind": label.split("(")[0], "label": label, "fault": f"{label}({worker})",
            "worker": worker, "step": 2, "workers": workers, "workload": workload,
            "outcome": outcome, "culprits": list(culprits), "ambiguous": ambiguous,
            "attribution": attribution, "rule": "", "error": None, "seconds": 1.0,
            "tensorflow": "2.21.0"}


# ------------------------------------------------------------------ the generator

def test_the_table_counts_each_answer_per_kind_and_in_all():
    rows = [_row(), _row(), _row(attribution="cannot tell", culprits=(0, 1), ambiguous=True),
            _row("Delay(seconds=0.5)", "survived", culprits=(), outcome="completed"),
            _row("Crash(how='exit')", "wrong", culprits=(0,), outcome="crashed"),
            _row("Crash(how='exit')", "never acted", culprits=(), outcome="failed")]
    lines = accuracy.table(rows).splitlines()
    assert lines[0].startswith("| fault | runs | named exactly | cannot tell")
    # Rows in the bench's order of kinds (SkipStep, then Crash, then Delay), the total last.
    assert lines[2:] == [
        "| `SkipStep` | 3 | 2 | 1 | 0 | 0 | 0 | 67 % | – |",
        "| `Crash(how='exit')` | 2 | 0 | 0 | 1 | 0 | 1 | 0 % | – |",
        "| `Delay(seconds=0.5)` | 1 | 0 | 0 | 0 | 1 | 0 | – | – |",
        "| **all** | 6 | 2 | 1 | 1 | 1 | 1 | 50 % | – |",
    ]


def _slowed(label, worker, slowed, outcome="completed"):
    return {**_row(label, "survived", worker=worker, culprits=(), outcome=outcome),
            "slowed": list(slowed)}


def test_the_straggler_column_scores_the_slowed_runs_that_completed():
    rows = [_slowed("Delay(seconds=0.5)", 1, [1]), _slowed("Delay(seconds=0.5)", 2, [2]),
            _slowed("Delay(seconds=0.5)", 2, []), _slowed("Latency(ms=50)", 0, [1]),
            _slowed("Latency(ms=50)", 0, [0, 1]),
            # Not scored: a run that did not complete, a kind that does not slow.
            {**_row("Latency(ms=50)", "cannot tell", worker=0, culprits=(0, 1), ambiguous=True)},
            _slowed("Preempt", 1, [0])]
    assert [accuracy.straggler_answer(r) for r in rows] == [
        "named", "named", "none", "wrong", "wrong", None, None]
    lines = accuracy.table(rows).splitlines()
    assert lines[0].endswith("| straggler named, of the slowed runs that completed |")
    assert lines[2].startswith("| `Preempt` |") and lines[2].endswith("| – |")
    assert lines[3].startswith("| `Delay(seconds=0.5)` |") and lines[3].endswith("| 2 of 3 |")
    assert lines[4].endswith("| 0 of 2, 2 wrong |")
    assert lines[5].startswith("| **all** |") and lines[5].endswith("| 2 of 5, 2 wrong |")
    doc = {"command": "c", "date": "d", "wall_seconds": 1.0, "settings": {"timeout": 3.0,
           "grace": 1.0}, "machine": {"cores": 2, "python": "3", "tensorflow": "2"},
           "left_out": {}, "runs": rows}
    region = accuracy.markdown(doc)
    assert "- `Delay(seconds=0.5)(2)`, `variable_loop`, 3 workers: named none" in region
    assert "- `Latency(ms=50)(0)`, `variable_loop`, 3 workers: named 0, 1" in region


def test_the_size_table_and_the_page_region_come_from_the_document_alone():
    rows = [_row(workers=2), _row(workers=2, workload="seed_training_loop"),
            _row(workers=4, attribution="cannot tell", culprits=(0, 1, 2, 3), ambiguous=True)]
    assert accuracy.size_table(rows).splitlines()[2:] == [
        "| `variable_loop`, 2 | 1 | 1 | 0 | 0 | 0 | 0 | 100 % | – |",
        "| `variable_loop`, 4 | 1 | 0 | 1 | 0 | 0 | 0 | 0 % | – |",
        "| `seed_training_loop`, 2 | 1 | 1 | 0 | 0 | 0 | 0 | 100 % | – |",
    ]
    doc = {"command": "python -m harness.bench.accuracy", "date": "2026-12-03",
           "wall_seconds": 125.4, "settings": {"timeout": 3.0, "grace": 1.0},
           "machine": {"cores": 2, "python": "3.11.7", "tensorflow": "2.21.0",
                       "load_avg": [1.5, 1, 1], "load_avg_end": [2.3, 2, 2]},
           "left_out": {"Partition(seconds=None)": "no namespaces here"}, "runs": rows}
    region = accuracy.markdown(doc)
    assert region.startswith("Made by `python -m harness.bench.accuracy` on 2026-12-03: "
                             "3 runs in 2 min 05 s on 2 cores (1-min load 1.5 at the start, "
                             "2.3 at the end), the workers on CPU")
    assert accuracy.table(rows) in region and accuracy.size_table(rows) in region
    assert "- `Partition(seconds=None)`: no namespaces here" in region
    assert ("- `SkipStep`, `variable_loop`, 4 workers: 1 run, 4 of 4 workers named as "
            "candidates") in region
    assert json.loads(accuracy.dump(doc)) == doc


def test_the_region_is_written_between_the_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\n{accuracy.START}\nold\n{accuracy.END}\n\nafter\n")
    assert accuracy.write_region(str(page), "new\ntable")
    assert page.read_text() == f"# Title\n\n{accuracy.START}\nnew\ntable\n{accuracy.END}\n\nafter\n"
    assert accuracy.region_of(page.read_text()) == "new\ntable"
    assert not accuracy.write_region(str(page), "new\ntable")


def test_the_plan_takes_the_first_a_middle_and_the_last_worker_and_step():
    assert accuracy.positions(2) == (0, 1)
    assert accuracy.positions(3) == (0, 1, 2)
    assert accuracy.positions(4) == (0, 1, 3)
    assert accuracy.positions(6) == (0, 2, 5)
    skip = next(k for k in accuracy.KINDS if k.label == "SkipStep")
    missing = next(k for k in accuracy.KINDS if k.label == "BadTFConfig(kind='missing')")
    job = accuracy.WORKLOADS[0]
    planned = accuracy.plan([2, 3], [job], [skip, missing])
    assert [p.fault for p in planned if p.workers == 2] == [
        F.SkipStep(w, s) for w in (0, 1) for s in (0, 2, 5)] + [
        F.BadTFConfig(0, "missing"), F.BadTFConfig(1, "missing")]
    assert len([p for p in planned if p.workers == 3]) == 9 + 3
    quick = accuracy.plan([4], [job], [skip, missing], quick=True)
    assert [p.fault for p in quick] == [F.SkipStep(3, 2), F.BadTFConfig(3, "missing")]
    for p in accuracy.plan([2, 3, 4], accuracy.WORKLOADS, accuracy.KINDS):
        p.fault.check(p.workers)          # every planned fault is valid for its cluster


def test_the_bench_has_a_row_for_every_fault_kind():
    covered = {k.cls.__name__ for k in accuracy.KINDS}
    assert covered | set(accuracy.NOT_IN_BENCH) == {c.__name__ for c in F.FAULT_TYPES}
    labels = [k.label for k in accuracy.KINDS]
    assert all(f"Crash(how={h!r})" in labels for h in F.CRASH_HOW)
    assert all(f"BadTFConfig(kind={k!r})" in labels for k in F.BAD_CONFIG_KINDS)
    assert len(set(labels)) == len(labels)


# ------------------------------------------------------------------ the published figures

def test_the_page_s_table_is_what_the_generator_makes_of_its_json():
    assert accuracy.region_of(PAGE.read_text(encoding="utf-8")) == accuracy.markdown(_doc()), (
        "docs/accuracy.md's table is stale: run  python -m harness.bench.accuracy --redraw  "
        "(a change to the table's code) or  ... --write-docs  (the figures)")


def test_every_fault_of_the_published_run_acted():
    bad = [(r["fault"], r["workers"], r["workload"]) for r in _doc()["runs"]
           if r["attribution"] == "never acted"]
    assert not bad, f"faults that never acted (an error of the bench's plan): {bad}"


# A wrong answer is the diagnosis's to fix (docs/accuracy.md, "Wrong
# answers"), then the benchmark is run again: never an expected failure here.
def test_the_published_run_has_no_wrong_answer():
    bad = [(r["fault"], r["workers"], r["workload"], r["culprits"]) for r in _doc()["runs"]
           if r["attribution"] == "wrong"]
    assert not bad, bad


def test_no_published_straggler_report_names_a_worker_that_was_not_slowed():
    bad = [(r["fault"], r["workers"], r["workload"], r["slowed"]) for r in _doc()["runs"]
           if accuracy.straggler_answer(r) == "wrong"]
    assert not bad, bad


def test_every_cannot_tell_names_the_truth_among_its_candidates():
    for r in _doc()["runs"]:
        if r["attribution"] == "cannot tell":
            assert r["ambiguous"] and r["worker"] in r["culprits"], r
        elif r["attribution"] == "named":
            assert not r["ambiguous"] and r["culprits"] == [r["worker"]], r
        elif r["attribution"] == "survived":
            assert r["outcome"] == "completed" and r["culprits"] == [], r
        else:   # wrong: no culprit, or one the fault did not act in, or candidates without it
            assert r["outcome"] != "completed" and (
                not r["culprits"] or r["worker"] not in r["culprits"]
                or (not r["ambiguous"] and len(r["culprits"]) > 1)), r


def test_the_published_run_is_the_full_bench():
    doc = _doc()
    assert doc["command"] == "python -m harness.bench.accuracy"
    assert not doc["settings"]["quick"]
    runs = doc["runs"]
    ran = {r["label"] for r in runs}
    for kind in accuracy.KINDS:
        assert kind.label in ran or doc["left_out"].get(kind.label), (
            f"{kind.label} has no run in docs/accuracy.json and no reason it was left out")
    assert {r["workers"] for r in runs} == set(accuracy.ALL_WORKERS)
    assert {r["workload"] for r in runs} == {w.name for w in accuracy.WORKLOADS}
    planned = accuracy.plan(accuracy.ALL_WORKERS, accuracy.WORKLOADS,
                            [k for k in accuracy.KINDS if k.label not in doc["left_out"]])
    assert sorted((r["workers"], r["workload"], r["fault"]) for r in runs) == sorted(
        (p.workers, p.workload.name, repr(p.fault)) for p in planned)


def test_the_table_needs_no_tensorflow():
    """The stale check runs in the suite's TensorFlow-free part: making the
    table imports no TensorFlow (checked in a fresh interpreter)."""
    import subprocess
    code = ("import sys, harness.bench.accuracy as a, json; "
            "a.markdown(json.load(open(sys.argv[1]))); "
            "assert not [m for m in sys.modules if m.startswith('tensorflow')]")
    subprocess.run([sys.executable, "-c", code, str(RESULTS)], cwd=ROOT, check=True)
