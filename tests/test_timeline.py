"""The timeline: from a run's record to a Chrome trace and an SVG picture.
Built from hand-made records (no TensorFlow), and once from a real hang."""
import dataclasses
import json
import xml.etree.ElementTree as ET

import pytest

from harness.diagnosis import diagnose
from harness.faults import SkipStep
from harness.result import RunResult
from harness.workloads import variable_loop
from observations import SKIP5, blocked, events, returned, run, with_ledger

pytestmark = pytest.mark.timeout(60)
SVG = "{http://www.w3.org/2000/svg}"


def _result(obs, attempt=0):
    v = diagnose(obs)
    return RunResult(outcome=v.outcome, workers=(), culprits=v.culprits, diagnosis=v.text,
                     duration=obs.duration, observation=obs, verdict=v, attempt=attempt)


def _skip_hang():
    """Worker 1 skipped step 5's all-reduce and returned; worker 0 waits in
    its last call, which worker 1 never launched."""
    fault = "SkipStep(worker=1, step=5)"
    w0 = with_ledger(blocked(0, 2), blocked=True)
    w1 = dataclasses.replace(returned(1, 2), events=events(range(10), 2, done=True, asked=10,
                                                           faults=[(5, fault)]))
    w1 = with_ledger(w1, per_step={s: 1 for s in SKIP5})
    return _result(run(w0, w1, ended_by="hang"))


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("no_leftover_workers")
def test_a_real_hang_draws_its_culprit_and_its_blocked_collective(mwms_cluster, tmp_path):
    result = mwms_cluster.run(variable_loop, args=(8,), timeout=2, faults=[SkipStep(1, 4)],
                              ledger="collectives")
    result.assert_hang(culprits=[1])
    trace_path, svg_path = result.timeline(str(tmp_path / "hang"))
    ev = json.load(open(trace_path))["traceEvents"]
    assert sum(1 for e in ev if e.get("cat") == "step") == 16
    assert [e["tid"] for e in ev if "(blocked)" in e["name"]] == [1]   # worker 0's calls
    texts = ["".join(t.itertext()) for t in _svg_tree(open(svg_path).read()).iter(SVG + "text")]
    assert "worker 1 ← culprit" in texts
    assert any(t.startswith("blocked: in call 8 of `step`, in its collective #1") for t in texts)


def _svg_tree(text):
    root = ET.fromstring(text)
    assert root.tag == SVG + "svg"
    return root
