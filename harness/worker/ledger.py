"""Worker side: the collective ledger, recorded with no change to user code.

Two levels (``run(ledger=...)``):

``"calls"`` (the default)
    Which collectives a ``tf.function`` launches is known when it is traced:
    the hooks below see each collective op being created (kind, shape,
    dtype, its ``timeout`` argument, in order, and what it reduces: the
    ops that produce each packed part of its input, see ``_label_of``) and
    tell the parent once, over the pipe.  Each later
    call of a function that launches collectives writes two records to the
    progress map (:mod:`harness.core.progress`): call *k* began (at step *s*),
    call *k* ended.  About a microsecond a call; it tells which call a worker
    is blocked in and which collectives that call launches, not which one
    of them is pending.
``"collectives"``
    Also a ``tf.py_function`` marker before and after each collective, under
    control dependencies, so the map says which collective was launched and
    which completed.  It costs a fraction of a millisecond per collective.

Eager collectives (``strategy.reduce`` outside a ``tf.function``) run in
TensorFlow's thread pool, so nothing here is thread-local; each is recorded
as one call of a pseudo-function named ``<eager KIND>``, and with the line
of the user's code that launched it (``ckpt.save(...)``, a metric's
``result()``: see :func:`harness.worker.sites.user_site`), told once per line over the pipe and
named by id in a ``CALL_SITE`` record.  The function's name stays the kind
alone: the workers' calls of it are counted and compared by name.

The hooks patch private TensorFlow functions: ``collective_ops`` (the
module attributes ``cross_device_utils`` and MWMS's variable initialisation
call through) and ``Function.__call__``.  Where a TensorFlow version lacks
them the ledger is off and the parent is told why, once; a run never breaks
for the ledger's sake.
"""
from __future__ import annotations

import linecache
import threading
from typing import Dict, List, Optional, Tuple

from harness.core import progress, protocol
from harness.errors import InjectedFault
from harness.worker.sites import Frame, LibraryFiles, site_text, user_site

# (module attribute, kind, how to read the shape and dtype from its arguments)
_HOOKED = (
    ("all_reduce_v2", "all-reduce", "tensor"),
    ("all_gather_v2", "all-gather", "tensor"),
    ("broadcast_send", "broadcast", "tensor"),
    ("broadcast_recv", "broadcast", "shape"),
)


def _describe_tensor(t) -> Tuple[Tuple, str]:
    shape = getattr(t, "shape", None)
    dims = tuple(d if isinstance(d, int) else -1 for d in shape.as_list()) \
        if shape is not None and shape.rank is not None else ()
    dtype = getattr(getattr(t, "dtype", None), "name", "?")
    return dims, dtype


def _describe_args(how: str, args, kwargs) -> Tuple[Tuple, str]:
    if how == "tensor":
        return _describe_tensor(args[0] if args else kwargs.get("t"))
    shape = args[0] if args else kwargs.get("shape")
    dtype = args[1] if len(args) > 1 else kwargs.get("dtype")
    try:
        import tensorflow as tf
        dims = tuple(d if isinstance(d, int) else -1 for d in tf.TensorShape(shape).as_list())
    except Exception:
        dims = ()
    return dims, getattr(dtype, "name", str(dtype))


# Ops whose output holds their first input's values, reshaped or cast: the
# walk from a collective's input goes through them to what is reduced.
_PASS_THROUGH = frozenset({"Identity", "Reshape", "Cast", "Squeeze", "ExpandDims", "Snapshot",
                           "StopGradient", "EnsureShape"})
# Ops that join tensors into one (MWMS packs gradients with ConcatV2), and
# which of their inputs are the parts.
_JOINS = {"ConcatV2": lambda inputs: inputs[:-1], "Concat": lambda inputs: inputs[1:],
          "Pack": lambda inputs: inputs}
MAX_LABEL_PARTS = 4096


