"""The workers' ``TF_CONFIG`` values, read against each other.

A training task's list is its ``cluster.chief`` list and then its
``cluster.worker`` list (MWMS's order), and its place in it is its task
(the chief first).  The majority list is the reference (ties go to the list of
the expected length, then to one held by a worker whose task index matches
its position).  A worker whose ``TF_CONFIG`` is missing, malformed, of
another size, reordered or with another address or port has an issue, as
does one claiming a task index another worker owns, or one that built a
1-replica strategy while N > 1 (it trained alone).  Two tied lists cannot be
told apart: the result says so.
"""
from __future__ import annotations

import collections
import json
from typing import Dict, List, Optional, Tuple

from harness.core import protocol
from harness.diagnosis.observations import RunObservation
from harness.diagnosis.words import names


def _cluster(cfg) -> Optional[Tuple[str, ...]]:
    """The training tasks' addresses in MWMS's order: the chief's, then the workers'."""
    try:
        if isinstance(cfg, str):
            cfg = json.loads(cfg)
        lst = list(cfg["cluster"].get("chief", [])) + list(cfg["cluster"]["worker"])
        if all(isinstance(a, str) for a in lst):
            return tuple(lst)
    except (TypeError, KeyError, ValueError, IndexError, AttributeError):
        pass
    return None


def _task(cfg) -> Tuple[Optional[str], Optional[int]]:
    """The task's type, and its place in :func:`_cluster`'s list."""
    try:
        if isinstance(cfg, str):
            cfg = json.loads(cfg)
        task = cfg["task"]
        kind, index = task.get("type"), int(task.get("index"))
        if kind == "worker":
            index += len(cfg["cluster"].get("chief", []))
        return kind, index
    except (TypeError, KeyError, ValueError, AttributeError):
        return None, None


def _list_diff(lst: Tuple[str, ...], ref: Tuple[str, ...]) -> str:
    if len(lst) != len(ref):
        return f"its TF_CONFIG cluster lists {len(lst)} workers, the others' {len(ref)}"
    if sorted(lst) == sorted(ref):
        return (f"its TF_CONFIG worker list is reordered "
                f"({', '.join(lst)} instead of {', '.join(ref)})")
    out = []
    for i, (a, b) in enumerate(zip(lst, ref)):
        if a != b:
            (ha, _, pa), (hb, _, pb) = a.rpartition(":"), b.rpartition(":")
            out.append(f"port {pa} instead of {pb} for task {i}" if ha == hb
                       else f"address {a} instead of {b} for task {i}")
    return "its TF_CONFIG has " + ", ".join(out)


def config_issues(obs: RunObservation) -> Tuple[Dict[int, List[str]], bool]:
    """Per-worker TF_CONFIG problems, and whether the reference was a tie."""
    n, issues = len(obs.workers), collections.defaultdict(list)
    lists: Dict[int, Tuple[str, ...]] = {}
    for w in obs.workers:
        found = _cluster(w.tf_config) if w.tf_config is not None else None
        if w.tf_config is None:
            issues[w.index].append("TF_CONFIG missing")
        elif found is None:
            issues[w.index].append("TF_CONFIG malformed (no cluster.worker list)")
        else:
            lists[w.index] = found
    ambiguous = False
    if lists:
        count = collections.Counter(lists.values())
        claimed = {w.index: _task(w.tf_config)[1] for w in obs.workers}

        def score(lst):   # majority, then expected size, then self-consistent holders
            holders = [i for i, v in lists.items() if v == lst]
            return count[lst], len(lst) == n, sum(claimed.get(i) == i for i in holders)

        best = max(score(lst) for lst in count)
        tied = [lst for lst in count if score(lst) == best]
        ambiguous = len(tied) > 1
        ref = tied[0]
        for i, lst in lists.items():
            if ambiguous and lst in tied:
                issues[i].append(f"its TF_CONFIG lists {', '.join(lst)}")
            elif lst != ref:
                issues[i].append(_list_diff(lst, ref))
    claims = collections.defaultdict(list)
    for w in obs.workers:
        kind, idx = _task(w.tf_config)
        if w.index in lists and kind not in ("chief", "worker"):   # a malformed one is flagged already
            issues[w.index].append(f"its TF_CONFIG task type is {kind!r}, not a training "
                                   f"task's ('chief' or 'worker')")
        if idx is not None:
            claims[idx].append(w.index)
    for idx, owners_ in claims.items():
        for i in owners_:
            if len(owners_) > 1 and idx != i:
                issues[i].append(f"its TF_CONFIG claims task index {idx}, which "
                                 f"{names([j for j in owners_ if j != i])} also claims")
    for w in obs.workers:
        created = [e.data for e in w.events if e.kind == protocol.STRATEGY_CREATED]
        if n > 1 and created and created[-1] == 1:
            issues[w.index].append("formed a cluster of 1 replica on its own "
                                   "(num_replicas_in_sync=1): it trained alone")
    return dict(issues), ambiguous
