"""No process outlives the test that started it: not on a hang, Ctrl-C,
pytest-timeout firing, or pytest itself being SIGKILLed."""
import os
import signal
import subprocess
import sys
import shutil
import tempfile
import time

import psutil
import pytest

from harness.network import namespace as netns
from harness.core.linux import wait_gone
from harness.launch import scratch
from harness.launch.state_dir import default_state_dir
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

@pytest.fixture(autouse=True)
def warm(mwms_cluster):
    # The fork server is up, TensorFlow imported, before the test's own time
    # starts: a busy machine's start-up must not use up a short timeout.
    mwms_cluster.run(lambda: None, timeout=120).assert_completed()

@pytest.mark.timeout(TEST_TIMEOUT, func_only=True)
def test_hung(mwms_cluster):
    mwms_cluster.run(stuck, timeout=HARNESS_TIMEOUT, faults=FAULTS)
"""


def _name(pid):
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return None


@pytest.fixture
def inner_tmp():
    """The inner pytest's temp directory.  Short: the forkserver's socket
    lives in it, and a socket's path is at most 107 bytes."""
    path = tempfile.mkdtemp(prefix="mwms-inner-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _start_inner(pytester, tmp_path, inner_tmp, test_timeout=300, harness_timeout=200, workers=2,
                 faults="()"):
    piddir = tmp_path / "pids"
    piddir.mkdir()
    pytester.makepyfile(test_inner=HUNG.replace("TEST_TIMEOUT", str(test_timeout))
                        .replace("HARNESS_TIMEOUT", str(harness_timeout))
                        .replace("FAULTS", faults))
    # The inner pytest's temp directory is its own, to be found empty once it
    # is gone; its ports are reserved among everyone else's.
    env = dict(os.environ, MWMS_PIDDIR=str(piddir), TMPDIR=inner_tmp,
               MWMS_STATE_DIR=os.environ.get("MWMS_STATE_DIR") or default_state_dir())
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s",
         f"--mwms-workers={workers}", "test_inner.py"],
        cwd=pytester.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # A pytest started in the background of a shell without job control
        # (a CI script's `cmd &`) ignores SIGINT, and so would its children;
        # a terminal's pytest gets Ctrl-C.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while len(list(piddir.iterdir())) < workers:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "workers never started"
        time.sleep(0.1)
    time.sleep(0.5)  # let worker 0 enter its collective
    pids = []
    for f in piddir.iterdir():
        pids.extend(int(x) for x in f.read_text().split())
    assert all(psutil.pid_exists(p) for p in pids)
    # The inner pytest's forkserver is a TensorFlow process too.  Its other
    # children may be short-lived helpers (a compiler probe, ldconfig), gone
    # by now without anything to clean up.
    pids.extend(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
    return proc, sorted(set(pids))


def test_sigkill_of_pytest_takes_every_worker_down(pytester, tmp_path, inner_tmp):
    """Workers, their grandchildren, the forkserver and, where the run is
    isolated, the anchor holding its network namespace (see harness.network.namespace)."""
    proc, pids = _start_inner(pytester, tmp_path, inner_tmp)
    if netns.available()[0]:
        assert any(_name(p) == "cat" for p in pids), "no namespace anchor to watch"
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    t0 = time.monotonic()
    left = wait_gone(pids, 10)
    assert not left, f"still alive {time.monotonic() - t0:.1f}s after SIGKILL: {left}"
    assert_temp_directory_emptied(inner_tmp)


QUICK = """
import harness

def test_quick(mwms_cluster):
    mwms_cluster.run(lambda: harness.context().index).assert_completed()
"""


def test_the_next_run_removes_what_a_run_killed_with_its_sweeper_left(
        pytester, tmp_path, inner_tmp):
    """A cgroup killed whole (a CI job's time-out, a container's OOM kill)
    takes the sweeper with pytest; the next pytest run removes what the
    first left in the temp directory."""
    proc, pids = _start_inner(pytester, tmp_path, inner_tmp)
    sweepers = [p for p in psutil.process_iter(["cmdline"])
                if scratch.__file__ in " ".join(p.info["cmdline"] or ())
                and inner_tmp in " ".join(p.info["cmdline"] or ())]
    assert len(sweepers) == 1, sweepers
    # The sweeper first: it starts sweeping the moment pytest's end closes
    # its pipe, so killing it second lets it act in between, as a cgroup's
    # kill, all at once, would not.
    for p in [*sweepers, psutil.Process(proc.pid)]:
        p.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert not wait_gone(pids + [s.pid for s in sweepers], 10)
    left = sorted(os.listdir(inner_tmp))
    assert any(n.startswith(scratch.PREFIX) for n in left), left
    assert any(n.startswith("pymp-") for n in left), left
    pytester.makepyfile(test_quick=QUICK)
    env = dict(os.environ, TMPDIR=inner_tmp,
               MWMS_STATE_DIR=os.environ.get("MWMS_STATE_DIR") or default_state_dir())
    second = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--mwms-workers=2",
         "test_quick.py"], cwd=pytester.path, env=env, capture_output=True, text=True,
        timeout=100)
    assert second.returncode == 0, second.stdout[-3000:]
    assert not set(left) & set(os.listdir(inner_tmp))
    assert_temp_directory_emptied(inner_tmp)


