"""harness.compat on real TensorFlow workers: what TensorFlow's and
tf-keras's multi-worker tests rely on from TensorFlow's runner (return
values and ``[worker-i]:`` lines, a task's own error raised in the test,
a peer's death, ``auto_restart`` restarting one task (TensorFlow's
``PeerFailureRecoverTest`` bodies), a preempted cluster started again task
by task, ``terminate`` and one task started again into its running
cluster, a hang at ``join``'s timeout, the pool), each with the harness's
verdict opening the error's message."""
import json
import os
import re
import signal
import shutil
import sys
import tempfile
import time

import pytest

from harness.compat import multi_process_runner as mpr
from harness.compat import multi_worker_test_base as mwtb

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("no_leftover_workers")]


@pytest.fixture(scope="module", autouse=True)
def _session_manager():
    yield
    mpr.shutdown_manager()


@pytest.fixture(autouse=True)
def _no_runner_left(no_leftover_workers):
    """A test that fails between start() and join() leaves no cluster
    running (ended before no_leftover_workers looks)."""
    yield
    mpr.end_all_runners()


def _index():
    return json.loads(os.environ["TF_CONFIG"])["task"]["index"]


def _strategy(health_check_every=None):
    import tensorflow as tf
    from tensorflow.python.distribute import collective_all_reduce_strategy as lib
    if health_check_every:
        # as TensorFlow's peer-failure test sets it: a peer's death is seen in seconds
        lib.CollectiveAllReduceExtended._check_health_interval = health_check_every
        lib.CollectiveAllReduceExtended._check_health_timeout = 1
        lib.CollectiveAllReduceExtended._check_health_initial_timeout = 0
    return tf.distribute.MultiWorkerMirroredStrategy()


def _sum(strategy, x=1.0):
    import tensorflow as tf
    return float(strategy.reduce("SUM", strategy.run(lambda: tf.constant(x)), axis=None))


def reduce_and_log(x):
    from absl import logging
    strategy = _strategy()
    mpr.get_barrier().wait()
    logging.info("task %d says hello", _index())
    return _sum(strategy, x)


def test_run_returns_each_tasks_value_and_its_prefixed_lines():
    r = mpr.run(reduce_and_log, mwtb.create_cluster_spec(num_workers=2), args=(1.5,),
                return_output=True, timeout=90)
    assert r.return_value == [3.0, 3.0]
    for i in (0, 1):   # tf-keras's tutorial test reads the lines this way
        assert any(re.match(rf"\[worker\-{i}\].*task {i} says hello", line) for line in r.stdout)


def rpc_layer_and_server_target():
    from tensorflow.python.distribute.cluster_resolver import TFConfigClusterResolver
    resolver = TFConfigClusterResolver()
    return resolver.rpc_layer, resolver.master()


@pytest.mark.parametrize("rpc_layer", [None, "grpc+loas"])
def test_each_task_s_tf_config_names_its_rpc_layer_as_tensorflow_s_runner_writes_it(rpc_layer):
    r = mpr.run(rpc_layer_and_server_target, mwtb.create_cluster_spec(num_workers=2),
                rpc_layer=rpc_layer, timeout=90)
    layer = rpc_layer or "grpc"
    assert [value[0] for value in r.return_value] == [layer, layer]
    # The resolver builds the server's target from it, as TensorFlow's tests read it.
    assert all(value[1].startswith(f"{layer}://") for value in r.return_value)


def raise_on_one():
    if _index() == 1:
        raise KeyError("no such key on 1")
    return "fine"


def test_a_tasks_error_is_raised_in_the_test_with_its_type_and_the_verdict_first():
    with pytest.raises(KeyError) as e:
        mpr.run(raise_on_one, mwtb.create_cluster_spec(num_workers=2), timeout=90)
    message = e.value.args[0]
    assert message.startswith("FAILED: worker 1 raised KeyError"), message
    assert message.endswith("\n\nno such key on 1")
    assert e.value.mpr_result.return_value == ["fine"]
    assert e.value.run_result.culprits == (1,)


def die_between_reduces():
    strategy = _strategy(health_check_every=2)
    _sum(strategy)
    if strategy.cluster_resolver.task_id == 1:
        os._exit(1)
    _sum(strategy)


