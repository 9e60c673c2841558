"""The facts of a run, worked out once from its observation, for every rule.

:class:`Facts` holds what the rules ask of a run again and again: the
outcome, each worker's steps and phase, the ``TF_CONFIG`` issues, the root
errors, the collective mismatches and the echoes, and the state signature
by which workers are compared.  The helpers below answer the same
questions of one worker.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Counter, Dict, List, Optional, Sequence, Tuple

from harness.core import protocol
from harness.diagnosis.observations import EndedBy, Outcome, RunObservation, WorkerObservation
from harness.diagnosis.configs import config_issues
from harness.diagnosis import ledger, order
from harness.diagnosis.echoes import is_collective_mismatch, is_echo, is_end_of_input

# Where each phase stands in a worker's life: who is behind whom.
PHASE_RANK: Dict[Optional[str], int] = {phase: rank for rank, phase in enumerate(protocol.PHASES)}

# Which situations a rule can apply to (the ``when`` column of the table):
COMPLETED = Outcome.COMPLETED
CRASHED = Outcome.CRASHED
FAILED = Outcome.FAILED       # a worker raised, and some error is a cause
FAILED_ECHOES = "failed_echoes"  # a worker raised, but every error is an echo
# A worker raised, and every cause is a collective whose members disagree:
# a cause that names no worker, so the evidence is the ledgers and steps.
FAILED_MISMATCH = "failed_mismatch"
HANG_ = Outcome.HANG
# Every worker returned, but their replicas disagree, or their collectives
# reduce the same tensors in another order (harness.diagnosis.order).
DIVERGED = "diverged"
CRASHED_AT_EXIT = Outcome.CRASHED_AT_EXIT   # every worker returned; one died at exit
SITUATIONS = (COMPLETED, CRASHED, FAILED, FAILED_ECHOES, FAILED_MISMATCH, HANG_, DIVERGED,
              CRASHED_AT_EXIT)


def or_inf(t: Optional[float]) -> float:
    """A time to sort by, with "never" last."""
    return t if t is not None else float("inf")


def phase(w: WorkerObservation) -> Optional[str]:
    """The last phase the worker reported (``None``: none yet)."""
    kinds = [e.kind for e in w.events if e.kind in PHASE_RANK]
    return kinds[-1] if kinds else None


def state(w: WorkerObservation) -> str:
    """``raised``, ``returned``, ``died``, ``stopped`` or ``blocked``."""
    if w.error is not None:
        return "raised"
    if w.returned:
        return "returned"
    if w.died:
        return "died"
    return "stopped" if w.stopped else "blocked"


def where_stopped(w: WorkerObservation) -> str:
    """Where a worker's progress stopped, as a phrase: ``at step 9``."""
    last = w.last_step
    p = phase(w)
    if p == protocol.STEP and last is not None:
        return f"at step {last}"
    if p == protocol.STEPS_DONE:
        return f"after the loop ({len(w.steps)} steps)"
    said: Dict[Optional[str], str] = {
        protocol.STRATEGY_CREATING: "in strategy creation", None: "before any progress",
        protocol.STARTED: "before strategy creation",
        protocol.STRATEGY_CREATED: "after strategy creation, before any step"}
    return said.get(p, f"after {p}")


def reference_steps(ws: Sequence[WorkerObservation]) -> Tuple[int, ...]:
    """The most common step sequence; ties go to the longest (a skip is a loss)."""
    counts = collections.Counter(w.steps for w in ws)
    return max(counts, key=lambda s: (counts[s], len(s))) if counts else ()


def outcome_of(obs: RunObservation) -> Outcome:
    """Strict precedence: crashed, then failed, then hang, else completed;
    a run whose workers all returned but disagree (the replica check)
    failed; one whose workers all returned, and agree, but one of whose
    processes then died crashed at exit."""
    ws = obs.workers
    if any(w.died for w in ws):
        return Outcome.CRASHED
    if any(w.error is not None for w in ws):
        return Outcome.FAILED
    if obs.ended_by in (EndedBy.HANG, EndedBy.DEADLOCK) or not all(w.returned for w in ws):
        return Outcome.HANG
    if diverged(obs):
        return Outcome.FAILED
    if any(w.died_at_exit for w in ws):
        return Outcome.CRASHED_AT_EXIT
    return Outcome.COMPLETED


def diverged(obs: RunObservation) -> bool:
    """The replica check found workers that disagree, or the reference
    check found the run differs from its single-worker reference, or the
    workers' collectives reduce the same tensors in another order."""
    return ((obs.replicas is not None and obs.replicas.divergence is not None)
            or (obs.reference is not None and obs.reference.differs)
            or order.out_of_order(obs.workers) is not None)


# (finished?, steps, phase): workers with equal signatures stand at the same
# point; the odd one out is the first suspect.
Signature = Tuple[bool, Tuple[int, ...], Optional[str]]


@dataclasses.dataclass(frozen=True)
class Facts:
    obs: RunObservation
    outcome: Outcome
    situation: str
    config_issues: Dict[int, List[str]]
    config_tie: bool
    errors: Tuple[WorkerObservation, ...]   # workers that raised, causes first, then by time
    roots: Tuple[WorkerObservation, ...]    # workers whose error is a cause of their own, by time
    mismatches: Tuple[WorkerObservation, ...]   # workers that reported a collective mismatch
    echoes: Tuple[WorkerObservation, ...]   # workers whose error is an echo
    comparable: Tuple[WorkerObservation, ...]   # neither stopped nor dead: compared by signature
    signatures: Dict[int, Signature]
    signature_counts: Counter

    @property
    def workers(self) -> Tuple[WorkerObservation, ...]:
        return self.obs.workers

    def worker(self, index: int) -> WorkerObservation:
        return next(w for w in self.obs.workers if w.index == index)


def signature(w: WorkerObservation) -> Signature:
    finished = w.returned and w.error is None
    return finished, w.steps, "done" if finished else phase(w)


def facts_of(obs: RunObservation) -> Facts:
    # A function one worker has retraced and another not yet is counted
    # alike on both, for every rule and line that reads the ledgers.
    obs = dataclasses.replace(obs, workers=ledger.same_traces(obs.workers))
    outcome = outcome_of(obs)
    issues, tie = config_issues(obs)
    raised = [w for w in obs.workers if w.error is not None]
    mismatches = tuple(w for w in raised if is_collective_mismatch(w.error))
    mismatched = {w.index for w in mismatches}
    roots = tuple(sorted((w for w in raised if not is_echo(w.error) and w.index not in mismatched),
                         key=lambda w: or_inf(w.finish_time)))
    if outcome == Outcome.FAILED and not raised:
        situation = DIVERGED
    elif outcome == Outcome.FAILED:
        situation = FAILED if roots else FAILED_MISMATCH if mismatches else FAILED_ECHOES
    else:
        situation = outcome
    comparable = tuple(w for w in obs.workers if not w.stopped and not w.died)
    signatures = {w.index: signature(w) for w in comparable}
    return Facts(
        obs=obs, outcome=outcome, situation=situation, config_issues=issues, config_tie=tie,
        errors=tuple(sorted(raised, key=lambda w: (is_echo(w.error), w.index in mismatched,
                                                   is_end_of_input(w.error),
                                                   or_inf(w.finish_time)))),
        roots=roots, mismatches=mismatches, echoes=tuple(w for w in raised if is_echo(w.error)),
        comparable=comparable, signatures=signatures,
        signature_counts=collections.Counter(signatures.values()))
