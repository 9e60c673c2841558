"""State shared between the test and its workers as TensorFlow's own
multi-worker tests share it (``multi_process_runner.manager()`` dicts,
``get_barrier()``): multiprocessing objects passed in ``run()``'s args, on
real workers; and the failures no restart cures, run with ``restarts=1``."""
import gc
import json
import multiprocessing
import os
import socket
import sys
from multiprocessing import resource_tracker

import multiprocess
import pytest

import harness
from harness.controller import Cluster
from harness.launch.manager import guarded_manager
from harness.launch.ray import launcher as raylaunch
from harness.network import namespace as netns
from harness.settings import RunSettings

pytestmark = [pytest.mark.timeout(150), pytest.mark.usefixtures("no_leftover_workers")]
RAY = raylaunch.available()
ISOLATION = netns.available()


def write_index_and_sum(shared):
    """What TensorFlow's tests do with ``manager().dict()``: each worker
    writes its task index and an all-reduced value; the test reads them
    after the run."""
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    value = float(harness.context().index + 1)
    total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(value)), axis=None)
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    shared[f"worker-{task}"] = (task, float(total))


def _expected(n):
    return {f"worker-{i}": (i, n * (n + 1) / 2) for i in range(n)}


@pytest.mark.parametrize("library", [multiprocessing, multiprocess], ids=lambda m: m.__name__)
def test_workers_write_a_manager_dict_that_the_test_reads_after_the_run(mwms_cluster, library):
    with guarded_manager(library) as manager:
        shared = manager.dict()
        mwms_cluster.run(write_index_and_sum, args=(shared,), timeout=30).assert_completed()
        assert dict(shared) == _expected(mwms_cluster.num_workers)


def meet(barrier, arrived, go, done):
    """Every worker arrives before any passes the barrier; worker 0 then
    lets the others go, and each reports to the queue."""
    ctx = harness.context()
    arrived.append(ctx.index)
    barrier.wait(timeout=20)
    seen = len(arrived)
    if ctx.index == 0:
        go.set()
    went = go.wait(timeout=20)
    done.put(ctx.index)
    return seen, went


@pytest.mark.mwms(workers=3, network="host")
def test_a_manager_barrier_event_list_and_queue_work_across_the_workers(mwms_cluster):
    n = mwms_cluster.num_workers
    with guarded_manager(multiprocessing) as manager:
        # multi_process_runner.get_barrier() is manager().Barrier(n)
        barrier, arrived, go, done = (manager.Barrier(n), manager.list(), manager.Event(),
                                      manager.Queue())
        result = mwms_cluster.run(meet, args=(barrier, arrived), kwargs={"go": go, "done": done},
                                  timeout=30)
        result.assert_completed()
        assert result.return_values == [(n, True)] * n
        assert go.is_set() and sorted(arrived) == list(range(n))
        assert sorted(done.get(timeout=5) for _ in range(n)) == list(range(n))


def test_a_manager_on_tcp_is_reached_on_the_hosts_network():
    """How workers on other machines reach a manager: over TCP."""
    cluster = Cluster(RunSettings(workers=2, timeout=30, network="host"))
    with guarded_manager(multiprocessing, address=("127.0.0.1", 0)) as manager:
        shared = manager.dict()
        cluster.run(write_task, args=(shared,)).assert_completed()
        assert sorted(shared.keys()) == [0, 1]


@pytest.mark.skipif(not ISOLATION[0], reason=f"no network namespace here: {ISOLATION[1]}")
def test_a_manager_on_the_hosts_loopback_is_not_reached_from_an_isolated_cluster():
    cluster = Cluster(RunSettings(workers=2, timeout=30, network="isolated"))
    with guarded_manager(multiprocessing, address=("127.0.0.1", 0)) as manager:
        result = cluster.run(write_task, args=(manager.dict(),), restarts=1)
        _not_restarted(result, f"cannot be reached at {manager.address!r}")
        assert "network='host'" in result.workers[0].exception.message


def test_a_manager_address_that_never_answers_is_a_clear_error_not_a_hang():
    """A listener whose backlog is full drops the worker's SYNs, as a
    firewall would: its connect() would wait for minutes."""
    cluster = Cluster(RunSettings(workers=2, timeout=30, network="host"))
    with socket.socket() as silent, guarded_manager(multiprocessing,
                                                   address=("127.0.0.1", 0)) as manager:
        silent.bind(("127.0.0.1", 0))
        silent.listen(0)
        address = silent.getsockname()
        queued = [socket.socket() for _ in range(3)]
        shared = manager.dict()
        token, real = shared._token, shared._token.address
        try:
            for s in queued:
                s.setblocking(False)
                s.connect_ex(address)
            token.address = address    # what the workers get; the test's proxy keeps its own
            result = cluster.run(write_task, args=(shared,), restarts=1)
        finally:
            token.address = real
            for s in queued:
                s.close()
    _not_restarted(result, f"cannot be reached at {address!r}")
    assert "no answer in 5 s" in result.workers[0].exception.message
    assert result.duration < 25, result.diagnosis


