"""What the controller alone knows of a run, beyond what it observed: the
fault plan set against what happened (which faults did not act, and why),
the restarts it made and those it did not, and the verdicts of earlier
attempts.  Plain records, the input of the stages after the rules
(:mod:`harness.diagnosis.stages`), as observations are of the rules.

It imports the observations only.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional, Tuple

from harness.diagnosis.observations import WorkerObservation

if TYPE_CHECKING:
    from harness.diagnosis.verdict import Verdict

# Why a fault asked for did not act.  Every one but ENDED_FIRST fails the
# run: the test would believe its job survives what never happened.
NOT_REACHED = "not_reached"                  # its worker finished without reaching its step
ENDED_FIRST = "ended_first"                  # the run ended before its step came
ATTEMPT_NEVER_RAN = "attempt_never_ran"      # planned for an attempt of the cluster that never ran
RESTART_NEVER_CAME = "restart_never_came"    # planned for a restart of its task that never came


@dataclasses.dataclass(frozen=True)
class NotActed:
    """A fault of the plan that did not act, and why (one of the constants
    above).  ``last_step``: for NOT_REACHED, its worker's last step (None
    when it reported none); ``restarts``: for RESTART_NEVER_CAME, how many
    times its worker was restarted."""

    fault: str                     # as it prints
    worker: int
    why: str
    step: Optional[int] = None     # the step it is keyed to
    attempt: int = 0
    last_step: Optional[int] = None
    restarts: int = 0

    @property
    def fails_the_run(self) -> bool:
        return self.why != ENDED_FIRST


# Why a failed attempt, or a failed task, was not started again.
BEFORE_FN = "before_fn"      # raised before fn ran: a restart brings the same fn and setup
RECURRING = "recurring"      # raised an error every attempt raises again
USED_UP = "used_up"          # the task used its restarts


@dataclasses.dataclass(frozen=True)
class NotRestarted:
    """Why ``workers`` were not restarted: one of the constants above, with
    the type of error they raised, or the restarts a task had."""

    why: str
    workers: Tuple[int, ...]
    error: str = ""
    restarts: int = 0


@dataclasses.dataclass(frozen=True)
class Story:
    """Everything the stages read besides the verdict and the observation.

    ``restarted``: under ``restart_policy="task"``, each ended process of a
    restarted task (its observation), in the order the parent restarted
    them; ``tasks_not_restarted``: why tasks that failed were not.
    ``attempts``: under ``restart_policy="cluster"``, every attempt's
    verdict in order, the last one included; ``not_restarted``: why the
    last one was not started again though restarts were left.
    ``positions`` and ``missing``: for a recorded job whose files some
    workers did not leave, the job's number of each observed worker, and
    the numbers of those that left none."""

    not_acted: Tuple[NotActed, ...] = ()
    restarted: Tuple[WorkerObservation, ...] = ()
    tasks_not_restarted: Tuple[NotRestarted, ...] = ()
    attempts: Tuple[Verdict, ...] = ()
    not_restarted: Optional[NotRestarted] = None
    positions: Tuple[int, ...] = ()
    missing: Tuple[int, ...] = ()

    def restarts_of(self, worker: int) -> int:
        """How many times ``worker``'s task was restarted."""
        return sum(1 for w in self.restarted if w.index == worker)
