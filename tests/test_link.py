"""The link that carries a Ray worker's channel, progress records and
files from its node to the controller (harness.launch.ray.link), with no Ray and no
TensorFlow: a fake worker writes its map and files and talks on its pipe,
and the test reads the controller's side as the watch loop does."""
import os
import time

import multiprocess
import pytest

from harness.launch.ray import link as mirror
from harness.core import progress
from harness.core import protocol

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def link(tmp_path):
    """A node side and a controller side joined by a socket pair; the fake
    worker's end of its pipe and its node-side paths; the controller's paths."""
    node, ctrl = tmp_path / "node", tmp_path / "ctrl"
    node.mkdir(), ctrl.mkdir()
    for folder in (node, ctrl):
        progress.create(str(folder / "w.progress"))
    worker_end, agent_end = multiprocess.Pipe(duplex=True)
    node_sock, ctrl_sock = multiprocess.Pipe(duplex=True)
    paths = {"log": "w.log", "stack": "w.stack"}
    node_link = mirror.NodeLink(node_sock, agent_end, str(node / "w.progress"),
                                {k: str(node / v) for k, v in paths.items()}, offset=100.0)
    ctrl_link = mirror.ControllerLink(ctrl_sock, 0, str(ctrl / "w.progress"),
                                      {k: str(ctrl / v) for k, v in paths.items()})
    yield worker_end, node, ctrl, ctrl_link
    worker_end.close()
    node_link.join(5)
    ctrl_link.close()


def test_a_flood_of_records_is_not_lost(link):
    """More records than the map holds, written at once: the worker tells
    its node (over its pipe) at half its ring, the link tells the
    controller at half of its copy's, and the test drains on each word,
    as the watch loop does."""
    worker_end, node, ctrl, ctrl_link = link
    writer = progress.Writer(str(node / "w.progress"), nudge=lambda: worker_end.send(
        protocol.Message(0, protocol.DRAIN, time.time())))
    reader = progress.Reader(str(ctrl / "w.progress"))
    total = progress.DEFAULT_CAPACITY * 3
    got = []
    for step in range(total):
        writer.write(progress.STEP, a=step)
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
    assert [r.a for r in got] == list(range(total))
    assert os.path.exists(ctrl / "w.progress")


def _content(path):
    return path.read_bytes() if path.exists() else b""
