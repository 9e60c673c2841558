"""A run as a story in time: who reached which step, who waited in which
collective, when a fault struck, when the harness called the verdict.

Two renderings of the same :class:`Lane` data, made from what the parent
observed (the record and the verdict; nothing else):

* :func:`chrome_trace`: the Trace Event Format (a JSON object with
  ``traceEvents``), which Perfetto (ui.perfetto.dev) and ``chrome://tracing``
  open, the viewers TensorFlow's profiler, PyTorch's and Horovod's timeline
  users already have.  One process per attempt, two threads per worker (its
  steps; its ``tf.function`` calls with their collectives), instants for
  phases, faults and the end of each worker, and one global instant where
  the verdict was declared.  Times in microseconds from the attempt's start.
* :func:`svg`: a self-contained picture that needs no viewer, one row per
  worker in the manner of Jepsen's timelines: step boxes, call boxes
  coloured by how they ended (completed, raised, still pending: the
  blocked collective is labelled), fault markers, the end of each worker,
  the verdict's line, and the culprit's row marked.

:func:`write` writes both.  Pure functions over plain data, apart from
:func:`write`; no TensorFlow.
"""
from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple
from xml.sax.saxutils import escape

from harness.core import protocol
from harness.diagnosis import ledger as ledger_facts
from harness.diagnosis.echoes import exit_text
from harness.diagnosis.observations import Outcome, RunObservation, WorkerObservation
from harness.diagnosis.stragglers import wait_labels, waits
from harness.report.writing import write_together

# Call boxes by how the call ended (the SVG's fill, the trace's colour name).
CALL_COLOURS = {"completed": ("#7fbf7f", "good"), "raised": ("#e06666", "terrible"),
                "pending": ("#f6a13a", "bad")}
PHASE_NAMES: Dict[str, str] = {
    protocol.STARTED: "started", protocol.STRATEGY_CREATING: "creating strategy",
    protocol.STRATEGY_CREATED: "strategy created", protocol.STEPS_DONE: "loop done"}


@dataclasses.dataclass(frozen=True)
class Span:
    """A box on a worker's row: ``start`` to ``end`` seconds (``end`` None:
    open to the end of the attempt), with a label and details."""

    start: float
    end: Optional[float]
    label: str
    state: str = ""            # calls: completed, raised or pending
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class Mark:
    """A point on a worker's row: a phase, a fault, the worker's end."""

    time: float
    kind: str                  # "phase", "fault" or "end"
    label: str


@dataclasses.dataclass(frozen=True)
class Lane:
    """One worker's row of one attempt."""

    worker: int
    culprit: bool
    steps: Tuple[Span, ...]
    calls: Tuple[Span, ...]
    marks: Tuple[Mark, ...]
    # Its waits at the collectives for the last worker to arrive, and a
    # few words on them (see harness.diagnosis.stragglers).
    waits: Tuple[Span, ...] = ()
    wait_label: str = ""
    name: str = ""             # as the verdict names it: "chief", "worker 1", "evaluator"

    @property
    def title(self) -> str:
        return self.name or f"worker {self.worker}"


@dataclasses.dataclass(frozen=True)
class Panel:
    """One attempt: its lanes, when it was decided, and the verdict's words."""

    attempt: int
    outcome: str
    headline: str
    duration: float
    lanes: Tuple[Lane, ...]
    ambiguous: bool = False


def _end_of(w: WorkerObservation, duration: float) -> float:
    """When the worker stopped making the record longer."""
    times = [t for t in (w.finish_time, w.exit_time) if t is not None]
    return min(min(times, default=duration), duration)


def _end_mark(w: WorkerObservation, duration: float) -> Optional[Mark]:
    if w.error is not None:
        return Mark(or_end(w.finish_time, duration), "end", f"raised {w.error}")
    if w.returned:
        return Mark(or_end(w.finish_time, duration), "end", "returned")
    if w.killed_by_harness:
        return Mark(or_end(w.exit_time, duration), "end", "killed by the harness")
    if w.exit_code is not None:
        return Mark(or_end(w.exit_time, duration), "end", f"died ({exit_text(w.exit_code)})")
    return None


def or_end(t: Optional[float], duration: float) -> float:
    return duration if t is None else min(t, duration)


