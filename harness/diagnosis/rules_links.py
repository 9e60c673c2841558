"""The rule that reads the links tried as a run ended
(:class:`~harness.diagnosis.observations.LinkProbe`): a worker cut off from
the network, by a link that is down or one too slow to carry a connect in
time (a rate limit whose queue is full: the handshake waits behind it).

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

import statistics
from typing import Callable, List, Optional, Sequence, Tuple

from harness.diagnosis.blame import Blame
from harness.diagnosis.facts import Facts
from harness.diagnosis.observations import LinkProbe
from harness.diagnosis.words import names


# A link that answered a connect only after this long (ms), and after this
# many times the median answer among the links that do not touch the
# worker, answered late: a handshake that waited behind a full queue
# (measured: 250-420 ms on a link held to 32 kbit/s, against at most 1 ms
# on the others, on 2 loaded cores).
SLOW_MS = 100.0
SLOW_FACTOR = 10.0


Measure = Callable[[LinkProbe], Optional[float]]


def _split(links: Sequence[LinkProbe], w: int) -> Tuple[List[LinkProbe], List[LinkProbe]]:
    """The links that touch worker ``w`` (to or from it), and the rest."""
    mine = [p for p in links if w in (p.source, p.target)]
    return mine, [p for p in links if w not in (p.source, p.target)]


def _apart(links: Sequence[LinkProbe], workers: int, measure: Measure, floor: float,
           missing_is_late: bool) -> List[int]:
    """The workers whose every link, to and from them, measured late
    (``floor`` or more, ``SLOW_FACTOR`` times the median of the links that
    do not touch them, and more than the most of those; or nothing came
    back, where ``missing_is_late``), each while every link that does not
    touch them measured something.  The median, not the most: on a loaded
    machine one of the others can take tens of ms (a prober thread not
    scheduled), seen once at 4 pytest processes beside each other."""
    found = []
    for w in range(workers):
        touching, others = _split(links, w)
        mine, rest = [measure(p) for p in touching], [measure(p) for p in others]
        if not mine or not rest or None in rest or (None in mine and not missing_is_late):
            continue
        measured = [m for m in rest if m is not None]
        bar = max(floor, SLOW_FACTOR * statistics.median(measured))
        if all(m is None or (m >= bar and m > max(measured)) for m in mine):
            found.append(w)
    return found


def _all_tried(links: Tuple[LinkProbe, ...]) -> bool:
    return bool(links) and all(p.tried for p in links)


def silent_workers(links: Tuple[LinkProbe, ...], workers: int) -> Optional[List[int]]:
    """The workers no tried link to or from answered in time (none, or
    late: see ``SLOW_MS``), each while every link that does not touch it
    answered; None when no worker stands apart so (or the links were not
    all tried)."""
    if not _all_tried(links):
        return None
    return _apart(links, workers, lambda p: p.ms if p.answered else None, SLOW_MS,
                  missing_is_late=True) or None


# A worker's round trips to and from every peer this slow (ms), and this
# many times the median between the others (and more than any), single
# out its link as slow (measured: 101 ms through a link held 50 ms each way, against at most
# 1 ms between the others).
SLOW_RTT_MS = 20.0


def slow_link_end(links: Tuple[LinkProbe, ...], workers: int) -> Optional[int]:
    """The one worker whose every round trip, to and from each peer, is
    slow (``SLOW_RTT_MS``, ``SLOW_FACTOR`` times the median between the
    others, and more than any of them) while every round trip between the others came back; None
    when no one worker stands out so (at 2 workers the one link has both
    ends: no one)."""
    ends = _apart([p for p in links if p.source is not None], workers, lambda p: p.rtt,
                  SLOW_RTT_MS, missing_is_late=False)
    return ends[0] if len(ends) == 1 else None


def slow_link_line(links: Tuple[LinkProbe, ...], w: int) -> str:
    """The words on worker ``w``'s slow link."""
    touching, others = _split([p for p in links if p.source is not None], w)
    mine, rest = sorted(p.rtt or 0.0 for p in touching), [p.rtt or 0.0 for p in others]
    return (f"slow link: {names([w])}'s round trips to and from each peer took {_span(mine)}, "
            f"the others' at most {_ms(max(rest))} (a byte there and back the way the workers' "
            f"traffic goes, tried as the run ended)")


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
    mine, rest = _split(f.obs.links, w)
    to_it = sorted({_said(p) for p in mine if p.target == w})
    how = [f"{' or '.join(sorted({p.how for p in mine if not p.answered}))} within "
           f"{max(p.ms for p in mine) / 1000:.1f} s"] if not all(p.answered for p in mine) else []
    late = sorted(p.ms for p in mine if p.answered)
    if late:
        how.append(f"answered after {_span(late)} against at most {_ms(max(p.ms for p in rest))} "
                   f"on every other link")
    return Blame([w], f"its link is down or too slow to carry a connect: as the run ended, "
                 f"{', '.join(to_it)} could not reach it in time, nor it them "
                 f"({'; '.join(how)}), while every other link answered",
                 f.worker(w).last_step)


