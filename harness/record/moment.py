"""When the picture of a recorded job is taken, and what happened after it.

A hung job does not end by itself: whoever runs it kills it (SIGKILL, or
SIGTERM and SIGKILL after a grace period), and only then are its files
gathered.  Read to their end, the files show every task dying at once, and
the kill would be blamed.  So the picture is taken at the moment the
evidence was complete, as the fixture takes it when it declares a hang,
and what follows is told after the verdict, as the ending, never used as
evidence:

- An *intervention* is a task's death (it ended with no exit record of
  its own: a signal, ``os._exit``) or the dump of a stop signal
  (SIGTERM).  They are taken in time order.
- At an intervention, the job *had hung* when every task still running
  had gone quiet by then: it had written a "no progress" dump after its
  latest progress, or it was stopped (SIGSTOP).  The picture is taken
  just before it (:data:`MARGIN`: the watcher sees a death up to a look
  late, and a peer may already have raised at it).
- An intervention while some task still progressed (the OOM killer, a
  node lost) is evidence, as today: the next one is looked at.
- With no intervention where the job had hung, the picture is the latest
  moment any file records (:func:`picture` returns None).

Pure: it reads :class:`TaskTimeline` values, which :func:`timeline` makes
from one task's files.
"""
from __future__ import annotations

import bisect
import dataclasses
import signal
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from harness.diagnosis.observations import EXIT_STATUS_UNKNOWN
from harness.diagnosis.words import names
from harness.record import files

# The watcher looks every 0.2 s, so a death is seen up to that late; a
# peer's error at the death must fall after the picture.
MARGIN = 0.25
QUIET_DUMP = "no progress"
STOP_REASONS = ("SIGTERM",)


@dataclasses.dataclass(frozen=True)
class TaskTimeline:
    """One task's times on the run's clock: its progress (sorted), its
    "no progress" dumps and stop-signal dumps, its watcher's stops and
    starts, and its end: ``end`` the time, ``died`` whether it left no exit
    record, ``how`` its words for the ending."""

    index: int
    progress: Tuple[float, ...] = ()
    quiet: Tuple[float, ...] = ()
    stops: Tuple[float, ...] = ()
    states: Tuple[Tuple[float, str], ...] = ()
    end: Optional[float] = None
    died: bool = False
    how: str = ""

    def progressed_before(self, at: float) -> float:
        i = bisect.bisect_right(self.progress, at)
        return self.progress[i - 1] if i else float("-inf")

    def quiet_at(self, at: float, seen: float) -> bool:
        """Gone quiet by ``at``: stopped, or a "no progress" dump after its
        latest progress by ``at``, written by ``seen`` (when the
        intervention was seen; what it recorded in between may be the
        intervention's echo, not progress)."""
        states = [s for t, s in self.states if t <= seen]
        if states and states[-1] == "stopped":
            return True
        since = self.progressed_before(at)
        return any(since < q <= seen for q in self.quiet)


def _ending_words(code: Optional[int]) -> str:
    if code is None or code == EXIT_STATUS_UNKNOWN:
        return "ended (exit status unknown)"
    if code < 0:
        try:
            return f"killed ({signal.Signals(-code).name})"
        except ValueError:
            return f"killed (signal {-code})"
    return f"exited (status {code})"


def timeline(task: files.TaskFiles, index: int, clock: Callable[[float], float]) -> TaskTimeline:
    """``task``'s :class:`TaskTimeline`, its times mapped by ``clock``."""
    moments = [clock(r.time) for r in task.records]
    quiet: List[float] = []
    stops: List[float] = []
    ending: Optional[Tuple[float, dict]] = None
    for e in task.events:
        kind, data, at = e.get("kind"), e.get("data"), clock(float(e.get("time", 0.0)))
        if kind == files.DUMP:
            reason = str((data or {}).get("reason", "")) if isinstance(data, dict) else ""
            if reason.startswith(QUIET_DUMP):
                quiet.append(at)
            elif reason in STOP_REASONS:
                stops.append(at)
        elif kind == files.EXIT:
            ending = ending or (at, data if isinstance(data, dict) else {})
        else:
            moments.append(at)
    watch = [w for w in task.watch if isinstance(w.get("time"), (int, float))]
    states = tuple((clock(w["time"]), str(w.get("state"))) for w in watch)
    ended = next(((clock(w["time"]), w) for w in watch if w.get("state") == "ended"), None)
    end, died, how = None, False, ""
    if ending is not None:
        end, data = ending
        error = data.get("error")
        if not isinstance(error, dict):
            error = {}
        said: Dict[Optional[str], str] = {
            files.RETURNED: "returned",
            files.RAISED: f"raised {str(error.get('type_name') or 'an error').rsplit('.', 1)[-1]}"}
        how = said.get(data.get("how"), _ending_words(data.get("status")))
    elif ended is not None:
        end, died = ended[0], True
        code = ended[1].get("exit_code")
        how = _ending_words(code if isinstance(code, int) else None)
    return TaskTimeline(index, tuple(sorted(moments)), tuple(sorted(quiet)), tuple(sorted(stops)),
                        states, end, died, how)


