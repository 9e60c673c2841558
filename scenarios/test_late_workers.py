"""Workers that join late, or never: a pod scheduled late or left Pending
(``StartDelay``), and its twin in the job's own code, a worker that works
for long before it creates its strategy.

The late worker is always the last one (the chief, task 0, hosts
TensorFlow's coordination service: see docs/faults.md#a-worker-that-starts-late).
How long the others wait is the coordination service's registration
timeout: an hour by default; the scenarios that need it shorter set it in
the job's own code, as a user would (:func:`wait_for_the_cluster_at_most`).
"""
import json
import os

import pytest

from harness.core import versions
from harness.faults import StartDelay
from scenarios.meta import NO_FIX, culprit_check, scenario

# Whether TensorFlow has a registration barrier decides these (HAS_BARRIER).
pytestmark = pytest.mark.by_version

STEPS = 5
REGISTER_TIMEOUT = 1.0   # the job's own registration timeout, seconds
# The others give up about a second past the registration timeout; the late
# worker starts well after that and well before their grace has run out,
# so that its start is seen every time.
LATE = 3.5
GRACE = 4.0
WITHIN = 3.0             # late, with TensorFlow's own timeout of an hour
# Whether the installed TensorFlow's coordination config has a registration
# barrier, without which the registration timeout bounds no wait.
HAS_BARRIER = versions.installed_minor() >= (2, 19)


def wait_for_the_cluster_at_most(seconds):
    """The job's own coordination service config, set before the strategy
    (which then uses it instead of its own): the workers wait ``seconds``
    for every task to register, then fail.  TensorFlow 2.19 to 2.21 keep
    to it only with ``cluster_register_with_barrier`` on, which
    ``configure_coordination_service`` does not take: it is set on the
    config it made.  TensorFlow 2.15 to 2.18 have no such field, and the
    timeout bounds no wait there."""
    from tensorflow.python.eager import context
    try:
        from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2 as config_pb2
    except ImportError:   # TensorFlow 2.15-2.18
        from tensorflow.tsl.protobuf import coordination_config_pb2 as config_pb2
    workers = len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])
    context.context().configure_coordination_service(
        service_type="standalone", service_leader="/job:worker/replica:0/task:0",
        cluster_register_timeout_in_ms=int(seconds * 1000),
        coordinated_jobs=[config_pb2.CoordinatedJob(name="worker", num_tasks=workers)])
    made = context.context().coordination_service
    if "cluster_register_with_barrier" in made.DESCRIPTOR.fields_by_name:
        made.cluster_register_with_barrier = True


def train(register_timeout=None, slow_worker=None, slow_seconds=0.0, steps=STEPS):
    """``steps`` all-reduces of 1.0 (returns the last sum: the number of
    workers).  ``register_timeout``: the job's own registration timeout;
    ``slow_worker`` works ``slow_seconds`` (loading its data, say) before
    it creates the strategy."""
    import time

    import tensorflow as tf

    import harness
    ctx = harness.context()
    if register_timeout is not None:
        wait_for_the_cluster_at_most(register_timeout)
    if ctx.index == slow_worker:
        time.sleep(slow_seconds)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    @tf.function
    def step():
        return strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)

    total = None
    for _ in ctx.steps(steps):
        total = float(step())
    return total


def _last(mwms_cluster):
    return mwms_cluster.num_workers - 1


def started_at(worker_result):
    """When the parent saw the worker start (its first report), or None."""
    return next((e.time for e in worker_result.observation.events if e.kind == "started"), None)


def _the_others_gave_up_at_registration(result, last):
    for w in result.workers[:last]:
        assert w.exception is not None and w.exception.type_name.endswith(
            "DeadlineExceededError"), result.report()
        assert "Wait_for_all_tasks_to_register" in w.exception.message, result.report()
        assert w.exit_code == 1   # raised, as a Python process does: no SIGABRT


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="tensorflow#60706")
def test_a_late_worker_is_waited_for(mwms_cluster):
    """Fixed: the last worker's process starts 3 s after the others', with
    TensorFlow's own registration timeout (an hour).

    TensorFlow: the others wait for it in strategy creation (the
    coordination service logs "Waiting for 1/N tasks to connect"), then
    every worker goes on together; nothing fails.

    Source: tensorflow#60706; kubeflow/trainer#1282 (pods scheduled one by one).

    Fix: nothing to fix: a registration timeout longer than the cluster
    manager's scheduling delays is what lets this complete.
    """
    last = _last(mwms_cluster)
    result = mwms_cluster.run(train, timeout=20, faults=[StartDelay(last, WITHIN)])
    result.assert_completed()
    n = mwms_cluster.num_workers
    assert result.return_values == [float(n)] * n
    assert started_at(result.workers[last]) - started_at(result.workers[0]) >= WITHIN - 0.5


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="DeadlineExceededError", source="tensorflow#60706",
          fixed_by="test_a_late_worker_is_waited_for",
          on={"2.15-2.18": dict(outcome="completed")})
