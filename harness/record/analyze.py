"""From a job's recorder files to the harness's verdict.

:func:`observe` turns the files of every task (:mod:`harness.record.files`)
into the :class:`~harness.diagnosis.observations.RunObservation` the
harness's parent would have made had it run the job, and the diagnosis
(a pure function of it) gives the verdict, the same one a test gets.

- **Who is who.**  A task's worker index is its place among the tasks
  that join MWMS's collectives, the chief first (as MWMS numbers its
  devices); an evaluator or parameter server is left out, with a note.
  Of a task recorded by several processes (a restarted pod), the one
  started last is analysed.
- **One clock.**  Each task's times are put on its host's wall clock
  through the clock pair of its meta file, then corrected for the hosts'
  disagreement: a call of a function that launches collectives ends at
  nearly the same moment on every worker (its last collective completes
  everywhere at once), so the median difference of the end times of the
  calls two tasks both ended is their clocks' offset
  (:func:`clock_offsets`).
- **When the picture is taken.**  At the moment the evidence was
  complete (:mod:`harness.record.moment`): just before the job was killed,
  when every task still running had gone quiet by then (a "no progress"
  dump, or stopped); what came after (the kill, a peer's error at it) is
  told as the ending, never used as evidence.  Else at the latest moment
  any file records (a dump, a task's end).  A run where a task has not
  ended is a hang if nothing progressed since; if it had just progressed,
  the job was running when its files were gathered, and nothing is
  decided.
- **Tasks that left no files** (a host lost, a directory not gathered)
  are named; the others are analysed, numbered as in the whole job, and
  :mod:`harness.record.judge` keeps the missing ones among the
  candidates of whatever the others' files show.
- **How a task ended** comes from its own exit record (its main returned,
  raised, or called ``sys.exit``) and from the watcher beside it (it was
  stopped; it ended, with its exit status when the watcher saw it).  A
  task that ended with neither is a death whose status only its parent
  knew (a SIGKILL, ``os._exit``): "exit status unknown"; a fatal signal's
  report in its stack file names the signal.

Pure but for reading the files.
"""
from __future__ import annotations

import collections
import dataclasses
import re
import signal
import statistics
from typing import Any, Counter, DefaultDict, Dict, List, Mapping, Optional, Sequence, Tuple

from harness.core import progress, protocol
from harness.controller.ledger_view import LedgerView
from harness.core.protocol import WorkerError
from harness.diagnosis.observations import (EXIT_STATUS_UNKNOWN, EndedBy, Event, RunObservation,
                                            WorkerObservation)
from harness.record import files, moment
from harness.record.recorder import cluster_position

# A job whose newest progress is this recent when its files were last
# written was running then: nothing to decide.
STILL_RUNNING = 1.0
COLLECTIVE_TASKS = ("chief", "worker")
_FATAL = {"Segmentation fault": signal.SIGSEGV, "Aborted": signal.SIGABRT,
          "Bus error": signal.SIGBUS, "Floating-point exception": signal.SIGFPE,
          "Floating point exception": signal.SIGFPE, "Illegal instruction": signal.SIGILL}
_WATCHDOG = "harness/record/recorder.py"
_FATAL_RE = re.compile(r"^Fatal Python error: (?P<what>[^\n]+?)\s*$", re.M)


@dataclasses.dataclass(frozen=True)
class Analysis:
    """What :func:`observe` made of the files: the observation (None when
    there is nothing to decide), the lines that say what could not be used
    (``problems``: bad input, the run is not analysed) or what to know
    (``notes``), and each worker's task as its files name it."""

    observation: Optional[RunObservation]
    problems: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()
    tasks: Tuple[str, ...] = ()
    running: str = ""
    # What happened after the picture was taken (the kill), for a person.
    ending: str = ""
    # The workers that left no files, and each analysed worker's index in
    # the whole job (the observation numbers them 0.. among themselves).
    missing: Tuple[int, ...] = ()
    positions: Tuple[int, ...] = ()


