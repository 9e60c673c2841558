"""What a value read from a recorder's file may be, checked before the
analyzer uses it.

The files of a recording come from wherever the user gathered them, so
nothing in them is trusted: a check either returns the value (the shape
the recorder writes) or raises :class:`Bad` with the words that say what
is wrong, which :mod:`harness.record.files` puts after the file's name and
line.  Times are finite, non-negative and below :data:`TIME_MAX`; counts
(steps, call numbers, ids, offsets) are integers in ``[-1, COUNT_MAX]``
or ``[0, COUNT_MAX]``; no JSON value nests deeper than :data:`MAX_DEPTH`
or holds a string that cannot be written as UTF-8.

The events' data are checked by kind, one small function each
(:data:`EVENT_DATA`).  Pure: no I/O.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional

from harness.core import protocol

# Seconds: the monotonic clock counts from boot and the wall clock from
# 1970, and both stay far below this (about 3000 years).
TIME_MAX = 1e11
# Integers the analyzer counts with (steps, call numbers, byte offsets):
# exact in a float, and far beyond any job's.
COUNT_MAX = 2 ** 53
# How deep a JSON value the recorder writes nests (a TF_CONFIG, an error's
# fields): far less than this.
MAX_DEPTH = 32
# Dimensions of a collective's shape.
MAX_DIMS = 64

DUMP, EXIT = "dump", "exit"
RETURNED, RAISED, EXITED = "returned", "raised", "exit"


class Bad(ValueError):
    """A value that is not what the recorder writes; the text says why."""


def shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def number(value: Any, what: str, high: float = TIME_MAX) -> float:
    """A finite number in ``[0, high]`` (a time, a duration)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Bad(f"{what} is {shown(value)}, not a number")
    if not (math.isfinite(value) and 0 <= value <= high):
        raise Bad(f"{what} is {shown(value)}, not a number of seconds from 0 to {high:g}")
    return float(value)


def count(value: Any, what: str, low: int = 0) -> int:
    """An integer in ``[low, COUNT_MAX]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise Bad(f"{what} is {shown(value)}, not an integer")
    if not low <= value <= COUNT_MAX:
        raise Bad(f"{what} is {shown(value)}, not an integer from {low} to 2**53")
    return value


def text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise Bad(f"{what} is {shown(value)}, not a string")
    return value


def mapping(value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise Bad(f"{what} is {shown(value)}, not an object")
    return value


def optional(check: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    def checked(value: Any, what: str) -> Any:
        return None if value is None else check(value, what)
    return checked


def anything(value: Any, what: str) -> Any:
    return value


def plain(value: Any, what: str) -> Any:
    """Any JSON value at most :data:`MAX_DEPTH` deep whose strings (keys
    too) can be written as UTF-8 (JSON's ``\\ud800`` escapes make lone
    surrogates, which printing would fail on)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise Bad(f"{what} nests deeper than {MAX_DEPTH}")
        if isinstance(item, str):
            _utf8(item, what)
        elif isinstance(item, dict):
            for key, inner in item.items():
                _utf8(key, what)
                stack.append((inner, depth + 1))
        elif isinstance(item, list):
            stack.extend((inner, depth + 1) for inner in item)
    return value


def _utf8(value: str, what: str) -> None:
    try:
        value.encode()
    except UnicodeEncodeError:
        raise Bad(f"{what} holds a string that is not Unicode text (a lone surrogate)") from None


def fields(value: Any, what: str, checks: Dict[str, Callable[[Any, str], Any]],
           required: tuple = ()) -> dict:
    """An object whose named fields pass their checks (the others are kept
    as they are); ``required`` ones must be there."""
    obj = mapping(value, what)
    for name in required:
        if name not in obj:
            raise Bad(f"{what} has no {name!r}")
    for name, check in checks.items():
        if name in obj:
            check(obj[name], f"{what}'s {name!r}")
    return obj


# ------------------------------------------------------------------ TF_CONFIG

def tf_config(value: Any, what: str) -> Optional[dict]:
    """None, or ``{"cluster": {TYPE: [ADDRESS, ...]}, "task": {"type", "index"}, ...}``."""
    if value is None:
        return None
    obj = mapping(value, what)
    if "cluster" in obj:
        cluster = mapping(obj["cluster"], f"{what}'s cluster")
        for kind, addresses in cluster.items():
            if not isinstance(addresses, list):
                raise Bad(f"{what}'s cluster {kind!r} is {shown(addresses)}, not a list")
            for address in addresses:
                text(address, f"{what}'s cluster {kind!r} address")
    if "task" in obj:
        fields(obj["task"], f"{what}'s task", {"type": text, "index": count})
    return obj


# ---------------------------------------------------------------- the meta

