"""The links of a switched cluster, tried: from the bridge and from every
worker's network namespace, a TCP connect to every worker's own port;
and, from each worker to each other, a byte there and back through the
path their traffic takes.

Run as ``python -m harness.network.probe USER_NS``: it joins the user
namespace (while single-threaded), reads one JSON line on stdin,
``{"sources": {NAME: NET_NS, ...}, "targets": {INDEX: [HOST, PORT], ...},
"seconds": S}``, tries from each source (a thread that joins that network
namespace: a network namespace is a thread's own) every target but
itself, all at once, and prints one JSON line: ``[[NAME, INDEX, HOW, MS],
...]``.  ``HOW`` is what came back within ``S`` seconds:

``connected``
    the target's process listens: the link and the worker answer;
``refused``
    the target's host answered with a reset (its process has ended): the
    link answers;
``timed out``, ``unreachable``
    nothing came back, or the kernel found no way there: the link does not
    answer.

A probe sends nothing but the connect, and closes at once: a TensorFlow
worker sees a connection that ends before its first byte, as a port
scanner's.

With ``"echo": {"port": P, "routes": {SRC: {DST: [HOST, PORT]}}}`` in the
spec, each worker source also serves an echo on port ``P`` of its own
namespace (a namespace the harness made for the run: no other process
binds there), and, once every echo listens, every source sends to each
other worker's echo, through ``routes[SRC][DST]`` where there is one (the
proxy's port for that pair, where the workers' traffic passes a proxy; the
echo itself otherwise), on one connection: one byte there and back,
twice, then ``BULK`` bytes there and back.  The faster one-byte round
trip and the bulk's time, in milliseconds, are each row's fifth and sixth
fields (None for what did not come back within ``S`` seconds).  Of the
harness it imports :mod:`harness.core.linux` only.
"""
from __future__ import annotations

import errno
import json
import os
import select
import socket
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple

# What an answer is called, by the connect's errno (0: connected).
ANSWERS = {0: "connected", errno.ECONNREFUSED: "refused"}
# The ones that say the link does not answer.
SILENT = ("timed out", "unreachable")


def _how(code: int) -> str:
    return ANSWERS.get(code, "unreachable")


def try_links(targets: Dict[int, Tuple[str, int]], seconds: float,
              skip: Optional[int] = None) -> List[Tuple[int, str, float]]:
    """From this thread's network namespace, a connect to each target (but
    ``skip``), all at once: ``(index, how, milliseconds)`` each."""
    start = time.monotonic()
    pending: Dict[socket.socket, int] = {}
    out: List[Tuple[int, str, float]] = []
    for index, (host, port) in sorted(targets.items()):
        if index == skip:
            continue
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        code = s.connect_ex((host, port))
        if code in (errno.EINPROGRESS, errno.EAGAIN):
            pending[s] = index
        else:
            out.append((index, _how(code), 1000 * (time.monotonic() - start)))
            s.close()
    deadline = start + seconds
    while pending:
        # Past the deadline, one last look without waiting: a connect the
        # kernel answered while this thread was not scheduled (a loaded
        # machine) is an answer, not silence.
        left = max(0.0, deadline - time.monotonic())
        _, ready, _ = select.select([], list(pending), [], left)
        for s in ready:
            index = pending.pop(s)
            code = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            out.append((index, _how(code), 1000 * (time.monotonic() - start)))
            s.close()
        if left == 0.0:
            break
    for s, index in pending.items():
        out.append((index, "timed out", 1000 * seconds))
        s.close()
    return sorted(out)


