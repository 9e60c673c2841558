"""The ``late_start`` rule on hand-built runs: a worker seen to start late,
or never, while the others ended in strategy creation.  Fast, no
TensorFlow.  The runs are shaped as TensorFlow 2.21 leaves them (measured,
see docs/faults.md#a-worker-that-starts-late): with a registration timeout
of R s the on-time workers raise ``DeadlineExceededError`` ("Barrier timed
out ... Wait_for_all_tasks_to_register") R s into strategy creation; with
none, they wait there until the hang timeout."""
from __future__ import annotations
from harness import plan as plan_module

import dataclasses

import pytest

from harness.diagnosis import diagnose
from harness.diagnosis.facts import facts_of
from harness.diagnosis.observations import Event, WorkerObservation
from harness.diagnosis.rules_start import LATE_START, late_start
from observations import blocked, config, died, events, raised, returned, run

BARRIER = ("Barrier timed out. Id: [Init]Wait_for_all_tasks_to_register::0. This usually "
           "happens because a task triggered the barrier too early or too slowly.")
CREATING = events(creating_only=True)


def late(events_from: float, ev=CREATING):
    """``ev`` moved ``events_from`` seconds later."""
    return tuple(dataclasses.replace(e, time=e.time + events_from) for e in ev)


def never(i: int, n: int) -> WorkerObservation:
    """A worker that reported nothing and was killed when the run ended."""
    return WorkerObservation(i, tf_config=config(i, n), exit_code=-9, exit_time=20.0,
                             killed_by_harness=True)


def gave_up(i: int, n: int, t: float = 3.1) -> WorkerObservation:
    return raised(i, n, "DeadlineExceededError", BARRIER, t, events=CREATING)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_worker_past_the_registration_timeout_is_named_not_the_ones_that_gave_up(n):
    last = n - 1
    obs = run(*(gave_up(i, n) for i in range(last)),
              raised(last, n, "DeadlineExceededError", "Deadline Exceeded", 14.0,
                     events=late(5.0)), ended_by="all_finished")
    v = diagnose(obs)
    assert (v.outcome, v.culprits, v.rule, v.ambiguous) == ("failed", (last,), "late_start", False)
    head = v.text.splitlines()[0]
    others = "worker 0" if n == 2 else f"workers {','.join(map(str, range(last)))}"
    assert head == (f"FAILED: worker {last} started 5.0s late; {others} gave up in strategy "
                    f"creation after 3.0s (DeadlineExceededError)"), v.text


@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_worker_that_never_started_is_named_so_whether_the_others_wait_or_give_up(n):
    last = n - 1
    waiting = run(*(blocked(i, n, events=CREATING) for i in range(last)), never(last, n),
                  ended_by="hang")
    v = diagnose(waiting)
    assert (v.outcome, v.culprits, v.rule) == ("hang", (last,), "late_start")
    assert f"worker {last} never started" in v.text.splitlines()[0]
    others = "worker 0" if n == 2 else f"workers {','.join(map(str, range(last)))}"
    assert v.text.splitlines()[0] == (
        f"HANG: worker {last} never started; {others} waited in strategy creation until the "
        f"hang timeout (10.0s without progress)"), v.text
    assert f"worker {last}: never started (reported nothing)" in v.text
    gave = run(*(gave_up(i, n) for i in range(last)), never(last, n), ended_by="grace_expired")
    assert (diagnose(gave).culprits, diagnose(gave).rule) == ((last,), "late_start")


def test_peers_that_died_waiting_are_not_blamed():
    # tensorflow#60706: the on-time workers abort (SIGABRT) in strategy creation.
    obs = run(died(0, 3, -6, 3.2, events=CREATING), died(1, 3, -6, 3.2, events=CREATING),
              never(2, 3))
    v = diagnose(obs)
    assert (v.outcome, v.culprits, v.rule) == ("crashed", (2,), "late_start")
    assert "died (exit code -6, SIGABRT)" in v.text.splitlines()[0]


def test_the_others_waits_are_told_as_one_span_per_way_they_ended():
    obs = run(gave_up(0, 4, 2.1), gave_up(1, 4, 2.3), died(2, 4, -6, 2.2, events=CREATING),
              never(3, 4))
    head = diagnose(obs).text.splitlines()[0]
    assert head == ("CRASHED: worker 3 never started; workers 0,1 gave up in strategy creation "
                    "after 2.0-2.2s (DeadlineExceededError); worker 2 gave up in strategy "
                    "creation after 2.1s and died (exit code -6, SIGABRT)"), head


def test_a_worker_whose_code_before_the_strategy_ran_long_is_named_as_such():
    # The user-code twin of a late start: the process started on time.
    slow = (CREATING[0],) + late(4.0, CREATING[1:])
    obs = run(gave_up(0, 3), gave_up(1, 3),
              raised(2, 3, "DeadlineExceededError", "Deadline Exceeded", 14.0, events=slow))
    v = diagnose(obs)
    assert (v.culprits, v.rule) == ((2,), "late_start")
    assert v.text.startswith("FAILED: worker 2 entered strategy creation 4.0s after the first "
                             "worker (it started on time"), v.text
    # Still in its own code when the run was ended.
    still = run(gave_up(0, 3), gave_up(1, 3), blocked(2, 3, events=CREATING[:1]),
                ended_by="grace_expired")
    v = diagnose(still)
    assert (v.culprits, v.rule) == ((2,), "late_start")
    assert "worker 2 never entered strategy creation (it started on time" in v.text


