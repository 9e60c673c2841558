"""Hostile functions: each gets a clear outcome or message, and nothing hangs
or stays behind."""
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

import harness
from harness.core.linux import wait_gone
from harness.launch.manager import guarded_manager

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leftover_workers")]




def _with_strategy():
    import tensorflow as tf
    return tf.distribute.MultiWorkerMirroredStrategy()


@pytest.mark.parametrize("body,code", [
    ("sys.exit(3)", 3),
    ("os._exit(0)", 0),
    ("os.abort()", -signal.SIGABRT),
])
def test_exits_without_returning_are_crashes(mwms_cluster, body, code):
    def fn():
        if harness.context().index == 0:
            eval(body, {"sys": sys, "os": os})
        return "ok"
    result = mwms_cluster.run(fn, timeout=10, grace=1)
    result.assert_crashed(culprits=[0])
    assert result.workers[0].exit_code == code
    assert result.workers[-1].return_value == "ok"


def test_exit_before_strategy_while_peers_wait_in_it(mwms_cluster):
    def fn():
        if harness.context().index == 0:
            os._exit(0)
        _with_strategy()
    result = mwms_cluster.run(fn, timeout=10, grace=1)
    result.assert_crashed(culprits=[0])


def test_fifty_megabytes_of_output_is_capped(mwms_cluster):
    def chatty():
        line = "x" * 99 + "\n"
        for _ in range(500_000):
            sys.stdout.write(line)
        print("THE END")
        return "done"
    result = mwms_cluster.run(chatty, timeout=60)
    result.assert_completed()
    log = result.workers[0].log
    assert len(log) < 2 * 1024 * 1024
    assert "bytes of log cut" in log and log.rstrip().endswith("THE END")


def test_child_process_that_would_outlive_the_worker_is_killed(mwms_cluster, tmp_path):
    def spawner():
        # One child in the worker's group, one in a session of its own.
        a = subprocess.Popen(["sleep", "1000"])
        b = subprocess.Popen(["sleep", "1000"], start_new_session=True)
        return [a.pid, b.pid]
    result = mwms_cluster.run(spawner)
    result.assert_completed()
    pids = [p for pair in result.return_values for p in pair]
    assert not wait_gone(pids, 3)


def test_stray_thread_does_not_hold_the_run(mwms_cluster):
    def leaves_a_thread():
        threading.Thread(target=time.sleep, args=(1000,), daemon=False).start()
        return harness.context().index
    t0 = time.monotonic()
    result = mwms_cluster.run(leaves_a_thread, timeout=10)
    result.assert_completed()
    assert time.monotonic() - t0 < 5


def test_fn_without_a_strategy_completes(mwms_cluster):
    result = mwms_cluster.run(lambda: harness.context().index * 2)
    result.assert_completed()
    assert result.return_values == [2 * i for i in range(mwms_cluster.num_workers)]


def _strategies(count, change_cluster=False, barrier=None):
    """``count`` strategies, one after another, each with a variable and an
    all-reduce; with ``change_cluster``, TF_CONFIG's ports move before the second.
    With ``barrier``, every worker finishes a strategy's all-reduce before
    any makes the next, as TensorFlow's own continuous-run test lines them
    up: a new strategy resets the worker's collective state, and a peer
    still receiving from the old one fails ("Delete called on non-empty
    BufRendezvous")."""
    import json
    import os

    import tensorflow as tf
    sums = []
    for k in range(count):
        if change_cluster and k == 1:
            config = json.loads(os.environ["TF_CONFIG"])
            config["cluster"]["worker"] = [f"{a.rsplit(':', 1)[0]}:{int(a.rsplit(':', 1)[1]) + 1}"
                                           for a in config["cluster"]["worker"]]
            os.environ["TF_CONFIG"] = json.dumps(config)
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            tf.Variable(float(k), name=f"v{k}")
        sums.append(float(strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)),
                                          axis=None)))
        if barrier is not None:
            barrier.wait(timeout=20)
    return sums