def clock_offsets(ends: Mapping[int, Mapping[tuple, float]]) -> Dict[int, float]:
    """Each worker's clock offset from the lowest worker's (seconds to take
    off its times), from when calls that both ended ended: the median of
    the differences, 0.0 where they share no call."""
    if not ends:
        return {}
    ref = min(ends)
    out = {}
    for index, mine in ends.items():
        common = [mine[k] - ends[ref][k] for k in mine.keys() & ends[ref].keys()]
        out[index] = statistics.median(common) if common and index != ref else 0.0
    return out


def _function_names(task: files.TaskFiles) -> Dict[int, str]:
    return {int(e["data"]["id"]): str(e["data"]["name"]) for e in task.events
            if e.get("kind") == protocol.LEDGER_FUNCTION and isinstance(e.get("data"), dict)}


def call_ends(task: files.TaskFiles) -> Dict[tuple, float]:
    """(function name, call number) -> wall-clock time its call ended
    (returned), for the functions whose name is the task's only one."""
    names = _function_names(task)
    unique = {fid for fid, n in names.items() if list(names.values()).count(n) == 1}
    return {(names[r.function], r.number): task.to_wall(r.time) for r in task.records
            if r.kind == progress.CALL_ENDED and r.detail == progress.CALL_RETURNED
            and r.function in unique}


def _fatal_signal(stacks: str) -> Optional[int]:
    found = _FATAL_RE.findall(stacks or "")
    for what in reversed(found):
        sig = _FATAL.get(what.strip())
        if sig is not None:
            return -int(sig)
    return None


def _last_dump(task: files.TaskFiles, clock, until: Optional[float]) -> str:
    """The stacks of the task's last dump by ``until`` (or its first
    stop signal's after it: the stacks as the job was stopped)."""
    dumps = [(clock(float(e.get("time", 0.0))), e["data"]) for e in task.events
             if e.get("kind") == files.DUMP and isinstance(e.get("data"), dict)]
    dumps.sort(key=lambda d: d[0])
    if until is not None:
        stop = [d for d in dumps if d[0] > until and d[1].get("reason") in moment.STOP_REASONS]
        dumps = [d for d in dumps if d[0] <= until] + stop[:1]
    if not dumps:
        return ""
    d = dumps[-1][1]
    start = d["offset"] - task.stacks_from
    if start < 0:   # older than the stack file's bytes that were read
        return ""
    dumped = task.stacks.encode(errors="surrogateescape")[start:][: d["length"]]
    text = dumped.decode(errors="replace")
    if text.startswith("--- "):
        text = text.split("\n", 1)[-1]
    # The recorder's watchdog thread, which wrote the dump, is not the job's.
    threads = text.split("\n\n")
    return "\n\n".join(t for t in threads if not (_WATCHDOG in t and " in _watch" in t))


def _latest(task: files.TaskFiles) -> float:
    times = [r.time for r in task.records] + [e["time"] for e in task.events] + \
            [w["time"] for w in task.watch if isinstance(w.get("time"), (int, float))]
    return max(times, default=task.meta["clock"]["monotonic"])


