"""explore's parts without TensorFlow: shrinking, properties, the search
loop on a fake job, and the saved plans."""
from __future__ import annotations

import collections
import dataclasses
import types
from typing import Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.database import InMemoryExampleDatabase

from harness import faults as F
from harness import faults_text
from harness import strategies
from harness.diagnosis.observations import Event
from harness.errors import SettingError
from harness.explore import properties, shrink
from harness.explore.attribution import Attribution, attribute
from harness.explore.search import SavedPlans, explore, hang_timeout
from harness.explore.space import Space

STEPS = 12


def fake_result(outcome="completed", culprits=(), ambiguous=False, error=None, acted=(),
                workers=3, steps=STEPS):
    """What the search and the properties read of a RunResult."""
    events = {i: [Event(0.1 * (s + 1), "step", s) for s in range(steps)] for i in range(workers)}
    for f in acted:
        events[f.worker].append(Event(0.5, "fault", f.step, repr(f)))
    obs_workers = tuple(types.SimpleNamespace(events=tuple(events[i]), finish_time=0.1 * steps + 0.1)
                        for i in range(workers))
    ws = tuple(types.SimpleNamespace(index=i, attempts=(), last_step=steps - 1,
                                     observation=obs_workers[i]) for i in range(workers))
    return types.SimpleNamespace(
        outcome=outcome, culprits=tuple(culprits), attempts=(), workers=ws,
        ambiguous=ambiguous, error=error, faults_never_acted=(),
        diagnosis=f"{outcome.upper()}: made up", observation=types.SimpleNamespace(workers=obs_workers))


def crash_window_job(window=(7, 8)):
    """A fake job whose recovery breaks when any worker crashes at a step in
    ``window``: the run completes, and the invariant sees a step twice."""
    def run(plan, timeout):
        broken = any(isinstance(f, F.Crash) and f.step in window for f in plan)
        r = fake_result(acted=plan)
        r.repeated = broken
        return r

    def invariant(result):
        assert not result.repeated, "a step was applied twice"
    return run, invariant


def survives_judge(invariant):
    return lambda result, plan: properties.survives(result, plan, invariant)


def search(run, judge, kinds=("Crash",), budget=1e9, seed=0, saved=None, max_faults=1, **kw):
    clock = kw.pop("clock", None)
    extra = {"clock": clock} if clock else {}
    return explore(run, judge, space_for=lambda steps, state, alike, epochs: Space(
        3, steps, tuple(kinds), max_faults=max_faults, state_steps=state,
        interchangeable=alike, epoch_steps=epochs), kinds=kinds,
        property="survives", budget=budget, shrink_budget=budget, seed=seed, timeout=None,
        most_timeout=60.0, saved=saved, **extra, **kw)


# -- shrinking -------------------------------------------------------------------------

def test_every_simpler_plan_is_below_its_plan():
    plan = (F.Pause(2, 9, None), F.Crash(1, 5, "abort", attempt=1))
    for p in shrink.simpler(plan, strategies.STEP_KINDS):
        assert shrink.order(p) < shrink.order(plan)
        assert shrink.valid(p)


def test_the_simplest_candidates_come_first():
    cands = shrink.simpler((F.Crash(2, 8, "kill"),), ["Crash"])
    assert cands[0] == (F.Crash(2, 0, "kill"),)
    assert (F.Crash(2, 7, "kill"),) in cands and (F.Crash(0, 8, "kill"),) in cands
    assert (F.Crash(2, 8, "exit"),) in cands
    assert all(len(p) == 1 for p in cands)
    assert len(cands) == len(set(cands))


def test_the_moves_most_likely_to_keep_a_failure_come_first():
    """A fault fewer, then an earlier step, a simpler setting, a lower
    worker, and another kind last (a Preempt that is already as small as
    it gets is not tried as a crash first)."""
    cands = shrink.simpler((F.Preempt(2, 6), F.Crash(1, 4, "kill")), ["Crash", "Preempt"])
    moves = [c for c in cands]
    assert moves[0] in {(F.Preempt(2, 6),), (F.Crash(1, 4, "kill"),)}
    first_step = next(i for i, c in enumerate(moves) if len(c) == 2 and c[0].step < 6
                      and isinstance(c[0], F.Preempt))
    first_kind = next(i for i, c in enumerate(moves) if isinstance(c[0], F.Crash)
                      and c[0].worker == 2)
    first_worker = next(i for i, c in enumerate(moves) if len(c) == 2 and c[0].worker < 2
                        and isinstance(c[0], F.Preempt))
    assert first_step < first_worker < first_kind
    assert shrink.simpler((F.Preempt(0, 0),), ["Crash", "Preempt"])[-1] == (F.Crash(0, 0),)