def meta(value: Any) -> dict:
    """The meta file's object, but for its format and version (read first,
    to name a foreign file or another version as such)."""
    obj = fields(value, "the meta", {
        "clock": lambda v, w: fields(v, w, {"wall": number, "monotonic": number},
                                     ("wall", "monotonic")),
        "tf_config": tf_config, "task": mapping, "host": text, "pid": count,
        "timeout": optional(number), "harness": optional(text)}, ("clock",))
    return plain(obj, "the meta")


# ------------------------------------------------------------------ events

def _error(value: Any, what: str) -> dict:
    return fields(value, what, {"type_name": text, "message": text, "traceback": text,
                                "fields": optional(mapping)})


def _exit(value: Any, what: str) -> dict:
    obj = fields(value, what, {"status": optional(lambda v, w: count(v, w, low=-COUNT_MAX)),
                               "error": optional(_error)}, ("how",))
    if obj["how"] not in (RETURNED, RAISED, EXITED):
        raise Bad(f"{what}'s 'how' is {shown(obj['how'])}, not one of "
                  f"{RETURNED!r}, {RAISED!r}, {EXITED!r}")
    return obj


def _dump(value: Any, what: str) -> dict:
    return fields(value, what, {"reason": text, "offset": count, "length": count},
                  ("reason", "offset", "length"))


def _shape(value: Any, what: str) -> list:
    if not isinstance(value, list) or len(value) > MAX_DIMS:
        raise Bad(f"{what} is {shown(value)}, not a list of at most {MAX_DIMS} dimensions")
    for dim in value:
        count(dim, f"{what}'s dimension", low=-1)
    return value


def _collective(value: Any, what: str) -> dict:
    obj = fields(value, what, {
        "function": count, "trace": count, "index": count, "kind": text, "shape": _shape,
        "dtype": text, "timeout": number},
        ("function", "trace", "index", "kind", "shape", "dtype"))
    label = obj.get("label", [])
    if not isinstance(label, list):
        raise Bad(f"{what}'s 'label' is {shown(label)}, not a list")
    return obj


def _listed(value: Any, what: str) -> list:
    if not isinstance(value, list):
        raise Bad(f"{what} is {shown(value)}, not a list")
    return value


def _with(checks: Dict[str, Callable[[Any, str], Any]], required: tuple = ()):
    return lambda value, what: fields(value, what, checks, required)


# An event's data, by its kind: what the harness's worker sends (protocol.Kind)
# and the recorder's own.
EVENT_DATA: Dict[str, Callable[[Any, str], Any]] = {
    protocol.STARTED: anything,
    protocol.STRATEGY_CREATING: _with({"tf_config": tf_config}),
    protocol.STRATEGY_CREATED: optional(count),
    protocol.STEP: optional(count),
    protocol.STEPS_DONE: optional(lambda v, w: count(v, w, low=-1)),
    protocol.FAULT: anything,
    protocol.RETURNED: anything,
    protocol.RAISED: optional(_error),
    protocol.REPLICAS: anything,
    protocol.LEDGER_FUNCTION: _with({"id": count, "name": text}, ("id", "name")),
    protocol.LEDGER_COLLECTIVE: _collective,
    protocol.LEDGER_OFF: anything,
    protocol.LEDGER_SITE: _with({"id": count, "site": text}, ("id", "site")),
    protocol.DRAIN: anything,
    protocol.NAME_UNRESOLVED: _with({"address": text, "error": optional(text)}),
    protocol.NAME_RESOLVED: _with({"address": text}),
    protocol.RESTORED: _with({"path": optional(text)}),
    protocol.SAVED: _with({"files": lambda v, w: [text(f, w) for f in _listed(v, w)]}),
    protocol.DATASET: _with({"cardinality": optional(lambda v, w: count(v, w, low=-2))}),
    DUMP: _dump,
    EXIT: _exit,
}


def event(value: Any) -> dict:
    """One line of the events file: ``{"kind", "time", "step", "data"}``."""
    obj = fields(plain(value, "the event"), "the event", {
        "kind": text, "time": number, "step": optional(lambda v, w: count(v, w, low=-1))},
        ("kind", "time"))
    check = EVENT_DATA.get(obj["kind"])
    if check is None:
        raise Bad(f"the event's kind {shown(obj['kind'])} is none the recorder writes")
    check(obj.get("data"), f"the {obj['kind']} event's data")
    return obj


WATCH_STATES = ("stopped", "running", "ended")


def watch(value: Any) -> dict:
    """One line of the watch file: ``{"state", "time"}``, and ``exit_code``."""
    obj = fields(plain(value, "the line"), "the line", {
        "time": number, "exit_code": optional(lambda v, w: count(v, w, low=-COUNT_MAX))},
        ("state", "time"))
    if obj["state"] not in WATCH_STATES:
        raise Bad(f"the state is {shown(obj['state'])}, not one of {', '.join(WATCH_STATES)}")
    return obj
