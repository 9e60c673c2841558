"""A Ctrl-C cannot cut the harness's killing in half: signals in a
:func:`~harness.core.interrupts.deferred` block wait for its end."""
import contextlib
import signal
import subprocess
import threading
import time
import types

import pytest

from harness.core import interrupts
from harness.core.linux import wait_gone
from harness.launch import local


def test_a_ctrl_c_in_the_block_comes_after_it():
    done = []
    with pytest.raises(KeyboardInterrupt), interrupts.deferred():
        signal.raise_signal(signal.SIGINT)
        done.append("first")
        signal.raise_signal(signal.SIGINT)
        done.append("second")
    assert done == ["first", "second"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_block_with_no_signal_changes_nothing():
    with interrupts.deferred() as noted:
        pass
    assert noted == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_signal_stays_ignored_after_the_block():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupts.deferred() as noted:
            signal.raise_signal(signal.SIGINT)
        assert noted == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


class _Handle:
    """A started worker whose kill brings a further Ctrl-C with it."""

    def __init__(self, log, interrupt):
        self.log, self.interrupt = log, interrupt

    def kill_tree(self):
        if self.interrupt:
            signal.raise_signal(signal.SIGINT)
        self.log.append("killed")

    def join(self, timeout=None):
        self.log.append("joined")

    def close(self):
        self.log.append("closed")


def test_an_interrupted_start_kills_every_started_worker_through_a_second_ctrl_c():
    log = []
    starts = local.Starts(None, [])
    starts.handles = {i: _Handle(log, interrupt) for i, interrupt in enumerate((True, False, True))}
    with pytest.raises(KeyboardInterrupt), interrupts.deferred():
        starts.cancel(end_server=False)
    assert log == ["killed"] * 3 + ["joined", "closed"] * 3
    assert not starts.handles


class Sleeper:
    """A stand-in for a worker's process: ``sleep`` in a group of its own;
    its start waits for ``gate`` when one is given."""

    def __init__(self, gate, started):
        self.gate, self.started = gate, started
        self.popen = None

    def start(self):
        if self.gate is not None:
            self.gate.wait(30)
        self.popen = subprocess.Popen(["sleep", "100"], start_new_session=True)
        self.started.append(self.popen.pid)

    @property
    def pid(self):
        return self.popen.pid

    @property
    def exitcode(self):
        return self.popen.poll()

    def join(self, timeout=None):
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)

    def close(self):
        pass


class Pipe:
    def close(self):
        pass


def _context(process):
    return types.SimpleNamespace(Pipe=lambda duplex: (Pipe(), Pipe()), Process=process)


def _specs(n):
    return [types.SimpleNamespace(index=i, log_path=f"worker-{i}.log") for i in range(n)]


def test_a_start_still_under_way_is_killed_by_its_own_thread_once_it_starts(monkeypatch):
    """Worker 0 has started when the call is abandoned: the caller kills
    it.  Worker 1's start is still under way past the wait: the thread that
    started it kills its process."""
    monkeypatch.setattr(local, "START_UNDO_WAIT", 0.2)
    gate, started = threading.Event(), []
    starts = local.Starts(_context(
        lambda target, args, name: Sleeper(gate if args[0].index == 1 else None, started)),
        _specs(2))
    for thread in starts.threads:
        thread.start()
    deadline = time.monotonic() + 10
    while len(started) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    starts.cancel(end_server=False)
    assert len(started) == 1 and not wait_gone(started, 5)
    gate.set()
    for thread in starts.threads:
        thread.join(10)
    assert len(started) == 2 and not wait_gone(started, 5)
    assert not starts.handles


def test_a_failed_start_kills_the_others():
    started = []

    class Failing(Sleeper):
        def start(self):
            raise OSError("no fork")

    starts = local.Starts(_context(
        lambda target, args, name: (Failing if args[0].index == 1 else Sleeper)(None, started)),
        _specs(3))
    with pytest.raises(OSError, match="no fork"):
        starts.run()
    assert started and not wait_gone(started, 5)
