"""The blame rule for a worker whose address did not resolve.  See
:mod:`harness.diagnosis.rules`.

What the workers show, TensorFlow 2.21, measured (2 and 3 workers, a
cluster list naming one worker by a host name that does not resolve):

- a worker other than the chief: every strategy is made, and the first
  collective fails at once (0.1-0.3 s) on the peers that must reach it,
  ``UnavailableError`` "errors resolving HOST:PORT: ... Address lookup
  failed for HOST:PORT os_error: Name or service not known syscall:
  getaddrinfo", without a retry; the unresolved worker itself fails later,
  of its peers' leaving.  TensorFlow's gRPC uses the native resolver
  (``getaddrinfo``); with c-ares the words are "DNS resolution failed for
  HOST:PORT", matched too;
- the chief (the coordination service's leader): every worker waits in
  strategy creation, its agent retrying the lookup in silence (nothing in
  any log) until the name resolves, when the cluster goes on, or the
  registration timeout (an hour by default) runs out.

So the evidence is the errors' own words, and, for the silent case, what
each worker's lookups of the cluster's names saw (``name_unresolved`` and
``name_resolved`` events, :mod:`harness.worker.names`).  The address is
mapped to a worker through the cluster list of ``TF_CONFIG``.
"""
from __future__ import annotations

import collections
import json
import re
from typing import Dict, List, Optional, Set, Tuple

from harness.core import protocol
from harness.diagnosis.blame import Blame
from harness.diagnosis.facts import Facts, phase
from harness.diagnosis.observations import WorkerObservation
from harness.diagnosis.words import names

# gRPC's words for a lookup that failed: native resolver and c-ares, and
# the JSON error of older gRPC (TensorFlow 2.15: "DNS resolution failed"
# with {"os_error":"...","syscall":"getaddrinfo","target_address":"H:P"}).
_Q = r'\\?"'   # a quote, escaped or not
_RESOLVE_RES = (
    re.compile(r"errors resolving ([^\s\[\]]+:\d+)"),
    re.compile(r"Address lookup failed for ([^\s\[\]]+:\d+)"),
    re.compile(r"DNS resolution failed for (?:service: )?([^\s\[\]]+:\d+)"),
    re.compile(_Q + r"syscall" + _Q + r":" + _Q + r"getaddrinfo" + _Q + r"[^}]*?" + _Q
               + r"target_address" + _Q + r":" + _Q + r"([^\"\\]+:\d+)"),
    re.compile(_Q + r"target_address" + _Q + r":" + _Q + r"([^\"\\]+:\d+)" + _Q
               + r"[^}]*?" + _Q + r"syscall" + _Q + r":" + _Q + r"getaddrinfo"),
)
_OS_ERROR_RES = (re.compile(r"os_error: ([^\]\"]*?) syscall"),
                 re.compile(_Q + r"os_error" + _Q + r":" + _Q + r"([^\"\\]+)"))


def failed_lookups(w: WorkerObservation) -> Dict[str, str]:
    """The addresses whose lookup failed in ``w``'s error, each with the
    resolver's words ("" when the error does not say)."""
    text = (w.error.message or "") if w.error is not None else ""
    found: Dict[str, str] = {}
    for pattern in _RESOLVE_RES:
        for address in pattern.findall(text):
            found.setdefault(address, "")
    why = next((m.group(1).strip() for m in (p.search(text) for p in _OS_ERROR_RES) if m), "")
    return dict.fromkeys(found, why)


def unresolved_names(w: WorkerObservation) -> Dict[str, Tuple[str, Optional[float]]]:
    """What ``w``'s own lookups saw: address -> (the resolver's words, when
    it resolved after all, or None)."""
    seen: Dict[str, Tuple[str, Optional[float]]] = {}
    for e in w.events:
        data = e.data if isinstance(e.data, dict) else {}
        address = data.get("address")
        if e.kind == protocol.NAME_UNRESOLVED and address:
            seen[address] = (str(data.get("error") or ""), None)
        elif e.kind == protocol.NAME_RESOLVED and address in seen:
            seen[address] = (seen[address][0], e.time)
    return seen


