"""What a search covered of the space it searched (:mod:`harness.explore.space`):
a plain function of the plans it ran and how each ended.

Only a fault that acted covers anything: a plan whose fault never acted
(its worker finished first) is counted apart, never as ground covered.
A search that finds nothing says what it covered, per kind, per role and
per window of steps, how many plans made a restart happen and how many
faults acted during one, and names each cell (a kind at a role in a
window) that no plan reached: "no plan broke the property" is as strong
as that.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Dict, Optional, Sequence, Tuple

from harness.explore.space import Cell, Plan, Space


@dataclasses.dataclass(frozen=True)
class PlanRun:
    """One plan the search ran: how it ended (its count in
    ``Exploration.outcomes``), which of its faults acted, whether it made a
    restart happen, and its wall time."""

    plan: Plan
    ended: str
    acted: Plan
    restarted: bool
    seconds: float
    resumed: Optional[int] = None   # the step the restart attempt began at

    @property
    def all_acted(self) -> bool:
        return len(self.acted) == len(self.plan)


@dataclasses.dataclass(frozen=True)
class Coverage:
    """The plans' spread over ``space``: counts of faults that acted by
    kind, role and window, the cells reached and those never reached."""

    space: Space
    plans: int
    acted: int                      # plans whose every fault acted
    never_acted: int                # plans with a fault that never acted
    restarted: int
    in_restart: int                 # faults that acted in a restart attempt
    at_state: int                   # faults that acted at a state point
    by_kind: Dict[str, int]
    by_role: Dict[str, int]
    by_window: Dict[int, int]
    reached: Tuple[Cell, ...]
    unreached: Tuple[Cell, ...]
    exhausted: bool

    def window_text(self, window: int) -> str:
        steps = self.space.windows()[window]
        return f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"

    def cell_text(self, cell: Cell) -> str:
        kind, role, window = cell
        return f"{kind} at {role}, {self.window_text(window)}"

    def lines(self) -> Tuple[str, ...]:
        """The coverage in words, a line each."""
        s = self.space
        cells = len(self.reached) + len(self.unreached)
        out = [f"covered: {self.acted} of {self.plans} plans acted "
               f"({self.never_acted} never acted); {len(self.reached)} of {cells} cells "
               f"(kind x role x window of steps)"
               + ("; every one-fault plan was run" if self.exhausted else
                  f"; {s.size()} one-fault plans in the space")
               + ("; the workers other than 0 taken as one (alike in the fault-free run)"
                  if s.interchangeable and s.workers > 2 else "")]
        out.append("  by kind: " + ", ".join(f"{k} {self.by_kind.get(k, 0)}" for k in s.kinds))
        out.append("  by role: " + ", ".join(f"{r} {self.by_role.get(r, 0)}" for r in s.roles()))
        out.append("  by window: " + ", ".join(f"{self.window_text(w)}: {self.by_window.get(w, 0)}"
                                             for w in range(len(s.windows()))))
        out.append(f"  {self.restarted} plans made a restart happen; {self.in_restart} faults "
                   f"acted in a restart attempt")
        out.append(self.state_text())
        if self.unreached:
            out.append("  never reached: " + self.unreached_text())
        return tuple(out)

    def state_text(self) -> str:
        s = self.space
        if not s.state_steps:
            return ("  state points: none (the fault-free run wrote nothing under "
                    "harness.context().run_dir at a step boundary)")
        seen = ", ".join(str(b) for b in s.state_steps[:12]) + (
            ", ..." if len(s.state_steps) > 12 else "")
        if not s.state_points():
            return (f"  state points: none stand out (the fault-free run wrote under run_dir at "
                    f"{len(s.state_steps)} of {s.steps} step boundaries)")
        return (f"  state points: writes seen at the boundaries of steps {seen}; {self.at_state} "
                f"faults acted just before or after one")

    def unreached_text(self, most: int = 8) -> str:
        """The cells never reached: a kind none of whose cells was
        reached in a word, the other cells one by one, up to ``most``."""
        missed = set(self.unreached)
        whole = [k for k in self.space.kinds
                 if all(c in missed for c in self.space.cells() if c[0] == k)]
        said = [f"{k} anywhere" for k in whole]
        cells = [self.cell_text(c) for c in self.unreached if c[0] not in whole]
        more = max(0, len(cells) - most)
        return "; ".join(said + cells[:most]) + (f"; and {more} more cells" if more else "")


def coverage(space: Space, runs: Sequence[PlanRun], exhausted: bool = False) -> Coverage:
    """What ``runs`` (the search's plans, the fault-free run left out)
    covered of ``space``."""
    by_kind: Dict[str, int] = collections.Counter()
    by_role: Dict[str, int] = collections.Counter()
    by_window: Dict[int, int] = collections.Counter()
    reached = set()
    in_restart = at_state = 0
    points = set(space.state_points())
    for r in runs:
        for f in r.acted:
            in_restart += f.attempt > 0
            at_state += f.attempt == 0 and getattr(f, "step", None) in points
            cell = space.cell_of(f)
            reached.add(cell)
            by_kind[cell[0]] += 1
            by_role[cell[1]] += 1
            by_window[cell[2]] += 1
    acted = sum(r.all_acted for r in runs)
    return Coverage(
        space, len(runs), acted, len(runs) - acted, sum(r.restarted for r in runs), in_restart,
        at_state,
        dict(by_kind), dict(by_role), dict(by_window),
        tuple(c for c in space.cells() if c in reached),
        tuple(c for c in space.cells() if c not in reached), exhausted)
