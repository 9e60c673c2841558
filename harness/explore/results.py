"""What a search tells: its progress while it runs (:class:`SearchProgress`,
for a live status line) and what it did (:class:`Exploration`, with the
:class:`BreakingPlan` it found), in words for people."""
from __future__ import annotations

import builtins
import dataclasses
from typing import TYPE_CHECKING, Dict, Optional, Tuple

from harness import faults_text
from harness.explore.coverage import Coverage, PlanRun
from harness.explore.properties import Signature
from harness.explore.shrink import Plan

if TYPE_CHECKING:
    from harness.controller import Progress
    from harness.result import RunResult


# What a signature's culprit roles (harness.explore.properties) mean, in words.
ROLES = {"faulted": "a worker the plan faulted",
         "other": "a worker the plan did not fault"}


def describe(signature: Signature) -> str:
    """A failure's signature for people: ``crashed; culprit: a worker the
    plan faulted; error UnavailableError``."""
    said = [signature.outcome]
    if signature.culprits:
        roles = ", ".join(ROLES.get(c, c) for c in signature.culprits)
        said.append(f"cannot tell, candidates: {roles}" if signature.ambiguous
                    else f"culprit{'s' if len(signature.culprits) > 1 else ''}: {roles}")
    if signature.error:
        said.append(f"error {signature.error}")
    if signature.broken:
        said.append(signature.broken)
    return "; ".join(said)


def seconds_text(seconds: float) -> str:
    """Seconds to a tenth, without a trailing ``.0``: ``3.4``, ``30``."""
    return f"{seconds:.1f}".removesuffix(".0")


@dataclasses.dataclass(frozen=True)
class SearchProgress:
    """Where a search is, for a live status line: its ``stage`` (one of
    :data:`STAGES`), ``runs`` the plans run so far (the shrink's
    and the replays included), ``elapsed`` seconds since it began, ``left`` seconds left of
    the stage's budget, ``running`` the plan now running (None between
    runs) and ``run`` that run's own progress when the caller passes it on
    (:meth:`later`), ``last`` the plan run last and ``ended`` how it
    ended (its count in ``Exploration.outcomes``)."""

    stage: str
    runs: int
    elapsed: float
    left: float
    running: Optional[Plan] = None
    last: Optional[Plan] = None
    ended: str = ""
    run: Optional[Progress] = None

    @property
    def runs_per_minute(self) -> float:
        return 60.0 * self.runs / self.elapsed if self.elapsed > 0 else 0.0

    def later(self, seconds: float, run: Optional[Progress] = None) -> SearchProgress:
        """The same search ``seconds`` later, with the running plan's own progress."""
        return dataclasses.replace(self, elapsed=self.elapsed + seconds,
                                   left=max(0.0, self.left - seconds), run=run)


# A search's stages, in order.
STAGES = ("fault-free run", "saved plans", "search", "shrink", "replay")


@dataclasses.dataclass(frozen=True)
class BreakingPlan:
    """The smallest plan found that breaks the property, and its run."""

    plan: Plan
    result: RunResult
    signature: Signature
    how: str                       # what broke, in words
    found: Plan                    # the plan the search drew, before shrinking
    shrink_runs: int = 0
    shrink_seconds: float = 0.0
    replays: int = 0               # how many times more the plan ran
    reproduced: int = 0            # in how many of them it failed the same way
    # The shrunk plan and its count, where it came back less often than the
    # plan as found, which is then the answer.
    passed_over: Optional[Tuple[Plan, int]] = None

    @property
    def line(self) -> str:
        """``faults=[...]``: paste it into ``run()`` to see the failure again."""
        return faults_text.plan_line(self.plan)

    @property
    def racy(self) -> bool:
        """The plan did not fail the same way every time it ran again."""
        return self.reproduced < self.replays

    def reproduced_text(self) -> str:
        if not self.replays:
            return "not replayed (reproduce=0)"
        if not self.racy:
            text = f"reproduced {self.reproduced} of {self.replays} replays"
        else:
            text = (f"RACY: failed the same way in {self.reproduced} of {self.replays} replays "
                    f"({self.reproduced + 1} of {self.replays + 1} runs in all)")
        if self.passed_over is not None:
            shrunk, count = self.passed_over
            text += (f"; kept as found: its shrunk form {faults_text.plan_line(shrunk)} failed "
                     f"the same way in only {count} of {self.replays} replays")
        return text


@dataclasses.dataclass(frozen=True)
class Exploration:
    """What a search did: ``runs`` plans run (the fault-free run, saved
    plans and the search's draws; the shrink's are in ``failure``),
    ``outcomes`` how they ended (a histogram), ``seconds`` each run's wall
    time, ``steps`` the job's steps, ``timeout`` the plans' hang timeout,
    ``exhausted`` True when every plan there is was run, ``seed`` the
    seed that draws the same plans again, ``failure`` None or a
    :class:`BreakingPlan`, ``plans`` each plan the search ran (saved and
    drawn, not the shrink's) and ``coverage`` what they covered."""

    property: str
    runs: int
    outcomes: Dict[str, int]
    seconds: Tuple[float, ...]
    steps: int
    timeout: float
    seed: int
    exhausted: bool
    search_seconds: float
    failure: Optional[BreakingPlan] = None
    plans: Tuple[PlanRun, ...] = ()
    coverage: Optional[Coverage] = None

    @builtins.property   # the builtin: in this class `property` names a field
    def runs_per_minute(self) -> float:
        return 60.0 * self.runs / self.search_seconds if self.search_seconds > 0 else 0.0

    def summary(self) -> str:
        seen = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))
        head = (f"explore ({self.property}): {self.runs} runs in {self.search_seconds:.1f} s "
                f"({self.runs_per_minute:.0f}/min; {seen}); {self.steps} steps, hang timeout "
                f"{seconds_text(self.timeout)} s, seed {self.seed}"
                + ("; every plan was run" if self.exhausted else ""))
        f = self.failure
        if f is None:
            return "\n".join([head, "no plan broke the property; "
                              + "\n".join(self.coverage.lines() if self.coverage else
                                          ("coverage not kept",))])
        if not f.plan:
            # Nothing to search: every plan's failure would be the job's own.
            again = (f"and in each of its {f.replays} replays" if not f.racy else
                     f"in {f.reproduced + 1} of {f.replays + 1} runs: the job itself is racy"
                     if f.replays else "(not replayed)")
            return "\n".join([
                f"the job breaks '{self.property}' with no fault at all, {again}: {f.how}",
                f"  signature: {describe(f.signature)}",
                "  no plan was searched: a search needs a job whose fault-free run holds "
                "the property",
                "  " + head])
        return "\n".join([
            f"{f.line}",
            f"  breaks '{self.property}': {f.how}",
            f"  signature: {describe(f.signature)}",
            f"  found as {faults_text.plan_line(f.found)}; shrunk in {f.shrink_runs} runs "
            f"({f.shrink_seconds:.1f} s); {f.reproduced_text()}",
            "  " + head])
