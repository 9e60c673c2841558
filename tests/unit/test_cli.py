"""The command line's parsing, usage and errors: faults from their text,
where the script starts, the status lines, what a run with restarts prints.
In-process, no TensorFlow; real runs are tests/test_cli.py."""
import dataclasses
import io
import re
import types

import pytest

from harness import faults as F
from harness.cli import (COMMANDS, UsageError, _parser, explore_command, main, parse_fault,
                         program_name, settings_from_args, split_command)
from harness.controller import Progress
from harness.errors import SettingError
from harness.explore import SearchProgress
from harness.report.console import (PLAIN_EVERY, StatusLine, format_progress, format_search,
                                    output_lines, timing)
from harness.settings import OPTIONS


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
    # explore's options that take a value
    (["--reproduce", "2", "--order", "uniform", "--kinds", "Crash", "train.py"],
     (["--reproduce", "2", "--order", "uniform", "--kinds", "Crash"], "train.py", None, [])),
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
    from harness.explore import check_kinds, check_settings
    checked = check_settings(dict(budget=ns.budget, seed=ns.seed, property=ns.property),
                             lambda name: "--" + name)
    assert checked == dict(budget=120.0, seed=7, property="detected")
    assert check_kinds(ns.kinds, "detected", "--kinds") == ("Crash", "Pause")
    assert settings_from_args(ns).restarts == 1
    with pytest.raises(SystemExit):
        _parser("explore").parse_args(["--property", "fast"])
    with pytest.raises(SystemExit):   # a run option is not explore's
        _parser("explore").parse_args(["--fault", "Crash(0, 1)"])
    ns = _parser("explore").parse_args(["--reproduce", "-1"])
    with pytest.raises(SettingError, match="--reproduce"):
        check_settings(dict(reproduce=ns.reproduce), lambda name: "--" + name)


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


# -- what `run` prints of a run with restarts ------------------------------------------

def _worker(index, log, attempt=0, attempts=()):
    return types.SimpleNamespace(index=index, log=log, attempt=attempt, attempts=attempts)


def _attempt(number, outcome, duration, itself, workers):
    return types.SimpleNamespace(
        attempt=number, outcome=outcome, duration=duration, workers=tuple(workers),
        observation=types.SimpleNamespace(duration=itself, task=lambda i: ("worker", i)),
        attempts=())


def test_a_run_with_restarts_shows_each_attempt_s_output_and_time():
    first = _attempt(0, "crashed", 5.5, 5.1, [_worker(0, "a0 w0\n"), _worker(1, "a0 w1\n")])
    second = _attempt(1, "completed", 1.3, 0.9, [_worker(0, "a1 w0\n", 1),
                                                 _worker(1, "a1 w1\n", 1)])
    run = _attempt(1, "completed", 7.2, 0.9, second.workers)
    run.attempts = (first, second)
    assert output_lines(run) == [
        "harness: attempt 0: crashed in 5.5 s, start-up included (the run itself: 5.1 s)",
        "[w0] a0 w0", "[w1] a0 w1",
        "harness: attempt 1: completed in 1.3 s, start-up included (the run itself: 0.9 s)",
        "[w0] a1 w0", "[w1] a1 w1"]
    assert timing(run) == ("7.2 s from the call, start-up included, over 2 attempts "
                           "(attempt 0 crashed: 5.5 s, the run itself 5.1 s; "
                           "attempt 1 completed: 1.3 s, the run itself 0.9 s)")


def test_a_run_without_restarts_prints_as_before():
    run = _attempt(0, "completed", 3.0, 0.4, [_worker(0, "hi\n"), _worker(1, "")])
    run.attempts = (run,)
    assert output_lines(run) == ["[w0] hi"]
    assert timing(run) == "3.0 s from the call, start-up included (the run itself: 0.4 s)"


