"""Faults and plans as text: a fault read back from the constructor call
it prints as, and a plan from (and to) the ``faults=[...]`` line
``explore`` prints and saves.  The text is parsed, never evaluated.
Imports :mod:`harness.faults` and :mod:`harness.errors` only.
"""
from __future__ import annotations

import ast
import dataclasses
from typing import Iterable, Tuple

from harness.errors import UsageError
from harness.faults import FAULT_TYPES, Fault


def _classes() -> dict:
    return {cls.__name__: cls for cls in FAULT_TYPES}


def _call(node: ast.expr, text: str, where: str) -> Fault:
    classes = _classes()
    names = ", ".join(classes)
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in classes):
        raise UsageError(f"{where} {text!r}: only a call of one of {names} is allowed, "
                         f"e.g. \"Crash(worker=1, step=5)\"")
    cls = classes[node.func.id]
    args, kwargs = [], {}
    try:
        for arg in node.args:
            if isinstance(arg, ast.Starred):
                raise ValueError("*args")
            args.append(ast.literal_eval(arg))
        for kw in node.keywords:
            if kw.arg is None:
                raise ValueError("**kwargs")
            kwargs[kw.arg] = ast.literal_eval(kw.value)
    except ValueError:
        raise UsageError(f"{where} {text!r}: arguments must be plain values (numbers, "
                         f"strings, None, True, False)") from None
    try:
        return cls(*args, **kwargs)
    except TypeError as e:
        fields = ", ".join(f.name for f in dataclasses.fields(cls))
        raise UsageError(f"{where} {text!r}: {e}; {cls.__name__} takes {fields}") from None


def _tree(text: str, where: str) -> ast.expr:
    try:
        return ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise UsageError(f"{where} {text!r}: not a fault ({e.msg}); write one of "
                         f"{', '.join(_classes())} as a call, e.g. "
                         f"\"Crash(worker=1, step=5)\"") from None


def parse(text: str, where: str = "fault") -> Fault:
    """A fault from its constructor call, e.g. ``"Crash(worker=1, step=5)"``:
    a call of one of :data:`FAULT_TYPES` by its bare name, with literal
    arguments (numbers, strings, None, True/False, tuples).  The text is
    parsed, never evaluated; a :class:`~harness.errors.UsageError` names
    ``where`` it came from."""
    return _call(_tree(text, where), text, where)


def parse_plan(text: str, where: str = "plan") -> Tuple[Fault, ...]:
    """A plan from the line a plan prints as (:func:`plan_line`):
    ``faults=[Crash(worker=1, step=5)]``, or the list alone."""
    body = text.strip()
    if body.startswith("faults="):
        body = body[len("faults="):]
    node = _tree(body, where)
    if not isinstance(node, (ast.List, ast.Tuple)):
        raise UsageError(f"{where} {text!r}: not a list of faults")
    return tuple(_call(e, ast.unparse(e), where) for e in node.elts)


def plan_line(plan: Iterable[Fault]) -> str:
    """The plan as a line to paste into ``run(faults=...)``."""
    return f"faults=[{', '.join(repr(f) for f in plan)}]"
