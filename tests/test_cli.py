"""The command line: `python -m harness run [options] SCRIPT [--] ARGS`,
`explore`, and the usage.

Real runs go through a subprocess, as a user's shell would start them (each
starts its own forkserver: about 3 s of TensorFlow import); parsing is
tested in-process.
"""
import os
import re
import subprocess
import sys
import textwrap

import pytest

from harness import SettingError
from harness.settings import OPTIONS
from harness.validators import parse_choice, parse_restarts, parse_seconds, parse_workers
from helpers import LEAVE_TOGETHER

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("no_leftover_workers")]

# Counts its steps with harness.context().steps(), where step faults act;
# with --together DIR its workers leave together (a run that must complete:
# tests/helpers.py's LEAVE_TOGETHER says why).
STEPS_PY = LEAVE_TOGETHER + textwrap.dedent('''\
    import argparse

    import tensorflow as tf

    import harness

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--together", default=None)
    args = parser.parse_args()
    print(f"started attempt {harness.context().attempt}", flush=True)

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = tf.Variable(1.0)


    @tf.function
    def train_step():
        return strategy.reduce("SUM", strategy.run(lambda: w * 2.0), axis=None)


    for step in harness.context().steps(args.steps):
        train_step()
    print(f"trained {args.steps} steps")
    if args.together:
        leave_together(strategy, args.together)
''')


