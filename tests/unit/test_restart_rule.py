"""What no restart cures, without a process: the rule that keeps an attempt
from being restarted, the text that says why, and the multiprocessing
objects refused before any process starts."""
import multiprocessing
import pickle

import multiprocess
import pytest

from harness import faults as F
from harness.controller import combine_attempts
from harness.controller.outcome import certain_to_recur
from harness.controller.request import serialize_call
from harness.core import serialize
from harness.diagnosis import diagnose
from harness.diagnosis.render import not_restarted_text
from harness.errors import SerializationError
from harness.result import RunResult
from observations import died, raised, returned, run

pytestmark = pytest.mark.timeout(30)

UNPICKLED = "fn or its arguments could not be unpickled in this worker: RuntimeError: no"


def _before_fn(i, type_name="SerializationError", message=UNPICKLED):
    """Worker ``i`` raised before it reported STARTED: before fn ran."""
    return raised(i, 2, type_name, message, 0.5, events=())


def test_an_error_before_fn_ran_recurs_and_names_every_worker_that_raised_it():
    why = not_restarted_text(certain_to_recur(run(_before_fn(0), _before_fn(1)).workers))
    assert why == ("workers 0,1 raised SerializationError before fn ran, and a restart "
                   "brings the same fn, arguments and setup")


def test_any_error_before_fn_ran_recurs_beside_a_peer_that_died():
    """The harness's own set-up (joining the cluster's namespace) is the
    same in every attempt too."""
    obs = run(died(0, 2, -9, 1.0), _before_fn(1, "HarnessError", "could not join"))
    assert not_restarted_text(certain_to_recur(obs.workers)).startswith(
        "worker 1 raised HarnessError before fn ran")


def test_a_setting_error_recurs_wherever_fn_raised_it():
    obs = run(returned(0, 2), raised(1, 2, "SettingError", "run(...): bad", 1.0))
    assert not_restarted_text(certain_to_recur(obs.workers)) == (
        "worker 1 raised SettingError, which every attempt raises again")


@pytest.mark.parametrize("obs", [
    run(returned(0, 2), raised(1, 2, "RuntimeError", "fn's own error", 1.0)),
    run(returned(0, 2), raised(1, 2, "InjectedFault", "injected", 1.0)),
    run(returned(0, 2), raised(1, 2, "UnavailableError", "peer gone", 1.0)),
    run(returned(0, 2), died(1, 2, 1, 3.0)),
    run(died(0, 2, -9, 1.0, events=()), died(1, 2, -9, 1.0, events=())),
], ids=["fn-raised", "injected", "peer-gone", "crashed", "died-before-fn"])
def test_what_fn_did_or_a_death_may_go_otherwise_next_time(obs):
    assert certain_to_recur(obs.workers) is None


def _result(obs):
    return RunResult(workers=(), duration=obs.duration, observation=obs, verdict=diagnose(obs))


def test_the_result_says_why_it_was_not_restarted():
    only = _result(run(_before_fn(0), _before_fn(1)))
    why = certain_to_recur(only.observation.workers)
    r = combine_attempts([only], [F.Crash(1, 3, attempt=1)], 1.0, why)
    assert r.restarts == 0 and r.outcome == "failed"
    assert r.diagnosis.splitlines()[-1] == f"not restarted: {not_restarted_text(why)}"
    assert r.faults_never_acted[0][1] == (f"attempt 1 never ran: the run ended after attempt 0 "
                                          f"(failed), not restarted: {not_restarted_text(why)}")
    assert r.verdict.stages == ("attempt_never_ran", "not_restarted")


def test_a_run_that_simply_ended_says_nothing_of_restarts():
    only = _result(run(returned(0, 2), returned(1, 2)))
    assert "restarted" not in combine_attempts([only], [], 1.0).diagnosis


# -- refused before any process starts --------------------------------------------

@pytest.mark.parametrize("make, counterpart", [
    (lambda: multiprocessing.Event(), "'fork' context"),
    (lambda: multiprocessing.Lock(), "'fork' context"),
    (lambda: multiprocess.Semaphore(2), "'fork' context"),
    (lambda: multiprocessing.Barrier(2), "Manager().Barrier(n)"),
    (lambda: multiprocessing.Queue(), "Manager().Queue()"),
    (lambda: multiprocessing.Pipe()[0], "Manager().Queue()"),
    (lambda: multiprocessing.Value("i", 1), "Manager().Value"),
    (lambda: multiprocessing.RawArray("d", 3), "Manager().Value"),
    (lambda: multiprocess.RawArray("d", 3), "multiprocess.Manager().Value"),
    (lambda: multiprocess.RawValue("i", 1), "multiprocess.Manager().Value"),
], ids=["Event", "Lock", "multiprocess-Semaphore", "Barrier", "Queue", "Pipe", "Value",
        "RawArray", "multiprocess-RawArray", "multiprocess-RawValue"])
def test_what_only_an_inheriting_child_could_use_is_refused_naming_what_works(make,
                                                                             counterpart):
    """These are the default (fork) context's: they start no process."""
    obj = make()
    with pytest.raises(SerializationError, match="cannot serialize") as refused:
        serialize_call(lambda o: None, (obj,), None)
    assert counterpart in str(refused.value)


def test_the_workers_payload_carries_the_parents_authkeys():
    payload = serialize.dumps((len, ("abc",), {}))
    data = serialize.with_authkeys(payload)
    keys, inner = pickle.loads(data)
    assert inner == payload
    assert keys["multiprocessing"] == bytes(multiprocessing.current_process().authkey)
    assert keys["multiprocess"] == bytes(multiprocess.current_process().authkey)
    fn, args, kwargs = serialize.load_call(data)
    assert fn(*args, **kwargs) == 3
