"""Explain a finished MWMS run from what the parent observed: a pure function.

:func:`diagnose` reads a :class:`~harness.record.RunObservation` and nothing
else (no fault plan, no TensorFlow, no clock, no I/O), so every rule here can
be tested on hand-built or recorded runs.

Outcome, by strict precedence: ``crashed`` if any worker died (ended without
returning or raising, not by the harness's hand); else ``failed`` if any
raised; else ``hang`` if the run ended by the hang detector or a worker never
returned; else ``completed``.

Blame, worked out from observations only:

1. Config first (hang and failed): the majority ``cluster.worker`` list is
   the reference (ties go to the list of the expected length, then to one held
   by a worker whose task index matches its position).  A worker whose
   TF_CONFIG is missing, malformed, of another size, reordered or with another
   address/port is blamed, as is one claiming a task index another worker
   owns, or one that built a 1-replica strategy while N > 1 (it trained
   alone).  Two tied lists cannot be told apart: ``ambiguous``.
2. A crash: the first death(s).  A later death that made no progress after a
   peer's earlier error or death is taken as a consequence (user code exiting
   on TensorFlow's echo); deaths within ``_SIMULTANEOUS`` s count as one.
3. A failure: the worker(s) whose error is not an echo (:func:`is_echo`),
   earliest first, plus every worker that raised the same type (a bug in
   common code hits everyone).  Echoes are never blamed over a root error,
   whatever the timestamps.  If every error is an echo, the run is analysed
   like a hang, then by which task the heartbeat errors name, then by time.
4. A hang: a stopped (SIGSTOP) worker; else the odd one out by state
   signature (finished or waiting, steps reported, phase): with N >= 3 the
   minority against a strict majority; with all waiting, the one(s) behind;
   else a worker whose stack shows no TensorFlow frame while the others wait
   in TensorFlow.  With N = 2 a skipped step on one is indistinguishable from
   an extra collective on the other (an extra all-reduce inside a step does
   not change the reported steps), so such a split is ``ambiguous`` and both
   are named.  When nothing stands out, all unfinished workers, ambiguous.

``fault`` events are never used for blame; the text lists them as "injected".

Trade-offs.  Times are the parent's arrival stamps, so "first" is only as
good as a few milliseconds; that is why an echo never beats a root error on
timing alone, and why near-simultaneous deaths are all blamed.  A user
handler that exits within ``_SIMULTANEOUS`` s of a peer's death (on a fast
"Socket closed") is blamed too.  The "unhealthy" errors name the task whose
heartbeats stopped, but a worker that simply returned and exited is named
the same way, so the names are used only when the steps show nothing.  The
majority rules assume one faulty worker among N >= 3; two independent faults
can outvote the truth.  ``Verdict.step`` is the step where the others wait for
the culprit when they wait for it, else the culprit's last step.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import signal
from typing import Dict, List, Optional, Sequence, Tuple

from .protocol import WorkerError
from .record import HANG, RunObservation, WorkerObservation

OUTCOMES = ("completed", "failed", "crashed", "hang")

# Deaths closer than this are one event (e.g. a kill fault on two workers);
# TensorFlow's echoes of a death take seconds (heartbeats), so this is safe.
_SIMULTANEOUS = 0.5
_MAX_LINES = 40
_PHASE_RANK = {"started": 0, "strategy_creating": 1, "strategy_created": 2,
               "step": 3, "steps_done": 4}
_ECHO_TYPES = frozenset({"UnavailableError", "CancelledError"})
_ECHO_MARKERS = ("collective ops is aborted by", "[_derived_]", "unhealthy",
                 "stopped sending heartbeats", "socket closed", "connection reset")
# A collective timing out means a peer never joined: a report about a peer.
_DEADLINE_ECHO = ("heartbeat", "collective has timed out")
# Config errors are causes even when TensorFlow wraps them in derived text.
_ROOT_MARKERS = ("is joining a group with", "could not start grpc server")
_HARNESS_DIR = os.path.dirname(os.path.abspath(__file__)).replace("\\", "/") + "/"
_TASK_RE = re.compile(r"/job:worker/replica:\d+/task:(\d+)")
_HEADER_RE = re.compile(r"^(Current thread|Thread)\b.*\(most recent call first\):\s*$")
_FRAME_RE = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+|\?+),? in (?P<func>.+?)\s*$')
_COLLECTIVE_RE = re.compile(r"collective|all_?reduce|all_?gather|broadcast", re.I)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What :func:`diagnose` concluded; ``text`` says it for a person."""

    outcome: str                  # one of OUTCOMES
    culprits: Tuple[int, ...]     # worker indexes blamed, sorted; () when completed
    text: str                     # multi-line, the first thing a person reads
    step: Optional[int] = None    # where things went wrong (blocked / diverged / died)
    error: Optional[str] = None   # type name of the root error, when there is one
    ambiguous: bool = False       # True when the culprit cannot be decided


