"""The Ray backend (--mwms-backend=ray) on a local Ray cluster of 2 and 3
simulated nodes: the same verdicts as the local backend, workers spread
over the nodes, nothing left behind, SIGKILL of pytest included.

Skipped, with the reason, where Ray is not installed
(``pip install -e '.[ray]'``)."""
import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from harness import faults as F
from harness.controller import Cluster
from harness.settings import RunSettings, SettingError, check_backend, parse_marker
from harness.workloads import allreduce_loop
from harness.core.linux import wait_gone
from helpers import SESSION_MARK

from harness.launch.ray import launcher as raylaunch  # noqa: E402 - imports nothing of Ray

RAY = raylaunch.available()
needs_ray = pytest.mark.skipif(not RAY[0], reason=RAY[1])
# One pytest-xdist process runs these one after another (--dist loadgroup):
# two Ray clusters at once on 2 cores start workers late enough to read as
# a hang.
pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("heavy")]

WORKERS = 3
TIMEOUT = 4.0
CASES = {
    "completes": [],
    "Crash": [F.Crash(WORKERS - 1, 3)],
    "RaiseError": [F.RaiseError(0, 2, "the user's error")],
    "SkipStep": [F.SkipStep(1, 3)],
    "Pause": [F.Pause(1, 3)],
    "Delay": [F.Delay(1, 2, seconds=1.0)],
}


def _verdict(result):
    v = result.verdict
    return v.outcome, v.culprits, v.ambiguous


_local_verdicts = {}


def _local(case):
    if case not in _local_verdicts:
        cluster = Cluster(RunSettings(workers=WORKERS, timeout=TIMEOUT, grace=3, network="host"))
        _local_verdicts[case] = _verdict(cluster.run(allreduce_loop, args=(6,),
                                                     faults=CASES[case]))
    return _local_verdicts[case]


@pytest.fixture(scope="module", params=[3], ids=lambda k: f"{k}nodes")
def ray_nodes(request):
    """A local Ray cluster of 3 simulated nodes, one worker on each, for the
    tests below; ended after them, so the rest of the suite runs without
    it.  (2 nodes, two workers on one, gave the same verdicts; left out to
    keep CI's run within its budget: add 2 to ``params`` to check it.)"""
    yield request.param
    raylaunch.close_session()


def _ray_cluster(nodes, **overrides):
    return Cluster(RunSettings(workers=WORKERS, timeout=TIMEOUT, grace=3, backend="ray",
                               ray_nodes=nodes, **overrides))


@needs_ray
@pytest.mark.parametrize("case", list(CASES))
def test_the_same_verdict_as_the_local_backend(ray_nodes, case):
    result = _ray_cluster(ray_nodes).run(allreduce_loop, args=(6,), faults=CASES[case])
    assert _verdict(result) == _local(case), result.diagnosis
    if case == "completes":
        assert result.return_values == [float(WORKERS)] * WORKERS
    if case in ("SkipStep", "Pause"):      # a hang: blocked workers' stacks were collected
        blocked = [w for w in result.workers if w.index != 1]
        assert all("quick_execute" in (w.stack or "") for w in blocked), result.diagnosis


def whose_forkserver():
    """The worker's parent: its node's forkserver (one per node agent)."""
    import harness
    harness.context()
    return os.getppid()


def own_port_locked_in(state_dir):
    """Whether this worker's port (from its ``TF_CONFIG``) has its lock
    file in ``state_dir`` while the worker runs."""
    import json
    import harness
    ctx = harness.context()
    config = json.loads(os.environ["TF_CONFIG"])
    port = config["cluster"]["worker"][ctx.index].rpartition(":")[2]
    return os.path.exists(os.path.join(state_dir, port))


