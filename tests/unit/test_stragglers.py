"""Stragglers from the ledger's call times (:mod:`harness.diagnosis.stragglers`),
on hand-made runs: each worker's calls of `step` simulated from its own
work between calls, the collective's time, and when the collective
releases each worker.  No process, no TensorFlow."""
from __future__ import annotations

import dataclasses
import random
import re

import pytest

from harness.diagnosis import diagnose
from harness.diagnosis.observations import Call, TracedFunction
from harness.diagnosis.stragglers import MIN_CALLS, slow_collectives, straggler_lines, stragglers
from harness.errors import SettingError
from harness.result import RunResult
from harness.report import timeline
from observations import ALL_REDUCE, returned, run

pytestmark = pytest.mark.timeout(60)


def simulated(n, calls=20, work=lambda i, k: 0.010, collective=lambda k: 0.008,
              release=lambda i, k: 0.0, traced=4.0):
    """A completed ``n``-worker run: worker i works ``work(i, k)`` seconds
    before call k of `step`; the call ends ``collective(k)`` after the last
    worker arrived, plus ``release(i, k)`` on worker i (a slow link delays
    some).  Call 1 (the trace) takes ``traced`` seconds."""
    ends = [0.5] * n
    per_worker = [[] for _ in range(n)]
    for k in range(1, calls + 1):
        began = [ends[i] + work(i, k) for i in range(n)]
        done = max(began) + (traced if k == 1 else collective(k))
        for i in range(n):
            ends[i] = done + release(i, k)
            per_worker[i].append(Call(0, k, k - 1, began[i], ends[i]))
    ws = [dataclasses.replace(returned(i, n, steps=range(calls), t=ends[i] + 0.01),
                              functions=(TracedFunction(0, "step", (ALL_REDUCE,)),),
                              calls=tuple(per_worker[i]), ledger="calls")
          for i in range(n)]
    return run(*ws)


def result_of(obs):
    v = diagnose(obs)
    return RunResult(workers=(), duration=obs.duration, observation=obs, verdict=v)


def sleeper(last, seconds=0.030):
    """Worker ``last`` does ``seconds`` more work before every call (the
    scenario's 30 ms sleep), the others a noisy 10 ms."""
    rng = random.Random(last)
    return lambda i, k: 0.010 + rng.uniform(0, 0.002) + (seconds if i == last else 0.0)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_worker_with_30_ms_of_its_own_work_is_named(n):
    obs = simulated(n, work=sleeper(n - 1))
    report = stragglers(obs)
    assert report.stragglers == (n - 1,)
    a = report.arrival(n - 1)
    assert a.last_share == 1.0 and 0.027 < a.lag < 0.033 and a.own > 0.027
    # The others wait about 30 ms of a ~48 ms step (work + sleep + collective).
    assert 0.5 < a.others_wait < 0.7
    (line,) = straggler_lines(obs)
    assert re.fullmatch(f"straggler: worker {n - 1} arrived last at 100% of `step` calls, "
                        r"(28|29|30|31) ms after the others on median; the others spent "
                        r"(5\d|6\d)% of each step waiting", line), line
    assert line in diagnose(obs).text.splitlines()


@pytest.mark.parametrize("seed", range(20))
def test_a_noisy_balanced_two_worker_run_names_none(seed):
    """Each worker last at about half the calls, by a few ms of noise."""
    rng = random.Random(seed)
    obs = simulated(2, work=lambda i, k: 0.008 + rng.uniform(0, 0.005),
                    release=lambda i, k: rng.uniform(0, 0.002))
    report = stragglers(obs)
    assert report.stragglers == () and report.enough
    assert straggler_lines(obs) == []


def test_a_chief_a_little_late_at_every_call_names_none():
    """The chief's own bookkeeping, 1 ms a step: last at every call, but
    by too little to matter; and it is its own work, not the link's, so
    nothing is said."""
    obs = simulated(3, work=lambda i, k: 0.010 + (0.001 if i == 0 else 0.0))
    report = stragglers(obs)
    assert report.arrival(0).last_share == 1.0 and report.stragglers == ()
    assert straggler_lines(obs) == []