def worker_list(config) -> Optional[Tuple[str, ...]]:
    """A ``TF_CONFIG``'s ``cluster.worker`` list (None: it has none)."""
    try:
        if isinstance(config, str):
            config = json.loads(config)
        workers = config["cluster"]["worker"]
    except (TypeError, KeyError, ValueError):
        return None
    return tuple(workers) if isinstance(workers, list) else None


def cluster_list(f: Facts) -> Tuple[str, ...]:
    """The cluster's worker list most workers hold (empty: none holds one)."""
    lists = collections.Counter(found for found in (worker_list(w.tf_config) for w in f.workers)
                                if found is not None)
    return lists.most_common(1)[0][0] if lists else ()


def _resolved_later(f: Facts, address: str) -> Optional[float]:
    times = [t for w in f.workers for a, (_, t) in unresolved_names(w).items()
             if a == address and t is not None]
    return min(times) if times else None


def _blame(owners: Dict[int, str], why: str, seen_by: List[int], head: str,
           f: Facts) -> Blame:
    """``owners``: worker -> its address that did not resolve."""
    words = f" ({why})" if why else ""
    later = [t for t in (_resolved_later(f, a) for a in owners.values()) if t is not None]
    after = (f"; it resolved {min(later):.1f} s into the run, too late" if later else "")
    whose = "; ".join(f"{names([w])}'s address {a}" for w, a in sorted(owners.items()))
    return Blame(sorted(owners), f"its address in TF_CONFIG did not resolve{words}, "
                 f"as {names(seen_by)} saw{after}", f.worker(min(owners)).last_step,
                 headline=f"{whose} did not resolve{words}: {head}{after}")


def unresolved_address(f: Facts) -> Optional[Blame]:
    """A worker whose address in ``TF_CONFIG`` did not resolve: named by the
    errors that say so, or, when every worker waits in strategy creation
    with no error, by the lookups of the coordination leader's name that
    failed and never came good (the chief's name: the one every worker's
    coordination agent must reach)."""
    cluster = cluster_list(f)
    by_error: Dict[str, Tuple[str, Set[int]]] = {}
    for w in f.workers:
        for address, why in failed_lookups(w).items():
            old_why, seen = by_error.setdefault(address, (why, set()))
            seen.add(w.index)
            if why and not old_why:
                by_error[address] = (why, seen)
    owners = {cluster.index(a): a for a in by_error if a in cluster}
    if owners:
        why = next((by_error[a][0] for a in owners.values() if by_error[a][0]), "")
        seen = set().union(*(by_error[a][1] for a in owners.values()))
        # An owner may repeat its peers' words (their abort reaches it): it
        # is not one that failed to reach itself.
        raised = sorted(seen - set(owners)) or sorted(seen)
        return _blame(owners, why, raised,
                      f"{names(raised)} failed the first time "
                      f"{'it' if len(raised) == 1 else 'they'} reached it "
                      f"({_error_types(f, raised)}; TensorFlow does not look it up again)", f)
    if not cluster or f.errors:
        return None
    waiting = [w for w in f.workers if phase(w) == protocol.STRATEGY_CREATING]
    if len(waiting) != len(f.workers):
        return None
    leader = cluster[0]
    saw = [w.index for w in f.workers
           if leader in unresolved_names(w) and unresolved_names(w)[leader][1] is None]
    if not saw:
        return None
    why = unresolved_names(f.worker(saw[0]))[leader][0]
    return _blame({0: leader}, why, saw,
                  "every worker waited in strategy creation for the coordination service "
                  "on it, with no error (TensorFlow retries the lookup in silence)", f)


def _error_types(f: Facts, indexes: List[int]) -> str:
    errors = [f.worker(i).error for i in indexes]
    kinds = sorted({e.type_name.rpartition(".")[2] for e in errors if e is not None})
    return "/".join(kinds) or "an error"
