"""One worker's link from its Ray node to the controller: its channel's
messages, its progress records and its files, over one TCP connection, in
the order they happened.

A worker on a Ray node is the same process as a local one: it writes its
progress map, log, stack dump and replica file into a directory of its
node and talks to its parent over a pipe.  Its parent there is its node's
agent (:mod:`harness.launch.ray.agent`), which holds a :class:`NodeLink`: it reads
the map as the controller reads it locally (a :class:`harness.core.progress.Reader`,
which works on a stopped, wedged or dead worker) and sends what is new
every :data:`EVERY` seconds, the files by what they grew, and each message
of the pipe, after whatever was recorded before it (a local parent reads
the map before it acts on a message, so the order is kept).  On the
controller, a :class:`ControllerLink` writes the records into the map the
controller made and the files where it reads them, and hands the
messages on through a local pipe, which is the worker's channel there:
the watch loop is the same as for a local worker and does not wake for
the records.  When the controller's copy of the map is half unread, the
link tells it to read (:data:`harness.core.protocol.DRAIN`), as a local worker
does, so no record is lost.

Clocks: a record's time is its node's ``time.monotonic()``; the node link
shifts it by the difference of the two clocks measured when the worker
started (exact on one machine but for the call's latency, a few
milliseconds), so the controller compares it with its own.

Frames (pickled tuples): ``("msg", bytes)`` both ways, ``("records",
[(kind, function, number, detail, time), ...])`` and ``("file", name, offset,
data)`` for ``name`` in :data:`FILES`.  Nothing here imports Ray or
TensorFlow.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Dict, Optional

import multiprocess
from multiprocess import connection

from harness.core import progress, protocol

EVERY = 0.02            # seconds between two looks at a worker's files
CHUNK = 1 << 20         # the most bytes of a file one frame carries
FILES = ("log", "stack", "replicas")   # besides the progress map
ROOM_WAIT = 2.0         # how long the controller's link waits for the watch loop to read


class NodeLink:
    """Node side: ``pipe`` (the agent's end of the worker's pipe) and the
    worker's files (``paths``: name -> path on this node, and its map at
    ``progress_path``) carried on ``sock``; ``offset`` is added to each
    record's time.  Ends when the worker's pipe closes (it exited), after
    a last look at its files."""

    def __init__(self, sock, pipe, progress_path: str, paths: Dict[str, str], offset: float):
        self.sock, self.pipe, self.paths, self.offset = sock, pipe, paths, offset
        self.reader = progress.Reader(progress_path)
        self.sent: Dict[str, int] = dict.fromkeys(paths, 0)
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.poller = threading.Thread(target=self._poll, daemon=True, name="link-poll")
        self.relay = threading.Thread(target=self._relay, daemon=True, name="link-relay")
        self.poller.start()
        self.relay.start()

    def _poll(self) -> None:
        while not self.done.wait(EVERY):
            self.flush()

    def _relay(self) -> None:
        try:
            while True:
                for end in connection.wait([self.pipe, self.sock]):
                    if end is self.pipe:
                        data = self.pipe.recv_bytes()
                        with self.lock:      # what was recorded before it goes first
                            self._send_new()
                            self.sock.send(("msg", data))
                    else:
                        _, data = self.sock.recv()
                        self.pipe.send_bytes(data)
        except (EOFError, OSError):
            pass
        finally:
            self.done.set()
            self.flush()
            self.reader.close()
            _close(self.sock)

    def flush(self) -> None:
        """Send what is new now (nothing once the link is closed)."""
        with self.lock:
            try:
                self._send_new()
            except (OSError, EOFError, ValueError):
                pass

    def _send_new(self) -> None:
        if self.sock.closed:
            return
        records = self.reader.drain()
        if records:
            self.sock.send(("records", [(r.kind, r.function, r.number, r.detail, r.time + self.offset)
                                        for r in records]))
        for name, path in self.paths.items():
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            if size <= self.sent[name]:
                continue
            with open(path, "rb") as f:
                f.seek(self.sent[name])
                while self.sent[name] < size:
                    data = f.read(min(CHUNK, size - self.sent[name]))
                    if not data:
                        break
                    self.sock.send(("file", name, self.sent[name], data))
                    self.sent[name] += len(data)

    def join(self, timeout: Optional[float] = None) -> None:
        """Wait until the link ended (the worker exited, all it left was sent)."""
        self.relay.join(timeout)


class ControllerLink:
    """Controller side of worker ``index``'s link on ``sock``: records into
    the map at ``progress_path``, files to ``paths`` (name -> path), and
    messages through :attr:`conn`, the worker's channel here."""

    def __init__(self, sock, index: int, progress_path: str, paths: Dict[str, Optional[str]]):
        self.sock, self.index = sock, index
        self.paths = {name: path for name, path in paths.items() if path}
        self.conn, self._inner = multiprocess.Pipe(duplex=True)
        self.writer = progress.Writer(progress_path, nudge=self._nudge)
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"link-{index}")
        self.thread.start()

    def _nudge(self) -> None:
        self._inner.send(protocol.Message(self.index, protocol.DRAIN, time.time()))

    def _room(self) -> None:
        """Unlike a worker, the link can wait: with the controller's copy
        full, it tells the watch loop to read and waits for it (up to
        :data:`ROOM_WAIT`) rather than overwrite records nobody read."""
        if self.writer.unread() < self.writer.capacity:
            return
        self._nudge()
        deadline = time.monotonic() + ROOM_WAIT
        while self.writer.unread() >= self.writer.capacity and time.monotonic() < deadline:
            time.sleep(0.001)

    def _run(self) -> None:
        try:
            while True:
                for end in connection.wait([self.sock, self._inner]):
                    if end is self._inner:
                        self.sock.send(("msg", self._inner.recv_bytes()))
                        continue
                    frame = self.sock.recv()
                    if frame[0] == "msg":
                        self._inner.send_bytes(frame[1])
                    elif frame[0] == "records":
                        for record in frame[1]:
                            self._room()
                            self.writer.copy(*record)
                    elif frame[0] == "file" and frame[1] in self.paths:
                        self._write(*frame[1:])
        except (EOFError, OSError):
            pass
        finally:
            _close(self._inner)     # the watch loop sees the channel close
            _close(self.sock)

    def _write(self, name: str, offset: int, data: bytes) -> None:
        fd = os.open(self.paths[name], os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.pwrite(fd, data, offset)
        finally:
            os.close(fd)

    def join(self, timeout: Optional[float] = None) -> None:
        """Wait until the node side ended the link (all it sent is in place)."""
        self.thread.join(timeout)

    def close(self) -> None:
        _close(self.conn)
        _close(self.sock)
        self.thread.join(5)


def _close(conn) -> None:
    """Close a connection another thread may be closing too."""
    try:
        conn.close()
    except OSError:
        pass
