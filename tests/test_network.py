"""A network namespace per cluster (--mwms-network): the host cannot reach
the workers, they still reach each other, and nothing is left behind."""
import json
import os
import socket
import subprocess
import tempfile
import time

import psutil
import pytest

import harness
from harness import plan as plan_module
from harness.diagnosis.rules_links import SHARED_NETWORK, throttled_worker
from harness.network import isolation, namespace as netns
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
    assert isolation("host") == (False, "--mwms-network=host")
    assert isolation("auto") == ISOLATION


def test_the_session_header_says_where_clusters_run(pytester, monkeypatch):
    pytester.makepyfile("def test_x(): pass")
    # Unprobed, the header says what it can without starting a process.
    monkeypatch.delenv("MWMS_NETWORK_PROBES", raising=False)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert "pytest-mwms: network auto (a network namespace per cluster where this machine " \
           "allows it; the summary says which)" in result.stdout.str()
    # Probed already (a parent process did), it says which.
    isolation("auto")
    monkeypatch.setenv("MWMS_NETWORK_PROBES", os.environ["MWMS_NETWORK_PROBES"])
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    header = "isolated (a network namespace per cluster)" if ISOLATION[0] else "host loopback"
    assert f"pytest-mwms: network {header}" in result.stdout.str()
    host = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--mwms-network=host")
    assert "pytest-mwms: network host loopback (--mwms-network=host)" in host.stdout.str()
    if SWITCH[0]:
        switched = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                                 "--mwms-network=switched")
        assert "pytest-mwms: network switched (a network namespace per worker, on a bridge)" \
            in switched.stdout.str()
    bad = pytester.runpytest_subprocess("--mwms-network=private")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "--mwms-network: 'private' is not one of auto, isolated, switched, host" \
        in bad.stderr.str()


# ---------------------------------------------------------------- network faults

from harness.faults import Bandwidth, FaultError, Partition, UnresolvedHost  # noqa: E402
from harness.plan import needs_network  # noqa: E402


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
            plan_module.validate([bad], 2)


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


def reach_the_bridge_after(steps):
    """Once the boundaries of ``steps`` steps have passed, whether a TCP
    connection to the bridge gets through (nothing listens there: refused)."""
    ctx = harness.context()
    for _ in ctx.steps(steps):
        pass
    try:
        socket.create_connection((netns.BRIDGE_HOST, 9), timeout=1.0).close()
        return "connected"
    except OSError as e:
        return type(e).__name__


@needs_switch
def test_a_network_fault_is_in_place_when_its_step_begins(mwms_cluster):
    """The worker waits at its step's boundary until the parent has made
    the change: the step keyed to the fault is the one that meets it,
    however soon it begins (here at once, with no TensorFlow at all)."""
    result = mwms_cluster.run(reach_the_bridge_after, args=(2,), timeout=20,
                              faults=[Partition(1, 1)])
    result.assert_completed()
    assert result.return_values[0] == "ConnectionRefusedError"
    assert result.return_values[1] == "TimeoutError"


def _holders_alive():
    from harness.core import linux
    return [c.pid for c in psutil.Process().children(recursive=True)
            if c.name() == "sleep" and linux.alive(c.pid)]


def test_network_faults_say_why_they_cannot_be_done(monkeypatch):
    """A machine without ``tc`` (or ``setpriv``, ``nsenter``) gets the
    reason, and the run is refused before any process starts."""
    monkeypatch.delenv(netns.PROBES_VARIABLE, raising=False)
    real = netns.shutil.which
    monkeypatch.setattr(netns.shutil, "which", lambda tool: None if tool == "tc" else real(tool))
    ok, why = netns.switch_available()
    assert not ok and ("tc not installed" in why or why == ISOLATION[1])
    from harness.controller import Cluster
    from harness.settings import RunSettings
    with pytest.raises(SettingError, match="network faults need a network namespace per worker"):
        Cluster(RunSettings()).run(timed_steps, faults=[Partition(1, 2)])


# ---------------------------------------------------------------- the proxy (Latency, ResetPeers)

from harness.faults import Crash, Latency, ResetPeers  # noqa: E402
from harness.network.probe import serve_echo  # noqa: E402


def _round_trip(conn):
    import time
    t = time.monotonic()
    conn.sendall(b"x")
    assert conn.recv(1) == b"x"
    return time.monotonic() - t


