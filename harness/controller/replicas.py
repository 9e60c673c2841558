"""Parent side: do the workers hold the same model?  ``run(check_replicas=...)``.

When ``fn`` returns, each worker fingerprints the variables its strategy
created (recorded as they were created; see :mod:`harness.worker.replicas`):
one :class:`~harness.core.protocol.VariablePrint` per variable, a SHA-256 of its
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

from harness.errors import SettingError
from harness.core.protocol import VariablePrint
from harness.diagnosis.observations import DivergentVariable, Outcome, ReferenceCheck, ReplicaCheck
from harness.diagnosis.words import divergence_text

# allclose's atol and rtol both, for check_replicas=True.
DEFAULT_TOLERANCE = 1e-6
# ... and for reference=True: Keras's ctl_correctness_test compares
# multi-worker training with one device within 1e-3 (sums in another order).
DEFAULT_REFERENCE_TOLERANCE = 1e-3


def parse_tolerance(value, option: str, default: float) -> Optional[float]:
    """A check's switch: False/None for off, True for ``default``, a number
    0 or more for that tolerance (``atol`` and ``rtol``; 0: bit for bit)."""
    if value is None or value is False:
        return None
    if value is True:
        return default
    if isinstance(value, (int, float)) and not isinstance(value, bool) \
            and math.isfinite(value) and value >= 0:
        return float(value)
    raise SettingError(f"{option}: {value!r} is not True, False or a tolerance "
                       f"(a number 0 or more, used as atol and rtol)")


def parse_check_replicas(value) -> Optional[float]:
    """``run(check_replicas=...)``: True is :data:`DEFAULT_TOLERANCE`."""
    return parse_tolerance(value, "run(check_replicas=...)", DEFAULT_TOLERANCE)


def parse_reference(value) -> Optional[float]:
    """``run(reference=...)``: True is :data:`DEFAULT_REFERENCE_TOLERANCE`."""
    return parse_tolerance(value, "run(reference=...)", DEFAULT_REFERENCE_TOLERANCE)


def compare_reference(worker, returned, load, ref_outcome: str, ref_text: str, ref_worker,
                      ref_returned, ref_load, tolerance: float) -> ReferenceCheck:
    """Worker 0 of a completed run (``worker``, its observation; ``returned``,
    its return value; ``load(number)``, a variable's value) against the
    single-worker reference (the same, ``ref_*``).  Variables first, in the
    order of creation; then the return values, when both are numbers or
    arrays of numbers of one shape."""
    if ref_outcome != Outcome.COMPLETED or ref_worker is None:
        first = (ref_text.splitlines() or [""])[0]
        return ReferenceCheck(ref_outcome, 0, tolerance,
                              detail=f"the single-worker reference run itself ended "
                                     f"{ref_outcome}: {first}")
    mine, theirs = worker.variables, ref_worker.variables
    check = compare({0: mine, 1: theirs}, lambda w, k: (load if w == 0 else ref_load)(k),
                    tolerance)
    found = check.divergence
    if found is not None:
        how = ("is not the same variable" if found.max_difference is None
               else f"differs by up to {found.max_difference:.3g}")
        return ReferenceCheck(Outcome.COMPLETED, len(mine), tolerance, found.variable,
                              found.max_difference,
                              f"{found.variable} {how} from the single-worker reference "
                              f"(tolerance {tolerance:g})"
                              + ("" if found.max_difference is not None else ": " + divergence_text(
                                  found, lambda side: "the run" if 0 in side else "the reference")))
    difference = _returned_difference(returned, ref_returned, tolerance)
    if difference is not None:
        return ReferenceCheck(Outcome.COMPLETED, len(mine), tolerance, "fn's return value", difference,
                              f"fn's return value differs by up to {difference:.3g} from the "
                              f"single-worker reference's (tolerance {tolerance:g})")
    return ReferenceCheck(Outcome.COMPLETED, len(mine), tolerance)


def _returned_difference(a, b, tolerance: float) -> Optional[float]:
    """The largest difference between two return values made of numbers,
    when it is beyond the tolerance; None when they agree or are not numbers."""
    import numpy as np
    try:
        x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    if x.shape != y.shape or _close(x, y, tolerance):
        return None
    return _difference(x, y)


def _sides(groups: List[List[int]]) -> Tuple[Tuple[int, ...], ...]:
    return tuple(tuple(g) for g in sorted(groups, key=lambda g: (-len(g), g)))


def _layout_divergence(prints: Dict[int, Tuple[VariablePrint, ...]]) -> Optional[DivergentVariable]:
    """Workers that created different variables (number, names, shapes, dtypes)."""
    workers = sorted(prints)
    longest = max((len(p) for p in prints.values()), default=0)
    for k in range(longest):
        def layout(w: int, k: int = k) -> Optional[Tuple[str, tuple, str]]:
            p = prints[w]
            return None if k >= len(p) else (p[k].name, tuple(p[k].shape), p[k].dtype)
        groups: Dict[Optional[Tuple[str, tuple, str]], List[int]] = {}
        for w in workers:
            groups.setdefault(layout(w), []).append(w)
        if len(groups) == 1:
            continue
        # Each side's variable, in the order of the sides.
        layouts = tuple("none (created fewer variables)" if key is None
                        else f"{key[0]!r} shape {key[1]} {key[2]}"
                        for key, _ in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[1])))
        first = next(prints[w][k] for w in workers if k < len(prints[w]))
        return DivergentVariable(
            variable=first.label, sides=_sides(list(groups.values())), max_difference=None,
            detail=f"the workers created different variables; variable #{k} is",
            layouts=layouts)
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
        detail = f"variable {label} differs by up to {biggest:.3g} (tolerance {tolerance:g})"
        return ReplicaCheck(counts, tolerance,
                            DivergentVariable(label, sides, biggest, detail), tuple(notes))
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
