"""The collective ledger: its record format and parent-side assembly (fast,
no TensorFlow), its hooks on a TensorFlow that lacks them, and what it
records on real workers at each level."""
import types

import pytest

from harness.core import progress
from harness.core import protocol
from harness.controller.ledger_view import LedgerView
from harness.worker import ledger as worker_ledger
from harness.worker import sites as worker_sites


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


# -- the user's line of an eager collective -------------------------------------

LIBS = ("/usr/lib/python3.11/",)
HARNESS = "/repo/harness/"
OWN = ("/repo/harness/workloads.py", "/repo/harness/bench/corpus/")


def _library(path):
    return worker_sites.is_library_file(path, LIBS, HARNESS, OWN)


@pytest.mark.parametrize("path, library", [
    ("/home/me/train.py", False),
    ("/venv/lib/python3.11/site-packages/tensorflow/python/checkpoint/checkpoint.py", True),
    ("/venv/lib/python3.11/site-packages/tf_keras/src/metrics/base_metric.py", True),
    ("/usr/lib/python3/dist-packages/keras/src/trainers/trainer.py", True),
    ("/usr/lib/python3.11/threading.py", True),
    ("/repo/harness/worker/ledger.py", True),
    ("/repo/harness/bench/corpus/fit.py", False),
    ("/repo/harness/workloads.py", False),
    ("/repo/scenarios/test_chief_only.py", False),
    ("<frozen runpy>", True),
    ("", True),
])
def test_which_files_are_the_users(path, library):
    assert _library(path) is library


def test_the_users_frame_is_the_innermost_outside_the_libraries():
    frames = [("/repo/harness/worker/ledger.py", 300, "hooked"),
              ("/venv/lib/python3.11/site-packages/tensorflow/python/ops/collective_ops.py", 9,
               "all_reduce_v2"),
              ("/venv/lib/python3.11/site-packages/tensorflow/python/checkpoint/checkpoint.py",
               2300, "save"),
              ("/home/me/train.py", 57, "train"),
              ("/home/me/train.py", 80, "main"),
              ("/repo/harness/worker/main.py", 140, "_call_fn")]
    assert worker_sites.first_user_frame(frames, _library) == ("/home/me/train.py", 57, "train")
    assert worker_sites.first_user_frame(frames[:3], _library) is None


def test_a_site_is_said_with_its_source_when_there_is_one():
    frame = ("/home/me/train.py", 57, "train")
    assert worker_sites.site_text(frame, "        ckpt.save(path)\n") == \
        "train.py:57 in train: ckpt.save(path)"
    assert worker_sites.site_text(frame) == "train.py:57 in train"


def test_the_users_frame_is_found_from_a_pool_thread_while_the_caller_waits():
    """TensorFlow runs an eager all-reduce in a pool thread, whose frames
    are all library code: the user's frame is the waiting caller's (here
    this file stands for the user's code)."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(1) as pool:
        frame = pool.submit(worker_sites.user_site, lambda path: path != __file__).result()
    assert frame is not None and frame[0] == __file__ and \
        frame[2] == "test_the_users_frame_is_found_from_a_pool_thread_while_the_caller_waits"


def test_looking_at_the_callers_frames_keeps_none_of_its_locals_alive():
    """The caller's locals (TensorFlow's ThreadPool) must die when the
    caller's function returns, not at a later collection in whatever thread
    runs it, where the pool's finalizer can deadlock."""
    import gc
    import weakref
    from concurrent.futures import ThreadPoolExecutor

    class Local:
        pass

    def caller(pool):
        local = Local()
        pool.submit(worker_sites.user_site, lambda path: path != __file__).result()
        return weakref.ref(local)

    enabled = gc.isenabled()
    gc.disable()
    try:
        with ThreadPoolExecutor(1) as pool:
            ref = caller(pool)
        assert ref() is None
    finally:
        if enabled:
            gc.enable()


def test_ledger_view_gives_each_call_its_users_line_in_either_order():
    view = LedgerView(start=0.0)
    view.message(protocol.LEDGER_FUNCTION, {"id": 0, "name": "<eager all-reduce>"})
    view.records([progress.Record(progress.CALL_BEGAN, 0, 1, 5, 1.0),
                  progress.Record(progress.CALL_SITE, 0, 1, 0, 1.0),
                  progress.Record(progress.CALL_ENDED, 0, 1, 0, 1.1),
                  progress.Record(progress.CALL_BEGAN, 0, 2, 6, 2.0)])
    view.message(protocol.LEDGER_SITE, {"id": 0, "site": "train.py:57 in train: ckpt.save(p)"})
    first, second = view.call_records()
    assert (first.site, second.site) == ("train.py:57 in train: ckpt.save(p)", "")