def _label_of(t) -> Tuple[str, ...]:
    """What a traced collective reduces: the name of the op that produces
    each packed part of its input ``t``, in the pack's order, through the
    ops that pack, reshape or cast.  Their names come from the user's
    graph (a gradient's from the forward op it differentiates:
    ``gradient_tape/dense/MatMul/MatMul_1``), so a worker that packs the
    same gradients in another order gives the same names in another order.
    () when ``t`` has no graph op."""
    try:
        parts: List[str] = []
        todo = [t]
        while todo and len(parts) < MAX_LABEL_PARTS:
            op = todo.pop().op
            join = _JOINS.get(op.type)
            if join is not None:
                todo.extend(reversed(join(list(op.inputs))))
            elif op.type in _PASS_THROUGH and op.inputs:
                todo.append(op.inputs[0])
            else:
                parts.append(op.name)
        return tuple(parts)
    except Exception:   # a tensor of another kind: the ledger never breaks a run
        return ()


def _timeout_of(position: Optional[int], args, kwargs) -> float:
    """The collective's ``timeout`` argument in seconds (MWMS passes
    ``CommunicationOptions(timeout_seconds=...)`` through it); 0.0 when none."""
    value = kwargs.get("timeout")
    if value is None and position is not None and position < len(args):
        value = args[position]
    try:
        return float(value or 0.0)
    except (TypeError, ValueError):
        return 0.0


