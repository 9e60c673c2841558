"""Memory per step on real TensorFlow workers, in a job too fast for the
parent's samples (200 all-reduce steps in 1-3 s): each worker notes its
resident set at each step boundary, so a leak of 1 MiB a step is named and
the same job without it is flat.  How often, over many runs, is
``python -m harness.bench.memory_rate``'s (docs/benchmark.md)."""
import pytest

from harness.bench.memory_rate import flat, leaking_loop, named

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leftover_workers")]


def test_a_leak_in_a_fast_job_is_named_and_the_job_without_it_is_flat(mwms_cluster):
    leak = mwms_cluster.run(leaking_loop, kwargs={"steps": 200, "keep_on": 1}, timeout=30)
    assert named(leak, 1), leak.memory
    assert "memory: worker 1 grows +1." in leak.diagnosis
    assert len(leak.memory[0].points) >= 190   # a point per step, not 10 a second
    clean = mwms_cluster.run(leaking_loop, kwargs={"steps": 200}, timeout=30)
    assert flat(clean), clean.memory
