"""The links of a switched cluster, tried: from the bridge and from every
worker's network namespace, a TCP connect to every worker's own port.

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
scanner's.  Of the harness it imports :mod:`harness.core.linux` only.
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


def probe(sources: Dict[str, Optional[str]], targets: Dict[int, Tuple[str, int]],
          seconds: float) -> List[list]:
    """Every source's links, a thread each: ``[[name, index, how, ms], ...]``.
    A source's path is the network namespace its thread joins (None: this
    process's own); a source named by a target's index does not try itself."""
    from harness.core import linux
    found: List[list] = []
    lock = threading.Lock()

    def one(name: str, path: Optional[str]) -> None:
        try:
            if path is not None:
                linux.join_namespace(path, linux.CLONE_NEWNET)
            tried = try_links(targets, seconds, skip=int(name) if name.isdigit() else None)
            rows = [[name, index, how, round(ms, 1)] for index, how, ms in tried]
        except OSError as e:
            rows = [[name, index, f"not tried: {e}", 0.0] for index in sorted(targets)
                    if str(index) != name]
        with lock:
            found.extend(rows)

    threads = [threading.Thread(target=one, args=item, daemon=True) for item in sources.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 2.0)
    return sorted(found, key=lambda row: (str(row[0]), row[1]))


def main(argv: List[str]) -> None:
    from harness.core import linux
    if argv:
        linux.join_namespace(argv[0], linux.CLONE_NEWUSER)
    linux.die_with_parent()
    spec = json.loads(sys.stdin.readline())
    targets = {int(k): (host, int(port)) for k, (host, port) in spec["targets"].items()}
    print(json.dumps(probe(spec["sources"], targets, float(spec["seconds"]))), flush=True)
    os._exit(0)   # a thread stuck joining a namespace must not hold the exit


if __name__ == "__main__":
    main(sys.argv[1:])