def test_a_peers_death_raises_the_survivors_tensorflow_error_naming_the_dead_one():
    import tensorflow as tf
    runner = mpr.MultiProcessRunner(die_between_reduces, mwtb.create_cluster_spec(num_workers=2))
    runner.start()
    with pytest.raises((tf.errors.UnavailableError, tf.errors.DeadlineExceededError)) as e:
        runner.join(timeout=90)
    headline = str(e.value).splitlines()[0]
    assert headline.startswith("CRASHED") and "worker 1" in headline, str(e.value)
    assert runner.get_process_exit_code("worker", 1) == 1


def exit_on_first_attempt(attempts):
    strategy = _strategy(health_check_every=2)
    i = _index()
    attempts[i] = attempts.get(i, 0) + 1
    _sum(strategy)
    if attempts[i] == 1 and i == 1:
        os._exit(1)
    return _sum(strategy)


def test_auto_restart_restarts_the_task_that_exited_and_returns_the_last_values():
    attempts = mpr.manager().dict()
    runner = mpr.MultiProcessRunner(exit_on_first_attempt, mwtb.create_cluster_spec(num_workers=2),
                                    args=(attempts,), auto_restart=True)
    runner.start()
    assert runner.join(timeout=120).return_value == [2.0, 2.0]
    result = runner.results[-1]
    assert result.restarts == 0     # no cluster restart: one task at a time
    assert dict(attempts) == {i: len(w.attempts) for i, w in enumerate(result.workers)}
    first = result.workers[1].attempts[0]
    assert first.exit_code == 1 and first.exception is None


def exit_creating_variables(attempts):
    """PeerFailureRecoverTest.test_creating_variable's body: worker 1's
    first process exits between two variables' initial broadcasts."""
    import tensorflow as tf
    strategy = _strategy(health_check_every=3)
    i = _index()
    attempts[i] = attempts.get(i, 0) + 1
    with strategy.scope():
        tf.Variable(1.)
        if attempts[i] == 1 and i == 1:
            os._exit(1)
        v = tf.Variable(tf.random.uniform(()))
        return v.read_value().numpy()


def exit_between_large_reduces(attempts):
    """PeerFailureRecoverTest.test_quick_recover's body: long health checks,
    a large all-reduce, worker 1's first process exits after the first."""
    import tensorflow as tf
    from tensorflow.python.distribute import collective_all_reduce_strategy as lib
    lib.CollectiveAllReduceExtended._check_alive_interval = 30
    lib.CollectiveAllReduceExtended._check_alive_initial_timeout = 30
    strategy = _strategy(health_check_every=3)
    i = _index()
    attempts[i] = attempts.get(i, 0) + 1

    @tf.function
    def replica_fn():
        value = tf.ones((64, 64))
        tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, [value, value])

    strategy.run(replica_fn)
    if attempts[i] == 1 and i == 1:
        os._exit(1)
    strategy.run(replica_fn)


@pytest.mark.parametrize("body", [exit_creating_variables, exit_between_large_reduces])
def test_peer_failure_recover_bodies_restart_one_task_at_a_time(body):
    attempts = mpr.manager().dict()
    runner = mpr.MultiProcessRunner(body, mwtb.create_cluster_spec(num_workers=2),
                                    args=(attempts,), auto_restart=True)
    runner.start()
    values = runner.join(timeout=90).return_value
    result = runner.results[-1]
    assert result.restarts == 0 and result.workers[1].restarts >= 1
    assert result.workers[1].attempts[0].exit_code == 1
    assert dict(attempts) == {i: len(w.attempts) for i, w in enumerate(result.workers)}
    if body is exit_creating_variables:
        assert len(values) == 2 and values[0] == values[1]


def preemptible(ready, preempted, runs):
    """A preemption handler's shape: the signalled task tells the others,
    and every task exits 42; run again, each returns its run count.  Each
    task says it is ready once its handler is in place."""
    i = _index()
    runs[i] = runs.get(i, 0) + 1
    strategy = _strategy()
    if runs[i] > 1:
        return _sum(strategy, float(runs[i]))

    # The handler only flags: a proxy used from a signal handler could
    # interleave with the main thread's call on the same connection.
    signalled = []
    signal.signal(signal.SIGTERM, lambda *_: signalled.append(True))
    ready[i] = True
    while not signalled and not preempted.wait(0.1):
        pass
    preempted.set()
    sys.exit(42)


