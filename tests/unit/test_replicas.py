"""The replica check without TensorFlow: comparing fingerprints, the rule
that blames, the verdict's text, and the record's round trip."""
import hashlib
import math

import numpy as np
import pytest

from harness.diagnosis import diagnose
from harness.diagnosis.words import divergence_text
from harness.errors import SettingError
from harness.core.protocol import VariablePrint
from harness.diagnosis.observations import (ReferenceCheck, ReplicaCheck, DivergentVariable, RunObservation,
                            WorkerObservation)
from harness.controller.replicas import (DEFAULT_REFERENCE_TOLERANCE, DEFAULT_TOLERANCE, compare,
                              compare_reference, parse_check_replicas, parse_reference)
from observations import returned, run

pytestmark = pytest.mark.timeout(30)


def _prints(values, names=None):
    """One worker's fingerprints of ``values`` (numpy arrays), as the worker makes them."""
    names = names or [f"v{k}" for k in range(len(values))]
    return tuple(VariablePrint(k, name, tuple(v.shape), str(v.dtype),
                               hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest())
                 for k, (name, v) in enumerate(zip(names, values)))


def _compare(per_worker, tolerance=DEFAULT_TOLERANCE, names=None):
    prints = {w: _prints(vs, names) for w, vs in per_worker.items()}
    loaded = []

    def load(worker, number):
        loaded.append((worker, number))
        return per_worker[worker][number]
    return compare(prints, load, tolerance), loaded


W = np.arange(6, dtype=np.float32).reshape(2, 3)
B = np.zeros(3, dtype=np.float32)
STEPS = np.array(20, dtype=np.int64)


def test_equal_replicas_agree_without_reading_a_value():
    check, loaded = _compare({0: [W, B, STEPS], 1: [W.copy(), B.copy(), STEPS.copy()]})
    assert check.divergence is None and check.variables == (3, 3)
    assert loaded == []      # equal digests settle it


def test_a_difference_within_the_tolerance_is_agreement():
    check, loaded = _compare({0: [W, B], 1: [W + 1e-8, B]})
    assert check.divergence is None and loaded


def test_the_first_variable_that_differs_is_named_with_its_largest_difference():
    check, _ = _compare({0: [W, B, STEPS], 1: [W, B + 0.5, STEPS + 1]},
                        names=["dense/kernel:0", "dense/bias:0", "iterations:0"])
    d = check.divergence
    assert "dense/bias:0" in d.variable and "#1" in d.variable
    assert d.max_difference == pytest.approx(0.5)
    assert sorted(d.sides) == [(0,), (1,)]
    assert "0.5" in d.detail


def test_tolerance_zero_is_bit_for_bit():
    check, _ = _compare({0: [W], 1: [W + 1e-8]}, tolerance=0.0)
    assert check.divergence is not None


def test_workers_that_made_different_variables_diverge_on_the_layout():
    check, loaded = _compare({0: [W, B], 1: [W]}, names=["k", "b"])
    d = check.divergence
    assert d.max_difference is None and d.layouts[1] == "none (created fewer variables)"
    assert divergence_text(d) == ("the workers created different variables; variable #1 is "
                                  "worker 0: 'b' shape (3,) float32; worker 1: none (created "
                                  "fewer variables)")
    assert loaded == []
    check, _ = _compare({0: [W], 1: [W.reshape(3, 2)]})
    assert "shape (3, 2)" in divergence_text(check.divergence)


def test_nan_on_one_side_differs():
    check, _ = _compare({0: [W], 1: [np.full_like(W, np.nan)]})
    assert check.divergence is not None and math.isnan(check.divergence.max_difference)


def test_sides_group_the_agreeing_workers_largest_first():
    check, _ = _compare({0: [W], 1: [W], 2: [W + 1], 3: [W]})
    assert check.divergence.sides == ((0, 1, 3), (2,))


@pytest.mark.parametrize("value, expected", [
    (False, None), (None, None), (True, DEFAULT_TOLERANCE), (0, 0.0), (1e-3, 1e-3)])
def test_parse_check_replicas(value, expected):
    assert parse_check_replicas(value) == expected


@pytest.mark.parametrize("value", [-1, "yes", float("nan"), float("inf"), [1]])
def test_parse_check_replicas_rejects(value):
    with pytest.raises(SettingError, match="check_replicas"):
        parse_check_replicas(value)


# ---------------------------------------------------------------- the verdict

def _diverged(n, sides, variable="'kernel:0' (variable #0, shape (2, 3), float32)"):
    obs = run(*(returned(i, n) for i in range(n)))
    div = DivergentVariable(variable, sides, 0.25, f"variable {variable} differs by up to 0.25")
    return RunObservation(**{**obs.__dict__, "replicas": ReplicaCheck((1,) * n, 1e-6, div)})


