"""The space a search draws from, its draws and what a search covered of
it: plain functions, no TensorFlow."""
from __future__ import annotations

import collections
import dataclasses

from harness import faults as F
from harness.explore.coverage import PlanRun, coverage
from harness.explore.space import (CHIEF_ROLE, ORDERS, OTHER_ROLE, Draws, Space, UniformDraws,
                                   kind_weights)


def _draw_all(space, seed=0, weights=None, limit=10_000):
    draws, ran = Draws(space, seed, weights), []
    while len(ran) < limit:
        plan = draws.next(set(ran), [])
        if plan is None:
            return ran
        ran.append(plan)
    return ran


def test_the_steps_are_cut_in_windows_the_first_longer():
    assert [list(w) for w in Space(3, 10, ("Crash",)).windows()] == \
        [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert [list(w) for w in Space(3, 2, ("Crash",)).windows()] == [[0], [1]]
    s = Space(3, 10, ("Crash", "Preempt"))
    assert s.roles() == (CHIEF_ROLE, OTHER_ROLE) and Space(1, 4, ("Crash",)).roles() == (CHIEF_ROLE,)
    assert len(s.cells()) == 2 * 2 * 4
    assert s.cell_of(F.Preempt(2, 7)) == ("Preempt", OTHER_ROLE, 2)
    # Worker 1 stands for workers 1 and 2, alike unless the job tells them apart.
    assert s.size() == 2 * 10 * 3 + 2 * 10
    assert dataclasses.replace(s, interchangeable=False).size() == 3 * 10 * 3 + 3 * 10


def test_the_first_draws_reach_every_cell_before_any_twice():
    space = Space(4, 12, ("Crash", "RaiseError", "Preempt"))
    first = _draw_all(space, seed=3)[:len(space.cells())]
    assert {space.cell_of(p[0]) for p in first} == set(space.cells())


def test_no_plan_is_drawn_twice_and_the_draws_end_with_the_space():
    space = Space(3, 5, ("Crash", "Preempt"))
    ran = _draw_all(space)
    assert len(ran) == len(set(ran)) == space.size()


def test_the_same_seed_draws_the_same_plans_and_seeds_differ():
    space = Space(3, 12, ("Crash", "RaiseError", "Delay", "Pause", "Preempt"))
    assert _draw_all(space, seed=7, limit=30) == _draw_all(space, seed=7, limit=30)
    firsts = {_draw_all(space, seed=s, limit=1)[0] for s in (0, 1, 2, 3, 7, 1234)}
    assert len(firsts) > 1


def test_delays_and_pauses_are_rare_under_survives():
    kinds = ("Crash", "RaiseError", "Delay", "Pause", "Preempt")
    space = Space(3, 20, kinds)
    ran = _draw_all(space, weights=kind_weights(kinds, "survives"), limit=110)
    count = collections.Counter(type(p[0]).__name__ for p in ran)
    assert count["Delay"] < count["Pause"] < count["Crash"]
    assert (count["Delay"] + count["Pause"]) / len(ran) < 0.3
    # Each kind that breaks jobs more often is tried everywhere before a delay is tried at all.
    stops = len([c for c in space.cells() if c[0] not in ("Delay", "Pause")])
    assert all(type(p[0]).__name__ not in ("Delay", "Pause") for p in ran[:stops])
    assert kind_weights(kinds, "detected") == dict.fromkeys(kinds, 1.0)


def test_the_stops_sweep_every_step_before_any_step_gets_a_second():
    """A job that writes at every step has no state point that stands out;
    a crash, an error and a preemption each leave it where the worker
    stopped, so the first round of the cells stops a worker at each step."""
    kinds = ("Crash", "RaiseError", "Delay", "Pause", "Preempt")
    space = Space(3, 20, kinds)
    stopping = [c for c in space.cells() if c[0] in ("Crash", "RaiseError", "Preempt")]
    for seed in range(5):
        ran = _draw_all(space, seed=seed, weights=kind_weights(kinds, "survives"), limit=40)
        stops = [p[0].step for p in ran if type(p[0]).__name__ != "Delay"
                 and type(p[0]).__name__ != "Pause"][:len(stopping)]
        assert len(stops) == len(stopping)
        assert set(stops) == set(range(20)), sorted(stops)
        # Within each window no step had a second stop before every step had one.
        for window in space.windows():
            seen = [s for s in stops if s in window]
            assert set(seen[:len(window)]) == set(window)


def test_a_stop_covers_its_step_only_if_the_job_was_restarted_after_it():
    """A stop that ended the job some other way (or never acted) left the
    restart at its step untried: its step is drawn again before a step
    the job came back from gets a second stop."""
    kinds = ("Crash", "RaiseError", "Preempt")
    space = Space(1, 20, kinds)   # one role: a neighbour of a step is the step before or after
    draws, ran, restarted = Draws(space, 0), [], []
    for _ in range(45):
        plan = draws.next(set(ran), list(restarted))
        cell = space.cell_of(plan[0])
        before = [p[0].step for p in ran]
        if plan[0].step % 2 and plan[0].step in before:
            left = [p for p in space.singles(cell) if p not in ran and p[0].step % 2 == 0]
            assert not left, (plan, left)
        ran.append(plan)
        if plan[0].step % 2:   # the job comes back only from a stop at an odd step
            restarted.append(plan)
    assert len({p[0].step for p in ran if p[0].step % 2 == 0}) == 10


def test_a_plan_that_made_a_restart_happen_guides_the_draws():
    """Its neighbours come early, and with max_faults=2 and a restart
    attempt, plans with a second fault in that attempt."""
    space = Space(3, 12, ("Crash",), max_faults=2, attempts=2)
    draws, ran = Draws(space, 0), []
    guide = (F.Crash(1, 6),)
    ran.append(guide)
    for _ in range(40):
        ran.append(draws.next(set(ran), [guide]))
    near = {(F.Crash(1, 5),), (F.Crash(1, 7),)}
    assert near & set(ran)
    later = [p for p in ran if len(p) == 2]
    assert later and all(p[0] == guide[0] and p[1].attempt == 1 for p in later)


def _ran(plan, acted=None, restarted=False, ended="completed"):
    return PlanRun(tuple(plan), ended, tuple(plan if acted is None else acted), restarted, 1.0)


def test_coverage_names_what_no_plan_reached():
    space = Space(3, 8, ("Crash", "Preempt"))
    runs = [_ran([F.Crash(0, 0)]), _ran([F.Crash(2, 5)], restarted=True),
            _ran([F.Preempt(1, 7)], acted=(), ended="a fault never acted")]
    c = coverage(space, runs)
    assert (c.plans, c.acted, c.never_acted, c.restarted) == (3, 2, 1, 1)
    assert c.by_kind == {"Crash": 2} and c.by_role == {CHIEF_ROLE: 1, OTHER_ROLE: 1}
    assert set(c.reached) == {("Crash", CHIEF_ROLE, 0), ("Crash", OTHER_ROLE, 2)}
    text = "\n".join(c.lines())
    # The preemption never acted: every one of its cells is named unreached.
    assert "covered: 2 of 3 plans acted (1 never acted); 2 of 16 cells" in text
    assert "never reached: Preempt anywhere; Crash at worker 0, steps 2-3;" in text
    assert "Crash at another worker, steps 6-7" in text and "more" not in text
    assert "by kind: Crash 2, Preempt 0" in text
    assert "1 plans made a restart happen; 0 faults acted in a restart attempt" in text


def test_coverage_counts_a_fault_in_a_restart_attempt_only_where_it_acted():
    space = Space(2, 4, ("Crash",), max_faults=2, attempts=2)
    second = F.Crash(0, 1, attempt=1)
    runs = [_ran([F.Crash(1, 2), second], restarted=True),
            _ran([F.Crash(1, 3), second], acted=[F.Crash(1, 3)], restarted=True)]
    c = coverage(space, runs)
    assert c.in_restart == 1 and c.acted == 1 and c.never_acted == 1


def test_state_points_are_the_steps_around_each_write_unless_writes_are_everywhere():
    space = Space(3, 20, ("Crash", "Preempt"), state_steps=(0, 13))
    assert space.state_points() == (0, 12, 13)
    assert Space(3, 20, ("Crash",), state_steps=tuple(range(1, 20))).state_points() == ()
    assert Space(3, 20, ("Crash",)).state_points() == ()


def test_where_writes_are_everywhere_the_epoch_boundaries_are_the_state_points():
    """A Keras job that backs up every batch writes at every step: no write
    stands out, and its callbacks act at the epoch boundaries (4 epochs of
    4 batches: epochs begin at steps 4, 8, 12)."""
    space = Space(3, 16, ("Crash", "RaiseError", "Preempt"), state_steps=tuple(range(1, 17)),
                  epoch_steps=(4, 8, 12))
    assert space.state_points() == (3, 4, 7, 8, 11, 12) and space.write_steps() == ()
    first = _draw_all(space, seed=1)[:len(space.state_points()) * len(space.roles())]
    assert {(p[0].step, space.role_of(p[0].worker)) for p in first} == {
        (s, role) for s in (3, 4, 7, 8, 11, 12) for role in space.roles()}
    # Writes that stand out come first; no epochs, no writes: no state point.
    assert Space(3, 16, ("Crash",), state_steps=(5,), epoch_steps=(4, 8)).state_points() == (4, 5)
    assert Space(3, 16, ("Crash",), state_steps=tuple(range(16))).state_points() == ()


def test_the_draws_crash_each_role_around_each_write_first():
    space = Space(4, 20, ("RaiseError", "Preempt", "Crash"), state_steps=(13,))
    first = [Draws(space, seed).next(set(), []) for seed in range(20)]
    assert {type(p[0]) for p in first} == {F.Crash}
    ran = _draw_all(space, seed=1)[:4]
    assert {(p[0].step, space.role_of(p[0].worker)) for p in ran} == \
        {(12, CHIEF_ROLE), (12, OTHER_ROLE), (13, CHIEF_ROLE), (13, OTHER_ROLE)}
    assert all(isinstance(p[0], F.Crash) for p in ran)
    # Without a crash among the kinds, a preemption stands in.
    preempts = _draw_all(Space(3, 20, ("Delay", "Preempt"), state_steps=(13,)), seed=1)[:4]
    assert all(isinstance(p[0], F.Preempt) and p[0].step in (12, 13) for p in preempts)


def test_the_file_faults_asked_for_act_during_each_write_first():
    space = Space(3, 20, ("Crash", "TornWrite", "LostRename", "SlowWrite"), state_steps=(13,))
    first = _draw_all(space, seed=2)[:8]
    # Crashes of each role at 12 and 13, a torn write and a lost rename of
    # each role in step 12, the one that wrote; no slow write (it breaks no write).
    assert sorted((type(p[0]).__name__, p[0].step, space.role_of(p[0].worker)) for p in first) \
        == sorted([("Crash", s, r) for s in (12, 13) for r in (CHIEF_ROLE, OTHER_ROLE)]
                  + [(k, 12, r) for k in ("TornWrite", "LostRename")
                     for r in (CHIEF_ROLE, OTHER_ROLE)])
    # None where the job writes at most of its steps.
    assert Space(3, 4, ("TornWrite",), state_steps=(1, 2, 3)).write_steps() == ()


def test_coverage_says_where_the_job_wrote_and_how_many_faults_fell_around_it():
    space = Space(2, 20, ("Crash",), state_steps=(13,))
    c = coverage(space, [_ran([F.Crash(0, 12)]), _ran([F.Crash(1, 13)]), _ran([F.Crash(1, 3)])])
    assert c.at_state == 2
    assert "  state points: writes seen at the boundaries of steps 13; 2 faults acted just " \
        "before or after one" in c.lines()
    assert "none (the fault-free run wrote nothing" in coverage(Space(2, 20, ("Crash",)), []).state_text()
    everywhere = Space(2, 20, ("Crash",), state_steps=tuple(range(1, 20)))
    assert "none stand out (the fault-free run wrote under run_dir at 19 of 20 step boundaries)" \
        in coverage(everywhere, []).state_text()


def test_a_second_fault_lands_first_where_the_restart_attempt_resumed():
    """With the restart attempt known to have begun at step 4 (the job
    restored what it kept), the first second faults are crashes of each
    role there, in the restart attempt."""
    space = Space(3, 12, ("Crash", "Preempt"), max_faults=2, attempts=2)
    guide = (F.Crash(1, 6),)
    seconds = []
    for seed in range(30):
        draws, ran = Draws(space, seed), [guide]
        while True:
            plan = draws.next(set(ran), [guide], {guide: 4})
            ran.append(plan)
            if len(plan) == 2:
                seconds.append(plan)
                break
    assert all(p[0] == guide[0] and p[1].attempt == 1 and p[1].step == 4
               and isinstance(p[1], F.Crash) for p in seconds)
    assert {space.role_of(p[1].worker) for p in seconds} == {CHIEF_ROLE, OTHER_ROLE}


def test_the_step_a_restart_attempt_resumed_at_is_read_from_its_steps():
    import types

    from harness.diagnosis.observations import Event
    from harness.explore.search import resumed_at

    def attempt(*steps):
        w = types.SimpleNamespace(events=tuple(Event(0.1, "step", s) for s in steps))
        return types.SimpleNamespace(observation=types.SimpleNamespace(workers=(w, w)))
    assert resumed_at(types.SimpleNamespace(attempts=())) is None
    assert resumed_at(types.SimpleNamespace(attempts=(attempt(0, 1, 2), attempt(3, 4)))) == 3
    assert resumed_at(types.SimpleNamespace(attempts=(attempt(0), attempt()))) is None


def test_the_uniform_order_draws_every_plan_once_and_learns_nothing():
    space = Space(3, 5, ("Crash", "Preempt"))
    draws, ran = UniformDraws(space, 4), []
    while (plan := draws.next(set(ran), ran)) is not None:
        ran.append(plan)
    # It knows no symmetry: workers 1 and 2 are each drawn.
    assert len(ran) == len(set(ran)) == dataclasses.replace(space, interchangeable=False).size()
    # Its kinds are drawn alike, whatever a kind's weight under the property.
    weights = kind_weights(("Crash", "Delay"), "survives")
    first = [UniformDraws(Space(3, 20, ("Crash", "Delay")), s, weights).next(set(), [])[0]
             for s in range(400)]
    delays = sum(isinstance(f, F.Delay) for f in first)
    assert 150 < delays < 250, delays
    assert set(ORDERS) == {"guided", "uniform"}


def test_plans_that_differ_only_in_which_other_worker_are_one():
    space = Space(4, 10, ("Crash", "Pause"), max_faults=2, attempts=2)
    assert space.key((F.Crash(3, 4),)) == (F.Crash(1, 4),)
    assert space.key((F.Crash(0, 4),)) == (F.Crash(0, 4),)
    one = space.key((F.Crash(3, 4, "kill"), F.Crash(2, 4, "exit")))
    assert one == space.key((F.Crash(2, 4, "kill"), F.Crash(3, 4, "exit")))
    assert one == space.key((F.Crash(1, 4, "kill"), F.Crash(2, 4, "exit")))
    assert space.key((F.Crash(2, 1), F.Pause(3, 5, 0.2, attempt=1))) == \
        (F.Crash(1, 1), F.Pause(2, 5, 0.2, attempt=1))
    apart = dataclasses.replace(space, interchangeable=False)
    assert apart.key((F.Crash(3, 4),)) == (F.Crash(3, 4),)
    # The draws never run a plan one with a plan run before.
    draws, ran = Draws(space, 0), []
    while len(ran) < 300 and (plan := draws.next(set(ran), ran)) is not None:
        ran.append(plan)
    assert len({space.key(p) for p in ran}) == len(ran)
