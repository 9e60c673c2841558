"""Each row of the diagnosis's rule table on its own: when it answers, whom it
names, and when it passes.  Fast, no TensorFlow.

Every rule is called directly on the facts of a hand-built run, so a rule is
shown to answer (or pass) by itself, whatever the rows before it would say;
then ``diagnose`` is asked which rule decided, so the order of the table is
covered too.
"""
from __future__ import annotations

import pytest

from harness.diagnosis import RULES, diagnose
from harness.diagnosis import rules as R
from harness.diagnosis.facts import SITUATIONS, facts_of
from harness.errors import StepDesyncError
from harness.protocol import WorkerError
from harness.record import WorkerObservation
from observations import (SKIP5, STACK_SLEEP, STACK_TF, UNHEALTHY, blocked, config, died,
                          events, raised, returned, run, shape_error)


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
        assert last.name in ("nothing_to_blame", "crash", "root_error", "no_evidence"), situation


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


def test_behind_names_the_worker_whose_progress_stopped_first():
    obs = run(blocked(0, 2, steps=range(9)), blocked(1, 2, steps=range(10)), ended_by="hang")
    assert list(blame(R.behind, obs).culprits) == [0]
    assert decided_by(obs) == "behind"
    # Someone finished: not a question of who is behind.
    assert blame(R.behind, run(blocked(0, 2), returned(1, 2), ended_by="hang")) is None


def test_skipped_step_names_the_worker_with_a_hole():
    obs = run(blocked(0, 2, steps=range(10)), returned(1, 2, steps=SKIP5, asked=10),
              ended_by="hang")
    b = blame(R.skipped_step, obs)
    assert list(b.culprits) == [1] and "skipped step 5" in b.reason
    assert decided_by(obs) == "skipped_step"
    same = run(blocked(0, 2, steps=range(10)), returned(1, 2, steps=range(10)), ended_by="hang")
    assert blame(R.skipped_step, same) is None


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


def test_outside_tensorflow_names_the_worker_not_in_a_tensorflow_call():
    obs = run(blocked(0, 2, stack=STACK_TF), blocked(1, 2, stack=STACK_SLEEP), ended_by="hang")
    assert list(blame(R.outside_tensorflow, obs).culprits) == [1]
    assert decided_by(obs) == "outside_tensorflow"
    assert blame(R.outside_tensorflow, run(blocked(0, 2), blocked(1, 2), ended_by="hang")) is None


def test_raised_first_when_every_error_is_an_echo():
    obs = run(raised(0, 2, "CancelledError", "Collective ops is aborted by: x", 2.0),
              raised(1, 2, "CancelledError", "Collective ops is aborted by: y", 1.0))
    assert list(blame(R.raised_first, obs).culprits) == [1]
    assert decided_by(obs) == "raised_first"
    assert blame(R.raised_first, run(blocked(0, 2), blocked(1, 2), ended_by="hang")) is None


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
