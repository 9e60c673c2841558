"""Stragglers: the worker the others wait for at the collectives.

Every worker of an MWMS cluster must join each collective call; the call
cannot go on until the last worker has arrived.  From the ledger's call
times (``Call.began``/``ended``, on the parent's clock) this module finds,
per call of a function (matched across workers by name and call number,
as :mod:`harness.diagnosis.ledger` does), the worker that arrived last,
how long after the others it came (its *lag*), and how long each other
worker waited for it.  A *straggler* is a worker that the evidence singles
out: it arrives last at most calls, late by milliseconds and by a good
share of a step, and late because of its own work between calls (its time
outside the calls is longer than the others'), not because the previous
collective released it later.  The last condition tells a slow worker from
a slow link: a ``Latency`` fault on one worker's link makes the collective
release its peers at different times, so one of them arrives last at every
call by the latency, although every worker does the same work between
calls.

TensorFlow 2.21, measured on 2 CPU cores (the seed's loop, 12 steps; the
first call of each function, traced, is left out):

* balanced, 2 workers: steps of 7-15 ms; each worker last at about half
  the calls (5 and 6 of 11), lag 0.1-4.4 ms (median ~1.7 ms);
* balanced, 4 workers: steps of 20-30 ms; one worker last at 7 of 11
  calls, lag 0.2-6.5 ms (median ~2 ms);
* worker 1 of 2 sleeping 30 ms before each step: last at 11 of 11 calls,
  lag 28.7-38.5 ms (median ~30 ms) in steps of ~40 ms; its peers waited
  ~75% of each step;
* worker 3 of 4 sleeping 30 ms: last at 11 of 11 calls, lag 12-25 ms
  (median ~20 ms) in steps of ~50 ms (its peers' work overlaps its sleep
  on 2 cores);
* ``Latency(1, 2, ms=20)`` at 2 workers: calls of ~180 ms, and worker 0
  (the one without the fault) last at every call, 21 ms after worker 1,
  because the all-reduce releases it ~21 ms later; its time between calls
  is worker 1's;
* the same at 4 workers: calls of ~235 ms, worker 2 last at 9 of 11
  calls, lag 0.4-9.7 ms.
* worker 2 of 3 sleeping 30 ms (20 steps, beside another run): last at
  19 of 19 calls, median lag 26 ms, its own extra time 32 ms, steps of
  ~85 ms; its peers waited 36% of each step;
* the scenarios' runs (20 steps; 40 for the input pipeline): ``Latency``
  at 2 workers, worker 0 last at 18 of 19 calls, 22 ms late, none of it
  its own (named none, and said); at 3 workers, last at 79%, 2.9 ms; a
  80 ms ``py_function`` map on worker 1 of 2: last at 90% of 39 calls,
  71 ms late, its peers waiting 85% of each ~82 ms step; on worker 2 of
  3: 87%, 62 ms, 74%;
* 4 workers on 2 cores, none slowed by its own work: one worker (2) came
  last at 11 of 11 calls, median lag 10 ms, as the all-reduce released it
  later; its own extra time between calls was 0.3 ms.  Arrival alone would
  have named it.

The thresholds below sit between those: last at >= 75% of calls (and at
so many that chance would do it once in a thousand runs at most), a median
lag >= 5 ms and >= 10% of the median step, and at least half of the lag
being the worker's own extra time between calls.  Pure functions of a
:class:`~harness.diagnosis.observations.RunObservation`; no TensorFlow.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Dict, List, Optional, Sequence, Tuple

from harness.diagnosis import ledger
from harness.diagnosis.observations import RunObservation, WorkerObservation
from harness.diagnosis.rules_links import slow_link_end, slow_link_line
from harness.diagnosis.words import names

# A straggler arrives last at this share of the calls at least (a balanced
# 2-worker run: each about half).
MIN_LAST_SHARE = 0.75
# ... with a median lag behind the others of at least this (seconds; a
# balanced run: ~2 ms) ...
MIN_LAG = 0.005
# ... and of at least this share of the median step.
MIN_LAG_SHARE = 0.1
# At least this share of the lag must be the worker's own extra time
# between calls (a late release by the previous collective is the link's).
MIN_OWN_SHARE = 0.5
# ... and at so many calls that chance would make it last that often with
# at most this probability (each worker last at 1/n of the calls): at 2
# workers, last at 9 of 11 calls happens by chance in 3% of runs, at 17
# of 19 in 0.04%.
MAX_CHANCE = 0.001
# Fewer matched calls than this (the first of each function left out)
# tell too little: no finding, no line (the catalogue's 6-step runs, where
# a chief's checkpoint or a tail of evaluation steps decides who is last).
MIN_CALLS = 8

# A worker that arrived at one call at least this long (seconds) after
# every other, and at least this many median steps late, by its own work
# between calls, made the others wait once: *late*, a finding apart from
# the straggler's pattern (a 0.5 s sleep before one step arrives 0.50 s
# late, against 30-80 ms between workers' first, traced, calls on 2 quiet
# cores).
LATE_ONCE = 0.25
LATE_STEPS = 3.0
# A call whose collective took this long (seconds) after its last worker
# arrived (the traced first call left out) was slow on every worker alike:
# the harness then tries the links, where it can (a run of 3 ms steps
# under 50 ms of latency on one link: 205-520 ms).
SLOW_COLLECTIVE = 0.05

CallKey = Tuple[str, int]   # (function name, call number)


@dataclasses.dataclass(frozen=True)
class WorkerArrival:
    """One worker's arrivals at the matched calls.

    ``last_share``: the share of the calls at which it arrived last;
    ``lag``: its median lag (seconds) behind the latest of the others, at
    the calls where it came last (0.0 when it never did); ``own``: its
    median extra time between calls over the others' at those calls (how
    much of the lag is its own work); ``others_wait``: the median share of
    each step the other workers spent waiting for it there (0.0 when it
    never came last); ``chance``: the probability that a worker is last
    that often by chance alone (each last at 1/n of the calls)."""

    worker: int
    last_share: float
    lag: float
    own: float
    others_wait: float
    chance: float = 1.0


@dataclasses.dataclass(frozen=True)
class LateArrival:
    """One call at which ``worker`` arrived ``lag`` seconds after every
    other worker, ``own`` of them its own extra time since its previous
    collective call (any function's) over the others' median."""

    worker: int
    function: str
    number: int
    lag: float
    own: float


@dataclasses.dataclass(frozen=True)
class StragglerReport:
    """What the call times say about stragglers.

    ``function``: the function whose calls are read, the one with the
    most calls matched on every worker (a training step's, as a rule);
    ``calls``: how many of its calls were matched (the first, traced, left
    out); ``step``: the median step (seconds: from the end
    of a worker's previous call of the function to the end of this one);
    ``in_call``: the median time a worker spent inside a call; ``workers``:
    a :class:`WorkerArrival` per worker; ``stragglers``: the workers named
    (empty when none stands out, or when ``calls`` are too few to tell);
    ``late``: each call, of any function and the first ones too, at which
    one worker made the others wait once (:class:`LateArrival`: at least
    ``LATE_ONCE`` and ``LATE_STEPS`` median steps, most of it its own);
    ``slow_link``: the worker whose every round trip to and from its peers
    was slow where the links were tried
    (:func:`harness.diagnosis.rules_links.slow_link_end`), empty where no
    one stands out or nothing was tried."""

    calls: int
    function: str
    step: float
    in_call: float
    workers: Tuple[WorkerArrival, ...]
    stragglers: Tuple[int, ...]
    late: Tuple[LateArrival, ...] = ()
    slow_link: Tuple[int, ...] = ()

    @property
    def late_workers(self) -> Tuple[int, ...]:
        return tuple(sorted({a.worker for a in self.late}))

    @property
    def enough(self) -> bool:
        """Whether there are enough calls to tell a pattern from chance."""
        return self.calls >= MIN_CALLS

    def arrival(self, worker: int) -> WorkerArrival:
        return next(a for a in self.workers if a.worker == worker)

    @property
    def most_last(self) -> Optional[WorkerArrival]:
        """The worker last most often (None: no calls)."""
        return max(self.workers, key=lambda a: a.last_share) if self.calls else None


@dataclasses.dataclass(frozen=True)
class _Sample:
    """One call, matched on every worker."""

    function: str
    began: Dict[int, float]
    last: int
    lag: float                   # the last one's lag behind the latest other
    own: float                   # its gap between calls over the others' median gap
    waits: Dict[int, float]      # each other worker's wait, as a share of its step
    step: float
    in_call: float


def _timed_calls(w: WorkerObservation) -> Dict[CallKey, Tuple[float, float]]:
    """(began, ended) of each of the worker's completed collective calls."""
    out = {}
    for c in ledger.collective_calls(w):
        if c.ended is not None and not c.raised:
            out[(ledger.function_of(w, c), c.number)] = (c.began, c.ended)
    return out


def _samples(ws: Sequence[WorkerObservation]) -> List[_Sample]:
    """Every call k >= 2 of a function that every worker made and ended,
    with each worker's previous call of it: the first (traced) is left out,
    and the previous call's end is where a worker's time between calls starts."""
    timed = {w.index: _timed_calls(w) for w in ws}
    keys = set.intersection(*(set(t) for t in timed.values())) if timed else set()
    out = []
    for name, number in sorted(keys):
        prev = (name, number - 1)
        if number < 2 or prev not in keys:
            continue
        began = {i: t[(name, number)][0] for i, t in timed.items()}
        ended = {i: t[(name, number)][1] for i, t in timed.items()}
        gap = {i: began[i] - t[prev][1] for i, t in timed.items()}
        step = {i: ended[i] - t[prev][1] for i, t in timed.items()}
        last = max(began, key=lambda i: (began[i], i))
        others = [i for i in began if i != last]
        lag = began[last] - max(began[i] for i in others)
        own = gap[last] - statistics.median(gap[i] for i in others)
        waits = {i: (began[last] - began[i]) / step[i] if step[i] > 0 else 0.0 for i in others}
        out.append(_Sample(name, began, last, lag, own, waits, statistics.median(step.values()),
                           statistics.median(ended[i] - began[i] for i in began)))
    return out


def _late(ws: Sequence[WorkerObservation], step: float) -> Tuple[LateArrival, ...]:
    """Every call matched on every worker (the first of a function too)
    at which one worker arrived late once (``LATE_ONCE``): its time since
    its own previous collective call, of any function, is what is
    compared, so a call traced alike on every worker compares alike."""
    timed = {w.index: sorted(_timed_calls(w).items(), key=lambda kv: kv[1][0]) for w in ws}
    since: Dict[int, Dict[CallKey, Tuple[float, float]]] = {}
    for i, calls in timed.items():
        since[i] = {key: (began, began - calls[n - 1][1][1])
                    for n, (key, (began, _)) in enumerate(calls) if n > 0}
    keys = set.intersection(*(set(v) for v in since.values())) if since else set()
    out = []
    for key in sorted(keys):
        began = {i: since[i][key][0] for i in since}
        gap = {i: since[i][key][1] for i in since}
        last = max(began, key=lambda i: (began[i], i))
        others = [i for i in began if i != last]
        lag = began[last] - max(began[i] for i in others)
        own = gap[last] - statistics.median(gap[i] for i in others)
        if lag >= LATE_ONCE and lag >= LATE_STEPS * step and own >= MIN_OWN_SHARE * lag:
            out.append(LateArrival(last, key[0], key[1], lag, own))
    return tuple(out)


def _arrival(worker: int, samples: Sequence[_Sample], workers: int) -> WorkerArrival:
    mine = [s for s in samples if s.last == worker]
    if not mine:
        return WorkerArrival(worker, 0.0, 0.0, 0.0, 0.0)
    return WorkerArrival(worker, len(mine) / len(samples),
                         statistics.median(s.lag for s in mine),
                         statistics.median(s.own for s in mine),
                         statistics.median(v for s in mine for v in s.waits.values()),
                         chance(len(mine), len(samples), workers))


def chance(last: int, calls: int, workers: int) -> float:
    """The probability that a given worker is last at ``last`` or more of
    ``calls`` calls when each of ``workers`` is last alike by chance (a
    binomial tail)."""
    if last <= 0:
        return 1.0
    if workers <= 1:
        return 1.0 if last <= calls else 0.0
    # In logs: the binomial coefficient of thousands of calls is beyond a float.
    log_p, log_q = -math.log(workers), math.log1p(-1.0 / workers)
    terms = [math.lgamma(calls + 1) - math.lgamma(k + 1) - math.lgamma(calls - k + 1)
             + k * log_p + (calls - k) * log_q for k in range(last, calls + 1)]
    top = max(terms, default=-math.inf)
    if top == -math.inf:
        return 0.0
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def _singled_out(a: WorkerArrival, step: float) -> bool:
    return (a.last_share >= MIN_LAST_SHARE and a.chance <= MAX_CHANCE and a.lag >= MIN_LAG
            and a.lag >= MIN_LAG_SHARE * step and a.own >= MIN_OWN_SHARE * a.lag)


def slow_collectives(obs: RunObservation) -> bool:
    """Whether, in a run whose every worker returned, some call's
    collective took ``SLOW_COLLECTIVE`` or more after its last worker
    arrived: every worker slowed alike, as a slow link does."""
    ws = [w for w in obs.workers if ledger.has_ledger(w)]
    if len(ws) < 2 or len(ws) != len(obs.workers) or not all(w.returned for w in ws):
        return False
    timed = [_timed_calls(w) for w in ws]
    for key in set.intersection(*(set(t) for t in timed)):
        if key[1] >= 2 and statistics.median(t[key][1] for t in timed) - max(
                t[key][0] for t in timed) >= SLOW_COLLECTIVE:
            return True
    return False


def stragglers(obs: RunObservation) -> StragglerReport:
    """The straggler report of ``obs`` (see the module docstring): empty
    unless every worker returned."""
    ws = [w for w in obs.workers if ledger.has_ledger(w)]
    # Only a run whose every worker returned: where one stopped, its calls
    # and its peers' no longer pair up one for one, and the verdict is another.
    whole = len(ws) >= 2 and len(ws) == len(obs.workers) and all(w.returned for w in ws)
    samples = _samples(ws) if whole else []
    returned = bool(obs.workers) and all(w.returned for w in obs.workers)
    end = slow_link_end(obs.links, len(obs.workers)) if returned else None
    slow = () if end is None else (end,)
    if not samples:
        # A run without a ledger (ledger="off") can still name a slow link.
        return StragglerReport(0, "", 0.0, 0.0,
                               tuple(WorkerArrival(w.index, 0.0, 0.0, 0.0, 0.0)
                                     for w in obs.workers), (), _late(ws, 0.0) if whole else (),
                               slow)
    functions = [s.function for s in samples]
    function = max(sorted(set(functions)), key=functions.count)
    samples = [s for s in samples if s.function == function]
    step = statistics.median(s.step for s in samples)
    in_call = statistics.median(s.in_call for s in samples)
    arrivals = tuple(_arrival(w.index, samples, len(ws)) for w in ws)
    named = (tuple(a.worker for a in arrivals if _singled_out(a, step))
             if len(samples) >= MIN_CALLS else ())
    return StragglerReport(len(samples), function, step, in_call, arrivals, named,
                           _late(ws, step), slow)


def waits(obs: RunObservation) -> Dict[int, Tuple[Tuple[float, float], ...]]:
    """Per worker, each wait for the last arrival at a call of the report's
    function (``(began, when the last one arrived)``; none at calls where
    it came last itself), for the timeline."""
    report = stragglers(obs)
    out: Dict[int, List[Tuple[float, float]]] = {w.index: [] for w in obs.workers}
    if not report.calls:
        return dict.fromkeys(out, ())
    for s in _samples(list(obs.workers)):
        if s.function == report.function:
            for i, t in s.began.items():
                if i != s.last:
                    out[i].append((t, s.began[s.last]))
    return {i: tuple(v) for i, v in out.items()}


def wait_labels(obs: RunObservation) -> Dict[int, str]:
    """Per worker, a few words for its row of the timeline: ``straggler:
    last 100%, 30 ms late`` (last at 100% of the calls), or ``waited 62% of its time in
    calls``; empty when there are too few calls to tell."""
    report = stragglers(obs)
    if not report.enough:
        return {w.index: "" for w in obs.workers}
    spans = waits(obs)
    out = {}
    for w in obs.workers:
        if w.index in report.stragglers:
            a = report.arrival(w.index)
            out[w.index] = f"straggler: last {_pct(a.last_share)}, {_ms(a.lag)} late"
            continue
        in_calls = sum(c.ended - c.began for c in ledger.collective_calls(w)
                       if c.ended is not None and c.number > 1
                       and ledger.function_of(w, c) == report.function)
        waited = sum(b - a for a, b in spans[w.index])
        out[w.index] = (f"waited {_pct(waited / in_calls)} of its time in calls"
                        if in_calls > 0 else "")
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds >= 0.0095 else f"{seconds * 1000:.1f} ms"


def _s(seconds: float) -> str:
    return f"{seconds:.2f} s" if seconds >= 0.1 else _ms(seconds)


def _pct(share: float) -> str:
    return f"{share * 100:.0f}%"


def straggler_lines(obs: RunObservation) -> List[str]:
    """The diagnosis's lines about stragglers, for a completed run: who the
    others waited for, or, when one worker arrives last at most calls but
    not by its own work, that the wait is the link's or the collective's;
    nothing when there are too few calls to tell or nothing to say."""
    report = stragglers(obs)
    lines = [f"late once: {names([a.worker])} arrived {_s(a.lag)} after the others at call "
             f"{a.number} of `{a.function}`, {_s(a.own)} of it its own time since its previous "
             f"call: the others waited" for a in report.late]
    lines += [slow_link_line(obs.links, w) for w in report.slow_link]
    if not report.enough:
        return lines
    for i in report.stragglers:
        a = report.arrival(i)
        lines.append(f"straggler: {names([i])} arrived last at {_pct(a.last_share)} of "
                     f"`{report.function}` calls, {_ms(a.lag)} after the others on median; "
                     f"the others spent {_pct(a.others_wait)} of each step waiting")
    top = report.most_last
    if not report.stragglers and top is not None and released_late(top):
        lines.append(f"stragglers: none; every worker waited alike, median "
                     f"{_ms(report.in_call)} of each {_ms(report.step)} step in "
                     f"`{report.function}`: a slow link or collective, not a slow worker "
                     f"({names([top.worker])} arrives last at {_pct(top.last_share)} of calls, "
                     f"{_ms(top.lag)} late, as the previous call releases it later)")
    return lines


def released_late(a: WorkerArrival) -> bool:
    """Whether ``a`` arrives last at most calls, though not by its own work
    between calls: the previous collective released it later (a slow link,
    or the collective's own order)."""
    return (a.last_share >= MIN_LAST_SHARE and a.chance <= MAX_CHANCE and a.lag > 0
            and a.own < MIN_OWN_SHARE * a.lag)
