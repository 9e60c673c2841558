"""When the watch loop finds a worker stopped for good (harness.controller.proof)."""
from __future__ import annotations

import signal
from types import SimpleNamespace

from harness.controller.proof import Proofs
from harness.diagnosis.deadlock import SETTLE
from harness.diagnosis.observations import (Call, CollectiveOp, EndedBy, TracedFunction,
                                            WorkerObservation)

STEP = TracedFunction(0, "step", (CollectiveOp("all-reduce", (1,), "float32"),))


def _worker(index, pending):
    calls = tuple(Call(0, k, k - 1, began=k / 10, ended=None if pending and k == 3 else k / 10,
                       launched=(0,), done=() if pending and k == 3 else (0,))
                  for k in (1, 2, 3))
    return WorkerObservation(index=index, functions=(STEP,), calls=calls, ledger="collectives")


def _tracked(index, stopped):
    return SimpleNamespace(index=index, pending=True,
                           handle=SimpleNamespace(is_stopped=lambda: stopped))


def _look(proofs, stopped, elapsed, actions=()):
    workers = [_worker(0, pending=True), _worker(1, pending=False)]
    return proofs.look(workers, [_tracked(0, False), _tracked(1, stopped)], list(actions),
                       elapsed=elapsed, now=100 + elapsed, failed=False, exit_on_return=False)


def test_a_stop_counts_from_when_it_was_first_seen():
    proofs = Proofs(100.0, end_when_certain=True)
    assert _look(proofs, stopped=True, elapsed=2.0) is None
    assert _look(proofs, stopped=True, elapsed=2.0 + SETTLE / 2) is None
    assert _look(proofs, stopped=True, elapsed=2.0 + SETTLE + 0.01) == EndedBy.DEADLOCK


def test_a_worker_that_resumed_starts_its_count_again():
    proofs = Proofs(100.0, end_when_certain=True)
    _look(proofs, stopped=True, elapsed=2.0)
    assert _look(proofs, stopped=False, elapsed=2.2) is None
    assert _look(proofs, stopped=True, elapsed=2.4) is None
    assert _look(proofs, stopped=True, elapsed=2.4 + SETTLE + 0.01) == EndedBy.DEADLOCK


def test_a_worker_the_harness_will_continue_is_no_proof():
    proofs = Proofs(100.0, end_when_certain=True)
    resume = SimpleNamespace(worker=1, signal=signal.SIGCONT)
    for t in (2.0, 5.0):
        assert _look(proofs, stopped=True, elapsed=t, actions=[resume]) is None


def test_without_end_when_certain_a_stop_is_left_to_the_timeout():
    proofs = Proofs(100.0, end_when_certain=False)
    for t in (2.0, 5.0):
        assert _look(proofs, stopped=True, elapsed=t) is None

