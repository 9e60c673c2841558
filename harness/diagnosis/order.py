"""Collectives in another order: the workers' sequences compared by what
each collective reduces, not only by kind and shape.

Every worker of an MWMS cluster must launch the same collectives in the
same order, and pack the same tensors into each in the same order: the
*n*-th part of one worker's pack is summed with the *n*-th part of every
other's.  A worker whose gradient list comes in another order
(``variables_to_train`` built from a ``set``, tensorflow/agents#473) packs
the same tensors elsewhere; when the swapped tensors have the same shape
nothing in TensorFlow notices, and the sums are of different variables'
gradients.

The ledger (:mod:`harness.worker.ledger`) labels each collective traced in
a ``tf.function`` with one name per packed part: the op that produces it
(a gradient's op is named after the forward op it differentiates).  Labels
are compared, per function, only where the kinds, shapes and dtypes of the
function's collectives agree on every worker (otherwise TensorFlow's own
shape check and the ledger rules decide), and only where every worker's
labels are the same multiset in another order: names can legitimately
differ between workers (Keras's layer-name counters), and a renamed part
is never taken for a reordered one.  Eager collectives have no graph, so
no label: their order is not told, and :func:`check` says so.

Pure: no TensorFlow, no I/O.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Dict, Hashable, List, Optional, Sequence, Tuple, TypeVar

from harness.diagnosis.observations import CollectiveOp, WorkerObservation
from harness.diagnosis.words import names

# The error a run whose collectives come in another order fails with.
COLLECTIVE_ORDER_DIVERGENCE = "CollectiveOrderDivergence"

# One worker's parts of one function: (collective index, part index, name).
Part = Tuple[int, int, str]


@dataclasses.dataclass(frozen=True)
class OrderDivergence:
    """Where the workers' packed parts first part: in ``function``'s
    collective ``collective`` (from 1, among its collectives) at its part
    ``part`` (from 1, of ``parts``; 0 where the workers launch the
    collectives themselves in another order, of other shapes: then ``op``
    is empty and ``reduced`` says each worker's collective), what each
    worker reduced there (``reduced``), the workers that order it otherwise
    against a strict majority (``culprits``; every worker, with
    ``ambiguous``, where no majority stands: always at 2 workers)."""

    function: str
    collective: int
    part: int
    parts: int
    op: str                         # the collective, said: ``all-reduce float32[9]``
    reduced: Tuple[Tuple[int, str], ...]   # (worker, what it reduced there), by worker
    culprits: Tuple[int, ...]
    ambiguous: bool

    @property
    def where(self) -> str:
        """``collective #1 of `step` (all-reduce float32[9]), part 1 of 3``."""
        if not self.part:
            return f"collective #{self.collective} of `{self.function}`"
        return (f"collective #{self.collective} of `{self.function}` ({self.op}), "
                f"part {self.part} of {self.parts}")

    @property
    def what(self) -> str:
        """``worker 0 reduced gradient_tape/mul/Mul, worker 1 gradient_tape/mul_4/Mul``."""
        said = [f"{names([i])} {name}" for i, name in self.reduced]
        return "reduced there: " + "; ".join(said)


@dataclasses.dataclass(frozen=True)
class OrderCheck:
    """What :func:`check` found: the first divergence (None: none), and the
    functions whose order could not be told (``untold``: a collective with
    no label, as an eager one has, on some worker)."""

    divergence: Optional[OrderDivergence] = None
    untold: Tuple[str, ...] = ()


def _signature(op: CollectiveOp) -> Tuple[str, Tuple[int, ...], str]:
    return op.kind, op.shape, op.dtype


def _functions(w: WorkerObservation) -> Dict[Tuple[str, int], Tuple[CollectiveOp, ...]]:
    """The worker's traced functions that launch collectives, keyed by
    (name, how many of that name came before): ids are per worker."""
    seen: Dict[str, int] = collections.Counter()
    out = {}
    for f in sorted(w.functions, key=lambda f: f.id):
        if f.collectives:
            out[(f.name, seen[f.name])] = f.collectives
            seen[f.name] += 1
    return out


def _parts(ops: Sequence[CollectiveOp], labelled: Sequence[int]) -> List[Part]:
    return [(i, k, name) for i in labelled for k, name in enumerate(ops[i].label)]


_Order = TypeVar("_Order", bound=Hashable)   # what the workers are compared by


def _majority(orders: Dict[int, _Order]) -> Optional[_Order]:
    """The order a strict majority of the workers share, alone at its size."""
    (top, hits), *rest = collections.Counter(orders.values()).most_common()
    if 2 * hits > len(orders) and not (rest and rest[0][1] == hits):
        return top
    return None


def _compare(name: str, ops_of: Dict[int, Tuple[CollectiveOp, ...]]) -> Tuple[
        Optional[OrderDivergence], bool]:
    """One function on every worker: its divergence (or None), and whether
    its order could be told (every collective labelled on every worker)."""
    first = next(iter(ops_of.values()))
    if any(len(ops) != len(first) or list(map(_signature, ops)) != list(map(_signature, first))
           for ops in ops_of.values()):
        return _whole_collectives(name, ops_of)
    labelled = [i for i in range(len(first)) if all(ops[i].label for ops in ops_of.values())]
    told = len(labelled) == len(first)
    parts = {w: _parts(ops, labelled) for w, ops in ops_of.items()}
    orders = {w: tuple(p[2] for p in ps) for w, ps in parts.items()}
    if len(set(orders.values())) == 1:
        return None, told
    if len({tuple(sorted(o)) for o in orders.values()}) > 1:
        return None, told    # other names, not another order: nothing is said
    length = len(next(iter(orders.values())))   # the same on every worker: a permutation
    at = next(n for n in range(length) if len({o[n] for o in orders.values()}) > 1)
    index, part, _ = next(iter(parts.values()))[at]
    majority = _majority(orders)
    culprits = (sorted(w for w, o in orders.items() if o != majority) if majority is not None
                else sorted(orders))
    return OrderDivergence(
        function=name, collective=index + 1, part=part + 1, parts=len(first[index].label),
        op=str(first[index]), reduced=tuple((w, orders[w][at]) for w in sorted(orders)),
        culprits=tuple(culprits), ambiguous=majority is None), told


def _whole_collectives(name: str, ops_of: Dict[int, Tuple[CollectiveOp, ...]]) -> Tuple[
        Optional[OrderDivergence], bool]:
    """The function's collectives differ in kind or shape between workers
    (TensorFlow then raises a shape mismatch itself, tensorflow#56885):
    another order where every worker launches the same collectives, each
    with its label, in another order; else nothing is said."""
    keyed = {w: tuple((*_signature(op), op.label) for op in ops) for w, ops in ops_of.items()}
    if len({tuple(sorted(k)) for k in keyed.values()}) > 1:
        return None, True    # other collectives, not another order
    told = all(op.label for ops in ops_of.values() for op in ops)
    if not told:
        return None, False
    at = next(n for n in range(len(next(iter(keyed.values()))))
              if len({k[n] for k in keyed.values()}) > 1)
    majority = _majority(keyed)
    culprits = (sorted(w for w, k in keyed.items() if k != majority) if majority is not None
                else sorted(keyed))
    mine = {w: ops[at] for w, ops in ops_of.items()}
    return OrderDivergence(
        function=name, collective=at + 1, part=0, parts=0, op="",
        reduced=tuple((w, f"{op.label[0]} ({op})") for w, op in sorted(mine.items())),
        culprits=tuple(culprits), ambiguous=majority is None), True


def check(workers: Sequence[WorkerObservation]) -> OrderCheck:
    """Compare, per function, the labels of the collectives of every worker
    that kept a ledger (see the module's docstring).  The first function
    (in the first worker's order) whose labels are a permutation of each
    other's is the divergence."""
    kept = [w for w in workers if w.ledger is not None and w.functions]
    if len(kept) < 2:
        return OrderCheck()
    each = {w.index: _functions(w) for w in kept}
    untold: List[str] = []
    found = None
    for key in each[kept[0].index]:
        if not all(key in fs for fs in each.values()):
            continue
        divergence, told = _compare(key[0], {i: fs[key] for i, fs in each.items()})
        if not told:
            untold.append(key[0])
        if found is None:
            found = divergence
    return OrderCheck(found, tuple(dict.fromkeys(untold)))


def out_of_order(workers: Sequence[WorkerObservation]) -> Optional[OrderDivergence]:
    """The first divergence :func:`check` finds, or None."""
    return check(workers).divergence


def first_step(w: WorkerObservation, function: str) -> Optional[int]:
    """The step of the worker's first call of ``function`` that launched
    collectives: every call packs them in the order traced."""
    named = {f.id: f.name for f in w.functions}
    return next((c.step for c in w.calls if named.get(c.function) == function), None)


def order_lines(workers: Sequence[WorkerObservation], untold_too: bool = False) -> List[str]:
    """What a person reads of the check: where the order parts and what
    each worker reduced there; with ``untold_too``, also that the order
    of some functions cannot be told (where it would matter: the replicas
    disagree)."""
    found = check(workers)
    if found.divergence is not None:
        d = found.divergence
        return [f"order: the workers' collectives part at {d.where}; {d.what}"]
    if untold_too and found.untold:
        shown = ", ".join(f"`{n}`" for n in found.untold[:3]) + (
            ", ..." if len(found.untold) > 3 else "")
        return [f"note: the order of what {shown} reduce{'s' if len(found.untold) == 1 else ''} "
                f"cannot be told (a collective without a label: an eager one has no graph "
                f"to name its tensors)"]
    return []
