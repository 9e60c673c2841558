"""Reading workers' errors: a cause, or TensorFlow reporting a peer's failure?

When one worker fails, TensorFlow tells its peers in errors of its own
("Collective ops is aborted by", "tasks are unhealthy", "Socket closed"):
*echoes*.  An echo is never a cause, so it is never blamed over an error
that is not one, whatever the timestamps.

A *collective mismatch* is a cause that names no one: the members of one
collective disagree (in shape, in type or dtype, in who broadcasts), and
every worker that hears of it reports it, the one that noticed and the
peers it aborted alike.  No peer failed, so it is no echo, whatever wraps
it ("Collective ops is aborted by", a "remote target"); nor does it say
which side is wrong, so the rules look to the ledgers and the steps.
"""
from __future__ import annotations

import re
import signal
from typing import Iterator, List, Optional, Tuple

from harness.core.protocol import WorkerError
from harness.diagnosis.observations import EXIT_STATUS_UNKNOWN

_ECHO_TYPES = frozenset({"UnavailableError", "CancelledError"})
_ECHO_MARKERS = ("collective ops is aborted by", "[_derived_]", "unhealthy",
                 "stopped sending heartbeats", "socket closed", "connection reset",
                 "with a different incarnation")
# A collective timing out means a peer never joined: a report about a peer;
# so does the coordination service's registration barrier timing out (a
# peer never registered: it started late, or never).
_DEADLINE_ECHO = ("heartbeat", "collective has timed out", "wait_for_all_tasks_to_register")
# Config errors are causes even when TensorFlow wraps them in derived text.
_ROOT_MARKERS = ("is joining a group with", "could not start grpc server")
_TASK_RE = re.compile(r"/job:worker/replica:\d+/task:(\d+)")
# The sentences of TensorFlow's collective_param_resolver_local.cc for a
# collective whose members disagree (the first two measured on 2.15.1 and 2.21).
SHAPE_MISMATCH = re.compile(
    r"Shape mismatch in the collective instance \d+\. Op at device (?P<device>\S+) expected "
    r"shape (?P<mine>\[[^\]]*\]) but another member in the group expected shape "
    r"(?P<other>\[[^\]]*\])")
_MISMATCH_RES = (
    SHAPE_MISMATCH,
    re.compile(r"Collective instance \d+ expected type \d+ and data_type \d+ but got type \d+ "
               r"and data_type \d+"),
    re.compile(r"Instance \d+ already has source \d+, received second claim from \d+"),
    re.compile(r"Instance \d+ found no source for broadcast"),
)


def short_type(type_name: str) -> str:
    """``tensorflow.python.framework.errors_impl.UnavailableError`` -> ``UnavailableError``."""
    return (type_name or "").rsplit(".", 1)[-1]


def is_echo(error: Optional[WorkerError]) -> bool:
    """Whether ``error`` is TensorFlow reporting a peer's failure, not a cause."""
    if error is None:
        return False
    kind, msg = short_type(error.type_name), (error.message or "").lower()
    if any(m in msg for m in _ROOT_MARKERS) or is_collective_mismatch(error):
        return False
    if kind in _ECHO_TYPES or any(m in msg for m in _ECHO_MARKERS):
        return True
    return kind == "DeadlineExceededError" and any(m in msg for m in _DEADLINE_ECHO)


# What a restarted task's process raises when it joins a cluster whose
# coordination service still holds the failure it was restarted for: its
# agent is put in error before it connects.
_RESTART_MARKERS = ("coordination service agent is not in disconnected state",)


def is_restart_echo(error: Optional[WorkerError]) -> bool:
    """Whether ``error`` reports a task's failure or restart (an echo), or
    is a restarted process turned away by the cluster its failure left."""
    return is_echo(error) or (error is not None and any(
        m in (error.message or "").lower() for m in _RESTART_MARKERS))


def shape_mismatches(message: str) -> Iterator[Tuple[int, str, str]]:
    """(task, its shape, the other member's shape) for each "Shape mismatch"
    sentence of ``message``: the task that noticed names its own shape."""
    for found in SHAPE_MISMATCH.finditer(message or ""):
        task = _TASK_RE.search(found["device"])
        if task:
            yield int(task.group(1)), found["mine"], found["other"]


def collective_mismatch(message: str) -> Optional[str]:
    """TensorFlow's sentence saying that a collective's members disagree,
    from an error message that holds one, else None."""
    for pattern in _MISMATCH_RES:
        found = pattern.search(message or "")
        if found:
            return found.group(0)
    return None


def is_collective_mismatch(error: Optional[WorkerError]) -> bool:
    """Whether ``error`` reports a collective whose members disagree: a
    cause, but not one that says which worker is wrong."""
    return error is not None and collective_mismatch(error.message) is not None