def test_a_late_release_by_a_slow_link_names_none_and_says_so():
    """``Latency`` at 2 workers, as measured: the all-reduce takes ~180 ms
    and releases worker 0 ~21 ms after worker 1, so worker 0 arrives last
    at every call, 21 ms late, by no work of its own."""
    obs = simulated(2, work=lambda i, k: 0.002, collective=lambda k: 0.160,
                    release=lambda i, k: 0.021 if i == 0 else 0.0)
    report = stragglers(obs)
    a = report.arrival(0)
    assert a.last_share == 1.0 and 0.020 < a.lag < 0.022 and abs(a.own) < 0.001
    assert report.stragglers == ()
    (line,) = straggler_lines(obs)
    assert line.startswith("stragglers: none; every worker waited alike, median ")
    assert line.endswith(": a slow link or collective, not a slow worker (worker 0 arrives "
                         "last at 100% of calls, 21 ms late, as the previous call releases "
                         "it later)")


def test_a_slow_collective_on_every_worker_alike_names_none():
    """Every worker waits alike in a slow all-reduce: no one arrives late."""
    rng = random.Random(1)
    obs = simulated(4, work=lambda i, k: 0.002 + rng.uniform(0, 0.001),
                    collective=lambda k: 0.200)
    assert stragglers(obs).stragglers == () and straggler_lines(obs) == []


def test_too_few_calls_tell_nothing():
    obs = simulated(3, calls=MIN_CALLS, work=sleeper(2))   # MIN_CALLS - 1 read: call 1 is left out
    report = stragglers(obs)
    assert report.calls == MIN_CALLS - 1 and not report.enough
    assert report.stragglers == () and straggler_lines(obs) == []


def test_the_traced_first_call_is_left_out():
    """Call 1 (the trace) can start seconds apart: it is no evidence."""
    obs = simulated(2, work=lambda i, k: (0.3 if (i == 1 and k == 1) else 0.010))
    report = stragglers(obs)
    assert report.calls == 19 and report.stragglers == ()


def test_a_run_without_a_ledger_reports_nothing():
    obs = run(returned(0, 2), returned(1, 2))
    report = stragglers(obs)
    assert (report.calls, report.stragglers) == (0, ())
    assert straggler_lines(obs) == []


def test_result_stragglers_and_assert_no_straggler():
    r = result_of(simulated(3, work=sleeper(2)))
    assert r.stragglers == (2,)
    with pytest.raises(AssertionError) as e:
        r.assert_no_straggler()
    text = str(e.value)
    assert text.startswith("COMPLETED: all 3 workers returned")   # the diagnosis first
    assert "straggler: worker 2 arrived last" in text
    assert text.splitlines()[-1].startswith("expected no straggler; the others wait ")
    assert text.endswith("for worker 2")
    assert r.assert_no_straggler(max_wait=1.0) is r
    with pytest.raises(AssertionError, match="expected the others to wait at most 10% of each "
                                             "step for a straggler; the others wait"):
        r.assert_no_straggler(max_wait=0.1)
    balanced = result_of(simulated(3))
    assert balanced.stragglers == () and balanced.assert_no_straggler() is balanced


@pytest.mark.parametrize("bad", [0, -0.5, 1.5, "0.5", True, float("nan")])
def test_max_wait_is_validated(bad):
    r = result_of(simulated(2))
    with pytest.raises(SettingError, match=r"assert_no_straggler\(max_wait=\.\.\.\): must be a "
                                           r"number in \(0, 1\]"):
        r.assert_no_straggler(max_wait=bad)


def test_the_timeline_shows_each_workers_wait():
    r = result_of(simulated(3, work=sleeper(2)))
    (p,) = timeline.panels_of(r)
    waits = {ln.worker: ln.waits for ln in p.lanes}
    assert waits[2] == () and len(waits[0]) == len(waits[1]) == 19   # the straggler waits for no one
    assert all(0.027 < s.end - s.start < 0.033 for s in waits[0])
    labels = {ln.worker: ln.wait_label for ln in p.lanes}
    assert labels[2].startswith("straggler: last 100%")
    assert labels[0].startswith("waited ") and "of its time in calls" in labels[0]
    svg = timeline.svg([p])
    assert svg.count('class="wait"') == 38 and "straggler: last 100%" in svg


def test_a_run_whose_worker_did_not_return_reports_nothing():
    obs = simulated(3, work=sleeper(2))
    obs = dataclasses.replace(obs, workers=obs.workers[:2] + (
        dataclasses.replace(obs.workers[2], returned=False, exit_code=-9, killed_by_harness=True),))
    assert stragglers(obs).stragglers == () and straggler_lines(obs) == []