def _ms(ms: float) -> str:
    return f"{ms:.0f} ms" if ms >= 9.5 else f"{ms:.1f} ms"


def _span(ms: List[float]) -> str:
    if len(ms) == 1 or _ms(ms[0]) == _ms(ms[-1]):
        return _ms(ms[0])
    return f"{_ms(ms[0]).removesuffix(' ms')}-{_ms(ms[-1])}"


# A link whose 64 kB there and back took this long (ms), and this many
# times the median of the links that do not touch the worker (and more than
# any), or never
# came back within the probes' limit, is too slow to carry the run
# (measured: never within 0.5 s through a link held to 32 kbit/s, against
# 1-4 ms on the others).
BULK_SLOW_MS = 100.0


def throttled_worker(links: Tuple[LinkProbe, ...], workers: int) -> Optional[int]:
    """The one worker whose every link, to and from it (the switch's to it
    too), carried 64 kB there and back too slowly or not at all, while
    every link that does not touch it carried it; None otherwise."""
    if not _all_tried(links):
        return None
    found = _apart(links, workers, lambda p: p.bulk, BULK_SLOW_MS, missing_is_late=True)
    return found[0] if len(found) == 1 else None


def throttled(f: Facts) -> Optional[Blame]:
    """A worker whose link is too slow to carry the run: as it ended, 64 kB
    sent there and back over each of its links came back too late or not
    at all, and over every other link quickly."""
    w = throttled_worker(f.obs.links, len(f.workers))
    if w is None:
        return None
    mine, others = _split(f.obs.links, w)
    rest = [p.bulk or 0.0 for p in others]
    late = sorted(p.bulk for p in mine if p.bulk is not None)
    how = (f"{len(mine) - len(late)} of {len(mine)} did not come back while the probes ran"
           if len(late) < len(mine) else "")
    if late:
        how += f"{'; ' if how else ''}the rest took {_span(late)}"
    return Blame([w], f"its link is too slow to carry the run: as it ended, 64 kB sent there "
                 f"and back over each of its links ({how}), against at most {_ms(max(rest))} "
                 f"over every other link", f.worker(w).last_step)


# Why no link was tried where the workers share one network: said where
# the verdict cannot tell, as what could have told it.
SHARED_NETWORK = ("not tried: the workers share one network, with no link of their own "
                  "(--mwms-network=switched gives each worker one, for the links to be tried)")


def link_lines(links: Tuple[LinkProbe, ...], note: str, ambiguous: bool = True) -> List[str]:
    """The links tried, in a line or two: those that did not answer, one
    by one, and how many did; or why none could be tried (that the workers
    share one network only where the verdict is ``ambiguous``)."""
    if not links:
        return [f"links: {note}"] if note and (ambiguous or note != SHARED_NETWORK) else []
    silent = [p for p in links if not p.answered]
    said = "; ".join(f"{_said(p)} to {names([p.target])}: {p.how}" for p in silent[:8])
    more = f"; and {len(silent) - 8} more" if len(silent) > 8 else ""
    trips = sorted(p.rtt for p in links if p.rtt is not None and p.source is not None)
    rtt = f"; round trips between workers {_span(trips)}" if trips else ""
    if not silent:
        return [f"links: all {len(links)} tried as the run ended answered (the switch and each "
                f"worker to each worker's port){rtt}"]
    return [f"links tried as the run ended: {len(links) - len(silent)} of {len(links)} answered; "
            f"{said}{more}{rtt}"]
