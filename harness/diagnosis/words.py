"""Small phrases the rules and the rendering share: worker lists, step ranges."""
from __future__ import annotations

import contextlib
import contextvars
from typing import TYPE_CHECKING, Callable, Iterator, List, Optional, Sequence

if TYPE_CHECKING:
    from harness.diagnosis.observations import DivergentVariable

# Each process's name in a cluster with a chief or an evaluator ("chief",
# "worker 0", "evaluator"), set for the time a verdict is worked out; None
# in a cluster of workers only, whose tasks are "worker i".
_LABELS: contextvars.ContextVar[Optional[Sequence[str]]] = contextvars.ContextVar(
    "task_labels", default=None)


@contextlib.contextmanager
def task_labels(labels: Optional[Sequence[str]]) -> Iterator[None]:
    """Name the processes by ``labels`` (None: ``worker i``) inside the block."""
    token = _LABELS.set(tuple(labels) if labels else None)
    try:
        yield
    finally:
        _LABELS.reset(token)


def name(index: int) -> str:
    """``worker 1``, or ``chief`` / ``evaluator`` in a cluster that has one."""
    labels = _LABELS.get()
    return labels[index] if labels and 0 <= index < len(labels) else f"worker {index}"


# Consecutive workers named as a range (``2-255``) from this many on: a
# verdict on hundreds of tasks stays a line.
RANGE_FROM = 4


def names(indexes: Sequence[int]) -> str:
    """``worker 1``, ``workers 0,2`` or ``workers 0,2-255``; ``chief, worker 1``
    in a cluster with a chief."""
    indexes = sorted(set(indexes))
    if _LABELS.get():
        return ", ".join(name(i) for i in indexes)
    runs: List[List[int]] = []
    for i in indexes:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    parts = [f"{r[0]}-{r[-1]}" if len(r) >= RANGE_FROM else ",".join(map(str, r)) for r in runs]
    return ("worker " if len(indexes) == 1 else "workers ") + ",".join(parts)


def ranges(steps: Sequence[int]) -> str:
    """``0-4,6-9`` for a sorted run of steps; the steps themselves otherwise."""
    if list(steps) != sorted(set(steps)):
        return ",".join(map(str, steps[:12])) + ("..." if len(steps) > 12 else "")
    runs: List[List[int]] = []
    for s in steps:
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


def steps_text(steps: Sequence[int], ref: Sequence[int]) -> str:
    """``9 steps (0-4,6-9), skipping step 5``: what ran, against the majority's."""
    if not steps:
        return "no steps"
    text = f"{len(steps)} step{'s' if len(steps) != 1 else ''} ({ranges(steps)})"
    mine, theirs = set(steps), set(ref)
    missing = [s for s in ref if s not in mine and s < max(steps)]   # not a later stop
    extra = [s for s in steps if s not in theirs]
    if missing:
        text += f", skipping step{'s' if len(missing) > 1 else ''} {ranges(missing)}"
    if extra and ref:
        text += f", extra step{'s' if len(extra) > 1 else ''} {ranges(extra)}"
    return text


def divergence_text(found: DivergentVariable,
                    name_of: Callable[[Sequence[int]], str] = names) -> str:
    """A :class:`~harness.diagnosis.observations.DivergentVariable` said
    whole: what differs, then who sides with whom (each side named by
    ``name_of``: the workers, by default)."""
    if found.layouts:
        return f"{found.detail} " + "; ".join(
            f"{name_of(side)}: {layout}" for side, layout in zip(found.sides, found.layouts))
    return f"{found.detail}: " + " | ".join(
        f"{name_of(side)} agree" if len(side) > 1 else f"{name_of(side)} alone"
        for side in found.sides)
