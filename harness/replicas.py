"""Parent side: do the workers hold the same model?  ``run(check_replicas=...)``.

When ``fn`` returns, each worker fingerprints the variables its strategy
created (recorded as they were created; see :mod:`harness.worker.replicas`):
one :class:`~harness.protocol.VariablePrint` per variable, a SHA-256 of its
value, in the order of creation.  Mirrored variables and optimizer slots are
fingerprinted; sync-on-read ones (metrics, batch-norm moving statistics)
are not, since they legitimately differ between workers.

:func:`compare` finds the first variable on which the workers disagree
beyond the tolerance.  Digests settle equality at no cost; only a variable
whose digests differ is read back from the workers' replica files to be
compared within the tolerance and measured.  MWMS gives every worker the
same all-reduced bytes, so replicas that trained together agree bit for
bit; the default tolerance only leaves room for a platform whose reductions
are not bitwise reproducible.

This module needs numpy (TensorFlow's own dependency), not TensorFlow.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .errors import SettingError
from .protocol import VariablePrint
from .record import ReplicaCheck, ReplicaDivergence

# allclose's atol and rtol both, for check_replicas=True.
DEFAULT_TOLERANCE = 1e-6


def parse_check_replicas(value) -> Optional[float]:
    """``run(check_replicas=...)``: False/None for off, True for the default
    tolerance, a number 0 or more for that tolerance (0: bit for bit)."""
    if value is None or value is False:
        return None
    if value is True:
        return DEFAULT_TOLERANCE
    if isinstance(value, (int, float)) and not isinstance(value, bool) \
            and math.isfinite(value) and value >= 0:
        return float(value)
    raise SettingError(f"run(check_replicas=...): {value!r} is not True, False or a "
                       f"tolerance (a number 0 or more, used as atol and rtol)")


def _names(ws: Sequence[int]) -> str:
    return ("worker " if len(ws) == 1 else "workers ") + ", ".join(map(str, ws))


def _sides(groups: List[List[int]]) -> Tuple[Tuple[int, ...], ...]:
    return tuple(tuple(g) for g in sorted(groups, key=lambda g: (-len(g), g)))


def _layout_divergence(prints: Dict[int, Tuple[VariablePrint, ...]]) -> Optional[ReplicaDivergence]:
    """Workers that created different variables (number, names, shapes, dtypes)."""
    workers = sorted(prints)
    longest = max((len(p) for p in prints.values()), default=0)
    for k in range(longest):
        def layout(w):
            p = prints[w]
            return None if k >= len(p) else (p[k].name, tuple(p[k].shape), p[k].dtype)
        groups: Dict[object, List[int]] = {}
        for w in workers:
            groups.setdefault(layout(w), []).append(w)
        if len(groups) == 1:
            continue
        parts = []
        for key, ws in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1])):
            parts.append(f"{_names(ws)}: " + ("none (created fewer variables)" if key is None
                                              else f"{key[0]!r} shape {key[1]} {key[2]}"))
        first = next(prints[w][k] for w in workers if k < len(prints[w]))
        return ReplicaDivergence(
            variable=first.label, sides=_sides(list(groups.values())), max_difference=None,
            detail=f"the workers created different variables; variable #{k} is "
                   + "; ".join(parts))
    return None


def compare(prints: Dict[int, Tuple[VariablePrint, ...]],
            load: Callable[[int, int], object], tolerance: float,
            notes: Sequence[str] = ()) -> ReplicaCheck:
    """Compare the workers' fingerprints; ``load(worker, number)`` returns
    that worker's value of variable ``number`` as a numpy array."""
    import numpy as np

    counts = tuple(len(prints[w]) for w in sorted(prints))
    found = _layout_divergence(prints)
    if found is not None:
        return ReplicaCheck(counts, tolerance, found, tuple(notes))
    workers = sorted(prints)
    for k in range(counts[0] if counts else 0):
        if len({prints[w][k].digest for w in workers}) == 1:
            continue
        values = {w: np.asarray(load(w, k)) for w in workers}
        groups: List[List[int]] = []
        for w in workers:
            for g in groups:
                same = (prints[w][k].digest == prints[g[0]][k].digest
                        or _close(values[w], values[g[0]], tolerance))
                if same:
                    g.append(w)
                    break
            else:
                groups.append([w])
        if len(groups) == 1:
            continue     # different bits, within the tolerance
        ref = values[workers[0]]
        differences = [_difference(values[w], ref) for w in workers]
        # max() would skip a NaN (every comparison with it is False): a
        # NaN on one side is the biggest difference there is.
        biggest = math.nan if any(map(math.isnan, differences)) else max(differences)
        sides = _sides(groups)
        label = prints[workers[0]][k].label
        detail = (f"variable {label} differs by up to {biggest:.3g} "
                  f"(tolerance {tolerance:g}): " + " | ".join(
                      f"{_names(side)} agree" if len(side) > 1 else f"{_names(side)} alone"
                      for side in sides))
        return ReplicaCheck(counts, tolerance,
                            ReplicaDivergence(label, sides, biggest, detail), tuple(notes))
    return ReplicaCheck(counts, tolerance, None, tuple(notes))


def _close(a, b, tolerance: float) -> bool:
    import numpy as np
    try:
        return bool(np.allclose(a.astype(np.float64), b.astype(np.float64),
                                atol=tolerance, rtol=tolerance, equal_nan=True))
    except (TypeError, ValueError):
        return False     # not numbers (strings, resources): different bits differ


def _difference(a, b) -> float:
    import numpy as np
    try:
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
    except (TypeError, ValueError):
        return math.nan
    if not d.size:
        return 0.0
    # Where both sides are NaN they agree (allclose's equal_nan).
    d[np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64))] = 0.0
    return float(np.max(d))
