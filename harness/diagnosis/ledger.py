"""Reading the workers' collective ledgers (see :mod:`harness.worker.ledger`).

Every worker of an MWMS cluster must launch the same collectives in the
same order: the *n*-th collective of one pairs with the *n*-th of every
other.  The ledger says, per worker, which calls of which functions it made
(at which step) and which collectives each call launches.  From that:

* per step, how many collectives a worker launched (a skipped step
  launches none; an extra all-reduce makes one more);
* the call each worker is blocked in, and the collectives it launches (at
  ``ledger="collectives"``, the one that is pending);
* where the workers' sequences of collectives part.

Functions are matched across workers by name: ids are per worker.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Collection, Dict, Iterator, List, Optional, Sequence, Tuple

from harness.diagnosis.observations import Call, CollectiveOp, WorkerObservation
from harness.diagnosis.words import name


def _ops(w: WorkerObservation) -> Dict[int, Tuple[CollectiveOp, ...]]:
    return {f.id: f.collectives for f in w.functions}


def _names(w: WorkerObservation) -> Dict[int, str]:
    return {f.id: f.name for f in w.functions}


def collective_calls(w: WorkerObservation) -> List[Call]:
    """The worker's calls that launch at least one collective, in order."""
    ops = _ops(w)
    return [c for c in w.calls if ops.get(c.function)]


def has_ledger(w: WorkerObservation) -> bool:
    return bool(collective_calls(w))


def _launches(w: WorkerObservation) -> Iterator[Tuple[Optional[int], str, int]]:
    """(step, function name, collectives launched) for each of the worker's
    calls that launch collectives, in order."""
    ops, named = _ops(w), _names(w)
    for c in collective_calls(w):
        yield c.step, named[c.function], len(ops[c.function])


def counts_by_step(w: WorkerObservation,
                   functions: Optional[Collection[str]] = None) -> Optional[Dict[int, int]]:
    """Collectives launched per step (every reported step, 0 when none), by
    calls of the functions named ``functions`` only when given, or None when the worker
    reported no step.  Calls before the first step (variable initialisation
    broadcasts, say) belong to no step."""
    if not w.steps:
        return None
    counts = dict.fromkeys(w.steps, 0)
    for step, function, n in _launches(w):
        if step is not None and (functions is None or function in functions):
            counts[step] = counts.get(step, 0) + n
    return counts


def counts_by_function(w: WorkerObservation, step: int) -> Dict[str, int]:
    """Collectives launched in ``step``, per function name (a worker's ids
    are its own; ``<eager broadcast>`` for the variable initialisations
    made outside any function)."""
    counts: Dict[str, int] = collections.Counter()
    for at, function, n in _launches(w):
        if at == step:
            counts[function] += n
    return counts


def total_launched(w: WorkerObservation) -> int:
    return sum(n for _, _, n in _launches(w))


def last_call(w: WorkerObservation) -> Optional[Call]:
    """The worker's last call that launches collectives (None: none)."""
    calls = collective_calls(w)
    return calls[-1] if calls else None


def function_of(w: WorkerObservation, call: Call) -> str:
    """The name of the function ``call`` is a call of (``?``: not known)."""
    return _names(w).get(call.function, "?")


def calls_of(w: WorkerObservation, name: str) -> int:
    """How many calls of the function named ``name`` the worker made."""
    named = _names(w)
    return sum(1 for c in collective_calls(w) if named.get(c.function) == name)


def pending_call(w: WorkerObservation) -> Optional[Call]:
    """The call the worker is blocked in: its last collective call that never ended."""
    calls = [c for c in collective_calls(w) if c.ended is None]
    return calls[-1] if calls else None


def describe_ops(ops: Sequence[CollectiveOp]) -> str:
    """``all-reduce float32[1]`` or ``2 collectives: all-reduce float32[10], ...``."""
    if len(ops) == 1:
        return str(ops[0])
    shown = ", ".join(map(str, ops[:3])) + (", ..." if len(ops) > 3 else "")
    return f"{len(ops)} collectives: {shown}"


def describe_pending(w: WorkerObservation) -> str:
    """Where in its ledger a blocked worker waits, e.g. ``in call 10 of `step`
    (all-reduce float32[1])``; at ``ledger="collectives"`` the pending one."""
    call = pending_call(w)
    if call is None:
        return ""
    ops = _ops(w)[call.function]
    where = f"in {describe_call(w, call, with_ops=False)}"
    if w.ledger == "collectives" and call.launched:
        index = [i for i in call.launched if i not in call.done]
        if index:
            i = index[-1]
            return f"{where}, in its collective #{i + 1} of {len(ops)} ({ops[i]}), launched, " \
                   f"not completed"
    return f"{where} ({describe_ops(ops)})"


def describe_call(w: WorkerObservation, call: Call, with_ops: bool = True) -> str:
    """``call 10 of `step` (all-reduce float32[1])``; an eager collective's
    with the user's line that made it: ``call 1 of `<eager all-reduce>`
    from train.py:57 in train: ckpt.save(path) (all-reduce float32[])``."""
    text = f"call {call.number} of `{_names(w).get(call.function, '?')}`" + site_words(call)
    return text + (f" ({describe_ops(_ops(w)[call.function])})" if with_ops else "")


def site_words(call: Optional[Call]) -> str:
    """`` from train.py:57 in train: ckpt.save(path)``, or "" when the
    call's line is not known."""
    return f" from {call.site}" if call is not None and call.site else ""