def harness_cli(tmp_path, *args, timeout=90, command="run"):
    """Run `python -m harness run ARGS` in tmp_path; return the CompletedProcess."""
    (tmp_path / "steps.py").write_text(STEPS_PY)
    return subprocess.run([sys.executable, "-m", "harness", command, *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(120)
def test_completing_script_exits_0_and_prints_the_diagnosis(tmp_path):
    proc = harness_cli(tmp_path, "-n", "2", "--timeout", "30", "steps.py", "--", "--steps", "5",
                       "--together", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "COMPLETED: all 2 workers returned" in proc.stdout
    assert "ran 5 steps (0-4)" in proc.stdout    # the script got its argument
    # What the script printed, each line tagged with its worker.
    assert "[w0] trained 5 steps" in proc.stdout and "[w1] trained 5 steps" in proc.stdout
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("harness: steps.py on 2 workers: completed in ")
    assert "s from the call, start-up included (the run itself: " in last
    assert last.endswith("expected completed: ok")
    assert "Traceback" not in proc.stderr


@pytest.mark.timeout(120)
def test_skipped_step_names_the_worker_that_left_and_expect_failed_exits_0(tmp_path):
    # A worker whose script ended exits (on_return="exit", harness run's
    # default): worker 1 skips a step, runs out of steps first, and leaves
    # while worker 0 still needs it in its last all-reduce.  TensorFlow 2.21,
    # measured: worker 0 raises UnavailableError, at once (its receive from
    # worker 1 reset) or after the 10 s heartbeat timeout; a hang timeout
    # above that makes it a failure every time.
    proc = harness_cli(tmp_path, "--timeout", "30", "--grace", "20",
                       "--fault", "SkipStep(worker=1, step=2)", "--expect", "failed",
                       "--report-dir", "timelines", "steps.py", "--steps", "6")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # In call 6, which worker 1 never made, or (2 runs in 66 beside 5 others)
    # in call 5, whose data it still had to send when its process ended.
    assert re.search(r"FAILED: worker 1 returned and its process ended after 5 calls of "
                     r"`train_step`; worker 0 then failed in call [56] with UnavailableError; "
                     r"culprit: worker 1 \(it left while they still needed it in a collective",
                     proc.stdout), proc.stdout
    # Every worker's output, the failed one's traceback too, on failure.
    assert "[w1] trained 6 steps" in proc.stdout and "[w0] Traceback" in proc.stdout
    assert "failed in" in proc.stdout and "expected failed: ok" in proc.stdout
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
                       "--fault", "Crash(worker=1, step=2)", "steps.py", "--together", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "COMPLETED after 1 restart: attempt 0 CRASHED, attempt 1 COMPLETED" in out
    assert "replicas:" in out
    # Each attempt's output, after a line with its outcome and time.
    order = [out.index(text) for text in (
        "harness: attempt 0: crashed in ", "[w1] started attempt 0",
        "harness: attempt 1: completed in ", "[w1] started attempt 1", "[w1] trained 8 steps")]
    assert order == sorted(order), out
    # The total, and each attempt's part of it: the attempts ran one after
    # the other within the call, and the crash's run lasted its grace unless
    # worker 0 raised on its own (a peer killed mid-call can fail it with
    # "Socket closed" within 0.1 s: a race TensorFlow decides).
    last = out.strip().splitlines()[-1]
    times = re.search(r"completed in ([\d.]+) s from the call, start-up included, over 2 "
                      r"attempts \(attempt 0 crashed: ([\d.]+) s, the run itself ([\d.]+) s; "
                      r"attempt 1 completed: ([\d.]+) s, the run itself ([\d.]+) s\)", last)
    assert times, last
    total, first, first_run, second, second_run = map(float, times.groups())
    assert total >= first + second - 0.2 and first >= first_run > 0, out
    attempt0 = out[out.index("--- attempt 0 ---"):]
    assert first_run >= 1.0 or "worker 0: raised" in attempt0, out
    assert second >= second_run > 0


@pytest.mark.timeout(120)
def test_a_task_restarted_alone_shows_each_of_its_processes_output(tmp_path):
    proc = harness_cli(tmp_path, "--grace", "1", "--restarts", "1", "--restart-policy", "task",
                       "--fault", "Crash(worker=1, step=2)", "steps.py")
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr   # a verdict, either way
    out = proc.stdout
    # Worker 0's echo of the crash can restart every task together before
    # worker 1's first restart has printed (an immediate "Socket closed"
    # rather than the restarted process's new incarnation): the restart that
    # printed is then a later one, so any restart number is taken.
    restarted = re.search(r"^\[w1 restart ([1-9])\] started attempt \1$", out, re.M)
    assert restarted, out
    assert out.index("[w1] started attempt 0") < restarted.start()
    assert "harness: attempt 1:" not in out   # one attempt of the cluster


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
    assert proc.returncode == 2 and "error: SCRIPT: 'nope.py': no such file" in proc.stderr
    proc = harness_cli(tmp_path, "-m", "no_such_module_here", timeout=30)
    assert proc.returncode == 2
    assert "error: -m no_such_module_here: no module named" in proc.stderr
    assert "run_script" not in proc.stderr
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
    assert "--mwms-" not in proc.stdout


def _console_script():
    """The `harness` command pip installed beside this Python, or, where the
    package is not installed, the same call its wrapper makes."""
    installed = os.path.join(os.path.dirname(sys.executable), "harness")
    if os.path.exists(installed):
        return [installed]
    return [sys.executable, "-c", "import sys; from harness.cli import main; "
            "sys.argv[0] = '/venv/bin/harness'; sys.exit(main())"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("how", ["python -m harness", "harness"])
def test_the_top_level_usage_lists_every_command(tmp_path, how):
    from harness.cli import COMMANDS
    command = [sys.executable, "-m", "harness"] if how != "harness" else _console_script()
    proc = subprocess.run([*command, "--help"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    usage = proc.stdout.split("\n\n", 1)[0].splitlines()
    assert [line.split(how + " ", 1)[1].split()[0] for line in usage] == list(COMMANDS)
    assert usage[0] == f"usage: {how} run [options] (SCRIPT | -m MODULE) [--] [ARG ...]"


@pytest.mark.timeout(150)
def test_explore_shows_a_live_status_and_prints_the_plan_that_breaks_the_job(tmp_path):
    # Without restarts, any crash breaks "survives": found at once, then shrunk.
    # The workers leave together: a worker whose process ends while its peer
    # still reads its last call's data fails that peer (TensorFlow's race,
    # seen once in CI as a failed fault-free run).
    proc = harness_cli(tmp_path, "--grace", "1", "--budget", "40", "--seed", "0",
                       "--kinds", "Crash", "steps.py", "--steps", "4", "--together",
                       str(tmp_path), command="explore", timeout=140)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # not a terminal: plain status lines, the first at once
    status = [ln for ln in proc.stderr.splitlines() if ln.startswith("harness: explore, ")]
    assert status and status[0] == ("harness: explore, the fault-free run | 0 runs, 0/min | "
                                    "running (no faults) | 40s left"), proc.stderr
    out = proc.stdout
    assert re.search(r"^faults=\[Crash\(worker=\d, step=\d, how='\w+'\)\]$", out, re.M), out
    assert "  signature: crashed; culprit: a worker the plan faulted" in out
    assert re.search(r"hang timeout \d+(\.\d)? s, seed 0", out), out
    assert "harness: with --restarts 0 nothing restarts the script" in out
    assert re.search(r"shrunk in \d+ runs \([\d.]+ s\); reproduced 3 of 3 replays$", out, re.M), out
    printed = out.index("harness: what the workers printed in the run of that plan:")
    assert out.index("[w0] started attempt 0", printed) < out.index("\nthe run of that plan:\n")
    assert re.search(r"harness: replay it with: python -m harness run -n 2 --restarts 0 "
                     r"--fault \"Crash\(worker=\d, step=\d, how='\w+'\)\" steps.py -- "
                     r"--steps 4 --together \S+$", out, re.M), out