def error_text(error: WorkerError) -> str:
    """The error as a line: ``TYPE: its first line``, or for a collective
    mismatch ``TYPE: TensorFlow's sentence about it`` (its first line is
    often only "Graph execution error:" or the op that aborted)."""
    sentence = collective_mismatch(error.message)
    if sentence:
        return f"{short_type(error.type_name)}: {sentence}"
    line = reason_line(error.message)
    return f"{error.type_name}: {line}" if line else error.type_name


_OPENS, _CLOSES = "([{", ")]}"
# A value printed inside a message (a tensor, a PerReplica) keeps this many
# characters at each end; what is between is elided.
KEPT_OF_A_VALUE = 24


def _depth(text: str) -> int:
    return sum(text.count(c) for c in _OPENS) - sum(text.count(c) for c in _CLOSES)


def _elide_values(text: str) -> str:
    """``text`` with the inside of each long bracketed value shortened to its
    two ends: the reason around a printed tensor is what a person reads."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c in _OPENS:
            depth, j = 0, i
            while j < len(text):
                depth += (text[j] in _OPENS) - (text[j] in _CLOSES)
                if depth == 0:
                    break
                j += 1
            inside = text[i + 1:j]
            if len(inside) > 3 * KEPT_OF_A_VALUE:
                inside = f"{inside[:KEPT_OF_A_VALUE]}...{inside[-KEPT_OF_A_VALUE:]}"
            out.append(c + inside + text[j:j + 1])
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def reason_line(message: str) -> str:
    """An error message as one line that is never cut before its reason:
    its first line, or, where that line opens a printed value it does not
    close (``Attempt to convert a value (PerReplica:{``), the lines up to
    where the value closes and the sentence goes on, with long values
    shortened to their ends."""
    lines = [ln.strip() for ln in (message or "").strip().splitlines()]
    if not lines or _depth(lines[0]) <= 0:
        return lines[0] if lines else ""
    taken, depth = [], 0
    for ln in lines:
        taken.append(ln)
        depth += _depth(ln)
        if depth <= 0 and not ln.endswith(tuple(_CLOSES)):
            break
    return _elide_values(" ".join(" ".join(taken).split()))


# A worker whose input ran out raises these; it is a cause only when nothing
# else explains why (an error about the data set up, raised by a peer, does).
_END_OF_INPUT = frozenset({"StopIteration", "OutOfRangeError"})


def is_end_of_input(error: Optional[WorkerError]) -> bool:
    return error is not None and short_type(error.type_name) in _END_OF_INPUT


def tasks_named(message: str) -> List[int]:
    """The task indexes a TensorFlow error message names (``/job:worker/.../task:N``)."""
    return [int(t) for t in _TASK_RE.findall(message or "")]


# "Additional GRPC error information from remote target /job:.../task:N
# while calling ...": the task the failed call went to, which answered or
# relayed the error.  It says nothing of that task's health: a worker cut
# off from the others names the coordination service's task (0) this way
# when its own heartbeat fails (TensorFlow 2.15.1, measured).
_REMOTE_TARGET_RE = re.compile(r"remote target /job:worker/replica:\d+/task:\d+")


def tasks_named_unhealthy(message: str) -> List[int]:
    """The tasks an "unhealthy" or heartbeat error names as failed: every
    task it names but the remote targets of the calls that carried it."""
    return tasks_named(_REMOTE_TARGET_RE.sub("remote target", message or ""))


def names_unhealthy(message: str) -> bool:
    """Whether the message reports tasks whose heartbeats stopped."""
    lower = (message or "").lower()
    return "unhealthy" in lower or "heartbeat" in lower


# Lines of a TensorFlow error message that say nothing of their own.
_NOT_TELLING = ("Graph execution error", "Detected at node", "File ", "[[", "The error could")
# The op TensorFlow names before an eager collective's message.
_FUNCTION_NODE = re.compile(r"\{\{function_node [^}]*\}\}")


def telling_line(message: str) -> str:
    """The first line of an error message that says what went wrong
    (TensorFlow's often opens with "Graph execution error:")."""
    lines = [_FUNCTION_NODE.sub("", line).strip() for line in (message or "").strip().splitlines()]
    lines = [line for line in lines if line]
    for line in lines:
        if not line.startswith(_NOT_TELLING) and not line.endswith(":"):
            return line
    return lines[0] if lines else ""


def exit_text(code: Optional[int]) -> str:
    if code is None:
        return "no exit code"
    if code == EXIT_STATUS_UNKNOWN:
        return "exit status unknown"
    if code < 0:
        try:
            return f"exit code {code}, {signal.Signals(-code).name}"
        except ValueError:
            return f"exit code {code}, signal {-code}"
    return f"exit code {code}" + (" without returning" if code == 0 else "")