@dataclasses.dataclass
class _Blame:
    """One rule's conclusion, before it is rendered."""

    culprits: Sequence[int]
    reason: str
    step: Optional[int] = None
    ambiguous: bool = False
    headline: Optional[str] = None   # replaces the generic headline


# ---------------------------------------------------------------- errors

def _short(type_name: str) -> str:
    return (type_name or "").rsplit(".", 1)[-1]


def is_echo(error: Optional[WorkerError]) -> bool:
    """Whether ``error`` is TensorFlow reporting a peer's failure, not a cause."""
    if error is None:
        return False
    kind, msg = _short(error.type_name), (error.message or "").lower()
    if any(m in msg for m in _ROOT_MARKERS):
        return False
    if kind in _ECHO_TYPES or any(m in msg for m in _ECHO_MARKERS):
        return True
    return kind == "DeadlineExceededError" and any(m in msg for m in _DEADLINE_ECHO)


def _exit_text(code: Optional[int]) -> str:
    if code is None:
        return "no exit code"
    if code < 0:
        try:
            return f"exit code {code}, {signal.Signals(-code).name}"
        except ValueError:
            return f"exit code {code}, signal {-code}"
    return f"exit code {code}" + (" without returning" if code == 0 else "")


def _where_raised(tb: str) -> str:
    """`` at file:line`` of the innermost user frame of a Python traceback."""
    frames = [m for m in map(_FRAME_RE.match, (tb or "").splitlines()) if m]
    user = [m for m in frames if not _is_library(m["file"])]
    if not user:
        return ""
    m = user[-1]
    return f" at {os.path.basename(m['file'])}:{m['line']}"


# ---------------------------------------------------------------- stacks

def _is_library(path: str) -> bool:
    """Not the user's code.  "/harness/" also catches recorded runs from another
    checkout, at the price of hiding a user's own package named harness."""
    p = path.replace("\\", "/")
    return (p.startswith("<") or "site-packages/" in p or "dist-packages/" in p
            or "/lib/python3" in p or "/harness/" in p or p.startswith(_HARNESS_DIR))


def _parse_stack(stack: str) -> List[Tuple[bool, List[Tuple[str, str, str]]]]:
    """Threads as (is_current, frames innermost first); tolerant of anything."""
    threads: List[Tuple[bool, List[Tuple[str, str, str]]]] = []
    for line in (stack or "").splitlines():
        if _HEADER_RE.match(line.strip()) or line.strip().startswith("Stack (most recent"):
            threads.append((not line.strip().startswith("Thread"), []))
            continue
        m = _FRAME_RE.match(line)
        if m:
            if not threads:
                threads.append((True, []))
            threads[-1][1].append((m["file"], m["line"], m["func"]))
    return [t for t in threads if t[1]]


def _main_frames(stack: str) -> List[Tuple[str, str, str]]:
    """Frames of the thread running the user's fn, else the current, else any."""
    threads = _parse_stack(stack)
    with_user = [t for t in threads if any(not _is_library(f[0]) for f in t[1])]
    for pool in (with_user, [t for t in threads if t[0]], threads):
        if pool:
            return next((t for t in pool if t[0]), pool[0])[1]
    return []


def _op_hint(frames: Sequence[Tuple[str, str, str]]) -> str:
    for file, _, func in frames:
        if (os.path.basename(file) == "collective_all_reduce_strategy.py"
                and (func == "__init__" or func.startswith("_initialize"))):
            return "in strategy creation"
    for _, _, func in frames:
        if _COLLECTIVE_RE.search(func):
            return f"in {func}"
    tf = [f for f in frames if "/tensorflow/" in f[0].replace("\\", "/")]
    if tf:
        return "in a TensorFlow op" if "execute" in tf[0][2] else f"in TensorFlow ({tf[0][2]})"
    return ""


