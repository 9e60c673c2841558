"""Generated fault plans on real workers: the harness's outcome and culprits
match the oracle, every run returns in time and leaves nothing behind."""
import time

import pytest
from hypothesis import HealthCheck, example, given, note, settings

from harness.launch.ports import bindable
from harness import faults as F
from harness import strategies
from plans import Plan, fault_plans, replay
from harness.core.linux import wait_gone
from helpers import tensorflow_pids, variable_loop
from oracle import expect

GRACE = 2.0


def _ports(result):
    ports = set()
    for w in result.observation.workers:
        if w.tf_config:
            ports.update(int(a.rsplit(":", 1)[1]) for a in w.tf_config["cluster"]["worker"])
    return ports


@pytest.mark.timeout(900)
@given(plan=fault_plans())
# Found by the thorough profile: a skipped *last* step leaves no hole in the
# skipper's step record, and the diagnosis called it ambiguous.
@example(plan=Plan(workers=2, faults=(F.SkipStep(worker=0, step=5),), timeout=3.0, steps=6))
# Found by the thorough profile: a worker killed by the harness's cleanup
# whose exit status arrived before the harness marked it read as a crash.
@example(plan=Plan(workers=4, faults=(F.BadTFConfig(worker=3, kind="missing"),), timeout=3.0))
def test_generated_plan_matches_the_oracle(plan):
    note(f"replay: plans.replay({plan!r}, helpers.variable_loop)")
    outcome, culprits = expect(plan)
    t0 = time.monotonic()
    result = replay(plan, variable_loop, grace=GRACE)
    wall = time.monotonic() - t0
    print(f"{plan} -> {result.outcome} {result.culprits} in {wall:.2f}s")
    assert result.outcome == outcome, result.report()
    assert result.culprits == culprits, result.report()
    # In time: start-up and steps take well under 10 s here; on top come the
    # hang timeout or the grace, and any injected delays or pauses.
    waits = sum(getattr(f, "seconds", 0) or 0 for f in plan.faults)
    assert wall < 10 + plan.timeout + GRACE + waits
    assert not wait_gone(tensorflow_pids(), seconds=2)
    busy = [p for p in _ports(result) if not bindable(p, reuse_address=True)]
    assert not busy, f"ports still bound after the run: {busy}"


@pytest.mark.timeout(240)
@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=strategies.plans(workers=2, steps=4, kinds=["Delay"], min_faults=1))
def test_the_documented_given_example_runs_on_one_cluster_object(mwms_cluster, plan):
    """docs/faults.md's example, with a kind every run survives: the fixture's
    cluster serves every example, and each run is fresh processes."""
    mwms_cluster.run(variable_loop, args=(4,), faults=plan, timeout=20).assert_completed()
    assert len(mwms_cluster.runs) >= 1
