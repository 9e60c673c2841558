"""The collective ledger: its record format and parent-side assembly (fast,
no TensorFlow), its hooks on a TensorFlow that lacks them, and what it
records on real workers at each level."""

import pytest

from harness.workloads import allreduce_loop


@pytest.mark.timeout(120)
@pytest.mark.parametrize("level", [True, "collectives", False])
def test_what_the_ledger_records_on_real_workers(mwms_cluster, level):
    result = mwms_cluster.run(allreduce_loop, args=(5,), timeout=60, ledger=level)
    result.assert_completed()
    for w in result.workers:
        mine = [c for c in w.collectives if c.function == "step"]
        if level is False:
            assert w.collectives == () and w.observation.ledger is None
            continue
        assert [c.step for c in mine] == [0, 1, 2, 3, 4]
        assert {(c.kind, c.dtype, c.state) for c in mine} == {("all-reduce", "float32",
                                                               "completed")}
        if level == "collectives":
            assert all(call.launched == (0,) and call.done == (0,)
                       for call in w.observation.calls if call.step is not None)


def test_bad_ledger_level_is_rejected_before_any_process(mwms_cluster):
    with pytest.raises(ValueError, match="run\\(ledger=...\\)"):
        mwms_cluster.run(allreduce_loop, ledger="everything")
