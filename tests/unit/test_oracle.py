"""The oracle and the plan strategies, without TensorFlow."""
from hypothesis import given, settings

from harness import faults as F
from harness import plan as plan_module
from plans import Plan, fault_plans, well_formed
from oracle import expect


def test_no_fault_completes():
    assert expect(Plan(3)) == ("completed", ())


def test_benign_faults_complete():
    assert expect(Plan(2, (F.Delay(0, 1, 0.5), F.Pause(1, 2, 0.5)))) == ("completed", ())


def test_first_stopping_fault_decides():
    plan = Plan(4, (F.RaiseError(2, 1), F.Crash(0, 3)))
    assert expect(plan) == ("failed", (2,))
    assert expect(Plan(4, (F.Crash(3, 4, "kill"), F.SkipStep(1, 1)))) == ("crashed", (3,))
    assert expect(Plan(3, (F.Pause(1, 2),))) == ("hang", (1,))


def test_desync_hangs_and_names_the_worker_even_at_two():
    assert expect(Plan(3, (F.SkipStep(1, 2),))) == ("hang", (1,))
    assert expect(Plan(2, (F.ExtraCollective(1, 2),))) == ("hang", (1,))


def test_config_faults():
    assert expect(Plan(3, (F.BadTFConfig(0, "wrong_size"),))) == ("hang", (0,))
    assert expect(Plan(3, (F.BadTFConfig(2, "wrong_size"),))) == ("failed", (2,))
    assert expect(Plan(2, (F.BadTFConfig(1, "swapped"),))) == ("failed", (0, 1))


@settings(max_examples=300, deadline=None)
@given(fault_plans())
def test_generated_plans_are_valid_and_replayable(plan):
    assert 2 <= plan.workers <= 4 and len(plan.faults) <= 2
    assert well_formed(plan)
    assert plan_module.validate(plan.faults, plan.workers) == plan.faults
    # The printed plan is the plan: it can be pasted back.
    assert eval(repr(plan), {**vars(F), "Plan": Plan}) == plan
    outcome, culprits = expect(plan)
    assert outcome in ("completed", "failed", "crashed", "hang")
    assert all(0 <= c < plan.workers for c in culprits)
    assert bool(culprits) == (outcome != "completed")