def summarize_stack(stack: str) -> str:
    """One line saying where a worker is blocked, e.g.
    ``train at test_steps.py:23 (in a TensorFlow op)``."""
    frames = _main_frames(stack)
    if not frames:
        return "no stack" if not (stack or "").strip() else "stack unreadable"
    user = next((i for i, f in enumerate(frames) if not _is_library(f[0])), None)
    file, line, func = frames[user if user is not None else 0]
    hint = _op_hint(frames[:user] if user is not None else frames)
    return f"{func} at {os.path.basename(file)}:{line}" + (f" ({hint})" if hint else "")


def _stack_kind(stack: str) -> str:
    frames = _main_frames(stack)
    if not frames:
        return "none"
    return "tf" if any("/tensorflow/" in f[0].replace("\\", "/") for f in frames) else "other"


# ---------------------------------------------------------------- progress

def _steps(w: WorkerObservation) -> Tuple[int, ...]:
    return tuple(e.step for e in w.events if e.kind == "step" and isinstance(e.step, int))


def _phase(w: WorkerObservation) -> Optional[str]:
    kinds = [e.kind for e in w.events if e.kind in _PHASE_RANK]
    return kinds[-1] if kinds else None


def _last_step(w: WorkerObservation) -> Optional[int]:
    s = _steps(w)
    return s[-1] if s else None


def _state(w: WorkerObservation) -> str:
    if w.error is not None:
        return "raised"
    if w.returned:
        return "returned"
    if w.died:
        return "died"
    return "stopped" if w.stopped else "blocked"


def _ranges(steps: Sequence[int]) -> str:
    if list(steps) != sorted(set(steps)):
        return ",".join(map(str, steps[:12])) + ("..." if len(steps) > 12 else "")
    runs: List[List[int]] = []
    for s in steps:
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in runs)


def _steps_text(steps: Sequence[int], ref: Sequence[int]) -> str:
    """``9 steps (0-4,6-9), skipping step 5``: what ran, against the majority's."""
    if not steps:
        return "no steps"
    text = f"{len(steps)} step{'s' if len(steps) != 1 else ''} ({_ranges(steps)})"
    mine, theirs = set(steps), set(ref)
    missing = [s for s in ref if s not in mine and s < max(steps)]   # not a later stop
    extra = [s for s in steps if s not in theirs]
    if missing:
        text += f", skipping step{'s' if len(missing) > 1 else ''} {_ranges(missing)}"
    if extra and ref:
        text += f", extra step{'s' if len(extra) > 1 else ''} {_ranges(extra)}"
    return text


def _reference_steps(ws: Sequence[WorkerObservation]) -> Tuple[int, ...]:
    """The most common step sequence; ties go to the longest (a skip is a loss)."""
    counts = collections.Counter(_steps(w) for w in ws)
    return max(counts, key=lambda s: (counts[s], len(s))) if counts else ()


def _at(w: WorkerObservation) -> str:
    """Where a worker's progress stopped, as a phrase."""
    phase, last = _phase(w), _last_step(w)
    if phase == "step" and last is not None:
        return f"at step {last}"
    if phase == "steps_done":
        return f"after the loop ({len(_steps(w))} steps)"
    return {"strategy_creating": "in strategy creation", None: "before any progress",
            "started": "before strategy creation",
            "strategy_created": "after strategy creation, before any step",
            }.get(phase, f"after {phase}")


def _names(idx: Sequence[int]) -> str:
    idx = sorted(idx)
    return ("worker " if len(idx) == 1 else "workers ") + ",".join(map(str, idx))


def _time(t: Optional[float]) -> float:
    return t if t is not None else float("inf")


# ---------------------------------------------------------------- config

def _cluster(cfg) -> Optional[Tuple[str, ...]]:
    try:
        if isinstance(cfg, str):
            cfg = json.loads(cfg)
        lst = cfg["cluster"]["worker"]
        if isinstance(lst, (list, tuple)) and all(isinstance(a, str) for a in lst):
            return tuple(lst)
    except (TypeError, KeyError, ValueError, IndexError):
        pass
    return None