@settings(max_examples=50, deadline=None)
@given(plan=strategies.plans(4, 10, max_faults=3, attempts=2))
def test_shrinking_always_ends(plan):
    seen = 0
    while True:
        cands = shrink.simpler(plan)
        if not cands:
            break
        plan, seen = cands[-1], seen + 1   # the least simplification each time
        assert seen < 500


def test_a_kind_shrinks_only_to_kinds_the_search_draws():
    cands = shrink.simpler((F.Pause(1, 3, None),), ["Pause", "Delay"])
    kinds = {type(p[0]).__name__ for p in cands}
    assert kinds == {"Pause", "Delay"}


# -- the properties --------------------------------------------------------------------

def test_culprits_are_told_relative_to_the_plan():
    a = properties.signature_of(fake_result("crashed", (2,), acted=[F.Crash(2, 5)]), (F.Crash(2, 5),))
    b = properties.signature_of(fake_result("crashed", (0,), acted=[F.Crash(0, 5)]), (F.Crash(0, 5),))
    assert a == b and a.culprits == ("faulted",)
    c = properties.signature_of(fake_result("crashed", (1,), acted=[F.Crash(0, 5)]), (F.Crash(0, 5),))
    assert c.culprits == ("other",)


def test_a_signature_s_roles_are_a_multiset_whatever_the_workers_order():
    """Every worker blamed: a crash of worker 2 and one of worker 0 fail
    the same way, so a shrink can move the fault to worker 0."""
    late = properties.signature_of(
        fake_result("hang", (0, 1, 2), ambiguous=True, acted=[F.Crash(2, 3)]), (F.Crash(2, 3),))
    early = properties.signature_of(
        fake_result("hang", (0, 1, 2), ambiguous=True, acted=[F.Crash(0, 3)]), (F.Crash(0, 3),))
    assert late == early and late.culprits == ("faulted", "other", "other")


def test_survives_holds_on_completion_and_breaks_on_the_invariant():
    ok = fake_result()
    assert properties.survives(ok, (), None).signature is None

    def promise(result):
        raise AssertionError("step 7 twice")
    broke = properties.survives(ok, (), promise)
    assert broke.signature.broken == "invariant: AssertionError"
    assert "step 7 twice" in broke.how
    hung = properties.survives(fake_result("hang", (1,)), (), None)
    assert hung.signature.outcome == "hang"


def _died_at_exit(dead, acted, returned=(0, 1, 2)):
    r = fake_result("crashed_at_exit", tuple(dead), acted=acted)
    for i, w in enumerate(r.observation.workers):
        w.index, w.returned, w.died_at_exit = i, i in returned, i in dead
    return r


def test_a_kill_of_the_plan_after_every_worker_returned_breaks_no_survival():
    """A preemption whose grace outlasts the job: the parent's kill lands
    after worker 0 returned.  The job's work was done; the kill was the
    plan's.  A death at exit of a worker no fault acted on is the job's
    own (an atexit handler, a teardown abort), and breaks it."""
    plan = (F.Preempt(0, 7),)
    held = properties.survives(_died_at_exit([0], plan), plan, None)
    assert held.signature is None
    assert properties.killed_once_done(_died_at_exit([0], plan), plan)

    def promise(result):
        raise AssertionError("the model was not saved")
    assert properties.survives(_died_at_exit([0], plan), plan, promise).signature.broken == \
        "invariant: AssertionError"
    own = properties.survives(_died_at_exit([1], plan), plan, None)
    assert own.signature is not None and own.signature.outcome == "crashed_at_exit"
    # Killed before it returned: a crash, whatever the plan.
    early = properties.survives(_died_at_exit([0], plan, returned=(1, 2)), plan, None)
    assert early.signature is not None


@pytest.mark.parametrize("outcome,culprits,ambiguous,expected", [
    ("crashed", (1,), False, Attribution.NAMED),
    ("hang", (0, 1), True, Attribution.CANNOT_TELL),
    ("hang", (0, 2), True, Attribution.WRONG),      # the truth not among the candidates
    ("hang", (2,), False, Attribution.WRONG),       # a confident wrong culprit
    ("failed", (), False, Attribution.WRONG),       # no one named
    ("completed", (), False, Attribution.SURVIVED),
])
def test_attribution(outcome, culprits, ambiguous, expected):
    plan = (F.SkipStep(1, 4),)
    r = fake_result(outcome, culprits, ambiguous, acted=plan)
    assert attribute(r, plan) == expected
    assert (properties.detected(r, plan, None).signature is None) == (expected != Attribution.WRONG)


