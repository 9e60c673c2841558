"""restart_policy="task" without TensorFlow: the option, the policy table,
which end of a worker a restart follows, and the story the result tells."""
import dataclasses
import types

import pytest

from harness import faults as F
from harness.controller.outcome import attempt_story, judge, with_task_history
from harness.controller.request import make_request
from harness.controller.restarts import (ECHO_WINDOW, POLICIES, TOGETHER_PER_FAILURE,
                                         TaskRestarter, check_restart_on, incarnation_plan,
                                         task_outcome)
from harness.diagnosis.echoes import telling_line
from harness.diagnosis.observations import Outcome
from harness.diagnosis.render import not_restarted_text, task_story
from harness.diagnosis.stages import restart_order
from harness.diagnosis.story import USED_UP, NotRestarted
from harness.errors import SettingError
from harness.result import RunResult, WorkerResult
from harness.settings import OPTION, RunSettings, parse_marker, read_settings
from harness.validators import parse_restart_policy
from observations import died, raised, returned, run

pytestmark = pytest.mark.timeout(30)

INCARNATION = ("Collective ops is aborted by: Error reported from /job:worker/task:1: "
               "/job:worker/replica:0/task:1 unexpectedly tried to connect with a different "
               "incarnation. It has likely restarted.")


def test_the_option_is_one_row_with_its_places_and_a_validator_naming_them():
    option = OPTION["restart-policy"]
    assert (option.flag, option.ini, option.default, option.marker) == (
        "--mwms-restart-policy", "mwms_restart_policy", "cluster", True)
    assert parse_restart_policy(" Task ") == "task"
    with pytest.raises(SettingError, match=r"--mwms-restart-policy: 'pod' is not one of "
                                           r"cluster, task"):
        parse_restart_policy("pod")
    assert parse_marker({"restart_policy": "task"}) == {"restart_policy": "task"}
    with pytest.raises(SettingError, match=r"@pytest.mark.mwms\(restart_policy=...\)"):
        parse_marker({"restart_policy": 1})
    settings = read_settings(lambda o: ("task" if o.name == "restart-policy" else o.default,
                                        "cli"))
    assert settings.restart_policy == "task"
    with pytest.raises(SettingError, match="--restart-policy"):
        read_settings(lambda o: ("x" if o.name == "restart-policy" else o.default, "cli"))


def test_run_takes_the_policy_and_refuses_a_hang_it_cannot_restart():
    req = make_request(RunSettings(), "forkserver", len, restarts=2, restart_policy="task")
    assert (req.settings.restart_policy, req.settings.restarts) == ("task", 2)
    assert make_request(RunSettings(), "forkserver", len).settings.restart_policy == "cluster"
    with pytest.raises(SettingError, match=r"run\(restart_policy=...\): 'all'"):
        make_request(RunSettings(), "forkserver", len, restart_policy="all")
    with pytest.raises(SettingError, match=r"run\(restart_on=...\): hang cannot restart one task"):
        make_request(RunSettings(), "forkserver", len, restart_policy="task",
                     restart_on="crash,hang")
    check_restart_on("cluster", frozenset({Outcome.HANG}))


def test_the_policy_table_says_how_many_attempts_and_task_restarts():
    cluster, task = POLICIES["cluster"], POLICIES["task"]
    assert (cluster.cluster_attempts(3), cluster.task_restarts(3)) == (4, 0)
    assert (task.cluster_attempts(3), task.task_restarts(3)) == (1, 3)


def test_a_worker_that_raised_or_died_is_restartable_one_that_returned_or_was_killed_not():
    assert task_outcome(raised(0, 2, "ValueError", "x", 1.0)) == Outcome.FAILED
    assert task_outcome(died(0, 2, -9, 1.0)) == Outcome.CRASHED
    assert task_outcome(died(0, 2, 0, 1.0)) == Outcome.CRASHED      # exit 0 without returning
    assert task_outcome(returned(0, 2)) is None
    killed = dataclasses.replace(died(0, 2, -9, 1.0), killed_by_harness=True)
    assert task_outcome(killed) is None


def _tracked(obs):
    return types.SimpleNamespace(seen=obs, events=list(obs.events), index=obs.index)


def test_the_restarter_counts_per_worker_and_says_why_not():
    r = TaskRestarter(2, 1, frozenset({Outcome.CRASHED}), start=None, result_of=None)
    assert r.wants(_tracked(died(1, 2, 1, 1.0)))
    assert not r.wants(_tracked(raised(1, 2, "ValueError", "x", 1.0)))   # fail not asked for
    r.left[1] = 0
    assert not r.wants(_tracked(died(1, 2, 1, 1.0)))
    assert r.not_restarted == {1: NotRestarted(USED_UP, (1,), restarts=1)}
    assert not_restarted_text(r.not_restarted[1]) == "worker 1 used its 1 restart"
    # an error raised before fn ran comes back in every process
    r2 = TaskRestarter(2, 3, frozenset({Outcome.FAILED}), start=None, result_of=None)
    early = dataclasses.replace(raised(0, 2, "SerializationError", "x", 1.0), events=())
    assert not r2.wants(_tracked(early)) and "before fn ran" in not_restarted_text(
        r2.not_restarted[0])