def serve_echo(port: int, host: str = "0.0.0.0") -> socket.socket:
    """An echo on ``host:port`` of this thread's network namespace, served
    by daemon threads (which share the namespace of the thread that starts
    them); the listening socket, to close (port 0: its ``getsockname``)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, port))
    server.listen(64)

    def echo(conn: socket.socket) -> None:
        with conn:
            try:
                while True:
                    data = conn.recv(65536)
                    if not data:
                        return
                    conn.sendall(data)
            except OSError:
                return

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return server


# A throughput sample: this many bytes sent to an echo and read back.
BULK = 65536
# A round trip and a bulk (ms; None: not back in time).
Trip = Tuple[Optional[float], Optional[float]]


def round_trip(host: str, port: int, seconds: float,
               rounds: int = 2) -> Trip:
    """To the echo at ``host:port``, on one connection: the fastest of
    ``rounds`` one-byte round trips, then ``BULK`` bytes there and back
    (ms each); None for what did not come back within ``seconds`` in all."""
    deadline = time.monotonic() + seconds
    best: Optional[float] = None
    try:
        with socket.create_connection((host, port), timeout=seconds) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(rounds):
                s.settimeout(max(1e-3, deadline - time.monotonic()))
                t0 = time.monotonic()
                s.sendall(b"x")
                if s.recv(1) != b"x":
                    return best, None
                ms = 1000 * (time.monotonic() - t0)
                best = ms if best is None else min(best, ms)
            return best, _bulk(s, deadline)
    except OSError:
        return best, None


def _bulk(s: socket.socket, deadline: float) -> Optional[float]:
    """``BULK`` bytes to the echo on ``s`` and back by ``deadline`` (ms),
    sending and reading at once (an echo's buffers are not that deep)."""
    s.setblocking(False)
    t0 = time.monotonic()
    out, back = memoryview(b"y" * BULK), 0
    while back < BULK:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        readable, writable, _ = select.select([s], [s] if out else [], [], left)
        if writable:
            out = out[s.send(out):]
        if readable:
            data = s.recv(65536)
            if not data:
                return None
            back += len(data)
    return 1000 * (time.monotonic() - t0)


def trips(name: str, targets: Dict[int, Tuple[str, int]], echo: dict,
          seconds: float) -> Dict[int, Trip]:
    """Source ``name``'s round trip and bulk to each other worker's echo,
    all at once (threads started from this one share its namespace)."""
    routes = echo["routes"].get(name, {})
    out: Dict[int, Trip] = {}

    def one_trip(index: int) -> None:
        host, port = routes.get(str(index), [targets[index][0], echo["port"]])
        out[index] = round_trip(host, int(port), seconds)

    threads = [threading.Thread(target=one_trip, args=(i,), daemon=True)
               for i in sorted(targets) if str(i) != name]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 1.0)
    return out


def _rounded(ms: Optional[float]) -> Optional[float]:
    return None if ms is None else round(ms, 1)


def probe(sources: Dict[str, Optional[str]], targets: Dict[int, Tuple[str, int]],
          seconds: float, echo: Optional[dict] = None) -> List[list]:
    """Every source's links, a thread each: ``[[name, index, how, ms], ...]``,
    with each source's round trip and bulk to each other worker's echo as a
    fifth and sixth field when ``echo`` is given (see the module docstring).
    A source's path is the network namespace its thread joins (None: this
    process's own); a source named by a target's index does not try itself."""
    from harness.core import linux
    found: List[list] = []
    servers: List[socket.socket] = []   # closed once every source is done
    lock = threading.Lock()
    listening = threading.Barrier(len(sources)) if echo is not None else None

    def one(name: str, path: Optional[str]) -> None:
        try:
            if path is not None:
                linux.join_namespace(path, linux.CLONE_NEWNET)
        except OSError as e:
            _arrive()   # with no echo: its peers' trips to it come back None
            rows = [[name, index, f"not tried: {e}", 0.0] for index in sorted(targets)
                    if str(index) != name]
        else:
            rows = _tried(name)
        with lock:
            found.extend(rows)

    def _arrive() -> None:
        """Wait until every source serves its echo, or gave up trying."""
        if listening is not None:
            try:
                listening.wait(seconds + 1.0)
            except threading.BrokenBarrierError:
                pass   # one is stuck: the trips to it come back None

    def _tried(name: str) -> List[list]:
        result: Dict[int, Trip] = {}
        got = None
        if echo is not None:
            if name.isdigit():
                try:
                    server = serve_echo(int(echo["port"]))
                    with lock:
                        servers.append(server)
                except OSError:
                    pass   # its peers' trips to it come back None
            _arrive()
            got = threading.Thread(target=lambda: result.update(
                trips(name, targets, echo, seconds)), daemon=True)
            got.start()
        tried = try_links(targets, seconds, skip=int(name) if name.isdigit() else None)
        if got is not None:
            got.join(2 * seconds + 2.0)
        return [[name, index, how, round(ms, 1)]
                + ([_rounded(t) for t in result.get(index, (None, None))] if got else [])
                for index, how, ms in tried]

    threads = [threading.Thread(target=one, args=item, daemon=True) for item in sources.items()]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 3 * seconds + 4.0
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    with lock:
        for server in servers:
            server.close()
        return sorted(found, key=lambda row: (str(row[0]), row[1]))


def main(argv: List[str]) -> None:
    from harness.core import linux
    if argv:
        linux.join_namespace(argv[0], linux.CLONE_NEWUSER)
    linux.die_with_parent()
    spec = json.loads(sys.stdin.readline())
    targets = {int(k): (host, int(port)) for k, (host, port) in spec["targets"].items()}
    print(json.dumps(probe(spec["sources"], targets, float(spec["seconds"]), spec.get("echo"))),
          flush=True)
    os._exit(0)   # a thread stuck joining a namespace must not hold the exit


if __name__ == "__main__":
    main(sys.argv[1:])
