"""A deadlock the ledger proves: the run can never complete, so it need not
wait out its hang timeout.

Every collective of an MWMS cluster needs every worker: call *k* of a
function that launches collectives ends on a worker only once every other
worker has made call *k* of it too (the ledger's pairing, see
:mod:`harness.diagnosis.ledger`).  A worker whose ``fn`` returned makes no
more calls.  So when a worker is in call *k* of ``step`` and a peer has
returned after fewer than *k* calls of ``step``, that call never ends: the
run is certain to hang, whatever the waiting worker does next.

Only that is proof.  What looks like a hang but is not certain keeps the
timeout:

* a worker still in Python (between steps, or lingering after its loop)
  may yet make the call;
* a paused or slow worker may resume, so a peer blocked *by* it is not
  proof; only a peer that is gone for good is, or one stopped (SIGSTOP)
  that nothing will continue: the harness knows whether it will send the
  SIGCONT itself, and no one else does in a run (``held``);
* a peer that died or raised ends the run through its peers' grace, as
  before, and a cluster manager may restart it (``restart_policy``), so it
  is not counted here;
* a peer whose process ends once it returns (``on_return="exit"``, as a
  script's does) leaves the cluster, and TensorFlow then fails the workers
  still waiting for it (its connection refused, or its heartbeats stopped:
  TensorFlow 2.21, measured, ``UnavailableError`` within about 10 s): an
  error, not a hang, so nothing is declared (the ``left_early`` rule names
  it when they fail);
* a call whose collectives carry a timeout
  (``CommunicationOptions(timeout_seconds=...)``) ends by raising, not by
  hanging;
* a worker whose ledger lost records, or was off, cannot be counted;
* a worker that is neither finished nor proven to wait for ever may still
  be on its way (to its own return, say): the proof waits for it, so the
  verdict sees the run as the hang timer would;
* a peer returned only a moment ago: its last collectives may pair with
  what the waiting worker launched (two functions whose collectives share
  keys, when the workers traced in another order), and those complete on
  every worker at nearly the same moment.  So the proof waits
  :data:`SETTLE` seconds after the return.

At ``ledger="collectives"`` the ledger also says which collective of the
call is pending, and that proves more: a worker waiting on an all-reduce
or all-gather it launched needs every peer's contribution to that very
collective, and a peer gone for good whose collectives all completed has
nothing left to give (each of its collectives, to complete, took the
waiting worker's matching one with it).  So the wait is endless whatever
the counts say, as when a worker's extra collective paired with its
peers' next one and left it one short at the end.  A broadcast is left
out: its sender may finish before its receivers start.  A peer stopped
for good gives nothing more either, whether or not its own collectives
completed: its part of the all-reduce can end on the stopped worker before
the waiting one has taken the last of it, and it never will now.  What the
peer had already sent arrives within moments, so this proof waits
:data:`SETTLE` seconds after the peer was first seen stopped.

A worker that died or raised is gone for good too, when nothing will
start it again: :func:`certain_after_failure` proves, for a run that asked
to end once its verdict is certain (``run(end_when_certain=True)``), that
every other worker waits for ever on a call the failed one never made, so
the peers' grace (waiting for their own errors, which TensorFlow raises
only once its heartbeats notice) can change nothing but those echoes.

Functions are matched by name (ids are per worker); two functions of one
name on a worker add up, which can only hide a certainty, never make one.
Pure: a function of the workers' observations.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Optional, Sequence

from harness.diagnosis import ledger
from harness.diagnosis.observations import WorkerObservation
from harness.diagnosis.words import name

# Seconds a peer's return must be old before its count is proof: far longer
# than a collective takes to end on every worker once one has ended it.
SETTLE = 0.3


@dataclasses.dataclass(frozen=True)
class CertainDeadlock:
    """Worker ``waiting`` is in call ``call`` of ``function``; worker
    ``returned`` returned from ``fn`` after ``calls`` calls of it."""

    waiting: int
    function: str
    call: int
    returned: int
    calls: int
    how: str = "returned"   # how the other worker went: "returned", "died", "raised"
    pending_kind: str = "all-reduce"   # what the waiting worker waits on

    def __str__(self) -> str:
        if self.calls >= self.call and self.how == "is stopped":
            return (f"{name(self.returned)} is stopped for good after {self.calls} calls of "
                    f"`{self.function}`; {name(self.waiting)} still waits on an "
                    f"{self.pending_kind} in call {self.call}, which needs its part")
        if self.calls >= self.call:   # proved by the pending collective, not the counts
            return (f"{name(self.returned)} {self.how} with every collective it launched "
                    f"completed; {name(self.waiting)} waits on an {self.pending_kind} in call "
                    f"{self.call} of `{self.function}`")
        made = f"{self.calls} call{'s' if self.calls != 1 else ''}"
        return (f"{name(self.returned)} {self.how} after {made} of `{self.function}`; "
                f"{name(self.waiting)} waits in call {self.call}")


def _countable(w: WorkerObservation) -> bool:
    """The worker's ledger is on and complete, so its calls can be counted."""
    return w.ledger is not None and "lost" not in w.ledger_note