class _Handle:
    exitcode = 1

    def join(self, timeout=None):
        pass

    def kill_tree(self, known=()):
        pass

    def close(self):
        pass


def _ended_worker(obs):
    return types.SimpleNamespace(seen=obs, events=list(obs.events), index=obs.index,
                                 handle=_Handle(), note=lambda **changes: None)


def test_an_echo_soon_after_a_tasks_restart_restarts_every_task_using_none_of_theirs():
    started = []
    r = TaskRestarter(3, 1, frozenset({Outcome.CRASHED, Outcome.FAILED}),
                      start=lambda i, k: started.append((i, k)), result_of=lambda w, k: k)
    echo = _ended_worker(raised(2, 8, "tensorflow.AbortedError", INCARNATION, 1.0))
    assert not r.echoes(echo, 100.0)            # no task restarted yet: no failure to echo
    r.restart(_ended_worker(died(1, 8, 1, 1.0)), 100.0)
    assert r.left == [1, 0, 1] and started == [(1, 1)]
    own = _ended_worker(raised(0, 8, "ValueError", "bad batch", 1.0))
    assert not r.echoes(own, 101.0)             # an error of its own is no echo
    assert all(r.echoes(echo, 101.0) for _ in range(TOGETHER_PER_FAILURE))
    assert not r.echoes(echo, 101.0)            # the echoes of one failure restart so often
    r.restart(echo, 101.0, asked=True)
    assert r.left == [1, 0, 1]                  # an echo's restart uses none of its own
    late = TaskRestarter(3, 1, frozenset({Outcome.CRASHED}), start=lambda i, k: None,
                         result_of=lambda w, k: k)
    late.restart(_ended_worker(died(1, 8, 1, 1.0)), 100.0)
    assert not late.echoes(echo, 100.0 + ECHO_WINDOW + 1)
    assert late.echoes(echo, 100.0 + ECHO_WINDOW)


def test_the_story_tells_the_echoes_restarted_with_every_task_and_counts_one_restart():
    crash = died(1, 8, 1, 2.0, steps=range(9))
    echo = raised(2, 8, "tensorflow.UnavailableError",
                  "Collective ops is aborted by: Socket closed", 2.1, steps=range(8))
    stopped = dataclasses.replace(died(0, 8, -9, 2.1, steps=range(8)), killed_by_harness=True)
    again = dataclasses.replace(died(1, 0, -9, 2.1), killed_by_harness=True)
    last = run(returned(0, 10), returned(1, 10), returned(2, 10))
    result = _result(last, history={0: [_ended(stopped)], 1: [_ended(crash), _ended(again, 1)],
                                    2: [_ended(echo)]})
    assert result.outcome == Outcome.COMPLETED
    assert result.diagnosis.startswith(
        "COMPLETED after 1 task restart: worker 1 crashed at step 8 (exit code 1) and was "
        "restarted; then the echoes of that failure (every task restarted together): worker 2 "
        "failed at step 7 with UnavailableError: Collective ops is aborted by: Socket closed; "
        "then:\nCOMPLETED"), result.diagnosis


def test_a_faults_attempt_is_its_workers_restart_count():
    plan = (F.Crash(1, 3), F.Crash(1, 2, attempt=1), F.Crash(0, 1, attempt=1))
    assert incarnation_plan(plan, [0, 1]) == (F.Crash(1, 2, attempt=1),)
    assert incarnation_plan(plan, [1, 0]) == (F.Crash(1, 3), F.Crash(0, 1, attempt=1))


def _ended(obs, attempt=0):
    return WorkerResult(index=obs.index, exception=obs.error, exit_code=obs.exit_code,
                        last_step=obs.last_step, observation=obs, attempt=attempt)


def _result(obs_run, plan=(), history=None, not_restarted=None, whole_plan=()):
    story = attempt_story(obs_run, plan, history, not_restarted or {}, whole_plan)
    workers = tuple(WorkerResult(index=w.index, exception=w.error, exit_code=w.exit_code,
                                 last_step=w.last_step, observation=w) for w in obs_run.workers)
    if history is not None:
        workers = with_task_history(workers, history)
    return RunResult(workers, 1.0, obs_run, judge(obs_run, story))


def test_the_story_puts_the_cause_before_the_echoes_whatever_the_order_heard():
    crash = _ended(died(1, 3, 1, 2.0, steps=range(4)))
    echo = _ended(raised(2, 3, "tensorflow.UnavailableError",
                         "Graph execution error:\n\nCollective ops is aborted by: "
                         "recvmsg:Connection reset by peer", 1.9))
    order = restart_order([echo.observation, crash.observation])
    assert [w.index for w in order] == [1, 2]
    assert task_story(order) == ("worker 1 crashed at step 3 (exit code 1) and was restarted; then "
                                 "the echoes of that failure (each restarted): worker 2 failed at "
                                 "step 3 with UnavailableError: Collective ops is aborted by: "
                                 "recvmsg:Connection reset by peer")
    assert telling_line("Graph execution error:\n\nDetected at node x\n" + INCARNATION) == \
        INCARNATION
    assert telling_line("{{function_node __wrapped__CollectiveReduceV2_device_/job:worker/"
                        "replica:0/task:0/device:CPU:0}} " + INCARNATION) == INCARNATION


