"""Port reservation between processes and between users (issue 10).

No TensorFlow.  The tests with two users switch to unprivileged uids with
``setpriv`` and need root; elsewhere they are skipped, saying why.  Their
child processes load ``harness/launch/ports.py`` and ``harness/errors.py`` by path
(a bare ``harness`` package object pointing at the checkout's ``harness/``),
so they need only a Python the other uid can run and a checkout it can read.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness.launch import ports as ports_module, scratch
from harness.errors import HarnessError, StateDirError
from harness.launch.ports import bindable, port_range, reserve_ports
from harness.launch.state_dir import DIR_NAME, ENV_VAR, INI_OPTION, check_state_dir

HARNESS_DIR = str(Path(__file__).resolve().parent.parent / "harness")

# Run as ``python -I -B -c CHILD HARNESS_DIR JSON``: SAME_USER + [JSON].
CHILD = r"""
import importlib.util, json, os, sys, time, types
# Load harness/errors.py, harness/launch/state_dir.py and harness/launch/ports.py from
# the directory given, by
# path: not harness/__init__.py, and not an installed harness.
for name, path in (("harness", ""), ("harness.launch", "launch")):
    pkg = types.ModuleType(name)
    pkg.__path__ = [os.path.join(sys.argv[1], path)]
    sys.modules[name] = pkg
