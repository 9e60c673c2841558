"""Every report writer takes every run: no worker started, workers that ran
no step, zero-length steps and runs, times past the run's end, ledgers or
none, one attempt or several, tasks restarted alone.  Driven by generated
observations (no TensorFlow): a writer that raised under pytest would end
the session with INTERNALERROR, the rest of its tests never run.  The
writers' failures themselves (a timeline's files, the plugin's guard, the
analyzer's --timeline) are forced here too."""
import dataclasses
import json
import os
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.core import protocol
from harness.core.protocol import WorkerError
from harness.diagnosis import diagnose
from harness.diagnosis.observations import Event, RunObservation, WorkerObservation
from harness.errors import HarnessWarning, ReportWarning
from harness.record import commands, files
from harness.report import console, pytest_report, timeline
from harness.result import RunResult, WorkerResult
from observations import config, with_ledger

pytestmark = pytest.mark.timeout(120)

# The loaded profile's draws (mwms-ci: the same ones every run, derandomized),
# but at least this many: each example is a few milliseconds.
EXAMPLES = max(150, settings.default.max_examples)
ENDS = ("all_finished", "hang", "grace_expired", "certain", "start_failed")
# Times: zero, tiny, ordinary, and past the run's end (a clock's late look).
TIMES = st.sampled_from([0.0, 1e-9, 0.01, 0.5, 3.0, 30.0])


@st.composite
def worker_observations(draw, index: int, n: int) -> WorkerObservation:
    """One worker: up to a few steps (possibly none, possibly at one
    instant), and any end (returned, raised, died, killed, none seen)."""
    steps = draw(st.integers(0, 6))
    times = sorted(draw(st.lists(TIMES, min_size=steps, max_size=steps)))
    events = []
    if draw(st.booleans()):     # reported anything at all
        events += [Event(0.0, protocol.STARTED), Event(0.0, protocol.STRATEGY_CREATING)]
        if draw(st.booleans()):
            events.append(Event(0.0, protocol.STRATEGY_CREATED, data=n))
            events += [Event(t, protocol.STEP, step=s) for s, t in enumerate(times)]
            if draw(st.booleans()):
                events.append(Event(times[-1] if times else 0.0, protocol.FAULT,
                                    step=steps, data="Crash(worker=0, step=1)"))
    end = draw(st.sampled_from(["returned", "raised", "died", "killed", "unseen"]))
    at = draw(TIMES)
    w = WorkerObservation(
        index, tf_config=config(index, max(n, 1)), events=tuple(events),
        returned=end == "returned",
        error=WorkerError("ValueError", "boom\nsecond line", "") if end == "raised" else None,
        finish_time=at if end in ("returned", "raised") else None,
        exit_code={"returned": 0, "raised": 1, "died": -11, "killed": -9}.get(end),
        exit_time=None if end == "unseen" else at, killed_by_harness=end == "killed",
        stack=draw(st.sampled_from(["", "Thread 0x1 (most recent call first):\n  File x"])))
    ledger = draw(st.sampled_from(["none", "steps", "outside", "blocked"]))
    if ledger == "steps":
        w = with_ledger(w)
    elif ledger == "outside":
        w = with_ledger(w, calls_without_steps=draw(st.integers(0, 3)))
    elif ledger == "blocked":
        w = with_ledger(w, per_step=dict.fromkeys(range(steps), 2), blocked=True)
    return w


@st.composite
def run_observations(draw) -> RunObservation:
    """A run of 0-3 workers; with ``started`` fewer than the cluster's size
    (a start that failed part way), or none at all."""
    n = draw(st.integers(1, 3))
    started = draw(st.integers(0, n))
    workers = tuple(draw(worker_observations(i, n)) for i in range(started))
    return RunObservation(num_workers=n, timeout=draw(st.sampled_from([0.1, 10.0])), grace=5.0,
                          ended_by=draw(st.sampled_from(ENDS)),
                          duration=draw(TIMES), workers=workers)


def _worker_result(w: WorkerObservation, restarts: int) -> WorkerResult:
    """What the controller hands back for ``w``; with ``restarts``, a task
    restarted alone that many times (its earlier processes ended)."""
    exc = w.error
    last = WorkerResult(w.index, exception=exc, exit_code=w.exit_code,
                        log="line one\n\x1b[31mcolour\x1b[0m\n" * (w.index + 1),
                        last_step=w.steps[-1] if w.steps else None, stack=w.stack,
                        observation=w, attempt=restarts)
    if not restarts:
        return last
    earlier = tuple(WorkerResult(w.index, exit_code=1, log="", observation=w, attempt=k)
                    for k in range(restarts))
    return dataclasses.replace(last, attempts=earlier + (last,))


