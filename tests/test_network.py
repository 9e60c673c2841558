"""A network namespace per cluster (--mwms-network): the host cannot reach
the workers, they still reach each other, and nothing is left behind."""
import json
import os
import socket
import subprocess

import psutil
import pytest

import harness
from harness import netns
from harness.settings import SettingError, parse_marker
from harness.workloads import allreduce_loop

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leftover_workers")]
ISOLATION = netns.available()
needs_isolation = pytest.mark.skipif(not ISOLATION[0], reason=f"no network namespace "
                                     f"here: {ISOLATION[1]}")
SWITCH = netns.switch_available()
needs_switch = pytest.mark.skipif(not SWITCH[0], reason=f"no namespace per worker here: "
                                  f"{SWITCH[1]}")


def hold_the_port(path):
    """Worker 0 writes its gRPC port to ``path`` once its strategy exists,
    then waits long enough for the parent to knock on it."""
    import time
    ctx = harness.context()
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    if ctx.index == 0:
        port = json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"][0].rsplit(":", 1)[1]
        with open(path, "w") as f:
            f.write(port)
        time.sleep(1.5)
    # and the workers still reach each other
    return float(strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None))


def _knock(mwms_cluster, tmp_path):
    """Run ``hold_the_port`` and, while worker 0 holds its port, look from
    the host: does 127.0.0.1:PORT accept, does ``ss -ltn`` list it, is a
    namespace anchor among pytest's children."""
    path = tmp_path / "port"
    seen = {}

    def progress(_):
        if "port" in seen or not path.exists() or not path.read_text():
            return
        port = int(path.read_text())
        seen["port"] = port
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            seen["connect"] = "accepted"
        except ConnectionRefusedError:
            seen["connect"] = "refused"
        listening = subprocess.run(["ss", "-ltn"], capture_output=True, text=True).stdout
        seen["listed"] = f":{port} " in listening
        seen["anchors"] = _anchors()

    result = mwms_cluster.run(hold_the_port, args=(str(path),), timeout=20, progress=progress)
    result.assert_completed()
    assert result.return_values == [float(mwms_cluster.num_workers)] * mwms_cluster.num_workers
    assert "port" in seen, "the parent never saw the worker's port"
    return seen


def _anchors():
    return [c.pid for c in psutil.Process().children(recursive=True) if c.name() == "cat"]


@needs_isolation
@pytest.mark.mwms(network="isolated")
def test_isolated_workers_are_not_reachable_from_the_host(mwms_cluster, tmp_path):
    seen = _knock(mwms_cluster, tmp_path)
    assert (seen["connect"], seen["listed"]) == ("refused", False)
    assert len(seen["anchors"]) == 1
    assert _anchors() == []                        # the anchor went with the run


@pytest.mark.mwms(network="host")
def test_on_the_host_they_are(mwms_cluster, tmp_path):
    seen = _knock(mwms_cluster, tmp_path)
    assert (seen["connect"], seen["listed"], seen["anchors"]) == ("accepted", True, [])


@needs_isolation
@pytest.mark.mwms(network="isolated", workers=3)
def test_isolated_runs_restart_and_fail_as_on_the_host(mwms_cluster):
    from harness.faults import Crash
    result = mwms_cluster.run(allreduce_loop, args=(6,), timeout=20, grace=1, restarts=1,
                              faults=[Crash(2, 3)])
    result.assert_completed()
    assert [a.outcome for a in result.attempts] == ["crashed", "completed"]
    assert result.attempts[0].culprits == (2,)


@needs_isolation
@pytest.mark.mwms(network="isolated")
def test_a_worker_that_cannot_join_its_namespace_says_so(mwms_cluster, monkeypatch):
    monkeypatch.setattr(netns.Namespace, "paths", property(
        lambda self: ("/nonexistent/user", "/nonexistent/net")))
    result = mwms_cluster.run(allreduce_loop, args=(3,), timeout=20, grace=1)
    result.assert_failed(error="HarnessError")
    assert "could not join the cluster's network namespace" in result.workers[0].exception.message


def test_network_settings_are_checked():
    assert parse_marker({"network": "host"}) == {"network": "host"}
    with pytest.raises(SettingError, match=r"mwms\(network=\.\.\.\)"):
        parse_marker({"network": "private"})
    assert netns.resolve("host") == (False, "--mwms-network=host")
    assert netns.resolve("auto") == ISOLATION


