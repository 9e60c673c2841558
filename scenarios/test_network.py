"""The network: a worker cut off from its peers, for good or for a moment,
a slow link, a far node, connections reset.  Each worker is in a network
namespace of its own, joined to the others through a bridge
(``harness.network.namespace``); ``Partition`` takes its link down (and up again),
``Bandwidth`` throttles it; ``Latency`` and ``ResetPeers`` act through a
TCP proxy between the workers (``harness.network.proxy``).  The faults act at
step 5 of the seed's loop.
"""
import pytest

from harness.network import namespace as netns
from harness.faults import Bandwidth, Latency, Partition, ResetPeers
from scenarios.meta import NO_FIX, scenario
from scenarios.test_peer_faults import AT, COLLECTIVE_TIMEOUT, train_loop

pytestmark = pytest.mark.skipif(not netns.switch_available()[0], reason=(
    f"network faults need a network namespace per worker: {netns.switch_available()[1]}"))


def _last(mwms_cluster):
    return mwms_cluster.num_workers - 1


@pytest.mark.by_version
@pytest.mark.timeout(90)
@scenario(outcome="failed", error="UnavailableError", source="MWMS docs: fault tolerance",
          fixed_by=NO_FIX)
def test_partition_never_heals(mwms_cluster):
    """A worker's network link goes down at step 5 and stays down; its
    process runs on.  No ``CommunicationOptions`` timeout.

    TensorFlow: the step's all-reduce waits until the coordination service
    misses the cut-off worker's heartbeats, 8-10 s later: the others raise
    ``UnavailableError`` naming it as unhealthy, and it raises
    ``DeadlineExceededError`` on its own heartbeat.  The harness reads every
    error as an echo; the links it tries as the run ends find the worker
    silent to the switch and to its peers, every other link answering, and
    name it (rule ``cut_off``), with 2 workers too, where the errors alone
    cannot tell the side (only the leader names its one peer, as it would
    if its own link were cut).

    Source: the MWMS fault-tolerance guide (a lost node).

    Fix: none makes it complete without the node; checkpoint, and let a
    cluster manager restart the job (``run(restarts=1)`` shows it).
    """
    last = _last(mwms_cluster)
    result = mwms_cluster.run(train_loop, timeout=30, grace=20, faults=[Partition(last, AT)])
    result.assert_failed().assert_culprit(last)
    assert result.verdict.rule == "cut_off", result.diagnosis
    # Which comes first differs (2.15: the cut-off worker's own deadline),
    # so each worker's error type is what is asserted.
    assert all(w.exception.type_name == "UnavailableError" for w in result.workers[:last])
    assert result.workers[last].exception.type_name == "DeadlineExceededError"


@pytest.mark.by_version
@pytest.mark.timeout(90)
@scenario(outcome=("failed", "crashed"), error="DeadlineExceededError",
          source="MWMS docs: fault tolerance; CommunicationOptions", fixed_by=NO_FIX)
def test_partition_with_a_collective_timeout(mwms_cluster):
    """The same partition, with ``CommunicationOptions(timeout_seconds=4)``.

    TensorFlow: the collective gives up first: ``DeadlineExceededError``
    "Collective has timed out" on the workers waiting for the cut-off one,
    4 s later, before the heartbeats are missed (8-9 s).  Not deterministic: a
    worker, or every worker, may instead die of SIGSEGV aborting the
    timed-out collective (a TensorFlow bug, seen at 3 workers on 2.21 and
    at 2 on 2.15); the harness then says it cannot tell, rather than blame
    the workers that crashed.

    Source: the MWMS fault-tolerance guide; ``CommunicationOptions``.

    Fix: none completes; the timeout makes the failure come sooner.
    """
    last = _last(mwms_cluster)
    result = mwms_cluster.run(train_loop, kwargs={"collective_timeout": COLLECTIVE_TIMEOUT},
                              timeout=30, grace=20, faults=[Partition(last, AT)])
    if result.outcome == "crashed":
        result.assert_cannot_tell(range(mwms_cluster.num_workers))
    else:
        result.assert_failed(error="DeadlineExceededError")