def test_more_strategies_on_the_same_cluster_run_and_the_harness_follows_the_newest(
        mwms_cluster):
    """TensorFlow 2.21, measured: strategies made one after another on one
    TF_CONFIG all-reduce correctly once the workers are lined up between
    them; the replica check reads the last one's variables."""
    n = mwms_cluster.num_workers
    with guarded_manager() as manager:
        result = mwms_cluster.run(_strategies, args=(3, False, manager.Barrier(n)), timeout=20,
                                  check_replicas=True)
    result.assert_completed()
    assert result.return_values == [[float(n)] * 3] * n
    assert result.replicas.variables == (1,) * n and result.replicas.divergence is None
    assert [p.name for p in result.observation.workers[0].variables] == ["v2:0"]


def test_a_strategy_on_a_changed_cluster_is_a_clear_failure_not_a_hang(mwms_cluster):
    result = mwms_cluster.run(_strategies, args=(2, True), timeout=20)
    assert result.outcome == "failed", result.report()
    assert result.error == "SecondStrategyError"
    assert "changed cluster" in result.workers[0].exception.message


def test_fifty_runs_keep_parent_memory_and_fds_flat(mwms_cluster):
    me = psutil.Process()

    def sample():
        return me.memory_info().rss, me.num_fds()

    for _ in range(5):  # warm up: imports, caches, the forkserver
        mwms_cluster.run(lambda: 1).assert_completed()
    rss0, fds0 = sample()
    t0 = time.monotonic()
    for _ in range(50):
        mwms_cluster.run(lambda: 1).assert_completed()
    rss1, fds1 = sample()
    print(f"\n50 runs in {time.monotonic() - t0:.1f}s: parent RSS {rss0 / 2**20:.1f} -> "
          f"{rss1 / 2**20:.1f} MiB, open fds {fds0} -> {fds1}")
    assert fds1 - fds0 <= 2
    assert rss1 - rss0 < 30 * 2**20


UNGUARDED = """
from harness.controller import Cluster
from harness.settings import RunSettings
print("main module imported as", __name__, flush=True)
SCALE = 3

def scaled(text):
    return SCALE * len(text)

result = Cluster(RunSettings(workers=2, timeout=20)).run(scaled, args=("ab",))
print(result.report())
print("values", result.return_values)
"""


def test_a_script_that_starts_a_cluster_unguarded_runs_its_function_once_per_worker(tmp_path):
    """A forked worker does not import the parent's main module again (it
    runs the harness's entry point and ``fn``, which dill carries by value
    when it lives in ``__main__``): a script that starts a cluster at its
    top level, with no ``if __name__ == '__main__':``, runs its function on
    each worker and is not started again inside them."""
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=100, cwd=tmp_path).stdout
    assert "COMPLETED" in out, out
    assert "values [6, 6]" in out, out
    assert out.count("main module imported as") == 1, out


SQUAT = """
import os, sys
for port in range(1024, 65536):
    try:
        os.close(os.open(os.path.join(sys.argv[1], str(port)),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644 if port % 2 else 0))
    except FileExistsError:
        pass
"""


def test_runs_pass_while_another_user_squats_every_port_name(tmp_path):
    """Another local user fills the shared state directory with a file under
    every port's name (half of them unreadable): this user's runs still
    reserve their ports (held by claims, not by those names) and complete."""
    import shutil
    import tempfile
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or not setpriv:
        pytest.skip("needs root and setpriv, to act as another user")
    shared = tempfile.mkdtemp(prefix="mwms-squat-")
    try:
        os.chmod(shared, 0o1777)
        state = os.path.join(shared, "state")
        os.mkdir(state)
        os.chmod(state, 0o1777)
        squat = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
                                "--", "/usr/bin/python3", "-I", "-c", SQUAT, state],
                               capture_output=True, text=True, cwd="/", timeout=120)
        if squat.returncode != 0:
            pytest.skip(f"cannot act as uid 65534 here: {squat.stderr.strip()[-300:]}")
        assert len(os.listdir(state)) == 65536 - 1024
        cluster = harness.Cluster(workers=2, timeout=30, state_dir=state)
        for _ in range(2):
            cluster.run(lambda: harness.context().index).assert_completed()
        assert len(os.listdir(state)) == 65536 - 1024
    finally:
        shutil.rmtree(shared, ignore_errors=True)