def test_the_session_header_says_where_clusters_run(pytester):
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    header = "isolated (a network namespace per cluster)" if ISOLATION[0] else "host loopback"
    assert f"pytest-mwms: network {header}" in result.stdout.str()
    host = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--mwms-network=host")
    assert "pytest-mwms: network host loopback (--mwms-network=host)" in host.stdout.str()
    bad = pytester.runpytest_subprocess("--mwms-network=private")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "--mwms-network: 'private' is not one of auto, isolated, host" in bad.stderr.str()


# ---------------------------------------------------------------- network faults

from harness.faults import Bandwidth, FaultError, Partition, needs_network  # noqa: E402


def timed_steps(size=1, n=10):
    """``n`` all-reduces of ``size`` float32s, each timed in the worker."""
    import time
    ctx = harness.context()
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x = tf.ones([size])

    @tf.function
    def step():
        return strategy.reduce("SUM", strategy.run(lambda: x), axis=None)

    times = []
    for _ in ctx.steps(n):
        t = time.monotonic()
        step()
        times.append(time.monotonic() - t)
    return times


def test_network_faults_are_checked_and_say_what_they_do():
    assert Partition(1, 4).network_commands() == ((0.0, "down"),)
    assert Partition(1, 4, seconds=3).network_commands() == ((0.0, "down"), (3, "up"))
    assert Bandwidth(0, 2, kbps=500).network_commands() == ((0.0, "rate 500"),)
    assert needs_network([Partition(1, 4)]) and not needs_network([])
    from harness import faults
    for bad, message in ((Partition(1, 4, seconds=-1), "seconds"),
                         (Bandwidth(1, 4, kbps=1), "kbps must be 8 or more")):
        with pytest.raises(FaultError, match=message):
            faults.validate([bad], 2)


@pytest.mark.mwms(network="host")
def test_network_faults_need_namespaces(mwms_cluster):
    """On the host's loopback there is no link to cut: refused, with the
    reason, before any process starts (the same where namespaces cannot be
    made at all)."""
    with pytest.raises(SettingError, match=r"network faults need a network namespace per "
                                           r"worker, and this run has none \(--mwms-network=host\)"):
        mwms_cluster.run(timed_steps, faults=[Partition(1, 2)])
    assert mwms_cluster.runs == []


@needs_switch
def test_a_healed_partition_delays_a_step_and_the_run_completes(mwms_cluster):
    result = mwms_cluster.run(timed_steps, timeout=20, faults=[Partition(1, 4, seconds=2)])
    result.assert_completed()
    for times in result.return_values:
        # The step at the cut waits it out (a later one may still pay for
        # TCP's retransmission back-off, as seen once under CI load).
        slowest = max(times)
        assert 1.5 <= slowest <= 8.0 and times.index(slowest) in (4, 5), times
    assert not _holders_alive()


@needs_switch
def test_a_bandwidth_limit_slows_steps_by_what_the_link_carries(mwms_cluster):
    size, kbps = 250_000, 20_000          # 1 MB a step through 20 Mbit/s: about 0.4 s
    expected = size * 4 * 8 / (kbps * 1000)
    result = mwms_cluster.run(timed_steps, kwargs={"size": size, "n": 8}, timeout=30,
                              faults=[Bandwidth(1, 4, kbps=kbps)])
    result.assert_completed()
    for times in result.return_values:
        before, after = sorted(times[1:4])[1], sorted(times[5:])[1]
        assert before < expected / 4, times
        assert expected / 2 <= after <= expected * 4, (expected, times)


def _holders_alive():
    from harness import linux
    return [c.pid for c in psutil.Process().children(recursive=True)
            if c.name() == "sleep" and linux.alive(c.pid)]


def test_network_faults_say_why_they_cannot_be_done(monkeypatch):
    """A machine without ``tc`` (or ``setpriv``, ``nsenter``) gets the
    reason, and the run is refused before any process starts."""
    monkeypatch.setattr(netns, "_switch_probed", None)
    real = netns.shutil.which
    monkeypatch.setattr(netns.shutil, "which", lambda tool: None if tool == "tc" else real(tool))
    ok, why = netns.switch_available()
    assert not ok and ("tc not installed" in why or why == ISOLATION[1])
    from harness.controller import Cluster
    from harness.settings import RunSettings
    with pytest.raises(SettingError, match="network faults need a network namespace per worker"):
        Cluster(RunSettings()).run(timed_steps, faults=[Partition(1, 2)])