def test_a_lone_worker_against_a_majority_is_the_culprit():
    v = diagnose(_diverged(3, ((0, 1), (2,))))
    assert (v.outcome, v.culprits, v.ambiguous, v.error, v.rule) == (
        "failed", (2,), False, "ReplicaDivergence", "replicas")
    assert v.text.startswith("FAILED: replicas diverged; culprit: worker 2")
    assert "kernel:0" in v.text


@pytest.mark.parametrize("n, sides", [
    (2, ((0,), (1,))),                  # two workers: which one is right?
    (4, ((0, 1), (2, 3))),              # two against two
    (3, ((0,), (1,), (2,))),            # every worker trained alone
    (5, ((0, 1, 2), (3, 4))),           # the odd side is not one worker
])
def test_without_a_clear_majority_it_cannot_tell(n, sides):
    v = diagnose(_diverged(n, sides))
    assert v.outcome == "failed" and v.ambiguous
    assert v.culprits == tuple(range(n))
    assert "cannot tell" in v.text


def test_agreeing_replicas_complete_and_say_so():
    obs = run(returned(0, 2), returned(1, 2))
    obs = RunObservation(**{**obs.__dict__, "replicas": ReplicaCheck((4, 4), 1e-6)})
    v = diagnose(obs)
    assert v.outcome == "completed"
    assert "replicas: 4 mirrored variables agree on every worker" in v.text


def test_a_worker_that_could_not_fingerprint_is_noted_not_blamed():
    obs = run(returned(0, 2), returned(1, 2))
    obs = RunObservation(**{**obs.__dict__, "replicas": ReplicaCheck(
        (4,), 1e-6, notes=("worker 1: could not fingerprint its variables: OSError: disk",))})
    v = diagnose(obs)
    assert v.outcome == "completed" and "could not fingerprint" in v.text


def test_the_record_round_trips_with_its_replica_check():
    obs = _diverged(3, ((0, 1), (2,)))
    again = RunObservation.from_dict(obs.to_dict())
    assert again == obs and diagnose(again) == diagnose(obs)


# ---------------------------------------------------------------- the reference


def _worker(values, names=None):
    return WorkerObservation(0, returned=True, variables=_prints(values, names))


def _against(mine, theirs, returned=1.0, ref_returned=1.0, tolerance=1e-3,
             ref_outcome="completed", names=None):
    return compare_reference(_worker(mine, names), returned, lambda k: mine[k],
                             ref_outcome, "HANG: stuck", _worker(theirs, names), ref_returned,
                             lambda k: theirs[k], tolerance)


def test_a_run_that_matches_its_reference():
    check = _against([W, B], [W + 1e-5, B])
    assert not check.differs and check.variables == 2


def test_a_variable_off_the_reference_is_named_with_its_difference():
    check = _against([W, B], [W * 2, B], names=["dense/kernel:0", "dense/bias:0"])
    assert check.differs and "dense/kernel:0" in check.what
    assert check.max_difference == pytest.approx(5.0)
    assert "from the single-worker reference" in check.detail


def test_a_return_value_off_the_reference():
    check = _against([W], [W], returned=[1.0, 2.0], ref_returned=[1.0, 2.5])
    assert check.what == "fn's return value" and check.max_difference == pytest.approx(0.5)
    assert not _against([W], [W], returned="text", ref_returned="other").differs


def test_a_reference_that_did_not_complete_fails_the_check():
    check = _against([W], [W], ref_outcome="hang")
    assert check.differs and "reference run itself ended hang: HANG: stuck" in check.detail


def test_parse_reference():
    assert parse_reference(True) == DEFAULT_REFERENCE_TOLERANCE
    assert parse_reference(False) is None and parse_reference(0) == 0.0
    with pytest.raises(SettingError, match="reference"):
        parse_reference("yes")


def test_the_verdict_of_a_run_off_its_reference():
    obs = run(returned(0, 2), returned(1, 2))
    check = ReferenceCheck("completed", 4, 1e-3, "'kernel:0' (variable #0)", 0.5,
                           "'kernel:0' (variable #0) differs by up to 0.5 from the "
                           "single-worker reference (tolerance 0.001)")
    v = diagnose(RunObservation(**{**obs.__dict__, "reference": check}))
    assert (v.outcome, v.culprits, v.ambiguous, v.error, v.rule) == (
        "failed", (0, 1), True, "ReferenceMismatch", "reference")
    assert v.text.startswith("FAILED: the run differs from its single-worker reference: "
                             "'kernel:0'")
    same = ReferenceCheck("completed", 4, 1e-3)
    v = diagnose(RunObservation(**{**obs.__dict__, "reference": same}))
    assert v.outcome == "completed" and "reference: matches the single-worker reference" in v.text
    again = RunObservation.from_dict(RunObservation(**{**obs.__dict__, "reference": check}).to_dict())
    assert again.reference == check
