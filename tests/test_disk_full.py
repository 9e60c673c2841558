"""A full temp directory is named as the machine's problem, never blamed on
a worker: at the session's start, at a run's start, and when the disk fills
during a run.  Each case is a pytest session of its own whose ``TMPDIR`` is
a small tmpfs (mounting one needs root; elsewhere the tests are skipped)."""
import os
import subprocess
import sys
import tempfile

import pytest

from harness.launch.state_dir import default_state_dir

pytestmark = pytest.mark.timeout(180)

INNER = """
import os
import harness

def fill_then_fail():
    if harness.context().index == 0:
        # The workers' TMPDIR is the run's directory: fill its file system.
        with open(os.path.join(os.environ["TMPDIR"], "big"), "wb") as f:
            while True:
                f.write(b"x" * 65536)
                f.flush()
    return 0

def test_run(mwms_cluster):
    mwms_cluster.run(lambda: harness.context().index).assert_completed()

def test_fills_the_disk(mwms_cluster):
    mwms_cluster.run(fill_then_fail, timeout=20)

def test_no_cluster():
    pass
"""


@pytest.fixture
def tmpfs():
    """Mount a tmpfs of the size given (KiB); unmounted at the end."""
    mounted = []

    def mount(kib):
        path = tempfile.mkdtemp(prefix="mwms-tmpfs-")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k,mode=1777", "tmpfs",
                               path], capture_output=True, text=True)
        if done.returncode != 0:
            os.rmdir(path)
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", path], capture_output=True)
        os.rmdir(path)


def _session(pytester, tmpdir, *args):
    pytester.makepyfile(test_inner=INNER)
    env = dict(os.environ, TMPDIR=tmpdir,
               MWMS_STATE_DIR=os.environ.get("MWMS_STATE_DIR") or default_state_dir())
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         "--mwms-workers=2", "test_inner.py", *args],
        cwd=pytester.path, env=env, capture_output=True, text=True, timeout=150)


def test_a_temp_directory_too_full_to_start_is_one_usage_error(pytester, tmpfs):
    tmpdir = tmpfs(4)
    out = _session(pytester, tmpdir)
    text = out.stdout + out.stderr
    assert out.returncode == pytest.ExitCode.USAGE_ERROR, text[-3000:]
    assert f"the temp directory ({tmpdir}) is full" in out.stderr
    assert "INTERNALERROR" not in text and "Traceback" not in text


def test_a_temp_directory_too_full_for_a_run_fails_that_test_naming_it(pytester, tmpfs):
    tmpdir = tmpfs(16)
    out = _session(pytester, tmpdir, "-k", "test_run or test_no_cluster")
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-3000:]
    assert "INTERNALERROR" not in text
    assert f"TempDirFullError: the temp directory ({tmpdir}) is full" in out.stdout
    assert "1 failed, 1 passed" in out.stdout
    assert "culprit" not in out.stdout


def test_a_disk_that_fills_during_the_run_is_named_not_blamed(pytester, tmpfs):
    tmpdir = tmpfs(16 * 1024)
    out = _session(pytester, tmpdir, "-k", "test_fills_the_disk")
    text = out.stdout + out.stderr
    assert out.returncode == 1, text[-3000:]
    assert f"TempDirFullError: the temp directory ({tmpdir}) is full" in out.stdout, \
        text[-3000:]
    assert "culprit" not in out.stdout
    assert not [n for n in os.listdir(tmpdir) if n.startswith("pytest-mwms-session")]