def nested(outer):
    """The list inside the dict comes from the manager, not from the
    parent's pickle: the worker's own authkey must be the parent's."""
    outer["inner"].append(harness.context().index)


def test_a_proxy_the_manager_hands_a_worker_is_accepted(mwms_cluster):
    with guarded_manager(multiprocessing) as manager:
        outer = manager.dict(inner=manager.list())
        mwms_cluster.run(nested, args=(outer,), timeout=30).assert_completed()
        assert sorted(outer["inner"]) == list(range(mwms_cluster.num_workers))


@pytest.fixture
def named_semaphores():
    """Semaphores with a name (a spawn context's) start the stdlib's
    resource tracker; the one this test started is stopped after it."""
    tracker = resource_tracker._resource_tracker
    running = tracker._fd is not None
    yield multiprocessing.get_context("spawn")
    gc.collect()    # the semaphores' finalizers unlink them first
    if not running:
        tracker._stop()


def set_or_wait(event, lock):
    if harness.context().index == 0:
        with lock:
            event.set()
    return event.wait(timeout=20)


def test_an_event_and_a_lock_of_a_spawn_context_reach_the_workers(mwms_cluster,
                                                                   named_semaphores):
    event, lock = named_semaphores.Event(), named_semaphores.Lock()
    result = mwms_cluster.run(set_or_wait, args=(event, lock), timeout=30)
    result.assert_completed()
    assert result.return_values == [True] * mwms_cluster.num_workers and event.is_set()
    assert lock.acquire(timeout=1)
    del event, lock


def write_task(shared):
    shared[harness.context().index] = os.getpid()


def test_spawned_workers_reach_a_manager_too():
    cluster = Cluster(RunSettings(workers=2, timeout=60, start_method="spawn", network="host"))
    with guarded_manager(multiprocessing) as manager:
        shared = manager.dict()
        result = cluster.run(write_task, args=(shared,))
        result.assert_completed()
        assert sorted(shared.keys()) == [0, 1]


@pytest.mark.skipif(not RAY[0], reason=RAY[1])
def test_a_manager_dict_on_ray_nodes_of_this_machine():
    """Ray's workers are forks of each node agent's forkserver; on nodes
    of one machine a Manager()'s Unix socket is theirs too."""
    cluster = Cluster(RunSettings(workers=2, timeout=30, grace=3, backend="ray", ray_nodes=2))
    try:
        with guarded_manager(multiprocessing) as manager:
            shared = manager.dict()
            cluster.run(write_index_and_sum, args=(shared,)).assert_completed()
            assert dict(shared) == _expected(2)
    finally:
        raylaunch.close_session()


# -- what no restart cures ----------------------------------------------------------

def _not_restarted(result, error_text):
    assert result.outcome == "failed", result.diagnosis
    assert len(result.attempts) == 1 and result.restarts == 0, result.diagnosis
    for worker in result.workers:
        assert worker.exception.type_name == "SerializationError", result.diagnosis
        assert error_text in worker.exception.message, worker.exception.message
    last = result.diagnosis.splitlines()[-1]
    assert last.startswith("not restarted: workers 0,1 raised SerializationError before fn "
                           "ran"), result.diagnosis


class LoadsNowhere:
    """Pickles in the parent; unpickling it raises, as an object whose
    class changed under the workers would."""

    def __getstate__(self):
        return {"made": "in the parent"}

    def __setstate__(self, state):
        raise RuntimeError("this object does not load here")


def test_arguments_that_cannot_be_unpickled_are_not_restarted(mwms_cluster):
    result = mwms_cluster.run(write_task, args=(LoadsNowhere(),), timeout=30, restarts=1)
    _not_restarted(result, "RuntimeError: this object does not load here")


def test_a_function_the_workers_cannot_import_is_not_restarted(mwms_cluster, tmp_path,
                                                               monkeypatch):
    source = tmp_path / "vanishing_module.py"
    source.write_text("def fn():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import vanishing_module
        source.unlink()    # fn goes by name, and the workers find no module of that name
        result = mwms_cluster.run(vanishing_module.fn, timeout=30, restarts=1)
    finally:
        sys.modules.pop("vanishing_module", None)
    _not_restarted(result, "No module named 'vanishing_module'")


def test_a_proxy_whose_manager_is_gone_fails_at_once_and_is_not_restarted(mwms_cluster):
    with guarded_manager(multiprocessing) as manager:
        shared = manager.dict()
        address = manager.address
    result = mwms_cluster.run(write_index_and_sum, args=(shared,), timeout=30, restarts=1)
    _not_restarted(result, f"cannot be reached at {address!r}")
    assert result.duration < 20, result.diagnosis
