"""The timeline: from a run's record to a Chrome trace and an SVG picture.
Built from hand-made records (no TensorFlow), and once from a real hang."""
import dataclasses
import json
import xml.etree.ElementTree as ET

import pytest

from harness.report import timeline
from harness.diagnosis import diagnose
from harness.result import RunResult
from observations import SKIP5, blocked, events, returned, run, with_ledger

pytestmark = pytest.mark.timeout(60)
SVG = "{http://www.w3.org/2000/svg}"


def _result(obs, attempt=0):
    v = diagnose(obs)
    return RunResult(workers=(), duration=obs.duration, observation=obs, verdict=v,
                     attempt=attempt)


def _skip_hang():
    """Worker 1 skipped step 5's all-reduce and returned; worker 0 waits in
    its last call, which worker 1 never launched."""
    fault = "SkipStep(worker=1, step=5)"
    w0 = with_ledger(blocked(0, 2), blocked=True)
    w1 = dataclasses.replace(returned(1, 2), events=events(range(10), 2, done=True, asked=10,
                                                           faults=[(5, fault)]))
    w1 = with_ledger(w1, per_step={s: 1 for s in SKIP5})
    return _result(run(w0, w1, ended_by="hang"))


def test_a_panel_holds_steps_calls_faults_and_ends():
    r = _skip_hang()
    (p,) = timeline.panels_of(r)
    assert (p.outcome, p.attempt) == ("hang", 0) and p.headline.startswith("HANG")
    w0, w1 = p.lanes
    assert w1.culprit and not w0.culprit
    assert [s.label for s in w0.steps] == [f"step {k}" for k in range(10)]
    assert w0.steps[-1].end is None                   # blocked: open to the end
    assert w1.steps[-1].end is not None               # returned: closed
    pending = [c for c in w0.calls if c.state == "pending"]
    assert len(pending) == 1 and "in call 10 of `step`" in pending[0].detail
    assert [m.label for m in w1.marks if m.kind == "fault"] == ["SkipStep(worker=1, step=5)"]
    assert [m.label for m in w1.marks if m.kind == "end"] == ["returned"]
    assert [m.label for m in w0.marks if m.kind == "end"] == ["killed by the harness"]


def test_the_chrome_trace_has_the_expected_events():
    trace = json.loads(json.dumps(timeline.chrome_trace(timeline.panels_of(_skip_hang()))))
    ev = trace["traceEvents"]
    for e in ev:
        assert {"ph", "pid", "name"} <= set(e)
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
    names = {e["args"]["name"] for e in ev if e["name"] == "thread_name"}
    assert "worker 1 (culprit): steps" in names and "worker 0: calls" in names
    steps = [e for e in ev if e.get("cat") == "step"]
    assert len(steps) == 20 and all(e["ph"] == "X" and e["dur"] >= 0 for e in steps)
    blocked_calls = [e for e in ev if e.get("cat") == "collective" and "(blocked)" in e["name"]]
    assert len(blocked_calls) == 1 and blocked_calls[0]["tid"] == 1
    assert blocked_calls[0]["args"]["state"] == "pending"
    assert any(e["name"] == "fault: SkipStep(worker=1, step=5)" for e in ev if e["ph"] == "i")
    (verdict,) = [e for e in ev if e.get("cat") == "verdict"]
    assert verdict["s"] == "g" and verdict["name"] == "HANG declared"
    assert verdict["ts"] == pytest.approx(21.0 * 1e6)


def test_the_picture_is_svg_with_the_culprit_and_the_blocked_collective():
    root = svg_tree(timeline.svg(timeline.panels_of(_skip_hang())))
    texts = ["".join(t.itertext()) for t in root.iter(SVG + "text")]
    assert "worker 1 ← culprit" in texts and "worker 0" in texts
    assert any(t.startswith("blocked: in call 10 of `step`") for t in texts)
    assert "HANG declared" in texts
    rects = list(root.iter(SVG + "rect"))
    assert sum(1 for r in rects if r.get("class") == "culprit-row") == 1
    assert sum(1 for r in rects if r.get("class", "").startswith("step")) == 20
    assert sum(1 for r in rects if r.get("class") == "call pending") == 1


def test_an_ambiguous_verdict_marks_candidates_not_a_culprit():
    obs = run(blocked(0, 2, steps=range(5)), blocked(1, 2, steps=range(5)), ended_by="hang")
    r = _result(obs)
    assert r.ambiguous
    texts = ["".join(t.itertext()) for t in svg_tree(timeline.svg(timeline.panels_of(r)))
             .iter(SVG + "text")]
    assert "worker 0 ? candidate" in texts and not any("← culprit" in t for t in texts)


def test_every_attempt_is_a_panel_and_a_process(tmp_path):
    first, second = _skip_hang(), _result(run(returned(0, 2), returned(1, 2)), attempt=1)
    r = dataclasses.replace(second, attempts=(first, second))
    trace_path, svg_path = r.timeline(str(tmp_path / "sub" / "run.svg"))
    assert trace_path.endswith("run.trace.json") and svg_path.endswith("run.svg")
    trace = json.load(open(trace_path))
    procs = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"]
    assert procs == ["attempt 0: hang", "attempt 1: completed"]
    texts = ["".join(t.itertext()) for t in svg_tree(open(svg_path).read()).iter(SVG + "text")]
    assert "attempt 0: HANG" in texts and "attempt 1: COMPLETED" in texts


def test_a_run_in_which_no_worker_reported_a_step_has_a_picture_too():
    obs = run(blocked(0, 2, steps=()), blocked(1, 2, steps=()), ended_by="hang")
    (p,) = timeline.panels_of(_result(obs))
    assert all(ln.steps == () for ln in p.lanes)
    texts = ["".join(t.itertext()) for t in svg_tree(timeline.svg([p])).iter(SVG + "text")]
    assert "attempt 0: HANG" in texts and "worker 1 ? candidate" in texts


def test_ticks_are_round():
    assert timeline._ticks(3.7) == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
    assert timeline._ticks(45) == [0, 10, 20, 30, 40]
    assert timeline._ticks(0) == [0.0]


def svg_tree(text):
    root = ET.fromstring(text)
    assert root.tag == SVG + "svg"
    return root