def assert_temp_directory_emptied(path, seconds=10 + scratch.QUIET_SECONDS):
    """What the inner pytest left in its temp directory is gone within
    ``seconds`` (the sweeper's work when pytest was killed)."""
    deadline = time.monotonic() + seconds
    while os.listdir(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.listdir(path), sorted(os.listdir(path))


@pytest.mark.skipif(not netns.switch_available()[0], reason=f"no namespace per worker here: "
                    f"{netns.switch_available()[1]}")
def test_sigkill_of_pytest_takes_a_switched_network_down(pytester, tmp_path, inner_tmp):
    """A run with network faults (a namespace per worker on a bridge, and
    the proxy between them): the anchor, the holder of every worker's
    namespace and the proxy go too."""
    proc, pids = _start_inner(pytester, tmp_path, inner_tmp, faults=(
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
    assert_temp_directory_emptied(inner_tmp)


def _cmdline(pid):
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error:
        return []


def _ended(proc, pids, seconds):
    """The inner pytest's output once it has ended by itself within
    ``seconds``; if it has not, it and what it started are killed, and the
    test fails with what it printed so far."""
    try:
        return proc.communicate(timeout=seconds)[0]
    except subprocess.TimeoutExpired:
        # pytest's faulthandler prints every thread's stack on SIGABRT.
        proc.send_signal(signal.SIGABRT)
        try:
            out = proc.communicate(timeout=10)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        wait_gone(pids, 10)
        pytest.fail(f"the inner pytest was still running {seconds} s on:\n{out[-6000:]}")


def test_ctrl_c_stops_the_run_and_its_workers(pytester, tmp_path, inner_tmp):
    proc, pids = _start_inner(pytester, tmp_path, inner_tmp)
    proc.send_signal(signal.SIGINT)
    out = _ended(proc, pids, 30)
    assert "KeyboardInterrupt" in out
    left = wait_gone(pids, 5)
    assert not left, left
    assert_temp_directory_emptied(inner_tmp)


@pytest.mark.parametrize("gaps", [(0.05,), (0.1, 0.2), (0.3, 0.05)],
                         ids=["twice", "three-times", "twice-late"])
def test_a_second_and_third_ctrl_c_end_the_session_and_every_worker(
        pytester, tmp_path, inner_tmp, gaps):
    """Ctrl-C again while the first one's teardown kills the workers: the
    teardown finishes (a Ctrl-C waits for its end), and no worker is left
    for ``multiprocess`` to join at pytest's exit."""
    proc, pids = _start_inner(pytester, tmp_path, inner_tmp)
    proc.send_signal(signal.SIGINT)
    for gap in gaps:
        time.sleep(gap)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    _ended(proc, pids, 10)
    left = wait_gone(pids, 5)
    assert not left, [(p, _cmdline(p)) for p in left]
    assert_temp_directory_emptied(inner_tmp)


# A module the inner session's forkserver imports last (``--mwms-preload``):
# it marks the moment, then holds the server, so that the session's first
# start is still waiting on it when Ctrl-C comes, and would wait far longer
# than the 10 s pytest has to end.
SLOW_PRELOAD = """
import os, time
open(os.environ["MWMS_PRELOADING"], "w").close()
time.sleep(120)
"""


def test_ctrl_c_twice_while_the_first_workers_start_ends_the_session(pytester, tmp_path,
                                                                     inner_tmp):
    """The session's first run, its workers' starts waiting on a forkserver
    still importing: a second Ctrl-C while the first one's clean-up waits for
    those starts ends the session too, every started worker killed."""
    pytester.makepyfile(test_inner=QUICK, slow_preload=SLOW_PRELOAD)
    marker = tmp_path / "preloading"
    env = dict(os.environ, TMPDIR=inner_tmp, MWMS_PRELOADING=str(marker),
               PYTHONPATH=os.pathsep.join(filter(None, [str(pytester.path),
                                                        os.environ.get("PYTHONPATH")])),
               MWMS_STATE_DIR=os.environ.get("MWMS_STATE_DIR") or default_state_dir())
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s",
         "--mwms-workers=2", "--mwms-preload=slow_preload", "test_inner.py"],
        cwd=pytester.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = set()
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        seen.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
        time.sleep(0.05)
    time.sleep(1)   # collection is long over: the first run's start is waiting
    seen.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    out = _ended(proc, sorted(seen), 10)
    assert "KeyboardInterrupt" in out, out[-3000:]
    left = wait_gone(sorted(seen), 5)
    assert not left, [(p, _cmdline(p)) for p in left]
    assert_temp_directory_emptied(inner_tmp)


def test_pytest_timeout_backstop_cleans_up(pytester, tmp_path, inner_tmp):
    """pytest-timeout firing inside run() (harness timeout longer than the
    test's) still leaves nothing behind."""
    proc, pids = _start_inner(pytester, tmp_path, inner_tmp, test_timeout=8, harness_timeout=100)
    out = _ended(proc, pids, 60)
    assert proc.returncode == 1 and "Timeout" in out, out
    left = wait_gone(pids, 5)
    assert not left, left
    assert_temp_directory_emptied(inner_tmp)


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
    0700 directory, in this process's scratch directory; fn sees it as its
    TMPDIR.  After the run the scratch directory holds only what lasts the
    session: the forkserver's socket directory and its preload report, and
    what says whose the directory is (see harness.launch.scratch)."""
    from harness.workloads import allreduce_loop

    def where():
        import tempfile as worker_tempfile
        return worker_tempfile.gettempdir(), allreduce_loop(3)

    result = mwms_cluster.run(where, timeout=60)
    result.assert_completed()
    run_dirs = {d for d, _ in result.return_values}
    assert len(run_dirs) == 1
    run_dir = run_dirs.pop()
    assert os.path.dirname(run_dir) == scratch.scratch_dir(), run_dir
    assert os.path.basename(run_dir).startswith("run-")
    assert not os.path.exists(run_dir)
    left = sorted(os.listdir(scratch.scratch_dir()))
    lasting = {"preload-report", scratch.OWNER_FILE, scratch.OUTSIDE_FILE}
    assert all(name in lasting or name.startswith("pymp-") for name in left), left


_HOLDS_A_MANAGER = """
import contextlib, multiprocessing, os, sys, time
import multiprocess
from harness.compat import runner
from harness.launch.manager import guarded_manager
if __name__ == "__main__":
    kind = sys.argv[1]
    with (contextlib.nullcontext(runner.manager()) if kind == "compat" else
          guarded_manager(multiprocessing if kind == "multiprocessing" else multiprocess)) \\
            as manager:
        manager.dict()["ready"] = 1
        print(manager._process.pid, manager.address, flush=True)
        time.sleep(120)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("library", ["multiprocessing", "multiprocess", "compat"])
def test_sigkill_of_a_test_leaves_no_manager_and_no_socket_directory(tmp_path, library):
    """A ``Manager()`` outlives a SIGKILLed parent, server and ``pymp-*``
    directory both; :func:`harness.launch.manager.guarded_manager`'s
    leaves neither, nor does ``multi_process_runner.manager()``'s (started
    from a forkserver)."""
    script = tmp_path / "holds.py"
    script.write_text(_HOLDS_A_MANAGER)
    # The holder's temp directory, to find what it leaves; short, as the
    # Unix sockets made in it must be (tmp_path can be too long for them).
    its_tmp = tempfile.mkdtemp(prefix="mwms-holder-")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    holder = subprocess.Popen([sys.executable, str(script), library], stdout=subprocess.PIPE,
                              text=True, cwd=root,
                              env={**os.environ, "PYTHONPATH": root, "TMPDIR": its_tmp})
    try:
        server, address = holder.stdout.readline().split()
        assert psutil.pid_exists(int(server)) and os.path.exists(address)
        holder.kill()
        holder.wait(timeout=10)
        assert wait_gone([int(server)], 10) == [], "the manager's server outlived its parent"
        deadline = time.monotonic() + 10
        while os.path.exists(os.path.dirname(address)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not os.path.exists(os.path.dirname(address)), "its socket directory was left"
        while os.listdir(its_tmp) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert os.listdir(its_tmp) == [], "the holder left these in its temp directory"
    finally:
        holder.kill()
        holder.wait()
        shutil.rmtree(its_tmp, ignore_errors=True)