def test_a_fault_that_never_acted_is_not_counted_as_attributed():
    plan = (F.SkipStep(1, 4),)
    assert attribute(fake_result("hang", (1,)), plan) == Attribution.NOT_ACTED


# -- the search ------------------------------------------------------------------------

def test_the_search_finds_the_window_and_shrinks_to_its_first_step_and_worker():
    run, invariant = crash_window_job()
    found = search(run, survives_judge(invariant))
    f = found.failure
    assert f is not None
    assert f.plan == (F.Crash(0, 7, "exit"),)
    assert f.line == "faults=[Crash(worker=0, step=7, how='exit')]"
    assert faults_text.parse_plan(f.line) == f.plan
    assert f.signature.broken == "invariant: AssertionError"
    assert found.steps == STEPS and found.runs >= 2


def test_a_fixed_job_breaks_nothing_and_every_plan_is_run():
    run, invariant = crash_window_job(window=())
    found = search(run, survives_judge(invariant))
    assert found.failure is None
    assert found.exhausted
    # Worker 0 and worker 1 (standing for 1 and 2, alike in the
    # fault-free run) x 12 steps x 3 ways to crash, and the fault-free run.
    assert found.runs == 2 * STEPS * len(F.CRASH_HOW) + 1
    assert found.outcomes == {"completed": found.runs}
    assert {f.worker for r in found.plans for f in r.plan} == {0, 1}


def test_workers_the_job_tells_apart_are_each_searched():
    fixed, invariant = crash_window_job(window=())

    def run(plan, timeout):
        r = fixed(plan, timeout)
        if not plan:
            r.workers[2].last_step -= 1   # worker 2 takes a step less
        return r
    found = search(run, survives_judge(invariant))
    assert found.exhausted and found.runs == 3 * STEPS * len(F.CRASH_HOW) + 1
    assert not found.coverage.space.interchangeable


def test_the_same_seed_draws_the_same_plans():
    runs = []

    def run(plan, timeout):
        runs.append(plan)
        return fake_result(acted=plan)
    search(run, survives_judge(None), budget=1e9, seed=7)
    first = list(runs)
    runs.clear()
    search(run, survives_judge(None), budget=1e9, seed=7)
    assert runs == first


def test_the_budget_stops_the_search():
    now = [0.0]

    def run(plan, timeout):
        now[0] += 1.0   # each run takes a second
        return fake_result(acted=plan)
    found = search(run, survives_judge(None), budget=10.0, clock=lambda: now[0])
    assert found.failure is None and not found.exhausted
    assert 10 <= found.runs <= 11


def test_a_job_that_fails_without_faults_is_the_failure():
    found = search(lambda plan, t: fake_result("failed", (0,), error="ValueError"),
                   survives_judge(None))
    assert found.failure.plan == ()
    assert found.runs == 1


def test_the_plans_hang_timeout_comes_from_the_fault_free_run():
    found = search(lambda plan, t: fake_result(acted=plan), survives_judge(None), budget=1e9)
    assert found.timeout == 3.0   # five times 0.1 s is below the least


def _stepped(times, finish):
    w = types.SimpleNamespace(events=tuple(Event(t, "step", i) for i, t in enumerate(times)),
                              finish_time=finish)
    return types.SimpleNamespace(observation=types.SimpleNamespace(workers=(w,)))


def test_the_hang_timeout_covers_the_start_up_the_usual_step_and_the_longest():
    steady = [2.0 + 0.5 * i for i in range(10)]
    assert hang_timeout(_stepped(steady, 7.0), 3.0, 60.0) == pytest.approx(4.0)   # 2 x start-up
    fast = [0.5 + 1.0 * i for i in range(10)]
    assert hang_timeout(_stepped(fast, 10.5), 3.0, 60.0) == pytest.approx(5.0)    # 5 x a step
    # One slow gap of 4 s among steps of 0.5 s moves it to twice that gap,
    # not five times: the search's timeout no longer rides on one outlier.
    slow_once = steady[:5] + [t + 4.0 for t in steady[5:]]
    assert hang_timeout(_stepped(slow_once, 11.0), 3.0, 60.0) == pytest.approx(2 * 4.5)
    assert hang_timeout(_stepped(steady, 7.0), 3.0, 3.5) == 3.5
    assert hang_timeout(_stepped([], None), 3.0, 60.0) == 3.0


