"""Memory that grows (harness.diagnosis.memory) on hand-made samples: no TensorFlow."""
import random

import pytest

from harness.core import protocol
from harness.diagnosis import diagnose, memory
from harness.diagnosis.memory import MIB
from harness.diagnosis.observations import Event, RunObservation, WorkerObservation
from harness.controller.memory import MemorySampler, interval

STEP_SECONDS = 0.1


def worker(index, mib_at_step, steps=40, samples_per_step=1):
    """A worker that ran ``steps`` steps of STEP_SECONDS each, its memory
    in step ``s`` being ``mib_at_step(s)`` MiB, sampled in each step."""
    events = tuple(Event(1.0 + s * STEP_SECONDS, protocol.STEP, s) for s in range(steps))
    samples = tuple(
        (1.0 + (s + (k + 0.5) / samples_per_step) * STEP_SECONDS, int(mib_at_step(s) * MIB))
        for s in range(steps) for k in range(samples_per_step))
    # Samples before the first step: the start, TensorFlow's import.
    before = ((0.1, 200 * MIB), (0.5, 300 * MIB))
    return WorkerObservation(index=index, events=events, returned=True, memory=before + samples)


def run(*workers):
    return RunObservation(num_workers=len(workers), timeout=30, grace=5,
                          ended_by="all_finished", duration=10.0, workers=tuple(workers))


def flat(s):
    return 400.0


def warmup_then_flat(s):
    # Tracing and the allocator's first pools: 150 MiB in the first 3 steps.
    return 400.0 + min(s, 3) * 50.0


def leak(s):
    return 400.0 + s * 1.0


def noisy(seed):
    rng = random.Random(seed)
    return lambda s: 400.0 + rng.gauss(0, 3.0)


def test_flat_memory_has_a_rate_near_zero_and_does_not_grow():
    g = memory.growth(worker(0, flat))
    assert g.mib_per_step == pytest.approx(0.0, abs=1e-9)
    assert not g.steady and not g.grows()


def test_warm_up_bump_then_flat_is_no_leak():
    g = memory.growth(worker(0, warmup_then_flat))
    assert g.fitted[0][0] >= memory.WARMUP_STEPS
    assert g.mib_per_step == pytest.approx(0.0, abs=1e-9)
    assert not g.steady


def test_steady_leak_is_fitted_at_its_rate_and_named():
    leaking = worker(1, leak, steps=200)
    g = memory.growth(leaking)
    assert g.mib_per_step == pytest.approx(1.0, abs=0.01)
    assert g.steady and g.grows()
    lines = memory.memory_lines(run(worker(0, flat, steps=200), leaking))
    assert len(lines) == 1
    assert lines[0].startswith("memory: worker 1 grows +1.00 MiB per step over ")
    assert "the other stays flat" in lines[0]
    assert "RSS 450 -> 599 MiB" in lines[0]


def test_noise_alone_is_no_leak():
    for seed in range(20):
        g = memory.growth(worker(0, noisy(seed)))
        assert abs(g.mib_per_step) < memory.FLAT_MIB_PER_STEP, seed
        assert not g.steady, seed


def test_leak_under_noise_and_outliers_is_still_fitted():
    rng = random.Random(7)

    def spiky(s):
        return 400.0 + 2.0 * s + rng.gauss(0, 3.0) + (80.0 if s % 9 == 0 else 0.0)
    g = memory.growth(worker(0, spiky, steps=60))
    assert g.mib_per_step == pytest.approx(2.0, abs=0.3)
    assert g.steady


def test_steady_growth_of_a_few_mib_in_all_is_not_named():
    # 0.4 MiB per step past the warm-up of a 25-step run: 7 MiB in all,
    # within what TensorFlow's own warm-up grows.
    g = memory.growth(worker(0, lambda s: 400.0 + 0.4 * s, steps=25))
    assert g.mib_per_step == pytest.approx(0.4, abs=0.01) and g.grows()
    assert not g.steady


