"""Each row of the diagnosis's rule table on its own: when it answers, whom it
names, and when it passes.  Fast, no TensorFlow.

Every rule is called directly on the facts of a hand-built run, so a rule is
shown to answer (or pass) by itself, whatever the rows before it would say;
then ``diagnose`` is asked which rule decided, so the order of the table is
covered too.
"""
from __future__ import annotations

import dataclasses

import pytest

from harness.diagnosis import RULES, diagnose
from harness.diagnosis import rules as R
from harness.diagnosis.facts import SITUATIONS, facts_of
from harness.errors import StepDesyncError
from harness.core.protocol import WorkerError
from harness.diagnosis.observations import (Call, CollectiveOp, Event, TracedFunction,
                                            WorkerObservation)
from observations import (SKIP5, STACK_SLEEP, STACK_TF, UNHEALTHY, blocked, config, died,
                          events, raised, returned, run, shape_error, with_ledger)


def blame(rule, obs):
    return rule(facts_of(obs))


def decided_by(obs):
    return diagnose(obs).rule


def desync(i: int, n: int, steps, t: float) -> WorkerObservation:
    e = StepDesyncError(steps)
    return WorkerObservation(i, tf_config=config(i, n), events=events(range(6), n),
                             error=WorkerError("StepDesyncError", str(e), "", e.fields),
                             finish_time=t, exit_code=1, exit_time=t + 0.1)


# ---------------------------------------------------------------- the table

def test_table_names_are_unique_and_every_situation_ends_with_an_answer():
    assert len({r.name for r in RULES}) == len(RULES)
    assert all(r.when <= set(SITUATIONS) and r.when for r in RULES)
    for situation in SITUATIONS:
        last = [r for r in RULES if situation in r.when][-1]
        assert last.name in ("nothing_to_blame", "crash", "root_error", "no_evidence",
                             "reference", "died_at_exit"), situation


def test_the_verdict_names_the_rule_and_a_completed_run_blames_nobody():
    obs = run(*(returned(i, 2) for i in range(2)))
    assert blame(R.nothing_to_blame, obs).culprits == ()
    assert decided_by(obs) == "nothing_to_blame"
    assert blame(R.nothing_to_blame, run(returned(0, 2), blocked(1, 2), ended_by="hang")) is None


# ---------------------------------------------------------------- crash, config

def test_crash_names_the_first_death_not_the_later_one():
    obs = run(died(0, 3, -9, 2.0), died(1, 3, 1, 9.0), blocked(2, 3, steps=range(4)))
    b = blame(R.crash, obs)
    assert list(b.culprits) == [0] and "died later" in b.headline
    assert decided_by(obs) == "crash"


def test_every_worker_exiting_alike_at_once_names_no_one():
    # PreemptionCheckpointHandler's exit: status 42 everywhere, same step.
    obs = run(died(0, 3, 42, 5.00, steps=range(10)), died(1, 3, 42, 5.02, steps=range(10)),
              died(2, 3, 42, 5.01, steps=range(10)))
    v = diagnose(obs)
    assert (v.outcome, v.culprits, v.ambiguous, v.rule) == (
        "crashed", (0, 1, 2), True, "coordinated_exit")
    assert "exited with status 42 at step 9" in v.text and "worker 0 exited first" in v.text
    assert "PreemptionCheckpointHandler" in v.text
    # Another status alike everywhere names the handler nowhere.
    ones = run(*(died(i, 3, 1, 5.0 + i / 100, steps=range(10)) for i in range(3)))
    assert "status 1" in diagnose(ones).text and "Preemption" not in diagnose(ones).text
    # The notified worker may exit last, long after: the order proves nothing.
    late = run(*obs.workers[:2], died(2, 3, 42, 9.0, steps=range(10)))
    assert blame(R.coordinated_exit, late).ambiguous
    # Not alike: different statuses, a signal, other steps, a survivor, an error.
    for other in (died(2, 3, 1, 5.01, steps=range(10)), died(2, 3, -9, 5.01, steps=range(10)),
                  died(2, 3, 42, 5.01, steps=range(6)), blocked(2, 3),
                  raised(2, 3, "ValueError", "boom", 5.0, steps=range(10))):
        assert blame(R.coordinated_exit, run(obs.workers[0], obs.workers[1], other)) is None


