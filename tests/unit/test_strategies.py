"""harness.strategies: what they draw is a valid plan, they shrink toward
the simplest, and a wrong argument names itself.  No TensorFlow."""
import pytest
from hypothesis import find, given, settings, strategies as st
from hypothesis.errors import InvalidArgument

from harness import faults as F
from harness import plan as plan_module
from harness import strategies


@settings(max_examples=200, deadline=None)
@given(st.data(), st.integers(1, 5), st.integers(1, 12), st.integers(1, 3))
def test_every_plan_drawn_is_valid_for_its_cluster(data, workers, steps, attempts):
    plan = data.draw(strategies.plans(workers, steps, max_faults=3, attempts=attempts))
    assert plan_module.validate(plan, workers, restarts=attempts - 1) == plan
    assert all(f.step < steps for f in plan)
    assert len({(f.worker, f.step, f.attempt) for f in plan}) == len(plan)
    # A plan prints as the faults' calls: pasted back, the same plan.
    assert eval(repr(plan), vars(F)) == plan


def test_a_failing_plan_shrinks_to_one_fault_at_the_lowest_worker_and_step():
    found = find(strategies.plans(3, 10, max_faults=3),
                 lambda plan: any(f.step >= 4 for f in plan))
    assert found == (F.Crash(0, 4),)
    crash_late = find(strategies.plans(3, 10, kinds=["Pause", "SkipStep"], max_faults=2),
                      lambda plan: any(isinstance(f, F.Pause) for f in plan))
    assert crash_late == (F.Pause(0, 0, 0.2),)


@pytest.mark.parametrize("kwargs,named", [
    (dict(workers=0, steps=5), "workers=0"), (dict(workers=2, steps=True), "steps=True"),
    (dict(workers=2, steps=5, kinds=["Crash", "Meteor"]), "not ['Meteor']"),
    (dict(workers=2, steps=5, kinds="Crash"), "kinds='Crash'"),
    (dict(workers=2, steps=5, min_faults=2, max_faults=1), "max_faults=1 is below"),
])
def test_a_wrong_argument_names_itself(kwargs, named):
    with pytest.raises(InvalidArgument, match=named.replace("[", r"\[").replace("]", r"\]")):
        strategies.plans(**kwargs).example()