def lane(w: WorkerObservation, culprit: bool, duration: float) -> Lane:
    """One worker's row, from its observation."""
    end = _end_of(w, duration)
    boundaries = [e for e in w.events if e.kind == protocol.STEP and isinstance(e.step, int)]
    steps = []
    for k, e in enumerate(boundaries):
        nxt = boundaries[k + 1].time if k + 1 < len(boundaries) else None
        # The last step ends where the worker did; a worker the harness
        # killed (or never saw end) was still in it when the verdict came.
        finish = nxt if nxt is not None else (end if w.finished or w.died else None)
        steps.append(Span(e.time, finish, f"step {e.step}"))
    names = {f.id: f for f in w.functions}
    pending = ledger_facts.pending_call(w)
    calls = []
    for c in w.calls:
        f = names.get(c.function)
        if f is None:
            continue
        ops = ledger_facts.describe_ops(f.collectives)
        if c.ended is not None:
            state = "raised" if c.raised else "completed"
            detail = ops
        else:
            state = "pending"
            detail = (ledger_facts.describe_pending(w) if c == pending else "") or ops
        calls.append(Span(c.began, c.ended, f"{f.name} #{c.number}", state, detail))
    marks = [Mark(e.time, "phase", PHASE_NAMES[e.kind]) for e in w.events
             if e.kind in PHASE_NAMES]
    marks += [Mark(e.time, "fault", str(e.data)) for e in w.events if e.kind == protocol.FAULT]
    last = _end_mark(w, duration)
    if last is not None:
        marks.append(last)
    return Lane(w.index, culprit, tuple(steps), tuple(calls),
                tuple(sorted(marks, key=lambda m: m.time)))


def panel(obs: RunObservation, outcome: str, culprits: Sequence[int], text: str,
          attempt: int = 0, ambiguous: bool = False) -> Panel:
    """One attempt's panel from its record and verdict."""
    blamed = set(culprits)
    spans, labels = waits(obs), wait_labels(obs)
    lanes = tuple(dataclasses.replace(
        lane(w, w.index in blamed, obs.duration),
        waits=tuple(Span(t0, t1, "waiting for the last worker") for t0, t1 in spans[w.index]),
        wait_label=labels[w.index], name=obs.label(w.index)) for w in obs.workers)
    return Panel(attempt, outcome, (text.splitlines() or [""])[0], obs.duration, lanes,
                 ambiguous)


def panels_of(result) -> List[Panel]:
    """Every attempt of a :class:`~harness.result.RunResult`, as panels."""
    attempts = result.attempts or (result,)
    return [panel(a.observation, a.outcome, a.culprits, a.diagnosis, a.attempt, a.ambiguous)
            for a in attempts]


# ---------------------------------------------------------------- the trace

def _us(seconds: float) -> float:
    return round(seconds * 1e6, 1)


def chrome_trace(panels: Sequence[Panel]) -> dict:
    """The Trace Event Format object for ``panels`` (see the module docstring)."""
    events: List[dict] = []
    for p in panels:
        pid = p.attempt
        events.append({"ph": "M", "name": "process_name", "pid": pid,
                       "args": {"name": f"attempt {p.attempt}: {p.outcome}"}})
        for ln in p.lanes:
            mark = " (culprit)" if ln.culprit else ""
            for tid, what in ((2 * ln.worker, "steps"), (2 * ln.worker + 1, "calls")):
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                               "args": {"name": f"{ln.title}{mark}: {what}"}})
                events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                               "args": {"sort_index": tid}})
            for s in ln.steps:
                end = p.duration if s.end is None else s.end
                events.append({"ph": "X", "cat": "step", "name": s.label, "pid": pid,
                               "tid": 2 * ln.worker, "ts": _us(s.start),
                               "dur": _us(max(0.0, end - s.start))})
            for s in ln.calls:
                end = p.duration if s.end is None else s.end
                events.append({"ph": "X", "cat": "collective", "pid": pid,
                               "tid": 2 * ln.worker + 1, "ts": _us(s.start),
                               "dur": _us(max(0.0, end - s.start)),
                               "name": s.label + (" (blocked)" if s.state == "pending" else ""),
                               "cname": CALL_COLOURS[s.state][1],
                               "args": {"state": s.state, "collectives": s.detail}})
            for m in ln.marks:
                events.append({"ph": "i", "s": "t", "cat": m.kind, "pid": pid,
                               "tid": 2 * ln.worker, "ts": _us(m.time),
                               "name": f"fault: {m.label}" if m.kind == "fault" else m.label})
        events.append({"ph": "i", "s": "g", "cat": "verdict", "pid": pid, "tid": 0,
                       "ts": _us(p.duration), "name": f"{p.outcome.upper()} declared",
                       "args": {"diagnosis": p.headline}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"generator": "pytest-mwms",
                          "attempts": [{"attempt": p.attempt, "outcome": p.outcome,
                                        "verdict": p.headline} for p in panels]}}