def _task(cfg) -> Tuple[Optional[str], Optional[int]]:
    try:
        if isinstance(cfg, str):
            cfg = json.loads(cfg)
        task = cfg["task"]
        return task.get("type"), int(task.get("index"))
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


def _config_issues(obs: RunObservation) -> Tuple[Dict[int, List[str]], bool]:
    """Per-worker TF_CONFIG problems, and whether the reference was a tie."""
    n, issues = len(obs.workers), collections.defaultdict(list)
    lists = {}
    for w in obs.workers:
        if w.tf_config is None:
            issues[w.index].append("TF_CONFIG missing")
        elif _cluster(w.tf_config) is None:
            issues[w.index].append("TF_CONFIG malformed (no cluster.worker list)")
        else:
            lists[w.index] = _cluster(w.tf_config)
    ambiguous = False
    if lists:
        count = collections.Counter(lists.values())
        claimed = {w.index: _task(w.tf_config)[1] for w in obs.workers}

        def score(lst):   # majority, then expected size, then self-consistent holders
            holders = [i for i, v in lists.items() if v == lst]
            return count[lst], len(lst) == n, sum(claimed.get(i) == i for i in holders)

        best = max(score(l) for l in count)
        tied = [l for l in count if score(l) == best]
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
        if w.index in lists and kind != "worker":   # a malformed one is flagged already
            issues[w.index].append(f"its TF_CONFIG task type is {kind!r}, not 'worker'")
        if idx is not None:
            claims[idx].append(w.index)
    for idx, owners_ in claims.items():
        for i in owners_:
            if len(owners_) > 1 and idx != i:
                issues[i].append(f"its TF_CONFIG claims task index {idx}, which "
                                 f"{_names([j for j in owners_ if j != i])} also claims")
    for w in obs.workers:
        created = [e.data for e in w.events if e.kind == "strategy_created"]
        if n > 1 and created and created[-1] == 1:
            issues[w.index].append("formed a cluster of 1 replica on its own "
                                   "(num_replicas_in_sync=1): it trained alone")
    return dict(issues), ambiguous


# ---------------------------------------------------------------- blame rules

def _blame_crash(obs: RunObservation) -> _Blame:
    died = sorted((w for w in obs.workers if w.died), key=lambda w: _time(w.exit_time))
    roots = [w for w in obs.workers if w.error is not None and not is_echo(w.error)]
    times = [w.exit_time for w in died if w.exit_time is not None]
    times += [w.finish_time for w in roots if w.finish_time is not None]
    t0 = min(times) if times else None

    def consequence(w: WorkerObservation) -> bool:
        if t0 is None or w.exit_time is None or w.exit_time <= t0 + _SIMULTANEOUS:
            return False
        return not any(e.kind == "step" and e.time > t0 for e in w.events)

    culprits = [w for w in died if not consequence(w)]
    if not culprits:   # every death came after a peer's own root error
        first = min(roots, key=lambda w: _time(w.finish_time))
        return _Blame([first.index], f"raised {first.error} before any worker died",
                      _last_step(first), headline=f"{_names([w.index for w in died])} died "
                      f"after {_names([first.index])} raised {first.error}; culprit: "
                      f"{_names([first.index])} (its error came first)")
    parts = [f"{_names([w.index])} died ({_exit_text(w.exit_code)}) {_at(w)}" for w in culprits]
    later = [w.index for w in died if w not in culprits]
    echoes = [w for w in obs.workers if w.error is not None and is_echo(w.error)]
    head = "; ".join(parts)
    if echoes and culprits[0].exit_time is not None:
        dt = min(_time(w.finish_time) for w in echoes) - culprits[0].exit_time
        kinds = "/".join(sorted({_short(w.error.type_name) for w in echoes}))
        head += f"; {_names([w.index for w in echoes])} reported it as {kinds}" + (
            f" {dt:.1f}s later" if dt != float("inf") else "")
    if later:
        head += f"; {_names(later)} died later (likely a consequence)"
    return _Blame([w.index for w in culprits], "died", _last_step(culprits[0]), headline=head)


