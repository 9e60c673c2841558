"""A Ctrl-C cannot cut the harness's killing in half: signals in a
:func:`~harness.core.interrupts.deferred` block wait for its end."""
import concurrent.futures
import signal
import threading

import pytest

from harness.core import interrupts
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
    started = []
    for interrupt in (True, False, True):
        f = concurrent.futures.Future()
        f.set_result(_Handle(log, interrupt))
        started.append(f)
    failed = concurrent.futures.Future()
    failed.set_exception(OSError("no fork"))
    started.append(failed)
    with pytest.raises(KeyboardInterrupt), interrupts.deferred():
        local._undo_starts(started)
    assert log == ["killed", "joined", "closed"] * 3


def test_a_start_still_under_way_is_waited_for_and_killed():
    log = []
    began = threading.Event()
    gate = threading.Event()

    def start():
        began.set()
        gate.wait(5)
        return _Handle(log, False)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        under_way = pool.submit(start)
        never_begun = pool.submit(lambda: _Handle(log, False))
        assert began.wait(5)
        # Released only once the undo waits: the undo must wait for it.
        threading.Timer(0.2, gate.set).start()
        local._undo_starts([under_way, never_begun])
    assert never_begun.cancelled()
    assert log == ["killed", "joined", "closed"]