def test_a_worker_late_past_the_registration_timeout(scenario_run, mwms_cluster):
    """The last worker's process starts 3.5 s late; the job waits 1 s for the
    cluster to register (its own coordination config).

    TensorFlow: about a second past the timeout every on-time worker raises
    ``DeadlineExceededError`` in ``MultiWorkerMirroredStrategy()``
    ("Barrier timed out. Id: [Init]Wait_for_all_tasks_to_register"); the
    service logs "cluster registration failed ... some tasks were never
    scheduled, or scheduling delays".  They exit with status 1, as a Python
    process whose main raised: no SIGABRT on 2.21 (tensorflow#60706 saw one
    on 2.9 and 2.11).  The late worker, started after they left, waits in
    strategy creation (its registration fails with "Deadline Exceeded"
    about 9 s later).  On 2.15-2.18 the config has no registration barrier
    and the timeout bounds no wait: the late worker is waited for and the
    run completes.

    Source: tensorflow#60706; kubeflow/trainer#1282.

    Fix: a registration timeout longer than the scheduling delays (the
    default, an hour, or the cluster manager's gang scheduling, which starts
    every pod together).
    """
    result = _past_the_timeout(scenario_run, mwms_cluster)
    if HAS_BARRIER:
        _the_others_gave_up_at_registration(result, _last(mwms_cluster))


def _past_the_timeout(scenario_run, mwms_cluster):
    return scenario_run("past", train, kwargs={"register_timeout": REGISTER_TIMEOUT},
                        timeout=20, grace=GRACE, faults=[StartDelay(_last(mwms_cluster), LATE)])


@pytest.mark.timeout(60)
@culprit_check("test_a_worker_late_past_the_registration_timeout")
def test_the_late_worker_is_named_not_the_ones_that_gave_up(scenario_run, mwms_cluster):
    result = _past_the_timeout(scenario_run, mwms_cluster)
    if not HAS_BARRIER:
        result.assert_completed()
        return
    last = _last(mwms_cluster)
    result.assert_culprit(last)
    assert result.verdict.rule == "late_start"
    head = result.diagnosis.splitlines()[0]
    assert head.startswith(f"FAILED: worker {last} started ") and "s late; " in head, head
    assert "gave up in strategy creation after" in head and "(DeadlineExceededError)" in head


@pytest.mark.timeout(60)
@scenario(outcome="hang", source="kubeflow/trainer#1282", fixed_by=NO_FIX)
def test_a_worker_that_never_starts(mwms_cluster):
    """The last worker is never scheduled (its pod stays Pending), with
    TensorFlow's own registration timeout (an hour).

    TensorFlow: the others wait in strategy creation for it, silently but
    for the coordination service's "Waiting for 1/N tasks to connect" (60 s
    measured with nothing else; the hour is the service's default).
    ``CommunicationOptions(timeout_seconds=...)`` bounds collectives, not
    this wait (measured: 3 s set, blocked 20 s).  The run's hang timeout
    ends it, and the verdict names the worker that never started.

    Source: kubeflow/trainer#1282 (one of 100 pods Pending forever).

    Fix: none completes without the worker; a registration timeout fails the
    job fast instead (``test_a_worker_that_never_starts_with_a_registration_timeout``),
    and the cluster manager can then restart it.
    """
    last = _last(mwms_cluster)
    result = mwms_cluster.run(train, timeout=4, faults=[StartDelay(last, None)])
    result.assert_hang(culprits=[last])
    assert result.verdict.rule == "late_start"
    assert f"worker {last} never started" in result.diagnosis.splitlines()[0]
    assert started_at(result.workers[last]) is None


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="DeadlineExceededError", source="tensorflow#60706",
          fixed_by=NO_FIX, on={"2.15-2.18": dict(outcome="hang")})
def test_a_worker_that_never_starts_with_a_registration_timeout(mwms_cluster):
    """The last worker is never scheduled; the job waits 1 s for the cluster
    to register.

    TensorFlow: the others raise ``DeadlineExceededError`` (the registration
    barrier) about a second past the timeout, and exit; the verdict names
    the worker that never started.  On 2.15-2.18 the timeout bounds no
    wait: the others wait until the hang timeout.

    Source: tensorflow#60706.

    Fix: none completes without the worker; failing fast lets the cluster
    manager restart the job once it can be scheduled.
    """
    last = _last(mwms_cluster)
    result = mwms_cluster.run(train, kwargs={"register_timeout": REGISTER_TIMEOUT}, timeout=4,
                              grace=1, faults=[StartDelay(last, None)])
    assert result.culprits == (last,) and result.verdict.rule == "late_start", result.report()
    assert f"worker {last} never started" in result.diagnosis.splitlines()[0]


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="DeadlineExceededError", source="seed rule 2",
          fixed_by="test_a_late_worker_is_waited_for", on={"2.15-2.18": dict(outcome="completed")})
def test_a_worker_that_works_before_creating_its_strategy(mwms_cluster):
    """The last worker spends 3.5 s in its own code (loading its data, say)
    before it creates the strategy, the twin of a late start; the job waits
    1 s for the cluster to register.

    TensorFlow: as for a late process: the others raise
    ``DeadlineExceededError`` at the registration barrier; the verdict
    names the slow worker, which started on time and entered strategy
    creation 3.5 s after the others.  On 2.15-2.18 it is waited for and the
    run completes.

    Source: seed rule 2 (the strategy first); tensorflow#60706.

    Fix: create the strategy first, then load the data, or a registration
    timeout longer than the work before it.
    """
    last = _last(mwms_cluster)
    result = mwms_cluster.run(train, kwargs={"register_timeout": REGISTER_TIMEOUT,
                                             "slow_worker": last, "slow_seconds": LATE},
                              timeout=20, grace=GRACE)
    if not HAS_BARRIER:
        result.assert_completed()
        return
    _the_others_gave_up_at_registration(result, last)
    result.assert_culprit(last)
    assert result.verdict.rule == "late_start"
    assert f"worker {last} entered strategy creation" in result.diagnosis.splitlines()[0]