def _structural(obs: RunObservation) -> Optional[_Blame]:
    """The odd one out by (finished?, steps, phase); None when all agree."""
    parts = [w for w in obs.workers if not w.stopped and not w.died]
    if len(parts) < 2:
        return None
    sig = {w.index: (w.returned and w.error is None, _steps(w),
                     "done" if w.returned and w.error is None else _phase(w)) for w in parts}
    groups = collections.Counter(sig.values())
    if len(groups) == 1:
        return None
    top, top_n = groups.most_common(1)[0]
    ref = _reference_steps(parts)
    if len(parts) >= 3 and 2 * top_n > len(parts):
        maj = next(w for w in parts if sig[w.index] == top)
        odd = [w for w in parts if sig[w.index] != top]
        c = odd[0]
        ran = _steps_text(_steps(c), top[1])
        if not top[0] and sig[c.index][0]:
            why = f"missing from the collective {_at(maj)}: it finished after {ran}"
            step = _last_step(maj)   # where the others wait for it
        elif top[0]:
            why = (f"blocked {_at(c)} after the others returned with the same steps: it made a "
                   "collective call they did not (e.g. an extra all-reduce)" if _steps(c) == top[1]
                   else f"blocked {_at(c)} after the others returned; it ran {ran}")
            step = _last_step(c)
        else:
            why = f"out of step: blocked {_at(c)} while the others are blocked {_at(maj)}"
            step = _last_step(c)
        return _Blame([w.index for w in odd], why, step)
    if all(not s[0] for s in sig.values()):
        pos = {w.index: (_PHASE_RANK.get(sig[w.index][2], -1), len(sig[w.index][1]),
                         _last_step(w) if _last_step(w) is not None else -1) for w in parts}
        low = min(pos.values())
        behind = [i for i, p in pos.items() if p == low]
        if len(behind) < len(parts):
            w = next(x for x in parts if x.index == behind[0])
            ahead = next(x for x in parts if pos[x.index] != low)
            return _Blame(behind, f"behind: its progress stopped {_at(w)} while the others "
                          f"went on and are blocked {_at(ahead)}", _last_step(w))
    gapped = _skipped_boundary(parts)
    if gapped is not None:
        w, other, missing = gapped
        return _Blame([w.index], f"skipped step {_ranges(missing)}: its step record jumps over "
                      f"{'it' if len(missing) == 1 else 'them'} while {_names([other.index])} "
                      f"ran every step, so every collective after it paired with the wrong "
                      f"step; it {'returned' if sig[w.index][0] else 'is blocked ' + _at(w)} "
                      f"and {_names([other.index])} is "
                      f"{'finished' if sig[other.index][0] else 'blocked ' + _at(other)}",
                      _last_step(other) if not sig[other.index][0] else _last_step(w))
    desc = "; ".join(f"{_names([w.index])} ran {_steps_text(_steps(w), ref)}, and "
                     f"{'returned' if sig[w.index][0] else 'is blocked ' + _at(w)}" for w in parts)
    waiting = [w for w in parts if not sig[w.index][0]]
    why = ("with 2 workers it cannot tell a skipped step on one from an extra collective on "
           "the other: " if len(parts) == 2 else "the workers split with no majority, so it "
           "cannot tell which side is wrong: ") + desc
    return _Blame([w.index for w in parts], why,
                  _last_step(waiting[0]) if waiting else None, ambiguous=True)


def _skipped_boundary(parts: Sequence[WorkerObservation]):
    """Two workers, one of whose step record has a hole the other's has not.

    A hole means the worker's own loop never crossed that step's boundary:
    it skipped the step, which is direct evidence, not the N = 2 ambiguity
    between "skipped one collective" and "made an extra one" (that arises
    when both report the same steps).  Returns (skipper, other, missing).
    """
    if len(parts) != 2:
        return None
    a, b = parts
    for w, other in ((a, b), (b, a)):
        mine, theirs = _steps(w), _steps(other)
        if not mine or not theirs:
            continue
        asked = _steps_asked(w)
        # A loop that finished knows how many steps it was asked for, so a
        # skipped last step shows too; otherwise only holes below its last.
        horizon = asked if asked is not None else max(mine) + 1
        missing = [s for s in theirs if s not in set(mine) and s < horizon]
        contiguous = list(theirs) == list(range(theirs[0], theirs[0] + len(theirs)))
        if missing and contiguous:
            return w, other, missing
    return None


