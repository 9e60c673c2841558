"""The recorder's files, the watcher and the analyzer, fast and without
TensorFlow: tasks' files are written here by the recorder's own writer,
with the records a job would leave."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from harness.core import progress, protocol
from harness.diagnosis import diagnose
from harness.errors import SettingError
from harness.record import analyze, commands, files, watcher
from harness.record.recorder import Recorder, cluster_position
from harness.record.settings import check_dir, check_timeout


def _config(i, n, kind="worker"):
    return {"cluster": {"worker": [f"127.0.0.1:{2000 + k}" for k in range(n)]},
            "task": {"type": kind, "index": i}}


def fake_task(monkeypatch, folder, i, n, calls, *, blocked=False, end=None, dump=True,
              t0=1000.0):
    """Worker ``i`` of ``n``: a strategy made at t0, then ``calls`` calls of
    `step` (one all-reduce) that ended, one a second from t0 + 1, and with
    ``blocked`` one more that did not; ``end``: an exit record's ``how``
    (else a dump, with ``dump``), 3 s after the last call began."""
    monkeypatch.setenv("TF_CONFIG", json.dumps(_config(i, n)))
    r = Recorder(str(folder), timeout=2)
    r.send(protocol.STARTED)
    r.send(protocol.STRATEGY_CREATING, data={"tf_config": _config(i, n)})
    r.send(protocol.STRATEGY_CREATED, data=n)
    r.send(protocol.LEDGER_FUNCTION, data={"id": 0, "name": "step"})
    r.send(protocol.LEDGER_COLLECTIVE, data={"function": 0, "trace": 0, "index": 0,
                                             "kind": "all-reduce", "shape": [1],
                                             "dtype": "float32"})
    for k in range(calls + blocked):
        at = t0 + 1 + k
        r.writer.copy(progress.STEP, -1, k, 0, at)
        r.writer.copy(progress.CALL_BEGAN, 0, k + 1, k, at)
        if k < calls:
            r.writer.copy(progress.CALL_ENDED, 0, k + 1, progress.CALL_RETURNED, at + 0.01)
    if end is not None:
        r.exited(end, 0 if end == files.RETURNED else 1,
                 {"type_name": "UnavailableError", "message": "peer gone"}
                 if end == files.RAISED else None)
    elif dump:
        r.dump("no progress for 2 s")
    r.events.close()
    r.stack_file.close()
    # Every time of these files on one made-up clock: the meta's pair says
    # monotonic t0 was wall t0.
    meta_path = r.base + files.META
    meta = json.loads(open(meta_path).read())
    meta["clock"] = {"wall": t0, "monotonic": t0}
    files.write_meta(meta_path, meta)
    _retime_events(r.base + files.EVENTS, t0 + calls + blocked + 3)
    return r.base


def _retime_events(path, at):
    lines = [json.loads(l) for l in open(path)]
    with open(path, "w") as f:
        for k, e in enumerate(lines):
            e["time"] = at if e["kind"] in (files.DUMP, files.EXIT) else 1000.0 + k * 0.001
            f.write(json.dumps(e) + "\n")


# ----------------------------------------------------------------- settings

def test_settings_name_the_argument(tmp_path):
    assert check_timeout(None) is None and check_timeout("2.5") == 2.5
    for bad in (-1, "soon", float("nan"), True):
        with pytest.raises(SettingError, match="^timeout: "):
            check_timeout(bad)
    (tmp_path / "f").write_text("")
    with pytest.raises(SettingError, match="^dir: .* is not a directory"):
        check_dir(tmp_path / "f")
    with pytest.raises(SettingError, match="^dir: "):
        check_dir("")


def test_cluster_position_puts_the_chief_first():
    config = {"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"]},
              "task": {"type": "worker", "index": 1}}
    assert cluster_position(config) == (2, 3)
    assert cluster_position({**config, "task": {"type": "chief", "index": 0}}) == (0, 3)
    assert cluster_position(None) == (0, 1)


def test_file_names_carry_task_host_and_pid():
    assert files.stem(_config(1, 2), "node b", 42) == "worker-1.node_b.42"
    assert files.stem(None, "h", 7) == "task-pid7.h.7"


@pytest.mark.parametrize("argv, expect", [
    (["--dir", "d", "train.py", "--lr", "1"], (["--dir", "d"], "train.py", None, ["--lr", "1"])),
    (["--dir=d", "--", "train.py", "--", "x"], (["--dir=d"], "train.py", None, ["--", "x"])),
    (["--dir", "d", "-m", "pkg.train", "--", "--lr"], (["--dir", "d"], None, "pkg.train", ["--lr"])),
    (["--dir", "d"], (["--dir", "d"], None, None, [])),
])
def test_record_command_line_splits_at_the_script(argv, expect):
    assert commands.split_record(argv) == expect


# ------------------------------------------------------------------ the watcher

def test_wait_status_as_an_exit_code():
    assert watcher.wait_status_code(3 << 8) == 3
    assert watcher.wait_status_code(signal.SIGKILL) == -signal.SIGKILL


def test_the_watcher_sees_a_process_stop_and_end(tmp_path):
    path = tmp_path / "w.watch.jsonl"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    w = subprocess.Popen([sys.executable, "-m", "harness.record.watcher", str(child.pid),
                          str(path)])
    try:
        time.sleep(0.5)
        child.send_signal(signal.SIGSTOP)
        time.sleep(0.6)
        child.send_signal(signal.SIGCONT)
        time.sleep(0.6)
        child.kill()
        time.sleep(0.6)          # a zombie, not reaped yet: its status is read
        child.wait()
        assert w.wait(timeout=10) == 0
    finally:
        child.kill()
        w.kill()
        child.wait()
        w.wait()
    states = [json.loads(l) for l in path.read_text().splitlines()]
    assert [s["state"] for s in states] == ["stopped", "running", "ended"]
    assert states[-1]["exit_code"] == -signal.SIGKILL


# ------------------------------------------------------------------- clocks

def test_clock_offsets_from_when_calls_ended():
    ends = {0: {("step", 1): 10.0, ("step", 2): 11.0},
            1: {("step", 1): 50.01, ("step", 2): 51.0, ("step", 3): 52.0},
            2: {("other", 1): 3.0}}
    off = analyze.clock_offsets(ends)
    assert off[0] == 0.0 and off[1] == pytest.approx(40.005) and off[2] == 0.0
    assert analyze.clock_offsets({}) == {}


# ---------------------------------------------------------------- analysis

def _observe(folder):
    tasks, problems = files.read_dirs([str(folder)])
    assert not problems, problems
    return analyze.observe(tasks)


def test_a_worker_that_skipped_a_call_is_named(tmp_path, monkeypatch):
    fake_task(monkeypatch, tmp_path, 0, 2, calls=5, blocked=True)   # waits in call 6
    fake_task(monkeypatch, tmp_path, 1, 2, calls=5)     # skipped one: in Python, after 5
    obs = _observe(tmp_path).observation
    assert obs.ended_by == "hang" and obs.timeout == pytest.approx(3.0, abs=0.02)
    verdict = diagnose(obs)
    assert verdict.outcome == "hang" and verdict.culprits == (1,), verdict.text


def test_a_clean_run_completes(tmp_path, monkeypatch):
    for i in range(2):
        fake_task(monkeypatch, tmp_path, i, 2, calls=4, end=files.RETURNED)
    verdict = diagnose(_observe(tmp_path).observation)
    assert verdict.outcome == "completed", verdict.text


def test_a_job_still_running_is_not_judged(tmp_path, monkeypatch):
    fake_task(monkeypatch, tmp_path, 0, 2, calls=4, blocked=True, dump=False)
    fake_task(monkeypatch, tmp_path, 1, 2, calls=4, blocked=True, dump=False)
    analysis = _observe(tmp_path)
    assert analysis.observation is None and "running" in analysis.running


def test_a_restarted_task_is_read_from_its_last_process(tmp_path, monkeypatch):
    fake_task(monkeypatch, tmp_path, 0, 2, calls=4, end=files.RETURNED)
    first = fake_task(monkeypatch, tmp_path, 1, 2, calls=2, end=files.RAISED, t0=900.0)
    os.rename(first + files.META, first + ".old" + files.META)   # another pid's stem
    for ext in (files.PROGRESS, files.EVENTS, files.STACKS):
        os.rename(first + ext, first + ".old" + ext)
    fake_task(monkeypatch, tmp_path, 1, 2, calls=4, end=files.RETURNED)
    analysis = _observe(tmp_path)
    assert any("worker 1: 2 processes recorded" in n for n in analysis.notes), analysis.notes
    assert diagnose(analysis.observation).outcome == "completed"


# ---------------------------------------------------------------- bad input

def _analyze(capsys, *dirs):
    code = commands.analyze_command([str(d) for d in dirs])
    return code, capsys.readouterr()


def test_an_empty_directory_is_one_line_and_status_2(tmp_path, capsys):
    code, out = _analyze(capsys, tmp_path, tmp_path / "nowhere")
    assert code == 2
    assert out.err.splitlines() == [
        f"harness analyze: {tmp_path}: no recorder's files in it (no *{files.META})",
        f"harness analyze: {tmp_path / 'nowhere'}: no such directory"]


def test_a_missing_task_is_named_not_called_a_crash(tmp_path, monkeypatch, capsys):
    fake_task(monkeypatch, tmp_path, 0, 3, calls=4, blocked=True)
    fake_task(monkeypatch, tmp_path, 2, 3, calls=4, blocked=True)
    code, out = _analyze(capsys, tmp_path)
    assert code == 2 and out.out == ""
    assert out.err.splitlines() == [
        "harness analyze: worker 1 left no files: it never started the recorder, or its "
        "directory was not gathered"]


@pytest.mark.parametrize("damage, says", [
    (lambda base: open(base + files.META, "w").write('{"format": "pytest-mwms-rec'),
     "torn or not a recorder's file"),
    (lambda base: open(base + files.META, "w").write('{"format": "someone else"}'),
     "not a pytest-mwms recorder's file"),
    (lambda base: _set_meta(base, version=99), "written by another version of the recorder"),
    (lambda base: open(base + files.EVENTS, "a").write('{"kind": "step", "ti'),
     "line 7 is torn or not JSON"),
    (lambda base: open(base + files.PROGRESS, "r+b").truncate(10), "torn or not a progress map"),
    (lambda base: os.unlink(base + files.EVENTS), "missing"),
])
def test_a_torn_or_foreign_file_is_one_line_naming_it(tmp_path, monkeypatch, capsys, damage,
                                                     says):
    base = fake_task(monkeypatch, tmp_path, 0, 2, calls=4)
    fake_task(monkeypatch, tmp_path, 1, 2, calls=4)
    damage(base)
    code, out = _analyze(capsys, tmp_path)
    assert code == 2
    lines = out.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"harness analyze: {base}") and says in lines[0], \
        out.err


def _set_meta(base, **changes):
    meta = json.loads(open(base + files.META).read())
    meta.update(changes)
    open(base + files.META, "w").write(json.dumps(meta))
