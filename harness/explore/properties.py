"""What ``explore`` checks of each run: a table of properties, each a plain
function from a run's result (and the plan that was injected) to the
failure's :class:`Signature`, or None when the property holds.

- ``survives``: the run completed (after the restarts allowed) and the
  user's ``invariant(result)`` did not raise: what the job promises.  A
  run whose every worker returned, and whose only deaths at exit are
  workers a fault of the plan acted on (a preemption's kill landing once
  its job was done), held it too: the job's work was done, and the kill
  was the plan's, not the job's.
- ``detected``: a run that did not complete named a worker whose fault
  acted (or said "cannot tell" with one among its candidates), never
  only a worker no fault acted in (:mod:`harness.explore.attribution`).

A signature is what must stay fixed while a failing plan shrinks: the
outcome, each culprit as the plan sees it (a faulted worker or another),
whether the verdict could tell, the root error's type, and which promise
broke.  Culprits are told relative to the plan, so a plan moved to a lower
worker keeps its signature when the blame moves with it.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Optional, Sequence, Tuple

from harness.diagnosis.observations import Outcome
from harness.explore.attribution import Attribution, attribute, truth


@dataclasses.dataclass(frozen=True)
class Signature:
    outcome: str
    culprits: Tuple[str, ...] = ()   # "faulted" or "other", one per culprit
    ambiguous: bool = False
    error: Optional[str] = None      # the root error's type name
    broken: str = ""                 # which promise broke: "invariant: <type>", "wrong culprit"

    def __str__(self) -> str:
        said = [self.outcome]
        if self.culprits:
            kinds = ", ".join(self.culprits)
            said.append(f"{'cannot tell: candidates' if self.ambiguous else 'culprit'} {kinds}")
        if self.error:
            said.append(f"error {self.error}")
        if self.broken:
            said.append(self.broken)
        return "; ".join(said)


@dataclasses.dataclass(frozen=True)
class Check:
    """One run judged: its signature when the property broke (else None),
    and a line saying how (the invariant's message, the verdict)."""

    signature: Optional[Signature]
    how: str = ""


def signature_of(result, plan: Sequence, broken: str = "") -> Signature:
    faulted = truth(result, plan)
    # A multiset: which worker holds which role is the plan's business, so
    # a blame that moves with the fault keeps its signature.
    roles = tuple(sorted("faulted" if c in faulted else "other" for c in result.culprits))
    return Signature(str(result.outcome), roles, result.ambiguous, result.error, broken)


def headline(result) -> str:
    return result.diagnosis.splitlines()[0] if result.diagnosis else str(result.outcome)


# A run in which a fault asked for never acted (its worker finished
# without reaching its step) proves nothing either way: counted apart.
NEVER_ACTED = Check(None, "a fault never acted")


def killed_once_done(result, plan: Sequence) -> bool:
    """Every worker returned its value, and each that then died at exit
    is one a fault of ``plan`` acted on: the plan's kill came after the
    job's work."""
    if result.outcome != Outcome.CRASHED_AT_EXIT:
        return False
    ws = result.observation.workers
    dead = {w.index for w in ws if w.died_at_exit}
    return bool(dead) and all(w.returned for w in ws) and dead <= truth(result, plan)


def survives(result, plan: Sequence, invariant: Optional[Callable]) -> Check:
    if result.faults_never_acted:
        return NEVER_ACTED
    if result.outcome != Outcome.COMPLETED and not killed_once_done(result, plan):
        return Check(signature_of(result, plan), headline(result))
    if invariant is not None:
        try:
            invariant(result)
        except Exception as e:   # the user's promise, in any form it raises
            return Check(signature_of(result, plan, f"invariant: {type(e).__name__}"),
                         f"completed, but the invariant raised {type(e).__name__}: {e}")
    return Check(None)


def detected(result, plan: Sequence, invariant: Optional[Callable]) -> Check:
    if result.faults_never_acted:
        return NEVER_ACTED
    if attribute(result, plan) != Attribution.WRONG:
        return Check(None)
    return Check(signature_of(result, plan, "wrong culprit"), headline(result))


PROPERTIES: Dict[str, Callable[..., Check]] = {
    "survives": survives,
    "detected": detected,
}
