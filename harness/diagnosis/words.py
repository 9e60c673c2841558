"""Small phrases the rules and the rendering share: worker lists, step ranges."""
from __future__ import annotations

from typing import List, Sequence


def names(indexes: Sequence[int]) -> str:
    """``worker 1`` or ``workers 0,2``."""
    indexes = sorted(indexes)
    return ("worker " if len(indexes) == 1 else "workers ") + ",".join(map(str, indexes))


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