def test_one_jump_in_the_middle_is_not_steady_growth():
    g = memory.growth(worker(0, lambda s: 400.0 + (100.0 if s >= 25 else 0.0), steps=50))
    assert not g.steady
    assert memory.memory_lines(run(worker(0, lambda s: 400.0 + (100.0 if s >= 25 else 0.0),
                                          steps=50))) == []


def test_several_samples_per_step_pair_with_the_step_they_fell_in():
    g = memory.growth(worker(0, leak, samples_per_step=3))
    assert len(g.points) == 40
    assert g.mib_per_step == pytest.approx(1.0, abs=0.01)


def test_no_rate_without_samples_steps_or_enough_steps():
    none = memory.growth(WorkerObservation(index=0))
    assert none.mib_per_step is None and "no samples" in none.why_none
    no_steps = memory.growth(WorkerObservation(index=0, memory=((0.1, MIB), (0.2, MIB))))
    assert no_steps.mib_per_step is None and no_steps.why_none == "no steps reported"
    short = memory.growth(worker(0, leak, steps=8))
    assert short.mib_per_step is None and "too few steps" in short.why_none
    assert not short.grows()


def test_a_worker_without_a_rate_is_said_so_beside_the_leak():
    lines = memory.memory_lines(run(worker(0, leak, steps=100), worker(1, leak, steps=5)))
    assert lines[0].startswith("memory: worker 0 grows +1.00 MiB per step")
    assert "worker 1: no rate (too few steps past the warm-up" in lines[0]


def test_steps_points_leave_out_samples_before_the_first_step():
    points = memory.step_points([(0.5, 1), (1.05, 2), (1.15, 3), (1.18, 4)], [1.0, 1.1])
    assert points == ((0, 2), (1, 4))


def test_a_second_loop_numbered_from_zero_goes_on_counting():
    # A training loop of 30 steps, then an evaluation loop of 30 that
    # numbers its steps from 0 again, leaking all along.
    events = tuple(Event(1.0 + k * STEP_SECONDS, protocol.STEP, k % 30) for k in range(60))
    samples = tuple((1.05 + k * STEP_SECONDS, int((400 + k) * MIB)) for k in range(60))
    g = memory.growth(WorkerObservation(index=0, events=events, memory=samples))
    assert [p[0] for p in g.points] == list(range(60))
    assert g.mib_per_step == pytest.approx(1.0) and g.steady


def test_a_worker_above_the_limit_but_not_steady_is_said_so_not_called_flat():
    # Grows 1 MiB per step until step 40, then stays: the second half is flat.
    stops = worker(2, lambda s: 400.0 + min(s, 40), steps=60)
    g = memory.growth(stops)
    assert g.grows() and not g.steady
    lines = memory.memory_lines(run(worker(0, flat, steps=60), worker(1, leak, steps=60), stops))
    assert "worker 2: +" in lines[0] and "MiB per step, not steadily" in lines[0]
    assert lines[0].endswith("; worker 0 flat")


def test_memory_survives_the_record_round_trip():
    obs = run(worker(0, leak))
    back = RunObservation.from_dict(obs.to_dict())
    assert back.workers[0].memory == obs.workers[0].memory
    assert memory.growth(back.workers[0]).mib_per_step == pytest.approx(1.0, abs=0.01)


def test_the_sampling_interval_starts_at_a_tenth_and_grows_with_the_run():
    assert interval(0.0) == interval(20.0) == 0.1
    assert interval(60.0) == pytest.approx(0.25)


class _Handle:
    def __init__(self, read):
        self.read = read

    def memory_bytes(self):
        return self.read


class _Tracked:
    def __init__(self, read, pending=True):
        self.handle, self.pending = _Handle(read), pending
        self.seen = WorkerObservation(index=0)

    def note(self, **changes):
        import dataclasses
        self.seen = dataclasses.replace(self.seen, **changes)


