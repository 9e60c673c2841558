"""The timeline of a real hang (the drawing itself: tests/unit/test_timeline.py)."""
import json

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
    ev = json.load(open(trace_path))["traceEvents"]
    assert sum(1 for e in ev if e.get("cat") == "step") == 16
    assert [e["tid"] for e in ev if "(blocked)" in e["name"]] == [1]   # worker 0's calls
    texts = ["".join(t.itertext()) for t in svg_tree(open(svg_path).read()).iter(SVG + "text")]
    assert "worker 1 ← culprit" in texts
    assert any(t.startswith("blocked: in call 8 of `step`, in its collective #1") for t in texts)