@needs_ray
def test_ray_workers_ports_are_locked_where_the_local_backends_are(ray_nodes):
    """The node agents reserve ports in the machine's state directory, the
    one every local run and other user of the machine locks in, not in
    Ray's own temp directory (the agents' temp directory)."""
    from harness.launch.state_dir import resolve_state_dir
    result = _ray_cluster(ray_nodes).run(own_port_locked_in, args=(resolve_state_dir(None)[0],),
                                          timeout=20)
    result.assert_completed()
    assert result.return_values == [True] * WORKERS


@needs_ray
def test_workers_spread_one_per_node_and_restart_in_place(ray_nodes):
    cluster = _ray_cluster(ray_nodes)
    # The matrix's 4 s timeout is short for these runs on a busy machine.
    spread = cluster.run(whose_forkserver, timeout=20)
    parents = spread.return_values
    assert len(set(parents)) == min(WORKERS, ray_nodes), spread.report()
    # worker i on node i mod K: workers 0 and 2 share node 0 on 2 nodes
    assert (parents[0] == parents[2]) == (ray_nodes == 2), parents
    # On a busy machine a restarted attempt's workers spent 4 s converting
    # the step function (CI).
    restarted = cluster.run(allreduce_loop, args=(6,), restarts=1, faults=[F.Crash(1, 2)],
                            timeout=20)
    restarted.assert_completed()
    assert [a.outcome for a in restarted.attempts] == ["crashed", "completed"]


def test_ray_settings_are_checked(monkeypatch):
    assert parse_marker({"backend": "ray"}) == {"backend": "ray"}
    with pytest.raises(SettingError, match=r"mwms\(backend=\.\.\.\)"):
        parse_marker({"backend": "slurm"})
    from harness.validators import parse_ray_address, parse_ray_nodes
    assert parse_ray_address("") is None and parse_ray_address("auto") == "auto"
    assert parse_ray_address("10.0.0.1:6379") == "10.0.0.1:6379"
    for bad in ("6379", "host:", "host:99999"):
        with pytest.raises(SettingError, match="not auto or HOST:PORT"):
            parse_ray_address(bad)
    with pytest.raises(SettingError, match="from 1 to 16"):
        parse_ray_nodes("0")
    if RAY[0]:
        with pytest.raises(SettingError, match="network='isolated' cannot be had"):
            check_backend(RunSettings(backend="ray", network="isolated"))
    # Without Ray: a usage error that says how to install it.
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(SettingError, match=r"Ray is not installed; install it with "
                                           r"pip install -e '\.\[ray\]'"):
        check_backend(RunSettings(backend="ray"))


@needs_ray
def test_network_faults_are_refused_on_ray(ray_nodes):
    with pytest.raises(SettingError, match=r"network faults need a network namespace per "
                                           r"worker, and this run has none \(--mwms-backend=ray"):
        _ray_cluster(ray_nodes).run(allreduce_loop, faults=[F.Partition(1, 2)])


INNER = """
import os, time
import harness

def stuck():
    ctx = harness.context()
    with open(os.path.join(os.environ["MWMS_PIDDIR"], f"worker-{ctx.index}"), "w") as f:
        f.write(str(os.getpid()))
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    if ctx.index == 0:
        strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
    time.sleep(1000)

def test_hung(mwms_cluster):
    mwms_cluster.run(stuck, timeout=200)
"""


def _everything_under(pid):
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