def picture(timelines: Sequence[TaskTimeline]) -> Optional[Tuple[float, float]]:
    """The moment the evidence was complete, just before the first
    intervention at which the job had hung, and when that intervention was
    seen (the dumps until then show the hung job); None when there is none
    (the files are read to their end)."""
    interventions = sorted({t.end for t in timelines if t.died and t.end is not None}
                           | {t.stops[0] for t in timelines if t.stops})
    for seen in interventions:
        before = seen - MARGIN
        running = [t for t in timelines if t.end is None or t.end >= before]
        if running and all(t.quiet_at(before, seen) for t in running):
            return before, seen
    return None


def _group(items: List[Tuple[int, str]]) -> List[Tuple[List[int], str]]:
    out: List[Tuple[List[int], str]] = []
    for index, how in items:
        for group in out:
            if group[1] == how:
                group[0].append(index)
                break
        else:
            out.append(([index], how))
    return out


def _who(indexes: Sequence[int], everyone: Sequence[int], how: str) -> str:
    """``every task was killed (SIGKILL)``, ``workers 0,2 were killed
    (SIGKILL)``, ``worker 1 ended (...)``: ``every task`` when
    ``indexes`` are all of ``everyone`` (every task of the job)."""
    every = sorted(indexes) == sorted(everyone) and len(everyone) > 1
    verb = ("were " if len(indexes) > 1 and not every else "was ") \
        if how.startswith("killed") else ""
    return f"{'every task' if every else names(indexes)} {verb}{how}"


def ending(timelines: Sequence[TaskTimeline], at: float) -> str:
    """What happened after the picture taken at ``at``, in one line:
    ``then every task was killed (SIGKILL) 13.0 s after the job's last
    progress``.  What a task did after it is no evidence: an error it
    raised then is marked so."""
    after = [t for t in timelines if t.end is None or t.end > at]
    if not after:
        return ""
    everyone = [t.index for t in timelines]
    last = max([t.progressed_before(at) for t in timelines] + [0.0])
    parts = []
    stopped = [(t.index, min(s for s in t.stops if s > at)) for t in after
               if any(s > at for s in t.stops)]
    since, since_words = last, "the job's last progress"
    if stopped:
        first = min(s for _, s in stopped)
        parts.append(f"SIGTERM to {_who([i for i, _ in stopped], everyone, '')[:-1]} "
                     f"{first - last:.1f} s after the job's last progress")
        since, since_words = first, "it"
    ends = [(t.index, t.how + (" (after the kill: an echo, not evidence)"
                               if t.how.startswith("raised") else ""))
            for t in after if t.end is not None]
    if ends:
        times = [t.end - since for t in after if t.end is not None]
        span = f"{min(times):.1f}" + (f"-{max(times):.1f}" if max(times) - min(times) >= 0.1
                                      else "")
        groups = _group(ends)
        if len(groups) == 1:
            parts.append(f"{_who(groups[0][0], everyone, groups[0][1])} {span} s after "
                         f"{since_words}")
        else:
            parts.append(f"{span} s after {since_words}: " + ", ".join(
                _who(indexes, everyone, how) for indexes, how in groups))
    open_ = [t.index for t in after if t.end is None]
    if open_:
        parts.append(f"{names(open_)} left no record of its end (its watcher ended with it)")
    return "then " + "; ".join(parts)

