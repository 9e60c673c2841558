"""The blame rule of the collective ledgers' counts (``collective_counts``):
who launched more or fewer collectives than the rest, step by step, and
when that cannot single a worker out (a loop that ended a step before the
others' looks like a peer's step more).  See :mod:`harness.diagnosis.rules`."""
from __future__ import annotations

import collections
from typing import Collection, Dict, List, Optional, Sequence, Tuple

from harness.diagnosis import ledger
from harness.diagnosis.blame import Blame
from harness.diagnosis.facts import Facts
from harness.diagnosis.observations import WorkerObservation
from harness.diagnosis.words import names


def _counted(n: int) -> str:
    return "no collective" if n == 0 else f"{n} collective{'s' if n != 1 else ''}"


def _odd_ones(counts: Dict[int, int]) -> Optional[Tuple[List[int], int]]:
    """The workers off a strict majority's count (N >= 3), and that count."""
    top, hits = collections.Counter(counts.values()).most_common(1)[0]
    if len(counts) < 3 or 2 * hits <= len(counts):
        return None
    return sorted(i for i, n in counts.items() if n != top), top


def _told(counts: Dict[int, int], leave_out=()) -> str:
    """``worker 0 launched 3; worker 1 launched 2``, one part per worker."""
    return "; ".join(f"{names([i])} launched {n}" for i, n in sorted(counts.items())
                     if i not in leave_out)


def _grouped(counts: Dict[int, int], leave_out) -> str:
    """What the workers but ``leave_out`` launched, grouped by count."""
    rest = collections.defaultdict(list)
    for i, n in counts.items():
        if i not in leave_out:
            rest[n].append(i)
    return "; ".join(f"{names(idx)} launched {n}" for n, idx in sorted(rest.items()))


def _lone_deviant(by_step: Dict[int, Dict[int, int]], s: int) -> Optional[Tuple[int, int]]:
    """The one worker whose count at step ``s`` is off its own usual count,
    and that usual count."""
    usual = {i: ledger.usual(counts, s) for i, counts in by_step.items()}
    deviants = [(i, n) for i, n in usual.items() if n is not None and by_step[i][s] != n]
    return deviants[0] if len(deviants) == 1 else None


def _counts_by_step(ws: Sequence[WorkerObservation], functions: Optional[Collection[str]] = None
                    ) -> Optional[Dict[int, Dict[int, int]]]:
    """Each worker's :func:`ledger.counts_by_step`, by index; None when one reported no step."""
    out = {}
    for w in ws:
        counts = ledger.counts_by_step(w, functions)
        if counts is None:
            return None
        out[w.index] = counts
    return out


def collective_counts(f: Facts) -> Optional[Blame]:
    """From the ledgers: who launched more or fewer collectives than the rest.

    Where steps are known, the first step at which the workers launched
    different numbers of collectives; the odd one out against a strict
    majority (N >= 3), else the one whose count at that step differs from
    its own usual count (a skipped step launches none, an extra all-reduce
    one more), which names the culprit even with 2 workers.  Without steps,
    totals: the minority against a strict majority, else it cannot tell.
    Loops that legitimately vary (an epoch-end metric read) vary alike on
    every worker, so they do not count as a difference.
    """
    comp = f.comparable
    if len(comp) < 2 or any(w.ledger is None for w in comp) \
            or not any(ledger.has_ledger(w) for w in comp):
        return None
    by_step = _counts_by_step(comp)
    if by_step is not None:
        return _blame_by_step(f, by_step)
    return _blame_by_totals(f, {w.index: ledger.total_launched(w) for w in comp})


