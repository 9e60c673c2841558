"""stop_workers: who ended by the harness's hand, on handles that need no process."""
from __future__ import annotations

import dataclasses
from typing import Optional

from harness.controller.teardown import stop_workers
from harness.controller.watch import TrackedWorker
from harness.diagnosis.observations import WorkerObservation


@dataclasses.dataclass
class EndedHandle:
    """A worker's process as the parent sees it: ``code`` is its exit status
    now (None: running); a kill makes it -9."""
    index: int
    code: Optional[int] = None
    sent: list = dataclasses.field(default_factory=list)

    @property
    def conn(self):
        return self

    def send(self, message) -> None:
        self.sent.append(message)

    @property
    def exitcode(self) -> Optional[int]:
        return self.code

    def join(self, timeout=None) -> None:
        pass

    def descendants(self) -> list:
        return []

    def kill_tree(self, known=()) -> None:
        if self.code is None:
            self.code = -9

    def close(self) -> None:
        pass


def tracked(handle, **seen) -> TrackedWorker:
    return TrackedWorker(handle=handle, seen=WorkerObservation(index=handle.index, **seen),
                         ledger=None)


def test_a_worker_running_when_the_run_was_decided_ends_by_the_harness_even_if_it_ended_first():
    # Worker 0 is killed; worker 1 raised TensorFlow's heartbeat error and
    # exited 1 while the teardown was under way (seen on Ray): after the
    # verdict's moment, so not a death of the run.
    handles = [EndedHandle(0), EndedHandle(1, code=1)]
    workers = [tracked(h) for h in handles]
    stop_workers(workers, handles, start=0.0)
    assert [w.seen.killed_by_harness for w in workers] == [True, True]
    assert [w.seen.exit_code for w in workers] == [-9, 1]
    assert not any(w.seen.died for w in workers)


def test_a_worker_seen_to_end_before_the_decision_keeps_its_death():
    handles = [EndedHandle(0), EndedHandle(1, code=1)]
    workers = [tracked(handles[0]), tracked(handles[1], exit_code=1, exit_time=2.0)]
    stop_workers(workers, handles, start=0.0)
    assert workers[1].seen.died and not workers[1].seen.killed_by_harness
    assert workers[1].seen.exit_time == 2.0


def test_a_finished_worker_that_exits_when_released_is_not_killed():
    handles = [EndedHandle(0, code=0)]
    workers = [tracked(handles[0], returned=True)]
    stop_workers(workers, handles, start=0.0)
    assert handles[0].sent   # released
    assert not workers[0].seen.killed_by_harness and workers[0].seen.exit_code == 0
