"""The space a search draws its plans from, and the draws: plain functions
and a seeded draw, no TensorFlow, no hypothesis.

A fault's place in the space is its *cell*: its kind, its worker's role
(worker 0, which does the chief's part of a job, or one of the others, which
are alike unless the job tells them apart) and the window of steps it falls
in (the job's steps cut in up to :data:`WINDOWS` runs of steps). Where the
fault-free run wrote files under its ``run_dir`` (its *state points*: the
step boundaries at which a write was seen), :class:`Draws` first crashes
each role just before and just after each write, and tries each file fault
asked for during it, as crash-recovery bug finders place their faults around
the state a system keeps (CrashTuner, Legolas). Then it picks the next plan
from the cell run least so far, so a short search spreads over every kind,
role and part of the job before it goes deeper, and a plan is never drawn
twice; a kind the property rarely fails on comes later as well as less
often (:func:`kind_weights`). Within a cell it takes a step no fault of its
family has acted at yet (a crash, an error and a preemption all stop a
worker there, and a job's state on its disk is where the worker stopped,
whatever stopped it), so the stops sweep every step of a job that writes at
each of them before any step gets a second. With ``max_faults`` > 1 it also draws plans of
several faults: a second fault in the restart attempt of a plan that made a
restart happen (a fault during recovery), or elsewhere in the first attempt;
the first such second faults are crashes at the step the restart attempt
began at, right after the job restored its state. Plans that made a restart
happen are the search's guide: a share of the draws goes to their neighbours
(the step before or after, the other role).
"""
from __future__ import annotations

import collections
import dataclasses
import random
from typing import Callable, Dict, Iterator, List, Optional, Protocol, Sequence, Set, Tuple

from harness import faults as F
from harness.explore.shrink import Plan, valid
from harness.strategies import SHORT_SECONDS

Cell = Tuple[str, str, int]   # (kind, role, window)

# The most windows a job's steps are cut in.
WINDOWS = 4
# The roles, by what a worker does for the job.
CHIEF_ROLE, OTHER_ROLE = "worker 0", "another worker"
# A parameter-server cluster's roles, by task type.
TASK_ROLES = {"chief": "the chief", "worker": "a worker", "ps": "a parameter server"}
# The share of draws that follow a plan which made a restart happen, once
# there is one, and that add a fault to such a plan (max_faults > 1).
NEAR_SHARE, MORE_SHARE = 0.25, 0.35
# The file faults tried during each write of the fault-free run, first:
# those that act on a write (a full disk, a cut write, a lost rename).
DURING = ("TornWrite", "LostRename", "DiskFull")
# How many draws of plans already run the uniform order makes in a row
# before it picks among the plans left.
UNIFORM_TRIES = 1000
# The kinds that stop a worker at a step (its process ends or it leaves the
# job): one family, in the order a fault point is tried with them.
STOPPING = ("Crash", "Preempt", "RaiseError")


def family(kind: str) -> str:
    """The kinds whose faults leave a job in one state at a step: the
    stopping kinds are one family, each other kind its own."""
    return "stop" if kind in STOPPING else kind


def kind_weights(kinds: Sequence[str], property: str) -> Dict[str, float]:
    """How much of the search each kind gets, relative to a crash's: under
    ``survives`` a delay or a pause far under the hang timeout rarely
    breaks a job, so they are drawn a quarter and half as often."""
    rare = {"Delay": 0.25, "SlowWrite": 0.25, "Pause": 0.5} if property == "survives" else {}
    return {k: rare.get(k, 1.0) for k in kinds}


def _settings(kind: str, for_ever: bool) -> Tuple[tuple, ...]:
    """Each setting a fault of ``kind`` is drawn with, as constructor arguments."""
    if kind == "Crash":
        return tuple((h,) for h in F.CRASH_HOW)
    if kind in ("Delay", "SlowWrite"):
        return tuple((s,) for s in SHORT_SECONDS)
    if kind == "Pause":
        return tuple((s,) for s in SHORT_SECONDS + ((None,) if for_ever else ()))
    return ((),)


