"""The certain-deadlock proof (harness.diagnosis.deadlock), on hand-made ledgers."""
from __future__ import annotations

import dataclasses

import pytest

from harness.diagnosis import diagnose
from harness.diagnosis.deadlock import SETTLE, CertainDeadlock, certain_deadlock
from harness.diagnosis.observations import (Call, CollectiveOp, RunObservation, TracedFunction,
                                            WorkerObservation)

STEP = TracedFunction(0, "step", (CollectiveOp("all-reduce", (1,), "float32"),))


def worker(index, calls, pending=False, returned_at=None, **changes):
    """A worker that made ``calls`` calls of `step` (one per step, 0.1 s
    apart), the last one not ended when ``pending``; returned at
    ``returned_at`` when given."""
    made = tuple(Call(0, k, k - 1, began=k / 10, ended=None if pending and k == calls
                      else k / 10 + 0.05) for k in range(1, calls + 1))
    w = WorkerObservation(index=index, functions=(STEP,), calls=made, ledger="calls",
                          returned=returned_at is not None, finish_time=returned_at)
    return dataclasses.replace(w, **changes)


def test_a_peer_that_returned_after_fewer_calls_proves_the_wait_endless():
    ws = [worker(0, 10, pending=True), worker(1, 9, returned_at=1.0)]
    proof = certain_deadlock(ws, now=1.0 + SETTLE)
    assert proof == CertainDeadlock(waiting=0, function="step", call=10, returned=1, calls=9)
    assert str(proof) == "worker 1 returned after 9 calls of `step`; worker 0 waits in call 10"


def test_a_return_too_recent_is_not_yet_proof():
    ws = [worker(0, 10, pending=True), worker(1, 9, returned_at=1.0)]
    assert certain_deadlock(ws, now=1.0 + SETTLE / 2) is None


def test_a_peer_that_made_the_call_proves_nothing():
    # The last step's all-reduce ends on the slower worker a moment later.
    ws = [worker(0, 10, pending=True), worker(1, 10, returned_at=1.0)]
    assert certain_deadlock(ws, now=5.0) is None


@pytest.mark.parametrize("peer", [
    dict(returned_at=None),                                  # still in Python: may make the call
    dict(returned_at=None, exit_code=-9, finish_time=None),  # died: grace decides, may restart
    dict(returned_at=1.0, ledger=None),                      # its ledger was off
    dict(returned_at=1.0, ledger_note="12 progress records were lost"),
], ids=["lingering", "died", "no-ledger", "lost-records"])
def test_only_a_peer_gone_for_good_with_a_full_ledger_is_proof(peer):
    ws = [worker(0, 10, pending=True), worker(1, 9, **peer)]
    assert certain_deadlock(ws, now=5.0) is None


def test_a_call_with_a_collective_timeout_ends_by_raising():
    timed = TracedFunction(0, "step", (CollectiveOp("all-reduce", (1,), "float32"),))
    timed = dataclasses.replace(timed, collectives=(
        dataclasses.replace(timed.collectives[0], timeout=2.0),))
    ws = [worker(0, 10, pending=True, functions=(timed,)), worker(1, 9, returned_at=1.0)]
    assert certain_deadlock(ws, now=5.0) is None


def test_a_waiting_worker_the_harness_stopped_since_still_waited():
    ws = [worker(0, 10, pending=True, exit_code=-9, killed_by_harness=True),
          worker(1, 9, returned_at=1.0)]
    assert certain_deadlock(ws, now=5.0) is not None
    ws[0] = dataclasses.replace(ws[0], killed_by_harness=False)   # it died by itself
    assert certain_deadlock(ws, now=5.0) is None


def test_a_peer_that_never_called_the_function_counts_zero_calls():
    ws = [worker(0, 1, pending=True), worker(1, 0, returned_at=1.0)]
    assert certain_deadlock(ws, now=5.0).calls == 0


