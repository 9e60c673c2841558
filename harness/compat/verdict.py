"""From the harness's :class:`~harness.result.RunResult` to what TensorFlow's
runner gives: the result namedtuple, its output lines, and the error
``join()`` raises, whose message opens with the harness's verdict.

Pure functions: no processes, no TensorFlow.
"""
from __future__ import annotations

import builtins
import collections
from typing import AbstractSet, List, Mapping, Optional, Sequence, Tuple

from harness.core import serialize
from harness.core.protocol import WorkerError
from harness.result import RunResult, WorkerResult

MultiProcessRunnerResult = collections.namedtuple("MultiProcessRunnerResult",
                                                  ["return_value", "stdout"])

# TensorFlow's runner pads the task's name to this width before the line.
PREFIX_WIDTH = 14
COMPLETED, HANG = "completed", "hang"

TIMEOUT_TEXT = ("One or more subprocesses timed out, where timeout was set to {}s. Please change "
                "the `timeout` argument for `MultiProcessRunner.join()` or "
                "`multi_process_runner.run()` if it should be adjusted.")


def name(index: int, names: Optional[Sequence[str]] = None) -> str:
    """Task ``index`` as TensorFlow's runner names it (``chief-0``,
    ``worker-1``): from ``names``, the runner's task names by index, else
    a cluster of workers only."""
    return names[index] if names else f"worker-{index}"


def prefixed(index: int, log: str, names: Optional[Sequence[str]] = None) -> List[str]:
    """A task's log as TensorFlow's runner streams it: each line after
    ``[worker-i]:`` (``[chief-0]:``) padded to 14 characters, newline kept."""
    task = f"[{name(index, names)}]:".ljust(PREFIX_WIDTH)
    return [f"{task} {line}\n" for line in log.splitlines()]


def attempts_of(result: RunResult) -> Tuple[RunResult, ...]:
    return tuple(result.attempts) or (result,)


def output_lines(results: Sequence[RunResult],
                 names: Optional[Sequence[str]] = None) -> List[str]:
    """Every worker's lines, run by run and attempt by attempt, worker by
    worker, a restarted task's processes in turn (TensorFlow's are
    interleaved as they come)."""
    lines: List[str] = []
    for result in results:
        for attempt in attempts_of(result):
            for w in attempt.workers:
                for process in w.attempts or (w,):
                    lines += prefixed(w.index, process.log, names)
    return lines


def return_values(result: RunResult) -> list:
    """The values ``fn`` returned, None left out, by task index."""
    return [w.return_value for w in result.workers
            if w.returned and w.exception is None and w.return_value is not None]


def decide(result: RunResult, terminated: AbstractSet[int] = frozenset()) -> Tuple[str, Optional[int]]:
    """What ``join()`` does with ``result``, in TensorFlow's order: ``("ok",
    None)``; ``("raise", i)``, re-raise task i's exception (the culprit's
    first, else the first that raised); ``("timeout", None)``, a task was
    still blocked (the harness found a hang, or a peer's grace ran out where
    TensorFlow would wait for ``join``'s timeout); ``("exit", i)``, task i
    exited non-zero or died.  Tasks the test terminated are not errors."""
    if result.outcome == COMPLETED:
        return "ok", None
    # Each task's last status, as TensorFlow's runner keeps it: a task the
    # test or the chief's exit ended raises too, where its last process
    # that ended by itself raised.
    raised = [w.index for w in result.workers if last_raised(w) is not None]
    if raised:
        culprits = [i for i in result.culprits if i in raised]
        return "raise", (culprits or raised)[0]
    ended_by = getattr(result.observation, "ended_by", None)
    held = any(not w.returned and w.index not in terminated for w in result.workers)
    # A run whose only unfinished tasks are those the test ended is no hang.
    if (result.outcome == HANG and held) or (
            ended_by is not None and ended_by != "all_finished" and held):
        return "timeout", None
    exited = [w for w in result.workers if w.index not in terminated and not w.returned]
    for w in sorted(exited, key=lambda w: (not (w.exit_code or 0) > 0, w.index)):
        return "exit", w.index
    # TensorFlow's join() checks every exit status, a task that returned its
    # value included, and takes only a positive one (a signal passes).
    for w in result.workers:
        if w.index not in terminated and w.died_at_exit and (w.exit_code or 0) > 0:
            return "exit", w.index
    return "ok", None


def last_raised(worker: WorkerResult) -> Optional[WorkerResult]:
    """The task's last process that returned or raised, where it raised
    (its own result): TensorFlow's runner's last
    status of the task; None where it returned, or none of its processes
    ended by itself."""
    for process in reversed(worker.attempts or (worker,)):
        if process.exception is not None:
            return process
        if process.returned:
            return None
    return None


def exit_text(result: RunResult, index: int, names: Optional[Sequence[str]] = None) -> str:
    code = result.workers[index].exit_code
    task = name(index, names)
    if code is not None and code < 0:
        return f"Subprocess {task} died by signal {-code}. See logs for details."
    return f"Subprocess {task} exited with exit code {code}. See logs for details."


def rebuild_exception(pickled: Optional[bytes], error: Optional[WorkerError]) -> BaseException:
    """The task's own exception, sent by the worker; else one made from the
    harness's record of it (a builtin type keeps its type)."""
    if pickled:
        try:
            exc = serialize.loads(pickled)
            if isinstance(exc, BaseException):
                return exc
        except Exception:   # a type the parent cannot import: fall back to the record
            pass
    if error is None:
        return RuntimeError("the task raised, and its error was not recorded")
    kind = getattr(builtins, error.type_name.rpartition(".")[2], None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind(error.message)
        except Exception:   # a builtin whose constructor wants more than a message
            pass
    return RuntimeError(f"{error.type_name}: {error.message}")


def with_verdict(exc: BaseException, verdict: str) -> BaseException:
    """``exc`` with its message opening with ``verdict``."""
    text = f"{verdict}\n\n"
    message = getattr(exc, "_message", None)
    if isinstance(message, str):
        # TensorFlow's OpError makes str() from it, not from args.
        exc._message = text + message   # type: ignore[attr-defined]
    elif exc.args and isinstance(exc.args[0], str):
        exc.args = (text + exc.args[0],) + tuple(exc.args[1:])
    elif not exc.args:
        exc.args = (verdict,)
    else:
        exc.args = (text + str(exc.args[0]),) + tuple(exc.args[1:])
    return exc


def status_of(statuses: Mapping[int, Tuple[int, Optional[bytes]]], index: int,
              attempt: int) -> Optional[bytes]:
    """The pickled exception task ``index`` recorded in ``attempt``, if any."""
    entry = statuses.get(index)
    if not entry or entry[0] != attempt:
        return None
    return entry[1]