def test_a_tf_config_that_disagrees_is_left_to_the_config_rule():
    wrong = config(1, 2, port_list=[20000, 29999])
    obs = run(blocked(0, 2, events=CREATING), never(1, 2), ended_by="hang")
    obs = dataclasses.replace(obs, workers=(obs.workers[0],
                                            dataclasses.replace(obs.workers[1], tf_config=wrong)))
    assert late_start(facts_of(obs)) is None
    assert diagnose(obs).rule == "config"


def test_two_late_workers_are_both_named():
    obs = run(gave_up(0, 3), never(1, 3),
              raised(2, 3, "DeadlineExceededError", "Deadline Exceeded", 14.0, events=late(4.0)))
    assert diagnose(obs).culprits == (1, 2)


def test_it_passes_when_the_late_worker_came_in_time_or_the_others_got_further():
    # Within LATE_START of the first: the spread of a launcher's forks.
    close = run(blocked(0, 2, events=CREATING), blocked(1, 2, events=late(LATE_START - 0.5)),
                ended_by="hang")
    assert late_start(facts_of(close)) is None
    # The others made the strategy: whatever went wrong, it was not the wait.
    further = run(blocked(0, 2, steps=range(5)), blocked(1, 2, events=late(5.0, events(range(4)))),
                  ended_by="hang")
    assert late_start(facts_of(further)) is None
    # Everyone on time and waiting (a worker without TF_CONFIG that trains alone, say).
    on_time = run(*(blocked(i, 3, events=CREATING) for i in range(3)), ended_by="hang")
    assert late_start(facts_of(on_time)) is None


def test_one_that_came_late_explains_no_wait_that_goes_on_nor_an_error_of_their_own():
    # TensorFlow admits a worker that comes late: with everyone still
    # waiting after it came, its lateness (a launcher's slow start) explains
    # nothing.
    came = run(blocked(0, 3, events=CREATING), blocked(1, 3, events=CREATING),
               blocked(2, 3, events=late(3.0)), ended_by="hang")
    assert late_start(facts_of(came)) is None
    # The others failed of an error of their own, not of waiting.
    own = run(raised(0, 3, "UnavailableError", "errors resolving mwms-worker-1:20001", 3.0,
                     events=CREATING),
              raised(1, 3, "UnavailableError", "errors resolving mwms-worker-1:20001", 3.0,
                     events=CREATING),
              raised(2, 3, "UnavailableError", "errors resolving mwms-worker-1:20001", 9.0,
                     events=late(3.0)))
    assert late_start(facts_of(own)) is None


def test_a_worker_that_died_before_reporting_is_a_crash_not_a_late_start():
    obs = run(blocked(0, 2, events=CREATING), died(1, 2, -9, 0.5, events=()))
    v = diagnose(obs)
    assert v.rule == "crash" and v.culprits == (1,)


def test_a_late_worker_that_was_waited_for_completes_and_blames_nobody():
    ev = late(5.0, events(range(10), done=True, asked=10))
    obs = run(returned(0, 2), WorkerObservation(1, tf_config=config(1, 2), events=ev, returned=True,
                                                finish_time=7.0, exit_code=0, exit_time=7.1))
    assert diagnose(obs).culprits == () and diagnose(obs).outcome == "completed"


def test_the_rule_reads_no_fault_event():
    # The record lists a StartDelay as injected; with that event alone (no
    # start seen late) the rule does not answer.
    noted = (Event(0.0, "fault", data="StartDelay(worker=1, seconds=5)"),) + CREATING
    obs = run(blocked(0, 2, events=CREATING), blocked(1, 2, events=noted), ended_by="hang")
    assert late_start(facts_of(obs)) is None


# ---------------------------------------------------------------- the fault

def test_start_delay_takes_seconds_or_none_and_one_per_worker_and_attempt():
    from harness import faults
    from harness.errors import FaultError
    assert plan_module.validate([faults.StartDelay(1, 2.5), faults.StartDelay(0, None)], 2)
    assert repr(faults.StartDelay(1, None)) == "StartDelay(worker=1, seconds=None)"
    from harness.cli import parse_fault   # --fault takes it as it prints
    assert parse_fault("StartDelay(worker=1, seconds=None)") == faults.StartDelay(1, None)
    assert parse_fault("StartDelay(2, 3.5)") == faults.StartDelay(2, 3.5)
    with pytest.raises(FaultError, match="seconds must be 0 or more"):
        plan_module.validate([faults.StartDelay(1, -1)], 2)
    with pytest.raises(FaultError, match="seconds must be a number"):
        plan_module.validate([faults.StartDelay(1, "5")], 2)
    with pytest.raises(FaultError, match="already has a StartDelay"):
        plan_module.validate([faults.StartDelay(1, 1), faults.StartDelay(1, 2)], 2)
    assert plan_module.validate([faults.StartDelay(1, 1), faults.StartDelay(1, 2, attempt=1)], 2,
                           restarts=1)
    with pytest.raises(FaultError, match="does not exist"):
        plan_module.validate([faults.StartDelay(2, 1)], 2)