def _steps_asked(w: WorkerObservation) -> Optional[int]:
    """``n`` of the worker's finished ``steps(n)`` loop, when it reported it."""
    done = [e for e in w.events if e.kind == "steps_done" and isinstance(e.data, int)]
    return done[-1].data if done else None


def _blame_stuck(obs: RunObservation) -> _Blame:
    """Blame in a hang, or in a failure where every error is an echo."""
    stopped = [w for w in obs.workers if w.stopped and not w.died]
    if stopped:
        return _Blame([w.index for w in stopped], f"stopped (SIGSTOP) {_at(stopped[0])}",
                      _last_step(stopped[0]))
    found = _structural(obs)
    if found:
        return found
    votes: collections.Counter = collections.Counter()
    for w in obs.workers:
        msg = (w.error.message or "") if w.error is not None else ""
        if "unhealthy" in msg.lower() or "heartbeat" in msg.lower():
            votes.update({int(t) for t in _TASK_RE.findall(msg)} - {w.index})
    top = max(votes.values(), default=0)
    named = [i for i, c in votes.items() if c == top and 0 <= i < len(obs.workers)]
    if named:
        return _Blame(named, "named as unhealthy (stopped sending heartbeats) by its peers",
                      next(_last_step(w) for w in obs.workers if w.index == named[0]))
    live = [w for w in obs.workers if not w.finished]
    kinds = {w.index: _stack_kind(w.stack) for w in live}
    outside = [i for i, k in kinds.items() if k == "other"]
    if outside and "tf" in kinds.values():
        w = next(x for x in live if x.index == outside[0])
        return _Blame(outside, f"not in TensorFlow ({summarize_stack(w.stack)}) while the "
                      "others wait in a TensorFlow call", _last_step(w))
    raised = sorted((w for w in obs.workers if w.error is not None),
                    key=lambda w: _time(w.finish_time))
    if raised:
        return _Blame([raised[0].index], f"raised first ({raised[0].error})", _last_step(raised[0]))
    pool = live or sorted(obs.workers, key=lambda w: -_time(w.finish_time))[:1]
    return _Blame([w.index for w in pool], "no worker stands out: all stopped at the same point "
                  f"({_at(pool[0])})", _last_step(pool[0]), ambiguous=True)


_SHAPE_RE = re.compile(r"Op at device /job:worker/replica:\d+/task:(\d+)\S* expected shape "
                       r"(\[[^\]]*\]) but another member in the group expected shape "
                       r"(\[[^\]]*\])")


def _blame_shape_mismatch(obs: RunObservation) -> Optional[_Blame]:
    """Collectives that paired tensors of different shapes.

    TensorFlow's "Shape mismatch in the collective instance" names the task
    that noticed and its own shape, and the other shape.  Collected over all
    errors, that is each task's shape; the odd one out against a strict
    majority (N >= 3) is the worker whose collective differed: a different
    batch size, or a collective the others did not make.  Two workers are
    symmetric (each only sees that the other differs): no verdict here.
    """
    known: Dict[int, str] = {}
    other_shapes = set()
    for w in obs.workers:
        for task, mine, other in _SHAPE_RE.findall((w.error.message or "") if w.error else ""):
            known[int(task)] = mine
            other_shapes.add(other)
    if not known:
        return None
    n = obs.num_workers
    if n < 3:
        # Each of two workers only sees that the other differs; leave it to
        # the rules on timing and progress.
        return None
    shapes = ", ".join(f"{_names([t])} {s}" for t, s in sorted(known.items()))
    counts = collections.Counter(known.values())
    top, hits = counts.most_common(1)[0]
    if len(counts) > 1 and 2 * hits > len(known):
        odd = sorted(t for t, v in known.items() if v != top)
    elif len(counts) == 1 and len(known) == n - 1 and other_shapes - {top}:
        odd = sorted(set(range(n)) - set(known))
    else:
        return None
    steps = [_last_step(w) for w in obs.workers if w.index in odd]
    return _Blame(odd, f"its collective had a different shape from the others' ({shapes}; "
                  f"majority {top})", steps[0] if steps else None,
                  headline=f"{_names(odd)}: collective shape differs from the other workers' "
                           f"(Shape mismatch; majority shape {top})")


