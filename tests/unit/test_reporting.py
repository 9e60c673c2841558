"""What pytest shows of a test's runs, without TensorFlow: JUnit
properties, report sections, the session summary."""
import pytest

from harness.report import pytest_report as reporting
from harness.diagnosis import diagnose
from harness.result import RunResult, WorkerResult
from observations import blocked, died, returned, run

pytestmark = pytest.mark.timeout(30)


def _result(obs, logs=None):
    v = diagnose(obs)
    workers = tuple(WorkerResult(index=w.index, exit_code=w.exit_code, observation=w,
                                 log=(logs or {}).get(w.index, ""), stack=w.stack)
                    for w in obs.workers)
    return RunResult(workers=workers, duration=obs.duration, observation=obs, verdict=v)


OK = _result(run(returned(0, 2), returned(1, 2)))
CRASH = _result(run(returned(0, 2), died(1, 2, -9, 3.0)), logs={1: "line 1\nline 2"})
STUCK = _result(run(blocked(0, 2, steps=range(5)), blocked(1, 2, steps=range(5)),
                    ended_by="hang"))


def test_junit_properties_are_the_last_runs_verdict():
    props = dict(reporting.junit_properties([OK, CRASH]))
    assert props == {"mwms_outcome": "crashed", "mwms_culprits": "1", "mwms_step": "3",
                     "mwms_ambiguous": "false", "mwms_rule": "crash", "mwms_duration": "21.00",
                     "mwms_workers": "2", "mwms_runs": "2"}
    assert dict(reporting.junit_properties([STUCK]))["mwms_ambiguous"] == "true"
    assert dict(reporting.junit_properties([STUCK]))["mwms_culprits"] == "0,1"


def test_sections_for_what_did_not_complete():
    sections = dict(reporting.report_sections([OK, CRASH], {2: ("/r/x.trace.json", "/r/x.svg")}))
    assert list(sections) == ["mwms run 2: crashed",
                              "mwms run 2: worker 1 log tail (exit code -9)"]
    assert sections["mwms run 2: crashed"].startswith("CRASHED: worker 1 died")
    assert sections["mwms run 2: crashed"].endswith("timeline: /r/x.trace.json\ntimeline: /r/x.svg")
    assert sections["mwms run 2: worker 1 log tail (exit code -9)"] == "line 1\nline 2"
    # the failure already opens with the last run's diagnosis: only the files remain
    failed = dict(reporting.report_sections([CRASH], {1: ("/r/x.svg",)}, test_failed=True))
    assert failed["mwms run: crashed"] == "timeline: /r/x.svg"
    assert reporting.report_sections([CRASH], {}, test_failed=True)[0][0] == \
        "mwms run: worker 1 log tail (exit code -9)"
    stuck = dict(reporting.report_sections([STUCK], {}))
    assert "mwms run: worker 0 stack" in stuck and "quick_execute" in stuck["mwms run: worker 0 stack"]


def test_which_runs_get_a_timeline_and_where():
    assert not reporting.wants_timeline(OK, "failed") and reporting.wants_timeline(OK, "all")
    assert reporting.wants_timeline(CRASH, "failed")
    stem = reporting.timeline_stem("/r", "tests/test_a.py::test_b[x-1]", 2)
    assert stem == "/r/tests_test_a.py_test_b_x-1-run2"


def test_the_session_summary():
    runs = [reporting.run_summary(r, f"t::{i}") for i, r in enumerate([OK, CRASH, STUCK])]
    lines = reporting.summary_lines(runs, "/r")
    assert lines[0] == "3 cluster runs: 1 completed, 0 failed, 1 crashed, 1 hang"
    assert lines[1] == ("of the 2 that did not complete: 1 named exactly one culprit, "
                        "1 could not tell (named every candidate)")
    assert lines[2].startswith("slowest: 21.0s t::0 (completed)")
    assert lines[3] == "timelines in /r"
    assert reporting.summary_lines([]) == []


def test_where_each_files_time_went_with_durations():
    phases = [{"launch": 0.1, "start": 0.2, "strategy": 0.7, "steps": 2.0, "wait: finish": 0.1,
               "teardown": 0.1},
              {"launch": 0.1, "steps": 1.0, "wait: hang timeout": 5.0, "stacks": 0.5,
               "teardown": 0.4}]
    runs = [{"nodeid": "s/test_a.py::one", "outcome": "completed", "culprits": [],
             "ambiguous": False, "duration": 3.2, "phases": phases[0]},
            {"nodeid": "s/test_a.py::two", "outcome": "hang", "culprits": [1],
             "ambiguous": False, "duration": 7.0, "attempts": 2, "phases": phases[1]}]
    lines = reporting.summary_lines(runs, test_seconds={"s/test_a.py": 12.0, "s/test_b.py": 1.0})
    table = lines[lines.index("where the time went, by file (seconds; --durations):") + 1:]
    assert table[0].split() == ["file", "tests", "s", "runs", "restarts", "start-up", "steps",
                                "TF", "detects", "harness", "waits", "finish", "end",
                                "outside", "runs"]
    # start-up 0.1+0.2+0.7+0.1, steps 3.0, harness waits 5.0, end 0.1+0.5+0.4; the rest of
    # the 12 s was the tests' own.
    assert table[1].split() == ["s/test_a.py", "12.0", "2", "1", "1.1", "3.0", "0.0", "5.0",
                                "0.1", "1.0", "1.8"]
    assert table[2].split() == ["s/test_b.py", "1.0", "0", "0"] + ["0.0"] * 6 + ["1.0"]
    assert not any("where the time went" in line for line in reporting.summary_lines(runs))
