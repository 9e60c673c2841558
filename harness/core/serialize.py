"""Serialization of what crosses the process boundary: ``fn`` and its result.

``multiprocess`` uses dill, which can send closures and lambdas defined in
a test file.  Left to itself, dill pickles any module that is not in the
standard library or site-packages *by value*: a test that refers to
``harness`` (installed in editable mode) or to a helper module of its own
would ship a copy of that module's whole namespace and overwrite the
worker's live module with it; ``harness.context()`` then reads a stale copy.
Workers share the parent's ``sys.path`` and can import the same modules, so
every importable module is sent by name here; only ``__main__`` keeps dill's
by-value treatment (a worker's ``__main__`` is not the parent's).
"""
from __future__ import annotations

import io
import sys
from types import ModuleType
from typing import Any

import dill
from dill import _dill


class _Pickler(dill.Pickler):
    dispatch = _dill.MetaCatchingDict(dill.Pickler.dispatch.copy())


def _save_module(pickler, obj: ModuleType) -> None:
    name = obj.__name__
    if name in ("__main__", "__mp_main__") or sys.modules.get(name) is not obj:
        _dill.save_module(pickler, obj)
    else:
        pickler.save_reduce(_dill._import_module, (name,), obj=obj)


_Pickler.dispatch[ModuleType] = _save_module


def dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, recurse=True).dump(obj)
    return buf.getvalue()


def loads(data: bytes) -> Any:
    return dill.loads(data)
