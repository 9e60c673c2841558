"""The timeline of a real hang (the drawing itself: tests/unit/test_timeline.py)."""
import json
import os
from pathlib import Path

import pytest

from harness.faults import SkipStep
from harness.workloads import variable_loop

from unit.test_timeline import SVG, svg_tree


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_workers")
def test_a_real_hang_draws_its_culprit_and_its_blocked_collective(mwms_cluster, tmp_path):
    result = mwms_cluster.run(variable_loop, args=(8,), timeout=2, faults=[SkipStep(1, 4)],
                              ledger="collectives")
    result.assert_hang(culprits=[1])
    trace_path, svg_path = result.timeline(str(tmp_path / "hang"))
    ev = json.loads(Path(trace_path).read_text())["traceEvents"]
    assert sum(1 for e in ev if e.get("cat") == "step") == 16
    assert [e["tid"] for e in ev if "(blocked)" in e["name"]] == [1]   # worker 0's calls
    texts = ["".join(t.itertext()) for t in svg_tree(Path(svg_path).read_text()).iter(SVG + "text")]
    assert "worker 1 ← culprit" in texts
    assert any(t.startswith("blocked: in call 8 of `step`, in its collective #1") for t in texts)


NO_STEP = """
    import pytest

    def fails_at_once():
        raise ValueError("fails before any step")

    def test_fails_before_any_step(mwms_cluster):
        mwms_cluster.run(fails_at_once, timeout=30).assert_completed()

    def test_its_timeline_cannot_be_drawn(mwms_cluster, monkeypatch):
        def broken(panels):
            raise RuntimeError("the drawing broke")
        monkeypatch.setattr("harness.report.timeline.svg", broken)
        mwms_cluster.run(fails_at_once, timeout=30).assert_completed()

    def test_after():
        pass
"""


@pytest.mark.timeout(240)
def test_a_report_dir_with_runs_that_ran_no_step_ends_the_session_as_usual(pytester, tmp_path):
    """--mwms-report-dir and two runs that failed before any step: the first
    drawn, the second's drawing broken on purpose (a warning, a report
    section, no file); the session's last test runs, and pytest exits 1
    (tests failed), not 3 (INTERNALERROR)."""
    pytester.makepyfile(test_no_step=NO_STEP)
    reports = tmp_path / "reports"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--mwms-workers=2",
                                           f"--mwms-report-dir={reports}")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    assert "INTERNALERROR" not in out + result.stderr.str()
    result.assert_outcomes(failed=2, passed=1)
    stem = "test_no_step.py_test_fails_before_any_step-run1"
    assert sorted(os.listdir(reports)) == [f"{stem}.svg", f"{stem}.trace.json"]
    root = svg_tree((reports / f"{stem}.svg").read_text())
    assert not [r for r in root.iter(SVG + "rect") if r.get("class", "").startswith("step")]
    trace = json.loads((reports / f"{stem}.trace.json").read_text())
    assert not [e for e in trace["traceEvents"] if e.get("cat") == "step"]
    assert f"timeline: {reports / stem}.svg" in out
    assert "pytest-mwms: reports not made" in out
    assert ("pytest-mwms could not make the timeline of run 1: RuntimeError: the drawing broke"
            in out)
    assert out.count("ReportWarning") == 1
    assert f"timelines in {reports}" in out