@pytest.mark.timeout(90)
@scenario(outcome="completed", source="MWMS docs: fault tolerance")
def test_partition_healed_before_the_heartbeat_timeout(mwms_cluster):
    """Fixed, in the sense that nothing needs fixing: the link is down for
    2 s at step 5, then up.

    TensorFlow: the step waits out the cut and training goes on; every
    worker completes with the same loss.  Shorter than the heartbeat
    timeout (about 10 s), a partition is a straggler.

    Source: the MWMS fault-tolerance guide.

    Fix: nothing to fix.
    """
    last = _last(mwms_cluster)
    result = mwms_cluster.run(train_loop, timeout=20,
                              faults=[Partition(last, AT, seconds=2)])
    result.assert_completed()
    assert len(set(result.return_values)) == 1


@pytest.mark.timeout(90)
@scenario(outcome="completed", source="MWMS docs: fault tolerance")
def test_slow_link_straggler(mwms_cluster):
    """Fixed, in the same sense: from step 5 on, the last worker's link
    carries 2 Mbit/s each way.

    TensorFlow: every all-reduce after it is slower for every worker (they
    wait on the slow link), and all complete with the same loss.

    Source: the MWMS fault-tolerance guide (stragglers).

    Fix: nothing to fix, but a slow link slows the whole cluster.
    """
    last = _last(mwms_cluster)
    result = mwms_cluster.run(train_loop, timeout=20, faults=[Bandwidth(last, AT, kbps=2000)])
    result.assert_completed()
    assert len(set(result.return_values)) == 1


@pytest.mark.timeout(90)
@scenario(outcome="completed", source="MWMS docs: fault tolerance")
def test_high_latency_straggler(mwms_cluster):
    """Fixed, in the same sense: from step 5 on, every byte to and from the
    last worker arrives 30 ms late (± 10 ms), as from a node in another rack
    or region.

    TensorFlow: an all-reduce waits for several round trips, so each step
    costs a few times the delay (about 4 x 50 ms for a 2-worker all-reduce
    here); every worker completes with the same loss.

    Source: the MWMS fault-tolerance guide (stragglers).

    Fix: nothing to fix, but one far worker slows every step of the cluster.
    """
    last = _last(mwms_cluster)
    result = mwms_cluster.run(train_loop, timeout=20,
                              faults=[Latency(last, AT, ms=30, jitter_ms=10)])
    result.assert_completed()
    assert len(set(result.return_values)) == 1


# The chief's summary writing, which its peers wait out in the all-reduce;
# the reset comes RESET_AFTER into it.
CHIEF_SECONDS = 0.5
RESET_AFTER = 0.2


@pytest.mark.timeout(90)
@scenario(outcome="failed", error="UnavailableError", source="MWMS docs: fault tolerance",
          fixed_by="test_connections_reset_then_restarted")
def test_connections_reset_during_a_step(mwms_cluster):
    """Every connection of the chief is reset during step 5, while its
    peers wait for it inside the step's all-reduce (it writes summaries
    first).

    TensorFlow: the RPCs in flight fail at once with ``UnavailableError``
    ("Connection reset by peer"), on every worker, each naming the peer
    whose RPC failed; gRPC does not retry them.  A reset is seen from both
    ends alike, so the harness cannot tell which worker's connections were
    cut, and names every worker as a candidate.  (A reset while no RPC is
    in flight goes unnoticed: gRPC reconnects.)

    Source: the MWMS fault-tolerance guide; a NAT or load balancer that
    drops its connection table.

    Fix: none completes without a restart (see the next scenario).
    """
    result = mwms_cluster.run(train_loop, kwargs={"chief_seconds": CHIEF_SECONDS},
                              timeout=20, grace=5, faults=[ResetPeers(0, AT, after=RESET_AFTER)])
    result.assert_failed(error="UnavailableError")
    result.assert_cannot_tell(range(mwms_cluster.num_workers))


@pytest.mark.timeout(120)
@scenario(outcome="completed", source="MWMS docs: fault tolerance", straggler=True)
def test_connections_reset_then_restarted(mwms_cluster):
    """The same reset, with the job restarted once by its cluster manager
    (``restarts=1``).

    TensorFlow: the first attempt fails as above; the second, on fresh
    connections, completes.  Its peers wait out the chief's 0.5 s before
    each step, so the chief is the straggler its diagnosis names.

    Source: the MWMS fault-tolerance guide (restart the job).

    Fix: this is the fix: restart (and checkpoint, so as not to start over).
    """
    result = mwms_cluster.run(train_loop, kwargs={"chief_seconds": CHIEF_SECONDS},
                              timeout=20, grace=5, restarts=1, faults=[ResetPeers(0, AT, after=RESET_AFTER)])
    result.assert_completed()
    assert [a.outcome for a in result.attempts] == ["failed", "completed"]