def _run_result(obs: RunObservation, attempt: int, restarts: int) -> RunResult:
    return RunResult(workers=tuple(_worker_result(w, restarts) for w in obs.workers),
                     duration=obs.duration, observation=obs, verdict=diagnose(obs),
                     attempt=attempt, phases={"launch": 0.0, "steps": obs.duration})


@st.composite
def run_results(draw) -> RunResult:
    """One run: one attempt, or several (restarts), its last attempt's
    tasks maybe restarted alone."""
    attempts = draw(st.lists(run_observations(), min_size=1, max_size=3))
    restarts = draw(st.integers(0, 2))
    results = [_run_result(obs, k, restarts if k == len(attempts) - 1 else 0)
               for k, obs in enumerate(attempts)]
    return dataclasses.replace(results[-1], attempts=tuple(results) if len(results) > 1 else (),
                               duration=sum(r.duration for r in results))


def _leftovers(folder):
    return sorted(p for p in os.listdir(folder) if ".partial" in p)


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(run_results(), min_size=1, max_size=2))
def test_every_writer_takes_every_run(tmp_path, runs):
    last = runs[-1]
    panels = timeline.panels_of(last)
    assert len(panels) == max(1, len(last.attempts))
    ET.fromstring(timeline.svg(panels))
    json.loads(json.dumps(timeline.chrome_trace(panels), allow_nan=False))
    trace_path, svg_path = last.timeline(str(tmp_path / "t" / "run.svg"))
    assert json.loads(Path(trace_path).read_text())["traceEvents"]
    assert ET.parse(svg_path).getroot().tag.endswith("svg")
    assert _leftovers(tmp_path / "t") == []

    properties = pytest_report.junit_properties(runs)
    assert len(properties) == 8 and all(isinstance(v, str) for _, v in properties)
    sections = pytest_report.report_sections(runs, {len(runs): (trace_path, svg_path)}, True)
    assert all(isinstance(title, str) and isinstance(text, str) for title, text in sections)
    summaries = [json.loads(json.dumps(pytest_report.run_summary(r, "t.py::t"), allow_nan=False))
                 for r in runs]
    lines = pytest_report.summary_lines(summaries, str(tmp_path), test_seconds={"t.py": 0.0})
    assert lines and all(isinstance(line, str) for line in lines)

    assert all(isinstance(line, str) for line in console.output_lines(last))
    assert console.timing(last) and console.attempt_line(last)


# ------------------------------------------------------ a timeline's files


def _a_run_with_no_step():
    obs = RunObservation(num_workers=2, timeout=10.0, grace=5.0, ended_by="all_finished",
                         duration=0.4, workers=tuple(
                             WorkerObservation(i, tf_config=config(i, 2),
                                               error=WorkerError("ValueError", "at once", ""),
                                               finish_time=0.2, exit_code=1, exit_time=0.3)
                             for i in range(2)))
    return _run_result(obs, 0, 0)


def test_a_run_whose_workers_ran_no_step_is_drawn(tmp_path):
    run = _a_run_with_no_step()
    assert run.outcome == "failed"
    trace_path, svg_path = run.timeline(str(tmp_path / "run"))
    assert os.path.getsize(svg_path) > 0 and os.path.getsize(trace_path) > 0
    ET.parse(svg_path)


def test_a_drawing_that_raises_leaves_no_file(tmp_path, monkeypatch):
    def broken(panels):
        raise RuntimeError("drawing broke")
    monkeypatch.setattr(timeline, "svg", broken)
    with pytest.raises(RuntimeError):
        _a_run_with_no_step().timeline(str(tmp_path / "run"))
    assert os.listdir(tmp_path) == []


def test_a_second_file_that_cannot_be_placed_takes_the_first_with_it(tmp_path, monkeypatch):
    """The trace is in place when the picture's rename fails (a full disk,
    say): neither stays, nor any temporary file."""
    real = os.replace

    def replace(src, dst):
        if dst.endswith(".svg"):
            raise OSError(28, "No space left on device")
        real(src, dst)
    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError):
        _a_run_with_no_step().timeline(str(tmp_path / "run"))
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------ the plugin's guard


class _Config:
    """What the guard reads of pytest's config: its stash."""

    def __init__(self):
        self.stash = pytest.Stash()