def user_line(w: WorkerObservation) -> str:
    """The user's line of the eager collective the worker is blocked in or
    made last, else ""."""
    call = pending_call(w) or last_call(w)
    return call.site if call is not None else ""


def calls_by_name(w: WorkerObservation) -> Dict[str, int]:
    """How many calls that launch collectives the worker made, per function name."""
    return dict(collections.Counter(function_of(w, c) for c in collective_calls(w)))


def never_launched(ws: Sequence[WorkerObservation], w: WorkerObservation,
                   counts: Optional[Dict[int, Dict[str, int]]] = None) -> List[int]:
    """The workers that never began the call ``w`` is blocked in.
    ``counts``: :func:`calls_by_name` of each worker with a ledger, by
    index, where the caller asks for every worker (worked out once)."""
    call = pending_call(w)
    if call is None:
        return []
    if counts is None:
        counts = {o.index: calls_by_name(o) for o in ws if has_ledger(o)}
    name = function_of(w, call)
    return [o.index for o in ws if o.index != w.index and o.index in counts
            and counts[o.index].get(name, 0) < call.number]


def _retraced(ws: Sequence[WorkerObservation]) -> Dict[str, Tuple[CollectiveOp, ...]]:
    """The functions whose latest traces differ between workers by
    broadcasts alone, each with its collectives less the broadcasts.

    A function that creates variables on its first call is traced twice:
    the first trace also broadcasts the new variables' initial values, the
    second does not.  A worker's ledger keeps the latest trace, so a worker
    that has retraced and one that has not yet list the same call's
    collectives differently, though both run the same program: compared
    position by position, that is no disagreement."""
    traces: Dict[str, set] = collections.defaultdict(set)
    for w in ws:
        for f in w.functions:
            traces[f.name].add(f.collectives)
    out = {}
    for fn_name, seen in traces.items():
        stripped = {tuple(op for op in ops if op.kind != "broadcast") for ops in seen}
        if len(seen) > 1 and len(stripped) == 1:
            out[fn_name] = stripped.pop()
    return out


def same_traces(ws: Sequence[WorkerObservation]) -> Tuple[WorkerObservation, ...]:
    """The workers with the functions of :func:`_retraced` listed without
    their broadcasts on every worker, so that counts and sequences compare
    one program with itself."""
    retraced = _retraced(ws)
    if not retraced:
        return tuple(ws)
    return tuple(dataclasses.replace(w, functions=tuple(
        dataclasses.replace(f, collectives=retraced[f.name]) if f.name in retraced else f
        for f in w.functions)) for w in ws)


def sequence(w: WorkerObservation) -> List[Tuple[CollectiveOp, str, Optional[int]]]:
    """Every collective the worker launched, in order: (op, function name, step)."""
    ops, names = _ops(w), _names(w)
    return [(op, names.get(c.function, "?"), c.step)
            for c in collective_calls(w) for op in ops[c.function]]


def where_sequences_part(ws: Sequence[WorkerObservation]) -> Optional[str]:
    """The first collective number at which the workers' records differ in
    kind or shape (the n-th collectives of all workers pair up), said for a
    person; None when they agree as far as each went."""
    seqs = {w.index: sequence(w) for w in ws if has_ledger(w)}
    if len(seqs) < 2:
        return None
    for n in range(max(len(s) for s in seqs.values())):
        if any(n >= len(s) for s in seqs.values()):
            continue   # a worker that stopped early: not a disagreement in kind or shape
        here = {i: s[n] for i, s in seqs.items()}
        ops = {(v[0].kind, v[0].shape, v[0].dtype) for v in here.values()}
        if len(ops) > 1:
            parts = "; ".join(
                f"{name(i)}: {v[0]} in `{v[1]}`" + (f" (step {v[2]})" if v[2] is not None else "")
                for i, v in sorted(here.items()))
            return f"the workers' collectives part at #{n + 1}: {parts}"
    return None


def odd_collective(ws: Sequence[WorkerObservation]) -> Optional[Tuple[List[int], int, str, tuple]]:
    """From three workers up: at the first collective number whose kind,
    shape or dtype differs between the workers' ledgers, the workers in the
    minority against a strict majority, that number (from 1), the
    majority's collective, said, and the first odd worker's (op, function,
    step) there.  None when there is no such point or no
    such majority (two workers are symmetric)."""
    seqs = {w.index: sequence(w) for w in ws if w.ledger is not None and has_ledger(w)}
    if len(seqs) < 3 or len(seqs) < len(ws):
        return None
    for n in range(min(len(s) for s in seqs.values())):
        here = {i: (s[n][0].kind, s[n][0].shape, s[n][0].dtype) for i, s in seqs.items()}
        if len(set(here.values())) == 1:
            continue
        (top, hits), *_ = collections.Counter(here.values()).most_common()
        if 2 * hits <= len(here):
            return None
        odd = sorted(i for i, v in here.items() if v != top)
        majority = next(s[n][0] for i, s in seqs.items() if here[i] == top)
        mine = seqs[odd[0]][n]
        return odd, n + 1, str(majority), mine
    return None


def usual(counts: Dict[int, int], leave_out: int) -> Optional[int]:
    """The worker's most common per-step count, the step ``leave_out`` aside;
    None when there is no other step or no single most common count."""
    rest = collections.Counter(v for s, v in counts.items() if s != leave_out)
    if not rest:
        return None
    (top, hits), *others = rest.most_common()
    if others and others[0][1] == hits:
        return None
    return top