# ---------------------------------------------------------------- the picture

WIDTH = 1100
LEFT = 170          # the labels' column
RIGHT = 20
ROW = 38
HEAD = 44           # a panel's title lines
AXIS = 22
MAX_LABEL = 150     # characters of a label kept


def _clip(text: str, n: int = MAX_LABEL) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def _ticks(duration: float) -> List[float]:
    """Round tick times (1, 2 or 5 times a power of ten) for the axis, about 8."""
    if duration <= 0:
        return [0.0]
    raw = duration / 8
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [round(i * step, 6) for i in range(int(duration / step + 1e-9) + 1)]


# The least room a step gets on the axis: where steps are short beside the
# run's start-up and its end, the axis stretches them (the ticks then say
# where the seconds fall).
MIN_STEP_PX = 36.0


def time_axis(p: Panel) -> Tuple[Callable[[float], float], List[float]]:
    """``x(t)`` for the panel and the times to tick: a piecewise linear axis
    whose knots are the step boundaries of the worker that ran the most
    steps, each of its steps at least :data:`MIN_STEP_PX` wide where that
    fits, the rest in proportion (the other workers' boundaries, a few
    milliseconds off, fall between)."""
    room, duration = WIDTH - LEFT - RIGHT, max(p.duration, 1e-3)
    longest = max(p.lanes, key=lambda ln: len(ln.steps), default=None)
    bounds = sorted({round(min(max(s.start, 0.0), duration), 4)
                     for s in (longest.steps if longest else ())})
    knots = sorted({0.0, duration, *bounds})
    seconds = [b - a for a, b in itertools.pairwise(knots)]
    inside = [bool(bounds) and bounds[0] <= a and b <= bounds[-1]
              for a, b in itertools.pairwise(knots)]
    least = min(MIN_STEP_PX, room / max(1, 2 * sum(inside)))
    scale = room / duration
    for _ in range(20):   # shrink the rest until the steps' least room fits
        widths = [max(d * scale, least) if i else d * scale for d, i in zip(seconds, inside)]
        if sum(widths) <= room + 1e-6:
            break
        free = sum(d for d, w, i in zip(seconds, widths, inside) if not (i and w == least))
        fixed = sum(w for w, i in zip(widths, inside) if i and w == least)
        scale = max((room - fixed) / max(free, 1e-9), 1e-9)
    edges: List[float] = [LEFT]
    for w in widths:
        edges.append(edges[-1] + w * room / max(sum(widths), 1e-9))

    def x(t: float) -> float:
        t = max(0.0, min(t, duration))
        i = max(0, min(len(seconds) - 1, bisect.bisect_right(knots, t) - 1))
        share = (t - knots[i]) / seconds[i] if seconds[i] > 0 else 0.0
        return edges[i] + share * (edges[i + 1] - edges[i])

    ticks, last = [], -math.inf
    for t in sorted(set(_ticks(p.duration)) | set(knots)):
        if x(t) - last >= 48:
            ticks.append(t)
            last = x(t)
    return x, ticks