def _blame_failed(obs: RunObservation) -> _Blame:
    shape = _blame_shape_mismatch(obs)
    if shape is not None:
        return shape
    roots = sorted((w for w in obs.workers if w.error is not None and not is_echo(w.error)),
                   key=lambda w: _time(w.finish_time))
    if not roots:
        return _blame_stuck(obs)
    first = roots[0]
    if _short(first.error.type_name) == "StepDesyncError":
        return _blame_desync_check(obs, first)
    same = [w.index for w in roots if _short(w.error.type_name) == _short(first.error.type_name)]
    head = f"{_names(same)} raised {first.error} (root error"
    echoes = [w for w in obs.workers if w.error is not None and is_echo(w.error)]
    if echoes:
        kinds = "/".join(sorted({_short(w.error.type_name) for w in echoes}))
        head += f"; {_names([w.index for w in echoes])} reported it as {kinds}"
    return _Blame(same, f"raised {first.error}", _last_step(first), headline=head + ")")


_ODD_RE = re.compile(r"odd one out: ((?:worker \d+(?:, )?)+)")
_AT_RE = re.compile(r"worker (\d+) at step (-?\d+)")


def _blame_desync_check(obs: RunObservation, first: WorkerObservation) -> _Blame:
    """The opt-in sync check saw workers at different steps.  Every worker
    raises the same StepDesyncError, computed from the same all-reduced
    vector, so its message (which names the odd ones out, or says there is
    no majority) is the observation to read."""
    message = first.error.message or ""
    steps = {int(i): int(k) for i, k in _AT_RE.findall(message)}
    odd = _ODD_RE.search(message)
    if odd:
        culprits = [int(x) for x in re.findall(r"\d+", odd.group(1))]
        step = min(steps.values()) if steps else None
        return _Blame(culprits, f"out of step (sync check: {message})", step,
                      headline=f"{_names(culprits)} out of step with the others "
                               f"(sync check at step {step})")
    gapped = _skipped_boundary(obs.workers)
    if gapped is not None:
        w, _, missing = gapped
        return _Blame([w.index], f"skipped step {_ranges(missing)} (sync check: {message})",
                      missing[0], headline=f"{_names([w.index])} out of step: it skipped step "
                                           f"{_ranges(missing)} (sync check)")
    everyone = sorted(steps) or [w.index for w in obs.workers]
    return _Blame(everyone, f"cannot tell which side is wrong with no majority: {message}",
                  min(steps.values()) if steps else None, ambiguous=True,
                  headline="workers out of step and no majority (sync check); "
                           "it cannot tell which side is wrong")


# ---------------------------------------------------------------- text

def _worker_line(w: WorkerObservation, ref: Sequence[int]) -> str:
    state = _state(w)
    if state == "raised":
        text = f"raised {_at(w)}: {w.error}"
        if is_echo(w.error):
            # The first line of "tasks are unhealthy" hides the task it names.
            named = sorted({int(t) for t in _TASK_RE.findall(w.error.message or "")} - {w.index})
            text += f" (echo, naming {_names(named)})" if named else " (echo)"
    elif state == "returned":
        text = "returned"
    elif state == "died":
        text = f"died ({_exit_text(w.exit_code)}) {_at(w)}"
    elif state == "stopped":
        text = f"stopped (SIGSTOP) {_at(w)}, no stack"
    else:
        where = summarize_stack(w.stack) if w.stack.strip() else ""
        where = where.replace(" (in strategy creation)", "")   # _at already says so
        text = f"blocked {_at(w)}" + (f": {where}" if where else ", no stack")
    return f"{text}; ran {_steps_text(_steps(w), ref)}"


def _outcome(obs: RunObservation) -> str:
    ws = obs.workers
    if any(w.died for w in ws):
        return "crashed"
    if any(w.error is not None for w in ws):
        return "failed"
    if obs.ended_by == HANG or not all(w.returned for w in ws):
        return "hang"
    return "completed"


