"""The blame rules for a run where a worker raised.  See
:mod:`harness.diagnosis.rules`."""
from __future__ import annotations

import collections
from typing import Dict, Optional

from harness.errors import StepDesyncError, odd_ones_out
from harness.diagnosis.echoes import error_text, is_end_of_input, shape_mismatches, short_type
from harness.diagnosis import ledger
from harness.diagnosis.facts import Facts
from harness.diagnosis.observations import error_of
from harness.diagnosis.words import names
from harness.diagnosis.blame import Blame

def shape_mismatch(f: Facts) -> Optional[Blame]:
    """Collectives that paired tensors of different shapes.

    TensorFlow's "Shape mismatch in the collective instance" names the task
    that noticed and its own shape, and the other shape.  Collected over all
    errors, that is each task's shape; the odd one out against a strict
    majority (N >= 3) is the worker whose collective differed: a different
    batch size, or a collective the others did not make.  Two workers are
    symmetric (each only sees that the other differs): no verdict here.
    """
    known: Dict[int, str] = {}
    other_shapes = set()
    for w in f.workers:
        for task, mine, other in shape_mismatches(w.error.message if w.error else ""):
            known[task] = mine
            other_shapes.add(other)
    n = f.obs.num_workers
    if not known or n < 3:
        return None
    shapes = ", ".join(f"{names([t])} {s}" for t, s in sorted(known.items()))
    counts = collections.Counter(known.values())
    top, hits = counts.most_common(1)[0]
    if len(counts) > 1 and 2 * hits > len(known):
        odd = sorted(t for t, v in known.items() if v != top)
    elif len(counts) == 1 and len(known) == n - 1 and other_shapes - {top}:
        odd = sorted(set(range(n)) - set(known))
    else:
        return None
    steps = [w.last_step for w in f.workers if w.index in odd]
    return Blame(odd, f"its collective had a different shape from the others' ({shapes}; "
                 f"majority {top})", steps[0] if steps else None,
                 headline=f"{names(odd)}: collective shape differs from the other workers' "
                          f"(Shape mismatch; majority shape {top})")


def collective_shapes(f: Facts) -> Optional[Blame]:
    """From the ledgers, N >= 3: the worker whose n-th collective has another
    kind or shape than the majority's (a different batch size, a collective
    the others did not make), whatever the errors happened to report."""
    found = ledger.odd_collective(f.workers)
    if found is None:
        return None
    odd, number, majority, mine = found
    w = f.worker(odd[0])
    return Blame(odd, f"its collective #{number} is {mine[0]} in `{mine[1]}`, where the others' "
                 f"is {majority}", mine[2] if mine[2] is not None else w.last_step)


def sync_check(f: Facts) -> Optional[Blame]:
    """The opt-in sync check saw workers at different steps.  Every worker
    raises the same StepDesyncError, computed from the same all-reduced
    vector, and its ``steps`` field (worker i's step at the check) is the
    observation to read."""
    if not f.roots:
        return None
    error = error_of(f.roots[0])
    if short_type(error.type_name) != StepDesyncError.__name__:
        return None
    steps = list((error.fields or {}).get("steps") or [])
    message = error.message or ""
    odd = odd_ones_out(steps)
    if odd:
        step = min(steps)
        return Blame(list(odd), f"out of step (sync check: {message})", step,
                     headline=f"{names(odd)} out of step with the others "
                              f"(sync check at step {step})")
    everyone = list(range(len(steps))) or [w.index for w in f.workers]
    return Blame(everyone, f"cannot tell which side is wrong with no majority: {message}",
                 min(steps) if steps else None, ambiguous=True,
                 headline="workers out of step and no majority (sync check); "
                          "it cannot tell which side is wrong")


def root_error(f: Facts) -> Optional[Blame]:
    """The worker(s) whose error is a cause, earliest first, plus every worker
    that raised the same type (a bug in common code hits everyone).  Input
    that ran out (``StopIteration``, ``OutOfRangeError``) is a cause only
    when no other error explains it: a peer's error about how the data was
    split says why one worker got nothing."""
    if not f.roots:
        return None
    roots = [w for w in f.roots if not is_end_of_input(w.error)] or list(f.roots)
    first = roots[0]
    kind = short_type(error_of(first).type_name)
    same = [w.index for w in roots if short_type(error_of(w).type_name) == kind]
    said = error_text(error_of(first))
    head = f"{names(same)} raised {said} (root error"
    if f.echoes:
        kinds = "/".join(sorted({short_type(error_of(w).type_name) for w in f.echoes}))
        head += f"; {names([w.index for w in f.echoes])} reported it as {kinds}"
    return Blame(same, f"raised {said}", first.last_step, headline=head + ")")
