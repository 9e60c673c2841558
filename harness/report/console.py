"""What ``harness run`` and ``harness explore`` print: each worker's
output under its tag, each attempt's outcome and time, the closing line,
and the live status lines (a run's workers, a search's plans).

Plain functions of a :class:`~harness.result.RunResult` or a progress
report, and :class:`StatusLine`, which writes them to a stream.
"""
from __future__ import annotations

import shutil
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, TextIO

if TYPE_CHECKING:
    from harness.controller import Progress
    from harness.explore import SearchProgress
    from harness.result import RunResult

# A status line on a terminal is redrawn at every report; elsewhere (a log,
# a CI job) a plain line is printed at most this often.
PLAIN_EVERY = 5.0


def _tag(result: RunResult, index: int) -> str:
    kind, number = result.observation.task(index)
    return f"[w{number}]" if kind == "worker" else f"[ps{number}]" if kind == "ps" else f"[{kind}]"


def output_lines(result: RunResult) -> List[str]:
    """What each worker printed (stdout and stderr, TensorFlow's own logging
    included), each line after its worker's tag, ``[w0]``, as torchrun's
    ``--tee`` does: on every outcome, since the logs go with the run.  With
    restarts, each attempt's output follows a line with its outcome and
    time (:func:`attempt_line`); a task restarted alone
    (``restart_policy="task"``) shows each of its processes, the later
    ones as ``[w1 restart 1]``."""
    attempts = result.attempts if len(result.attempts) > 1 else (result,)
    out: List[str] = []
    for attempt in attempts:
        if len(attempts) > 1:
            out.append(attempt_line(attempt))
        for w in attempt.workers:
            tag = _tag(result, w.index)
            for process in w.attempts or (w,):
                named = tag if not w.attempts or process.attempt == 0 \
                    else f"{tag[:-1]} restart {process.attempt}]"
                out += [f"{named} {line}" for line in process.log.rstrip("\n").splitlines()]
    return out


def attempt_line(attempt: RunResult) -> str:
    """``harness: attempt 0: crashed in 8.5 s, start-up included (the run
    itself: 5.7 s)``."""
    return (f"harness: attempt {attempt.attempt}: {attempt.outcome} in "
            f"{attempt.duration:.1f} s, start-up included (the run itself: "
            f"{attempt.observation.duration:.1f} s)")


def timing(result: RunResult) -> str:
    """How long the call took, start-up included, and each attempt's part."""
    total = f"{result.duration:.1f} s from the call, start-up included"
    if len(result.attempts) <= 1:
        return f"{total} (the run itself: {result.observation.duration:.1f} s)"
    each = "; ".join(f"attempt {a.attempt} {a.outcome}: {a.duration:.1f} s, the run itself "
                     f"{a.observation.duration:.1f} s" for a in result.attempts)
    return f"{total}, over {len(result.attempts)} attempts ({each})"


def format_progress(p: Progress) -> str:
    """One line from a :class:`~harness.controller.Progress`:
    ``attempt 0 | 12.3s | w0 step 41, w1 step 41, w2 returned | idle 0.2s of 30s``."""
    workers = ", ".join(
        f"w{i} " + (state if state != "running" else
                    "started" if step is None else f"step {step}")
        for i, (step, state) in enumerate(zip(p.steps, p.states)))
    return (f"harness: attempt {p.attempt} | {p.elapsed:.1f}s | {workers} | "
            f"idle {p.idle:.1f}s of {p.timeout:g}s")


# A search's stages (harness.explore.results.STAGES) as the status line says them.
STAGE_WORDS = {"fault-free run": "the fault-free run", "saved plans": "saved plans",
               "search": "searching", "shrink": "shrinking", "replay": "replaying"}


def plan_text(plan: Sequence) -> str:
    """A plan's faults as they print, or ``(no faults)``."""
    return ", ".join(repr(f) for f in plan) or "(no faults)"


def format_search(p: SearchProgress) -> str:
    """One line from a :class:`~harness.explore.SearchProgress`: ``harness:
    explore, searching | 14 runs, 32/min | running Crash(worker=1, step=3,
    how='exit') for 1.2s | last Delay(...): completed | 41s left``."""
    parts = [f"harness: explore, {STAGE_WORDS.get(p.stage, p.stage)}",
             f"{p.runs} run{'s' if p.runs != 1 else ''}, {p.runs_per_minute:.0f}/min"]
    if p.running is not None:
        parts.append(f"running {plan_text(p.running)}"
                     + (f" for {p.run.elapsed:.1f}s" if p.run is not None else ""))
    if p.last is not None:
        parts.append(f"last {plan_text(p.last)}: {p.ended}")
    parts.append(f"{p.left:.0f}s left")
    return " | ".join(parts)


class StatusLine:
    """A progress callback for the command line: on a terminal, one line
    redrawn in place (so a run that may hang shows it is alive), cut to the
    terminal's width; otherwise a plain line every :data:`PLAIN_EVERY`
    seconds.  ``format`` makes the line from a report."""

    def __init__(self, stream: Optional[TextIO] = None, clock: Callable[[], float] = time.monotonic,
                 format: Callable[[Any], str] = format_progress):
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.clock = clock
        self.format = format
        self.shown = 0        # the width drawn on the terminal
        self.last_plain: Optional[float] = None

    def __call__(self, progress: Any) -> None:
        text = self.format(progress)
        if self.tty:
            text = text[:shutil.get_terminal_size().columns - 1]
            self.stream.write("\r" + text.ljust(self.shown))
            self.shown = len(text)
        elif self.last_plain is None or self.clock() - self.last_plain >= PLAIN_EVERY:
            self.stream.write(text + "\n")
            self.last_plain = self.clock()
        self.stream.flush()

    def close(self) -> None:
        """Wipe the terminal's line before the verdict is printed."""
        if self.tty and self.shown:
            self.stream.write("\r" + " " * self.shown + "\r")
            self.stream.flush()
            self.shown = 0
