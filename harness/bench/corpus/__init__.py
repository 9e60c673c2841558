"""The corpus of users' bugs: real jobs, each broken as a user broke it and
fixed as the user fixed it, with the truth written beside it.

The injected faults of :mod:`harness.bench.accuracy` stand in for bugs;
these are the bugs themselves, in the code users write: ``model.fit`` with
tf_keras and Keras 3, custom training loops, ``tf.data`` pipelines,
callbacks, restarts and checkpoints.  No job calls the harness: each reads
its ``TF_CONFIG`` and builds its strategy as the user's script does, and a
restart is the job's own exit (a preempted pod), never a fault of the plan.

A :class:`Case` holds the two jobs, the clusters to run them on and the
:class:`Truth`: the task at fault, or that no single task is.  The family
modules (:mod:`~harness.bench.corpus.fit`, :mod:`~harness.bench.corpus.callbacks`,
:mod:`~harness.bench.corpus.loops`, :mod:`~harness.bench.corpus.data`,
:mod:`~harness.bench.corpus.restarts`) each give a ``CASES`` tuple;
:func:`cases` gathers them.  :func:`judge` sets a verdict against the truth,
a pure function; ``python -m harness.bench.corpus`` runs every case and
writes the table of ``docs/accuracy.md``'s corpus section.

This module imports no TensorFlow: the jobs import it when they run.
"""
from __future__ import annotations

import dataclasses
import enum
import importlib
from typing import Callable, Dict, FrozenSet, Iterable, Mapping, Optional, Sequence, Tuple, Union

FAMILIES = ("fit (tf_keras)", "fit (Keras 3)", "callbacks", "custom loop", "tf.data",
            "restarts and checkpoints")
MODULES = ("harness.bench.corpus.fit", "harness.bench.corpus.callbacks",
           "harness.bench.corpus.loops", "harness.bench.corpus.data",
           "harness.bench.corpus.restarts")


@dataclasses.dataclass(frozen=True)
class Truth:
    """Who is at fault: ``tasks``, indexes in the run's workers (a chief
    first, as :class:`~harness.core.tfconfig.ClusterShape` orders them).
    ``single``: one task is to blame alone (``tasks`` holds it); else no
    single task is, and ``tasks`` are the ones involved (a verdict that
    names one of them alone is wrong)."""
    tasks: FrozenSet[int]
    single: bool = True

    def __post_init__(self):
        if not self.tasks:
            raise ValueError("Truth: at least one task is involved")
        if self.single and len(self.tasks) != 1:
            raise ValueError(f"Truth: a single task at fault, not {sorted(self.tasks)}")

    def __str__(self) -> str:
        if self.single:
            return f"task {next(iter(self.tasks))}"
        return "no single task (" + ",".join(map(str, sorted(self.tasks))) + ")"


def at_fault(task: int) -> Truth:
    return Truth(frozenset({task}))


def no_single(tasks: Iterable[int]) -> Truth:
    return Truth(frozenset(tasks), single=False)


TruthOf = Union[Truth, Callable[[int], Truth]]   # a truth, or one per cluster size


@dataclasses.dataclass(frozen=True)
class Case:
    """One user's bug.  ``broken`` and ``fixed`` are module-level functions
    called on every task as ``fn(directory, **kwargs)``: ``directory`` a
    fresh directory of the run's own, shared by its tasks (a bucket).

    ``sizes``: the clusters it runs on, tasks in the collectives;
    ``chief``: one of them is a chief (``chief:1,worker:N-1``).  ``keras``:
    ``"tf_keras"`` runs it with ``TF_USE_LEGACY_KERAS=1``.  ``run``: more
    arguments of :meth:`~harness.controller.cluster.Cluster.run`
    (``restarts``, ``restart_policy``, ``on_return``, ``step_fn``)."""
    name: str
    family: str
    source: str          # where users reported it: an issue, a forum thread, a guide
    summary: str         # the bug in one line, as a user would tell it
    broken: Callable
    fixed: Callable
    truth: TruthOf
    sizes: Tuple[int, ...] = (2, 3)
    chief: bool = False
    keras: Optional[str] = None
    timeout: float = 10.0
    grace: float = 2.0
    kwargs: Mapping = dataclasses.field(default_factory=dict)
    run: Mapping = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"Case {self.name!r}: family {self.family!r} is not one of {FAMILIES}")
        if self.keras not in (None, "tf_keras"):
            raise ValueError(f"Case {self.name!r}: keras={self.keras!r}, not None or 'tf_keras'")
        if not self.sizes or min(self.sizes) < 2:
            raise ValueError(f"Case {self.name!r}: sizes {self.sizes!r}, each 2 or more")

    def truth_at(self, size: int) -> Truth:
        truth = self.truth(size) if callable(self.truth) else self.truth
        if max(truth.tasks) >= size:
            raise ValueError(f"Case {self.name!r}: truth {truth} outside {size} tasks")
        return truth


class Answer(str, enum.Enum):
    """A run's answer: the first five for a broken job, the last two for its fixed twin."""
    NAMED = "named"                       # the task at fault, alone
    CANNOT_TELL = "cannot tell"           # ambiguous, the truth among the candidates
    WRONG = "wrong"                       # anything else: a healthy task named, or none
    DID_NOT_BREAK = "did not break"       # the broken job completed: an error of the corpus
    TWIN_FAILED = "twin did not complete"  # the fixed job did not: an error of the corpus
    TWIN_COMPLETED = "twin completed"

    def __str__(self) -> str:
        return self.value


ERRORS = (Answer.WRONG, Answer.DID_NOT_BREAK, Answer.TWIN_FAILED)


def judge(variant: str, completed: bool, culprits: Sequence[int], ambiguous: bool,
          truth: Truth) -> Answer:
    """Where one run stands against the truth (pure)."""
    if variant == "fixed":
        return Answer.TWIN_COMPLETED if completed else Answer.TWIN_FAILED
    if completed:
        return Answer.DID_NOT_BREAK
    named = set(culprits)
    if not named:
        return Answer.WRONG
    if ambiguous:
        return Answer.CANNOT_TELL if named & truth.tasks else Answer.WRONG
    if truth.single:
        return Answer.NAMED if named == truth.tasks else Answer.WRONG
    # No single task is at fault: a verdict is right only naming all involved.
    return Answer.NAMED if named == truth.tasks and len(named) > 1 else Answer.WRONG


def cases(modules: Sequence[str] = MODULES) -> Tuple[Case, ...]:
    """Every case of the family modules, in their order; names are unique."""
    found: Dict[str, Case] = {}
    for name in modules:
        for case in importlib.import_module(name).CASES:
            if case.name in found:
                raise ValueError(f"two cases named {case.name!r}")
            found[case.name] = case
    return tuple(found.values())