def test_a_saved_failure_runs_first_and_a_fixed_one_is_dropped():
    db = InMemoryExampleDatabase()
    saved = SavedPlans("job", db)
    run, invariant = crash_window_job()
    first = search(run, survives_judge(invariant), saved=saved, seed=1)
    assert saved.lines() == [first.failure.line]
    tried = []

    def counting(plan, timeout):
        tried.append(plan)
        return run(plan, timeout)
    again = search(counting, survives_judge(invariant), saved=saved, seed=2)
    assert tried[:2] == [(), first.failure.plan]   # the fault-free run, then the saved plan
    assert again.failure.plan == first.failure.plan
    fixed_run, fixed_invariant = crash_window_job(window=())
    search(fixed_run, survives_judge(fixed_invariant), saved=saved, budget=1e9)
    assert saved.lines() == []


def test_bad_arguments_name_themselves():
    from harness.explore import explore_cluster
    cluster = types.SimpleNamespace(settings=None)
    for kwargs, named in [(dict(property="fast"), "property"), (dict(kinds=["Nap"]), "kinds"),
                          (dict(budget=0), "budget"), (dict(max_faults=0), "max_faults"),
                          (dict(seed=-1), "seed"), (dict(invariant=3), "invariant"),
                          (dict(reproduce=-1), "reproduce"), (dict(kinds=[int]), "kinds"),
                          (dict(order="random"), "order")]:
        with pytest.raises(SettingError, match=f"explore\\({named}"):
            explore_cluster(cluster, print, **kwargs)


def test_a_plan_whose_fault_never_acted_is_counted_apart():
    def run(plan, timeout):
        r = fake_result("failed" if plan else "completed")   # the never-acted stage fails it
        r.faults_never_acted = (("Crash(worker=0, step=3, attempt=1)", "never reached"),) if plan else ()
        return r
    found = search(run, survives_judge(None), budget=1e9)
    assert found.failure is None
    assert found.outcomes["a fault never acted"] == found.runs - 1


def test_a_job_s_key_names_its_function_and_its_arguments():
    from harness.explore import job_key
    assert job_key(crash_window_job) == f"{__name__}.crash_window_job()"
    assert job_key(crash_window_job, (3,), {"fixed": True, "a": 1}) == \
        f"{__name__}.crash_window_job(3, a=1, fixed=True)"
    assert job_key(crash_window_job, kwargs={"fixed": True}) != job_key(crash_window_job)


def test_the_search_reports_each_run_as_it_starts_and_ends():
    run, invariant = crash_window_job()
    now = [0.0]

    def timed(plan, timeout):
        now[0] += 1.0
        return run(plan, timeout)
    seen = []
    found = search(timed, survives_judge(invariant), seed=1, budget=1e9,
                   clock=lambda: now[0], progress=seen.append)
    from harness.explore.results import STAGES
    assert [p.stage for p in seen][:2] == ["fault-free run"] * 2
    assert seen[0].running == () and seen[0].runs == 0 and seen[1].last == ()
    assert {p.stage for p in seen} <= set(STAGES) and seen[-1].stage == "replay"
    started = [p for p in seen if p.running is not None]
    ended = [p for p in seen if p.running is None]
    assert len(started) == len(ended) == seen[-1].runs
    assert all(b.runs == a.runs + 1 and b.last == a.running for a, b in zip(started, ended))
    assert ended[-1].elapsed == now[0] and seen[-1].runs > found.runs   # the shrink's too
    assert all(p.left >= 0 for p in seen)


def test_the_result_lines_round_the_timeout_and_say_what_a_culprit_is():
    from harness.explore.results import Exploration, describe, seconds_text
    assert [seconds_text(s) for s in (3.44184, 30.0, 3.0, 0.25)] == ["3.4", "30", "3", "0.2"]
    sig = properties.Signature("hang", ("faulted", "other"), ambiguous=True, error=None,
                               broken="wrong culprit")
    assert describe(sig) == ("hang; cannot tell, candidates: a worker the plan faulted, a "
                             "worker the plan did not fault; wrong culprit")
    assert describe(properties.Signature("failed", ("other",), error="UnavailableError")) == \
        "failed; culprit: a worker the plan did not fault; error UnavailableError"
    summary = Exploration("survives", 3, {"completed": 3}, (1.0,) * 3, 8, 3.44184, 1, False,
                          3.0).summary()
    assert "hang timeout 3.4 s" in summary and "3.44" not in summary