@dataclasses.dataclass(frozen=True)
class Space:
    """Every plan a search may run: faults of ``kinds`` at workers
    ``0..workers-1`` and steps ``0..steps-1``; with ``max_faults`` > 1, up
    to that many, in attempts ``0..attempts-1``."""

    workers: int
    steps: int
    kinds: Tuple[str, ...]
    max_faults: int = 1
    attempts: int = 1
    for_ever: bool = False
    state_steps: Tuple[int, ...] = ()   # boundaries where the fault-free run had written
    # The workers other than 0 are alike (the fault-free run could not tell
    # them apart): a plan is one with every plan that differs from it only
    # in which of them its faults fall on (FlyMC's symmetry), and the
    # one-fault plans of their role are those of worker 1.
    interchangeable: bool = True
    # Steps that began an epoch (a Keras fit's), where its callbacks act.
    epoch_steps: Tuple[int, ...] = ()
    # A parameter-server cluster's task types, a worker index's each: its
    # roles are the task types (the chief, a worker, a parameter server).
    task_types: Tuple[str, ...] = ()

    def stopping_kind(self) -> Optional[str]:
        """The kind that tries a fault point: a crash, else a preemption,
        else an error; None when ``kinds`` has none of them."""
        return next((k for k in STOPPING if k in self.kinds), None)

    def _writes_stand_out(self) -> bool:
        """The job writes at fewer than half its steps."""
        return bool(self.state_steps) and 2 * len(self.state_steps) <= self.steps

    def state_points(self) -> Tuple[int, ...]:
        """The steps just before and just after each write: a write seen at
        boundary ``b`` was made in step ``b - 1``, so a fault at ``b - 1``
        comes before it and one at ``b`` after it.  Where the job writes at
        most of its steps no write stands out: then the steps just before
        and just after each epoch boundary, where a Keras job's callbacks
        act, if it has any; else none."""
        marks = self.state_steps if self._writes_stand_out() else self.epoch_steps
        return tuple(sorted({s for b in marks for s in (b - 1, b) if 0 <= s < self.steps}))

    def write_steps(self) -> Tuple[int, ...]:
        """The steps in which the fault-free run wrote (a write seen at
        boundary ``b`` was made in step ``b - 1``), where they stand out."""
        if not self._writes_stand_out():
            return ()
        return tuple(sorted({b - 1 for b in self.state_steps if 0 <= b - 1 < self.steps}))

    def windows(self) -> Tuple[range, ...]:
        """The job's steps cut in up to :data:`WINDOWS` runs, the first
        ones longer by one where they do not divide evenly."""
        n = min(WINDOWS, self.steps)
        size, extra = divmod(self.steps, n)
        out, start = [], 0
        for i in range(n):
            end = start + size + (i < extra)
            out.append(range(start, end))
            start = end
        return tuple(out)

    def window_of(self, step: int) -> int:
        return next(i for i, w in enumerate(self.windows()) if step in w)

    def roles(self) -> Tuple[str, ...]:
        if self.task_types:
            return tuple(dict.fromkeys(TASK_ROLES[t] for t in self.task_types))
        return (CHIEF_ROLE, OTHER_ROLE) if self.workers > 1 else (CHIEF_ROLE,)

    def role_of(self, worker: int) -> str:
        if self.task_types:
            return TASK_ROLES[self.task_types[worker]]
        return CHIEF_ROLE if worker == 0 else OTHER_ROLE

    def workers_of(self, role: str) -> Sequence[int]:
        """The workers a plan of ``role`` is drawn at: one of the others
        stands for them all where they are interchangeable."""
        if self.task_types:
            return [i for i, t in enumerate(self.task_types) if TASK_ROLES[t] == role]
        if role == CHIEF_ROLE:
            return range(1)
        return range(1, min(2, self.workers) if self.interchangeable else self.workers)

    def key(self, plan: Sequence[F.Fault]) -> Plan:
        """``plan`` in its one form (:func:`canonical`); where the workers
        other than 0 are interchangeable, they are renamed 1, 2, ... in the
        order the plan's faults first name them, so plans that differ only
        in which of them they fall on are one."""
        if not self.interchangeable:
            return canonical(plan)
        names: Dict[int, int] = {}
        # Named in an order that does not depend on the names themselves.
        for f in sorted(plan, key=lambda f: (f.attempt, getattr(f, "step", 0), type(f).__name__,
                                             repr(dataclasses.replace(f, worker=0)))):
            if f.worker and f.worker not in names:
                names[f.worker] = len(names) + 1
        return canonical([dataclasses.replace(f, worker=names.get(f.worker, 0)) for f in plan])

    def cells(self) -> Tuple[Cell, ...]:
        return tuple((k, r, w) for k in self.kinds for r in self.roles()
                     for w in range(len(self.windows())))

    def cell_of(self, fault: F.Fault) -> Cell:
        return (type(fault).__name__, self.role_of(fault.worker),
                self.window_of(getattr(fault, "step", 0)))

    def singles(self, cell: Cell) -> List[Plan]:
        """Every one-fault plan of ``cell``, in the first attempt."""
        kind, role, window = cell
        cls = getattr(F, kind)
        return [(cls(w, s, *setting),) for w in self.workers_of(role)
                for s in self.windows()[window] for setting in _settings(kind, self.for_ever)]

    def size(self) -> int:
        """How many one-fault plans there are."""
        return sum(len(self.singles(c)) for c in self.cells())