def observe_task(task: files.TaskFiles, index: int, clock, until: Optional[float] = None,
                 dumps_until: Optional[float] = None) -> WorkerObservation:
    """One task's files as the parent would have seen the worker; ``clock``
    maps a time of its files to seconds since the run's start; ``until``:
    the moment the picture is taken (what came after is left out), and
    ``dumps_until`` that of the latest dump that shows it."""
    end = float("inf") if until is None else until
    view = LedgerView(0.0)
    records: List[progress.Record] = []
    for r in task.records:    # a plain loop: 65536 records a task, hundreds of tasks
        at = clock(r.time)
        if at <= end:
            records.append(progress.Record(r.kind, r.function, r.number, r.detail, at))
    view.records(records)
    if task.overwritten:
        view.notes.append(f"{task.overwritten} progress records were lost (overwritten: the "
                          f"ring keeps the latest {progress.DEFAULT_CAPACITY})")
    seen = WorkerObservation(index, tf_config=task.meta.get("tf_config"), ledger="calls")
    events: List[Event] = []
    ending: Optional[Tuple[float, dict]] = None
    for e in task.events:
        kind, data, at = e.get("kind", ""), e.get("data"), clock(float(e.get("time", 0.0)))
        if at > end and kind not in (protocol.LEDGER_FUNCTION, protocol.LEDGER_COLLECTIVE,
                                     protocol.LEDGER_SITE):
            continue
        if view.message(kind, data):
            if kind == protocol.LEDGER_OFF:
                seen = dataclasses.replace(seen, ledger=None)
            continue
        if kind == files.EXIT:
            ending = ending or (at, data if isinstance(data, dict) else {})
            continue
        if kind == files.DUMP:
            continue
        if kind == protocol.STRATEGY_CREATING:
            if isinstance(data, dict):
                seen = dataclasses.replace(seen, tf_config=data.get("tf_config"))
            data = None
        events.append(Event(at, kind, e.get("step"), data))
    watch = [w for w in task.watch if isinstance(w.get("time"), (int, float))
             and clock(w["time"]) <= end]
    ended = next((w for w in watch if w.get("state") == "ended"), None)
    stopped = bool(watch) and watch[-1].get("state") == "stopped"
    changes: Dict[str, Any] = {}   # WorkerObservation's fields, as the task ended
    if ending is not None:
        at, data = ending
        how, status = data.get("how"), data.get("status")
        if how == files.RAISED:
            error = data.get("error") or {}
            changes.update(error=WorkerError(error.get("type_name") or "Exception",
                                             error.get("message") or "",
                                             error.get("traceback") or "", error.get("fields")),
                           finish_time=at, exit_code=1)
        elif how == files.EXITED:
            changes.update(exit_code=int(status) if isinstance(status, int) else 1, exit_time=at)
        else:
            changes.update(returned=True, finish_time=at, exit_code=status or 0, exit_time=at)
    if ended is not None:
        code = ended.get("exit_code")
        changes["exit_time"] = clock(ended["time"])
        if ending is None:
            changes["exit_code"] = (code if isinstance(code, int) else
                                    _fatal_signal(task.stacks) or EXIT_STATUS_UNKNOWN)
        elif isinstance(code, int):
            changes["exit_code"] = code
    pending = ending is None and ended is None
    stack = _last_dump(task, clock, dumps_until if dumps_until is not None else until) \
        if pending and not stopped else ""
    steps = sorted(events + view.step_events, key=lambda ev: ev.time)
    return dataclasses.replace(
        seen, events=tuple(steps), stopped=stopped and pending, stack=stack,
        functions=view.functions(), calls=view.call_records(),
        ledger_note="; ".join(view.notes), **changes)


def _arrange(tasks: Sequence[files.TaskFiles]):
    """Tasks by worker index (the latest process of each), the number of
    workers, and notes on what was left out."""
    notes: List[str] = []
    by_index: DefaultDict[int, List[files.TaskFiles]] = collections.defaultdict(list)
    sizes: Counter[int] = collections.Counter()
    for t in tasks:
        kind, _ = t.task
        config = t.meta.get("tf_config") or next(
            (e["data"].get("tf_config") for e in t.events if e.get("kind") == "strategy_creating"
             and isinstance(e.get("data"), dict)), None)
        if kind not in COLLECTIVE_TASKS:
            notes.append(f"{t.stem} ({kind}) joins no collectives: left out")
            continue
        index, size = cluster_position(config)
        sizes[size] += 1
        by_index[index].append(t)
    chosen = {}
    for index, processes in by_index.items():
        group = sorted(processes, key=lambda t: t.meta["clock"]["wall"])
        chosen[index] = group[-1]
        if len(group) > 1:
            notes.append(f"worker {index}: {len(group)} processes recorded "
                         f"({', '.join(t.stem for t in group)}); the last started is analysed")
    size = sizes.most_common(1)[0][0] if sizes else 0
    return chosen, max([size, *(i + 1 for i in chosen)]), notes


