"""Memory that grows: each worker's memory samples against its steps, a
robust rate of growth per step, and whether it grows steadily.  Pure
functions of the observations (no TensorFlow).

Each worker notes its resident set at each step boundary (``STEP``
events' ``data``, a ``pread`` of ``/proc/self/statm``: a point per step
however fast the steps are).  Where it noted none (older records, a
backend without), the parent's samples stand in
(:mod:`harness.controller.memory`, about 10 a second): a sample taken while
the worker was in step ``s`` (after its boundary ``s``, before ``s + 1``)
is paired with ``s``, the last sample in each step standing for it.  The first steps are
TensorFlow's warm-up (tracing, the allocator's first pools, the
collectives' first buffers): the first :data:`WARMUP_FRACTION` of the
steps, and at least :data:`WARMUP_STEPS`, are left out of the fit.  The
rate is the Theil-Sen slope (the median of the slopes between every pair
of points): a few outliers (a collection, a buffer freed late) move it
little.  A worker *grows steadily* when its rate is at least the limit,
each half of its fitted steps grows at at least :data:`STEADY_SHARE` of
that rate (so that one jump, a cache filled once, does not read as a
leak), and it grew by :data:`MIN_GROWTH_MIB` at least over them.

The defaults come from the catalogue (TensorFlow 2.21, 2 workers, 2
cores; 25 completed runs, 50 worker-runs, of ``test_fit``, ``test_keras``,
``test_seed``, ``test_tutorials``, ``test_data`` and ``test_collectives``,
measured): warm-up included, TensorFlow grows 0.03-1.7 MiB per step, 0.2-18
MiB in all.  Leaving out 3 steps, 21
worker-runs had enough steps to fit, at up to 0.52 MiB per step (a
15-step Keras ``fit``), and one grew "steadily" at 0.26 MiB per step, by
1.7 MiB in all; leaving out 5, the 8 with enough steps lie within
0.03-0.11 MiB per step and 0.9-6.0 MiB in all.  A worker keeping 1 MiB per
step (``scenarios/test_memory.py``) fits at 1.06 MiB per step, 30 MiB over
28 steps, and its peer and the same job without the leak at 0.02-0.06.
"""
from __future__ import annotations

import bisect
import dataclasses
import math
import statistics
from typing import List, Optional, Sequence, Tuple

from harness.core import protocol
from harness.diagnosis.observations import RunObservation, WorkerObservation
from harness.diagnosis.words import name, names

MIB = 1 << 20
# The warm-up left out of the fit: this part of the steps, at least this many.
WARMUP_FRACTION = 0.25
WARMUP_STEPS = 5
# Fewer fitted points than this, or fewer steps between the first and the
# last: no rate (too little to tell growth from noise).
MIN_POINTS = 8
MIN_STEPS = 10
# The rate above which a worker's memory grows, MiB per step (the default of
# RunResult.assert_memory_flat and of the diagnosis's line): twice the
# catalogue's largest past the warm-up.
FLAT_MIB_PER_STEP = 0.25
# Each half of the fitted steps grows at at least this share of the rate.
STEADY_SHARE = 0.5
# A worker that grew less than this over the fitted steps does not grow
# steadily, whatever its rate (the catalogue's healthy runs: at most 6 MiB).
MIN_GROWTH_MIB = 8.0
# At most this many points go into a slope (evenly spaced): its cost is
# their square.
MAX_FIT_POINTS = 200

Point = Tuple[int, int]   # (step, bytes)


@dataclasses.dataclass(frozen=True)
class MemoryGrowth:
    """One worker's memory over its run (``RunResult.memory``).

    ``samples`` are the parent's ``(seconds since the run started, bytes)``;
    ``points`` the ``(step, bytes)`` each step ended with (a step counted
    by its place among the worker's boundaries, from 0); ``fitted`` the
    points after the warm-up that the rate is fitted on;
    ``mib_per_step`` the rate (None, with ``why_none``, where there is too
    little to fit); ``steady`` whether it grows steadily at at least
    :data:`FLAT_MIB_PER_STEP` and by :data:`MIN_GROWTH_MIB` (see the
    module docstring)."""

    worker: int
    samples: Tuple[Tuple[float, int], ...]
    points: Tuple[Point, ...]
    fitted: Tuple[Point, ...]
    mib_per_step: Optional[float]
    steady: bool = False
    why_none: str = ""

    @property
    def steps(self) -> int:
        """How many steps the rate is fitted over."""
        return self.fitted[-1][0] - self.fitted[0][0] if self.fitted else 0

    @property
    def first_mib(self) -> Optional[float]:
        """The resident set at the first fitted step, MiB."""
        return self.fitted[0][1] / MIB if self.fitted else None

    @property
    def last_mib(self) -> Optional[float]:
        """The resident set at the last fitted step, MiB."""
        return self.fitted[-1][1] / MIB if self.fitted else None

    def grows(self, mib_per_step: float = FLAT_MIB_PER_STEP) -> bool:
        """Whether the fitted rate is above ``mib_per_step``."""
        return self.mib_per_step is not None and self.mib_per_step > mib_per_step