def test_a_death_as_the_collectives_time_out_names_no_one():
    # Worker 2 was cut off; worker 0 segfaulted aborting its timed-out
    # all-reduce, at the moment worker 1's timed out too.
    timeout = "Collective has timed out during execution"
    obs = run(died(0, 3, -11, 5.0, steps=range(6)),
              raised(1, 3, "DeadlineExceededError", timeout, 5.0, steps=range(6)),
              raised(2, 3, "DeadlineExceededError", "heartbeat timeout", 5.1, steps=range(6)))
    v = diagnose(obs)
    assert (v.outcome, v.culprits, v.ambiguous, v.rule) == (
        "crashed", (0, 1, 2), True, "timed_out_abort")
    # A crash of its own (exit code 1, or long before the timeouts) is blamed as ever.
    for other in (died(0, 3, 1, 5.0, steps=range(6)), died(0, 3, -11, 1.0, steps=range(6))):
        assert blame(R.timed_out_abort, run(other, *obs.workers[1:])) is None


def test_every_worker_aborted_at_once_in_its_collective_names_no_one():
    # A partition with a collective timeout: both workers segfaulted
    # aborting their all-reduce of step 5 (TensorFlow 2.15), none raised.
    obs = run(with_ledger(died(0, 2, -11, 9.0, steps=range(6)), blocked=True),
              with_ledger(died(1, 2, -11, 9.1, steps=range(6)), blocked=True))
    v = diagnose(obs)
    assert (v.outcome, v.culprits, v.ambiguous, v.rule) == (
        "crashed", (0, 1), True, "aborted_together")
    assert "at step 5" in v.text and "SIGSEGV" in v.text
    # Without ledgers, the same deaths alike.
    bare = run(died(0, 2, -11, 9.0, steps=range(6)), died(1, 2, -6, 9.1, steps=range(6)))
    assert blame(R.aborted_together, bare).ambiguous
    # Not alike: apart in time or step, a kill, an exit status, a survivor,
    # a worker whose ledger shows it was not in a collective.
    for other in (died(1, 2, -11, 12.0, steps=range(6)), died(1, 2, -11, 9.1, steps=range(3)),
                  died(1, 2, -9, 9.1, steps=range(6)), died(1, 2, 1, 9.1, steps=range(6)),
                  blocked(1, 2, steps=range(6)),
                  with_ledger(died(1, 2, -11, 9.1, steps=range(6)))):
        assert blame(R.aborted_together, run(bare.workers[0], other)) is None
        assert decided_by(run(bare.workers[0], other)) != "aborted_together"


def test_a_worker_stopped_before_the_deaths_outranks_them():
    # The others' collective timed out waiting for the stopped worker; one
    # survivor died of SIGSEGV aborting it.  Still crashed; the stopped one
    # is the culprit.
    stopped = WorkerObservation(2, tf_config=config(2, 3), events=events(range(5), 3),
                                stopped=True, exit_code=-9, killed_by_harness=True)
    obs = run(died(0, 3, -11, 5.0, steps=range(6)),
              raised(1, 3, "DeadlineExceededError", "Collective has timed out", 4.9,
                     steps=range(6)), stopped, ended_by="grace_expired")
    b = blame(R.stopped_before_deaths, obs)
    assert list(b.culprits) == [2]
    v = diagnose(obs)
    assert (v.outcome, v.culprits, v.rule) == ("crashed", (2,), "stopped_before_deaths")
    assert v.text.startswith("CRASHED: culprit: worker 2 (stopped (SIGSTOP) at step 4 before")
    # A stop after the first death proves nothing of the kind.
    late = WorkerObservation(2, tf_config=config(2, 3), events=events(range(5), 3) + (
        Event(9.0, "step", 5),), stopped=True, exit_code=-9, killed_by_harness=True)
    assert blame(R.stopped_before_deaths, run(obs.workers[0], obs.workers[1], late)) is None


