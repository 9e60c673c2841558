"""``harness analyze`` on recordings nobody should trust: FIFOs, links out
of the recording, huge sparse files, JSON nested past the parser, wrong
types and numbers out of range give the one-line exit 2 naming the file,
quickly and in little memory; and a fuzz test over the files' formats and
the directory's shape holds "exit 2 or a verdict, never a traceback".

The fuzz test runs a short, fixed search in the suite; set
``MWMS_FUZZ_MINUTES`` to search for that long with fresh draws
(docs/contributors.md)."""
import contextlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from harness.core import progress
from harness.record import commands, files
from tests.recordings import write_hang, write_task

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Runs `python -m harness analyze DIR` as its only child, and prints its
# exit status, seconds and peak memory (KiB): RUSAGE_CHILDREN here is that
# child's alone, whatever the test process ran before.
MEASURE = """
import resource, subprocess, sys, time
began = time.monotonic()
done = subprocess.run([sys.executable, "-m", "harness", "analyze", sys.argv[1]],
                      capture_output=True, text=True, timeout=60)
took = time.monotonic() - began
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(done.returncode, took, peak)
sys.stdout.write(done.stderr)
"""
SECONDS, MIB = 2.0, 200


def _measured(folder):
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", MEASURE, str(folder)], check=False, capture_output=True,
                         text=True, timeout=120, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    head, *err = out.stdout.splitlines()
    code, took, peak = head.split()
    return int(code), float(took), int(peak) / 1024, err


def _write(path, data, mode="w"):
    with open(path, mode) as f:
        f.write(data)


def _read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


def _base(folder, i):
    """Worker ``i``'s files' base path in ``folder``."""
    name = next(n for n in os.listdir(folder) if n.startswith(f"worker-{i}.")
                and n.endswith(files.META))
    return os.path.join(str(folder), name[: -len(files.META)])


def _fifo(path):
    os.mkfifo(path)


def _to_dev_zero(path):
    os.symlink("/dev/zero", path)


def _sparse_gigabyte(path):
    with open(path, "wb") as f:
        f.truncate(1 << 30)   # no byte written: the disk holds none of it


def _nested(path):
    with open(path, "w") as f:
        f.write("[" * 100_000 + "]" * 100_000)


HOSTILE = {"fifo": _fifo, "symlink to /dev/zero": _to_dev_zero,
           "1 GiB sparse file": _sparse_gigabyte, "nested JSON": _nested}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("suffix", [files.META, files.EVENTS, files.PROGRESS, files.STACKS,
                                    files.WATCH])