def test_a_preempted_cluster_is_started_again_task_by_task():
    m = mpr.manager()
    ready, preempted, runs = m.dict(), m.Event(), m.dict()
    cluster_spec = mwtb.create_cluster_spec(num_workers=3)
    runner = mpr.MultiProcessRunner(preemptible, cluster_spec, args=(ready, preempted, runs))
    runner.start()
    until = time.monotonic() + 120
    while len(ready) < 3 and time.monotonic() < until:
        time.sleep(0.2)
    os.kill(runner.get_process_id("worker", 2), signal.SIGTERM)
    until = time.monotonic() + 60
    while any(runner.process_exists("worker", i) for i in range(3)) and time.monotonic() < until:
        time.sleep(0.5)
    assert [runner.get_process_exit_code("worker", i) for i in range(3)] == [42, 42, 42]
    for i in range(3):
        runner.start_single_process("worker", i, cluster_spec)
    assert runner.join(timeout=120).return_value == [6.0, 6.0, 6.0]
    assert len(runner.results) == 2


def wait_or_sleep(go, starts):
    """Worker 0 waits to be told; worker 1's first process sleeps, its
    second returns at once.  Each returns its pid."""
    i = _index()
    starts[i] = starts.get(i, 0) + 1
    if i == 0:
        return ("done" if go.wait(90) else "never told"), os.getpid()
    if starts[i] == 1:
        time.sleep(120)
    return "back", os.getpid()


def test_one_task_is_started_again_into_the_running_cluster_and_terminate_is_no_error():
    m = mpr.manager()
    go, starts = m.Event(), m.dict()
    runner = mpr.MultiProcessRunner(wait_or_sleep, mwtb.create_cluster_spec(num_workers=2),
                                    args=(go, starts))
    runner.start()
    pids = [runner.get_process_id("worker", i) for i in (0, 1)]
    assert None not in pids
    # Worker 1's first process must have counted its start before it ends,
    # or its second would take itself for the first and sleep.
    until = time.monotonic() + 60
    while len(starts) < 2 and time.monotonic() < until:
        time.sleep(0.05)
    runner.terminate("worker", 1)
    assert not runner.process_exists("worker", 1) and runner.process_exists("worker", 0)
    with pytest.raises(ValueError, match="worker-0 is still running"):
        runner.start_single_process("worker", 0)
    runner.start_single_process("worker", 1)
    assert runner.get_process_id("worker", 0) == pids[0]
    assert runner.get_process_id("worker", 1) not in (None, pids[1])
    go.set()
    assert runner.join(timeout=60).return_value == [("done", pids[0]),
                                                    ("back", runner.results[-1].workers[1].pid)]
    assert dict(starts) == {0: 1, 1: 2} and runner.results[-1].workers[1].restarts == 1


def one_never_reduces():
    strategy = _strategy()
    if _index() == 2:
        time.sleep(300)
    return _sum(strategy)


def test_a_hang_ends_at_joins_timeout_with_the_verdict_first():
    # three workers: two in the all-reduce outvote the one that never came
    runner = mpr.MultiProcessRunner(one_never_reduces, mwtb.create_cluster_spec(num_workers=3))
    runner.start()
    started = time.monotonic()
    with pytest.raises(mpr.SubprocessTimeoutError) as e:
        runner.join(timeout=20)
    assert time.monotonic() - started < 20 + 30
    text = str(e.value)
    assert text.startswith("HANG") and "culprit: worker 2" in text.splitlines()[0], text
    assert "timeout was set to 20s" in text
    assert e.value.mpr_result.return_value == []


def _mark_initialized():
    os.environ["POOL_INITIALIZED"] = "1"


def index_plus(k):
    return _index() + k if os.environ.get("POOL_INITIALIZED") == "1" else None


def test_the_pool_runs_its_initializer_then_the_function_on_every_task():
    pool = mpr.MultiProcessPoolRunner(mwtb.create_cluster_spec(num_workers=2),
                                      initializer=_mark_initialized)
    assert pool.run(index_plus, args=(10,)) == [10, 11]
    pool.shutdown()


_kept: dict = {}


def make_a_strategy():
    _kept["strategy"], _kept["pid"] = _strategy(), os.getpid()


def reduce_with_the_kept_strategy():
    return _sum(_kept["strategy"]), _kept["pid"] == os.getpid()


def exit_on_one():
    if _index() == 1:
        os._exit(3)
    return "fine"


_module_pool = mpr.MultiProcessPoolRunner(mwtb.create_cluster_spec(num_workers=1))