def _point(fault: F.Fault) -> Tuple[str, int]:
    """Where a fault leaves the job: its family and its step."""
    return family(type(fault).__name__), getattr(fault, "step", 0)


def canonical(plan: Sequence[F.Fault]) -> Plan:
    """A plan's faults in one order (by attempt, step, worker): two plans
    that differ only in their order are one."""
    return tuple(sorted(plan, key=lambda f: (f.attempt, getattr(f, "step", 0), f.worker,
                                             type(f).__name__, repr(f))))


class Draws:
    """The next plan to run, seeded: ``next(ran, restarted)`` with the
    plans run so far and those of them that made a restart happen; None
    when every plan the draws can reach has run."""

    def __init__(self, space: Space, seed: int, weights: Optional[Dict[str, float]] = None):
        self.space = space
        self.rng = random.Random(seed)
        self.weights = weights or dict.fromkeys(space.kinds, 1.0)
        self.tries: Dict[Cell, int] = dict.fromkeys(space.cells(), 0)
        self.left: Dict[Cell, List[Plan]] = {}
        self.first = self._around_state()

    def _around_state(self) -> List[Plan]:
        """A crash (else a preemption, else an error) of each role at each
        state point, and each file fault of ``kinds`` (:data:`DURING`) of
        each role in each step that wrote, which acts during that write;
        in a drawn order: whether a job breaks before, during or after its
        write is its own business."""
        s = self.space
        kind = s.stopping_kind()
        plans: List[Plan] = [] if kind is None else [
            (getattr(F, kind)(self.rng.choice(s.workers_of(role)), step),)
            for step in s.state_points() for role in s.roles()]
        plans += [(getattr(F, during)(self.rng.choice(s.workers_of(role)), step),)
                  for during in DURING if during in s.kinds
                  for step in s.write_steps() for role in s.roles()]
        self.rng.shuffle(plans)
        return plans

    def _single(self, ran: Set[Plan], restarted: Sequence[Plan]) -> Optional[Plan]:
        open_cells = [c for c in self.space.cells() if self._left_in(c, ran)]
        if not open_cells:
            return None
        # A cell's next try counts for 1 / its kind's weight: a kind drawn a
        # quarter as often also comes first only after four rounds of the rest.
        def due(c: Cell) -> float:
            return (self.tries[c] + 1) / self.weights[c[0]]
        least = min(due(c) for c in open_cells)
        cell = self.rng.choice([c for c in open_cells if due(c) == least])
        self.tries[cell] += 1
        # Of the cell's plans, one at a step its family has covered least: a
        # stop covers its step when the job was restarted after it (one that
        # ended the job some other way, or never acted, left the restart
        # there untried), then by how many of the family ran there at all.
        came_back = collections.Counter(_point(p[0]) for p in restarted if len(p) == 1)
        ran_at = collections.Counter(_point(p[0]) for p in ran if len(p) == 1)
        plans = self.left[cell]

        def covered(p: Plan) -> Tuple[int, int]:
            return came_back[_point(p[0])], ran_at[_point(p[0])]
        fewest = min(covered(p) for p in plans)
        at = [i for i, p in enumerate(plans) if covered(p) == fewest]
        return plans.pop(self.rng.choice(at))

    def _left_in(self, cell: Cell, ran: Set[Plan]) -> bool:
        if cell not in self.left:
            self.left[cell] = self.space.singles(cell)
        self.left[cell] = [p for p in self.left[cell] if p not in ran]
        return bool(self.left[cell])

    def _fresh(self, plan: Plan, ran: Set[Plan]) -> Optional[Plan]:
        """``plan`` in its one form, unless it (or a plan it is one with) ran."""
        plan = self.space.key(plan)
        return plan if plan not in ran and valid(plan) else None

    def _near(self, plan: Plan) -> Iterator[Plan]:
        """Plans one step or the other role from ``plan``'s first fault."""
        f = plan[0]
        moves: List[F.Fault] = []
        if isinstance(f, F.StepFault):
            moves += [dataclasses.replace(f, step=s) for s in (f.step - 1, f.step + 1)
                      if 0 <= s < self.space.steps]
        moves += [dataclasses.replace(f, worker=w) for role in self.space.roles()
                  if role != self.space.role_of(f.worker) for w in self.space.workers_of(role)]
        self.rng.shuffle(moves)
        return ((g,) + plan[1:] for g in moves)

    def _more(self, plan: Plan, resumed: Optional[int] = None) -> Iterator[Plan]:
        """``plan`` with one fault more: in the restart attempt when there
        is one (first a crash of each role at ``resumed``, the step the
        restart attempt began at, right after the job restored its state),
        else elsewhere in the first."""
        later = self.space.attempts > 1 and all(f.attempt == 0 for f in plan)
        first = self.space.stopping_kind()
        if later and resumed is not None and first is not None and 0 <= resumed < self.space.steps:
            roles = list(self.space.roles())
            self.rng.shuffle(roles)
            for role in roles:
                worker = self.rng.choice(self.space.workers_of(role))
                yield canonical(plan + (getattr(F, first)(worker, resumed, attempt=1),))
        for _ in range(8):
            kind = self.rng.choice(self.space.kinds)
            setting = self.rng.choice(_settings(kind, self.space.for_ever))
            worker = self.rng.randrange(self.space.workers)
            step = self.rng.randrange(self.space.steps)
            attempt = self.rng.randrange(1, self.space.attempts) if later else 0
            yield canonical(plan + (getattr(F, kind)(worker, step, *setting, attempt=attempt),))

    def next(self, ran: Set[Plan], restarted: Sequence[Plan],
             resumed: Optional[Dict[Plan, int]] = None) -> Optional[Plan]:
        """``resumed``: for a plan that made a restart happen, the step its
        restart attempt began at, where known."""
        ran = {self.space.key(p) for p in ran}
        while self.first:
            plan = self.space.key(self.first.pop(0))
            if plan not in ran:
                return plan
        fresh = [p for p in restarted if len(p) < self.space.max_faults] \
            if self.space.max_faults > 1 else []
        if fresh and self.rng.random() < MORE_SHARE:
            base = self.rng.choice(fresh)
            for plan in self._more(base, (resumed or {}).get(base)):
                if (new := self._fresh(plan, ran)) is not None:
                    return new
        if restarted and self.rng.random() < NEAR_SHARE:
            for plan in self._near(self.rng.choice(list(restarted))):
                if (new := self._fresh(plan, ran)) is not None:
                    return new
        single = self._single(ran, [self.space.key(p) for p in restarted])
        if single is not None or self.space.max_faults == 1:
            return single
        # Every one-fault plan has run: plans of several faults, built on them.
        bases = sorted((p for p in ran if 0 < len(p) < self.space.max_faults), key=repr)
        for _ in range(4 * len(bases)):
            for plan in self._more(self.rng.choice(bases)):
                if (new := self._fresh(plan, ran)) is not None:
                    return new
        return None