def test_chance_alone_names_no_one_in_a_short_run():
    """2 workers, 12 steps: last at 9 of 11 calls happens by chance in 3% of
    runs, so a worker late by 8 ms at 9 of them is not named."""
    obs = simulated(2, calls=12, work=lambda i, k: 0.010 + (
        0.008 if (i == 1) != (k in (3, 7)) else 0))
    report = stragglers(obs)
    assert report.arrival(1).last_share == 9 / 11 and report.stragglers == ()


def test_chance_holds_for_thousands_of_calls():
    """A long job's ledger has thousands of calls: the binomial tail is
    worked out in logs (its coefficients are beyond a float)."""
    from harness.diagnosis.stragglers import chance
    assert chance(9, 11, 2) == pytest.approx((55 + 11 + 1) / 2 ** 11)
    assert chance(0, 5000, 2) == 1.0 and chance(2400, 5000, 2) > 0.99
    assert 0.0 <= chance(3000, 5000, 2) < 1e-40 and chance(5000, 5000, 4) >= 0.0


@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_worker_late_once_by_half_a_second_is_said(n):
    """``Delay(seconds=0.5)``'s shape, as measured: one worker sleeps
    before one call of a 6-step job, too few calls for the pattern."""
    obs = simulated(n, calls=6, work=lambda i, k: 0.003 + (0.5 if (i, k) == (n - 1, 3) else 0.0),
                    traced=0.1)
    report = stragglers(obs)
    assert report.stragglers == () and not report.enough
    (late,) = report.late
    assert (late.worker, late.function, late.number) == (n - 1, "step", 3)
    assert 0.49 < late.lag < 0.51 and late.own > 0.49
    assert report.late_workers == (n - 1,)
    (line,) = straggler_lines(obs)
    assert line == (f"late once: worker {n - 1} arrived 0.50 s after the others at call 3 of "
                    "`step`, 0.50 s of it its own time since its previous call: the others waited")
    assert line in diagnose(obs).text.splitlines()


def test_late_once_is_read_from_each_workers_second_collective_on():
    """Each worker's time since its own previous collective call is read,
    so a worker's very first call (no previous one: a start, an import, a
    trace) tells nothing, and its second does."""
    first = simulated(3, calls=6, work=lambda i, k: 0.003 + (0.5 if (i, k) == (1, 1) else 0.0))
    assert stragglers(first).late == ()
    second = simulated(3, calls=6, work=lambda i, k: 0.003 + (0.5 if (i, k) == (1, 2) else 0.0))
    assert [(a.worker, a.number) for a in stragglers(second).late] == [(1, 2)]
    # Late by a traced call's own spread between workers (tens of ms): nothing.
    spread = simulated(3, calls=6, work=lambda i, k: 0.003 + (0.08 if (i, k) == (2, 2) else 0.0))
    assert stragglers(spread).late == ()


def test_late_once_needs_a_lag_that_stands_out_from_the_steps():
    """Steps of ~0.2 s with 0.3 s of noise once (1.5 steps) are nothing; a
    worker released late by the previous call (its own time alike) is
    nothing; jitter of tens of ms is nothing."""
    long_steps = simulated(3, calls=10, collective=lambda k: 0.2,
                           work=lambda i, k: 0.003 + (0.3 if (i, k) == (2, 5) else 0.0))
    assert stragglers(long_steps).late == ()
    released = simulated(3, calls=10, release=lambda i, k: 0.5 if (i, k) == (2, 4) else 0.0)
    assert stragglers(released).late == ()
    rng = random.Random(3)
    noisy = simulated(4, calls=20, work=lambda i, k: 0.005 + rng.uniform(0, 0.04))
    assert stragglers(noisy).late == () and straggler_lines(noisy) == []


def test_links_are_tried_after_a_completed_run_only_when_a_collective_was_slow_on_all():
    """The harness tries the links of a completed run (where it can) only
    when some call's collective took 50 ms or more after its last worker
    arrived: a slow link's mark, not a late worker's."""
    assert slow_collectives(simulated(3, calls=6, collective=lambda k: 0.2))
    assert slow_collectives(simulated(3, calls=6, collective=lambda k: 0.2 if k == 6 else 0.005))
    assert not slow_collectives(simulated(3, calls=6))
    assert not slow_collectives(simulated(
        3, calls=6, work=lambda i, k: 0.003 + (0.5 if (i, k) == (2, 3) else 0.0)))
    # The traced first call, seconds long, is left out.
    assert not slow_collectives(simulated(3, calls=6, traced=4.0))
    assert not slow_collectives(run(returned(0, 2), returned(1, 2)))   # no ledger
