"""Every report writer takes every run: none, one or many workers, no steps
at all, zero-length runs, one attempt or several.  Driven by generated
observations (no TensorFlow); a writer that raises here would end a session
with an INTERNALERROR."""
import dataclasses
import json
import xml.etree.ElementTree as ET

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.diagnosis import diagnose
from harness.report import pytest_report, timeline
from harness.result import RunResult
from observations import blocked, died, raised, returned, run, with_ledger

KINDS = {
    "returned": lambda i, n, steps, t: returned(i, n, steps=steps, t=t, asked=len(steps)),
    "blocked": lambda i, n, steps, t: blocked(i, n, steps=steps),
    "raised": lambda i, n, steps, t: raised(i, n, "ValueError", "boom", t, steps=steps),
    "died": lambda i, n, steps, t: died(i, n, -9, t, steps=steps),
}
ENDS = ("all_finished", "hang", "grace_expired", "certain")


@st.composite
def observations(draw):
    n = draw(st.integers(0, 4))
    workers = []
    for i in range(n):
        kind = draw(st.sampled_from(sorted(KINDS)))
        steps = range(draw(st.integers(0, 12)))
        t = draw(st.sampled_from([0.0, 0.05, 1.0, 30.0]))
        w = KINDS[kind](i, n, steps, t)
        ledger = draw(st.sampled_from(["none", "steps", "outside", "blocked"]))
        if ledger == "steps":
            w = with_ledger(w)
        elif ledger == "outside":
            w = with_ledger(w, calls_without_steps=draw(st.integers(0, 5)))
        elif ledger == "blocked":
            w = with_ledger(w, per_step={s: 2 for s in steps}, blocked=True)
        workers.append(w)
    obs = run(*workers, ended_by=draw(st.sampled_from(ENDS)))
    return dataclasses.replace(obs, duration=draw(st.sampled_from([0.0, 1e-6, 0.5, 21.0])))


def _result(obs, attempt):
    v = diagnose(obs)
    return RunResult(workers=(), duration=obs.duration, observation=obs, verdict=v,
                     attempt=attempt)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(observations(), min_size=1, max_size=3))
def test_every_writer_takes_every_run(tmp_path, attempts):
    results = [_result(obs, k) for k, obs in enumerate(attempts)]
    last = dataclasses.replace(results[-1], attempts=tuple(results) if len(results) > 1 else ())
    panels = timeline.panels_of(last)
    assert len(panels) == len(results)
    ET.fromstring(timeline.svg(panels))
    json.dumps(timeline.chrome_trace(panels))
    trace_path, svg_path = last.timeline(str(tmp_path / "t" / "run"))
    assert json.load(open(trace_path))["traceEvents"]
    assert ET.parse(svg_path).getroot() is not None
    runs = [last]
    pytest_report.junit_properties(runs)
    pytest_report.report_sections(runs, {1: (trace_path, svg_path)}, True)
    summary = pytest_report.run_summary(last, "test_x.py::test_x")
    pytest_report.summary_lines([summary], str(tmp_path))
