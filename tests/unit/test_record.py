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
from harness.record import analyze, commands, files, judge, watcher
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
    """And files a signal's dump that comes through its pipe under a
    header, the last one read after the process ended."""
    base = str(tmp_path / "w")
    read, write = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    w = subprocess.Popen([sys.executable, "-m", "harness.record.watcher", str(child.pid), base,
                          f"SIGTERM={read}"], pass_fds=(read,))
    os.close(read)
    try:
        time.sleep(0.5)
        os.write(write, b"Thread 0x1 (most recent call first):\n  File \"a.py\", line 1\n")
        child.send_signal(signal.SIGSTOP)
        time.sleep(0.6)
        child.send_signal(signal.SIGCONT)
        time.sleep(0.6)
        os.write(write, b"the second dump\n")
        child.kill()
        os.close(write)
        time.sleep(0.6)          # a zombie, not reaped yet: its status is read
        child.wait()
        assert w.wait(timeout=10) == 0
    finally:
        child.kill()
        w.kill()
        child.wait()
        w.wait()
    states = [json.loads(l) for l in open(base + files.WATCH).read().splitlines()]
    assert [s["state"] for s in states] == ["stopped", "running", "ended"]
    assert states[-1]["exit_code"] == -signal.SIGKILL
    stacks = open(base + files.STACKS).read()
    assert stacks.startswith("--- dump: SIGTERM ---\nThread 0x1") and \
        stacks.endswith("--- dump: SIGTERM ---\nthe second dump\n"), stacks
    dumps = [json.loads(l)["data"] for l in open(base + files.EVENTS)]
    assert [(d["reason"], d["offset"]) for d in dumps] == [
        ("SIGTERM", 0), ("SIGTERM", stacks.rindex("--- dump"))]


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
    (tmp_path / "a.meta.json").mkdir()
    (tmp_path / "file").write_text("")
    code, out = _analyze(capsys, tmp_path / "a.meta.json", tmp_path / "nowhere", tmp_path / "file")
    assert code == 2
    assert out.err.splitlines() == [
        f"harness analyze: {tmp_path / 'a.meta.json'}: no recorder's files in it (no *{files.META})",
        f"harness analyze: {tmp_path / 'nowhere'}: no such directory",
        f"harness analyze: {tmp_path / 'file'}: not a directory"]


def test_a_missing_task_is_a_candidate_and_bad_input_only_when_all_are_required(
        tmp_path, monkeypatch, capsys):
    fake_task(monkeypatch, tmp_path, 0, 3, calls=4, blocked=True)
    fake_task(monkeypatch, tmp_path, 2, 3, calls=4, blocked=True)
    code, out = _analyze(capsys, tmp_path)
    assert code == 1 and out.err == ""
    head = out.out.splitlines()[0]
    assert head.startswith("HANG: cannot tell who is to blame: worker 1 left no files") and \
        head.endswith("candidates: workers 0,1,2"), out.out
    code = commands.analyze_command([str(tmp_path), "--require-all"])
    out = capsys.readouterr()
    assert code == 2 and out.out == ""
    assert out.err.splitlines() == [
        "harness analyze: worker 1 left no files: it never started the recorder, or its "
        "directory was not gathered"]


def test_a_missing_task_is_never_overruled_by_the_others_culprit(tmp_path, monkeypatch):
    """Worker 0's files are lost; worker 1 skipped the call worker 2 waits
    in.  The others' files alone name worker 1, which worker 0's record
    could overturn (it may have skipped the call too): cannot tell, with
    both among the candidates, numbered as in the job."""
    fake_task(monkeypatch, tmp_path, 1, 3, calls=4)
    fake_task(monkeypatch, tmp_path, 2, 3, calls=4, blocked=True)
    analysis = _observe(tmp_path)
    assert analysis.missing == (0,) and analysis.positions == (1, 2)
    alone = diagnose(analysis.observation)
    assert alone.culprits == (0,) and "worker 1" in alone.text.splitlines()[0], alone.text
    verdict = judge.verdict(analysis)
    assert verdict.culprits == (0, 1) and verdict.ambiguous, verdict.text
    assert "from the others' files alone: HANG" in verdict.text


def _then(base, at, *, code=None, raised=False, dump=None):
    """What a task's files say after its fake_task: a dump, its end as its
    watcher saw it (``code``), an error it raised."""
    if dump:
        with open(base + files.EVENTS, "a") as f:
            f.write(json.dumps({"kind": files.DUMP, "time": at, "step": None,
                                "data": {"reason": dump, "offset": 0, "length": 0}}) + "\n")
    if raised:
        with open(base + files.EVENTS, "a") as f:
            f.write(json.dumps({"kind": files.EXIT, "time": at, "step": None, "data": {
                "how": files.RAISED, "status": 1, "error": {
                    "type_name": "UnavailableError", "message": "Socket closed"}}}) + "\n")
    if code is not None:
        with open(base + files.WATCH, "a") as f:
            f.write(json.dumps({"state": "ended", "time": at, "exit_code": code}) + "\n")