@needs_ray
def test_sigkill_of_pytest_leaves_nothing_of_ray_behind(pytester, tmp_path):
    """The inner pytest starts a local Ray cluster (holder, GCS, raylets,
    agents, their forkservers) and a hung 2-worker run; SIGKILL it, and
    every one of those processes is gone, the workers with them."""
    piddir = tmp_path / "pids"
    piddir.mkdir()
    before = ray_dirs()
    pytester.makepyfile(test_inner=INNER)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-s",
         "--mwms-backend=ray", "--mwms-ray-nodes=2", "test_inner.py"],
        cwd=pytester.path, env=dict(os.environ, MWMS_PIDDIR=str(piddir)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(list(piddir.iterdir())) < 2:
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "workers never started"
            time.sleep(0.2)
        time.sleep(0.5)
        workers = [int(f.read_text()) for f in piddir.iterdir()]
        pids = set(_everything_under(proc.pid)) | set(workers)
        names = {psutil.Process(p).name() for p in pids if psutil.pid_exists(p)}
        assert {"gcs_server", "raylet"} <= names, names
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    left = wait_gone(sorted(pids), seconds=20)
    assert not left, [(p, psutil.Process(p).cmdline()[:3]) for p in left if psutil.pid_exists(p)]
    assert not [d for d in ray_dirs() if d not in before], "the cluster's directory was left"


def ray_dirs():
    """The local Ray clusters' directories, but those a live holder of
    another pytest session holds (pytest-xdist's other process, say)."""
    return [d for d in glob.glob("/tmp/mwms-ray-*") if not _held_elsewhere(d)]


def _held_elsewhere(directory):
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if directory in (proc.info["cmdline"] or []) and \
                    proc.environ().get(SESSION_MARK) != os.environ[SESSION_MARK]:
                return True
        except psutil.Error:
            continue
    return False


@needs_ray
def test_an_unmodified_script_on_ray_from_the_command_line(tmp_path):
    """``harness run --backend ray``: a script (run_script) on a local Ray
    cluster the command starts and ends itself, with a fault, named."""
    from test_cli import harness_cli
    before = ray_dirs()
    # harness run ends a worker whose script ended (on_return="exit"): worker
    # 1 leaves while worker 0 needs it, which fails with UnavailableError at
    # once or after TensorFlow's 10 s heartbeat timeout, under the 30 s one.
    proc = harness_cli(tmp_path, "-n", "2", "--timeout", "30", "--grace", "20",
                       "--backend", "ray", "--ray-nodes", "2", "--fault", "SkipStep(1, 2)",
                       "--expect", "failed",
                       "steps.py", "--", "--steps", "5", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "culprit: worker 1" in proc.stdout, proc.stdout
    # Two rules name it, and which answers depends on whether worker 0's call
    # was still reading worker 1's data when worker 1 returned: the one that
    # says it left (left_early), or the per-step counts.
    assert ("worker 1 returned and its process ended after 4 calls" in proc.stdout
            or "worker 1 (launched no collective in step 2" in proc.stdout), proc.stdout
    assert not [d for d in ray_dirs() if d not in before]


@needs_ray
def test_joining_a_running_cluster_by_address_leaves_it_running():
    """``--mwms-ray-address=HOST:PORT``: the harness joins a cluster it did
    not start (here one held apart, as ``ray start`` would run it), runs on
    it, and at the session's end leaves it running with none of its own
    actors or workers left."""
    raylaunch.close_session()
    held = raylaunch.HeldCluster(2)
    try:
        cluster = _ray_cluster(2, ray_address=held.address)
        result = cluster.run(allreduce_loop, args=(6,), faults=[F.SkipStep(1, 3)])
        assert _verdict(result) == _local("SkipStep"), result.diagnosis
        session = raylaunch.session(held.address, 2, ())
        agents = [psutil.Process(pid) for pid in session.agent_pids()]
        raylaunch.close_session()
        assert wait_gone([a.pid for a in agents], 20) == []
        assert not glob.glob(os.path.join(held.tmpdir, "mwms-agent-*", "*")), \
            "a worker's directory outlived the session"
        assert held.holder.poll() is None
        names = set()
        for p in psutil.Process(held.holder.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):   # one ending as it is listed
                names.add(p.name())
        assert {"gcs_server", "raylet"} <= names, names
    finally:
        held.close()


# -- nodes that share nothing ---------------------------------------------------

from harness.network import namespace as netns  # noqa: E402

ALIKE_CASES = {
    "completes": [],
    "Crash": [F.Crash(1, 3)],
    "SkipStep": [F.SkipStep(1, 3)],
    "Pause": [F.Pause(1, 3)],
}
HOSTS_NODES = 2
# Both sides of the comparison run beside the nodes' Ray cluster: its first
# step's tracing took over 4 s there in CI.
HOSTS_TIMEOUT = 8.0
SWITCH = netns.switch_available()


@needs_ray
@pytest.mark.skipif(not SWITCH[0], reason=f"no namespace per node here: {SWITCH[1]}")
def test_nodes_that_share_nothing_give_the_same_verdicts(tmp_path):
    """The Ray backend on nodes that share nothing but the code
    (:mod:`harness.launch.ray.hosts`): each node in a network namespace of
    its own (its own address, no loopback in common) with a private /tmp;
    the controller on the head node's host.  The verdicts are the local
    backend's, the blocked workers' stacks come back, each worker sees
    only its own node, and nothing of the cluster is left."""
    here = os.path.dirname(os.path.realpath(__file__))
    if here.startswith(os.path.realpath(tempfile.gettempdir()) + os.sep):
        pytest.skip(f"the checkout is in {tempfile.gettempdir()}, which the nodes do not share")
    raylaunch.close_session()   # one Ray cluster at a time on 2 cores (see pytestmark)
    marker = tempfile.NamedTemporaryFile(prefix="mwms-marker-", dir="/tmp", delete=False)
    marker.close()
    tmpdir = tempfile.mkdtemp(prefix="mwms-rh-", dir="/tmp")
    log = tmp_path / "hosts.log"
    with open(log, "wb") as log_file:
        held = subprocess.Popen([sys.executable, "-m", "harness.launch.ray.hosts",
                                 str(HOSTS_NODES), tmpdir], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=log_file)
    try:
        ready = raylaunch._readline(held.stdout, raylaunch.START_TIMEOUT).split()
        if ready[:1] != ["ready"]:
            pytest.fail(f"the cluster did not start ({ready}); its log ends:\n"
                        + log.read_text(errors="replace")[-6000:], pytrace=False)
        _, gcs, user_ns, net_ns = ready
        driven = subprocess.run(
            [sys.executable, os.path.join(here, "ray_hosts_driver.py"), user_ns, net_ns, gcs,
             os.path.join(tmpdir, "ray"), marker.name], capture_output=True, text=True,
            timeout=180, cwd=os.path.dirname(here),
            env={**os.environ, "PYTHONPATH": os.pathsep.join([here, os.path.dirname(here)])})
        lines = [json.loads(line) for line in driven.stdout.splitlines() if line.startswith("{")]
        assert len(lines) == len(ALIKE_CASES) + 1, driven.stdout[-3000:] + driven.stderr[-3000:]
        for line in lines[:-1]:
            case = line["case"]
            local = Cluster(RunSettings(workers=2, timeout=HOSTS_TIMEOUT, grace=3,
                                        network="host")).run(
                allreduce_loop, args=(6,), faults=ALIKE_CASES[case])
            assert tuple(line["verdict"][:1]) + (tuple(line["verdict"][1]), line["verdict"][2]) \
                == _verdict(local), line["diagnosis"]
            if case in ("SkipStep", "Pause"):   # the blocked worker's stack came back
                assert line["stacks"][0], line["diagnosis"]
        where = lines[-1]
        assert where["outcome"] == "completed", where
        (ns0, address0, sees0), (ns1, address1, sees1) = where["workers"]
        assert len({ns0, ns1, os.readlink("/proc/self/ns/net")}) == 3, where
        assert {address0.rpartition(":")[0], address1.rpartition(":")[0]} == {f"{netns.SUBNET}.{i + 1}" for i in range(HOSTS_NODES)}
        assert not sees0 and not sees1, "a node sees the controller's /tmp"
    finally:
        held.stdin.close()
        held.wait(timeout=60)
        os.unlink(marker.name)
    assert not os.path.exists(tmpdir)
    assert not [p for p in psutil.process_iter(["cmdline"])
                if tmpdir in " ".join(p.info["cmdline"] or [])], "a process of the cluster is left"