def test_the_sampler_samples_live_workers_only_when_due():
    live, ended, unread = _Tracked(5 * MIB), _Tracked(7 * MIB, pending=False), _Tracked(None)
    sampler = MemorySampler(start=100.0)
    assert sampler.sample([live, ended, unread], 100.0) == pytest.approx(100.1)
    assert sampler.sample([live, ended, unread], 100.05) == pytest.approx(100.1)  # not due
    sampler.sample([live, ended, unread], 100.1)
    assert live.seen.memory == ((0.0, 5 * MIB), (0.1, 5 * MIB))
    assert ended.seen.memory == () and unread.seen.memory == ()


def _result(obs):
    from harness.result import RunResult
    return RunResult(workers=(), duration=1.0, observation=obs, verdict=diagnose(obs))


def test_assert_memory_flat_fails_a_leak_with_the_diagnosis_first_and_passes_flat():
    leaking = _result(run(worker(0, flat, steps=100), worker(1, leak, steps=100)))
    with pytest.raises(AssertionError) as raised:
        leaking.assert_memory_flat()
    assert str(raised.value).startswith(leaking.diagnosis + "\n")
    assert "worker 1 grows +1.00 MiB per step" in str(raised.value)
    assert "worker 0" not in str(raised.value)[len(leaking.diagnosis):]
    leaking.assert_memory_flat(mib_per_step=2)
    _result(run(worker(0, flat), worker(1, warmup_then_flat))).assert_memory_flat()
    assert [g.worker for g in leaking.memory] == [0, 1] and leaking.memory[1].steady


def test_assert_memory_flat_fails_where_flat_was_not_shown():
    with pytest.raises(AssertionError, match=r"worker 1: no rate \(too few steps"):
        _result(run(worker(0, flat), worker(1, flat, steps=6))).assert_memory_flat()
    with pytest.raises(AssertionError, match="no worker's memory was sampled"):
        _result(run()).assert_memory_flat()


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), True, "1"])
def test_assert_memory_flat_names_its_bad_argument(bad):
    from harness.errors import SettingError
    with pytest.raises(SettingError, match=r"assert_memory_flat\(mib_per_step=\.\.\.\)"):
        _result(run(worker(0, flat))).assert_memory_flat(mib_per_step=bad)


def test_the_proc_readers_read_this_process_and_none_for_a_gone_one():
    import os
    import subprocess
    from harness.launch import memory as proc_memory
    assert proc_memory.resident_bytes(os.getpid()) > MIB
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert proc_memory.resident_bytes(gone.pid) is None
    assert proc_memory.proportional_bytes(gone.pid) is None


def noted(index, mib_at_step, steps=200, step_seconds=0.0125):
    """A worker of fast steps (80 a second) that noted its resident set at
    each boundary, with no parent sample at all."""
    events = tuple(Event(1.0 + s * step_seconds, protocol.STEP, s, int(mib_at_step(s) * MIB))
                   for s in range(steps))
    return WorkerObservation(index=index, events=events, returned=True, memory=())


def test_the_resident_set_noted_at_each_boundary_gives_a_rate_however_fast_the_steps():
    leak = memory.growth(noted(1, lambda s: 400.0 + s))
    assert leak.mib_per_step == pytest.approx(1.0) and leak.steady and not leak.samples
    assert len(leak.points) == 200
    still = memory.growth(noted(0, warmup_then_flat))
    assert still.mib_per_step == pytest.approx(0.0) and not still.steady


def test_the_parent_s_samples_stand_in_where_the_worker_noted_nothing():
    sampled = worker(0, lambda s: 400.0 + s)   # events without data
    assert memory.boundary_points(sampled) == ()
    assert memory.growth(sampled).mib_per_step == pytest.approx(1.0)
    none = WorkerObservation(index=0, events=noted(0, flat).events[:0], returned=True)
    assert memory.growth(none).why_none.startswith("no samples")
