"""Parameter-server clusters without TensorFlow: their shape and
``TF_CONFIG``, the settings and faults they refuse, and the verdict's
rules on hand-built observations."""
import dataclasses

import pytest

from harness import faults as F
from harness import plan as plan_module
from harness.controller.outcome import not_acted
from harness.core.protocol import WorkerError
from harness.core.tfconfig import ClusterShape, cluster_configs
from harness.diagnosis import diagnose
from harness.diagnosis.observations import Event, LinkProbe, RunObservation, WorkerObservation
from harness.diagnosis.story import ENDED_FIRST, NOT_REACHED
from harness.errors import FaultError, SettingError
from harness.validators import parse_cluster

SHAPE = ClusterShape(chief=1, worker=2, ps=1)
TASKS = SHAPE.tasks


def test_the_shape_orders_the_chief_the_workers_then_the_parameter_servers():
    assert TASKS == (("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0))
    assert SHAPE.total == 4 and SHAPE.coordinated and not SHAPE.workers_only
    assert [SHAPE.serves(i) for i in range(4)] == [False, True, True, True]
    assert [SHAPE.label(i) for i in range(4)] == ["chief", "worker 0", "worker 1", "ps 0"]
    assert SHAPE.spec() == "chief:1,worker:2,ps:1"
    assert not ClusterShape(chief=1, worker=2).serves(1)


def test_every_task_s_tf_config_lists_the_parameter_servers():
    configs = cluster_configs([1, 2, 3, 4], shape=SHAPE)
    assert configs[3] == {"cluster": {"chief": ["127.0.0.1:1"],
                                      "worker": ["127.0.0.1:2", "127.0.0.1:3"],
                                      "ps": ["127.0.0.1:4"]},
                          "task": {"type": "ps", "index": 0}}
    assert all(c["cluster"] == configs[0]["cluster"] for c in configs)


@pytest.mark.parametrize("value, message", [
    ("worker:2,ps:1", "has parameter servers but no chief"),
    ("chief:1,ps:1", "has no worker"),
    ("chief:1,worker:2,ps:1,evaluator:1", "no evaluator beside parameter servers"),
])
def test_a_shape_a_coordinator_cannot_run_is_one_setting_error(value, message):
    with pytest.raises(SettingError, match=message) as raised:
        parse_cluster(value, "--mwms-cluster", limit=16)
    assert str(raised.value).startswith("--mwms-cluster: ")
    assert parse_cluster("chief:1,worker:2,ps:2", limit=16) == ClusterShape(1, 2, 0, 2)


def test_faults_a_server_cannot_take_are_refused_naming_the_task():
    assert plan_module.validate([F.Crash(task=("ps", 0), step=3)], 4, shape=SHAPE)[0].worker == 3
    with pytest.raises(FaultError, match=r"ps 0 runs a server, none of the job's code, so a "
                                         r"Delay has nothing to act on"):
        plan_module.validate([F.Delay(task=("ps", 0), step=1, seconds=1)], 4, shape=SHAPE)
    for refused in (F.SkipStep(0, 2), F.Latency(task=("ps", 0), step=1, ms=50)):
        with pytest.raises(FaultError, match=r"acts in MultiWorkerMirroredStrategy clusters"):
            plan_module.validate([refused], 4, shape=SHAPE)
    with pytest.raises(FaultError, match=r"does not exist"):   # not an IndexError
        plan_module.validate([F.Crash(7, 1)], 4, shape=SHAPE)
    with pytest.raises(FaultError, match=r"a parameter server is task=\('ps', 0\)"):
        plan_module.validate([F.Crash(3, 2)], 4, shape=SHAPE)
    # The chief's own faults act at the functions it schedules.
    assert plan_module.validate([F.Delay(0, 2, seconds=1)], 4, shape=SHAPE)


# -- the verdict -------------------------------------------------------------

def _events(steps, extra=()):
    return (Event(0.0, "started"),) + tuple(Event(0.1 + s / 10, "step", step=s)
                                           for s in steps) + tuple(extra)


def serving(i, steps=range(10)):
    return WorkerObservation(i, events=_events(steps), exit_code=-9, exit_time=9.0,
                             killed_by_harness=True)


def dead(i, steps=range(5), t=2.0):
    return WorkerObservation(i, events=_events(steps), exit_code=-9, exit_time=t)


def chief_returned(extra=()):
    return WorkerObservation(0, events=_events(range(10), extra), returned=True, finish_time=5.0,
                             exit_code=0, exit_time=5.1)


def chief_raised(message, t=3.0):
    return WorkerObservation(0, events=_events(range(10)),
                             error=WorkerError("UnavailableError", message, ""),
                             finish_time=t, exit_code=1, exit_time=t + 0.1)


def chief_blocked():
    return WorkerObservation(0, events=_events(range(10)), exit_code=-9, exit_time=9.0,
                             killed_by_harness=True)


def run(*workers, ended_by="all_finished", shape=SHAPE):
    return RunObservation(num_workers=len(workers), timeout=10.0, grace=5.0, ended_by=ended_by,
                          duration=9.0, workers=tuple(workers), tasks=shape.tasks,
                          serving=tuple(i for i in range(shape.total) if shape.serves(i)))


PS_NAMED = "failed to connect: from /job:ps/replica:0/task:{}/device:CPU:0"


def test_a_completed_job_blames_no_one_and_says_what_the_coordinator_put_back():
    back = Event(3.0, "rescheduled", data={"task": "worker", "index": 1,
                                           "error": "UnavailableError"})
    v = diagnose(run(chief_returned([back]), serving(1), dead(2), serving(3)))
    assert (v.outcome, v.culprits, v.rule) == ("completed", (), "coordinator_completed")
    assert "worker 1 stopped serving and the job went on" in v.text.splitlines()[0]
    assert "put 1 function(s) of worker 1 back in its queue" in v.text
    quiet = diagnose(run(chief_returned(), serving(1), dead(2), serving(3)))
    assert "put back no function of worker 1" in quiet.text


def test_a_dead_parameter_server_is_the_culprit_of_the_coordinator_s_error():
    v = diagnose(run(chief_raised(PS_NAMED.format(0)), serving(1), serving(2), dead(3)))
    assert (v.outcome, v.culprits, v.ambiguous) == ("crashed", (3,), False)
    assert v.text.startswith("CRASHED: culprit: ps 0 (ps 0 stopped serving")


def test_of_two_servers_down_the_one_the_error_names_is_the_culprit_else_cannot_tell():
    SHAPE2 = ClusterShape(chief=1, worker=2, ps=2)
    two_ps = (serving(1), serving(2), dead(3, t=1.0), dead(4, t=1.5))
    named = diagnose(run(chief_raised(PS_NAMED.format(0)), *two_ps, shape=SHAPE2))
    assert (named.culprits, named.ambiguous) == ((3,), False)
    vague = diagnose(run(chief_raised("Socket closed"), *two_ps, shape=SHAPE2))
    assert (vague.culprits, vague.ambiguous) == ((3, 4), True)
    assert "cannot tell which server" in vague.text
    # A worker lost is absorbed: of a worker and a parameter server down, the
    # coordinator's vague error is the parameter server's.
    mixed = (serving(1), dead(2, t=1.0), dead(3, t=1.5), serving(4))
    v = diagnose(run(chief_raised("Socket closed"), *mixed, shape=SHAPE2))
    assert (v.culprits, v.ambiguous) == ((3,), False)
    # Only a worker lost: cannot tell the job's error from that loss.
    v = diagnose(run(chief_raised("Socket closed"), serving(1), dead(2), serving(3)))
    assert (v.culprits, v.ambiguous) == ((0, 2), True)


def test_an_error_with_every_server_serving_is_the_job_s_own():
    v = diagnose(run(chief_raised("Expects 1 arguments"), serving(1), serving(2), serving(3)))
    assert (v.outcome, v.culprits, v.rule) == ("failed", (0,), "coordinator_raised")
    # The job's function fails where it ran, and TensorFlow names that worker.
    own = dataclasses.replace(chief_raised("x"), error=WorkerError(
        "InvalidArgumentError", "Incompatible shapes [{{node add}} on "
        "/job:worker/replica:0/task:1/device:CPU:0]", ""))
    v = diagnose(run(own, serving(1), serving(2), serving(3)))
    assert (v.culprits, v.ambiguous) == ((0,), False)
    # A worker lost earlier (absorbed) is not the culprit of the job's own error.
    v = diagnose(run(own, dead(1), serving(2), serving(3)))
    assert (v.outcome, v.culprits, v.rule) == ("failed", (0,), "coordinator_raised")
    assert "naming none of worker 0, which stopped serving" in v.text


def test_a_coordinator_that_waits_names_the_one_server_down_else_every_candidate():
    stopped = dataclasses.replace(serving(3), stopped=True)
    one = diagnose(run(chief_blocked(), serving(1), serving(2), stopped, ended_by="hang"))
    assert (one.outcome, one.culprits, one.ambiguous) == ("hang", (3,), False)
    none = diagnose(run(chief_blocked(), serving(1), serving(2), serving(3), ended_by="hang"))
    assert (none.outcome, none.culprits, none.ambiguous) == ("hang", (0, 1, 2, 3), True)
    # A worker that died the coordinator goes on without: not the hang's culprit.
    absorbed = diagnose(run(chief_blocked(), serving(1), dead(2), serving(3), ended_by="hang"))
    assert (absorbed.culprits, absorbed.ambiguous) == ((0, 1, 2, 3), True)
    assert "worker 1 died, which the coordinator goes on without" in absorbed.text
    # A coordinator stopped for ever is its own hang.
    frozen = dataclasses.replace(chief_blocked(), stopped=True)
    v = diagnose(run(frozen, serving(1), dead(2), serving(3), ended_by="hang"))
    assert (v.culprits, v.ambiguous, v.rule) == ((0,), False, "coordinator_stopped")


def test_a_server_fault_is_unreached_when_the_coordinator_finished_first():
    fault = F.Crash(3, 50)
    done = run(chief_returned(), serving(1), serving(2), serving(3))
    assert [n.why for n in not_acted([fault], done.workers, done.serving)] == [NOT_REACHED]
    cut = run(chief_raised("x"), serving(1), serving(2), serving(3))
    assert [n.why for n in not_acted([fault], cut.workers, cut.serving)] == [ENDED_FIRST]


def _config():
    return {"cluster": {"chief": ["127.0.0.1:21000"], "worker": ["127.0.0.1:21001",
                                                                "127.0.0.1:21002"],
                        "ps": ["127.0.0.1:21003"]}, "task": {"type": "chief", "index": 0}}


def test_an_error_naming_a_server_the_harness_saw_serving_cannot_tell_it_from_the_job():
    chief = dataclasses.replace(chief_raised(
        "failed to connect to all addresses; last error: UNKNOWN: ipv4:10.77.0.4:21003: "
        "No route to host"), tf_config=_config())
    v = diagnose(run(chief, serving(1), serving(2), serving(3)))
    assert (v.outcome, v.culprits, v.ambiguous) == ("failed", (0, 3), True)
    assert "naming ps 0, which the harness saw serving" in v.text


def test_a_server_the_links_found_cut_off_is_down():
    def probe(source, target):
        cut = 3 in (source, target)
        return LinkProbe(source, target, "timed out" if cut else "connected", 900.0 if cut else 1.0)
    links = tuple(probe(s, t) for s in (None, 0, 1, 2, 3) for t in range(4) if s != t)
    chief = dataclasses.replace(chief_raised("No route to host ipv4:10.77.0.4:21003"),
                                tf_config=_config())
    obs = dataclasses.replace(run(chief, serving(1), serving(2), serving(3)), links=links)
    v = diagnose(obs)
    assert (v.outcome, v.culprits, v.ambiguous) == ("failed", (3,), False)
    assert "ps 0: cut off" in v.text


def test_the_coordinator_holds_where_a_fault_ends_a_worker_only():
    plan = plan_module.validate(
        [F.Crash(task=("worker", 1), step=5), F.Preempt(task=("worker", 0), step=2),
         F.Pause(task=("worker", 0), step=3), F.Crash(task=("ps", 0), step=4)],
        SHAPE.total, shape=SHAPE)
    assert plan_module.coordinator_holds(plan, SHAPE) == ((0, 2), (1, 5))


def test_a_hold_is_taken_once_at_the_first_function_of_its_step_or_later_on_its_worker():
    from harness.worker.coordinator import Holds
    holds = Holds([(1, 5)], ("127.0.0.1:1", "127.0.0.1:2"))
    assert not holds.due(0, 9) and not holds.due(1, 4)
    assert holds.due(1, 7) and not holds.due(1, 8)


def test_the_held_function_waits_until_its_worker_stops_listening():
    import socket
    import threading
    import time

    from harness.worker.coordinator import Holds, listening
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    address = f"127.0.0.1:{server.getsockname()[1]}"
    assert listening(address)
    threading.Timer(0.3, server.close).start()
    began = time.monotonic()
    Holds([(0, 0)], (address,), limit=10).wait(0, 0)
    assert 0.25 < time.monotonic() - began < 5 and not listening(address)


def test_a_worker_server_takes_each_step_up_to_the_latest_function_run_on_it(tmp_path,
                                                                             monkeypatch):
    """A parameter server takes the coordinator's steps; a worker, the
    steps up to each function run on it, once each, in order (a function
    put back and run again elsewhere takes no step twice)."""
    import types

    from harness.core import progress
    from harness.worker import servers
    path = str(tmp_path / "chief.progress")
    progress.create(path, capacity=64)
    writer = progress.Writer(path)
    for kind, number, detail in [(progress.STEP, 0, 0), (progress.RAN, 0, 0),
                                 (progress.STEP, 1, 0), (progress.RAN, 1, 1),
                                 (progress.RAN, 0, 1), (progress.STEP, 2, 0),
                                 (progress.RAN, 2, 1), (progress.STEP, 3, 0),
                                 (progress.RAN, 3, 0)]:
        writer.write(kind, number=number, detail=detail)

    def stop(_):   # ends the loop once it has read every record
        raise KeyboardInterrupt

    monkeypatch.setattr(servers, "time", types.SimpleNamespace(sleep=stop))

    def taken(worker):
        ctx, ended = types.SimpleNamespace(steps=[]), []
        ctx.step_boundary = ctx.steps.append
        servers.follow(ctx, path, ended.append, worker)
        assert len(ended) == 1 and isinstance(ended[0], KeyboardInterrupt)
        return ctx.steps

    assert taken(None) == [0, 1, 2, 3]
    assert taken(0) == [0, 1, 2, 3]
    assert taken(1) == [0, 1, 2]


def test_the_search_draws_a_parameter_server_cluster_s_faults_by_task_type():
    from harness.explore.space import Space
    space = Space(4, 20, ("Crash", "Pause"), interchangeable=False,
                  task_types=("chief", "worker", "worker", "ps"))
    assert space.roles() == ("the chief", "a worker", "a parameter server")
    assert [list(space.workers_of(r)) for r in space.roles()] == [[0], [1, 2], [3]]
    assert space.cell_of(F.Crash(3, 7)) == ("Crash", "a parameter server", 1)
    assert {p[0].worker for p in space.singles(("Crash", "a worker", 0))} == {1, 2}


def test_the_search_keeps_the_kinds_every_server_takes():
    from harness.explore import coordinated_kinds
    assert coordinated_kinds(("Crash", "RaiseError", "Delay", "Pause", "Preempt"), True,
                             SHAPE) == ("Crash", "RaiseError", "Pause", "Preempt")
    with pytest.raises(SettingError, match=r"explore\(kinds=\.\.\.\): 'Delay' acts on no server"):
        coordinated_kinds(("Crash", "Delay"), False, SHAPE)
    with pytest.raises(SettingError, match=r"none of the kinds SkipStep acts"):
        coordinated_kinds(("SkipStep",), True, SHAPE)
