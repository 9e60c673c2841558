"""Blocks that a Ctrl-C cannot cut in half: no TensorFlow.

Killing a run's processes is a sequence of steps, and a second Ctrl-C that
lands between two of them leaves a live worker behind, which ``multiprocess``
then joins at the interpreter's exit, for ever.  Inside :func:`deferred` a
SIGINT (or SIGTERM) is noted instead; the block finishes, and the first
signal noted is delivered when it ends, as ``KeyboardInterrupt`` for SIGINT
or by the signal's own handler.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator, List

DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def deferred(signals=DEFERRED_SIGNALS) -> Iterator[List[int]]:
    """Hold ``signals`` back for the block (main thread only; elsewhere
    signals are not delivered to the thread anyway and this does nothing).
    Yields the list of signals noted so far."""
    noted: List[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield noted
        return
    previous = {}

    def note(signum, frame):
        noted.append(signum)

    for sig in signals:
        try:
            previous[sig] = signal.signal(sig, note)
        except (ValueError, OSError):   # not settable here
            pass
    try:
        yield noted
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if noted:
            _deliver(noted[0], previous.get(noted[0]))


def _deliver(signum: int, handler) -> None:
    """Act on ``signum`` as its handler from before the block would have."""
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_IGN:
        return
    elif signum == signal.SIGINT:
        raise KeyboardInterrupt
    else:
        signal.raise_signal(signum)
