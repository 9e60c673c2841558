"""Parent side: one worker's progress and collective ledger, put together.

What a worker records reaches the parent two ways: step boundaries and
calls through its progress map (:mod:`harness.core.progress`), and what is
learnt once, at trace time (a function's name, its collectives), over the
pipe.  :class:`LedgerView` takes both, in any order, and gives them back as
the plain records of :mod:`harness.diagnosis.observations`.  Pure: no TensorFlow, no I/O.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from harness.core import progress, protocol
from harness.diagnosis.observations import Call, CollectiveOp, Event, TracedFunction


class LedgerView:
    def __init__(self, start: float):
        self.start = start               # the run's start, on the monotonic clock
        self.step_events: List[Event] = []
        self.names: Dict[int, str] = {}
        self.traces: Dict[int, int] = {}
        self.ops: Dict[int, Dict[int, CollectiveOp]] = {}
        self.calls: Dict[Tuple[int, int], dict] = {}
        self.sites: Dict[int, str] = {}   # id -> the user's line (eager collectives)
        self.latest: Optional[float] = None   # the newest record's time (monotonic)
        self.notes: List[str] = []

    # -- from the pipe ----------------------------------------------------
    def message(self, kind: str, data) -> bool:
        """Take a ledger message; False when ``kind`` is not one."""
        if kind == protocol.LEDGER_FUNCTION:
            self.names[int(data["id"])] = str(data["name"])
        elif kind == protocol.LEDGER_COLLECTIVE:
            fid, trace = int(data["function"]), int(data["trace"])
            if self.traces.get(fid) != trace:   # a new trace: its list replaces the old
                self.traces[fid] = trace
                self.ops[fid] = {}
            self.ops[fid][int(data["index"])] = CollectiveOp(
                str(data["kind"]), tuple(int(d) for d in data["shape"]), str(data["dtype"]),
                tuple(str(part) for part in data.get("label", ())),
                float(data.get("timeout", 0.0)))
        elif kind == protocol.LEDGER_SITE:
            self.sites[int(data["id"])] = str(data["site"])
        elif kind == protocol.LEDGER_OFF:
            self.notes.append(f"no collective ledger: {data}")
        else:
            return False
        return True

    # -- from the progress map ----------------------------------------------
    def records(self, records: List[progress.Record]) -> None:
        for r in records:
            t = r.time - self.start
            self.latest = r.time if self.latest is None else max(self.latest, r.time)
            if r.kind == progress.STEP:
                self.step_events.append(Event(t, protocol.STEP, r.number, r.detail or None))
            elif r.kind == progress.CALL_BEGAN:
                self.calls[(r.function, r.number)] = {
                    "function": r.function, "number": r.number, "began": t,
                    "step": None if r.detail == progress.NO_STEP else r.detail}
            elif r.kind == progress.CALL_ENDED:
                call = self.calls.get((r.function, r.number))
                if r.detail == progress.CALL_NOT_RUN:   # skipped before it reached the cluster
                    self.calls.pop((r.function, r.number), None)
                elif call is not None:
                    call.update(ended=t, raised=r.detail == progress.CALL_RAISED)
            elif r.kind == progress.CALL_SITE:
                call = self.calls.get((r.function, r.number))
                if call is not None:
                    call["site"] = r.detail
            elif r.kind in (progress.COLLECTIVE_LAUNCHED, progress.COLLECTIVE_DONE):
                call = self.calls.get((r.function, r.number))
                if call is not None:
                    key = "launched" if r.kind == progress.COLLECTIVE_LAUNCHED else "done"
                    call[key] = call.get(key, ()) + (r.detail,)

    def lost(self, count: int) -> None:
        if count:
            self.notes.append(f"{count} progress records were lost (the parent read too late)")

    # -- the result --------------------------------------------------------
    def functions(self) -> Tuple[TracedFunction, ...]:
        fids = sorted(set(self.names) | set(self.ops))
        return tuple(TracedFunction(fid, self.names.get(fid, f"function {fid}"),
                                    tuple(op for _, op in sorted(self.ops.get(fid, {}).items())))
                     for fid in fids)

    def call_records(self) -> Tuple[Call, ...]:
        """The calls, each with its user's line where it has one (its id
        and the line may come in either order)."""
        def call(c: dict) -> Call:
            site = c.get("site")
            return Call(**{**c, "site": "" if site is None else self.sites.get(site, "")})
        return tuple(map(call, sorted(self.calls.values(), key=lambda c: c["began"])))
