"""Unit tests of :mod:`harness.diagnosis` on hand-built observations.

No process, no TensorFlow: each test builds a ``RunObservation`` the way the
controller would record it for one fault, and checks the verdict.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.diagnosis import OUTCOMES, Verdict, diagnose, is_echo, summarize_stack
from harness.core.protocol import WorkerError
from harness.diagnosis.observations import Event, RunObservation, WorkerObservation
from observations import (HOST, SKIP5, STACK_CREATE, STACK_SLEEP, STACK_TF, UNHEALTHY, blocked,
                          config, died, events, raised, returned, run, shape_error)

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- outcomes

def test_completed():
    v = diagnose(run(*(returned(i, 3) for i in range(3))))
    assert (v.outcome, v.culprits, v.step, v.error, v.ambiguous) == ("completed", (), None, None, False)
    assert v.text.startswith("COMPLETED: all 3 workers returned")
    assert OUTCOMES == ("completed", "failed", "crashed", "hang", "crashed_at_exit")


@pytest.mark.parametrize("echo_first", [False, True])
def test_failed_root_beats_echoes_whatever_the_timing(echo_first):
    # An echo stamped before the root error (clock noise) is still an echo.
    t_root, t_echo = (5.0, 4.99) if echo_first else (1.0, 11.0)
    v = diagnose(run(
        raised(0, 3, "UnavailableError", UNHEALTHY.format(1), t_echo),
        raised(1, 3, "ValueError", "boom\nmore", t_root,
               tb='Traceback (most recent call last):\n  File "/work/main/scenarios/t.py", line 7, in train\n'),
        raised(2, 3, "UnavailableError", "Collective ops is aborted by: ...", t_echo),
        ended_by="grace_expired"))
    assert (v.outcome, v.culprits, v.error) == ("failed", (1,), "ValueError")
    head = v.text.splitlines()[0]
    assert head.startswith("FAILED: worker 1 raised ValueError: boom (root error")
    assert "workers 0,2 reported it as UnavailableError" in head
    assert "root error: ValueError: boom at t.py:7" in v.text


def test_same_error_everywhere_blames_all():
    msg = "'ReplicaContext' object has no attribute 'is_chief'"
    v = diagnose(run(*(raised(i, 3, "AttributeError", msg, 1.0 + i / 100) for i in range(3))))
    assert (v.outcome, v.culprits, v.error) == ("failed", (0, 1, 2), "AttributeError")


def test_crash_sigkill_with_late_echoes():
    v = diagnose(run(died(0, 3, -9, 3.0, steps=range(4)),
                     raised(1, 3, "UnavailableError", UNHEALTHY.format(0), 13.0),
                     raised(2, 3, "UnavailableError", UNHEALTHY.format(0), 13.1)))
    assert (v.outcome, v.culprits, v.step, v.error) == ("crashed", (0,), 3, None)
    assert v.text.splitlines()[0].startswith("CRASHED: worker 0 died (exit code -9, SIGKILL) at step 3")
    assert "10.0s later" in v.text.splitlines()[0]


def test_crash_exit_1_before_any_step():
    w0 = died(0, 2, 1, 0.5, events=events(creating_only=True))
    v = diagnose(run(w0, blocked(1, 2, events=events(creating_only=True), stack=STACK_CREATE),
                     ended_by="grace_expired"))
    assert (v.outcome, v.culprits, v.step) == ("crashed", (0,), None)
    assert "exit code 1) in strategy creation" in v.text


def test_sys_exit_3_without_final_message_is_a_crash():
    v = diagnose(run(returned(0, 2), died(1, 2, 3, 1.5, steps=range(10))))
    assert (v.outcome, v.culprits) == ("crashed", (1,))
    assert "exit code 3" in v.text


def test_death_after_a_peers_error_is_a_consequence():
    # Worker 1's user code exits on TensorFlow's echo, 10 s after the root error.
    v = diagnose(run(raised(0, 2, "ValueError", "boom", 1.0), died(1, 2, 1, 11.0)))
    assert (v.outcome, v.culprits, v.error) == ("crashed", (0,), "ValueError")


def test_independent_simultaneous_deaths_are_both_blamed():
    v = diagnose(run(died(0, 3, -9, 3.0), died(1, 3, -9, 3.2),
                     raised(2, 3, "UnavailableError", UNHEALTHY.format(0), 13.0)))
    assert (v.outcome, v.culprits) == ("crashed", (0, 1))


# ---------------------------------------------------------------- hangs

def test_hang_stopped_worker():
    stopped = WorkerObservation(0, config(0, 2), events(range(4), 2), stopped=True)
    v = diagnose(run(stopped, blocked(1, 2, steps=range(5)), ended_by="hang"))
    assert (v.outcome, v.culprits, v.step) == ("hang", (0,), 3)
    assert "worker 0: stopped (SIGSTOP) at step 3, no stack" in v.text


@pytest.mark.parametrize("n,skipper", [(3, 1), (4, 2), (4, 0)])
def test_hang_skipper_finished_while_others_block(n, skipper):
    ws = [returned(i, n, steps=SKIP5) if i == skipper else blocked(i, n) for i in range(n)]
    v = diagnose(run(*ws, ended_by="hang"))
    assert (v.outcome, v.culprits, v.step, v.ambiguous) == ("hang", (skipper,), 9, False)
    head = v.text.splitlines()[0]
    assert head.startswith(f"HANG: no progress for 10.0s; culprit: worker {skipper} "
                           "(missing from the collective at step 9: it finished after 9 steps")
    assert "skipping step 5" in head


def test_hang_two_workers_same_steps_is_ambiguous():
    # A user's loop that reports every step but skips the collective in one
    # of them: both records are the same, so two workers are symmetric.
    v = diagnose(run(blocked(0, 2), returned(1, 2), ended_by="hang"))
    assert (v.outcome, v.culprits, v.ambiguous, v.step) == ("hang", (0, 1), True, 9)
    assert ("with 2 workers it cannot tell a skipped step on one from an extra "
            "collective on the other") in v.text
    assert "worker 0 ran 10 steps (0-9)" in v.text


@pytest.mark.parametrize("n", [2, 3])
def test_extra_collective_leaves_the_odd_one_blocked(n):
    # Same steps everywhere; worker 0 made an extra all-reduce and waits at the end.
    ws = [blocked(0, n)] + [returned(i, n) for i in range(1, n)]
    v = diagnose(run(*ws, ended_by="hang"))
    assert v.outcome == "hang"
    if n == 2:
        assert (v.culprits, v.ambiguous) == ((0, 1), True)
    else:
        assert (v.culprits, v.ambiguous, v.step) == ((0,), False, 9)
        assert "extra all-reduce" in v.text


def test_hang_worker_behind_two_workers():
    v = diagnose(run(blocked(0, 2, steps=range(4), stack=STACK_SLEEP),
                     blocked(1, 2, steps=range(5)), ended_by="hang"))
    assert (v.culprits, v.step, v.ambiguous) == ((0,), 3, False)
    assert "behind" in v.text


def test_hang_pause_in_user_code_found_by_stack():
    v = diagnose(run(blocked(0, 3), blocked(1, 3, stack=STACK_SLEEP), blocked(2, 3),
                     ended_by="hang"))
    assert (v.culprits, v.ambiguous) == ((1,), False)
    assert "not in TensorFlow" in v.text


def test_hang_with_no_evidence_is_ambiguous():
    v = diagnose(run(blocked(0, 2), blocked(1, 2), ended_by="hang"))
    assert (v.outcome, v.culprits, v.ambiguous) == ("hang", (0, 1), True)


def test_all_echo_failure_uses_structure_then_heartbeat_names():
    # N=3 skipper returned and exited; the others got UnavailableError at step 9.
    ws = [raised(0, 3, "UnavailableError", UNHEALTHY.format(1), 12.0, steps=range(10)),
          returned(1, 3, steps=SKIP5),
          raised(2, 3, "UnavailableError", UNHEALTHY.format(1), 12.0, steps=range(10))]
    v = diagnose(run(*ws))
    assert (v.outcome, v.culprits, v.error) == ("failed", (1,), "UnavailableError")
    # Network cut: same steps everywhere; the peers name the cut-off task.
    ws = [raised(0, 3, "UnavailableError", UNHEALTHY.format(2), 9.0),
          raised(1, 3, "UnavailableError", UNHEALTHY.format(2), 9.1),
          raised(2, 3, "DeadlineExceededError", "coordination heartbeat timed out", 8.9)]
    assert diagnose(run(*ws)).culprits == (2,)


# ---------------------------------------------------------------- config

def test_missing_tf_config_worker_trains_alone():
    n = 3
    alone = WorkerObservation(1, None, events(range(10), n, created=1, done=True),
                              returned=True, finish_time=2.0, exit_code=0, exit_time=2.1)
    ws = [blocked(i, n, events=events(creating_only=True), stack=STACK_CREATE) for i in (0, 2)]
    v = diagnose(run(ws[0], alone, ws[1], ended_by="hang"))
    assert (v.outcome, v.culprits, v.ambiguous) == ("hang", (1,), False)
    assert "TF_CONFIG missing" in v.text and "1 replica" in v.text
    assert "workers 0,2: blocked in strategy creation: make_strategy at test_config.py:12;" in v.text


def test_duplicate_index_blames_the_impostor():
    n = 2
    v = diagnose(run(blocked(0, n, events=events(creating_only=True), stack=STACK_CREATE),
                     raised(1, n, "UnknownError", "Could not start gRPC server", 1.0,
                            tf_config=config(0, n), events=events(creating_only=True))))
    assert (v.outcome, v.culprits, v.error) == ("failed", (1,), "UnknownError")
    assert "claims task index 0, which worker 0 also claims" in v.text


def test_wrong_cluster_size_blames_the_disagreeing_worker():
    n = 2
    msg = "/job:worker/replica:0/task:0 is joining a group with size 2, but that group has size 3"
    v = diagnose(run(raised(0, n, "InternalError", msg, 1.0, events=events(creating_only=True)),
                     raised(1, n, "InternalError", msg, 1.1, tf_config=config(1, 3),
                            events=events(creating_only=True))))
    assert (v.outcome, v.culprits, v.error) == ("failed", (1,), "InternalError")
    assert "its TF_CONFIG cluster lists 3 workers, the others' 2" in v.text


def test_swapped_order_both_claiming_index_0():
    n = 2
    swapped = {"cluster": {"worker": [f"{HOST}:20001", f"{HOST}:20000"]},
               "task": {"type": "worker", "index": 0}}
    v = diagnose(run(blocked(0, n, events=events(creating_only=True)),
                     blocked(1, n, events=events(creating_only=True), tf_config=swapped),
                     ended_by="hang"))
    assert (v.outcome, v.culprits, v.ambiguous) == ("hang", (1,), False)
    assert "reordered" in v.text


def test_wrong_port_majority_and_tie():
    bad = config(2, 3, [20000, 20001, 29999])
    v = diagnose(run(blocked(0, 3, events=events(creating_only=True)),
                     blocked(1, 3, events=events(creating_only=True)),
                     blocked(2, 3, events=events(creating_only=True), tf_config=bad),
                     ended_by="hang"))
    assert (v.culprits, v.ambiguous) == ((2,), False)
    assert "port 29999 instead of 20002 for task 2" in v.text
    # Two workers, two lists, nothing to prefer one: say so.
    v = diagnose(run(blocked(0, 2), blocked(1, 2, tf_config=config(1, 2, [20000, 29999])),
                     ended_by="hang"))
    assert (v.culprits, v.ambiguous) == ((0, 1), True)


def test_config_does_not_override_a_crash():
    v = diagnose(run(died(0, 2, -11, 1.0), blocked(1, 2, tf_config=None)))
    assert (v.outcome, v.culprits) == ("crashed", (0,))
    assert "SIGSEGV" in v.text and "TF_CONFIG missing" in v.text


# ---------------------------------------------------------------- stacks and text

def test_stack_grouping_text():
    ws = [blocked(0, 3, steps=range(20)), returned(1, 3, steps=range(19)),
          blocked(2, 3, steps=range(20))]
    text = diagnose(run(*ws, ended_by="hang")).text
    assert ("workers 0,2: blocked at step 19: train at test_steps.py:23 "
            "(in a TensorFlow op)") in text
    assert "worker 1: returned" in text
    assert len(text.splitlines()) <= 40


@pytest.mark.parametrize("stack,expected", [
    (STACK_TF, "train at test_steps.py:23 (in a TensorFlow op)"),
    (STACK_CREATE, "make_strategy at test_config.py:12 (in strategy creation)"),
    (STACK_SLEEP, "train at test_pause.py:31"),
    ('  File "/x/site-packages/tensorflow/ops/collective_ops.py", line 3 in all_reduce\n'
     '  File "/w/t.py", line 9 in f\n', "f at t.py:9 (in all_reduce)"),
    ("", "no stack"),
    ("garbage\n\x00 Thread (most recent call first):\n  File \"", "stack unreadable"),
])
def test_summarize_stack(stack, expected):
    assert summarize_stack(stack) == expected


@pytest.mark.parametrize("stack", ["", "Current thread 0x1 (most recent call first):\n",
                                   "  File \"x\", line ??? in <module>\n", "\n\n\x7f" * 50])
def test_garbled_stack_does_not_crash(stack):
    v = diagnose(run(blocked(0, 2, stack=stack), blocked(1, 2, stack=stack), ended_by="hang"))
    assert v.outcome == "hang" and v.culprits


def test_injected_faults_are_listed_not_used():
    w1 = blocked(1, 2, events=events(range(5), 2, faults=[(3, "Kill(step=3)")]))
    v = diagnose(run(blocked(0, 2, steps=range(5)), w1, ended_by="hang"))
    assert "injected: worker 1 at step 3: Kill(step=3)" in v.text
    assert v.ambiguous   # a fault event alone is no evidence


@pytest.mark.parametrize("type_name,message,echo", [
    ("UnavailableError", "anything", True),
    ("tensorflow.python.framework.errors_impl.CancelledError", "", True),
    ("DeadlineExceededError", "Collective has timed out during execution", True),
    ("DeadlineExceededError", "user deadline", False),
    ("InternalError", "[_Derived_]Collective ops is aborted by: x", True),
    ("InternalError", "task:1 is joining a group with size 2 [_Derived_]", False),
    ("ValueError", "boom", False),
])
def test_is_echo(type_name, message, echo):
    assert is_echo(WorkerError(type_name, message)) is echo


def test_round_trip_gives_the_same_verdict():
    obs = run(raised(0, 3, "UnavailableError", UNHEALTHY.format(1), 12.0, steps=range(10)),
              returned(1, 3, steps=SKIP5),
              blocked(2, 3, stack=STACK_TF, events=events(range(10), 3, faults=[(2, "X()")])),
              ended_by="grace_expired")
    assert diagnose(RunObservation.from_dict(obs.to_dict())) == diagnose(obs)


def test_no_tensorflow_import():
    code = ("import sys, harness.diagnosis, harness.diagnosis.observations; "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                   env={"PYTHONPATH": str(ROOT), "PATH": ""}, timeout=30)


# ---------------------------------------------------------------- property

ERRORS = [None, WorkerError("ValueError", "boom"), WorkerError("UnavailableError", UNHEALTHY.format(0)),
          WorkerError("InternalError", "is joining a group with"), WorkerError("", "")]
STACKS = ["", STACK_TF, STACK_CREATE, STACK_SLEEP, "junk\nFile"]
KINDS = ["started", "strategy_creating", "strategy_created", "step", "steps_done", "fault", "odd"]
EVENT = st.builds(Event, time=st.floats(0, 30), kind=st.sampled_from(KINDS),
                  step=st.one_of(st.none(), st.integers(-1, 6)),
                  data=st.one_of(st.none(), st.integers(0, 3), st.text(max_size=3)))
TIME = st.one_of(st.none(), st.floats(0, 30))


@st.composite
def observations(draw):
    n = draw(st.integers(1, 4))
    cfgs = [config(0, n), config(1, n), config(0, n + 1), None, {"cluster": 5}, "not json", {}]
    ws = []
    for i in range(n):
        ws.append(WorkerObservation(
            index=i, tf_config=draw(st.sampled_from(cfgs + [config(i, n)] * 3)),
            events=tuple(draw(st.lists(EVENT, max_size=6))), returned=draw(st.booleans()),
            error=draw(st.sampled_from(ERRORS)), finish_time=draw(TIME),
            exit_code=draw(st.sampled_from([None, 0, 1, 3, -9, -19, -200])), exit_time=draw(TIME),
            killed_by_harness=draw(st.booleans()), stopped=draw(st.booleans()),
            stack=draw(st.sampled_from(STACKS))))
    return RunObservation(n, 10.0, 5.0, draw(st.sampled_from(["all_finished", "hang", "grace_expired",
                                                       "deadlock"])),
                          20.0, tuple(ws))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(observations())
def test_property_precedence_and_culprits(obs):
    v = diagnose(obs)
    ws = obs.workers
    if any(w.died for w in ws):
        expected = "crashed"
    elif any(w.error is not None for w in ws):
        expected = "failed"
    elif obs.ended_by in ("hang", "deadlock") or not all(w.returned for w in ws):
        expected = "hang"
    elif any(w.died_at_exit for w in ws):
        expected = "crashed_at_exit"
    else:
        expected = "completed"
    assert isinstance(v, Verdict) and v.outcome == expected
    assert set(v.culprits) <= set(range(obs.num_workers))
    assert list(v.culprits) == sorted(set(v.culprits))
    assert bool(v.culprits) == (expected != "completed")
    assert v.text and len(v.text.splitlines()) <= 40


@pytest.mark.parametrize("n", [3, 4])
def test_shape_mismatch_names_the_odd_shape_when_it_did_not_raise(n):
    # Workers 1..n-1 noticed; worker 0 (batch 4 instead of 8) was killed blocked.
    ws = [blocked(0, n, steps=[0])] + [
        WorkerObservation(i, tf_config=config(i, n), events=events([0], n),
                          error=shape_error(i, "[8]", "[4]"), finish_time=0.5 + i / 10,
                          exit_code=1) for i in range(1, n)]
    v = diagnose(run(*ws, ended_by="grace_expired"))
    assert (v.outcome, v.culprits, v.ambiguous) == ("failed", (0,), False)
    assert "shape" in v.text.splitlines()[0].lower()


def test_shape_mismatch_names_the_odd_shape_among_raisers():
    ws = [WorkerObservation(i, tf_config=config(i, 4), events=events([0], 4),
                            error=shape_error(i, "[]" if i == 0 else "[10]", "[10]" if i == 0
                                               else "[]"), finish_time=1.0 - i / 10, exit_code=1)
          for i in range(4)]
    v = diagnose(run(*ws))
    assert (v.outcome, v.culprits) == ("failed", (0,))


def test_shape_mismatch_with_two_workers_leaves_it_to_the_other_rules():
    # Symmetric: the shape rule gives no verdict, and nothing else tells
    # which of the two made the odd collective: it cannot tell.
    ws = [WorkerObservation(0, tf_config=config(0, 2), events=events([0], 2),
                            error=shape_error(0, "[1]", "[8]"), finish_time=0.4, exit_code=1),
          WorkerObservation(1, tf_config=config(1, 2), events=events([0, 1], 2),
                            error=shape_error(0, "[1]", "[8]"), finish_time=0.5, exit_code=1)]
    v = diagnose(run(*ws))
    assert (v.outcome, v.culprits, v.ambiguous) == ("failed", (0, 1), True)
