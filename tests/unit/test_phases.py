"""Where a run's time went: the workers' phases from their events, and the
parent's from its clock (harness.controller.phases)."""
from __future__ import annotations

import pytest

from harness.controller.phases import Clock, added, ordered, render, worker_phases
from harness.core.protocol import WorkerError
from harness.diagnosis.observations import EndedBy, Event, RunObservation, WorkerObservation


def worker(index, started=0.1, created=0.3, steps=(0.4, 0.5), finish=0.6, **kw):
    events = [Event(started, "started"), Event(created, "strategy_created")]
    events += [Event(t, "step", k) for k, t in enumerate(steps)]
    return WorkerObservation(index=index, events=tuple(events), finish_time=finish, **kw)


def run(workers, duration, ended_by=EndedBy.ALL_FINISHED):
    return RunObservation(num_workers=len(workers), timeout=5.0, grace=5.0, ended_by=ended_by,
                          duration=duration, workers=tuple(workers))


def test_a_completed_run_is_cut_at_the_last_start_strategy_and_step():
    obs = run([worker(0, returned=True), worker(1, started=0.2, created=0.35, steps=(0.45, 0.55),
                                                finish=0.6, returned=True)], duration=0.65)
    assert worker_phases(obs) == pytest.approx(
        {"start": 0.2, "strategy": 0.15, "steps": 0.2, "wait: finish": 0.1})


def test_the_phases_add_up_to_the_run():
    obs = run([worker(0, returned=True), worker(1, returned=True)], duration=0.65)
    assert sum(worker_phases(obs).values()) == pytest.approx(0.65)


@pytest.mark.parametrize("ended_by, wait", [(EndedBy.HANG, "wait: hang timeout"),
                                            (EndedBy.DEADLOCK, "wait: deadlock proof")])
def test_a_run_decided_by_the_harness_names_what_it_waited_for(ended_by, wait):
    obs = run([worker(0, finish=None), worker(1, finish=None)], duration=5.5, ended_by=ended_by)
    phases = worker_phases(obs)
    assert phases[wait] == pytest.approx(5.0)
    assert set(phases) == {"start", "strategy", "steps", wait}


def test_peers_failed_by_tensorflow_after_a_death_wait_for_its_failure_detection():
    dead = worker(1, steps=(0.4,), finish=None, exit_code=-9, exit_time=0.45)
    echo = worker(0, finish=10.5, error=WorkerError("UnavailableError", "", "", None))
    phases = worker_phases(run([echo, dead], duration=10.5))
    assert phases["wait: TensorFlow's failure detection"] == pytest.approx(10.0)


def test_a_grace_that_ran_out_begins_at_the_first_worker_that_ended_badly():
    timed_out = worker(1, finish=4.4, error=WorkerError("DeadlineExceededError", "", "", None))
    blocked = worker(0, finish=None)
    phases = worker_phases(run([blocked, timed_out], duration=6.4,
                               ended_by=EndedBy.GRACE_EXPIRED))
    assert phases["wait: TensorFlow's failure detection"] == pytest.approx(3.9)
    assert phases["wait: grace"] == pytest.approx(2.0)


def test_a_run_without_a_strategy_or_steps_has_its_work_until_the_first_end():
    w = WorkerObservation(index=0, events=(Event(0.1, "started"),), finish_time=0.3,
                          returned=True)
    assert worker_phases(run([w], duration=0.35)) == pytest.approx(
        {"start": 0.1, "strategy": 0.0, "steps": 0.2, "wait: finish": 0.05})


def test_a_worker_that_never_started_leaves_the_whole_run_to_the_wait():
    w = WorkerObservation(index=0, exit_code=1, exit_time=0.2)
    phases = worker_phases(run([w], duration=0.2))
    assert phases["start"] == 0.0 and sum(phases.values()) == pytest.approx(0.2)


def test_a_hang_without_steps_waits_from_the_last_progress():
    blocked = WorkerObservation(index=0, events=(Event(0.1, "started"),
                                                 Event(0.2, "strategy_creating")))
    phases = worker_phases(run([blocked], duration=5.2, ended_by=EndedBy.HANG))
    assert phases["wait: hang timeout"] == pytest.approx(5.0)
    assert phases["steps"] == pytest.approx(0.1)


def test_the_clock_adds_each_interval_to_its_phase(monkeypatch):
    times = iter([10.0, 10.5, 11.0, 12.0])
    monkeypatch.setattr("harness.controller.phases.time.monotonic", lambda: next(times))
    clock = Clock()
    clock.mark("setup")
    clock.mark("launch")
    clock.mark("setup")
    assert clock.phases == {"setup": 1.5, "launch": 0.5}


def test_attempts_add_up_in_the_documented_order():
    total = added([{"teardown": 0.1, "start": 0.2}, {"start": 0.3, "request": 0.01}])
    assert list(total) == ["request", "start", "teardown"]
    assert total["start"] == pytest.approx(0.5)
    assert list(ordered({"other": 1.0, "setup": 1.0})) == ["setup", "other"]
    assert render({"launch": 0.02, "stacks": 0.0}) == "launch 0.02 s"
