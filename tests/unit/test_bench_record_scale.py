"""The scale benchmark of ``harness analyze`` (``harness.bench.recorder.scale``):
a job of N tasks built from a 2-task job's files reads as the 2-task job
did, worker 1 to blame, whatever each host's clock.  Here the 2-task job's
files are written by the recorder's own writer (tests/unit/test_record.py);
the benchmark's table comes from a real job's."""
import pytest

from harness.bench.recorder import scale as record_scale
from harness.record import analyze, files, judge
from tests.unit.test_record import fake_task

pytestmark = pytest.mark.timeout(60)


def test_a_job_built_from_two_tasks_names_the_culprit(tmp_path, monkeypatch):
    source = tmp_path / "source"
    source.mkdir()
    fake_task(monkeypatch, source, 0, 2, calls=5, blocked=True)   # waits in call 6
    fake_task(monkeypatch, source, 1, 2, calls=5)                  # never made it
    dirs = record_scale.replicate(str(source), 8, str(tmp_path / "job"))
    assert len(dirs) == 8
    tasks, problems = files.read_dirs(dirs)
    assert not problems and len(tasks) == 8
    analysis = analyze.observe(tasks)
    assert any("clock is" in n for n in analysis.notes), analysis.notes    # hosts set off
    verdict = judge.verdict(analysis)
    assert verdict.outcome == "hang" and verdict.culprits == (1,), verdict.text
    seconds, peak, status, first = record_scale.analyze(dirs)
    assert status == 1 and first.startswith("HANG") and "culprit: worker 1" in first, first
    assert seconds > 0 and peak > 0
