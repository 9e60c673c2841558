"""What the launcher comparison runs, and in which order: its five
workloads (``docs/benchmark.md``) and the schedule that alternates the
launchers run by run, so that drift on a shared machine hits all alike.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

ALL_WORKLOADS = (1, 2, 3, 4, 5)
# The workloads that hang: 4's skipper lingers, so only the hang timer can
# tell; 5's returns, so the ledgers prove the deadlock at once.
HANG_WORKLOADS = (4, 5)


@dataclasses.dataclass(frozen=True)
class Workload:
    """One benchmark workload: which function, on how many workers, with what."""

    number: int
    title: str
    fn: str                     # a key of harness.bench.launchers.workers.WORKLOAD_FNS
    workers: int
    kwargs: dict
    skip: Optional[Tuple[int, int]] = None  # (worker, step) that worker leaves out
    hang_timeout: float = 10.0
    linger: bool = True           # the skipping worker stays after its loop

    @property
    def expect_hang(self) -> bool:
        return self.skip is not None

    @property
    def skipper(self) -> int:
        """The worker that leaves a step out: the culprit of a hang."""
        if self.skip is None:
            raise ValueError(f"workload {self.number} has no worker that skips a step")
        return self.skip[0]


def make_workloads(hang_timeout: float = 10.0) -> Dict[int, Workload]:
    return {
        1: Workload(1, "2 workers, 20 all-reduce steps", "allreduce", 2, {"n_steps": 20}),
        2: Workload(2, "4 workers, 20 all-reduce steps", "allreduce", 4, {"n_steps": 20}),
        3: Workload(3, "seed training loop, 2 workers, 100 steps", "seed_training", 2,
                    {"epochs": 10, "steps_per_epoch": 10}),
        4: Workload(4, f"2 workers, worker 1 skips step 5 (T={hang_timeout:g} s)", "allreduce", 2,
                    {"n_steps": 20}, skip=(1, 5), hang_timeout=hang_timeout),
        5: Workload(5, f"2 workers, worker 1 skips step 5 and returns (T={hang_timeout:g} s)",
                    "allreduce", 2, {"n_steps": 20}, skip=(1, 5), hang_timeout=hang_timeout,
                    linger=False),
    }


def schedule(launchers: Sequence[str], workloads: Sequence[int], repeats: int,
             hang_repeats: int) -> List[tuple]:
    """The run order: ``(launcher, workload, repeat, cold)`` tuples.

    One cold run per launcher first, then rounds in which each workload runs
    under every launcher in turn (A B C A B C ...), so drift hits all alike.
    The hanging workloads run only in the first ``hang_repeats`` rounds.
    """
    completing = [w for w in workloads if w not in HANG_WORKLOADS]
    cold_workload = completing[0] if completing else 1
    plan = [(name, cold_workload, -1, True) for name in launchers]
    for rep in range(repeats):
        for w in workloads:
            if w in HANG_WORKLOADS and rep >= hang_repeats:
                continue
            # The floor cannot tell a hang: it runs the completing workloads only.
            plan.extend((name, w, rep, False) for name in launchers
                        if not (name == "floor" and w in HANG_WORKLOADS))
    return plan