def test_a_pool_used_inside_a_task_is_the_task_s_own():
    """TensorFlow's test_nested_pool: a function made in the test (sent by
    value, with the globals it names) runs the module's pool in a task."""
    def run_the_module_pool():
        return _module_pool.run(_index)
    try:
        assert _module_pool.run(run_the_module_pool) == [[0]]
    finally:
        _module_pool.shutdown()


def test_the_pool_keeps_its_processes_and_their_state_across_runs(capsys):
    """As TensorFlow's pool: a strategy made in one run is there in the
    next (cross_device_ops_test enables collectives in setUp, then runs);
    a run during which a task ends raises with the verdict, and the next
    starts a fresh cluster, saying so."""
    pool = mpr.MultiProcessPoolRunner(mwtb.create_cluster_spec(num_workers=2))
    try:
        assert pool.run(make_a_strategy) == []
        assert pool.run(reduce_with_the_kept_strategy) == [(2.0, True), (2.0, True)]
        with pytest.raises(Exception, match="worker 1") as raised:
            pool.run(exit_on_one)
        assert raised.value.run_result.workers[1].exit_code == 3
        assert pool.run(_index) == [0, 1]
        assert "the pool's cluster ended" in capsys.readouterr().err
    finally:
        pool.shutdown()


def _task_type():
    return mwtb.get_task_type()


def _raises():
    raise ValueError("This is an error.")


def test_parameter_servers_run_fn_as_every_task_does():
    """TensorFlow's runner runs ``fn`` on every task of its spec, the
    parameter servers included (``multi_process_runner_test``'s
    ``test_multi_process_runner`` and ``..._error_propagates_from_subprocesses``)."""
    result = mpr.run(_task_type, mwtb.create_cluster_spec(num_workers=2, num_ps=3,
                                                          has_chief=True))
    assert sorted(result.return_value) == ["chief", "ps", "ps", "ps", "worker", "worker"]
    runner = mpr.MultiProcessRunner(_raises, mwtb.create_cluster_spec(num_workers=1, num_ps=1),
                                    max_run_time=20)
    runner.start()
    with pytest.raises(ValueError, match="This is an error."):
        runner.join()


POOL_LEFT_RUNNING = """
from harness.compat import multi_process_runner as mpr
from harness.compat import multi_worker_test_base as mwtb

POOL = None


def one():
    return 1


def test_a_pool_left_running():
    global POOL
    POOL = mpr.MultiProcessPoolRunner(mwtb.create_cluster_spec(num_workers=2))
    assert POOL.run(one) == [1, 1]
"""


def test_a_pool_left_running_at_exit_is_shut_down_not_killed(pytester):
    """A module-level pool, as TensorFlow's test files keep one, is still
    running as the session exits: it is shut down before the launcher
    kills the workers left, so no task is reported dead."""
    pytester.makepyfile(pool_case=POOL_LEFT_RUNNING)
    result = pytester.runpytest_subprocess("-q", "-n", "0", "-p", "no:cacheprovider",
                                           "pool_case.py", timeout=120)
    result.assert_outcomes(passed=1)
    out = result.stdout.str() + result.stderr.str()
    assert "died" not in out and "ignoring the pool's error" not in out, out


def chief_returns_the_others_wait():
    if json.loads(os.environ["TF_CONFIG"])["task"]["type"] != "chief":
        time.sleep(1000)   # a server that runs until it is ended
    return "chief done"


@pytest.mark.parametrize("dependence_on_chief", [True, False])
def test_the_chief_s_exit_ends_its_cluster_under_dependence_on_chief(dependence_on_chief):
    runner = mpr.MultiProcessRunner(chief_returns_the_others_wait, mwtb.create_cluster_spec(
        has_chief=True, num_workers=1), dependence_on_chief=dependence_on_chief)
    runner.start()
    t0 = time.monotonic()
    if dependence_on_chief:
        assert runner.join(timeout=60).return_value == ["chief done"]
        assert time.monotonic() - t0 < 30   # the worker ended 3 s after the chief left
    else:
        with pytest.raises(mpr.SubprocessTimeoutError):
            runner.join(timeout=8)


def serve_or_count(steps):
    if _index() == 0:
        time.sleep(1000)   # ended by the test
    for i in range(steps):
        print(f"index 1, iteration {i}", flush=True)
        time.sleep(0.5)
    return "counted"