def _missing_problems(missing: Sequence[int]) -> Tuple[str, ...]:
    return tuple(f"worker {i} left no files: it never started the recorder, or its "
                 f"directory was not gathered" for i in missing)


def observe(tasks: Sequence[files.TaskFiles], require_all: bool = False) -> Analysis:
    """The run the files of ``tasks`` (every task's, from one directory or
    several) show; see the module docstring.  ``require_all``: a worker
    that left no files is bad input (a problem), not a candidate."""
    chosen, size, notes = _arrange(tasks)
    missing = tuple(i for i in range(size) if i not in chosen)
    if not chosen or (missing and require_all):
        return Analysis(None, _missing_problems(missing) if chosen else (
            "no task of a chief or worker left files",), tuple(notes))
    present = tuple(sorted(chosen))
    names = tuple(chosen[i].stem for i in present)
    offsets = clock_offsets({i: call_ends(t) for i, t in chosen.items()})
    for i, off in sorted(offsets.items()):
        if abs(off) >= 0.05:
            notes.append(f"worker {i}'s clock is {off:+.2f} s off worker {min(offsets)}'s "
                         f"(from when their calls ended): corrected")
    wall = {i: (lambda t, _task=t, _off=offsets.get(i, 0.0): _task.to_wall(t) - _off)  # noqa: B008
            for i, t in chosen.items()}
    start = min(wall[i](t.meta["clock"]["monotonic"]) for i, t in chosen.items())
    clocks = {i: (lambda t, _w=wall[i]: _w(t) - start) for i in present}
    timelines = [moment.timeline(chosen[i], i, clocks[i]) for i in present]
    cut, seen = moment.picture(timelines) or (None, None)
    notes += [f"worker {t.index} received SIGTERM {t.stops[0]:.1f} s into the run (its stacks "
              f"then are in its files)" for t in timelines if t.stops and cut is None]
    now = cut if cut is not None else max(clocks[i](_latest(chosen[i])) for i in present)
    workers = tuple(observe_task(chosen[i], p, clocks[i], cut, seen)
                    for p, i in enumerate(present))
    pending = [w for w in workers if not w.finished and w.exit_code is None]
    failed = [w for w in workers if w.error is not None or w.died]
    last_progress = max([0.0, *(w.last_seen for w in workers)])
    idle = now - last_progress
    base = Analysis(None, notes=tuple(notes), tasks=names, missing=missing, positions=present)
    if (cut is None and pending and not failed and idle < STILL_RUNNING
            and not any(w.stopped for w in workers)):
        running = (f"the job was running when its files were last written ({idle:.1f} s "
                   f"after its latest progress): nothing to decide; wait for the dumps "
                   f"(the recorder's --timeout) or send SIGUSR2 to every task, then gather "
                   f"the files again")
        return dataclasses.replace(base, running=running)
    if not pending:
        ended_by, grace = EndedBy.ALL_FINISHED, 0.0
    elif failed:
        first = min((w.finish_time if w.error is not None else w.exit_time) or 0.0
                    for w in failed)
        ended_by, grace = EndedBy.GRACE_EXPIRED, max(0.0, now - first)
    else:
        ended_by, grace = EndedBy.HANG, 0.0
    obs = RunObservation(num_workers=len(present), timeout=max(idle, 0.0), grace=grace,
                         ended_by=ended_by, duration=now, workers=workers,
                         exit_on_return=True,
                         tasks=tuple(("worker", i) for i in present) if missing else ())
    return dataclasses.replace(base, observation=obs,
                               ending=moment.ending(timelines, cut) if cut is not None else "")