def _panel_svg(p: Panel, top: float, out: List[str]) -> float:
    """Draw one panel from ``top``; return the y below it."""
    x, ticks = time_axis(p)
    colours: Dict[str, str] = {Outcome.COMPLETED: "#2e7d32", Outcome.HANG: "#b26a00"}
    colour = colours.get(p.outcome, "#c62828")
    out.append(f'<text x="8" y="{top + 16}" class="title" fill="{colour}">'
               f'attempt {p.attempt}: {escape(p.outcome.upper())}</text>')
    out.append(f'<text x="8" y="{top + 34}" class="head">{escape(_clip(p.headline, 190))}</text>')
    y0 = top + HEAD
    for r, ln in enumerate(p.lanes):
        y = y0 + r * ROW
        if ln.culprit:
            out.append(f'<rect x="0" y="{y}" width="{WIDTH}" height="{ROW}" class="culprit-row"/>')
        name = ln.title + (
            (" ? candidate" if p.ambiguous else " ← culprit") if ln.culprit else "")
        out.append(f'<text x="8" y="{y + ROW / 2 + 4}" class="{"culprit" if ln.culprit else "worker"}">'
                   f'{escape(name)}</text>')
        for k, s in enumerate(ln.steps):
            x0, x1 = x(s.start), x(p.duration if s.end is None else s.end)
            out.append(f'<rect x="{x0:.1f}" y="{y + 3}" width="{max(x1 - x0, 0.8):.1f}" '
                       f'height="{ROW / 2 - 4}" class="step{k % 2}"><title>{escape(s.label)}'
                       f'</title></rect>')
            if x1 - x0 > 34:
                out.append(f'<text x="{x0 + 3:.1f}" y="{y + ROW / 2 - 5}" class="small">'
                           f'{escape(s.label)}</text>')
        for s in ln.calls:
            x0, x1 = x(s.start), x(p.duration if s.end is None else s.end)
            fill = CALL_COLOURS[s.state][0]
            out.append(f'<rect x="{x0:.1f}" y="{y + ROW / 2}" width="{max(x1 - x0, 0.8):.1f}" '
                       f'height="{ROW / 2 - 3}" fill="{fill}" class="call {s.state}">'
                       f'<title>{escape(s.label)}: {escape(s.state)}; {escape(s.detail)}</title></rect>')
            if s.state == "pending":
                label = f"blocked: {s.detail or s.label}"
                anchor_x = min(x0 + 3, WIDTH - RIGHT - 6 * min(len(label), 90))
                out.append(f'<text x="{max(anchor_x, LEFT):.1f}" y="{y + ROW - 6}" '
                           f'class="blocked">{escape(_clip(label, 90))}</text>')
        _waits_svg(ln, y, x, out)
        for m in ln.marks:
            mx = x(m.time)
            if m.kind == "fault":
                out.append(f'<path d="M{mx:.1f},{y + 1} l-5,-0 l5,9 l5,-9 z" class="fault">'
                           f'<title>{escape(m.label)}</title></path>')
                out.append(f'<text x="{mx + 6:.1f}" y="{y + 9}" class="fault-label">'
                           f'{escape(_clip(m.label, 60))}</text>')
            elif m.kind == "end":
                cls = "end-ok" if m.label == "returned" else "end-bad"
                out.append(f'<line x1="{mx:.1f}" y1="{y + 2}" x2="{mx:.1f}" y2="{y + ROW - 2}" '
                           f'class="{cls}"><title>{escape(m.label)}</title></line>')
            else:
                out.append(f'<circle cx="{mx:.1f}" cy="{y + ROW / 2}" r="2" class="phase">'
                           f'<title>{escape(m.label)}</title></circle>')
    bottom = y0 + len(p.lanes) * ROW
    vx = x(p.duration)
    out.append(f'<line x1="{vx:.1f}" y1="{y0 - 4}" x2="{vx:.1f}" y2="{bottom}" class="verdict"/>')
    out.append(f'<text x="{vx - 4:.1f}" y="{y0 - 6}" class="verdict-label" '
               f'text-anchor="end">{escape(p.outcome.upper())} declared</text>')
    out.append(f'<line x1="{LEFT}" y1="{bottom + 2}" x2="{WIDTH - RIGHT}" y2="{bottom + 2}" '
               f'class="axis"/>')
    for t in ticks:
        out.append(f'<text x="{x(t):.1f}" y="{bottom + 15}" class="small" '
                   f'text-anchor="middle">{t:.2f}s</text>')
    return bottom + AXIS


WAIT = 3            # the height of a row's strip of waits, at its foot


