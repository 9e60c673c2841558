"""No process outlives the test that started it: not on a hang, Ctrl-C,
pytest-timeout firing, or pytest itself being SIGKILLed."""
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from harness.network import namespace as netns
from harness.core.linux import wait_gone
from helpers import tensorflow_pids

pytestmark = pytest.mark.timeout(120)

# The inner test: every worker records its pid and starts a grandchild
# (`sleep`) that would outlive it if nothing took it down; then worker 0
# blocks in an all-reduce nobody else joins while the others sleep.
HUNG = """
import os, subprocess, time
import pytest
import harness

def stuck():
    import tensorflow as tf
    ctx = harness.context()
    piddir = os.environ["MWMS_PIDDIR"]
    child = subprocess.Popen(["sleep", "1000"])
    with open(os.path.join(piddir, f"worker-{ctx.index}"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    if ctx.index == 0:
        strategy.reduce(tf.distribute.ReduceOp.SUM,
                        strategy.run(lambda: tf.constant(1.0)), axis=None)
    time.sleep(1000)

@pytest.mark.timeout(TEST_TIMEOUT)
def test_hung(mwms_cluster):
    mwms_cluster.run(stuck, timeout=HARNESS_TIMEOUT, faults=FAULTS)
"""


def _name(pid):
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return None


def _start_inner(pytester, tmp_path, test_timeout=300, harness_timeout=200, workers=2,
                 faults="()"):
    piddir = tmp_path / "pids"
    piddir.mkdir()
    pytester.makepyfile(test_inner=HUNG.replace("TEST_TIMEOUT", str(test_timeout))
                        .replace("HARNESS_TIMEOUT", str(harness_timeout))
                        .replace("FAULTS", faults))
    env = dict(os.environ, MWMS_PIDDIR=str(piddir))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s",
         f"--mwms-workers={workers}", "test_inner.py"],
        cwd=pytester.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while len(list(piddir.iterdir())) < workers:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "workers never started"
        time.sleep(0.1)
    time.sleep(0.5)  # let worker 0 enter its collective
    pids = []
    for f in piddir.iterdir():
        pids.extend(int(x) for x in f.read_text().split())
    # The inner pytest's forkserver is a TensorFlow process too.
    pids.extend(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
    assert all(psutil.pid_exists(p) for p in pids)
    return proc, sorted(set(pids))


def test_sigkill_of_pytest_takes_every_worker_down(pytester, tmp_path):
    """Workers, their grandchildren, the forkserver and, where the run is
    isolated, the anchor holding its network namespace (see harness.network.namespace)."""
    proc, pids = _start_inner(pytester, tmp_path)
    if netns.available()[0]:
        assert any(_name(p) == "cat" for p in pids), "no namespace anchor to watch"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    t0 = time.monotonic()
    left = wait_gone(pids, 10)
    assert not left, f"still alive {time.monotonic() - t0:.1f}s after SIGKILL: {left}"


@pytest.mark.skipif(not netns.switch_available()[0], reason=f"no namespace per worker here: "
                    f"{netns.switch_available()[1]}")
def test_sigkill_of_pytest_takes_a_switched_network_down(pytester, tmp_path):
    """A run with network faults (a namespace per worker on a bridge, and
    the proxy between them): the anchor, the holder of every worker's
    namespace and the proxy go too."""
    proc, pids = _start_inner(pytester, tmp_path, faults=(
        "[__import__('harness.faults').faults.Partition(1, 99), "
        "__import__('harness.faults').faults.Latency(0, 99, ms=1)]"))
    try:
        holders = [p for p in pids if _cmdline(p)[:2] == ["sleep", "2147483647"]]
        assert len(holders) == 2, [(p, _cmdline(p)) for p in pids]
        assert [p for p in pids if "harness.network.proxy" in _cmdline(p)], "no proxy to watch"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    left = wait_gone(pids, 10)
    assert not left, f"still alive after SIGKILL: {[(p, _cmdline(p)) for p in left]}"


def _cmdline(pid):
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def test_ctrl_c_stops_the_run_and_its_workers(pytester, tmp_path):
    proc, pids = _start_inner(pytester, tmp_path)
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=30)[0]
    assert "KeyboardInterrupt" in out
    left = wait_gone(pids, 5)
    assert not left, left


def test_pytest_timeout_backstop_cleans_up(pytester, tmp_path):
    """pytest-timeout firing inside run() (harness timeout longer than the
    test's) still leaves nothing behind."""
    proc, pids = _start_inner(pytester, tmp_path, test_timeout=8, harness_timeout=100)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 1 and "Timeout" in out, out
    left = wait_gone(pids, 5)
    assert not left, left


def test_harness_hang_kills_grandchildren(mwms_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("MWMS_PIDDIR", str(tmp_path))
    ns = {}
    exec(compile(HUNG.replace("TEST_TIMEOUT", "1").replace("HARNESS_TIMEOUT", "1"),
                 "hung", "exec"), ns)
    result = mwms_cluster.run(ns["stuck"], timeout=2)
    assert result.outcome == "hang"
    pids = [int(x) for f in tmp_path.iterdir() for x in f.read_text().split()]
    assert len(pids) == 2 * mwms_cluster.num_workers
    assert not wait_gone(pids, 3)
    assert not wait_gone(tensorflow_pids(), seconds=2)


def test_nothing_left_in_the_temp_directory_after_a_run(mwms_cluster):
    """Logs, stacks and what TensorFlow writes to the temp directory (autograph
    makes a file per traced function per worker) go with the run's own
    0700 directory; fn sees that directory as its TMPDIR."""
    import tempfile
    from harness.workloads import allreduce_loop

    def mine():
        return {name for name in os.listdir(tempfile.gettempdir())
                if name.startswith(("__autograph_generated_file", "pytest-mwms-"))}

    def where():
        import tempfile as worker_tempfile
        return worker_tempfile.gettempdir(), allreduce_loop(3)

    before = mine()
    result = mwms_cluster.run(where, timeout=60)
    result.assert_completed()
    run_dirs = {d for d, _ in result.return_values}
    assert len(run_dirs) == 1 and os.path.basename(run_dirs.pop()).startswith("pytest-mwms-")
    assert mine() <= before, mine() - before