def _hung(monkeypatch, folder, n=3):
    """Worker 1 of ``n`` skipped call 6 and lingers; the others wait in it;
    every one dumped by t = 1009."""
    return [fake_task(monkeypatch, folder, i, n, calls=5, blocked=i != 1) for i in range(n)]


@pytest.mark.parametrize("term", [False, True])
def test_a_hang_killed_later_reads_as_the_hang(tmp_path, monkeypatch, term):
    """Killed 11 s after the dumps (SIGTERM first, or SIGKILL alone), one
    task's status unknown, a peer raising at the kill: the hang, worker 1
    named, and the kill told after it."""
    bases = _hung(monkeypatch, tmp_path)
    kill = 1020.0
    for i, base in enumerate(bases):
        if term:
            _then(base, kill + 0.01 * i, dump="SIGTERM")
        if i == 2:
            _then(base, kill + 0.1 + 3 * term, raised=True)
        _then(base, kill + 0.2 + 3 * term, code=-9 if i == 0 else analyze.EXIT_STATUS_UNKNOWN)
    analysis = _observe(tmp_path)
    verdict = judge.verdict(analysis)
    assert verdict.outcome == "hang" and verdict.culprits == (1,), verdict.text
    assert not verdict.ambiguous
    if term:
        assert analysis.ending.startswith(
            "then SIGTERM to every task 14.0 s after the job's last progress; "), analysis.ending
    else:
        assert analysis.ending.startswith(
            "then 14.1-14.2 s after the job's last progress: worker 0 was killed (SIGKILL), "
            "worker 1 ended (exit status unknown), worker 2 raised"), analysis.ending
    assert "worker 2 raised UnavailableError (after the kill: an echo, not evidence)" in \
        analysis.ending, analysis.ending


def test_a_task_killed_while_the_job_progressed_is_a_crash(tmp_path, monkeypatch):
    """Worker 1 is SIGKILLed at its 4th call (the OOM killer); its peers
    wait for it, dump, and are killed 10 s later: worker 1's crash."""
    bases = [fake_task(monkeypatch, tmp_path, i, 3, calls=3, blocked=i != 1, dump=i != 1)
             for i in range(3)]
    _then(bases[1], 1004.1, code=-9)
    for i in (0, 2):
        _then(bases[i], 1016.0, code=-9)
    verdict = judge.verdict(_observe(tmp_path))
    assert verdict.outcome == "crashed" and verdict.culprits == (1,), verdict.text


@pytest.mark.parametrize("damage, says", [
    (lambda base: open(base + files.META, "w").write('{"format": "pytest-mwms-rec'),
     "torn or not a recorder's file"),
    (lambda base: open(base + files.META, "w").write('{"format": "someone else"}'),
     "not a pytest-mwms recorder's file"),
    (lambda base: _set_meta(base, version=99), "written by another version of the recorder"),
    (lambda base: open(base + files.EVENTS, "a").write('{"kind": "step", "ti'),
     "line 7 is torn or not JSON"),
    (lambda base: open(base + files.PROGRESS, "r+b").truncate(10), "torn or not a progress map"),
    (lambda base: open(base + files.PROGRESS, "r+b").truncate(100), "torn or not a progress map"),
    (lambda base: _set_written(base, 40), "torn or not a progress map (a record of kind 0"),
    (lambda base: open(base + files.WATCH, "a").write('{"state": "end'), "line 1 is torn"),
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


def _set_written(base, count):
    """The progress map's count of records, set past those written."""
    with open(base + files.PROGRESS, "r+b") as f:
        f.seek(8)
        f.write(count.to_bytes(8, "little"))


def _set_meta(base, **changes):
    meta = json.loads(open(base + files.META).read())
    meta.update(changes)
    open(base + files.META, "w").write(json.dumps(meta))


# ------------------------------------------------------------- signal dumps

FRONT = r"""
import ctypes, os, signal, sys, time
from harness.record import signals
dump = open(sys.argv[1], "w")
front = signals.Front({signal.SIGTERM: dump}, always_chain=(signal.SIGTERM,))
front.arm_all()
signal.signal = signals.wrap_signal(signal.signal, front)
signal.signal(signal.SIGTERM, lambda *a: print("the job's handler ran", flush=True))
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.1)
libc = ctypes.CDLL(None)
libc.signal(signal.SIGTERM, ctypes.c_void_p(1))   # SIG_IGN, set in C as TensorFlow sets its own
front.check()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.1)
print("alive", flush=True)
"""


def test_the_dump_stays_in_front_of_handlers_set_later(tmp_path):
    """A handler the job sets through signal.signal runs after the dump;
    one set in C is found and put behind the dump again."""
    out = subprocess.run([sys.executable, "-c", FRONT, str(tmp_path / "dump")],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "the job's handler ran\nalive\n", out.stdout + out.stderr
    dumps = (tmp_path / "dump").read_text().count("most recent call first")
    assert dumps == 2, (tmp_path / "dump").read_text()
