"""The parent's samples of each worker's memory, taken at a steady rate as
the watch loop runs: no message, hook or cost in the workers.

Each sample is ``(seconds since the run started, bytes)``, on the clock of
the workers' ``STEP`` events, so the diagnosis (:mod:`harness.diagnosis.memory`)
pairs it with the step the worker was in.  How a worker's memory is read
is its backend's (:meth:`~harness.launch.base.WorkerHandle.memory_bytes`:
its resident set, from ``/proc``, where the worker runs on this machine; a
backend that cannot read it records no samples).

The interval is :data:`MIN_INTERVAL` for the first
``MIN_INTERVAL * SAMPLES_PER_ELAPSED`` seconds, then a
``1/SAMPLES_PER_ELAPSED`` part of the time elapsed: 10 samples a second
for runs of up to 24 s, one each 0.25 s at 60 s, and a number of samples
that grows only with the logarithm of a long run's length.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

if TYPE_CHECKING:
    from harness.controller.watch import TrackedWorker
    from harness.launch.base import WorkerHandle

MIN_INTERVAL = 0.1
SAMPLES_PER_ELAPSED = 240


def interval(elapsed: float) -> float:
    """Seconds to the next sample, ``elapsed`` seconds into a run."""
    return max(MIN_INTERVAL, elapsed / SAMPLES_PER_ELAPSED)


def memory_of(handle: WorkerHandle) -> Optional[int]:
    """What ``handle``'s backend reads of its worker's memory (None: nothing)."""
    read = getattr(handle, "memory_bytes", None)
    return read() if read is not None else None


class MemorySampler:
    """Samples the live workers' memory each :func:`interval`, when asked by
    the watch loop (:meth:`sample`)."""

    def __init__(self, start: float):
        self.start = start
        self.next_at = start

    def sample(self, workers: Sequence[TrackedWorker], now: float) -> float:
        """Add a sample to each live worker when one is due; return when
        the next one is."""
        if now >= self.next_at:
            elapsed = now - self.start
            for worker in workers:
                if worker.pending:
                    taken = memory_of(worker.handle)
                    if taken is not None:
                        worker.note(memory=worker.seen.memory + ((round(elapsed, 4), taken),))
            self.next_at = now + interval(elapsed)
        return self.next_at