@pytest.mark.parametrize("make", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_hostile_file_is_exit_2_quickly_and_in_little_memory(tmp_path, make, suffix):
    """Each hostile file in place of one of a valid recording's: exit 2,
    one line naming it, in under 2 s and 200 MiB; a stack file is only
    ever read in part, so a sparse one is read, never refused."""
    write_hang(str(tmp_path))
    path = _base(tmp_path, 0) + suffix
    if os.path.lexists(path):
        os.unlink(path)
    make(path)
    code, took, peak, err = _measured(tmp_path)
    sparse_stacks = suffix == files.STACKS and make in (_sparse_gigabyte, _nested)
    if sparse_stacks:
        assert code == 1, err      # the verdict, from the stacks' last 16 MiB
    else:
        assert code == 2 and len(err) == 1 and err[0].startswith(f"harness analyze: {path}"), err
    assert took < SECONDS and peak < MIB, (took, peak)


# ------------------------------------------------------------- wrong values

def _meta(base, **changes):
    meta = json.loads(_read(base + files.META))
    meta.update(changes)
    return meta


def _set_meta(base, text):
    with open(base + files.META, "w") as f:
        f.write(text)


def _add_event(base, line):
    with open(base + files.EVENTS, "a") as f:
        f.write(line + "\n")


def _record(base, slot, kind, function, number, detail, at, written=None):
    with open(base + files.PROGRESS, "r+b") as f:
        f.seek(progress.HEADER_SIZE + slot * progress.RECORD.size)
        f.write(progress.RECORD.pack(kind, function, number, detail, at))
        if written is not None:
            f.seek(8)
            f.write(struct.pack("<Q", written))


CLOCK = {"wall": 1000.0, "monotonic": 1000.0}
WRONG = {
    "a NaN clock": (lambda b: _set_meta(b, json.dumps(_meta(b, clock={
        "wall": float("nan"), "monotonic": 1000.0}))), "torn or not a recorder's file"),
    "an infinite clock": (lambda b: _set_meta(b, json.dumps(_meta(b, clock={
        "wall": 1000.0, "monotonic": float("inf")}))), "torn or not a recorder's file"),
    "a clock of 1e308": (lambda b: _set_meta(b, json.dumps(_meta(b, clock={
        "wall": 1e308, "monotonic": 1000.0}))), "'wall' is 1e+308"),
    "a clock of 1e999": (lambda b: _set_meta(b, json.dumps(_meta(b, clock=CLOCK))
                                           .replace('"wall": 1000.0', '"wall": 1e999')),
                         "beyond a float"),
    "a negative clock": (lambda b: _set_meta(b, json.dumps(_meta(b, clock={
        "wall": -5, "monotonic": 1000.0}))), "'wall' is -5"),
    "a string clock": (lambda b: _set_meta(b, json.dumps(_meta(b, clock={
        "wall": "1000", "monotonic": 1000.0}))), "'wall' is '1000', not a number"),
    "a list for a meta": (lambda b: _set_meta(b, "[1, 2]"), "not a pytest-mwms recorder's file"),
    "a task index of a string": (lambda b: _set_meta(b, json.dumps(_meta(b, tf_config={
        "cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "0"}}))),
        "task's 'index' is '0'"),
    "bad UTF-8": (lambda b: _write(b + files.META, b'\xff\xfe', "ab"),
                  "torn or not a recorder's file"),
    "a lone surrogate": (lambda b: _set_meta(b, json.dumps(_meta(b, host="\ud800"))),
                         "not Unicode text"),
    "an event at NaN": (lambda b: _add_event(b, '{"kind": "started", "time": NaN}'),
                        "line 7 is torn or not JSON"),
    "an event at 1e308": (lambda b: _add_event(b, '{"kind": "started", "time": 1e308}'),
                          "line 7 is not a recorder's (the event's 'time' is 1e+308"),
    "an event of a string time": (lambda b: _add_event(b, '{"kind": "started", "time": "x"}'),
                                  "'time' is 'x', not a number"),
    "an event of no kind": (lambda b: _add_event(b, '{"time": 1}'), "has no 'kind'"),
    "an event of an unknown kind": (lambda b: _add_event(b, '{"kind": "x", "time": 1}'),
                                    "kind 'x' is none the recorder writes"),
    "an event of a list": (lambda b: _add_event(b, '[1]'), "the event is [1], not an object"),
    "a function id of a string": (lambda b: _add_event(
        b, '{"kind": "ledger_function", "time": 1, "data": {"id": "a", "name": "f"}}'),
        "'id' is 'a', not an integer"),
    "a dump at a negative offset": (lambda b: _add_event(
        b, '{"kind": "dump", "time": 1, "data": {"reason": "r", "offset": -1, "length": 1}}'),
        "'offset' is -1"),
    "an exit of another how": (lambda b: _add_event(
        b, '{"kind": "exit", "time": 1, "data": {"how": "vanished"}}'), "'how' is 'vanished'"),
    "an error of a list": (lambda b: _add_event(
        b, '{"kind": "exit", "time": 1, "data": {"how": "raised", "error": [1]}}'),
        "'error' is [1], not an object"),
    "a huge integer": (lambda b: _add_event(b, '{"kind": "step", "time": 1, "step": '
                                            + "9" * 5000 + "}"), "line 7 is torn or not JSON"),
    "a step of 2**64": (lambda b: _add_event(b, '{"kind": "step", "time": 1, "step": '
                                             + str(2 ** 64) + "}"), "'step' is 18446744073709551616"),
    "deep data": (lambda b: _add_event(b, '{"kind": "fault", "time": 1, "data": '
                                       + "[" * 500 + "]" * 500 + "}"), "nests deeper than 32"),
    "a record at NaN": (lambda b: _record(b, 0, progress.STEP, -1, 0, 0, float("nan")),
                        "not a number of seconds"),
    "a record at -inf": (lambda b: _record(b, 0, progress.STEP, -1, 0, 0, float("-inf")),
                         "not a number of seconds"),
    "a record at 1e308": (lambda b: _record(b, 0, progress.STEP, -1, 0, 0, 1e308),
                          "not a number of seconds"),
    "a record of a negative call": (lambda b: _record(b, 1, progress.CALL_BEGAN, 0, -7, 0,
                                                      1001.0), "number is -7"),
    "a written count of 2**63": (lambda b: _record(b, 0, progress.STEP, -1, 0, 0, 1001.0,
                                                   written=2 ** 63), "more than 2**53"),
    "too many lines": (lambda b: _write(b + files.EVENTS, '{"kind": "drain", "time": 1}\n'
                                        * (files.MAX_LINES[files.EVENTS] + 1)),
                       "65537 lines, more than"),
    "too many values": (lambda b: _add_event(b, '{"kind": "fault", "time": 1, "data": ['
                                             + "0," * files.MAX_VALUES + '0]}'),
                        "JSON values, more than"),
    "a watch line of no state": (lambda b: _write(b + files.WATCH, '{"time": 1}\n'),
                                 "has no 'state'"),
    "a watch line at inf": (lambda b: _write(
        b + files.WATCH, '{"state": "ended", "time": Infinity}\n'), "line 1 is torn or not JSON"),
}


@pytest.mark.parametrize("damage, says", list(WRONG.values()), ids=list(WRONG))
def test_a_wrong_value_is_one_line_naming_the_file(tmp_path, capsys, damage, says):
    bases = [write_task(str(tmp_path), i, 2, calls=4) for i in range(2)]
    damage(bases[0])
    code = commands.analyze_command([str(tmp_path)])
    out = capsys.readouterr()
    lines = out.err.splitlines()
    assert code == 2 and out.out == "", out
    assert len(lines) == 1 and lines[0].startswith(f"harness analyze: {bases[0]}") and \
        says in lines[0], lines


def test_a_stack_file_past_its_limit_is_read_from_its_end(tmp_path, monkeypatch, capsys):
    """The dump in the last bytes read is shown; one before them is out of
    reach, and the verdict stands without its stacks."""
    monkeypatch.setitem(files.LIMITS, files.STACKS, 4096)
    write_hang(str(tmp_path))
    waiting = _base(tmp_path, 0)
    with open(waiting + files.STACKS, "r+") as f:
        old = f.read()
        f.seek(0)
        f.write("x" * 10_000 + old)   # the dump now lies past the first 10000 bytes
    lines = _read(waiting + files.EVENTS).splitlines()
    dump = json.loads(lines[-1])
    dump["data"]["offset"] = 10_000
    lines[-1] = json.dumps(dump)
    _write(waiting + files.EVENTS, "\n".join(lines) + "\n")
    assert commands.analyze_command([str(tmp_path)]) == 1
    assert "--- worker 0 (" in capsys.readouterr().out
    dump["data"]["offset"] = 10
    lines[-1] = json.dumps(dump)
    _write(waiting + files.EVENTS, "\n".join(lines) + "\n")
    assert commands.analyze_command([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("HANG") and "--- worker 0 (" not in out, out


def test_a_name_the_recorder_never_makes_is_refused(tmp_path, capsys):
    write_hang(str(tmp_path))
    odd = os.path.join(str(tmp_path), "\x1b[2Jworker-9" + files.META)
    shutil.copy(next(os.path.join(tmp_path, n) for n in os.listdir(tmp_path)
                     if n.endswith(files.META)), odd)
    assert commands.analyze_command([str(tmp_path)]) == 2
    shown = odd.replace("\x1b", "\\x1b")   # printed, never obeyed by the terminal
    assert capsys.readouterr().err == f"harness analyze: {shown}: not a recorder's file name " \
        f"(a recorder's are STEM{files.META}, STEM of letters, digits, '_', '.', '-')\n"


# ------------------------------------------------------------------- fuzzing

EXAMPLES = 150     # the suite's short search (a few seconds)
FUZZ_MINUTES = float(os.environ.get("MWMS_FUZZ_MINUTES", "0") or 0)
EXAMPLE_SECONDS = 10.0     # generous: a few tenths on a loaded machine
EXAMPLE_BYTES = 200 << 20

HOSTILE_NUMBERS = st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e308, -1e308,
                                   -1, -1.5, 0, 2 ** 53, 2 ** 53 + 1, 2 ** 63, 2 ** 64, -2 ** 63,
                                   1e11, 1e11 + 1])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | HOSTILE_NUMBERS | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=8)
FILE_KINDS = (files.META, files.PROGRESS, files.EVENTS, files.STACKS, files.WATCH)


def _paths(folder):
    return sorted(os.path.join(folder, n) for n in os.listdir(folder))


def _walk_set(obj, draw, value):
    """``obj`` with a value somewhere in it (a drawn path) replaced by
    ``value``, or a key there deleted (``value`` is ``_DELETE``)."""
    if not isinstance(obj, (dict, list)) or not obj or draw(st.booleans()):
        return value if value is not _DELETE else None
    if isinstance(obj, dict):
        key = draw(st.sampled_from(sorted(obj)))
        if value is _DELETE and not isinstance(obj[key], (dict, list)):
            del obj[key]
        else:
            obj[key] = _walk_set(obj[key], draw, value)
    else:
        i = draw(st.integers(0, len(obj) - 1))
        obj[i] = _walk_set(obj[i], draw, value)
    return obj


_DELETE = object()


def _mutate_json(path, draw):
    data = _read(path, "rb")
    lines = data.splitlines() if not path.endswith(files.META) else [data]
    if not lines:
        return
    k = draw(st.integers(0, len(lines) - 1))
    try:
        obj = json.loads(lines[k])
    except (ValueError, RecursionError):
        return
    value = draw(st.one_of(JSON_VALUES, st.just(_DELETE)))
    lines[k] = json.dumps(_walk_set(obj, draw, value)).encode(errors="surrogatepass")
    _write(path, b"\n".join(lines) + b"\n", "wb")


def _mutate_record(path, draw):
    slot = draw(st.integers(0, 40))
    kind = draw(st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 255]))
    ints = st.integers(-2 ** 31, 2 ** 31 - 1), st.integers(-2 ** 63, 2 ** 63 - 1)
    at = draw(HOSTILE_NUMBERS.map(float) | st.floats(0, 2000))
    with open(path, "r+b") as f:
        f.seek(progress.HEADER_SIZE + slot * progress.RECORD.size)
        f.write(progress.RECORD.pack(kind, draw(ints[0]), draw(ints[1]), draw(ints[1]), at))
        if draw(st.booleans()):
            f.seek(8)
            f.write(struct.pack("<Q", draw(st.sampled_from([0, 1, 41, 65536, 65537, 2 ** 53,
                                                            2 ** 64 - 1]))))


def _replace(path, make):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
    make(path)


def _outside_meta(path):
    """A link to a valid meta file outside the recording (the test's own)."""
    os.symlink(_OUTSIDE[0], path)


_OUTSIDE = [os.devnull]

def _garbage(path, draw):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(draw(st.integers(0, size)))
        f.write(draw(st.binary(min_size=1, max_size=32)))


MUTATIONS = {
    "truncate": lambda path, draw: os.truncate(path, draw(st.integers(
        0, os.path.getsize(path)))),
    "garbage": _garbage,
    "json": _mutate_json,
    "record": lambda path, draw: _mutate_record(path, draw) if path.endswith(files.PROGRESS)
    else _mutate_json(path, draw),
    "delete": lambda path, draw: _replace(path, lambda p: None),
    "fifo": lambda path, draw: _replace(path, os.mkfifo),
    "directory": lambda path, draw: _replace(path, os.mkdir),
    "link to /dev/zero": lambda path, draw: _replace(path, _to_dev_zero),
    "link out": lambda path, draw: _replace(path, _outside_meta),
    "dangling link": lambda path, draw: _replace(path, lambda p: os.symlink(p + ".gone", p)),
    "link inside": lambda path, draw: _replace(
        path, lambda p: os.symlink(os.path.basename(_paths(os.path.dirname(p))[0]), p)),
    "sparse": lambda path, draw: os.truncate(path, draw(st.sampled_from(
        [files.LIMITS[k] + d for k in FILE_KINDS for d in (-1, 0, 1)] + [1 << 30]))),
    "nested": lambda path, draw: _write(
        path, "[" * draw(st.sampled_from([31, 33, 990, 100_000])) + "]"),
    "duplicate lines": lambda path, draw: _write(path, _read(path, "rb"), "ab"),
}


def _extra(folder, draw):
    """Files the recorder did not write: a task's files again under another
    stem, one of its files copied under a drawn stem, or a stray file of a
    recorder's suffix."""
    metas = [p for p in _paths(folder) if p.endswith(files.META)]
    if metas and draw(st.booleans()):   # a task recorded twice: a restarted process's files
        base = draw(st.sampled_from(metas))[: -len(files.META)]
        for suffix in FILE_KINDS:
            if os.path.isfile(base + suffix) and not os.path.islink(base + suffix) \
                    and not os.path.lexists(base + ".9" + suffix):
                shutil.copy(base + suffix, base + ".9" + suffix)
        return
    stem = draw(st.text(st.characters(codec="utf-8", exclude_characters="/\x00"),
                        min_size=1, max_size=12))
    suffix = draw(st.sampled_from(FILE_KINDS))
    target = os.path.join(folder, stem + suffix)
    if os.path.lexists(target):
        return
    if draw(st.booleans()):
        source = draw(st.sampled_from(_paths(folder)))
        if os.path.isfile(source) and not os.path.islink(source):
            shutil.copy(source, target)
    else:
        _write(target, draw(st.binary(max_size=64)), "wb")


@st.composite
def recordings(draw):
    """A drawn recording's maker: valid tasks, then mutations."""
    n = draw(st.integers(1, 3))
    tasks = [dict(calls=draw(st.integers(0, 4)), blocked=draw(st.booleans()),
                  end=draw(st.sampled_from([None, files.RETURNED, files.RAISED, files.EXITED])),
                  dump=draw(st.booleans()), code=draw(st.sampled_from([None, 0, 1, -9, -11])),
                  t0=draw(st.sampled_from([1000.0, 1000.5, 5e8])))
             for _ in range(n)]
    present = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    changes = draw(st.integers(0, 4))
    return n, tasks, present, changes


def _analyze(folder, timeline=None):
    out, err = io.StringIO(), io.StringIO()
    tracemalloc.start()
    began = time.monotonic()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = commands.analyze_command(
                [folder] + (["--timeline", timeline] if timeline else []))
        took = time.monotonic() - began
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return code, out.getvalue(), err.getvalue(), took, peak


def _check_fuzzed(data, counter):
    n, tasks, present, changes = data.draw(recordings())
    with tempfile.TemporaryDirectory(prefix="mwms-fuzz-") as folder:
        for i, (task, there) in enumerate(zip(tasks, present)):
            if there or not any(present):
                write_task(folder, i, n, **task)
        for _ in range(changes):
            if data.draw(st.booleans()) or not os.listdir(folder):
                _extra(folder, data.draw)
                continue
            path = data.draw(st.sampled_from(_paths(folder)))
            name = data.draw(st.sampled_from(sorted(MUTATIONS)))
            if (os.path.isfile(path) and not os.path.islink(path)) or name in (
                    "delete", "fifo", "directory", "link to /dev/zero", "link out",
                    "dangling link", "link inside"):
                MUTATIONS[name](path, data.draw)
        with tempfile.TemporaryDirectory(prefix="mwms-fuzz-timeline-") as drawn:
            timeline = os.path.join(drawn, "t")
            code, out, err, took, peak = _analyze(folder, timeline)
            written = sorted(os.listdir(drawn))
        counter[code] = counter.get(code, 0) + 1
        # A verdict comes with its timeline, whole; an exit 2, or a job
        # still running (no verdict yet), leaves none.
        verdict = code != 2 and "RUNNING: " not in out
        assert written == (["t.svg", "t.trace.json"] if verdict else []), (code, written, err)
    (out + err).encode()    # printable as it would be to a terminal
    assert took < EXAMPLE_SECONDS and peak < EXAMPLE_BYTES, (took, peak)
    if code == 2:
        assert out == "" and err and all(line.startswith("harness analyze: ")
                                         for line in err.splitlines()), (out, err)
    else:
        assert code in (0, 1) and err == "" and out.strip(), (code, out, err)


def _searched(examples, derandomize):
    counter = {}

    @settings(max_examples=examples, derandomize=derandomize, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def search(data):
        _check_fuzzed(data, counter)

    search()
    return counter


@pytest.mark.timeout(600 + 60 * FUZZ_MINUTES)
def test_fuzzed_recordings_give_exit_2_or_a_verdict(tmp_path):
    """Valid recordings of 1-3 tasks, mutated (truncated, garbled, values
    of wrong types or out of range, files removed, added, or replaced by a
    FIFO, a directory or a link in or out): exit 2 with one line a
    problem, or a verdict; never a traceback, each within
    EXAMPLE_SECONDS and EXAMPLE_BYTES (traced)."""
    _OUTSIDE[0] = write_task(str(tmp_path), 0, 1, calls=1, end=files.RETURNED) + files.META
    counter = _searched(EXAMPLES, derandomize=True)
    assert sum(counter.values()) == EXAMPLES and set(counter) >= {1, 2}, counter
    if FUZZ_MINUTES:
        total, until = dict(counter), time.monotonic() + 60 * FUZZ_MINUTES
        while time.monotonic() < until:
            for code, k in _searched(500, derandomize=False).items():
                total[code] = total.get(code, 0) + k
        print(f"\nfuzzed for {FUZZ_MINUTES:g} min: {sum(total.values())} recordings, "
              f"exit statuses {dict(sorted(total.items()))}")
