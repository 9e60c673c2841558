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

Objects of :mod:`multiprocessing` (and of ``multiprocess``, its dill fork)
are pickled as that library pickles them for a child it starts: a
manager's proxy takes its manager's authkey along, a lock, semaphore,
condition or event its semaphores' names.  What only a child that
inherits it could use is refused, naming the manager's counterpart: a
semaphore without a name (made by a ``fork`` context), a queue's pipes, a
barrier's or value's shared memory, a pipe's end.  The payload is made
once for every worker of every attempt, so no file descriptor can go with
it.  A worker also takes the parent's ``current_process().authkey``
(:func:`with_authkeys`, :func:`load_call`), as a child inherits it: a proxy
that a manager hands the worker (one held in a managed dict) is accepted.
"""
from __future__ import annotations

import contextlib
import ctypes
import importlib
import io
import pickle
import sys
import threading
from types import ModuleType
from typing import Any, Callable, Iterator, List, Sequence, Tuple, Union

import dill
from dill import _dill

FAMILIES = ("multiprocessing", "multiprocess")
# How long a worker waits for a proxy's manager to answer: a manager answers
# in milliseconds, while an address whose packets are dropped would hold the
# worker in connect() until TCP gives up, minutes later.
REACH_SECONDS = 5.0


class _Pickler(dill.Pickler):
    dispatch = _dill.MetaCatchingDict(dill.Pickler.dispatch.copy())

    def __init__(self, *args, **kwds):
        super().__init__(*args, **kwds)
        self._reducers = _multiprocessing_reducers()
        self._by_type: dict = {}   # type -> its reducer, or None: one lookup per object

    def reducer_override(self, obj):
        cls = type(obj)
        try:
            reduce = self._by_type[cls]
        except KeyError:
            reduce = self._by_type[cls] = next(
                (r for kinds, r in self._reducers if issubclass(cls, kinds)), None)
        return NotImplemented if reduce is None else reduce(obj)


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


# -- the worker's call and its authkeys ----------------------------------------

def _loaded(family: str, name: str):
    return sys.modules.get(f"{family}.{name}")


def with_authkeys(payload: bytes) -> bytes:
    """``payload`` as a worker is handed it: with this process's
    ``current_process().authkey`` of each multiprocessing library loaded."""
    keys = {family: bytes(module.current_process().authkey) for family in FAMILIES
            if (module := _loaded(family, "process")) is not None}
    return pickle.dumps((keys, payload), protocol=pickle.HIGHEST_PROTOCOL)


def load_call(data: bytes) -> Tuple[Callable, tuple, dict]:
    """``(fn, args, kwargs)`` from :func:`with_authkeys`'s bytes, once this
    process holds the parent's authkeys."""
    keys, payload = pickle.loads(data)
    for family, key in keys.items():
        importlib.import_module(f"{family}.process").current_process().authkey = key
    return loads(payload)


# -- multiprocessing's objects -------------------------------------------------

class _NoInheritance:
    """Stands for the Popen of the child being started while an object is
    pickled as for a child (``get_spawning_popen()``): nothing is handed
    down to it but the payload's bytes."""

    def duplicate_for_child(self, fd):
        raise TypeError("a file descriptor of this process cannot be sent to the workers")


@contextlib.contextmanager
def _as_for_a_child() -> Iterator[None]:
    contexts = [c for family in FAMILIES if (c := _loaded(family, "context")) is not None]
    saved = [c.get_spawning_popen() for c in contexts]
    for c in contexts:
        c.set_spawning_popen(_NoInheritance())
    try:
        yield
    finally:
        for c, popen in zip(contexts, saved):
            c.set_spawning_popen(popen)


def _reduce_for_a_child(obj):
    with _as_for_a_child():
        return obj.__reduce_ex__(pickle.DEFAULT_PROTOCOL)


def _reduce_proxy(proxy):
    with _as_for_a_child():
        reduced = proxy.__reduce__()
    try:
        rebuild, (func, token, serializer, kwds) = reduced
        authkey = kwds["authkey"]
    except (TypeError, ValueError, KeyError):
        return reduced    # a proxy class that pickles itself its own way
    # An AuthenticationString pickles only while a child is being started.
    kwds = dict(kwds, authkey=bytes(authkey))
    return _rebuild_proxy, (rebuild, func, token, serializer, kwds)