def _waits_svg(ln: Lane, y: float, x: Callable[[float], float], out: List[str]) -> None:
    """The lane's waits for the last worker at the collectives: a dark strip
    at the foot of its row (the straggler's row has none), and the words
    under the worker's name."""
    for s in ln.waits:
        if s.end is None:   # a wait ends when the last worker arrives: never open
            continue
        x0, x1 = x(s.start), x(s.end)
        out.append(f'<rect x="{x0:.1f}" y="{y + ROW - WAIT}" width="{max(x1 - x0, 0.8):.1f}" '
                   f'height="{WAIT}" class="wait"><title>{escape(s.label)}: '
                   f'{(s.end - s.start) * 1000:.1f} ms</title></rect>')
    if ln.wait_label:
        cls = "straggler" if ln.wait_label.startswith("straggler") else "small"
        out.append(f'<text x="8" y="{y + ROW - 3}" class="{cls}">'
                   f'{escape(_clip(ln.wait_label, 34))}</text>')


STYLE = """
text { font-family: DejaVu Sans, Arial, sans-serif; font-size: 12px; fill: #222; }
.title { font-size: 14px; font-weight: bold; }
.head { font-size: 11px; fill: #444; }
.small { font-size: 9px; fill: #333; }
.worker { font-size: 12px; }
.culprit { font-size: 12px; font-weight: bold; fill: #c62828; }
.culprit-row { fill: #fde7e7; }
.step0 { fill: #d7dce5; } .step1 { fill: #bec6d4; }
.call { stroke: #555; stroke-width: 0.3; }
.blocked { font-size: 10px; font-weight: bold; fill: #8a4b00; }
.fault { fill: #c62828; } .fault-label { font-size: 9px; fill: #c62828; }
.end-ok { stroke: #2e7d32; stroke-width: 2; } .end-bad { stroke: #c62828; stroke-width: 2; }
.phase { fill: #555; }
.wait { fill: #5b3a8c; } .straggler { font-size: 9px; font-weight: bold; fill: #5b3a8c; }
.verdict { stroke: #c62828; stroke-width: 1.5; stroke-dasharray: 4 3; }
.verdict-label { font-size: 10px; fill: #c62828; }
.axis { stroke: #888; stroke-width: 1; }
.legend { font-size: 10px; fill: #444; }
"""


def svg(panels: Sequence[Panel]) -> str:
    """A self-contained SVG picture of ``panels`` (see the module docstring)."""
    body: List[str] = []
    y = 8.0
    for p in panels:
        y = _panel_svg(p, y, body) + 10
    legend = [("#bec6d4", "step"), (CALL_COLOURS["completed"][0], "call completed"),
              (CALL_COLOURS["raised"][0], "call raised"),
              (CALL_COLOURS["pending"][0], "call pending (blocked)"),
              ("#5b3a8c", "waiting for the last worker")]
    lx = 8.0
    for colour, text in legend:
        body.append(f'<rect x="{lx}" y="{y}" width="12" height="10" fill="{colour}"/>')
        body.append(f'<text x="{lx + 16}" y="{y + 9}" class="legend">{escape(text)}</text>')
        lx += 30 + 6.2 * len(text)
    body.append(f'<text x="{lx}" y="{y + 9}" class="legend">▼ fault   | end of a worker   '
                f'- - verdict</text>')
    height = y + 20
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
            f'viewBox="0 0 {WIDTH} {height:.0f}">\n<style>{STYLE}</style>\n'
            f'<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n")


def write(result, path: str) -> Tuple[str, str]:
    """Write ``result``'s timeline as ``PATH.trace.json`` and ``PATH.svg``
    (an extension given in ``path`` is dropped); return the two paths."""
    return write_panels(panels_of(result), path)


def write_panels(panels: Sequence[Panel], path: str) -> Tuple[str, str]:
    """:func:`write` for panels made otherwise (``harness analyze``).  Both
    files or neither: each is made whole in memory, written under a
    temporary name beside its place and renamed there, and a failure
    (an exception while drawing, a full disk, an unwritable folder) removes
    what was written and raises, leaving no partial or empty file."""
    for ext in (".trace.json", ".json", ".svg"):
        if path.endswith(ext):
            path = path[: -len(ext)]
            break
    trace_path, svg_path = path + ".trace.json", path + ".svg"
    write_together({trace_path: json.dumps(chrome_trace(panels)), svg_path: svg(panels)})
    return trace_path, svg_path
