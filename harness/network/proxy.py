"""A TCP proxy between workers, for the faults a link cannot do on a kernel
without ``netem``: latency (:class:`harness.faults.Latency`) and reset
connections (:class:`harness.faults.ResetPeers`).  Toxiproxy's way, in
userspace and without privileges.

Every ordered pair of workers ``(src, dst)`` gets a port of its own on the
proxy, and worker ``src``'s ``TF_CONFIG`` lists peer ``dst`` there (itself
on its real address: that is where it listens).  A connection then says
which two workers it joins, without reading a byte of it, so a fault on
worker ``w`` acts on exactly the connections from and to ``w``.  The proxy
runs in the switched topology's bridge namespace (:class:`harness.network.namespace.Switch`):
a ``Partition`` or ``Bandwidth`` on a worker's link acts on its proxied
connections too.

Run as ``python -m harness.network.proxy [USER_NS NET_NS]``: it joins the
namespaces first (while single-threaded), reads its routes as one JSON line
on stdin (``[[listen_host, listen_port, target_host, target_port, src, dst],
...]``), listens, prints ``ready``, then reads commands, one a line:

``delay W MS JITTER_MS``
    every byte from and to worker ``W`` is held ``MS`` ms (± a uniform
    ``JITTER_MS``) before it is passed on; order is kept, and a stream is
    delayed, not throttled: chunks in flight overlap;
``reset W``
    every open connection from and to worker ``W`` is reset (RST to both
    ends); new ones are accepted;
``clear W``
    no delay on worker ``W``.

It exits when its stdin closes, or when its parent dies.  Of the harness
it imports :mod:`harness.core.linux` only (no TensorFlow).
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import struct
import sys
from typing import Dict, List, Set


class Link:
    """One proxied connection: the two workers it joins and its two sockets."""

    def __init__(self, src: int, dst: int):
        self.src, self.dst = src, dst
        self.transports: List[asyncio.WriteTransport] = []

    def joins(self, worker: int) -> bool:
        return worker in (self.src, self.dst)

    def reset(self) -> None:
        """Close both ends with SO_LINGER 0, which sends RST instead of FIN."""
        for transport in self.transports:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
            transport.abort()


class Proxy:
    def __init__(self) -> None:
        self.delays: Dict[int, tuple] = {}    # worker -> (ms, jitter ms)
        self.links: Set[Link] = set()

    def delay(self, link: Link) -> float:
        """Seconds to hold a chunk of ``link`` now: the delays of both its ends."""
        total = 0.0
        for worker in {link.src, link.dst}:
            ms, jitter = self.delays.get(worker, (0.0, 0.0))
            total += max(0.0, ms + random.uniform(-jitter, jitter))
        return total / 1000.0

    def command(self, line: str) -> None:
        words = line.split()
        if not words:
            return
        verb, worker = words[0], int(words[1])
        if verb == "delay":
            self.delays[worker] = (float(words[2]), float(words[3]) if len(words) > 3 else 0.0)
        elif verb == "clear":
            self.delays.pop(worker, None)
        elif verb == "reset":
            for link in [link for link in self.links if link.joins(worker)]:
                link.reset()

    async def pump(self, link: Link, reader: asyncio.StreamReader,
                   writer: asyncio.StreamWriter) -> None:
        """Pass ``reader``'s bytes to ``writer``, each chunk held its link's
        delay; a reader and a deliverer, so delayed chunks overlap."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()

        delivering = asyncio.ensure_future(deliver())
        last_due = 0.0
        try:
            while True:
                data = await reader.read(65536)
                # Never before the chunk ahead of it: a stream keeps its order.
                last_due = max(last_due, loop.time() + self.delay(link))
                queue.put_nowait((last_due, data))
                if not data:
                    break
            await delivering
        except (ConnectionError, OSError, asyncio.CancelledError):
            delivering.cancel()
            link.reset()

    async def serve(self, src: int, dst: int, target_host: str, target_port: int,
                    reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = Link(src, dst)
        link.transports.append(writer.transport)
        try:
            up_reader, up_writer = await asyncio.open_connection(target_host, target_port)
        except OSError:
            link.reset()   # the peer is not there: the client sees its connection reset
            return
        link.transports.append(up_writer.transport)
        self.links.add(link)
        try:
            await asyncio.gather(self.pump(link, reader, up_writer),
                                 self.pump(link, up_reader, writer))
        finally:
            self.links.discard(link)
            for transport in link.transports:
                transport.close()


async def main_async(routes: list) -> None:
    proxy = Proxy()
    servers = []
    for listen_host, listen_port, target_host, target_port, src, dst in routes:
        def handler(reader, writer, src=src, dst=dst, host=target_host, port=target_port):
            return proxy.serve(src, dst, host, port, reader, writer)
        servers.append(await asyncio.start_server(handler, listen_host, listen_port,
                                                  reuse_address=True))
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
    while True:
        line = await commands.readline()
        if not line:
            break
        proxy.command(line.decode())
        print("done", flush=True)   # the parent waits for it: the change is in place
    for server in servers:
        server.close()
    for link in list(proxy.links):
        link.reset()


def read_line() -> bytes:
    """One line of stdin, read unbuffered: the rest is the event loop's."""
    line = bytearray()
    while not line.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            break
        line += byte
    return bytes(line)


def main(argv: List[str]) -> None:
    from harness.core import linux
    if len(argv) == 2:
        linux.enter_namespaces(argv[0], argv[1])
    linux.die_with_parent()
    routes = json.loads(read_line())
    asyncio.run(main_async(routes))


if __name__ == "__main__":
    main(sys.argv[1:])
