"""The command line's parsing: faults from their text, where the script starts,
the status line.  In-process, no TensorFlow; real runs are tests/test_cli.py."""
import dataclasses
import io

import pytest

from harness import faults as F
from harness.cli import (PLAIN_EVERY, StatusLine, UsageError, _parser, format_progress,
                         parse_fault, settings_from_args, split_command)
from harness.controller import Progress
from harness.errors import SettingError


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


def test_the_status_line_says_each_workers_step_and_the_idle_time():
    assert format_progress(PROGRESS) == ("harness: attempt 0 | 12.3s | w0 step 41, w1 started, "
                                         "w2 returned | idle 0.2s of 30s")


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


PROGRESS = Progress(attempt=0, elapsed=12.34, idle=0.25, timeout=30.0, steps=(41, None, 7),
                    states=("running", "running", "returned"))




class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self._tty = tty

    def isatty(self):
        return self._tty


def test_the_restart_policy_flag_reaches_the_settings_and_a_bad_one_is_named():
    ns = _parser().parse_args(["--restarts", "2", "--restart-policy", "task"])
    settings = settings_from_args(ns)
    assert (settings.restarts, settings.restart_policy) == (2, "task")
    assert settings_from_args(_parser().parse_args([])).restart_policy == "cluster"
    with pytest.raises(SettingError, match="--restart-policy: 'pod'"):
        settings_from_args(_parser().parse_args(["--restart-policy", "pod"]))


def test_explore_takes_the_cluster_options_and_its_own():
    argv = ["-n", "3", "--restarts", "1", "--budget", "120", "--kinds", "Crash,Pause",
            "--seed", "7", "--property", "detected", "train.py", "--", "--epochs", "2"]
    options, script, module, args = split_command(argv)
    assert (script, module, args) == ("train.py", None, ["--epochs", "2"])
    ns = _parser("explore").parse_args(options)
    assert (ns.budget, ns.kinds, ns.seed, ns.property) == (120.0, "Crash,Pause", 7, "detected")
    assert settings_from_args(ns).restarts == 1
    with pytest.raises(SystemExit):
        _parser("explore").parse_args(["--property", "fast"])
    with pytest.raises(SystemExit):   # a run option is not explore's
        _parser("explore").parse_args(["--fault", "Crash(0, 1)"])


@pytest.mark.parametrize("line,plan", [
    ("faults=[Crash(worker=1, step=5, how='exit')]", (F.Crash(1, 5),)),
    ("[Pause(worker=0, step=2, seconds=None), SkipStep(task=('worker', 1), step=3)]",
     (F.Pause(0, 2, None), F.SkipStep(task=("worker", 1), step=3))),
    ("faults=[]", ()),
])
def test_a_plan_parses_back_from_its_line(line, plan):
    from harness import faults_text
    assert faults_text.parse_plan(line) == plan
    assert faults_text.parse_plan(faults_text.plan_line(plan)) == plan


@pytest.mark.parametrize("line", ["faults=Crash(1, 2)", "faults=[print('x')]", "faults=[1, 2]"])
def test_a_plan_line_that_is_not_a_list_of_faults_is_refused(line):
    from harness import faults_text
    with pytest.raises(UsageError):
        faults_text.parse_plan(line)