def test_crash_after_a_root_error_names_the_raiser():
    obs = run(raised(0, 2, "ValueError", "boom", 1.0), died(1, 2, 1, 4.0))
    assert list(blame(R.crash, obs).culprits) == [0]


def test_config_names_the_disagreeing_list_and_passes_when_all_agree():
    n = 3
    obs = run(blocked(0, n), blocked(1, n), blocked(2, n, tf_config=config(2, n + 1)),
              ended_by="hang")
    assert list(blame(R.config, obs).culprits) == [2]
    assert decided_by(obs) == "config"
    assert blame(R.config, run(*(blocked(i, n) for i in range(n)), ended_by="hang")) is None


def test_config_tie_is_ambiguous():
    obs = run(blocked(0, 2), blocked(1, 2, tf_config=config(1, 2, [20000, 20009])),
              ended_by="hang")
    b = blame(R.config, obs)
    assert b.ambiguous and sorted(b.culprits) == [0, 1]


# ---------------------------------------------------------------- failed

def test_shape_mismatch_names_the_minority_shape_from_three_workers():
    ws = [WorkerObservation(i, tf_config=config(i, 3), events=events([0], 3),
                            error=shape_error(i, "[4]" if i == 1 else "[8]",
                                              "[8]" if i == 1 else "[4]"),
                            finish_time=1.0, exit_code=1) for i in range(3)]
    obs = run(*ws)
    assert list(blame(R.shape_mismatch, obs).culprits) == [1]
    assert decided_by(obs) == "shape_mismatch"


def test_shape_mismatch_passes_with_two_workers():
    ws = [WorkerObservation(i, tf_config=config(i, 2), events=events([0], 2),
                            error=shape_error(i, "[1]", "[8]"), finish_time=0.4, exit_code=1)
          for i in range(2)]
    assert blame(R.shape_mismatch, run(*ws)) is None


def test_sync_check_reads_the_steps_field_not_the_message():
    obs = run(desync(0, 3, [5, 6, 5], 1.0), desync(1, 3, [5, 6, 5], 1.0),
              desync(2, 3, [5, 6, 5], 1.0))
    b = blame(R.sync_check, obs)
    assert (list(b.culprits), b.step) == ([1], 5)
    assert decided_by(obs) == "sync_check"
    # Reworded text changes nothing: the data is in the fields.
    reworded = run(*(WorkerObservation(
        w.index, tf_config=w.tf_config, events=w.events, finish_time=1.0, exit_code=1,
        error=WorkerError("StepDesyncError", "workers disagree", "", w.error.fields))
        for w in obs.workers))
    assert list(blame(R.sync_check, reworded).culprits) == [1]


def test_sync_check_without_a_majority_is_ambiguous():
    obs = run(desync(0, 2, [4, 5], 1.0), desync(1, 2, [4, 5], 1.0))
    b = blame(R.sync_check, obs)
    assert b.ambiguous and sorted(b.culprits) == [0, 1]


def test_sync_check_passes_on_other_errors():
    assert blame(R.sync_check, run(raised(0, 2, "ValueError", "boom", 1.0), blocked(1, 2))) is None


def test_root_error_names_every_worker_with_the_same_type_but_no_echo():
    obs = run(raised(0, 3, "ValueError", "boom", 1.0), raised(1, 3, "ValueError", "boom", 1.1),
              raised(2, 3, "UnavailableError", UNHEALTHY.format(0), 5.0))
    b = blame(R.root_error, obs)
    assert sorted(b.culprits) == [0, 1] and "reported it as UnavailableError" in b.headline
    assert decided_by(obs) == "root_error"


# ---------------------------------------------------------------- stuck

