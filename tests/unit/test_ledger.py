"""The collective ledger: its record format and parent-side assembly (fast,
no TensorFlow), its hooks on a TensorFlow that lacks them, and what it
records on real workers at each level."""
import types

import pytest

from harness.core import progress
from harness.core import protocol
from harness.controller.ledger_view import LedgerView
from harness.worker import ledger as worker_ledger


def test_records_round_trip_through_the_map_and_a_slow_reader_counts_losses(tmp_path):
    path = str(tmp_path / "w.progress")
    progress.create(path, capacity=8)
    nudges = []
    writer, reader = progress.Writer(path, nudge=lambda: nudges.append(1)), progress.Reader(path)
    writer.write(progress.STEP, number=3)
    writer.write(progress.CALL_BEGAN, 0, 1, 3)
    got = reader.drain()
    assert [(r.kind, r.function, r.number, r.detail) for r in got] == [(progress.STEP, -1, 3, 0),
                                                             (progress.CALL_BEGAN, 0, 1, 3)]
    assert reader.drain() == []
    for k in range(20):   # more than the ring holds, unread: the writer nudged
        writer.write(progress.STEP, number=k)
    assert nudges
    assert [r.number for r in reader.drain()] == list(range(12, 20)) and reader.lost == 12


def test_the_file_is_private_and_checked(tmp_path):
    path = str(tmp_path / "w.progress")
    progress.create(path)
    assert (tmp_path / "w.progress").stat().st_mode & 0o777 == 0o600
    (tmp_path / "junk").write_bytes(b"\0" * 4096)
    with pytest.raises(ValueError, match="not a pytest-mwms progress file"):
        progress.Reader(str(tmp_path / "junk"))


def test_ledger_view_assembles_calls_and_keeps_the_latest_trace():
    view = LedgerView(start=100.0)
    view.message(protocol.LEDGER_FUNCTION, {"id": 0, "name": "step"})
    for trace, shape in ((1, [4]), (2, [8])):
        view.message(protocol.LEDGER_COLLECTIVE, {"function": 0, "trace": trace, "index": 0,
                                                  "kind": "all-reduce", "shape": shape,
                                                  "dtype": "float32"})
    view.records([progress.Record(progress.STEP, -1, 0, 0, 101.0),
                  progress.Record(progress.CALL_BEGAN, 0, 1, 0, 101.1),
                  progress.Record(progress.CALL_ENDED, 0, 1, 0, 101.2),
                  progress.Record(progress.CALL_BEGAN, 0, 2, progress.NO_STEP, 101.3)])
    (f,) = view.functions()
    assert (f.name, [str(op) for op in f.collectives]) == ("step", ["all-reduce float32[8]"])
    first, second = view.call_records()
    assert (first.step, first.ended is not None, second.step, second.ended) == (0, True, None, None)
    assert [e.step for e in view.step_events] == [0]
    assert not view.message("returned", None)


def test_install_on_a_tensorflow_without_the_hooks_says_why_and_patches_nothing():
    class Function:
        def __call__(self, *a):
            return "called"
    fake_ops = types.SimpleNamespace(all_reduce_v2=lambda *a, **k: None,
                                     broadcast_send=lambda *a, **k: None,
                                     broadcast_recv=lambda *a, **k: None)   # no all_gather_v2
    why = worker_ledger.install(None, types.SimpleNamespace(Function=Function), fake_ops)
    assert "all_gather_v2" in why
    assert Function()() == "called" and not hasattr(Function.__call__, "_mwms_ledger")


def test_a_branch_or_inner_function_graph_belongs_to_its_trace():
    class Graph:
        def __init__(self, outer=None, has_outer=True):
            if has_outer:
                self.outer_graph = outer

    eager = Graph(has_outer=False)       # the graph outside every trace: no outer_graph
    trace = Graph(eager)
    branch = Graph(trace)
    inner = Graph(branch)                # a tf.function called inside a tf.cond branch
    assert worker_ledger._trace_graph(trace) is trace
    assert worker_ledger._trace_graph(branch) is trace
    assert worker_ledger._trace_graph(inner) is trace
    assert worker_ledger._trace_graph(Graph(None)).outer_graph is None
