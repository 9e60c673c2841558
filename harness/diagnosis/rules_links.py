"""The rule that reads the links tried as a run ended
(:class:`~harness.diagnosis.observations.LinkProbe`): a worker cut off from
the network.

In a switched cluster every worker has a network namespace of its own,
joined to a bridge: the harness tries each link from the bridge and from
each worker to each other.  A worker that answers no one (neither the
bridge nor any peer reaches it, nor it them) while every other link
answers is cut off, and a run that stalls waiting on it stalls on its link.
The bridge is a vantage point outside both ends, so this holds with 2
workers too: the bridge reaches the one and not the other.  Where more
than one worker is silent, or a link between two that answer the bridge
is down, no single worker stands out and the rule says nothing.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from harness.diagnosis.blame import Blame
from harness.diagnosis.facts import Facts
from harness.diagnosis.observations import LinkProbe
from harness.diagnosis.words import names


def silent_workers(links: Tuple[LinkProbe, ...], workers: int) -> Optional[List[int]]:
    """The workers no tried link to or from answered, when every link
    between the others (and from the bridge to them) did; None when the
    links do not split that way (or were not all tried)."""
    tried = [p for p in links if p.tried]
    if not tried or len(tried) < len(links):
        return None
    touching: Dict[int, List[LinkProbe]] = {w: [p for p in tried if w in (p.source, p.target)]
                                            for w in range(workers)}
    silent = [w for w, ps in touching.items() if ps and not any(p.answered for p in ps)]
    rest = [p for p in tried if p.source not in silent and p.target not in silent]
    if not silent or not rest or not all(p.answered for p in rest):
        return None
    return silent


def _said(p: LinkProbe) -> str:
    return "the switch" if p.source is None else names([p.source])


def cut_off(f: Facts) -> Optional[Blame]:
    """A worker cut off from the network: the links tried as the run ended
    found it silent to the switch and to every peer, every other link
    answering."""
    silent = silent_workers(f.obs.links, len(f.workers))
    if silent is None or len(silent) != 1:
        return None
    (w,) = silent
    mine = [p for p in f.obs.links if w in (p.source, p.target)]
    to_it = sorted({_said(p) for p in mine if p.target == w})
    how = sorted({p.how for p in mine})
    limit = max(p.ms for p in mine) / 1000
    return Blame([w], f"its link is down: as the run ended, {', '.join(to_it)} could not reach "
                 f"it, nor it them ({' or '.join(how)} within {limit:.1f} s), while every other "
                 f"link answered", f.worker(w).last_step)


def link_lines(links: Tuple[LinkProbe, ...], note: str) -> List[str]:
    """The links tried, in a line or two: those that did not answer, one
    by one, and how many did; or why none could be tried."""
    if not links:
        return [f"links: {note}"] if note else []
    silent = [p for p in links if not p.answered]
    said = "; ".join(f"{_said(p)} to {names([p.target])}: {p.how}" for p in silent[:8])
    more = f"; and {len(silent) - 8} more" if len(silent) > 8 else ""
    if not silent:
        return [f"links: all {len(links)} tried as the run ended answered (the switch and each "
                f"worker to each worker's port)"]
    return [f"links tried as the run ended: {len(links) - len(silent)} of {len(links)} answered; "
            f"{said}{more}"]