def test_the_verdict_says_the_hang_is_certain_and_why():
    ws = (worker(0, 10, pending=True), worker(1, 9, returned_at=1.0))
    obs = RunObservation(2, 30.0, 5.0, "deadlock", 1.6, ws)
    v = diagnose(obs)
    assert v.outcome == "hang"
    assert v.text.splitlines()[0].startswith(
        "HANG: certain deadlock (worker 1 returned after 9 calls of `step`; "
        "worker 0 waits in call 10)")


def test_a_peer_still_on_its_way_is_waited_for():
    """At 4 workers, one peer returned; another is still running its last
    step's Python: the run has not gone still, so nothing is declared yet."""
    ws = [worker(0, 10, pending=True), worker(1, 9, returned_at=1.0), worker(2, 9)]
    assert certain_deadlock(ws, now=5.0) is None
    ws[2] = worker(2, 9, returned_at=1.2)
    assert certain_deadlock(ws, now=5.0) is not None
    # A second waiter proven too; one dead worker does not hold the proof up.
    ws.append(worker(3, 10, pending=True))
    ws.append(worker(4, 3, exit_code=-9))
    assert certain_deadlock(ws, now=5.0).waiting == 0


def test_a_peer_that_leaves_once_it_returns_is_no_proof():
    """Under on_return="exit" (a script) the returned peer leaves the
    cluster, and TensorFlow fails those still waiting: an error, not a hang."""
    ws = [worker(0, 10, pending=True), worker(1, 9, returned_at=1.0)]
    assert certain_deadlock(ws, now=5.0, exit_on_return=True) is None


# -- certain_after_failure: run(end_when_certain=True) ------------------------------

from harness.diagnosis.deadlock import certain_after_failure  # noqa: E402


def test_a_dead_peer_that_made_fewer_calls_makes_the_failure_certain():
    ws = [worker(0, 4, pending=True), worker(1, 3, exit_code=1, exit_time=0.5),
          worker(2, 4, pending=True)]
    proof = certain_after_failure(ws, now=0.5 + SETTLE)
    assert proof == CertainDeadlock(0, "step", 4, 1, 3, "died")
    assert str(proof) == "worker 1 died after 3 calls of `step`; worker 0 waits in call 4"


def test_a_failure_is_certain_only_once_it_has_settled():
    ws = [worker(0, 4, pending=True), worker(1, 3, exit_code=1, exit_time=0.5)]
    assert certain_after_failure(ws, now=0.5 + SETTLE / 2) is None


def test_a_raised_peer_counts_as_gone():
    from harness.core.protocol import WorkerError
    err = WorkerError("RuntimeError", "boom")
    ws = [worker(0, 4, pending=True), worker(1, 3, error=err, finish_time=0.5)]
    assert certain_after_failure(ws, now=1.0).how == "raised"


@pytest.mark.parametrize("other", [
    dict(calls=4, pending=False),                      # between steps, in Python: may fail too
    dict(calls=3, pending=True),                       # in a call the dead one made: may end
], ids=["in-python", "call-the-dead-made"])
def test_a_peer_not_provably_blocked_keeps_the_grace(other):
    calls = other.pop("calls")
    ws = [worker(0, calls, **other), worker(1, 3, exit_code=1, exit_time=0.5)]
    assert certain_after_failure(ws, now=5.0) is None


def test_a_dead_peer_whose_ledger_lost_records_proves_nothing():
    ws = [worker(0, 4, pending=True),
          worker(1, 3, exit_code=1, exit_time=0.5, ledger_note="3 progress records were lost")]
    assert certain_after_failure(ws, now=5.0) is None


def test_without_a_failure_nothing_is_certain_here():
    ws = [worker(0, 4, pending=True), worker(1, 4, pending=True)]
    assert certain_after_failure(ws, now=5.0) is None


# -- the pending collective proves more (ledger="collectives") ----------------------

