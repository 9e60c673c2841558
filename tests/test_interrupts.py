"""Ctrl-C pressed twice or three times ends pytest promptly, whatever the
moment, and leaves no process: the second interrupt must not stop the
harness half-way through killing the workers (one left alive keeps the
interpreter in ``multiprocess``'s exit join for ever).

Each case is a pytest session of its own (the inner one) in its first run,
with the moment forced: the inner test makes the harness wait where the
interrupts must land, and says so with a marker file.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import psutil
import pytest

from harness.core.linux import wait_gone
from harness.launch import scratch
from harness.launch.state_dir import default_state_dir
from test_cleanup import assert_temp_directory_emptied

pytestmark = pytest.mark.timeout(240)

@pytest.fixture
def inner_tmp():
    """The inner pytest's temp directory, to be found empty once it is gone.
    Short: the forkserver's socket lives in it (107 bytes at most)."""
    path = tempfile.mkdtemp(prefix="mwms-inner-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


# How long pytest may take to end after the first Ctrl-C.
PROMPTLY = 10.0

# The inner session.  MOMENT makes the harness wait at one place, with a
# marker file written as it gets there:
#   start     worker 1's process is started but its start has not returned
#             (the start thread is slow), so the interrupt finds it in flight;
#   teardown  the workers' teardown has begun.
# (A start waiting on a busy forkserver: tests/test_cleanup.py.)
INNER = """
import os, subprocess, time
import harness
from harness.controller import teardown
from harness.launch import local

MOMENT = os.environ["MWMS_MOMENT"]
MARKS = os.environ["MWMS_MARKS"]


def mark(name):
    open(os.path.join(MARKS, name), "w").close()


if MOMENT == "start":
    started = local._start_one

    def slow_start(ctx, spec):
        handle = started(ctx, spec)
        if spec.index == 1:
            mark("moment")
            time.sleep(1.5)
        return handle

    local._start_one = slow_start

if MOMENT == "teardown":
    stop = teardown._stop_workers   # what runs with Ctrl-C held back

    def slow_stop(*args):
        mark("moment")
        time.sleep(1.5)
        stop(*args)

    teardown._stop_workers = slow_stop


def stuck():
    ctx = harness.context()
    child = subprocess.Popen(["sleep", "1000"])
    with open(os.path.join(MARKS, f"pids-{ctx.index}"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    time.sleep(1000)


def test_first_run(mwms_cluster):
    mark("run")
    mwms_cluster.run(stuck, timeout=RUN_TIMEOUT)
"""

def start_session(pytester, tmp_path, inner_tmp, moment, run_timeout=200):
    """The inner pytest, started; its marker directory and the token every
    process it starts carries in its environment."""
    marks = tmp_path / "marks"
    marks.mkdir()
    pytester.makepyfile(test_inner=INNER.replace("RUN_TIMEOUT", str(run_timeout)))
    token = uuid.uuid4().hex
    env = dict(os.environ, MWMS_MOMENT=moment, MWMS_MARKS=str(marks), TMPDIR=inner_tmp,
               MWMS_INTERRUPT_TOKEN=token,
               MWMS_STATE_DIR=os.environ.get("MWMS_STATE_DIR") or default_state_dir())
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-s", "--mwms-workers=2", "test_inner.py"],
        cwd=pytester.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # As a terminal's pytest: a background shell's would ignore SIGINT.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # noqa: PLW1509
    return proc, marks, token


def wait_for(proc, path, seconds=150):
    deadline = time.monotonic() + seconds
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"never got to {path.name}:\n{proc.communicate()[0][-4000:]}")
        time.sleep(0.01)


def processes_of(proc, marks):
    """What the inner pytest has started so far, and the workers' own pids
    and their children's (from their marker files)."""
    try:
        pids = {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
    except psutil.Error:
        pids = set()
    for f in marks.glob("pids-*"):
        pids.update(int(x) for x in f.read_text().split())
    return pids


def carrying(token):
    """Live processes with ``token`` in their environment (a worker forked
    by the server has the server's), but the scratch directory's sweeper,
    which outlives pytest by design to remove what it left."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if f"MWMS_INTERRUPT_TOKEN={token}" not in "\0".join(
                    f"{k}={v}" for k, v in p.environ().items()):
                continue
            if scratch.__file__ in " ".join(p.info["cmdline"] or ()):
                continue
            if p.status() != psutil.STATUS_ZOMBIE:
                found.append((p.pid, p.info["cmdline"]))
        except psutil.Error:
            pass
    return found


def interrupt(proc, delays):
    """SIGINT now and after each of ``delays`` (seconds after the one
    before), unless pytest has ended by then."""
    for delay in (0.0, *delays):
        time.sleep(delay)
        if proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)


def ended_promptly(proc, since, pids, seconds=PROMPTLY):
    """pytest's output, once it has ended within ``seconds`` of ``since``;
    if not, it and all it started are killed and the test fails."""
    try:
        out = proc.communicate(timeout=max(0.1, since + seconds - time.monotonic()))[0]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)   # pytest's faulthandler prints every stack
        try:
            out = proc.communicate(timeout=10)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
        for p in pids:
            with_kill(p)
        wait_gone(pids, 10)
        pytest.fail(f"pytest still ran {seconds} s after the first Ctrl-C:\n{out[-6000:]}")
    return out


def with_kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def assert_nothing_left(pids, token, inner_tmp):
    left = wait_gone(pids, 5)
    assert not left, [(p, psutil.Process(p).cmdline()) for p in left if psutil.pid_exists(p)]
    assert not carrying(token)
    assert_temp_directory_emptied(inner_tmp)


@pytest.mark.parametrize("moment", ["start", "teardown"])
def test_ctrl_c_two_and_three_times_ends_pytest_with_every_worker_killed(
        pytester, tmp_path, inner_tmp, moment):
    """``start``: the second and third Ctrl-C land while the interrupted
    start waits for the start still in flight; ``teardown``: the first
    during the run, the others while the harness kills the workers."""
    proc, marks, token = start_session(pytester, tmp_path, inner_tmp, moment)
    pids = set()
    try:
        if moment == "teardown":
            wait_for(proc, marks / "pids-1")
            wait_for(proc, marks / "pids-0")
            pids = processes_of(proc, marks)
            since = time.monotonic()
            interrupt(proc, ())
            wait_for(proc, marks / "moment", seconds=PROMPTLY)
            interrupt(proc, (0.3, 0.3))
        else:
            wait_for(proc, marks / "moment")
            pids = processes_of(proc, marks)
            since = time.monotonic()
            interrupt(proc, (0.3, 0.3))
        pids |= processes_of(proc, marks)
        out = ended_promptly(proc, since, pids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "KeyboardInterrupt" in out, out[-4000:]
    assert_nothing_left(pids, token, inner_tmp)