def test_a_report_that_fails_warns_once_and_is_left_out():
    from harness import plugin
    config, problems = _Config(), []

    def broken(*args):
        raise ValueError("cannot draw")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert plugin._reported(config, problems, "the timeline of run 1", broken, 1) is None
        assert plugin._reported(config, problems, "the timeline of run 2", broken, 2) is None
        assert plugin._reported(config, problems, "its sections", lambda: [1]) == [1]
    assert [type(w.message) for w in seen] == [ReportWarning]
    assert issubclass(ReportWarning, HarnessWarning)
    assert "could not make the timeline of run 1: ValueError: cannot draw" in str(seen[0].message)
    assert problems == ["pytest-mwms could not make the timeline of run 1: ValueError: cannot draw",
                        "pytest-mwms could not make the timeline of run 2: ValueError: cannot draw"]


def test_warnings_made_errors_do_not_end_the_session_either():
    """``-W error``: the warning itself would raise out of pytest's hook."""
    from harness import plugin
    config, problems = _Config(), []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plugin._reported(config, problems, "its sections", lambda: 1 / 0) is None
    assert problems == ["pytest-mwms could not make its sections: ZeroDivisionError: "
                        "division by zero"]


class _Terminal:
    def __init__(self):
        self.lines = []

    def write_sep(self, sep, title):
        self.lines.append(f"== {title} ==")

    def write_line(self, line):
        self.lines.append(line)


class _SummaryConfig(_Config):
    """A session's config, with the runs' summaries it collected."""

    def __init__(self, runs):
        from harness import plugin
        super().__init__()
        self.stash[plugin.RUNS_KEY] = runs

    def getoption(self, name, default=None):
        return default


def test_a_session_summary_that_cannot_be_made_is_one_line_under_its_title():
    from harness import plugin
    terminal = _Terminal()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        plugin.pytest_terminal_summary(terminal, 1, _SummaryConfig([{"nodeid": "t.py::t"}]))
    assert terminal.lines == ["== pytest-mwms ==",
                              "pytest-mwms could not make the session summary: KeyError: 'outcome'"]
    assert [type(w.message) for w in seen] == [ReportWarning]


def test_harness_run_that_cannot_write_its_timeline_says_so_in_one_line(tmp_path, capsys):
    """The report dir is a file: the verdict stands, a warning's line says why."""
    from harness import cli
    (tmp_path / "reports").write_text("")
    cli.write_timeline(_a_run_with_no_step(), str(tmp_path / "reports" / "job.py-run1"))
    said = capsys.readouterr()
    assert said.out == "" and said.err.startswith(
        f"harness: warning: the timeline could not be written to {tmp_path}/reports/job.py-run1: "
        f"FileExistsError: ") and len(said.err.splitlines()) == 1
    assert os.listdir(tmp_path) == ["reports"]


# ------------------------------------------------ harness analyze --timeline


def _recording_with_no_step(monkeypatch, folder, end):
    """Two tasks' recorder files: each made its strategy and ended (``end``)
    before its first step."""
    from unit.test_record import fake_task
    for i in range(2):
        fake_task(monkeypatch, folder, i, 2, calls=0, end=end)


@pytest.mark.parametrize("end, code", [(files.RETURNED, 0), (files.RAISED, 1)])
def test_analyze_draws_a_recording_with_no_step(tmp_path, monkeypatch, capsys, end, code):
    _recording_with_no_step(monkeypatch, tmp_path / "rec", end)
    out = tmp_path / "out" / "run"
    assert commands.analyze_command(["--timeline", str(out), str(tmp_path / "rec")]) == code
    said = capsys.readouterr()
    assert said.err == "" and f"timeline: {out}.svg" in said.out
    ET.parse(f"{out}.svg")
    assert json.loads(Path(f"{out}.trace.json").read_text())["traceEvents"]
    assert sorted(os.listdir(tmp_path / "out")) == ["run.svg", "run.trace.json"]


def test_analyze_that_cannot_write_its_timeline_says_one_line_and_leaves_nothing(
        tmp_path, monkeypatch, capsys):
    _recording_with_no_step(monkeypatch, tmp_path / "rec", files.RAISED)
    (tmp_path / "out").mkdir()
    real = os.replace

    def replace(src, dst):
        if dst.endswith(".svg"):
            raise OSError(28, "No space left on device")
        real(src, dst)
    monkeypatch.setattr(os, "replace", replace)
    out = tmp_path / "out" / "run"
    assert commands.analyze_command(["--timeline", str(out), str(tmp_path / "rec")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"harness analyze: {out}: the timeline could not be written: OSError: "
                   f"[Errno 28] No space left on device"]
    assert os.listdir(tmp_path / "out") == []