def test_stopped_names_the_stopped_worker():
    obs = run(blocked(0, 2, steps=range(4)),
              WorkerObservation(1, tf_config=config(1, 2), events=events(range(4), 2),
                                stopped=True, exit_code=-9, killed_by_harness=True),
              ended_by="hang")
    assert list(blame(R.stopped, obs).culprits) == [1]
    assert decided_by(obs) == "stopped"
    assert blame(R.stopped, run(blocked(0, 2), blocked(1, 2), ended_by="hang")) is None


def test_majority_names_the_one_that_finished_early():
    obs = run(blocked(0, 3), returned(1, 3, steps=SKIP5), blocked(2, 3), ended_by="hang")
    assert list(blame(R.majority, obs).culprits) == [1]
    assert decided_by(obs) == "majority"


def test_majority_passes_with_two_workers():
    assert blame(R.majority, run(blocked(0, 2), returned(1, 2, steps=SKIP5),
                                 ended_by="hang")) is None


def test_behind_names_the_worker_whose_progress_stopped_first_outside_tensorflow():
    obs = run(blocked(0, 2, steps=range(9), stack=STACK_SLEEP), blocked(1, 2, steps=range(10)),
              ended_by="hang")
    assert list(blame(R.behind, obs).culprits) == [0]
    assert decided_by(obs) == "behind"
    # Someone finished: not a question of who is behind.
    assert blame(R.behind, run(blocked(0, 2), returned(1, 2), ended_by="hang")) is None


def test_behind_in_tensorflow_is_no_evidence():
    # The user's `continue` on worker 1, which then lingers after its loop:
    # worker 0 waits at step 9 for a partner that finished.  Being "behind"
    # does not make worker 0 the culprit.
    obs = run(blocked(0, 2, steps=range(10), stack=STACK_TF),
              blocked(1, 2, steps=range(10), stack=STACK_SLEEP,
                      events=events(range(10), 2, done=True)), ended_by="hang")
    assert blame(R.behind, obs) is None
    assert blame(R.outside_tensorflow, obs) is None
    v = diagnose(obs)
    assert v.ambiguous and v.culprits == (0, 1)