def step_points(samples: Sequence[Tuple[float, int]],
                step_times: Sequence[float]) -> Tuple[Point, ...]:
    """``(step, bytes)`` per step: the last sample taken while the worker
    was in that step, the step counted by its place among the worker's
    boundaries (``step_times``, in order: its number for one loop of
    ``ctx.steps``, and a second loop that numbers from 0 again goes on
    counting); samples before its first boundary are left out."""
    last = {}
    for t, taken in samples:
        i = bisect.bisect_right(step_times, t) - 1
        if i >= 0:
            last[i] = taken
    return tuple(sorted(last.items()))


def after_warmup(points: Sequence[Point]) -> Tuple[Point, ...]:
    """The points past the warm-up (see the module docstring)."""
    if not points:
        return ()
    first, last = points[0][0], points[-1][0]
    skip = max(WARMUP_STEPS, math.ceil(WARMUP_FRACTION * (last - first + 1)))
    return tuple(p for p in points if p[0] >= first + skip)


def theil_sen(points: Sequence[Point]) -> Optional[float]:
    """The median of the slopes (bytes per step) between every two points
    at different steps; None with fewer than two."""
    if len(points) > MAX_FIT_POINTS:
        stride = len(points) / MAX_FIT_POINTS
        points = [points[int(i * stride)] for i in range(MAX_FIT_POINTS)]
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points)
              for x2, y2 in points[i + 1:] if x2 != x1]
    return statistics.median(slopes) if slopes else None


def is_steady(fitted: Sequence[Point], rate: float, mib_per_step: float) -> bool:
    """Whether ``fitted`` grows at ``rate`` (bytes per step), at least
    ``mib_per_step``, by :data:`MIN_GROWTH_MIB` over its steps, and each
    half of it at :data:`STEADY_SHARE` of the rate."""
    span = fitted[-1][0] - fitted[0][0]
    if rate < mib_per_step * MIB or rate * span < MIN_GROWTH_MIB * MIB:
        return False
    half = len(fitted) // 2
    halves = [theil_sen(fitted[:half + 1]), theil_sen(fitted[half:])]
    return all(h is not None and h >= STEADY_SHARE * rate for h in halves)


def boundary_points(w: WorkerObservation) -> Tuple[Point, ...]:
    """``(step, bytes)`` from the resident set the worker noted at each of
    its step boundaries (the step counted by its place among them, as in
    :func:`step_points`); empty where it noted none."""
    steps = [e for e in w.events if e.kind == protocol.STEP and isinstance(e.step, int)]
    noted = tuple((i, e.data) for i, e in enumerate(steps)
                  if isinstance(e.data, int) and not isinstance(e.data, bool) and e.data > 0)
    return noted if steps and len(noted) >= len(steps) // 2 else ()


def growth(w: WorkerObservation, mib_per_step: float = FLAT_MIB_PER_STEP) -> MemoryGrowth:
    """Worker ``w``'s :class:`MemoryGrowth`: from the resident set it noted
    at each step boundary, else from the parent's samples."""
    step_times = [e.time for e in w.events
                  if e.kind == protocol.STEP and isinstance(e.step, int)]
    points = boundary_points(w) or step_points(w.memory, step_times)
    fitted = after_warmup(points)
    why = ("no samples (its backend reads no memory)" if not points and not w.memory
           else "no steps reported" if not step_times
           else f"too few steps past the warm-up ({len(fitted)})"
           if len(fitted) < MIN_POINTS or fitted[-1][0] - fitted[0][0] < MIN_STEPS else "")
    rate = None if why else theil_sen(fitted)
    if rate is None:
        return MemoryGrowth(w.index, w.memory, points, fitted, None, why_none=why)
    return MemoryGrowth(w.index, w.memory, points, fitted, rate / MIB,
                        is_steady(fitted, rate, mib_per_step))


def memory_growth(obs: RunObservation,
                  mib_per_step: float = FLAT_MIB_PER_STEP) -> Tuple[MemoryGrowth, ...]:
    """Every worker's :class:`MemoryGrowth`, by index."""
    return tuple(growth(w, mib_per_step) for w in obs.workers)


def growth_text(g: MemoryGrowth) -> str:
    """``worker 1 grows +1.0 MiB per step over 200 steps (RSS 410 -> 610 MiB)``."""
    return (f"{name(g.worker)} grows {g.mib_per_step:+.2f} MiB per step over {g.steps} steps "
            f"(RSS {g.first_mib:.0f} -> {g.last_mib:.0f} MiB)")


def memory_lines(obs: RunObservation) -> List[str]:
    """The diagnosis's line on memory: the workers whose memory grows
    steadily, with their rates; none when no worker does."""
    grown = memory_growth(obs)
    growing = [g for g in grown if g.steady]
    if not growing:
        return []
    flat = [g for g in grown if g.mib_per_step is not None and not g.grows()]
    uneven = [g for g in grown if not g.steady and g.grows()]
    unfitted = [g for g in grown if g.mib_per_step is None]
    parts = [growth_text(g) for g in growing]
    parts += [f"{name(g.worker)}: {g.mib_per_step:+.2f} MiB per step, not steadily"
              for g in uneven]
    if unfitted:
        parts.append(f"{names([g.worker for g in unfitted])}: no rate ({unfitted[0].why_none})")
    if flat and not uneven and not unfitted:
        parts.append("the other stays flat" if len(flat) == 1 else "the others stay flat")
    elif flat:
        parts.append(f"{names([g.worker for g in flat])} flat")
    return ["memory: " + "; ".join(parts)]
