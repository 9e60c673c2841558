"""Reading the Python stacks a worker dumped (faulthandler's text) and its
exceptions' tracebacks: where the user's code is, and whether it waits in
TensorFlow.  Tolerant of anything: a garbled dump gives "stack unreadable".
"""
from __future__ import annotations

import os
import re
from typing import List, Sequence, Tuple

from harness.core.user_code import HARNESS_USER_CODE

Frame = Tuple[str, str, str]   # (file, line, function)

_HARNESS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))).replace("\\", "/") + "/"
_HEADER_RE = re.compile(r"^(Current thread|Thread)\b.*\(most recent call first\):\s*$")
_FRAME_RE = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+|\?+),? in (?P<func>.+?)\s*$')
_COLLECTIVE_RE = re.compile(r"collective|all_?reduce|all_?gather|broadcast", re.I)


_HARNESS_USER_CODE = tuple("/harness/" + part for part in HARNESS_USER_CODE)


def is_library(path: str) -> bool:
    """Not the user's code.  "/harness/" also catches recorded runs from another
    checkout, at the price of hiding a user's own package named harness."""
    p = path.replace("\\", "/")
    if any(part in p for part in _HARNESS_USER_CODE):
        return False
    return (p.startswith(("<", _HARNESS_DIR)) or "site-packages/" in p or "dist-packages/" in p
            or "/lib/python3" in p or "/harness/" in p)


def _in_tensorflow(frame: Frame) -> bool:
    return "/tensorflow/" in frame[0].replace("\\", "/")


def _parse(stack: str) -> List[Tuple[bool, List[Frame]]]:
    """Threads as (is_current, frames innermost first)."""
    threads: List[Tuple[bool, List[Frame]]] = []
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


def _main_frames(stack: str) -> List[Frame]:
    """Frames of the thread running the user's fn, else the current, else any."""
    threads = _parse(stack)
    with_user = [t for t in threads if any(not is_library(f[0]) for f in t[1])]
    for pool in (with_user, [t for t in threads if t[0]], threads):
        if pool:
            return next((t for t in pool if t[0]), pool[0])[1]
    return []


def _op_hint(frames: Sequence[Frame]) -> str:
    for file, _, func in frames:
        if (os.path.basename(file) == "collective_all_reduce_strategy.py"
                and (func == "__init__" or func.startswith("_initialize"))):
            return "in strategy creation"
    for _, _, func in frames:
        if _COLLECTIVE_RE.search(func):
            return f"in {func}"
    tf = [f for f in frames if _in_tensorflow(f)]
    if tf:
        return "in a TensorFlow op" if "execute" in tf[0][2] else f"in TensorFlow ({tf[0][2]})"
    return ""


def summarize_stack(stack: str) -> str:
    """One line saying where a worker is blocked, e.g.
    ``train at test_steps.py:23 (in a TensorFlow op)``."""
    frames = _main_frames(stack)
    if not frames:
        return "no stack" if not (stack or "").strip() else "stack unreadable"
    user = next((i for i, f in enumerate(frames) if not is_library(f[0])), None)
    file, line, func = frames[user if user is not None else 0]
    hint = _op_hint(frames[:user] if user is not None else frames)
    return f"{func} at {os.path.basename(file)}:{line}" + (f" ({hint})" if hint else "")


def stack_kind(stack: str) -> str:
    """``tf`` when the worker's main thread waits in TensorFlow, ``other``
    when it is elsewhere (a sleep, user code), ``none`` with no stack."""
    frames = _main_frames(stack)
    if not frames:
        return "none"
    return "tf" if any(_in_tensorflow(f) for f in frames) else "other"


def where_raised(traceback_text: str) -> str:
    """`` at file:line`` of the innermost user frame of a Python traceback."""
    frames = [m for m in map(_FRAME_RE.match, (traceback_text or "").splitlines()) if m]
    user = [m for m in frames if not is_library(m["file"])]
    if not user:
        return ""
    m = user[-1]
    return f" at {os.path.basename(m['file'])}:{m['line']}"
