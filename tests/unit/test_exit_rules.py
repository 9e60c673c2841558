"""The rules of how a worker's process ends (issue 24, items 4 and 5), on
hand-built observations, no TensorFlow: ``left_early`` (a worker that
returned and left while the others still needed it in a collective) and
``died_at_exit`` (every worker returned; one's process then died).  The
same on real workers: tests/test_scripts.py, tests/test_cli.py and
scenarios/test_finish.py."""
from __future__ import annotations

import dataclasses

import pytest

from harness.diagnosis import Story, conclude
from harness.diagnosis.story import NOT_REACHED, NotActed
from harness.diagnosis import diagnose
from harness.diagnosis import rules as R
from harness.diagnosis.facts import facts_of
from harness.diagnosis.observations import Outcome

from observations import UNHEALTHY, blocked, raised, returned, run, with_ledger

RESET = ("Collective ops is aborted by: recvmsg:Connection reset by peer\nAdditional GRPC "
         "error information from remote target /job:worker/replica:0/task:1")


def left(i: int, n: int, calls: int = 9, exit_time: float = 2.1) -> object:
    """A worker that ran ``calls`` calls of `step`, returned at 2.0 and whose
    process ended at ``exit_time``."""
    w = with_ledger(returned(i, n, steps=range(calls)))
    return dataclasses.replace(w, exit_time=exit_time)


def failed_in(i: int, n: int, calls: int = 10, t: float = 12.0, message: str = "",
              recorded: bool = True) -> object:
    """A worker that raised UnavailableError at ``t`` in its call ``calls``
    of `step`; ``recorded=False``: the ledger missed that call's start (an
    abort at once can beat its marker), so its last recorded call ended."""
    w = with_ledger(raised(i, n, "UnavailableError", message or UNHEALTHY.format(1), t,
                           steps=range(calls if recorded else calls - 1)))
    if recorded:
        last = dataclasses.replace(w.calls[-1], raised=True)
        w = dataclasses.replace(w, calls=w.calls[:-1] + (last,))
    return w


@pytest.mark.parametrize("recorded", [True, False])
def test_the_worker_that_left_is_named_and_those_that_failed_are_not(recorded):
    obs = run(failed_in(0, 2, recorded=recorded, message=RESET if not recorded else ""),
              left(1, 2))
    v = diagnose(obs)
    assert (v.outcome, v.rule, v.culprits, v.ambiguous) == ("failed", "left_early", (1,), False)
    assert v.text.startswith(
        "FAILED: worker 1 returned and its process ended after 9 calls of `step`; worker 0 "
        "then failed in call 10 with UnavailableError; culprit: worker 1 (it left while they "
        "still needed it in a collective; with 2 workers one call more on worker 0 would look "
        "the same)"), v.text


@pytest.mark.parametrize("n", [3, 4])
def test_from_three_workers_the_one_that_left_is_named_without_a_doubt(n):
    obs = run(*(left(i, n) if i == 1 else failed_in(i, n, t=2.5 + i) for i in range(n)))
    v = diagnose(obs)
    assert (v.rule, v.culprits, v.ambiguous) == ("left_early", (1,), False)
    assert "would look the same" not in v.text
    stayed = ",".join(str(i) for i in range(n) if i != 1)
    assert f"workers {stayed} then failed in call 10 with UnavailableError" in v.text


def cut_in_call(number: int, t: float = 2.15, began: float = 1.9) -> object:
    """Worker 0, raising at ``t`` in its call ``number`` of `step`, begun at ``began``."""
    w = failed_in(0, 2, calls=number, t=t, message=RESET)
    last = dataclasses.replace(w.calls[-1], began=began, ended=t)
    return dataclasses.replace(w, calls=w.calls[:-1] + (last,))


def test_a_peer_cut_off_in_a_call_the_leaver_made_too_names_the_leaver():
    """TensorFlow 2.21, recorded (tests/test_scripts.py's script whose
    worker 1 ends a call early, 2 runs in about 280 beside 3-5 others on 2 cores):
    worker 1 returned after its last call and its process ended while
    worker 0 still read that call's data from it; worker 0 raised in that
    call, one both made, not in the next."""
    v = diagnose(run(cut_in_call(9), left(1, 2)))
    assert (v.rule, v.culprits, v.ambiguous) == ("left_early", (1,), False)
    assert ("worker 0 then failed in call 9 with UnavailableError; culprit: worker 1 (its "
            "process ended while they still read its data of call 9, which it had made "
            "too)") in v.text, v.text


def test_a_peer_cut_off_before_the_leavers_exit_was_seen_names_the_leaver_too():
    """Recorded the same way: worker 0 raised "Socket closed" in a call both
    made after worker 1 returned (2.0) and before the parent saw its
    process end (2.1); its sockets close on the way out."""
    v = diagnose(run(cut_in_call(9, began=1.0, t=2.05), left(1, 2)))
    assert (v.rule, v.culprits, v.ambiguous) == ("left_early", (1,), False)


def test_a_peer_that_failed_in_a_call_the_leaver_made_before_it_returned_is_not_explained():
    assert blame_of(run(cut_in_call(9, began=1.0, t=1.9), left(1, 2))) is None


def test_workers_still_waiting_for_the_one_that_left_are_said_to_wait():
    obs = run(with_ledger(blocked(0, 2), blocked=True), left(1, 2), ended_by="hang")
    v = diagnose(obs)
    assert (v.outcome, v.rule, v.culprits) == ("hang", "left_early", (1,))
    assert "worker 0 then waited in call 10" in v.text