def test_a_terminated_task_s_peers_run_on_past_the_grace(monkeypatch):
    """TensorFlow's test_termination: the test ends one task and its peer
    goes on to its end (under a 1 s grace for a failure's peers)."""
    from harness.compat import runner as runner_module
    monkeypatch.setattr(runner_module, "GRACE_SEC", 1.0)
    runner = mpr.MultiProcessRunner(serve_or_count, mwtb.create_cluster_spec(num_workers=2),
                                    args=(8,), return_output=True)
    runner.start()
    runner.terminate("worker", 0)
    r = runner.join(timeout=60)
    assert r.return_value == ["counted"]
    assert any("index 1, iteration 7" in line for line in r.stdout), r.stdout


def sleep_then_return(seconds):
    time.sleep(seconds)
    return "slept"


def test_join_without_a_timeout_waits_past_the_hang_timeout(monkeypatch):
    from harness.compat import runner as runner_module
    monkeypatch.setattr(runner_module, "DEFAULT_TIMEOUT_SEC", 3)
    runner = mpr.MultiProcessRunner(sleep_then_return, mwtb.create_cluster_spec(num_workers=1),
                                    args=(8,))
    runner.start()
    assert runner.join(timeout=None).return_value == ["slept"]


def run_a_cluster_of_its_own():
    return mpr.run(_index, mwtb.create_cluster_spec(num_workers=1), timeout=90).return_value


def test_a_cluster_started_inside_a_task_leaves_the_test_process_s_clusters_working():
    """TensorFlow's runner's own tests start a cluster inside a task; the
    test process's later clusters must still start (its forkserver's and
    its manager's sockets untouched)."""
    r = mpr.run(run_a_cluster_of_its_own, mwtb.create_cluster_spec(num_workers=1), timeout=120)
    assert r.return_value == [[0]]
    assert mpr.run(_index, mwtb.create_cluster_spec(num_workers=2), timeout=90).return_value \
        == [0, 1]


CASES = os.path.join(os.path.dirname(__file__), "compat_cases")


def test_tensorflows_combinations_run_on_the_harness_with_pytests_options(pytester):
    """TensorFlow's ``combinations`` under ``pytest -q -x -k ... -n 0``, with
    only ``install()`` in a conftest: a workers-only preset and the chief
    preset run on harness workers (the pool runner of ``strategy_combinations``),
    a GPU preset skips for the GPUs missing, a parameter-server preset runs
    (its chief runs the test; its servers serve until the chief ends); absl
    never sees pytest's options."""
    from harness.compat import spec
    with open(os.path.join(CASES, "combinations_case.py")) as f:
        pytester.makepyfile(combinations_case=f.read())
    pytester.makeconftest("import harness.compat\nharness.compat.install()\n")
    chief = "" if spec.shapes_supported() else " and not 2x1CPU"
    result = pytester.runpytest_subprocess(
        "-q", "-x", "-n", "0", "-p", "no:cacheprovider", "-rs",
        "-k", f"test_sum and not GPUNoShare{chief}", "combinations_case.py", timeout=200)
    out = result.stdout.str()
    assert "UnrecognizedFlagError" not in out and "NotInitializedError" not in out, out
    result.assert_outcomes(passed=2 if chief else 3, skipped=1)
    assert "required GPUs are available" in out, out


def test_a_parameter_server_multi_process_cluster_serves_its_test_process(pytester,
                                                                         monkeypatch):
    """A ``MultiProcessCluster`` of 2 workers and a parameter server, as
    tf-keras's parameter-server tests start theirs in ``setUpClass``: the
    test process coordinates it at the spec's addresses, its functions run
    on the workers, and a worker killed and started again (``kill_task``,
    ``start_task``) serves again."""
    with open(os.path.join(CASES, "multi_process_cluster_case.py")) as f:
        pytester.makepyfile(multi_process_cluster_case=f.read())
    pytester.makeconftest("import harness.compat\nharness.compat.install()\n")
    # The test process converts its tf.function with AutoGraph, which writes
    # a module to the temp directory and leaves its compiled bytecode there:
    # a directory of its own, short enough for the Unix sockets made in it.
    own = tempfile.mkdtemp(prefix="mwms-")
    monkeypatch.setenv("TMPDIR", own)
    try:
        result = pytester.runpytest_subprocess("-q", "-n", "0", "-p", "no:cacheprovider",
                                               "multi_process_cluster_case.py", timeout=200)
    finally:
        shutil.rmtree(own, ignore_errors=True)
    result.assert_outcomes(passed=1, skipped=1)   # tf.test.TestCase's test_session skips