def collectives_worker(index, calls, pending_kind=None, **changes):
    """A worker at ledger="collectives" whose last call, when
    ``pending_kind``, launched one collective of that kind, not completed."""
    fn = TracedFunction(0, "step", (CollectiveOp(pending_kind or "all-reduce", (1,), "float32"),))
    made = tuple(Call(0, k, k - 1, began=k / 10,
                      ended=None if pending_kind and k == calls else k / 10 + 0.05,
                      launched=(0,), done=() if pending_kind and k == calls else (0,))
                 for k in range(1, calls + 1))
    w = WorkerObservation(index=index, functions=(fn,), calls=made, ledger="collectives")
    return dataclasses.replace(w, **changes)


def test_a_pending_all_reduce_is_endless_once_a_peer_returned_with_all_done():
    # An extra collective paired with the peers' next all-reduce: the counts
    # are even, but the waiting worker's last all-reduce has no partner left.
    ws = [collectives_worker(0, 6, returned=True, finish_time=1.0),
          collectives_worker(1, 6, pending_kind="all-reduce")]
    proof = certain_deadlock(ws, now=1.0 + SETTLE)
    assert proof is not None and proof.waiting == 1
    assert str(proof) == ("worker 0 returned with every collective it launched completed; "
                          "worker 1 waits on an all-reduce in call 6 of `step`")


@pytest.mark.parametrize("changes", [
    dict(pending_kind="broadcast"),   # its sender may finish before its receivers start
    dict(pending_kind=None),          # the call's collectives completed: it is computing
    dict(pending_kind="all-reduce", ledger="calls"),   # no word on which is pending
], ids=["broadcast", "computing", "calls-level"])
def test_only_a_launched_reduction_proves_the_wait_endless(changes):
    pending = dict(changes)
    kind = pending.pop("pending_kind")
    waiting = collectives_worker(1, 6, pending_kind=kind, **pending)
    if kind is None:   # in its last call, its collective done, the call not ended
        calls = waiting.calls[:-1] + (dataclasses.replace(waiting.calls[-1], ended=None),)
        waiting = dataclasses.replace(waiting, calls=calls)
    ws = [collectives_worker(0, 6, returned=True, finish_time=1.0), waiting]
    assert certain_deadlock(ws, now=5.0) is None


# -- a peer stopped (SIGSTOP) that nothing will continue ------------------------------

def test_a_stopped_peer_that_made_fewer_calls_proves_the_wait_endless_at_once():
    ws = [worker(0, 4, pending=True), worker(1, 3)]
    proof = certain_deadlock(ws, now=1.0, held={1: 1.0})
    assert str(proof) == "worker 1 is stopped after 3 calls of `step`; worker 0 waits in call 4"


def test_a_peer_stopped_after_its_part_of_the_call_ended_proves_it_once_settled():
    # The stopped worker's all-reduce ended before its peer had taken the
    # last part of it: the counts are even, the peer waits for good.
    ws = [collectives_worker(0, 3, pending_kind="all-reduce"), collectives_worker(1, 3)]
    assert certain_deadlock(ws, now=1.0 + SETTLE / 2, held={1: 1.0}) is None
    proof = certain_deadlock(ws, now=1.0 + SETTLE, held={1: 1.0})
    assert str(proof) == ("worker 1 is stopped for good after 3 calls of `step`; worker 0 "
                          "still waits on an all-reduce in call 3, which needs its part")


@pytest.mark.parametrize("changes", [
    dict(pending_kind=None),          # its collective done, the call not ended: computing
    dict(pending_kind="all-reduce", ledger="calls"),   # no word on which is pending
    dict(pending_kind="broadcast"),
], ids=["computing", "calls-level", "broadcast"])
def test_a_stopped_peer_that_made_the_call_proves_only_a_pending_reduction(changes):
    pending = dict(changes)
    kind = pending.pop("pending_kind")
    waiting = collectives_worker(0, 3, pending_kind=kind, **pending)
    if kind is None:
        calls = waiting.calls[:-1] + (dataclasses.replace(waiting.calls[-1], ended=None),)
        waiting = dataclasses.replace(waiting, calls=calls)
    ws = [waiting, collectives_worker(1, 3)]
    assert certain_deadlock(ws, now=5.0, held={1: 1.0}) is None
    assert certain_deadlock(ws, now=5.0) is None   # not held: it may resume