def test_the_proxy_delays_resets_and_clears_what_it_carries():
    """No TensorFlow: the proxy on the host's loopback in front of an echo
    server, as route (0 -> 1).  A delay on either end holds each way; a
    reset sends RST to the client; a new connection is accepted after."""
    import sys
    from harness.launch.ports import reserve_ports
    server = serve_echo(0, "127.0.0.1")   # the prober's own echo
    with reserve_ports(1) as reservation:
        port = reservation.ports[0]
    proxy = subprocess.Popen([sys.executable, "-m", "harness.network.proxy"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    try:
        proxy.stdin.write((json.dumps([["127.0.0.1", port, "127.0.0.1",
                                        server.getsockname()[1], 0, 1]]) + "\n").encode())
        proxy.stdin.flush()
        assert proxy.stdout.readline().strip() == b"ready"

        def command(line):
            proxy.stdin.write(line.encode() + b"\n")
            proxy.stdin.flush()

        conn = socket.create_connection(("127.0.0.1", port), timeout=5)
        fast = min(_round_trip(conn) for _ in range(5))
        command("delay 1 60 0")
        slow = min(_round_trip(conn) for _ in range(3))
        command("clear 1")
        cleared = min(_round_trip(conn) for _ in range(3))
        assert fast < 0.05 and 0.12 <= slow < 0.6 and cleared < 0.05, (fast, slow, cleared)
        command("delay 2 500 0")           # a worker this connection does not join
        assert _round_trip(conn) < 0.05
        command("reset 1")
        with pytest.raises(ConnectionResetError):
            conn.recv(1)
        again = socket.create_connection(("127.0.0.1", port), timeout=5)
        assert _round_trip(again) < 0.5
        again.close()
    finally:
        proxy.stdin.close()
        assert proxy.wait(timeout=5) == 0          # it exits when its stdin closes
        proxy.stdout.close()
        server.close()


def test_latency_and_reset_faults_are_checked_and_say_what_they_do():
    from harness import faults
    assert Latency(1, 4, ms=50).network_commands() == ((0.0, "delay 50 0"),)
    assert Latency(1, 4, ms=50, jitter_ms=5).network_commands() == ((0.0, "delay 50 5"),)
    assert ResetPeers(0, 2, after=0.2).network_commands() == ((0.2, "reset"),)
    assert needs_network([ResetPeers(0, 2)])
    assert netns.needs_proxy(["delay 5 0"]) and netns.needs_proxy(["reset"])
    assert not netns.needs_proxy(["down", "rate 500"])
    for bad, message in ((Latency(1, 4, ms=-1), "ms must be 0 or more"),
                         (Latency(1, 4, ms=5, jitter_ms=6), "jitter_ms must not exceed ms"),
                         (ResetPeers(1, 4, after="soon"), "after must be a number")):
        with pytest.raises(FaultError, match=message):
            plan_module.validate([bad], 2)


@needs_switch
def test_latency_slows_steps_by_round_trips_and_the_proxy_stays_invisible(mwms_cluster):
    """A 50 ms delay on worker 1: each all-reduce after it waits for a few
    round trips (about 4 x 50 ms with 2 workers, measured), every worker
    alike.  Each worker's TF_CONFIG lists its peers at the proxy; the
    observation the diagnosis reads lists the cluster as it is meant to be."""
    ms = 50
    result = mwms_cluster.run(timed_steps, kwargs={"n": 8}, timeout=30,
                              faults=[Latency(1, 4, ms=ms)])
    result.assert_completed()
    for times in result.return_values:
        before, after = sorted(times[1:4])[1], sorted(times[5:])[1]
        assert before < ms / 1000, times
        assert 2 * ms / 1000 <= after <= 12 * ms / 1000, times
    seen = [w.tf_config["cluster"]["worker"] for w in result.observation.workers]
    assert seen[0] == seen[1] and not any(netns.BRIDGE_HOST in a for a in seen[0]), seen
    assert not [c for c in psutil.Process().children(recursive=True)
                if "harness.network.proxy" in " ".join(c.cmdline())], "the proxy outlived its run"


@needs_switch
@pytest.mark.mwms(workers=3, network="switched")
def test_a_slow_link_is_named_by_its_round_trips_in_a_completed_run(mwms_cluster):
    """A 50 ms delay on worker 2 from step 2: the run completes, every
    worker slowed alike in the all-reduces (the arrivals point at no one,
    or at a peer the collective releases later); the links, tried because
    the collectives were slow, find worker 2's round trips 100 ms and the
    others' under a millisecond.  There is no twin on a real link here:
    this kernel has no netem, and the proxy is where latency is made."""
    from harness.diagnosis.stragglers import stragglers
    result = mwms_cluster.run(timed_steps, kwargs={"n": 6}, timeout=30,
                              faults=[Latency(2, 2, ms=50)])
    result.assert_completed()
    report = stragglers(result.observation)
    assert report.slow_link == (2,) and report.stragglers == (), result.diagnosis
    assert "slow link: worker 2's round trips to and from each peer took 10" in result.diagnosis
    trips = {(p.source, p.target): p.rtt for p in result.observation.links if p.source is not None}
    assert all(rtt is not None and (rtt >= 95 if 2 in pair else rtt < 20)
               for pair, rtt in trips.items()), trips
    assert result.phases["links"] < 2.0, result.phases
    # A run whose collectives were quick is not probed.
    quick = mwms_cluster.run(timed_steps, kwargs={"n": 6}, timeout=30)
    assert quick.observation.links == () and "links" not in quick.phases, quick.diagnosis


def _cannot_tell_who_was_reset(result):
    """Both ends of a reset connection see it fail: the verdict cannot tell
    which worker's connections were cut."""
    result.assert_failed(error="UnavailableError")
    result.assert_cannot_tell([0, 1])


@needs_switch
@pytest.mark.mwms(workers=2)
def test_a_reset_fails_the_step_in_flight_and_the_harness_cannot_tell(mwms_cluster):
    """Worker 0's connections reset while worker 1 waits for it in an
    all-reduce: RST, so "Connection reset by peer".  (The twin's text
    varies: ``ss -K`` destroys both ends' sockets, both being in the
    namespace, so a worker may see "Software caused connection abort", or
    a refused reconnect, as seen once in CI; its verdict is the same.)"""
    result = mwms_cluster.run(reset_in_flight, timeout=20, grace=5,
                              faults=[ResetPeers(0, 3, after=0.2)])
    _cannot_tell_who_was_reset(result)
    assert "Connection reset by peer" in result.workers[1].exception.message


@needs_isolation
@pytest.mark.mwms(network="isolated", workers=2)
def test_the_reset_twin_reads_the_same(mwms_cluster):
    """The fault's twin, with no fault plan: worker 0 destroys its own
    sockets (``ss -K``, as an admin tool or a NAT would, from outside
    TensorFlow) inside the cluster's isolated namespace.  With two workers
    every connection joins worker 0, so it cuts the same ones as
    ``ResetPeers(0, ...)``, and the verdict is the same."""
    _cannot_tell_who_was_reset(mwms_cluster.run(reset_in_flight, kwargs={"twin": True},
                                                timeout=20, grace=5))


def reset_in_flight(twin=False):
    """Worker 0 works 0.5 s before each step (its peer waits in the
    all-reduce); as the twin, it resets its own connections 0.2 s into
    step 3's wait."""
    import subprocess
    import time
    ctx = harness.context()
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    @tf.function
    def step():
        return strategy.reduce("SUM", strategy.run(lambda: tf.ones([10])), axis=None)

    for k in ctx.steps(6):
        if ctx.index == 0:
            time.sleep(0.2)
            if twin and k == 3:
                subprocess.run(["ss", "-K", "state", "established"], capture_output=True)
            time.sleep(0.3)
        step()


# -- a worker's address that does not resolve ---------------------------------

def name_a_worker_then_reduce(worker, name):
    """The user's own mistake: its TF_CONFIG lists worker ``worker`` by a
    host name nobody can resolve (a Service not yet, or never, in DNS)."""
    config = json.loads(os.environ["TF_CONFIG"])
    port = config["cluster"]["worker"][worker].rpartition(":")[2]
    config["cluster"]["worker"][worker] = f"{name}:{port}"
    os.environ["TF_CONFIG"] = json.dumps(config)
    return allreduce_loop(5)


@needs_isolation
@pytest.mark.parametrize("worker, outcome", [(1, "failed"), (0, "hang")])
def test_the_unresolved_address_twin_reads_as_the_fault_does(mwms_cluster, worker, outcome):
    """UnresolvedHost's twin: no hosts file of the harness's, the user's
    TF_CONFIG names a worker ``mwms-nowhere.invalid`` (in the run's network
    namespace a lookup fails at once, "Temporary failure in name
    resolution").  The verdict names that worker, as for the fault
    (scenarios/test_tf_config.py): a peer from TensorFlow's errors, the
    chief from the workers' lookups while all wait in strategy creation."""
    result = mwms_cluster.run(name_a_worker_then_reduce, args=(worker, "mwms-nowhere.invalid"),
                              timeout=4, grace=3)
    assert (result.outcome, result.culprits, result.verdict.rule) == (
        outcome, (worker,), "unresolved_address"), result.diagnosis
    assert f"worker {worker}'s address mwms-nowhere.invalid:" in result.diagnosis


@pytest.mark.mwms(network="host")
def test_a_name_fault_needs_a_hosts_file_of_its_own(mwms_cluster):
    """On the host's network there is no /etc/hosts of the run's own:
    refused, with the reason, before any process starts."""
    with pytest.raises(SettingError, match=r"UnresolvedHost.*\(--mwms-network=host\)"):
        mwms_cluster.run(allreduce_loop, faults=[UnresolvedHost(1)])
    assert mwms_cluster.runs == []


def test_a_cluster_with_a_hosts_file_of_its_own_leaves_the_hosts_alone():
    """The run's /etc/hosts is its own: a name it resolves is not the
    host's, and none of its copies is left behind in the temp directory."""
    ok, why = netns.names_available()
    if not ok:
        pytest.skip(why)
    before = set(os.listdir(tempfile.gettempdir()))
    with open("/etc/hosts") as f:
        hosts = f.read()
    with netns.Namespace(names=True) as ns:
        inside = ["nsenter", "-t", str(ns.anchor.pid), "-U", "-n", "-m",
                  "--preserve-credentials", "getent", "hosts", "mwms-worker-9"]

        def lookup(until: int):
            """getent's status once it is ``until`` (2: not found), or after 2 s."""
            for _ in range(100):
                done = subprocess.run(inside, capture_output=True, text=True)
                if done.returncode == until:
                    break
                time.sleep(0.02)
            return done

        assert lookup(until=2).returncode == 2
        ns.resolve("mwms-worker-9", "127.0.0.1", 0)
        assert lookup(until=0).stdout.split() == ["127.0.0.1", "mwms-worker-9"]
        ns.forget()
        assert lookup(until=2).returncode == 2
        ns.resolve("mwms-worker-9", "127.0.0.1", 30)   # due after the run: dropped with it
        pending = list(ns.timers)
    assert pending and not any(t.is_alive() for t in pending)
    with open("/etc/hosts") as f:
        assert f.read() == hosts
    assert not {n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("tmp")}


def cut_own_link(at=None, n=8):
    """``allreduce_loop`` of ``n`` steps; as the twin of a ``Partition``,
    the last worker takes its own link down (``ip link set eth0 down`` in
    its namespace, as an admin's command or a failed NIC would) at step
    ``at``'s boundary."""
    import subprocess
    ctx = harness.context()

    def steps(count):
        for k in ctx.steps(count):
            if k == at and ctx.index == ctx.num_workers - 1:
                subprocess.run(["ip", "link", "set", "eth0", "down"], check=True)
            yield k
    return allreduce_loop(n, steps=steps)


def _cut_off_is_named(cluster):
    """A worker's link down for good at step 3 (the fault, and its twin in
    the job's own code): the run hangs (TensorFlow's heartbeats take 8-10 s,
    past the 4 s timeout), and the links tried as it ends find the worker
    silent to the switch and to its peers while the others answer: it is
    named, at 2 workers too, the switch standing outside both ends."""
    workers = cluster.num_workers
    last = workers - 1
    fault = cluster.run(cut_own_link, faults=[Partition(last, 3)])
    twin = cluster.run(cut_own_link, kwargs={"at": 3})
    for result in (fault, twin):
        v = result.verdict
        assert (result.outcome, v.rule, v.culprits, v.ambiguous) == \
            ("hang", "cut_off", (last,), False), result.diagnosis
        silent = {(p.source, p.target) for p in result.observation.links if not p.answered}
        assert silent == {(s, t) for s in [None, *range(workers)] for t in range(workers)
                          if s != t and last in (s, t)}, result.diagnosis
        assert result.phases["links"] < 2.0, result.phases
    assert not _holders_alive()


@needs_switch
@pytest.mark.mwms(workers=2, timeout=4, grace=1, network="switched")
def test_a_worker_cut_off_is_named_by_the_links_and_so_is_its_twin_at_2(mwms_cluster):
    _cut_off_is_named(mwms_cluster)


@needs_switch
@pytest.mark.mwms(workers=3, timeout=4, grace=1, network="switched")
def test_a_worker_cut_off_is_named_by_the_links_and_so_is_its_twin_at_3(mwms_cluster):
    _cut_off_is_named(mwms_cluster)


def throttle_own_link(at=None, n=8, size=8000):
    """``n`` all-reduces of ``size`` float32s (32 kB at 8000); as the twin
    of a ``Bandwidth(kbps=32)``, the last worker rate-limits its own link
    (``tc qdisc replace dev eth0 root tbf rate 32kbit``: a shaper an admin
    or a noisy neighbour's QoS would set) at step ``at``'s boundary."""
    import shutil
    import subprocess
    ctx = harness.context()
    tc = shutil.which("tc") or shutil.which("tc", path="/usr/sbin:/sbin")

    def steps(count):
        for k in ctx.steps(count):
            if k == at and ctx.index == ctx.num_workers - 1:
                subprocess.run([tc, "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate",
                                "32kbit", "burst", "16kb", "latency", "50ms"], check=True)
            yield k
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x = tf.ones([size])

    @tf.function
    def step():
        return strategy.reduce("SUM", strategy.run(lambda: x), axis=None)

    for _ in steps(n):
        step()


@needs_switch
@pytest.mark.mwms(workers=3, timeout=4, grace=1, network="switched")
def test_a_worker_whose_link_is_throttled_is_named_and_so_is_its_twin(mwms_cluster):
    """A link limited to 32 kbit/s at step 3 under 32 kB all-reduces (the
    fault, both ways; its twin, the worker's own egress): the run hangs.
    The links tried as it ends find the worker silent to all while the
    others answer, the handshakes waiting behind the full queue
    (``cut_off``); or, where a handshake slipped through while TCP backed
    off and the queue was empty, 64 kB there and back over each of its
    links too slow while the others carry it (``throttled``)."""
    last = mwms_cluster.num_workers - 1
    fault = mwms_cluster.run(throttle_own_link, faults=[Bandwidth(last, 3, kbps=32)])
    twin = mwms_cluster.run(throttle_own_link, kwargs={"at": 3})
    for result in (fault, twin):
        v = result.verdict
        assert (result.outcome, v.culprits, v.ambiguous) == ("hang", (last,), False), \
            result.diagnosis
        assert v.rule in ("cut_off", "throttled"), result.diagnosis
        # The bulk never comes back over the throttled link: either rule's evidence holds.
        assert throttled_worker(result.observation.links, mwms_cluster.num_workers) == last, \
            result.diagnosis
    assert not _holders_alive()


@needs_switch
@pytest.mark.mwms(workers=2, timeout=10, network="switched")
def test_links_are_tried_when_a_switched_run_does_not_complete_not_after_a_quick_one(mwms_cluster):
    done = mwms_cluster.run(cut_own_link)
    done.assert_completed()
    assert done.observation.links == () and "links" not in done.phases
    crashed = mwms_cluster.run(cut_own_link, faults=[Crash(1, 3)], grace=1)
    assert crashed.outcome == "crashed" and crashed.verdict.culprits == (1,), crashed.diagnosis
    # A crashed worker's port is closed: its link answers with a reset.
    assert crashed.observation.links and all(p.answered for p in crashed.observation.links)


@needs_isolation
@pytest.mark.mwms(workers=2, timeout=10, network="isolated")
def test_on_one_shared_network_no_link_is_a_worker_s_own_to_try(mwms_cluster):
    """Nothing is tried, and the observation says why; the verdict says it
    only where it cannot tell (a crash named needs no links)."""
    crashed = mwms_cluster.run(cut_own_link, faults=[Crash(1, 3)], grace=1)
    assert crashed.observation.links == ()
    assert crashed.observation.links_note == SHARED_NETWORK
    assert crashed.verdict.culprits == (1,) and "links:" not in crashed.diagnosis