def test_a_file_importing_the_runner_from_harness_compat_runs_under_pytests_options(pytester):
    """A file that imports ``multi_process_runner`` and ``multi_worker_test_base``
    from ``harness.compat``, without ``install()``, under ``pytest -q -x -rfEs
    -k ... --junitxml``: TensorFlow's ``combinations`` read an absl flag in the
    test process, and absl once parsed pytest's options from ``sys.argv``
    there (``UnrecognizedFlagError: Unknown command line flag 'q'``)."""
    import xml.etree.ElementTree as ET
    with open(os.path.join(CASES, "import_case.py")) as f:
        pytester.makepyfile(import_case=f.read())
    result = pytester.runpytest_subprocess(
        "-q", "-x", "-rfEs", "-n", "0", "-p", "no:cacheprovider", "-k", "not deselected",
        "--junitxml=report.xml", "import_case.py", timeout=200)
    out = result.stdout.str()
    assert "UnrecognizedFlagError" not in out, out
    # tf.test.TestCase's test_session skips ("Not a test"), in -rs's summary
    result.assert_outcomes(passed=3, skipped=1, deselected=1)
    assert "SKIPPED [1]" in out and "Not a test" in out, out
    cases = ET.parse(pytester.path / "report.xml").getroot().iter("testcase")
    reported = {case.get("name"): [child.tag for child in case] for case in cases}
    assert reported == {"test_all_reduce_after_the_barrier_test_mode_eager": [],
                        "test_cluster_spec_in_each_mode_test_mode_eager": [],
                        "test_cluster_spec_in_each_mode_test_mode_graph": [],
                        "test_session": ["skipped"]}, reported


REACH_CASE = """
import socket

from tensorflow.python.distribute import multi_process_runner, multi_worker_test_base


def reach(port):
    with socket.socket() as s:
        s.settimeout(5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_tasks_reach_a_service_of_the_test_process():
    with socket.socket() as service:
        service.bind(("127.0.0.1", 0))
        service.listen()
        r = multi_process_runner.run(reach, multi_worker_test_base.create_cluster_spec(
            num_workers=2), args=(service.getsockname()[1],))
    assert r.return_value == [True, True]
"""


def test_the_session_s_options_reach_every_cluster_install_starts(pytester):
    """A test that serves something in the test process (tf.data service's
    dispatcher, in TensorFlow's input_lib_test) reaches it from its tasks
    under ``--mwms-network=host``: the session's options reach the
    clusters ``install()`` starts."""
    pytester.makeconftest("import harness.compat\nharness.compat.install()\n")
    pytester.makepyfile(reach_case=REACH_CASE)
    result = pytester.runpytest_subprocess("-q", "-n", "0", "-p", "no:cacheprovider",
                                           "--mwms-network=host", "reach_case.py", timeout=200)
    result.assert_outcomes(passed=1)


PREWARM_CONFTEST = """
import time

BEFORE = time.time()
import harness.compat

harness.compat.install()   # imports TensorFlow
INSTALLED = time.time()
"""

PREWARM_CASE = """
import psutil

from harness.launch.local import forkserver_pid


def test_no_cluster_started_yet():
    import conftest
    pid = forkserver_pid()
    started = None if pid is None else psutil.Process(pid).create_time()
    if hasattr(conftest, "INSTALLED"):
        # By the first half of install(): beside TensorFlow's import.
        midway = (conftest.BEFORE + conftest.INSTALLED) / 2
        print("forkserver started by midway:", started is not None and started < midway)
    else:
        print("forkserver started:", started is not None)
"""


def test_install_starts_the_forkserver_beside_tensorflows_import(pytester):
    """A conftest's ``install()`` routes clusters that no test names as a
    fixture: the forkserver's TensorFlow import starts first, beside the
    test process's own (``install()`` imports TensorFlow), not in the
    first multi-worker case."""
    pytester.makeconftest(PREWARM_CONFTEST)
    pytester.makepyfile(prewarm_case=PREWARM_CASE)
    result = pytester.runpytest_subprocess("-q", "-s", "-n", "0", "-p", "no:cacheprovider",
                                           "prewarm_case.py", timeout=120)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*forkserver started by midway: True*"])


def test_a_session_without_install_or_the_fixture_starts_no_forkserver(pytester):
    pytester.makeconftest("")
    pytester.makepyfile(prewarm_case=PREWARM_CASE)
    result = pytester.runpytest_subprocess("-q", "-s", "-n", "0", "-p", "no:cacheprovider",
                                           "prewarm_case.py", timeout=120)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*forkserver started: False*"])