def test_a_task_restarted_alone_shows_each_of_its_processes():
    ended = _worker(1, "first process\n", 0)
    last = _worker(1, "second process\n", 1)
    run = _attempt(0, "completed", 4.0, 2.0, [
        _worker(0, "w0\n", 0, (_worker(0, "w0\n"),)),
        _worker(1, "second process\n", 1, (ended, last))])
    run.attempts = (run,)
    assert output_lines(run) == ["[w0] w0", "[w1] first process",
                                 "[w1 restart 1] second process"]


# -- explore's status line ---------------------------------------------------------------

def test_the_search_s_status_line_says_runs_rate_the_plans_and_the_time_left():
    p = SearchProgress("search", runs=14, elapsed=30.0, left=41.4,
                       running=(F.Crash(1, 3),), last=(F.Delay(0, 5, 0.5),), ended="completed")
    assert format_search(p) == (
        "harness: explore, searching | 14 runs, 28/min | running Crash(worker=1, step=3, "
        "how='exit') | last Delay(worker=0, step=5, seconds=0.5): completed | 41s left")
    later = p.later(2.0, PROGRESS)
    assert (later.elapsed, later.left, later.run) == (32.0, 39.4, PROGRESS)
    assert "running Crash(worker=1, step=3, how='exit') for 12.3s" in format_search(later)
    first = SearchProgress("fault-free run", runs=0, elapsed=0.0, left=60.0, running=())
    assert format_search(first) == ("harness: explore, the fault-free run | 0 runs, 0/min | "
                                    "running (no faults) | 60s left")


def test_on_a_terminal_the_line_is_cut_to_its_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    stream = _Stream(tty=True)
    StatusLine(stream)(PROGRESS)
    assert stream.getvalue() == "\r" + format_progress(PROGRESS)[:39]


# -- usage, help and errors name the command line's own words ----------------------------

def test_the_usage_line_lists_every_command(capsys):
    assert main(["--help"], prog="harness") == 0
    out = capsys.readouterr().out
    usage = out.split("\n\n", 1)[0]
    assert [re.match(r"(?:usage:)?\s+harness (\w+)", line).group(1)
            for line in usage.splitlines()] == list(COMMANDS)
    for name, command in COMMANDS.items():
        assert command.summary in out


def test_the_program_is_named_as_it_was_started():
    assert program_name("/venv/bin/harness") == "harness"
    assert program_name("/src/harness/__main__.py") == "python -m harness"
    assert _parser("explore", "harness").format_usage().startswith("usage: harness explore ")


@pytest.mark.parametrize("command", ["run", "explore"])
def test_help_names_the_command_line_s_flags_not_pytest_s(command):
    text = _parser(command).format_help()
    assert "--mwms-" not in text
    assert "with `--backend=ray`" in text and "with `--report-dir`" in text


@pytest.mark.parametrize("args, named", [
    (["--budget", "0"], "--budget: 0 is out of range"),
    (["--budget", "soon"], "--budget: 'soon' is not a number of seconds"),
    (["--shrink-budget", "-1"], "--shrink-budget: -1 is out of range"),
    (["--max-faults", "0"], "--max-faults: '0' is not a whole number 1 or more"),
    (["--seed", "x"], "--seed: 'x' is not a whole number 0 or more"),
    (["--kinds", "Crash,Nap"], "--kinds: 'Nap' is not a kind of fault explore draws"),
    (["--restarts", "-1"], "--restarts: '-1' is not a number of restarts"),
    (["--order", "random"], "--order: 'random'"),
])
def test_explore_s_errors_name_its_flags(args, named, capsys):
    with pytest.raises(SystemExit) as e:
        explore_command([*args, "train.py"], "harness")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"harness explore: error: {named}" in err
    assert "explore(" not in err


def test_every_option_a_help_text_mentions_is_an_option():
    mentioned = {m for o in OPTIONS for m in re.findall(r"--mwms-([a-z-]+[a-z])", o.help)}
    assert mentioned and mentioned <= {o.name for o in OPTIONS}
    for o in OPTIONS:
        assert "--mwms-" not in o.help_for("cli")
        assert o.help_for("command line") == o.help
