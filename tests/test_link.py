"""The Ray link under a flood of records (its other tests: tests/unit/test_link.py),
with no Ray and no TensorFlow: a fake worker writes its map and files and talks on its pipe,
and the test reads the controller's side as the watch loop does."""
import os
import time

import pytest

from harness.core import progress
from harness.core import protocol

from unit.test_link import link  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(60)


def test_a_flood_of_records_is_not_lost(link):
    """More records than the map holds, written at once: the worker tells
    its node (over its pipe) at half its ring, the link tells the
    controller at half of its copy's, and the test drains on each word,
    as the watch loop does.

    The worker here waits until its word has crossed the link: a worker
    that writes on without pause can lap its node's ring before the
    node's link thread reads it (seen once under CI load), and that loss
    is the node reader's, not counted at the controller."""
    worker_end, node, ctrl, ctrl_link = link
    reader = progress.Reader(str(ctrl / "w.progress"))
    got = []
    nudges = iter(range(1 << 30))

    def nudge():
        token = f"nudge {next(nudges)}"
        worker_end.send(protocol.Message(0, protocol.DRAIN, time.time(), data=token))
        while True:
            msg = ctrl_link.conn.recv()
            got.extend(reader.drain())
            if msg.kind == protocol.DRAIN and msg.data == token:
                return

    writer = progress.Writer(str(node / "w.progress"), nudge=nudge)
    total = progress.DEFAULT_CAPACITY * 3
    for step in range(total):
        writer.write(progress.STEP, number=step)
        while ctrl_link.conn.poll(0):
            ctrl_link.conn.recv()
            got += reader.drain()
    worker_end.send(protocol.Message(0, protocol.RETURNED, time.time()))
    while True:
        msg = ctrl_link.conn.recv()
        got += reader.drain()
        if msg.kind == protocol.RETURNED:
            break
    assert reader.lost == 0
    assert [r.number for r in got] == list(range(total))
    assert os.path.exists(ctrl / "w.progress")


def _content(path):
    return path.read_bytes() if path.exists() else b""