def _rebuild_proxy(rebuild, func, token, serializer, kwds):
    """A proxy of ``fn``'s arguments, connected to its manager (which a
    proxy does as it is unpickled) within :data:`REACH_SECONDS`."""
    done: dict = {}

    def connect():
        try:
            done["proxy"] = rebuild(func, token, serializer, kwds)
        except BaseException as e:
            done["error"] = e

    # The connection is made in a thread of its own so that an address that
    # never answers cannot hold the worker: the thread dies with it.
    thread = threading.Thread(target=connect, name="mwms-manager-connect", daemon=True)
    thread.start()
    thread.join(REACH_SECONDS)
    if "proxy" in done:
        return done["proxy"]
    e = done.get("error") or TimeoutError(f"no answer in {REACH_SECONDS:g} s")
    raise ConnectionError(
        f"the manager of a {token.typeid} proxy cannot be reached at {token.address!r} "
        f"from this worker ({type(e).__name__}: {e}). A manager's proxies work where its "
        f"address can be reached, while it runs: Manager() listens on a Unix socket of the "
        f"machine that started it; workers on other machines need a SyncManager on TCP at "
        f"an address they reach (address=(host IP, port)); a cluster in a network "
        f"namespace of its own has a loopback of its own (network='host' shares the "
        f"machine's)") from e


def _reduce_semaphore(lock):
    if lock._semlock.name is None:
        family = type(lock).__module__.partition(".")[0]
        raise TypeError(
            f"a {family} {type(lock).__name__} made by a 'fork' context (alone or inside a "
            f"Condition or Event; the default start method on Linux before Python "
            f"3.14) has no name: only a fork of this process can use it, and the workers are "
            f"not forks of it. Make it with {family}.get_context('spawn') or 'forkserver', or "
            f"pass a manager's: {family}.Manager().Event(), .Lock(), .Barrier(n)")
    with _as_for_a_child():
        state = lock.__getstate__()
    return _open_semaphore, (type(lock), state)


def _open_semaphore(cls, state):
    """A lock or semaphore of ``fn``'s arguments, opened by its name."""
    lock = cls.__new__(cls)
    try:
        lock.__setstate__(state)
    except OSError as e:
        raise OSError(
            f"a {cls.__module__}.{cls.__name__} is a named semaphore of the machine that "
            f"made it, which this worker cannot open ({e}); on other machines pass a "
            f"manager's proxy (a SyncManager on TCP)") from e
    return lock


# (module, class, what it is, the manager's counterpart): objects that only
# a child which inherits them could use.
_REFUSED = (
    ("synchronize", "Barrier", "Barrier", "Barrier(n)"),
    ("queues", "Queue", "Queue", "Queue()"),
    ("queues", "SimpleQueue", "SimpleQueue", "Queue()"),
    ("connection", "_ConnectionBase", "Connection (an end of a Pipe)", "Queue()"),
    ("sharedctypes", "SynchronizedBase", "Value or Array", "Value(typecode, value) or .list()"),
    ("heap", "BufferWrapper", "shared memory (of a RawValue or RawArray)",
     "Value(typecode, value) or .list()"),
)


def _refuse(family: str, what: str, counterpart: str) -> Callable[[Any], Any]:
    def reduce(obj):
        raise TypeError(
            f"a {family} {what} made in the parent cannot reach the workers: it holds "
            f"memory or file descriptors that only a child {family} starts from this process "
            f"inherits, and the workers are not such children. Pass a manager's instead: "
            f"{family}.Manager().{counterpart}")
    return reduce


CTYPES = (ctypes.Array, ctypes.Structure, ctypes.Union, ctypes._SimpleCData)


def _refuse_shared_ctypes(families: Sequence[str]) -> Callable[[Any], Any]:
    """A RawValue or RawArray is a ctypes object over shared memory, which
    would otherwise be sent as a private copy; one reducer tells every
    loaded family's apart (a ctypes type has one reducer)."""
    checks = [(_loaded(family, "heap").BufferWrapper,
               _refuse(family, "RawValue or RawArray", "Value(typecode, value) or .list()"))
              for family in families]

    def reduce(obj):
        wrapper = getattr(obj, "_wrapper", None)
        for kind, refuse in checks:
            if isinstance(wrapper, kind):
                refuse(obj)
        return NotImplemented
    return reduce


# (the type or types an object may be an instance of, its reducer)
ReducerRow = Tuple[Union[type, Tuple[type, ...]], Callable[[Any], Any]]


def _multiprocessing_reducers() -> List[ReducerRow]:
    """(type, reducer) for each kind of multiprocessing object that is not
    pickled as dill would pickle it; only loaded modules can have made one.
    An object takes the first row its type matches."""
    out: List[ReducerRow] = []
    shared = [f for f in FAMILIES if _loaded(f, "sharedctypes") is not None]
    if shared:
        out.append((CTYPES, _refuse_shared_ctypes(shared)))
    for family in FAMILIES:
        for module, name, what, counterpart in _REFUSED:
            cls = getattr(_loaded(family, module), name, None)
            if cls is not None:
                out.append((cls, _refuse(family, what, counterpart)))
        managers, synchronize = _loaded(family, "managers"), _loaded(family, "synchronize")
        if managers is not None:
            out.append((managers.BaseProxy, _reduce_proxy))
        if synchronize is not None:
            out += [(synchronize.SemLock, _reduce_semaphore),
                    (synchronize.Condition, _reduce_for_a_child)]
    return out