def test_a_run_that_fails_after_a_restart_is_blamed_on_the_task_restarted_first():
    last = run(raised(0, 2, "tensorflow.AbortedError", INCARNATION, 3.0),
               returned(1, 2, steps=()))
    crash = _ended(died(1, 2, 1, 1.0, steps=range(9)))
    result = _result(last, history={0: [], 1: [crash]},
                     not_restarted={0: NotRestarted(USED_UP, (0,), restarts=0)})
    assert result.outcome == Outcome.FAILED and result.culprits == (1,)
    assert (result.verdict.culprits, result.verdict.step, result.verdict.ambiguous) == \
        ((1,), 8, False)
    assert result.diagnosis.startswith("FAILED after 1 task restart: worker 1 crashed at step 8 "
                                       "(exit code 1) and was restarted; then:\nFAILED")
    assert result.diagnosis.endswith("\nworker 0 not restarted: worker 0 used its 0 restarts")
    assert result.verdict.stages == ("task_restarts", "task_restart")
    assert [len(w.attempts) for w in result.workers] == [1, 2]
    assert result.workers[1].attempts[0] is crash and result.workers[1].restarts == 1


def test_an_error_of_its_own_after_the_restart_keeps_its_culprit():
    """The cluster recovered from worker 1's crash; then worker 2's own bug
    failed the run: worker 2 is the culprit, not the task restarted first."""
    last = run(returned(0, 3, steps=range(4)), returned(1, 3, steps=range(4)),
               raised(2, 3, "ValueError", "bad batch", 3.0, steps=range(3)))
    judged = _result(last)
    assert judged.culprits == (2,) and not judged.verdict.ambiguous
    crash = _ended(died(1, 3, 1, 1.0, steps=range(2)))
    result = _result(last, history={0: [], 1: [crash], 2: []})
    assert result.outcome == Outcome.FAILED and result.culprits == (2,)
    assert result.diagnosis.startswith("FAILED after 1 task restart: worker 1 crashed")


def test_without_a_restart_the_result_is_the_attempts_and_a_fault_never_reached_fails():
    done = run(returned(0, 2), returned(1, 2))
    plain = _result(done, history={0: [], 1: []})
    assert plain.outcome == Outcome.COMPLETED and plain.diagnosis == _result(done).diagnosis
    assert [w.restarts for w in plain.workers] == [0, 0]
    unreached = _result(done, history={0: [], 1: []}, whole_plan=(F.Crash(1, 2, attempt=1),))
    assert unreached.outcome == Outcome.FAILED
    assert "attempt 1 never ran" in unreached.diagnosis


class _ClosingHandle:
    """A process handle that, as ``multiprocess``'s, refuses a join once closed."""

    def __init__(self, exitcode):
        self.exitcode = exitcode
        self.closed = False

    def join(self, timeout=None):
        if self.closed:
            raise ValueError("process object is closed")

    def kill_tree(self, known=()):
        pass

    def close(self):
        self.closed = True


def _live_worker(index, exitcode=None):
    w = types.SimpleNamespace(index=index, handle=_ClosingHandle(exitcode), channel_open=True,
                              finished=False, serves=False,
                              seen=types.SimpleNamespace(exit_code=None, error=None))
    w.note = lambda **changes: w.seen.__dict__.update(
        {k: v for k, v in changes.items() if k in ("exit_code", "error")})
    return w


class _Restarter:
    def __init__(self):
        self.restarted = []

    def wants(self, worker):
        return True

    def echoes(self, worker, now):
        return False

    def restart(self, worker, now, asked=False):
        worker.handle.join(0)   # as TaskRestarter.restart does
        worker.handle.close()
        self.restarted.append(worker.index)
        return _live_worker(worker.index)


def test_a_worker_its_own_messages_restarted_is_not_restarted_again_as_its_exit_is_collected():
    """Collecting a worker's exit takes in its last messages first; where
    one of them (its RAISED) has restarted it, the exit collected is of a
    process already replaced: restarting it again joined a closed process
    (``ValueError: process object is closed``, a CI run at 4 workers)."""
    from harness.controller.watch import WatchLoop
    workers = [_live_worker(0), _live_worker(1, exitcode=1)]
    restarter = _Restarter()
    loop = WatchLoop(workers, RunSettings(), 0.0, restarter=restarter)
    ended = workers[1]

    def drain(worker, now):
        if worker is ended and ended in loop.workers:
            loop._restart(worker, now)   # what its RAISED message set off
    loop._drain = drain
    loop._collect_exit(ended, 1.0)
    loop._collect_exits(1.0, but=workers[0])
    assert restarter.restarted == [1]
    assert loop.workers[1] is not ended and not loop.workers[1].handle.closed