def test_the_smallest_plan_is_replayed_and_a_racy_one_is_reported_with_its_rate():
    run, invariant = crash_window_job()
    found = search(run, survives_judge(invariant), reproduce=3)
    assert (found.failure.replays, found.failure.reproduced) == (3, 3)
    assert not found.failure.racy and "reproduced 3 of 3 replays" in found.summary()
    # Breaks once in two runs of the same plan: the race is said, with its rate.
    calls = collections.Counter()

    def racy(plan, timeout):
        calls[plan] += 1
        r = run(plan, timeout)
        r.repeated = r.repeated and calls[plan] % 2 == 1
        return r
    found = search(racy, survives_judge(invariant), reproduce=4)
    assert found.failure.plan == (F.Crash(0, 7, "exit"),)
    assert (found.failure.replays, found.failure.reproduced) == (4, 2) and found.failure.racy
    assert "RACY: failed the same way in 2 of 4 replays (3 of 5 runs in all)" in found.summary()


def test_a_job_that_breaks_with_no_fault_is_not_searched_and_a_racy_one_says_so():
    run, invariant = crash_window_job()
    calls = collections.Counter()

    def broken(plan, timeout):
        calls[plan] += 1
        r = run(plan, timeout)
        r.repeated = r.repeated or not plan
        return r
    found = search(broken, survives_judge(invariant), reproduce=3)
    assert found.failure.plan == () and set(calls) == {()}, found.summary()
    assert "the job breaks 'survives' with no fault at all, and in each of its 3 replays" \
        in found.summary() and "no plan was searched" in found.summary()

    def racy(plan, timeout):
        calls[plan] += 1
        r = run(plan, timeout)
        r.repeated = r.repeated or (not plan and calls[plan] == 1)
        return r
    calls.clear()
    found = search(racy, survives_judge(invariant), reproduce=3)
    assert found.failure.plan == () and found.failure.racy, found.summary()
    assert "in 1 of 4 runs: the job itself is racy" in found.summary()


def test_a_shrunk_plan_that_races_gives_way_to_the_plan_as_found():
    # A crash at step 8 always breaks the job; one at step 7 only the first
    # time it runs, once a step-8 crash has run: the shrink takes it, its
    # replays do not bear it out.
    run, invariant = crash_window_job(window=(8,))
    calls = collections.Counter()

    def racy(plan, timeout):
        calls[plan] += 1
        r = run(plan, timeout)
        seen_8 = any(f.step == 8 for p in calls for f in p)
        r.repeated = r.repeated or (seen_8 and calls[plan] == 1
                                    and any(f.step == 7 for f in plan))
        return r
    found = search(racy, survives_judge(invariant), reproduce=3)
    f = found.failure
    assert f.plan == f.found and f.plan[0].step == 8, found.summary()
    assert (f.replays, f.reproduced) == (3, 3) and not f.racy
    shrunk, count = f.passed_over
    assert shrunk[0].step == 7 and count == 0
    assert "kept as found: its shrunk form faults=[Crash(worker=0, step=7" in found.summary()


def test_a_search_that_finds_nothing_says_what_it_covered():
    run, invariant = crash_window_job(window=())
    now = [0.0]

    def timed(plan, timeout):
        now[0] += 1.0
        return run(plan, timeout)
    found = search(timed, survives_judge(invariant), kinds=("Crash", "Preempt"), budget=10.0,
                   clock=lambda: now[0])
    assert found.failure is None and len(found.plans) == found.runs - 1
    summary = found.summary()
    assert "no plan broke the property; covered: " in summary
    assert f"{found.runs - 1} of {found.runs - 1} plans acted" in summary
    # Ten runs spread over every kind and role before going deeper.
    assert found.coverage.by_kind["Crash"] >= 3 and found.coverage.by_kind["Preempt"] >= 3
    assert set(found.coverage.by_role) == {"worker 0", "another worker"}


def test_kinds_are_named_or_given_as_the_fault_classes():
    from harness.explore import check_kinds
    assert check_kinds([F.Crash, "Pause"], "survives") == ("Crash", "Pause")
    assert check_kinds(F.Preempt, "survives") == ("Preempt",)
    assert check_kinds("Crash, Delay", "survives") == ("Crash", "Delay")


def test_the_status_line_has_words_for_every_stage():
    from harness.explore.results import STAGES
    from harness.report.console import STAGE_WORDS
    assert set(STAGE_WORDS) == set(STAGES)


def test_a_fault_never_goes_into_the_last_attempt_under_survives():
    """With restarts=1 the restart attempt is the last: a crash there fails
    the run whatever the job does, so "survives" draws none there; it does
    from restarts=2, and "detected" (any verdict must name a faulted
    worker) into every attempt."""
    from harness.explore import fault_attempts
    assert fault_attempts("survives", 1, 2) == 1
    assert fault_attempts("survives", 2, 2) == 2
    assert fault_attempts("survives", 0, 2) == 1
    assert fault_attempts("detected", 1, 2) == 2
    assert fault_attempts("survives", 3, 1) == 1 and fault_attempts("detected", 3, 1) == 1