def test_a_worker_that_stayed_until_the_run_was_decided_did_not_leave():
    # on_return="stay": its process ends at teardown, after the run's end
    obs = run(failed_in(0, 3), left(1, 3, exit_time=21.5), failed_in(2, 3))
    assert blame_of(obs) is None
    assert diagnose(obs).rule != "left_early"


def test_a_script_that_exited_is_known_to_have_left_however_late_its_exit_was_seen():
    # on_return="exit": the worker ends its process once it returned; the
    # parent may see that exit only after the peers' errors ended the run.
    obs = dataclasses.replace(run(failed_in(0, 2, t=2.2, message=RESET, recorded=False),
                                  left(1, 2, exit_time=21.5)), exit_on_return=True)
    v = diagnose(obs)
    assert (v.rule, v.culprits) == ("left_early", (1,))


def test_when_most_workers_left_the_ones_that_stayed_are_for_the_majority_rules():
    obs = run(failed_in(0, 3, calls=11), left(1, 3, calls=10), left(2, 3, calls=10))
    assert blame_of(obs) is None


def test_a_peer_that_failed_before_any_worker_left_is_not_explained_by_it():
    obs = run(failed_in(0, 2, t=1.0), left(1, 2))
    assert blame_of(obs) is None


def test_the_per_step_counts_outrank_it_when_they_name_the_other_worker():
    # Worker 0 made an extra all-reduce in step 5; worker 1 did all it
    # should, returned and left.  The ledger's counts name worker 0.
    extra = with_ledger(blocked(0, 2), {s: (2 if s == 5 else 1) for s in range(10)},
                        blocked=True)
    obs = run(extra, dataclasses.replace(with_ledger(returned(1, 2)), exit_time=2.1),
              ended_by="hang")
    assert blame_of(obs) is None
    v = diagnose(obs)
    assert (v.rule, v.culprits) == ("collective_counts", (0,))


def test_without_a_ledger_it_says_steps():
    obs = run(raised(0, 2, "UnavailableError", UNHEALTHY.format(1), 12.0, steps=range(10)),
              dataclasses.replace(returned(1, 2, steps=range(9))), )
    v = diagnose(obs)
    assert (v.rule, v.culprits) == ("left_early", (1,))
    assert v.text.startswith("FAILED: worker 1 returned and its process ended after 9 steps; "
                             "worker 0 then failed at step 9 with UnavailableError"), v.text


def blame_of(obs):
    return R.left_early(facts_of(obs))


# ------------------------------------------------------------ died at exit

def test_every_worker_returned_and_one_died_at_exit():
    obs = run(dataclasses.replace(returned(0, 3), exit_code=-6, exit_time=2.3),
              returned(1, 3), returned(2, 3))
    v = diagnose(obs)
    assert (v.outcome, v.rule, v.culprits, v.ambiguous) == (
        Outcome.CRASHED_AT_EXIT, "died_at_exit", (0,), False)
    assert v.outcome == "crashed_at_exit"
    assert v.text.splitlines()[0] == (
        "CRASHED_AT_EXIT: training completed (all 3 workers returned their values), then "
        "worker 0 died at exit (exit code -6, SIGABRT) 0.3s after it returned: a cluster "
        "manager sees the job fail; culprit: worker 0")
    assert "worker 0: returned, then died at exit (exit code -6, SIGABRT)" in v.text


@pytest.mark.parametrize("code, killed, outcome", [
    (3, False, "crashed_at_exit"),    # os._exit(3) in an atexit handler
    (0, False, "completed"),
    (-9, True, "completed"),          # the harness ended it once the run was decided
])
def test_what_counts_as_a_death_at_exit(code, killed, outcome):
    obs = run(dataclasses.replace(returned(0, 2), exit_code=code, killed_by_harness=killed),
              returned(1, 2))
    assert diagnose(obs).outcome == outcome


def test_a_death_during_training_outranks_one_at_exit():
    obs = run(dataclasses.replace(returned(0, 2), exit_code=-6),
              raised(1, 2, "ValueError", "bad batch", 1.0))
    assert diagnose(obs).outcome == "failed"


def test_a_fault_that_never_acted_fails_a_run_that_crashed_only_at_exit():
    obs = run(dataclasses.replace(returned(0, 2), exit_code=-6), returned(1, 2))
    never = NotActed("Crash(worker=1, step=50)", 1, NOT_REACHED, 50, last_step=9)
    v = conclude(diagnose(obs), obs, Story(not_acted=(never,)))
    assert diagnose(obs).outcome == Outcome.CRASHED_AT_EXIT and v.outcome == Outcome.FAILED
    assert v.text.startswith("FAILED: Crash(worker=1, step=50) never acted: worker 1 never "
                             "reached step 50: its last step was 9")


def test_the_log_tail_of_a_worker_that_died_at_exit_is_shown():
    from harness.report.pytest_report import report_sections
    from harness.result import RunResult, WorkerResult
    obs = run(dataclasses.replace(returned(0, 2), exit_code=-6), returned(1, 2))
    v = diagnose(obs)
    workers = tuple(WorkerResult(w.index, exit_code=w.exit_code, log=f"log of {w.index}\n"
                                 "Fatal Python error: Aborted" if w.index == 0 else "ok",
                                 observation=w) for w in obs.workers)
    result = RunResult(workers, 1.0, obs, v)
    assert workers[0].died_at_exit and not workers[1].died_at_exit
    assert "--- worker 0 (exit code -6)" in result.report()
    assert "--- worker 1" not in result.report()
    titles = [t for t, _ in report_sections([result], {})]
    assert titles == ["mwms run: crashed_at_exit", "mwms run: worker 0 log tail (exit code -6)"]