for name in ("errors", "launch.state_dir", "launch.ports"):
    spec = importlib.util.spec_from_file_location(
        "harness." + name, os.path.join(sys.argv[1], name.replace(".", "/") + ".py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
from harness.errors import StateDirError
from harness.launch.ports import reserve_ports
p = json.loads(sys.argv[2])
mode = p["mode"]
if mode == "probe":
    print("ok")
    sys.exit(0)
if mode == "squat":                   # a file under every port's name, half unreadable
    made = 0
    for port in range(p["range"][0], p["range"][1]):
        try:
            os.close(os.open(os.path.join(p["state_dir"], str(port)),
                             os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644 if port % 2 else 0))
            made += 1
        except FileExistsError:
            pass
    print(json.dumps(made))
    sys.exit(0)
kw = dict(state_dir=p["state_dir"], port_range=tuple(p["range"]), attempts=p.get("attempts", 2000))
if mode == "error":
    try:
        reserve_ports(p["n"], **kw).close()
    except StateDirError as e:
        print(json.dumps({"error": str(e)}))
    else:
        print(json.dumps({"error": None}))
elif mode == "hold":                  # reserve, say which, hold until stdin closes
    r = reserve_ports(p["n"], **kw)
    print(json.dumps(r.ports), flush=True)
    sys.stdin.read()
    r.close()
elif mode == "rounds":                # reserve, hold a moment, release; many times
    print("ready", flush=True)
    sys.stdin.readline()              # go
    records = []
    for _ in range(p["rounds"]):
        with reserve_ports(p["n"], **kw) as r:
            t0 = time.monotonic()
            time.sleep(p["hold"])
            t1 = time.monotonic()
        records.append([t0, t1, r.ports])
    print(json.dumps(records))
"""
SAME_USER = [sys.executable, "-I", "-B", "-c", CHILD, HARNESS_DIR]


# --------------------------------------------------------------------------
# helpers


def free_range(k):
    """``k`` consecutive bindable ports, below both the harness's own band
    (15000-32768, so concurrent harness runs never draw them) and the
    ephemeral range."""
    starts = list(range(10000, 15000 - k, k))
    for lo in random.sample(starts, len(starts)):
        if all(bindable(p) for p in range(lo, lo + k)):
            return lo, lo + k
    pytest.skip(f"no {k} consecutive free ports in 10000-15000")


def user(uid):
    """How the messages name a uid."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def entries(path):
    return sorted(os.listdir(path))


@pytest.fixture
def shared_tmp():
    """A directory under the system temp dir made like /tmp (1777), so that
    other uids can reach and create things in it (``tmp_path`` lies under a
    0700 directory of root's)."""
    d = tempfile.mkdtemp(prefix="mwms-test-ports-")
    scratch.remove_at_end(d)   # also when pytest is killed
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def state(shared_tmp):
    """A state directory path that does not exist yet: the harness makes it."""
    return os.path.join(shared_tmp, "state")


def _overlapping_collisions(records_a, records_b):
    """(pairs of holds overlapping in time, those that share a port)."""
    overlaps, collisions = 0, []
    for a0, a1, pa in records_a:
        for b0, b1, pb in records_b:
            if a0 < b1 and b0 < a1:
                overlaps += 1
                if set(pa) & set(pb):
                    collisions.append((pa, pb))
    return overlaps, collisions


def _run_rounds(commands, params):
    """Start one ``rounds`` child per command, release them at once, return
    each one's records."""
    procs = [subprocess.Popen(cmd + [json.dumps(params)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd="/",
                              env={"PATH": "/usr/bin:/bin", "HOME": "/"})
             for cmd in commands]
    try:
        for p in procs:
            line = p.stdout.readline()
            assert line == "ready\n", (line, p.stderr.read())
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    return [json.loads(out) for out, _ in outs]


# --------------------------------------------------------------------------
# two users at once (root only)

def _unused_uid():
    for uid in range(65533, 65000, -1):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    pytest.skip("no unused uid in 65001-65533")


@pytest.fixture(scope="module")
def as_user():
    """``as_user(uid)``: the command line, but for its last argument (the
    JSON parameters), running CHILD as ``uid`` on a world-readable copy of
    ``harness/errors.py`` and ``harness/launch/ports.py`` (the checkout itself may lie
    where other users cannot read, as under /root)."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run processes as two other (unprivileged) uids")
    setpriv = shutil.which("setpriv")
    if not setpriv:
        pytest.skip("needs setpriv (util-linux) to switch uids")
    uids = [65534, _unused_uid()]
    copy = tempfile.mkdtemp(prefix="mwms-test-harness-")
    scratch.remove_at_end(copy)   # also when pytest is killed
    try:
        os.chmod(copy, 0o755)
        os.mkdir(os.path.join(copy, "launch"), 0o755)
        for name in ("errors.py", "launch/state_dir.py", "launch/ports.py"):
            shutil.copyfile(os.path.join(HARNESS_DIR, name), os.path.join(copy, name))
            os.chmod(os.path.join(copy, name), 0o644)
        reasons = []
        for python in ["/usr/bin/python3", "/usr/local/bin/python3", sys.executable]:
            if not os.path.exists(python):
                continue

            def command(uid, python=python):
                return [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
                        python, "-I", "-B", "-c", CHILD, copy]
            for uid in uids:
                r = subprocess.run(command(uid) + [json.dumps({"mode": "probe"})], cwd="/",
                                   capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
                if r.stdout.strip() != "ok":
                    last = (r.stderr.strip().splitlines() or ["no output"])[-1]
                    reasons.append(f"{python} as uid {uid}: {last}")
                    break
            else:
                command.uids = uids
                yield command
                return
        pytest.skip("no Python that uids 65534 and another can run and that loads a copy of "
                    f"harness/launch/ports.py in {copy}: " + "; ".join(reasons))
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def test_two_users_reserve_at_once_without_collision_or_lockout(as_user, state):
    """Uid 65534 and another unused uid, each 25 times: reserve 2 of 4 ports,
    hold them 20 ms, release.  They start together, so they hold at the same
    time again and again; no port is ever held by both, neither fails (a
    lockout or an exhausted range would raise), and nothing is left."""
    lo, hi = free_range(4)
    a, b = as_user.uids
    rec_a, rec_b = _run_rounds([as_user(a), as_user(b)], dict(
        mode="rounds", state_dir=state, range=[lo, hi], n=2, rounds=25, hold=0.02))
    assert len(rec_a) == len(rec_b) == 25
    overlaps, collisions = _overlapping_collisions(rec_a, rec_b)
    assert overlaps >= 10, "the two users hardly ever held ports at the same time"
    assert not collisions, f"{len(collisions)} of {overlaps} overlapping holds shared a port"
    st = os.lstat(state)
    assert stat.S_IMODE(st.st_mode) == 0o1777 and st.st_uid in (a, b)  # made like /tmp
    assert entries(state) == []


def test_second_user_gets_a_clear_error_for_a_directory_it_cannot_use(as_user, shared_tmp):
    """The issue's case: the directory exists, made by root 0755; another
    user's run says what is wrong and what to do (not a bare PermissionError)."""
    d = os.path.join(shared_tmp, "rootonly")
    os.mkdir(d)
    os.chmod(d, 0o755)
    lo, hi = free_range(2)
    out = subprocess.run(as_user(65534) + [json.dumps(
        dict(mode="error", state_dir=d, range=[lo, hi], n=1))],
        capture_output=True, text=True, cwd="/", env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    message = json.loads(out.stdout)["error"]
    assert message is not None
    for part in (d, f"owner {user(0)}", "mode 0755", "drwxr-xr-x", f"you ({user(65534)})",
                 "cannot create files", ENV_VAR, INI_OPTION, f"chmod 1777 {d}"):
        assert part in message, (part, message)


def test_another_users_lock_file_is_left_alone_and_locks_nobody_out(as_user, state):
    """A lock file of another user (say their run was SIGKILLed holding the
    port, or planted) is neither locked, nor removed, nor changed, and its
    port is still ours to reserve: the claim (an abstract socket name) is
    what holds a port across users."""
    lo, hi = free_range(2)
    reserve_ports(1, state_dir=state, port_range=(lo, hi)).close()  # makes the directory
    theirs = os.path.join(state, str(lo))
    with open(theirs, "w") as f:
        f.write("x")
    os.chown(theirs, 65534, 65534)
    before = os.lstat(theirs)
    for _ in range(20):
        with reserve_ports(2, state_dir=state, port_range=(lo, hi)) as r:
            assert sorted(r.ports) == [lo, lo + 1]   # theirs held by the claim alone
    after = os.lstat(theirs)
    assert (after.st_ino, after.st_uid, after.st_mode, after.st_mtime_ns, after.st_size) == (
        before.st_ino, before.st_uid, before.st_mode, before.st_mtime_ns, before.st_size)
    with open(theirs, "rb") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # not left locked either
    assert entries(state) == [str(lo)]


def _squat(as_user, state, lo=1024, hi=65536):
    """Uid 65534 makes a file under every port name of ``[lo, hi)``."""
    out = subprocess.run(as_user(65534) + [json.dumps(dict(mode="squat", state_dir=state,
                                                          range=[lo, hi]))],
                         capture_output=True, text=True, cwd="/", env={"PATH": "/usr/bin:/bin"},
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_another_user_squatting_every_port_name_locks_nobody_out(as_user, state):
    """The state directory is shared (1777): another user can make a file
    under every port's name, readable or not.  Ports are still reserved,
    held by their claims, and the squatter's files are left as they were."""
    reserve_ports(1, state_dir=state).close()   # makes the directory
    assert _squat(as_user, state) == 65536 - 1024
    before = entries(state)
    for _ in range(20):
        with reserve_ports(3, state_dir=state) as r:
            assert len(set(r.ports)) == 3
    assert entries(state) == before
    assert all(os.lstat(os.path.join(state, n)).st_uid == 65534 for n in before)


def test_a_claim_of_another_user_holds_its_port(as_user, state):
    """The claim is what keeps two users' runs apart: a port another user
    holds is busy to us, whatever the files say."""
    lo, hi = free_range(2)
    holder = subprocess.Popen(as_user(65534) + [json.dumps(
        dict(mode="hold", state_dir=state, range=[lo, hi], n=2))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd="/", env={"PATH": "/usr/bin:/bin"})
    try:
        assert sorted(json.loads(holder.stdout.readline())) == [lo, lo + 1], holder.stderr.read()
        for name in entries(state):          # their lock files gone: the claims still hold
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(state, name))
        with pytest.raises(RuntimeError, match="2 were held by other runs"):
            reserve_ports(1, state_dir=state, port_range=(lo, hi), attempts=10)
    finally:
        holder.communicate(timeout=30)
    with reserve_ports(2, state_dir=state, port_range=(lo, hi)) as r:
        assert sorted(r.ports) == [lo, lo + 1]


# --------------------------------------------------------------------------
# links and other things planted under a port's name

def test_planted_links_are_not_followed(state, shared_tmp):
    lo, hi = free_range(5)
    reserve_ports(1, state_dir=state, port_range=(lo, hi)).close()  # makes the directory
    victim = os.path.join(shared_tmp, "victim")
    with open(victim, "w") as f:
        f.write("precious")
    os.chmod(victim, 0o644)
    hard_victim = os.path.join(shared_tmp, "hard-victim")
    with open(hard_victim, "w") as f:
        f.write("precious too")
    missing = os.path.join(shared_tmp, "would-be-created")
    os.symlink(victim, os.path.join(state, str(lo)))
    os.symlink(missing, os.path.join(state, str(lo + 1)))
    os.link(hard_victim, os.path.join(state, str(lo + 2)))
    os.mkfifo(os.path.join(state, str(lo + 3)))             # opening it would block
    planted = {p: os.lstat(os.path.join(state, str(p))) for p in range(lo, lo + 4)}
    victims = {v: os.stat(v) for v in (victim, hard_victim)}

    with reserve_ports(5, state_dir=state, port_range=(lo, hi)) as r:
        # Nothing planted locks anyone out: its port is held by the claim.
        assert sorted(r.ports) == list(range(lo, hi))
        for v in victims:                                # the targets are not locked
            with open(v, "rb") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)

    assert not os.path.lexists(missing)                 # not created through the link
    for v, st in victims.items():                       # not opened for writing, not truncated
        now = os.stat(v)
        assert (now.st_ino, now.st_size, now.st_mtime_ns, now.st_mode) == (
            st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
    with open(victim) as f:
        assert f.read() == "precious"
    for p, st in planted.items():                       # nothing planted was replaced or removed
        now = os.lstat(os.path.join(state, str(p)))
        assert (now.st_ino, now.st_mode) == (st.st_ino, st.st_mode)
    assert entries(state) == [str(p) for p in range(lo, lo + 4)]


def test_state_dir_that_is_a_symlink_is_refused(shared_tmp):
    real = os.path.join(shared_tmp, "real")
    os.mkdir(real, 0o700)
    link = os.path.join(shared_tmp, "link")
    os.symlink(real, link)
    with pytest.raises(StateDirError) as e:
        reserve_ports(1, state_dir=link, port_range=free_range(1))
    message = str(e.value)
    for part in (link, f"symbolic link to {real}", f"owner {user(os.geteuid())}",
                 "mode 0777", ENV_VAR, INI_OPTION):
        assert part in message, (part, message)
    assert isinstance(e.value, HarnessError) and isinstance(e.value, OSError)
    assert os.listdir(real) == []


# --------------------------------------------------------------------------
# directories that cannot be used: the message names path, owner, mode, setting

def test_world_writable_directory_that_is_not_sticky_is_refused(shared_tmp, monkeypatch):
    d = os.path.join(shared_tmp, "open")
    os.mkdir(d)
    os.chmod(d, 0o777)
    monkeypatch.setenv(ENV_VAR, d)
    with pytest.raises(StateDirError) as e:
        reserve_ports(1, port_range=free_range(1))
    message = str(e.value)
    for part in (d, f"owner {user(os.geteuid())}", "mode 0777", "drwxrwxrwx", "not sticky",
                 f"the environment variable {ENV_VAR}", INI_OPTION):
        assert part in message, (part, message)
    assert os.listdir(d) == []


def test_directory_of_another_user_is_refused(shared_tmp):
    d = os.path.join(shared_tmp, "theirs")
    os.mkdir(d)
    os.chmod(d, 0o755)
    if os.geteuid() == 0:
        os.chown(d, 65534, 65534)
        expect = (f"owner {user(65534)}", "belongs to another user")
    else:
        os.chmod(d, 0o555)   # ours but read-only stands in: a user cannot chown
        expect = ("mode 0555", "cannot create files")
    with pytest.raises(StateDirError) as e:
        reserve_ports(1, state_dir=d, port_range=free_range(1))
    message = str(e.value)
    for part in (d, *expect, ENV_VAR, INI_OPTION):
        assert part in message, (part, message)


def test_a_file_in_place_of_the_directory_is_refused(shared_tmp):
    f = os.path.join(shared_tmp, "file")
    open(f, "w").close()
    with pytest.raises(StateDirError, match="it is not a directory"):
        reserve_ports(1, state_dir=f, port_range=free_range(1))


# --------------------------------------------------------------------------
# which directory; how it is made

def test_default_directory_is_made_like_tmp_and_repaired(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(ENV_VAR, raising=False)
    default = os.path.join(str(tmp_path), DIR_NAME)
    with reserve_ports(2, port_range=free_range(2)) as r:
        assert r.path == default
        assert stat.S_IMODE(os.lstat(default).st_mode) == 0o1777
    # One left by an earlier version with the owner's umask: ours, so fixed.
    os.chmod(default, 0o755)
    reserve_ports(1, port_range=free_range(1)).close()
    assert stat.S_IMODE(os.lstat(default).st_mode) == 0o1777


def test_the_default_can_be_the_machines_temp_directory_not_the_processs(
        tmp_path, shared_tmp, monkeypatch):
    """A process whose tempfile.tempdir was moved (a Ray node agent's, into
    Ray's temp directory) still locks beside everyone else when it says
    where the machine's temp directory is; the environment still wins."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv(ENV_VAR, raising=False)
    with reserve_ports(1, port_range=free_range(1), tempdir=shared_tmp) as r:
        assert r.path == os.path.join(shared_tmp, DIR_NAME)
    assert not os.path.exists(os.path.join(str(tmp_path), DIR_NAME))
    monkeypatch.setenv(ENV_VAR, os.path.join(shared_tmp, "env"))
    with reserve_ports(1, port_range=free_range(1), tempdir=shared_tmp) as r:
        assert r.path == os.path.join(shared_tmp, "env")


def test_state_dir_argument_wins_over_the_environment(shared_tmp, monkeypatch):
    a, b = os.path.join(shared_tmp, "a"), os.path.join(shared_tmp, "b")
    monkeypatch.setenv(ENV_VAR, a)
    with reserve_ports(1, port_range=free_range(1)) as r:
        assert r.path == a
    with reserve_ports(1, state_dir=b, port_range=free_range(1)) as r:
        assert r.path == b
    # A private directory of one's own is accepted as it is (not made 1777).
    own = os.path.join(shared_tmp, "own")
    os.mkdir(own, 0o700)
    reserve_ports(1, state_dir=own, port_range=free_range(1)).close()
    assert stat.S_IMODE(os.lstat(own).st_mode) == 0o700


def test_check_state_dir_for_the_plugin(shared_tmp, monkeypatch):
    d = os.path.join(shared_tmp, "checked")
    monkeypatch.setenv(ENV_VAR, d)
    assert check_state_dir() == d
    assert stat.S_IMODE(os.lstat(d).st_mode) == 0o1777
    os.symlink(d, d + "-link")
    with pytest.raises(StateDirError, match="symbolic link"):
        check_state_dir(d + "-link")


def test_bad_port_range_is_a_value_error(state):
    with pytest.raises(ValueError, match="port_range"):
        reserve_ports(1, state_dir=state, port_range=(5, 5))
    with pytest.raises(ValueError, match="it has only 2"):
        reserve_ports(3, state_dir=state, port_range=(12000, 12002))


# --------------------------------------------------------------------------
# no litter

def test_directory_does_not_grow_with_use(state):
    reserve_ports(1, state_dir=state).close()
    before = entries(state)
    for _ in range(100):
        with reserve_ports(3, state_dir=state) as r:
            assert len(entries(state)) == len(before) + 3
            assert set(map(str, r.ports)) <= set(entries(state))
    assert entries(state) == before == []


def test_files_of_a_killed_run_are_swept_by_the_next(state):
    lo, hi = free_range(3)
    params = dict(mode="hold", state_dir=state, range=[lo, hi], n=2)
    child = subprocess.Popen(SAME_USER + [json.dumps(params)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        held = json.loads(child.stdout.readline())
        # Held by the child: not for us.
        with reserve_ports(1, state_dir=state, port_range=(lo, hi)) as r:
            assert r.ports[0] not in held
        with pytest.raises(RuntimeError, match="2 were held by other runs"):
            reserve_ports(2, state_dir=state, port_range=(lo, hi), attempts=30)
    finally:
        child.kill()                                       # SIGKILL: no release
        child.wait()
    assert entries(state) == sorted(map(str, held))         # its files are left...
    with reserve_ports(1, state_dir=state, port_range=free_range(1)) as r:
        assert entries(state) == [str(r.ports[0])]         # ...until the next reservation
    with reserve_ports(3, state_dir=state, port_range=(lo, hi)) as r:  # the locks died
        assert sorted(r.ports) == list(range(lo, hi))
    assert entries(state) == []


def test_a_lock_on_a_file_removed_meanwhile_is_not_trusted(state, monkeypatch):
    """The race the unlink protocol closes, played out step by step: we open
    the lock file while its holder still holds it; the holder releases (it
    removes the file, then unlocks); our lock then succeeds, on an inode no
    name denotes any more.  We must notice, and lock a fresh file, or a third
    process would create one and hold the same port at the same time."""
    lo, hi = free_range(1)
    holder = reserve_ports(1, state_dir=state, port_range=(lo, hi))
    real_flock = fcntl.flock
    raced = []

    class Fcntl:
        LOCK_EX, LOCK_NB = fcntl.LOCK_EX, fcntl.LOCK_NB

        @staticmethod
        def flock(fd, op):
            if not raced:
                holder.close()           # between our open and our flock
            raced.append(os.fstat(fd).st_nlink)
            return real_flock(fd, op)

    monkeypatch.setattr(ports_module, "fcntl", Fcntl)
    monkeypatch.setattr(ports_module, "_sweep", lambda *a: 0)  # go straight to the port
    # The lock files' own protocol, under the claims that would stop the race.
    monkeypatch.setattr(ports_module, "_claim", lambda port: socket.socket())
    with reserve_ports(1, state_dir=state, port_range=(lo, hi)) as r:
        monkeypatch.undo()
        assert r.ports == [lo]
        assert raced == [0, 1]           # locked a removed file, noticed, locked a fresh one
        with pytest.raises(RuntimeError, match="1 were held by other runs"):
            reserve_ports(1, state_dir=state, port_range=(lo, hi), attempts=5)
    assert entries(state) == []


def test_same_user_processes_racing_on_few_ports_never_collide(state):
    """Four processes, one port each out of four, 150 quick rounds: files are
    created, swept and removed under each other's feet all the time, and no
    port ever has two holders, nor does anyone run out.  (The race window the
    unlink protocol closes is microseconds wide, so this rarely meets it; the
    test above plays it out step by step.)"""
    lo, hi = free_range(4)
    records = _run_rounds([SAME_USER] * 4, dict(
        mode="rounds", state_dir=state, range=[lo, hi], n=1, rounds=150, hold=0.001))
    total_overlaps = 0
    for i in range(4):
        for j in range(i + 1, 4):
            overlaps, collisions = _overlapping_collisions(records[i], records[j])
            total_overlaps += overlaps
            assert not collisions, collisions[:5]
    assert total_overlaps >= 50
    assert entries(state) == []


# --------------------------------------------------------------------------
# what it did before, it still does

def test_distinct_ports_below_the_ephemeral_range_and_locked(state):
    lo, hi = port_range()
    assert hi <= ports_module.ephemeral_start()
    with reserve_ports(6, state_dir=state) as r:
        assert len(set(r.ports)) == 6
        assert all(lo <= p < hi for p in r.ports)
        # No other process gets any of them.
        for p in r.ports:
            params = dict(mode="error", state_dir=state, range=[p, p + 1], n=1, attempts=5)
            out = subprocess.run(SAME_USER + [json.dumps(params)], capture_output=True, text=True)
            assert "could not reserve 1 free ports" in out.stderr, out.stderr
    # Released: other processes can take them now.
    for p in r.ports:
        reserve_ports(1, state_dir=state, port_range=(p, p + 1)).close()


def test_a_port_in_use_on_any_interface_is_skipped(state):
    lo, hi = free_range(2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", lo))                  # loopback only; TF binds *:PORT
        s.listen()
        with reserve_ports(1, state_dir=state, port_range=(lo, hi)) as r:
            assert r.ports == [hi - 1]
            assert entries(state) == [str(hi - 1)]  # no file left for the skipped port
        with pytest.raises(RuntimeError, match="1 in use by other programs"):
            reserve_ports(1, state_dir=state, port_range=(lo, lo + 1), attempts=20)
    assert entries(state) == []


def test_locks_die_with_a_killed_process(state):
    lo, hi = free_range(2)
    params = dict(mode="hold", state_dir=state, range=[lo, hi], n=2)
    child = subprocess.Popen(SAME_USER + [json.dumps(params)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert sorted(json.loads(child.stdout.readline())) == [lo, lo + 1]
        with pytest.raises(RuntimeError):
            reserve_ports(1, state_dir=state, port_range=(lo, hi), attempts=20)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    deadline = time.monotonic() + 5
    while True:
        try:
            reserve_ports(2, state_dir=state, port_range=(lo, hi)).close()
            break
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    assert entries(state) == []