def _timeout_position(original) -> Optional[int]:
    """Where ``timeout`` stands among ``original``'s positional parameters."""
    import inspect
    try:
        names = list(inspect.signature(original).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("timeout") if "timeout" in names else None


def _trace_graph(graph):
    """The graph of the trace that ``graph`` belongs to: the outermost of
    the function graphs it is nested in.  A ``tf.cond`` or ``tf.while_loop``
    branch, and a ``tf.function`` called while another is traced, build
    graphs of their own inside the trace (``outer_graph``); their
    collectives are the trace's."""
    while getattr(getattr(graph, "outer_graph", None), "outer_graph", None) is not None:
        graph = graph.outer_graph
    return graph


def _trace_first(function, args, kwargs) -> bool:
    """Trace ``function`` for these arguments without running it (the call
    that follows uses the trace), so that a SkipStep can act between the two.
    False when it cannot be traced apart; the call then traces it itself."""
    try:
        function.get_concrete_function(*args, **kwargs)
        return True
    except Exception:
        return False


def _stand_in(function, args, kwargs):
    """What a skipped call returns: zeros of the structure the function's
    traced outputs have (so ``float(step())`` still works), or None."""
    try:
        import tensorflow as tf
        outputs = function.get_concrete_function(*args, **kwargs).structured_outputs

        def zero(t):
            if not isinstance(t, tf.Tensor):
                return t
            dims = [d if d is not None else 0 for d in t.shape.as_list()] \
                if t.shape.rank is not None else []
            return tf.zeros(dims, t.dtype)
        return tf.nest.map_structure(zero, outputs)
    except Exception:
        return None


class Ledger:
    """The ledger of one worker: assigns function ids, knows the current
    step, writes call records and sends what it learns at trace time."""

    def __init__(self, writer: progress.Writer, send, level: str, ctx):
        self.writer = writer
        self.send = send
        self.level = level
        self.ctx = ctx                        # the WorkerContext: its step, automatic steps
        self._ids: Dict[int, int] = {}        # id(Function) -> function id
        self._keep: List[object] = []         # the Functions, so their ids stay theirs
        self._collectives: Dict[int, int] = {}  # function id -> collectives in its latest trace
        self._graphs: Dict[int, object] = {}  # function id -> the graph last traced for it
        self._traces: Dict[int, int] = {}
        self._calls: Dict[int, int] = {}
        self._eager: Dict[Tuple, int] = {}
        self._stack: List[Tuple[int, bool]] = []   # (function id, called eagerly)
        self._skip_first: Dict[int, bool] = {}     # its first call is skipped (a SkipStep)
        self._sites: Dict[Frame, int] = {}         # a user's line -> its id
        self._library = LibraryFiles()
        self._lock = threading.Lock()

    # -- function ids ----------------------------------------------------
    def _new_id(self, name: str) -> int:
        fid = len(self._keep)
        self.send(protocol.LEDGER_FUNCTION, data={"id": fid, "name": name})
        return fid

    def function_id(self, function) -> int:
        fid = self._ids.get(id(function))
        if fid is None:
            with self._lock:
                fid = self._ids.get(id(function))
                if fid is None:
                    fid = self._new_id(str(getattr(function, "__name__", None)
                                           or getattr(function, "_name", "tf.function")))
                    self._keep.append(function)
                    self._ids[id(function)] = fid
        return fid

    def _step(self) -> int:
        step = self.ctx.current_step
        return progress.NO_STEP if step is None else step

    def _names(self, fid: int) -> str:
        function = self._keep[fid]
        return str(getattr(function, "__name__", None) or getattr(function, "_name", ""))

    def site_id(self) -> int:
        """The id of the user's line that launched the collective being
        made (told the parent the first time), or -1 when there is none."""
        frame = user_site(self._library.__getitem__)
        if frame is None:
            return -1
        sid = self._sites.get(frame)
        if sid is None:
            with self._lock:
                sid = self._sites.get(frame)
                if sid is None:
                    sid = self._sites[frame] = len(self._sites)
                    source = linecache.getline(frame[0], frame[1])
                    self.send(protocol.LEDGER_SITE,
                              data={"id": sid, "site": site_text(frame, source)})
        return sid

    # -- calls -------------------------------------------------------------
    def call(self, function, original, args, kwargs):
        from tensorflow.python.eager import context
        fid = self.function_id(function)
        if not context.executing_eagerly():
            # Called while an outer function is traced: the outer call's
            # records cover it when it runs.
            self._stack.append((fid, False))
            try:
                return original(function, *args, **kwargs)
            finally:
                self._stack.pop()
        known = self._collectives.get(fid)
        if known:
            # A call of a function that launches collectives: where fn
            # reports no steps, it is the next step (faults act before it).
            run = self.ctx.automatic_step(self._names(fid))
            if run is False:
                return _stand_in(function, args, kwargs)
        # Until its first trace is done, a function may launch collectives.
        record = known is None or known > 0
        number = 0
        if record:
            with self._lock:
                number = self._calls[fid] = self._calls.get(fid, 0) + 1
            self.writer.write(progress.CALL_BEGAN, fid, number, self._step())
        self._stack.append((fid, True))
        ended = progress.CALL_RAISED
        try:
            # Tracing apart from the call changes nothing, but it is only
            # done when a SkipStep is due: a trace that raises must raise as
            # the user's own call would.
            if known is None and self.ctx.skip_due() and \
                    _trace_first(function, args, kwargs) and self._skip_first.pop(fid, False):
                # Its first trace found a collective, and a SkipStep made the
                # call not happen: as if fn had never made it.
                ended = progress.CALL_NOT_RUN
                return _stand_in(function, args, kwargs)
            result = original(function, *args, **kwargs)
            ended = progress.CALL_RETURNED
            return result
        finally:
            self._stack.pop()
            if ended != progress.CALL_NOT_RUN:
                self._collectives.setdefault(fid, 0)
            if record:
                self.writer.write(progress.CALL_ENDED, fid, number, ended)

    # -- collectives ---------------------------------------------------------
    def collective(self, kind: str, how: str, original, args, kwargs, timeout_at=None):
        from tensorflow.python.eager import context
        from tensorflow.python.framework import ops
        shape, dtype = _describe_args(how, args, kwargs)
        timeout = _timeout_of(timeout_at, args, kwargs)
        if context.executing_eagerly():
            return self._eager_collective(kind, shape, dtype, timeout, original, args, kwargs)
        owner = next((fid for fid, eager in self._stack if eager), None)
        if owner is None:
            return original(*args, **kwargs)   # a graph built outside any tf.function call
        graph = _trace_graph(ops.get_default_graph())
        with self._lock:
            first = owner not in self._collectives
            if self._graphs.get(owner) is not graph:   # a new trace of this function
                self._graphs[owner] = graph
                self._traces[owner] = self._traces.get(owner, 0) + 1
                self._collectives[owner] = 0
            index = self._collectives[owner]
            self._collectives[owner] = index + 1
        if first:
            # The first call of a function is traced before it runs: only
            # now is it known to launch collectives, so only now is it
            # known to be a step.
            run = self.ctx.automatic_step(self._names(owner))
            if run is False:
                self._skip_first[owner] = True
            elif run is not None:   # the call belongs to the step just reported
                self.writer.write(progress.CALL_BEGAN, owner, self._calls.get(owner, 0),
                                  self._step())
        label = _label_of(args[0] if args else kwargs.get("t")) if how == "tensor" else ()
        self.send(protocol.LEDGER_COLLECTIVE,
                  data={"function": owner, "trace": self._traces[owner], "index": index,
                        "kind": kind, "shape": shape, "dtype": dtype, "label": label,
                        "timeout": timeout})
        if self.level != "collectives":
            return original(*args, **kwargs)
        return self._with_markers(owner, index, original, args, kwargs)

    def _eager_collective(self, kind, shape, dtype, timeout, original, args, kwargs):
        key = (kind, shape, dtype, timeout)
        fid = self._eager.get(key)
        if fid is None:
            with self._lock:
                fid = self._eager.get(key)
                if fid is None:
                    fid = self._new_id(f"<eager {kind}>")
                    self._keep.append(key)
                    self._collectives[fid] = 1
                    self._eager[key] = fid
            self.send(protocol.LEDGER_COLLECTIVE,
                      data={"function": fid, "trace": 1, "index": 0, "kind": kind,
                            "shape": shape, "dtype": dtype, "timeout": timeout})
        with self._lock:
            number = self._calls[fid] = self._calls.get(fid, 0) + 1
        self.writer.write(progress.CALL_BEGAN, fid, number, self._step())
        site = self.site_id()
        if site >= 0:
            self.writer.write(progress.CALL_SITE, fid, number, site)
        raised = 1
        try:
            result = original(*args, **kwargs)
            raised = 0
            return result
        finally:
            self.writer.write(progress.CALL_ENDED, fid, number, raised)

    def _with_markers(self, fid: int, index: int, original, args, kwargs):
        """The collective between two ``tf.py_function`` markers that write
        its launch and completion, ordered by control dependencies."""
        import tensorflow as tf

        def mark(kind):
            def write():
                self.writer.write(kind, fid, self._calls.get(fid, 0), index)
                return 0
            return write

        before = tf.py_function(mark(progress.COLLECTIVE_LAUNCHED), [], tf.int32)
        with tf.control_dependencies([before]):
            out = original(*args, **kwargs)
        with tf.control_dependencies([out]):
            after = tf.py_function(mark(progress.COLLECTIVE_DONE), [], tf.int32)
        with tf.control_dependencies([after]):
            return tf.identity(out)


def install(ledger: Ledger, function_module=None, collective_ops=None) -> Optional[str]:
    """Patch TensorFlow in this process to feed ``ledger``; None when done,
    else why it could not be (the ledger is then off).  The modules to patch
    default to TensorFlow's own (``polymorphic_function`` and
    ``collective_ops``)."""
    try:
        if function_module is None:
            from tensorflow.python.eager.polymorphic_function import polymorphic_function
            function_module = polymorphic_function
        if collective_ops is None:
            from tensorflow.python.ops import collective_ops as tf_collective_ops
            collective_ops = tf_collective_ops
    except ImportError as e:
        return f"this TensorFlow has no {e.name}"
    function_class = getattr(function_module, "Function", None)
    missing = [name for name, _, _ in _HOOKED if not callable(getattr(collective_ops, name, None))]
    # The class's own __call__ is what the ledger hooks, not "is it callable".
    if function_class is None or not callable(getattr(function_class, "__call__", None)):  # noqa: B004
        missing.append("polymorphic_function.Function.__call__")
    if missing or function_class is None:
        return "this TensorFlow lacks " + ", ".join(missing)
    if getattr(function_class.__call__, "_mwms_ledger", False):
        return None
    original_call = function_class.__call__

    def __call__(self, *args, **kwargs):
        try:
            return ledger.call(self, original_call, args, kwargs)
        except InjectedFault as e:
            # A RaiseError acts at the boundary of the step this call
            # begins: deep in the harness's code, and inside TensorFlow's
            # when the call traces the function.  Raised again from here,
            # where the user called, its traceback holds the user's frames
            # and this hook's, none of those.
            raise e.with_traceback(None) from None

    __call__._mwms_ledger = True   # type: ignore[attr-defined]  # read back above
    function_class.__call__ = __call__
    for name, kind, how in _HOOKED:
        original = getattr(collective_ops, name)

        def hooked(*args, _kind=kind, _how=how, _original=original,
                   _timeout_at=_timeout_position(original), **kwargs):  # noqa: B008 - once per op
            return ledger.collective(_kind, _how, _original, args, kwargs, _timeout_at)

        hooked.__name__ = name
        setattr(collective_ops, name, hooked)
    return None