def _blame_by_step(f: Facts, by_step: Dict[int, Dict[int, int]]) -> Optional[Blame]:
    """The first step whose counts differ, and who is off there."""
    common = set.intersection(*(set(v) for v in by_step.values()))
    differ = sorted(s for s in common if len({v[s] for v in by_step.values()}) > 1)
    if not differ:
        return None
    s = differ[0]
    at = {i: v[s] for i, v in by_step.items()}
    odd = _odd_ones(at)
    if odd is not None:
        return Blame(odd[0], f"launched {_counted(at[odd[0][0]])} in step {s}, where "
                     f"{_grouped(at, odd[0])}", s)
    lone = _lone_deviant(by_step, s)
    ended = _ended_first(f, lone[0], s, list(at)) if lone is not None else None
    if ended is not None:
        return ended
    if lone is not None:
        i, usual = lone
        return Blame([i], f"launched {_counted(at[i])} in step {s}, and {usual} in each of "
                     f"its other steps; in step {s} {_grouped(at, [i])}", s)
    deviant = _deviant_in_differing_functions(f, s, list(at))
    if deviant is not None:
        ended = _ended_first(f, deviant.culprits[0], s, list(at))
        return ended if ended is not None else deviant
    return Blame(sorted(at), f"the workers launched different numbers of collectives in "
                 f"step {s} ({_told(at)}), and it cannot tell which count is wrong", s,
                 ambiguous=True)


def _ended_first(f: Facts, i: int, s: int, workers: List[int]) -> Optional[Blame]:
    """Worker ``i`` stands out at step ``s`` by its own usual count, but
    ``s`` is its last step and others went on past it: its collective more
    may be its loop's end (an epoch's last metric read, a save) come before
    theirs, as when its data ran out first; or theirs ran longer.  Without
    a strict majority of loops that ended alike, it cannot tell."""
    last = {j: max(f.worker(j).steps, default=-1) for j in workers}
    went_on = sorted(j for j in workers if last[j] > s)
    if last[i] != s or not went_on:
        return None
    ended = sorted(j for j in workers if last[j] == s)
    if len(went_on) * 2 < len(workers) and len(ended) * 2 > len(workers):
        return None   # a strict majority ended here too: those that went on are the odd ones
    return Blame(sorted(workers),
                 f"{names(ended)} ended {'its' if len(ended) == 1 else 'their'} loop after "
                 f"step {s} (its last step launched one collective more: the loop's end) while "
                 f"{names(went_on)} went on to step {s + 1}: fewer steps on one side (uneven "
                 f"data, another epoch size) or more on the other, and it cannot tell which",
                 s, ambiguous=True)


def _blame_by_totals(f: Facts, totals: Dict[int, int]) -> Optional[Blame]:
    """Without steps: the minority of the totals against a strict majority."""
    if len(set(totals.values())) == 1:
        return None
    odd = _odd_ones(totals)
    if odd is not None:
        return Blame(odd[0], f"launched {totals[odd[0][0]]} collectives where the others "
                     f"launched {odd[1]} ({_told(totals)})", f.worker(odd[0][0]).last_step)
    return Blame(sorted(totals), "the workers launched different numbers of collectives and, "
                 "with no steps to place them and no majority, it cannot tell a missing one "
                 f"from an extra one ({_told(totals)})", None, ambiguous=True)


def _deviant_in_differing_functions(f: Facts, s: int, workers: List[int]) -> Optional[Blame]:
    """The one worker off its own usual count in step ``s``, counting only
    the functions whose collectives differ between the workers there.

    What every worker launched alike in that step is no evidence either
    way, yet it can make every worker's step look unusual: on TensorFlow
    2.15 Keras 2's optimizer makes its variables in the first call, so
    every worker's step 0 also holds the same initialisation broadcasts."""
    per_fn = {i: ledger.counts_by_function(f.worker(i), s) for i in workers}
    differing = {fn for fn in set().union(*per_fn.values())
                 if len({c.get(fn, 0) for c in per_fn.values()}) > 1}
    if not differing or all(set(c) <= differing for c in per_fn.values()):
        return None   # nothing to leave out: the counts above were these
    scoped = _counts_by_step([f.worker(i) for i in workers], differing)
    lone = _lone_deviant(scoped, s) if scoped is not None else None
    if scoped is None or lone is None:
        return None
    (i, usual), of = lone, ", ".join(f"`{fn}`" for fn in sorted(differing))
    rest = _told({j: scoped[j][s] for j in workers}, leave_out=[i])
    return Blame([i], f"launched {_counted(scoped[i][s])} of {of} in step {s}, and "
                 f"{usual} in each of its other steps; in step {s} {rest} (the "
                 f"collectives every worker launched alike there left out)", s)