def _gone(w: WorkerObservation, now: float, settle: float) -> bool:
    """Returned from ``fn`` at least ``settle`` seconds before ``now``, with
    every call ended: it makes no more calls."""
    return (w.returned and w.error is None and w.finish_time is not None
            and now - w.finish_time >= settle and ledger.pending_call(w) is None)


def _waits_for_ever_on(w: WorkerObservation) -> Optional[tuple]:
    """(function name, call number) of the call ``w`` is in, when it has
    not finished nor died (the harness may have stopped it since), and the
    call's collectives have no timeout."""
    if w.finished or w.died or not _countable(w):
        return None
    call = ledger.pending_call(w)
    if call is None:
        return None
    ops = next((f.collectives for f in w.functions if f.id == call.function), ())
    if any(op.timeout for op in ops):
        return None
    return ledger.function_of(w, call), call.number


# The collectives every participant must contribute to before any completes.
EVERY_PEER_GIVES = ("all-reduce", "all-gather")


def _pending_reduction(w: WorkerObservation) -> Optional[str]:
    """The kind of the all-reduce or all-gather ``w`` launched and waits
    on in its pending call, when its ledger says (``ledger="collectives"``)."""
    call = ledger.pending_call(w)
    if call is None or w.ledger != "collectives":
        return None
    ops = next((f.collectives for f in w.functions if f.id == call.function), ())
    for i in sorted(set(call.launched) - set(call.done)):
        if i < len(ops) and ops[i].kind in EVERY_PEER_GIVES:
            return ops[i].kind
    return None


def _proof(w: WorkerObservation, gone: Sequence[WorkerObservation],
           stuck: Sequence[WorkerObservation] = (),
           still: Sequence[WorkerObservation] = ()) -> Optional[CertainDeadlock]:
    """Why ``w`` waits for ever, when a peer in ``gone`` (finished for
    good) or ``stuck`` (stopped, and nothing will continue it) proves it;
    ``still``: those of ``stuck`` stopped long enough for what they sent
    to have arrived."""
    waiting = _waits_for_ever_on(w)
    if waiting is None:
        return None
    name, number = waiting
    pending = _pending_reduction(w)
    for o in gone:
        made = ledger.calls_of(o, name)
        if made < number or pending is not None:
            how = "raised" if o.error is not None else "died" if o.died else "returned"
            return CertainDeadlock(w.index, name, number, o.index, made, how,
                                   pending or "all-reduce")
    for o in stuck:
        made = ledger.calls_of(o, name)
        if made < number or (pending is not None and o in still):
            return CertainDeadlock(w.index, name, number, o.index, made, "is stopped",
                                   pending or "all-reduce")
    return None


def certain_deadlock(workers: Sequence[WorkerObservation], now: float,
                     settle: float = SETTLE, exit_on_return: bool = False,
                     held: Optional[Mapping[int, float]] = None) -> Optional[CertainDeadlock]:
    """The first proof, at ``now`` (seconds since the run started), that the
    run can never complete (see the module docstring), or None; a worker
    that returned proves nothing where it then leaves (``exit_on_return``).
    ``held``: the workers stopped (SIGSTOP) that nothing will continue,
    which make no more calls either, each with the time (seconds since the
    run started) it was first seen stopped.  Only once the run has gone still:
    every worker has finished, died, is held, or waits for ever, so the
    verdict sees what the hang timer would have seen (a peer still on its
    way to its own return is waited for)."""
    held = held or {}
    gone = [] if exit_on_return else [o for o in workers
                                      if _gone(o, now, settle) and _countable(o)]
    stuck = [o for o in workers if o.index in held and _countable(o)
             and not o.finished and not o.died]
    if not gone and not stuck:
        return None
    still = [o for o in stuck if now - held[o.index] >= settle]
    proofs = []
    for w in workers:
        if w.finished or w.died or w in stuck:
            continue
        proof = _proof(w, gone, stuck, still)
        if proof is None:
            return None
        proofs.append(proof)
    return proofs[0] if proofs else None


def _failed_for_good(w: WorkerObservation, now: float, settle: float) -> bool:
    """Raised or died at least ``settle`` seconds before ``now``."""
    at = w.finish_time if w.error is not None else w.exit_time if w.died else None
    return at is not None and now - at >= settle and _countable(w)


def certain_after_failure(workers: Sequence[WorkerObservation], now: float,
                          settle: float = SETTLE) -> Optional[CertainDeadlock]:
    """The first proof, at ``now``, that a run in which a worker raised or
    died (and is not started again) can never complete: every worker that
    has not finished nor died waits for ever in a call that a failed worker
    (or one gone after returning) made fewer times.  ``settle`` seconds
    after the failure, as for a return: what the failed worker launched
    last may still end on its peers."""
    failed = [o for o in workers if _failed_for_good(o, now, settle)]
    if not failed:
        return None
    gone = failed + [o for o in workers if _gone(o, now, settle) and _countable(o)]
    proofs = []
    for w in workers:
        if w.finished or w.died:
            continue
        proof = _proof(w, gone)
        if proof is None:
            return None
        proofs.append(proof)
    return proofs[0] if proofs else None