class UniformDraws:
    """The baseline the guided draws are measured against, as the search
    drew before them: each plan one fault, its kind, worker, step and
    setting each drawn uniformly, nothing learnt from the runs; a plan
    drawn again is drawn anew (after :data:`UNIFORM_TRIES` such draws in a
    row, one of the plans not yet run is picked); None once every one-fault
    plan has run."""

    def __init__(self, space: Space, seed: int, weights: Optional[Dict[str, float]] = None):
        self.space = dataclasses.replace(space, interchangeable=False)   # it knows no symmetry
        self.rng = random.Random(seed)

    def next(self, ran: Set[Plan], restarted: Sequence[Plan],
             resumed: Optional[Dict[Plan, int]] = None) -> Optional[Plan]:
        s = self.space
        for _ in range(UNIFORM_TRIES):
            kind = self.rng.choice(s.kinds)
            setting = self.rng.choice(_settings(kind, s.for_ever))
            plan = (getattr(F, kind)(self.rng.randrange(s.workers), self.rng.randrange(s.steps),
                                     *setting),)
            if plan not in ran:
                return plan
        left = [p for c in s.cells() for p in s.singles(c) if p not in ran]
        return self.rng.choice(left) if left else None


class DrawOrder(Protocol):
    """What the search asks of its draws (see :meth:`Draws.next`)."""
    space: Space

    def next(self, ran: Set[Plan], restarted: Sequence[Plan],
             resumed: Optional[Dict[Plan, int]] = None) -> Optional[Plan]: ...


# The draw orders a search can use, by name: ``guided`` (the search's own)
# and ``uniform`` (the baseline the benchmark compares it with).
ORDERS: Dict[str, Callable[[Space, int, Optional[Dict[str, float]]], DrawOrder]] = {
    "guided": Draws,
    "uniform": UniformDraws,
}
