"""The recorder's dumps on signals, kept in front of whatever handles them.

``faulthandler`` dumps every thread's stack from C when a registered signal
comes, then (``chain``) passes the signal on to the handler that was there
when it registered.  But a handler set later replaces it: the job's own
(``signal.signal(SIGTERM, ...)``, as ``PreemptionCheckpointHandler`` does),
or TensorFlow's in C++ (measured on TensorFlow 2.21: an MWMS job's
coordination service installs a SIGTERM handler of its own, its preemption
notifier, when the strategy is made; the process then lives on after a
SIGTERM).  :class:`Front` puts the dump back in front of it, chaining to
it, so the job's handling of the signal is what it would have been:

- at once for a handler set through :func:`signal.signal`, which is
  wrapped (:func:`wrap_signal`);
- within a look of the recorder's watchdog for one set in C (:meth:`Front.check`
  compares the handler the kernel has with faulthandler's).

Putting it back: faulthandler forgets its registration (and puts back the
handler it had found, now stale), the new handler is put back as the
kernel had it, and faulthandler registers again, finding the new one.
"""
from __future__ import annotations

import ctypes
import faulthandler
import signal
import threading
from typing import IO, Any, Dict, Optional, Union

# Room for a C ``struct sigaction`` (152 bytes with glibc on x86-64 and
# ARM64), read and written back whole, never looked into but for its
# first field: the handler's address.
_SIGACTION_ROOM = 512
# Where faulthandler writes a signal's dump: a file descriptor or an open file.
DumpFile = Union[int, IO[Any]]


def _libc():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.sigaction.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
        return libc
    except (OSError, AttributeError):
        return None


class Front:
    """faulthandler's dump on each of ``files``' signals (signal -> the
    file or fd the dump goes to), in front of the signal's handler.  After
    the dump, a handler found there runs; the default action (or "ignore")
    only for the signals of ``always_chain``: SIGTERM's default ends the
    job as it would have, SIGUSR2's would end a job that never asked."""

    def __init__(self, files: Dict[int, DumpFile], always_chain=()):
        self.files = dict(files)
        self.always_chain = {int(s) for s in always_chain}
        # Held while a handler is set too: a re-arm between the job's
        # setting its handler and its re-arm would put back the one before.
        self.lock = threading.RLock()
        self._libc = _libc()
        self._ours: Dict[int, Optional[bytes]] = {}

    def _action(self, sig: int) -> Optional[ctypes.Array]:
        if self._libc is None:
            return None
        buf = ctypes.create_string_buffer(_SIGACTION_ROOM)
        if self._libc.sigaction(int(sig), None, buf) != 0:
            return None
        return buf

    def _handler(self, sig: int) -> Optional[bytes]:
        action = self._action(sig)
        return None if action is None else action.raw[:ctypes.sizeof(ctypes.c_void_p)]

    def _set(self, sig: int) -> bool:
        """Whether ``sig`` has a handler of its own (not the default, not
        "ignore") now."""
        handler = self._handler(sig)
        if handler is None:
            return signal.getsignal(sig) not in (signal.SIG_DFL, signal.SIG_IGN, None)
        return int.from_bytes(handler, "little") not in (0, 1)   # SIG_DFL, SIG_IGN

    def arm(self, sig: int) -> None:
        """Register ``sig``'s dump in front of the handler it has now."""
        with self.lock:
            current = self._action(sig)
            if current is not None and self._ours.get(sig) == self._handler(sig):
                return      # in front already
            faulthandler.unregister(sig)
            if current is not None:
                self._libc.sigaction(int(sig), current, None)
            chain = int(sig) in self.always_chain or self._set(sig)
            faulthandler.register(sig, file=self.files[sig], all_threads=True, chain=chain)
            self._ours[sig] = self._handler(sig)

    def arm_all(self) -> None:
        for sig in self.files:
            self.arm(sig)

    def check(self) -> None:
        """Re-arm each signal whose handler is no longer faulthandler's."""
        for sig, ours in list(self._ours.items()):
            if ours is not None and self._handler(sig) != ours:
                self.arm(sig)


def wrap_signal(original, front: Front):
    """:func:`signal.signal` that puts ``front``'s dump back in front of the
    handler it sets for one of its signals."""
    if getattr(original, "_mwms_recorder", False):
        return original
    ours = {int(s) for s in front.files}

    def signal_(signalnum, handler):
        if int(signalnum) not in ours:
            return original(signalnum, handler)
        with front.lock:
            previous = original(signalnum, handler)
            front.arm(signal.Signals(int(signalnum)))
        return previous

    signal_._mwms_recorder = True   # type: ignore[attr-defined]  # read back above
    signal_.__wrapped__ = original   # type: ignore[attr-defined]  # as functools.wraps sets
    signal_.__doc__ = original.__doc__
    return signal_
