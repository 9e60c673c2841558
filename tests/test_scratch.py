"""The scratch directory goes with its pytest, however that pytest ends."""
import os
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from harness.launch import scratch

pytestmark = pytest.mark.timeout(60)

OWNER = """
import os, sys, tempfile, time
from harness.launch import scratch
outside = tempfile.mkdtemp(prefix="pymp-")
scratch.remove_at_end(outside)
run = scratch.make_dir("run-")
open(os.path.join(run, "log"), "w").write("x")
print(scratch.scratch_dir(), outside, run, flush=True)
if sys.argv[1] == "exit":
    sys.exit(0)
time.sleep(1000)
"""


@pytest.fixture
def temp_dir():
    path = tempfile.mkdtemp(prefix="mwms-scratch-test-")
    yield path
    os.rmdir(path)       # fails the test's teardown if anything was left


def _owner(temp_dir, how):
    proc = subprocess.Popen([sys.executable, "-c", OWNER, how], stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, TMPDIR=temp_dir))
    paths = proc.stdout.readline().split()
    assert len(paths) == 3, paths
    sweepers = [c for c in psutil.Process(proc.pid).children() if "scratch.py" in " ".join(c.cmdline())]
    return proc, paths, sweepers


def _gone_within(paths, seconds):
    deadline = time.monotonic() + seconds
    while any(os.path.lexists(p) for p in paths) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in paths if os.path.lexists(p)]


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_everything_is_removed_when_the_owner_ends(temp_dir, how):
    proc, paths, sweepers = _owner(temp_dir, how)
    assert len(sweepers) == 1
    assert os.path.dirname(paths[0]) == temp_dir and os.path.dirname(paths[2]) == paths[0]
    if how == "sigkill":
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    assert not _gone_within(paths, 5 + scratch.QUIET_SECONDS)
    # The sweeper leaves once its work is done.
    gone, alive = psutil.wait_procs(sweepers, timeout=5 + scratch.QUIET_SECONDS)
    assert not alive


def test_what_comes_back_after_the_first_removal_is_removed_too(tmp_path, monkeypatch):
    """A dying worker writes again once the sweeper has removed the
    directory: the sweeper's clock is the test's, so that write comes at
    that moment every time, between two of the sweeper's looks."""
    target = tmp_path / "scratch"
    (target / "worker-0").mkdir(parents=True)
    came_back = []

    class Clock:
        now = 0.0

        @staticmethod
        def monotonic():
            return Clock.now

        @staticmethod
        def sleep(seconds):
            Clock.now += seconds
            if not target.exists() and not came_back:
                (target / "worker-0").mkdir(parents=True)   # a dying worker's last write
                came_back.append(Clock.now)

    monkeypatch.setattr(scratch, "time", Clock)
    scratch.sweep([str(target)], quiet=5.0, give_up=60.0)
    assert came_back and not target.exists()


def _kill_with_its_sweeper(proc, sweepers):
    """A cgroup killed whole: the owner and its sweeper at once."""
    for p in [psutil.Process(proc.pid), *sweepers]:
        p.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    psutil.wait_procs(sweepers, timeout=5)


def test_the_next_owner_removes_what_a_session_killed_with_its_sweeper_left(temp_dir):
    proc, first, sweepers = _owner(temp_dir, "sigkill")
    _kill_with_its_sweeper(proc, sweepers)
    assert all(os.path.exists(p) for p in first)
    live, live_paths, live_sweepers = _owner(temp_dir, "sigkill")
    try:
        assert not [p for p in first if os.path.lexists(p)]
        # A session whose owner lives is left alone.
        assert all(os.path.exists(p) for p in live_paths)
    finally:
        live.send_signal(signal.SIGKILL)
        live.wait(timeout=30)
        live.stdout.close()
    assert not _gone_within(live_paths, 5 + scratch.QUIET_SECONDS)


def test_a_scratch_directory_is_stale_only_when_its_owner_is_gone(tmp_path):
    now = time.time()
    path = tmp_path / (scratch.PREFIX + "x")
    path.mkdir()
    # Being made right now: no owner file yet.
    assert not scratch.stale(str(path), now)
    assert scratch.stale(str(path), now + scratch.UNOWNED_GRACE_SECONDS + 1)
    owner = path / scratch.OWNER_FILE
    owner.write_text(f"{os.getpid()} {scratch.start_time(os.getpid())}\n")
    assert not scratch.stale(str(path), now)
    # The same pid, started at another time, is another process.
    owner.write_text(f"{os.getpid()} 1\n")
    assert scratch.stale(str(path), now)
    owner.write_text("garbage\n")
    assert scratch.stale(str(path), now)
    # Half-written (no end of line yet): the grace of a directory being made.
    owner.write_text("")
    assert not scratch.stale(str(path), now)
    owner.write_text(f"{os.getpid()}")
    assert not scratch.stale(str(path), now)
    # Not a directory of this kind: never touched.
    link = tmp_path / (scratch.PREFIX + "link")
    link.symlink_to(path)
    assert not scratch.stale(str(link), now + 1000)
    link.unlink()


MANAGER_USER = """
import multiprocessing
from harness.launch.manager import guarded_manager
with guarded_manager(multiprocessing) as manager:
    manager.dict()["shared"] = 1
print(multiprocessing.util.get_temp_dir(), flush=True)
"""


def test_multiprocessings_own_exit_handler_finds_its_directory(temp_dir):
    """The sweeper is told of ``multiprocessing``'s temp directory (a
    Manager's socket); it must not take it before ``multiprocessing``'s own
    exit handler, which then printed a FileNotFoundError traceback."""
    proc = subprocess.run([sys.executable, "-c", MANAGER_USER], capture_output=True, text=True,
                          env=dict(os.environ, TMPDIR=temp_dir), timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert os.path.dirname(proc.stdout.strip()) == temp_dir
    assert not _gone_within([proc.stdout.strip()], 5 + scratch.QUIET_SECONDS)
    _gone_within([os.path.join(temp_dir, n) for n in os.listdir(temp_dir)],
                 5 + scratch.QUIET_SECONDS)   # the sweeper's last pass, before temp_dir goes
