"""The link that carries a Ray worker's channel, progress records and
files from its node to the controller (harness.launch.ray.link), with no Ray and no
TensorFlow: a fake worker writes its map and files and talks on its pipe,
and the test reads the controller's side as the watch loop does."""
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


def test_records_go_before_the_message_that_follows_them(link):
    worker_end, node, ctrl, ctrl_link = link
    writer = progress.Writer(str(node / "w.progress"))
    reader = progress.Reader(str(ctrl / "w.progress"))
    before = time.monotonic()
    for step in range(5):
        writer.write(progress.STEP, number=step)
    worker_end.send(protocol.Message(0, protocol.RETURNED, time.time()))
    msg = ctrl_link.conn.recv()                 # the watch loop wakes for the message...
    records = reader.drain()                    # ...and reads the map first: all there
    assert msg.kind == protocol.RETURNED
    assert [r.number for r in records] == list(range(5))
    # The node's clock shifted by the offset measured at start (here 100 s).
    assert all(before + 100 <= r.time <= time.monotonic() + 100 for r in records)
    ctrl_link.conn.send(protocol.RELEASE)       # and the other way
    assert worker_end.recv() == protocol.RELEASE


def test_files_follow_as_they_grow_and_the_link_ends_with_the_worker(link):
    worker_end, node, ctrl, ctrl_link = link
    with open(node / "w.log", "ab") as f:
        f.write(b"first line\n")
    deadline = time.monotonic() + 5
    while _content(ctrl / "w.log") != b"first line\n":
        assert time.monotonic() < deadline, "the log never came"
        time.sleep(0.01)
    with open(node / "w.log", "ab") as f:
        f.write(b"x" * (3 << 20))               # more than a frame carries
    (node / "w.stack").write_text("Thread 0x1 (most recent call first):\n")
    worker_end.close()                          # the worker exits: a last look, then EOF
    with pytest.raises(EOFError):
        ctrl_link.conn.recv()
    ctrl_link.join(5)
    assert (ctrl / "w.log").stat().st_size == len(b"first line\n") + (3 << 20)
    assert (ctrl / "w.stack").read_text().startswith("Thread 0x1")


def _content(path):
    return path.read_bytes() if path.exists() else b""
