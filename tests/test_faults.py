"""Every fault kind on real TensorFlow workers, N in {2, 3, 4}, the faulted
worker first and last (at 4, the last).  The assertions read the diagnosis (outcome,
culprits), never the fault plan."""
import pytest

from harness import faults as F
from helpers import variable_loop

pytestmark = pytest.mark.timeout(120)

STEPS = 8
FAULT_STEP = 4
TIMEOUT = 3.0


def training_loop():
    return variable_loop(STEPS)


def make_fault(kind, w):
    """The fault of matrix entry `kind` on worker `w`."""
    return {
        "SkipStep": F.SkipStep(w, FAULT_STEP),
        "ExtraCollective": F.ExtraCollective(w, FAULT_STEP),
        "Crash-exit": F.Crash(w, FAULT_STEP, "exit"),
        "Crash-kill": F.Crash(w, FAULT_STEP, "kill"),
        "Crash-abort": F.Crash(w, FAULT_STEP, "abort"),
        "RaiseError": F.RaiseError(w, FAULT_STEP, "injected"),
        "Pause-forever": F.Pause(w, FAULT_STEP),
        "Pause-resumed": F.Pause(w, FAULT_STEP, seconds=1.0),
        "Delay": F.Delay(w, FAULT_STEP, 1.0),
        "BadTFConfig-missing": F.BadTFConfig(w, "missing"),
        "BadTFConfig-wrong_size": F.BadTFConfig(w, "wrong_size"),
        "BadTFConfig-duplicate_index": F.BadTFConfig(w, "duplicate_index"),
        "BadTFConfig-swapped": F.BadTFConfig(w, "swapped"),
        "BadTFConfig-wrong_port": F.BadTFConfig(w, "wrong_port"),
    }[kind]


# kind -> the outcome TensorFlow 2.21 gives here, measured over repeated runs
# at N = 2, 3, 4; a pair is (faulted worker is the chief, faulted worker is last).
EXPECTED = {
    "SkipStep": "hang",                # the others block in their last all-reduce
    "ExtraCollective": "hang",         # pairs with the others' next one; blocks at the end
    "Crash-exit": "crashed",
    "Crash-kill": "crashed",
    "Crash-abort": "crashed",
    "RaiseError": "failed",
    "Pause-forever": "hang",
    "Pause-resumed": "completed",
    "Delay": "completed",
    "BadTFConfig-missing": "hang",     # it trains alone; the others wait in strategy creation
    "BadTFConfig-wrong_size": ("hang", "failed"),   # last: "joining a group with ..."
    "BadTFConfig-duplicate_index": "failed",        # "Could not start gRPC server"
    "BadTFConfig-swapped": "failed",                # "Could not start gRPC server"
    "BadTFConfig-wrong_port": ("hang", "failed"),   # last: peers cannot connect to it
}
# With two workers, of two disagreeing TF_CONFIG lists neither is the
# majority: the diagnosis must say so, naming both.  (A skipped or an extra
# collective is told apart by the collective ledger's per-step counts.)
AMBIGUOUS_AT_2 = {"BadTFConfig-swapped", "BadTFConfig-wrong_port"}
COMPLETES = {"Pause-resumed", "Delay"}


# The chief at 2 workers, the last worker at 2, 3 and 4: the chief's role
# is the same at any N, and the accuracy benchmark (docs/accuracy.md) runs
# every kind at the first, a middle and the last worker at 2, 3 and 4.
MATRIX = [(2, "chief")] + [(n, "last") for n in (2, 3, 4)]


@pytest.mark.parametrize("n,position", MATRIX, ids=[f"{n}-{p}" for n, p in MATRIX])
@pytest.mark.parametrize("kind", list(EXPECTED))
def test_fault_matrix(mwms_cluster, kind, n, position):
    mwms_cluster.settings = mwms_cluster.settings.with_overrides(workers=n)
    w = 0 if position == "chief" else n - 1
    result = mwms_cluster.run(training_loop, faults=[make_fault(kind, w)], timeout=TIMEOUT, grace=2)
    record = (f"{kind} N={n} w={w}: outcome={result.outcome} culprits={result.culprits} "
              f"detect={result.observation.detection_delay}")
    print(record)
    expected = EXPECTED[kind]
    if isinstance(expected, tuple):
        expected = expected[0] if w == 0 else expected[1]
    assert result.outcome == expected, result.report()
    if kind in COMPLETES:
        assert result.return_values == [float(n) * STEPS] * n
        return
    if kind in AMBIGUOUS_AT_2 and n == 2:
        assert result.verdict.ambiguous and result.culprits == (0, 1), result.report()
        assert "cannot tell" in result.diagnosis, result.diagnosis
    else:
        assert result.culprits == (w,), result.report()
    if result.observation.ended_by == "hang":
        assert result.observation.detection_delay < 1.0, record
    elif result.observation.ended_by == "deadlock":   # proven once the skipper returned
        returned = max(w.finish_time for w in result.observation.workers if w.returned)
        assert result.observation.duration - returned < 5.0, record


@pytest.mark.parametrize("n", [2, 3])
def test_sync_check_turns_a_skip_into_an_immediate_error(mwms_cluster, n):
    # The skipper reports every boundary (as a `continue` would), so its
    # sync check at the next boundary pairs with the others' training
    # all-reduce of step 4: TensorFlow fails it at once as a shape mismatch.
    mwms_cluster.settings = mwms_cluster.settings.with_overrides(workers=n)
    last = n - 1
    result = mwms_cluster.run(training_loop, faults=[F.SkipStep(last, FAULT_STEP)],
                              timeout=TIMEOUT, grace=2, sync_check=True)
    assert result.outcome == "failed", result.report()
    # Caught at the first boundary after the skip, not at the end.
    assert max(w.last_step for w in result.workers) == FAULT_STEP + 1
    assert result.culprits == (last,), result.report()
    assert not result.ambiguous


def test_sync_check_passes_a_healthy_run(mwms_cluster):
    result = mwms_cluster.run(training_loop, sync_check=True).assert_completed()
    assert result.return_values == [float(mwms_cluster.num_workers) * STEPS] * mwms_cluster.num_workers


@pytest.mark.parametrize("n", [2, 3, 4])
def test_start_delay_past_the_registration_timeout_names_the_late_worker(mwms_cluster, n):
    """The last worker starts 3.5 s late, past the job's own registration
    timeout of 1 s (scenarios/test_late_workers.py).  TensorFlow 2.19-2.21,
    measured: the others raise DeadlineExceededError at the registration
    barrier about 1 s past the timeout and exit 1; the late worker, seen to
    start after them, is the one named.  2.15-2.18 have no registration
    barrier: the late worker is waited for, and the run completes."""
    from scenarios.test_late_workers import GRACE, HAS_BARRIER, LATE, REGISTER_TIMEOUT, train
    mwms_cluster.settings = mwms_cluster.settings.with_overrides(workers=n)
    last = n - 1
    result = mwms_cluster.run(train, kwargs={"register_timeout": REGISTER_TIMEOUT}, timeout=20,
                              grace=GRACE, faults=[F.StartDelay(last, LATE)])
    if not HAS_BARRIER:
        result.assert_completed()
        return
    assert (result.outcome, result.culprits, result.verdict.rule) == (
        "failed", (last,), "late_start"), result.report()
    assert result.diagnosis.startswith(f"FAILED: worker {last} started "), result.diagnosis
    for w in result.workers[:last]:
        assert w.exception.type_name.endswith("DeadlineExceededError") and w.exit_code == 1
