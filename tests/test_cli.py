"""The command line: `python -m harness run [options] SCRIPT [--] ARGS`.

Real runs go through a subprocess, as a user's shell would start them (each
starts its own forkserver: about 3 s of TensorFlow import); parsing is
tested in-process.
"""
import dataclasses
import io
import subprocess
import sys
import textwrap

import pytest

from harness import faults as F
from harness import SettingError
from harness.cli import (PLAIN_EVERY, StatusLine, UsageError, format_progress, parse_fault,
                         split_command)
from harness.controller import Progress
from harness.settings import OPTIONS, parse_choice, parse_restarts, parse_seconds, parse_workers

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("no_leftover_workers")]

# Counts its steps with harness.context().steps(), where step faults act.
STEPS_PY = textwrap.dedent('''\
    import argparse

    import tensorflow as tf

    import harness

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = tf.Variable(1.0)


    @tf.function
    def train_step():
        return strategy.reduce("SUM", strategy.run(lambda: w * 2.0), axis=None)


    for step in harness.context().steps(args.steps):
        train_step()
    print(f"trained {args.steps} steps")
''')


def harness_cli(tmp_path, *args, timeout=90):
    """Run `python -m harness run ARGS` in tmp_path; return the CompletedProcess."""
    (tmp_path / "steps.py").write_text(STEPS_PY)
    return subprocess.run([sys.executable, "-m", "harness", "run", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(120)
def test_completing_script_exits_0_and_prints_the_diagnosis(tmp_path):
    proc = harness_cli(tmp_path, "-n", "2", "--timeout", "30", "steps.py", "--", "--steps", "5")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "COMPLETED: all 2 workers returned" in proc.stdout
    assert "ran 5 steps (0-4)" in proc.stdout    # the script got its argument
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("harness: steps.py on 2 workers: completed in ")
    assert last.endswith("expected completed: ok")
    assert "Traceback" not in proc.stderr


@pytest.mark.timeout(120)
def test_fault_that_hangs_with_expect_hang_exits_0(tmp_path):
    proc = harness_cli(tmp_path, "--timeout", "3", "--fault", "SkipStep(worker=1, step=2)",
                       "--expect", "hang", "--report-dir", "timelines", "steps.py",
                       "--steps", "6")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "HANG: no progress for 3.0s; culprit: worker 1" in proc.stdout
    assert "--- worker 0 (exit code -9)" in proc.stdout   # the blocked worker's log tail
    assert "hang in" in proc.stdout and "expected hang: ok" in proc.stdout
    assert sorted(p.name for p in (tmp_path / "timelines").iterdir()) == [
        "steps.py-run1.svg", "steps.py-run1.trace.json"]
    assert f"harness: timeline: {tmp_path / 'timelines' / 'steps.py-run1.svg'}" in proc.stdout
    # not a terminal: the live status comes as plain lines, the first at once
    status = [ln for ln in proc.stderr.splitlines() if ln.startswith("harness: attempt 0 |")]
    assert status and "w1 " in status[0] and "idle" in status[0] and "\r" not in proc.stderr


@pytest.mark.timeout(120)
def test_outcome_other_than_expected_exits_1(tmp_path):
    proc = harness_cli(tmp_path, "--grace", "1", "--fault", "Crash(worker=1, step=2)",
                       "steps.py")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "CRASHED: worker 1 died" in proc.stdout
    assert "crashed in" in proc.stdout and "expected completed: NOT OK" in proc.stdout


@pytest.mark.timeout(120)
def test_restarts_recover_a_crash_and_the_replicas_are_checked(tmp_path):
    proc = harness_cli(tmp_path, "--grace", "1", "--restarts", "1", "--check-replicas",
                       "--fault", "Crash(worker=1, step=2)", "steps.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "COMPLETED after 1 restart: attempt 0 CRASHED, attempt 1 COMPLETED" in proc.stdout
    assert "replicas:" in proc.stdout


@pytest.mark.timeout(30)
@pytest.mark.parametrize("args, option, expected", [
    (["-n", "0"], "--workers", lambda: parse_workers("0", "--workers")),
    (["--workers", "many"], "--workers", lambda: parse_workers("many", "--workers")),
    (["--timeout", "soon"], "--timeout", lambda: parse_seconds("soon", "--timeout")),
    (["--grace", "-1"], "--grace", lambda: parse_seconds("-1", "--grace", allow_zero=True)),
    (["--devices", "tpu"], "--devices", lambda: parse_choice("tpu", "--devices", ("cpu", "gpu"))),
    (["--start-method", "fork"], "--start-method",
     lambda: parse_choice("fork", "--start-method", ("forkserver", "spawn"))),
    (["--restarts", "-1"], "--restarts", lambda: parse_restarts("-1", "--restarts")),
    (["--expect", "success"], "--expect", None),
], ids=["workers-0", "workers-word", "timeout", "grace", "devices", "start-method", "restarts",
        "expect"])
def test_bad_option_value_exits_2_naming_the_option(tmp_path, args, option, expected):
    proc = harness_cli(tmp_path, *args, "steps.py", timeout=30)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"error: {option}: " in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    if expected is not None:   # the very message the pytest option gets (with its name)
        with pytest.raises(SettingError) as e:
            expected()
        assert str(e.value) in proc.stderr


@pytest.mark.timeout(30)
def test_malicious_fault_is_refused_and_not_run(tmp_path):
    marker = tmp_path / "PWNED"
    proc = harness_cli(tmp_path, "--fault", f"__import__('os').system('touch {marker}')",
                       "steps.py", timeout=30)
    assert proc.returncode == 2 and "error: --fault" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not marker.exists()


@pytest.mark.timeout(30)
def test_missing_script_and_unknown_option_exit_2(tmp_path):
    proc = harness_cli(tmp_path, "nope.py", timeout=30)
    assert proc.returncode == 2 and "no such file" in proc.stderr
    proc = harness_cli(tmp_path, "-m", "no_such_module_here", timeout=30)
    assert proc.returncode == 2 and "no module named" in proc.stderr
    proc = harness_cli(tmp_path, "--bogus", "steps.py", timeout=30)
    assert proc.returncode == 2 and "--bogus" in proc.stderr
    proc = harness_cli(tmp_path, "--fault", "Crash(worker=7, step=1)", "steps.py", timeout=30)
    assert proc.returncode == 2 and "worker 7 does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.timeout(30)
def test_help_lists_the_plugin_options(tmp_path):
    proc = harness_cli(tmp_path, "--help", timeout=30)
    assert proc.returncode == 0
    for o in OPTIONS:
        assert o.flag.replace("--mwms-", "--") in proc.stdout
    assert "-n N" in proc.stdout and "--fault" in proc.stdout and "--expect" in proc.stdout


@pytest.mark.parametrize("fault", [
    F.SkipStep(worker=1, step=2), F.ExtraCollective(0, 3), F.Crash(1, 5, how="kill"),
    F.RaiseError(0, 1, "it's \"quoted\""), F.Pause(1, 2), F.Pause(1, 2, seconds=0.5),
    F.Delay(0, 1, 2), F.BadTFConfig(1, "swapped"), F.Preempt(1, 3), F.Preempt(0, 2, grace=1.5),
    F.Crash(1, 2, attempt=1), F.Partition(1, 2), F.Partition(0, 1, seconds=2.5),
    F.Bandwidth(1, 3, kbps=500), F.Latency(0, 2, ms=30, jitter_ms=5.5), F.ResetPeers(1, 4),
    F.ResetPeers(1, 4, after=0.25),
])
def test_a_fault_parses_back_from_how_it_prints(fault):
    assert parse_fault(repr(fault)) == fault


@pytest.mark.parametrize("text", [
    "__import__('os').system('true')",
    "Crash(worker=__import__('os').getpid(), step=1)",
    "Crash.__init__.__globals__",
    "harness.faults.Crash(worker=1, step=1)",
    "Crash(*[1, 2])",
    "Crash(**{'worker': 1, 'step': 2})",
    "Crash(worker=1, step=1) or open('x', 'w')",
    "print(1)",
    "[Crash(worker=1, step=1)]",
    "lambda: 0",
    "Crash(worker=1 +",
    "Crash(wrker=1, step=1)",
])
def test_anything_but_a_literal_fault_call_is_refused(text):
    with pytest.raises(UsageError, match="--fault"):
        parse_fault(text)


@pytest.mark.parametrize("argv, expected", [
    (["-n", "3", "--timeout", "30", "--fault", "Crash(worker=1, step=5)", "train.py", "--",
      "--epochs", "2"],
     (["-n", "3", "--timeout", "30", "--fault", "Crash(worker=1, step=5)"], "train.py", None,
      ["--epochs", "2"])),
    (["train.py", "--timeout", "5"], ([], "train.py", None, ["--timeout", "5"])),
    (["--timeout=5", "-m", "pkg.train", "--", "--x"], (["--timeout=5"], None, "pkg.train",
                                                       ["--x"])),
    (["-n", "2", "--", "train.py", "-v"], (["-n", "2"], "train.py", None, ["-v"])),
    (["--workers", "2"], (["--workers", "2"], None, None, [])),
])
def test_split_command_finds_where_the_script_starts(argv, expected):
    assert split_command(argv) == expected


PROGRESS = Progress(attempt=0, elapsed=12.34, idle=0.25, timeout=30.0, steps=(41, None, 7),
                    states=("running", "running", "returned"))


def test_the_status_line_says_each_workers_step_and_the_idle_time():
    assert format_progress(PROGRESS) == ("harness: attempt 0 | 12.3s | w0 step 41, w1 started, "
                                         "w2 returned | idle 0.2s of 30s")


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self._tty = tty

    def isatty(self):
        return self._tty


def test_on_a_terminal_the_line_is_redrawn_in_place_and_wiped():
    stream = _Stream(tty=True)
    status = StatusLine(stream)
    status(PROGRESS)
    status(dataclasses.replace(PROGRESS, steps=(42, 1, 7)))
    status.close()
    out = stream.getvalue()
    assert "\n" not in out and out.count("\r") == 4 and out.endswith("\r")
    assert "w0 step 42" in out


def test_elsewhere_plain_lines_at_most_every_few_seconds():
    now = [100.0]
    stream = _Stream(tty=False)
    status = StatusLine(stream, clock=lambda: now[0])
    for _ in range(5):
        status(PROGRESS)
        now[0] += 1.0
    now[0] += PLAIN_EVERY
    status(PROGRESS)
    status.close()
    assert stream.getvalue().splitlines() == [format_progress(PROGRESS)] * 2