def _skip_twin(n: int, skipper: int, linger: bool):
    """The ledgers of a user's `continue` at step 4 on ``skipper``: it
    launched no collective in step 4, and finished (or lingers after its
    loop) while the others wait in their last call."""
    ws = []
    for i in range(n):
        if i == skipper:
            per_step = {s: (0 if s == 4 else 1) for s in range(10)}
            w = (blocked(i, n, stack=STACK_SLEEP, events=events(range(10), n, done=True))
                 if linger else returned(i, n))
            ws.append(with_ledger(w, per_step))
        else:
            ws.append(with_ledger(blocked(i, n), blocked=True))
    return run(*ws, ended_by="hang")


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("linger", [False, True])
def test_collective_counts_name_the_skipper_at_every_size(n, linger):
    for skipper in sorted({0, n // 2, n - 1}):
        obs = _skip_twin(n, skipper, linger)
        b = blame(R.collective_counts, obs)
        assert (list(b.culprits), b.step, b.ambiguous) == ([skipper], 4, False)
        # A skipper whose process ended while the others waited (it
        # returned and exited mid-run) is named as the one that left.
        assert decided_by(obs) == ("collective_counts" if linger else "left_early")
        assert diagnose(obs).culprits == (skipper,)


def test_collective_counts_name_the_extra_collective_with_two_workers():
    extra = with_ledger(blocked(0, 2), {s: (2 if s == 5 else 1) for s in range(10)}, blocked=True)
    obs = run(extra, with_ledger(returned(1, 2)), ended_by="hang")
    b = blame(R.collective_counts, obs)
    assert (list(b.culprits), b.step, b.ambiguous) == ([0], 5, False)
    assert "launched 2 collectives in step 5, and 1 in each of its other steps" in b.reason


def _ended_early(i: int, n: int, last: int, went_on: bool):
    """Worker ``i`` of ``n`` whose loop ended after step ``last`` with one
    collective more there (its epoch's end), blocked in it; or one that
    went on to the next step, blocked there (``went_on``)."""
    steps = range(last + 2) if went_on else range(last + 1)
    per_step = {s: (2 if (s == last and not went_on) else 1) for s in steps}
    return with_ledger(blocked(i, n, steps=steps), per_step, blocked=True)


def test_a_loop_ended_a_step_early_against_a_peer_that_went_on_cannot_tell_at_two():
    """Uneven data (one worker's epoch a batch shorter) and a skipped step
    look the same with 2 workers: the one whose last step holds its loop's
    end, or the peer with a step more."""
    obs = run(_ended_early(0, 2, 7, went_on=False), _ended_early(1, 2, 7, went_on=True),
              ended_by="hang")
    b = blame(R.collective_counts, obs)
    assert (list(b.culprits), b.step, b.ambiguous) == ([0, 1], 7, True)
    assert "worker 0 ended its loop after step 7" in b.reason
    assert "worker 1 went on to step 8" in b.reason


def test_from_three_workers_the_loop_that_ended_alike_is_the_majority():
    obs = run(_ended_early(0, 3, 7, went_on=False), _ended_early(1, 3, 7, went_on=True),
              _ended_early(2, 3, 7, went_on=False), ended_by="hang")
    b = blame(R.collective_counts, obs)
    assert (list(b.culprits), b.ambiguous) == ([1], False)
    one_short = run(_ended_early(0, 3, 7, went_on=False), _ended_early(1, 3, 7, went_on=True),
                    _ended_early(2, 3, 7, went_on=True), ended_by="hang")
    b = blame(R.collective_counts, one_short)
    assert (list(b.culprits), b.ambiguous) == ([0], False)


def test_an_extra_collective_in_the_last_step_is_named_when_no_peer_went_on():
    extra = with_ledger(blocked(0, 2), {s: (2 if s == 9 else 1) for s in range(10)},
                        blocked=True)
    obs = run(extra, with_ledger(returned(1, 2)), ended_by="hang")
    b = blame(R.collective_counts, obs)
    assert (list(b.culprits), b.step, b.ambiguous) == ([0], 9, False)


def test_collective_counts_without_steps_cannot_tell_at_two_and_use_the_majority_from_three():
    two = run(with_ledger(blocked(0, 2, events=events([], 2)), calls_without_steps=10,
                          blocked=True),
              with_ledger(returned(1, 2, steps=[]), calls_without_steps=9), ended_by="hang")
    b = blame(R.collective_counts, two)
    assert b.ambiguous and sorted(b.culprits) == [0, 1]
    waiting = [with_ledger(blocked(i, 3, events=events([], 3)), calls_without_steps=10,
                           blocked=True) for i in (0, 2)]
    three = run(waiting[0], with_ledger(returned(1, 3, steps=[]), calls_without_steps=9),
                waiting[1], ended_by="hang")
    b = blame(R.collective_counts, three)
    assert (list(b.culprits), b.ambiguous) == ([1], False)


def test_collective_counts_pass_when_the_ledgers_agree_or_are_missing():
    agree = run(with_ledger(blocked(0, 2)), with_ledger(blocked(1, 2)), ended_by="hang")
    assert blame(R.collective_counts, agree) is None
    assert blame(R.collective_counts, run(blocked(0, 2), blocked(1, 2), ended_by="hang")) is None
    # Every worker read a metric at the end of epoch 1: alike, so not a difference.
    epoch = {s: (2 if s == 4 else 1) for s in range(10)}
    alike = run(with_ledger(blocked(0, 2), epoch), with_ledger(blocked(1, 2), epoch),
                ended_by="hang")
    assert blame(R.collective_counts, alike) is None


def test_the_hang_text_says_where_each_worker_waits_from_the_ledger():
    obs = _skip_twin(2, 1, linger=True)
    text = diagnose(obs).text
    assert "in call 10 of `step` (all-reduce float32[1])" in text
    assert "worker 1 never launched call 10 of `step` (all-reduce float32[1]), which worker 0 " \
           "waits in" in text


def test_split_with_two_workers_and_no_hole_is_ambiguous():
    obs = run(blocked(0, 2, steps=range(10)), returned(1, 2, steps=range(10)), ended_by="hang")
    b = blame(R.split, obs)
    assert b.ambiguous and sorted(b.culprits) == [0, 1]
    assert decided_by(obs) == "split"
    assert blame(R.split, run(blocked(0, 2), blocked(1, 2), ended_by="hang")) is None


def test_heartbeat_names_the_task_the_peers_name():
    obs = run(raised(0, 3, "UnavailableError", UNHEALTHY.format(2), 3.0),
              raised(1, 3, "UnavailableError", UNHEALTHY.format(2), 3.1),
              blocked(2, 3, steps=range(4)), ended_by="grace_expired")
    assert list(blame(R.heartbeat, obs).culprits) == [2]
    assert decided_by(obs) == "heartbeat"
    assert blame(R.heartbeat, run(blocked(0, 2), blocked(1, 2), ended_by="hang")) is None


def test_one_leader_naming_a_peer_that_raised_on_its_own_heartbeats_cannot_tell():
    """2 workers, the link between them cut: the leader names worker 1, and
    worker 1 raises on its own heartbeats: a cut-off leader would read the
    same.  With a second peer naming worker 1 too (3 workers), it is named."""
    heartbeat_rpc = "Deadline Exceeded\nRPC: /tensorflow.CoordinationService/Heartbeat"
    two = run(raised(0, 2, "UnavailableError", UNHEALTHY.format(1), 9.0, steps=range(6)),
              raised(1, 2, "DeadlineExceededError", heartbeat_rpc, 9.1, steps=range(6)),
              ended_by="all_finished")
    b = blame(R.heartbeat, two)
    assert (sorted(b.culprits), b.ambiguous) == ([0, 1], True)
    assert "either side may have lost the link" in b.reason
    three = run(raised(0, 3, "UnavailableError", UNHEALTHY.format(2), 9.0, steps=range(6)),
                raised(1, 3, "UnavailableError", UNHEALTHY.format(2), 9.0, steps=range(6)),
                raised(2, 3, "DeadlineExceededError", heartbeat_rpc, 9.1, steps=range(6)))
    assert (list(blame(R.heartbeat, three).culprits), blame(R.heartbeat, three).ambiguous) == (
        [2], False)


def test_outside_tensorflow_names_the_worker_not_in_a_tensorflow_call():
    obs = run(blocked(0, 2, stack=STACK_TF), blocked(1, 2, stack=STACK_SLEEP), ended_by="hang")
    assert list(blame(R.outside_tensorflow, obs).culprits) == [1]
    assert decided_by(obs) == "outside_tensorflow"
    assert blame(R.outside_tensorflow, run(blocked(0, 2), blocked(1, 2), ended_by="hang")) is None


def test_no_evidence_when_every_error_is_an_echo_names_every_raiser():
    # Who raised first is a matter of milliseconds, not evidence.
    obs = run(raised(0, 2, "CancelledError", "Collective ops is aborted by: x", 2.0),
              raised(1, 2, "CancelledError", "Collective ops is aborted by: y", 1.0))
    b = blame(R.no_evidence, obs)
    assert b.ambiguous and sorted(b.culprits) == [0, 1]
    assert decided_by(obs) == "no_evidence"


def test_no_evidence_names_everyone_unfinished_and_says_it_cannot_tell():
    obs = run(blocked(0, 2), blocked(1, 2), ended_by="hang")
    b = blame(R.no_evidence, obs)
    assert b.ambiguous and sorted(b.culprits) == [0, 1]
    assert decided_by(obs) == "no_evidence"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_every_rule_is_a_function_of_facts_that_answers_or_passes(rule):
    # The same quiet run (nobody stands out) through every rule: each either
    # passes or answers with workers that exist.
    obs = run(blocked(0, 2), blocked(1, 2), ended_by="hang")
    found = rule.blame(facts_of(obs))
    assert found is None or set(found.culprits) <= {0, 1}


def test_input_that_ran_out_is_not_the_root_when_a_peer_says_why():
    # FILE auto-sharding with too few files: worker 1 got no file (its
    # StopIteration came first), worker 0 says why.
    obs = run(raised(0, 2, "InvalidArgumentError", "Could not apply FILE based sharding", 1.2),
              raised(1, 2, "StopIteration", "", 1.0))
    v = diagnose(obs)
    assert (v.culprits, v.error, v.rule) == ((0,), "InvalidArgumentError", "root_error")
    # Alone, input that ran out is the cause.
    alone = run(raised(0, 2, "StopIteration", "", 1.0), blocked(1, 2), ended_by="grace_expired")
    assert diagnose(alone).culprits == (0,)


def _shaped(w, shape):
    """``w`` with a ledger of one call of `step` in step 0, whose all-reduce has ``shape``."""
    w = with_ledger(w, {0: 1}, blocked=w.error is None)
    return dataclasses.replace(w, functions=(TracedFunction(0, "step", (
        CollectiveOp("all-reduce", shape, "float32"),)),))


def test_collective_shapes_name_the_odd_shape_from_the_ledgers_from_three_workers():
    # Nobody's error carries the shapes (echoes only); the ledgers do.
    ws = [_shaped(raised(i, 4, "CancelledError", "Collective ops is aborted by: x", 1.0,
                         steps=[0]), (32,) if i == 0 else (16,)) for i in range(4)]
    obs = run(*ws)
    b = blame(R.collective_shapes, obs)
    assert (list(b.culprits), b.step) == ([0], 0)
    assert "all-reduce float32[32]" in b.reason and "float32[16]" in b.reason
    assert decided_by(obs) == "collective_shapes"
    assert blame(R.collective_shapes, run(*ws[:2])) is None    # two: symmetric


def _traced(w, *ops):
    """``w`` whose latest trace of `step` launches ``ops`` (kind, shape)."""
    return dataclasses.replace(w, functions=(TracedFunction(0, "step", tuple(
        CollectiveOp(kind, shape, "float32") for kind, shape in ops)),))


def test_a_worker_that_retraced_a_variable_creating_function_is_not_the_odd_one():
    """The first trace of a function that creates variables broadcasts their
    initial values, the second does not; a ledger keeps the latest.  One
    worker a retrace ahead lists the call's collectives without the
    broadcasts: no disagreement (a throttled link at step 0 of the seed's
    loop, 3 workers, TensorFlow 2.21.0: named the one ahead)."""
    first = (("broadcast", (784, 10)), ("broadcast", (10,)), ("all-reduce", (7960,)))
    ws = [_traced(with_ledger(blocked(i, 4, steps=[0]), {0: 1}, blocked=True),
                  *(first if i != 1 else first[2:])) for i in range(3)]
    assert blame(R.collective_shapes, run(*ws, ended_by="hang")) is None
    # A worker whose trace really differs (another shape) is still named.
    ws[1] = _traced(ws[1], *first[:2], ("all-reduce", (3980,)))
    assert blame(R.collective_shapes, run(*ws, ended_by="hang")).culprits == [1]


def _with_first_step_broadcasts(w, broadcasts=8):
    """``w`` whose step 0 also holds ``broadcasts`` variable initialisations
    outside any function, as Keras 2's optimizer makes them in the first
    call (TensorFlow 2.15.1, measured: 8 on the seed's model)."""
    init = TracedFunction(1, "<eager broadcast>", (CollectiveOp("broadcast", (1,), "float32"),))
    extra = tuple(Call(1, k, 0, began=0.01 + k / 1000, ended=0.02 + k / 1000)
                  for k in range(1, broadcasts + 1))
    return dataclasses.replace(w, functions=w.functions + (init,), calls=extra + w.calls)


@pytest.mark.parametrize("odd_step", [0, 2])
def test_collectives_every_worker_launched_alike_do_not_hide_the_extra_call(odd_step):
    """Both workers' step 0 look unusual (the same broadcasts in it); leaving
    them out, worker 0's extra call of `step` is what stands out."""
    per_step = {s: (2 if s == odd_step else 1) for s in range(5)}
    extra = _with_first_step_broadcasts(with_ledger(blocked(0, 2, steps=range(5)), per_step,
                                                    blocked=True))
    other = _with_first_step_broadcasts(with_ledger(returned(1, 2, steps=range(5))))
    b = blame(R.collective_counts, run(extra, other, ended_by="hang"))
    assert (list(b.culprits), b.step, b.ambiguous) == ([0], odd_step, False), b.reason
    if odd_step == 0:
        assert "of `step` in step 0" in b.reason and "left out" in b.reason


def test_the_ledger_lines_give_one_line_to_workers_waiting_for_the_same_missing_one():
    """Many workers blocked in the call one of them never launched: one line,
    however many wait (at 256 tasks, one, not 255)."""
    from harness.diagnosis.render import ledger_lines
    n = 6
    ws = [with_ledger(blocked(i, n), blocked=True) for i in range(n) if i != 1]
    skipper = with_ledger(returned(1, n), {s: (0 if s == 4 else 1) for s in range(10)})
    lines = [ln for ln in ledger_lines(ws[:1] + [skipper] + ws[1:]) if "never launched" in ln]
    assert lines == ["ledger: worker 1 never launched call 10 of `step` (all-reduce "
                     "float32[1]), which workers 0,2-5 wait in"]


def test_a_worker_still_in_its_own_code_is_not_said_to_have_made_an_extra_call():
    """The others returned after the same steps; its ledger holds no pending
    call: it is in Python after its loop (slow, or stuck there), and the
    verdict says so rather than claim a collective call the ledger lacks."""
    ws = [with_ledger(returned(i, 3, steps=range(6))) for i in (0, 2)]
    slow = with_ledger(blocked(1, 3, steps=range(6), stack=STACK_SLEEP))
    b = blame(R.majority, run(ws[0], slow, ws[1], ended_by="hang"))
    assert list(b.culprits) == [1]
    assert "in no collective call" in b.reason and "extra" not in b.reason
    # With a call pending, the extra call is what the ledger shows.
    extra = with_ledger(blocked(1, 3, steps=range(6)), {s: 1 for s in range(6)} | {5: 2},
                        blocked=True)
    b = blame(R.majority, run(ws[0], extra, ws[1], ended_by="hang"))
    assert "made a collective call they did not" in b.reason


def test_a_worker_a_retrace_ahead_launched_no_fewer_collectives_in_its_step():
    """The same retrace, read by the per-step counts: 2 collectives in step 0
    against the others' 10 was the retraced worker's latest trace, not
    fewer launches (4 workers, a throttled link, TensorFlow 2.21.0)."""
    first = (("broadcast", (784, 10)),) * 8 + (("all-reduce", (7960,)), ("all-reduce", (1,)))
    ws = [_traced(with_ledger(blocked(i, 4, steps=[0]), {0: 1}, blocked=True),
                  *(first if i != 2 else first[8:])) for i in range(4)]
    v = diagnose(run(*ws, ended_by="hang"))
    assert v.culprits != (2,) and v.rule != "collective_counts", v.text


def test_the_tables_docstring_lists_every_rule_in_the_tables_order():
    """The docstring of harness.diagnosis.rules says the order of trust; it
    must be the table's, every row named once."""
    import re

    from harness.diagnosis import rules
    named = [n for n in re.findall(r"``(\w+)``", rules.__doc__) if n in rules.RULE]
    assert named == [r.name for r in rules.RULES]
