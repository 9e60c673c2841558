"""Restarts and preemption without TensorFlow: the fault plan per attempt,
the settings, and how attempts make one result."""
import dataclasses
import signal

import pytest

from harness import faults as F
from harness import plan as plan_module
from harness.controller import combine_attempts
from harness.diagnosis import diagnose
from harness.errors import FaultError, SettingError
from harness.result import RunResult
from harness.settings import parse_marker
from harness.validators import MAX_RESTARTS, parse_restart_on, parse_restarts
from observations import died, returned, run

pytestmark = pytest.mark.timeout(30)


def test_attempt_is_keyword_only_and_prints_only_when_not_the_first():
    assert repr(F.Crash(1, 3)) == "Crash(worker=1, step=3, how='exit')"
    f = F.Crash(1, 3, attempt=1)
    assert repr(f) == "Crash(worker=1, step=3, how='exit', attempt=1)"
    assert eval(repr(f), vars(F)) == f and f != F.Crash(1, 3)
    with pytest.raises(TypeError):
        F.Crash(1, 3, "exit", 1)


@pytest.mark.parametrize("fault, restarts, message", [
    (F.Crash(0, 1, attempt=1), 0, "attempt 1 never runs"),
    (F.Crash(0, 1, attempt=-1), 3, "attempt -1 never runs"),
    (F.SkipStep(0, 1, attempt=True), 3, "attempt True"),
    (F.Preempt(0, 1, grace=-1), 0, "grace must be 0 or more"),
    (F.Preempt(0, 1, grace="soon"), 0, "grace must be a number"),
])
def test_bad_attempts_and_preemptions_are_rejected(fault, restarts, message):
    with pytest.raises(FaultError, match=message):
        plan_module.validate([fault], 2, restarts)


def test_a_bad_config_per_worker_per_attempt():
    plan = [F.BadTFConfig(1, "missing"), F.BadTFConfig(1, "missing", attempt=1)]
    assert plan_module.validate(plan, 2, restarts=1) == tuple(plan)
    with pytest.raises(FaultError, match="already has a BadTFConfig in attempt 1"):
        plan_module.validate(plan + [F.BadTFConfig(1, "wrong_port", attempt=1)], 2, restarts=1)
    assert plan_module.in_attempt(plan, 1) == (plan[1],)


def test_what_the_parent_sends_after_each_fault():
    assert F.Preempt(0, 2).parent_signals(5.0) == ((5.0, signal.SIGKILL),)
    assert F.Preempt(0, 2, grace=0.5).parent_signals(5.0) == ((0.5, signal.SIGKILL),)
    assert F.Pause(0, 2, 1.5).parent_signals(5.0) == ((1.5, signal.SIGCONT),)
    assert F.Pause(0, 2).parent_signals(5.0) == ()
    assert F.Crash(0, 2).parent_signals(5.0) == ()


@pytest.mark.parametrize("value, expected", [(0, 0), ("3", 3), (" 2 ", 2), (MAX_RESTARTS, MAX_RESTARTS)])
def test_parse_restarts(value, expected):
    assert parse_restarts(value) == expected


@pytest.mark.parametrize("value", [-1, "1.5", "x", True, MAX_RESTARTS + 1])
def test_parse_restarts_rejects(value):
    with pytest.raises(SettingError, match="--mwms-restarts"):
        parse_restarts(value)


def test_parse_restart_on():
    assert parse_restart_on("crash,fail") == {"crashed", "failed"}
    assert parse_restart_on(["hang", "crash"]) == {"hang", "crashed"}
    assert parse_restart_on(" Crash , HANG ") == {"crashed", "hang"}
    for bad in ("crashed", "", "crash,,", "timeout"):
        with pytest.raises(SettingError, match="restart_on"):
            parse_restart_on(bad)


def test_the_marker_takes_restarts():
    assert parse_marker({"restarts": 2}) == {"restarts": 2}
    with pytest.raises(SettingError, match=r"mwms\(restarts=\.\.\.\)"):
        parse_marker({"restarts": -1})


# ---------------------------------------------------------------- attempts

def _result(obs, attempt, never=()):
    v = dataclasses.replace(diagnose(obs), faults_never_acted=never)
    return RunResult(workers=(), duration=obs.duration, observation=obs, verdict=v,
                     attempt=attempt)


CRASHED = run(returned(0, 2), died(1, 2, 1, 3.0))
COMPLETED = run(returned(0, 2), returned(1, 2))


def test_the_result_is_the_last_attempts_and_tells_the_story():
    first, second = _result(CRASHED, 0), _result(COMPLETED, 1)
    r = combine_attempts([first, second], [F.Crash(1, 3)], 12.5)
    assert (r.outcome, r.culprits, r.attempt, r.restarts, r.duration) == (
        "completed", (), 1, 1, 12.5)
    assert r.attempts == (first, second) and r.attempts[0].culprits == (1,)
    lines = r.diagnosis.splitlines()
    assert lines[0] == "COMPLETED after 1 restart: attempt 0 CRASHED, attempt 1 COMPLETED"
    assert lines[1] == "--- attempt 1 (last) ---"
    assert "--- attempt 0 ---" in lines and any("died" in ln for ln in lines)


def test_one_attempt_is_its_own_story():
    only = _result(COMPLETED, 0)
    r = combine_attempts([only], [], 3.0)
    assert r.diagnosis == only.diagnosis and r.attempts == (only,) and r.restarts == 0


def test_a_fault_for_an_attempt_that_never_ran_fails_the_run():
    fault = F.Crash(1, 3, attempt=1)
    r = combine_attempts([_result(COMPLETED, 0)], [fault], 3.0)
    assert r.outcome == "failed"
    assert r.faults_never_acted == ((repr(fault), "attempt 1 never ran: the run ended after "
                                     "attempt 0 (completed)"),)
    assert r.diagnosis.startswith(f"FAILED: {fault!r} never acted: attempt 1 never ran")


def test_faults_that_never_acted_in_an_earlier_attempt_are_kept():
    never = (("SkipStep(worker=0, step=50)", "worker 0 never reached step 50"),)
    r = combine_attempts([_result(CRASHED, 0, never), _result(COMPLETED, 1)], [], 3.0)
    assert r.faults_never_acted == never


@pytest.mark.parametrize("kwargs", [
    {"on_return": "leave"}, {"progress": 3}, {"restart_on": "crashed"}, {"restarts": -1},
    {"check_replicas": "yes"}, {"reference": -1}, {"timeout": 0}, {"grace": "soon"},
    {"ledger": "everything"}, {"step_fn": ""}, {"env": {"TF_CONFIG": "{}"}}, {"env": {"A": 1}},
], ids=lambda kwargs: next(iter(kwargs)))
def test_bad_run_arguments_fail_before_any_process_starts(kwargs):
    """Each is a SettingError naming the argument, raised by the request's
    validators: no port is reserved and no process started."""
    from harness.controller import Cluster
    from harness.settings import RunSettings
    name = next(iter(kwargs))
    with pytest.raises(SettingError, match=rf"run\({name}=\.\.\.\)"):
        Cluster(RunSettings()).run(lambda: None, **kwargs)


def test_every_checked_argument_of_run_has_one_validator():
    import inspect
    from harness.controller import Cluster
    from harness.controller.request import VALIDATORS
    given_whole = {"self", "fn", "args", "kwargs", "faults", "sync_check", "env"}
    assert set(inspect.signature(Cluster.run).parameters) - given_whole == set(VALIDATORS)