def _blame(obs: RunObservation, outcome: str, issues: Dict[int, List[str]], tie: bool) -> _Blame:
    if outcome == "completed" or not obs.workers:
        return _Blame((), "")
    if outcome == "crashed":     # a death is a cause whatever the configs say
        return _blame_crash(obs)
    if issues:
        detail = ("; ".join(next(iter(issues.values()))) if len(issues) == 1 else "; ".join(
            f"{_names([i])}: {', '.join(v)}" for i, v in sorted(issues.items())))
        return _Blame(sorted(issues), ("the TF_CONFIG cluster lists disagree and none has a "
                                       "majority, so it cannot tell which is wrong: "
                                       if tie else "") + detail, ambiguous=tie)
    return _blame_failed(obs) if outcome == "failed" else _blame_stuck(obs)


def diagnose(obs: RunObservation) -> Verdict:
    """The outcome of a run, who is to blame, and a text a person reads first."""
    ws = obs.workers
    outcome = _outcome(obs)
    issues, tie = _config_issues(obs)
    blame = _blame(obs, outcome, issues, tie)
    culprits = tuple(sorted(set(blame.culprits)))
    # Errors, root ones first: the first is the run's error when it failed, or
    # when a crash was blamed on a worker that raised before the deaths.
    errs = sorted((w for w in ws if w.error is not None),
                  key=lambda w: (is_echo(w.error), _time(w.finish_time)))
    error = None
    if errs and (outcome == "failed" or (outcome == "crashed" and errs[0].index in culprits
                                         and not is_echo(errs[0].error))):
        error = _short(errs[0].error.type_name)
    text = _render(obs, outcome, blame, culprits, issues, errs)
    return Verdict(outcome, culprits, text, blame.step, error, blame.ambiguous)


def _render(obs: RunObservation, outcome: str, blame: _Blame, culprits: Tuple[int, ...],
            issues: Dict[int, List[str]], errs: List[WorkerObservation]) -> str:
    ws = obs.workers
    who = f"culprit{'s' if len(culprits) > 1 else ''}: {_names(culprits)}"
    reason = "ambiguous, see below" if blame.ambiguous else blame.reason
    if outcome == "completed":
        head = f"COMPLETED: all {len(ws)} workers returned in {obs.duration:.1f}s"
    elif blame.headline:
        head = f"{outcome.upper()}: {blame.headline}"
    elif outcome == "hang":
        cause = (f"no progress for {obs.timeout:.1f}s" if obs.ended_by == HANG
                 else "not every worker finished")
        head = f"HANG: {cause}; {who} ({reason})"
    else:
        kinds = "/".join(sorted({_short(w.error.type_name) for w in errs}))
        head = f"FAILED: {_names([w.index for w in errs])} raised {kinds}; {who} ({reason})"
    lines = [head]
    if blame.ambiguous:
        lines.append(f"ambiguous: {blame.reason}")
    ref = _reference_steps(ws)
    groups: Dict[str, List[int]] = collections.defaultdict(list)
    for w in ws:
        mark = "  <- culprit" if w.index in culprits else ""
        groups[_worker_line(w, ref) + mark].append(w.index)
    lines += [f"  {_names(idx)}: {text}" for text, idx in groups.items()]
    if outcome == "completed" and len({_steps(w) for w in ws}) > 1:
        lines.append("note: the workers ran different steps")
    if outcome in ("completed", "crashed"):   # else the config is the blame, said above
        lines += [f"note: TF_CONFIG of {_names([i])}: {'; '.join(v)}"
                  for i, v in sorted(issues.items())]
    faults = [(w.index, e) for w in ws for e in w.events if e.kind == "fault"]
    for i, e in faults[:5]:
        at = f" at step {e.step}" if e.step is not None else ""
        lines.append(f"injected: {_names([i])}{at}: {e.data}")
    if len(faults) > 5:
        lines.append(f"injected: ... and {len(faults) - 5} more")
    if errs and not is_echo(errs[0].error):
        lines.append(f"root error: {errs[0].error}{_where_raised(errs[0].error.traceback)}")
    elif errs:
        lines.append(("the errors are TensorFlow reporting the death" if outcome == "crashed" else
                      "no root error: every error is TensorFlow reporting a peer's failure")
                     + f" (first: {errs[0].error})")
    lines = [ln if len(ln) <= 300 else ln[:297] + "..." for ln in lines]
    if len(lines) > _MAX_LINES:
        lines = lines[:_MAX_LINES - 1] + [f"... {len(lines) - _MAX_LINES + 1} more lines"]
    return "\n".join(lines)
