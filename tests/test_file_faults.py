"""The file faults on real TensorFlow workers: a full disk, a write cut by a
kill, a rename that never happened and a slow write, each beside its twin
in user code (a write to ``/dev/full``, a job that kills itself half way
through its own write or just before its rename, a wait before its write),
and what each does
to a job that keeps its state in place against one that writes a
temporary file, syncs it and renames it (measured with TensorFlow 2.21.0)."""
import json
import os
import time

import pytest

import harness
from harness.errors import ExplorationFailed
from harness.faults import DiskFull, LostRename, SlowWrite, TornWrite

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("no_leftover_workers"),
              pytest.mark.mwms(workers=2, timeout=20, grace=1)]

STEPS = 6
AT = 3


def state_loop(in_place=False, n=STEPS, full_at=None, killed_at=None, unrenamed_at=None,
               slow_at=None):
    """One all-reduce a step; the chief keeps the next step and a count in
    ``run_dir/state.json``, which every worker reads to resume.  In place:
    the file is written where it is; else a temporary file, synced and
    renamed over it.  The twins: ``full_at`` writes the state to
    ``/dev/full`` at that step (a real full disk), ``killed_at`` writes
    half of it and kills the chief there (a real kill mid-write),
    ``unrenamed_at`` kills the chief just before its rename, ``slow_at``
    waits a second before the write (a slow disk)."""
    import tensorflow as tf
    ctx = harness.context()
    path = os.path.join(ctx.run_dir, "state.json")
    state = {"next": 0, "count": 0}
    if os.path.exists(path):
        with open(path) as f:
            state = json.load(f)   # a torn or emptied file raises here
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    @tf.function
    def step():
        return strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)

    def save(s, state):
        text = json.dumps(state)
        if s == full_at:
            with open("/dev/full", "w") as f:
                f.write(text)
        target = path if in_place else path + ".tmp"
        if s == slow_at:
            time.sleep(1.0)
        with open(target, "w") as f:
            if s == killed_at:
                f.write(text[:len(text) // 2])
                f.flush()
                os._exit(1)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if s == unrenamed_at:
            os._exit(1)
        if not in_place:
            os.replace(target, path)

    for s in ctx.steps(n):
        if s < state["next"]:
            continue
        step()
        state = {"next": s + 1, "count": state["count"] + 1}
        if ctx.index == 0:
            save(s, state)
    return state["count"]


def every_step_once(result):
    counts = [w.return_value for w in result.workers]
    assert counts[0] == STEPS, f"the chief counted {counts[0]} steps, not {STEPS}"


def _same(fault_run, twin_run):
    assert (fault_run.outcome, fault_run.culprits, fault_run.error) == \
        (twin_run.outcome, twin_run.culprits, twin_run.error), \
        fault_run.diagnosis + "\n---\n" + twin_run.diagnosis


def test_a_full_disk_fails_the_writer_as_a_real_one_does(mwms_cluster):
    fault = mwms_cluster.run(state_loop, kwargs={"in_place": True}, faults=[DiskFull(0, AT)])
    twin = mwms_cluster.run(state_loop, kwargs={"in_place": True, "full_at": AT})
    assert fault.outcome == "failed" and fault.culprits == (0,), fault.diagnosis
    assert "No space left on device" in fault.diagnosis
    _same(fault, twin)


def test_a_torn_write_kills_the_writer_as_a_real_kill_does(mwms_cluster):
    fault = mwms_cluster.run(state_loop, kwargs={"in_place": True}, faults=[TornWrite(0, AT)])
    twin = mwms_cluster.run(state_loop, kwargs={"in_place": True, "killed_at": AT})
    assert fault.outcome == "crashed" and fault.culprits == (0,), fault.diagnosis
    _same(fault, twin)


@pytest.mark.parametrize("fault", [DiskFull(0, AT), TornWrite(0, AT)], ids=repr)
def test_state_kept_in_place_is_lost_and_a_renamed_one_survives(mwms_cluster, fault):
    broken = mwms_cluster.run(state_loop, kwargs={"in_place": True}, faults=[fault], restarts=1)
    assert broken.outcome == "failed", broken.diagnosis
    assert "JSONDecodeError" in broken.diagnosis   # the restart read what was left
    fixed = mwms_cluster.run(state_loop, faults=[fault], restarts=1)
    fixed.assert_completed()
    every_step_once(fixed)


def test_a_lost_rename_kills_the_writer_as_a_real_kill_before_its_rename(mwms_cluster):
    fault = mwms_cluster.run(state_loop, faults=[LostRename(0, AT)])
    twin = mwms_cluster.run(state_loop, kwargs={"unrenamed_at": AT})
    assert fault.outcome == "crashed" and fault.culprits == (0,), fault.diagnosis
    _same(fault, twin)


def test_state_renamed_survives_a_lost_rename_and_in_place_never_renames(mwms_cluster):
    fixed = mwms_cluster.run(state_loop, faults=[LostRename(0, AT)], restarts=1)
    fixed.assert_completed()
    every_step_once(fixed)
    in_place = mwms_cluster.run(state_loop, kwargs={"in_place": True}, faults=[LostRename(0, AT)])
    assert in_place.faults_never_acted, in_place.diagnosis


def _gap_after(result, step):
    """Seconds between the chief's boundaries of ``step`` and ``step + 1``."""
    times = {e.step: e.time for e in result.observation.workers[0].events if e.kind == "step"}
    return times[step + 1] - times[step]


def test_a_slow_write_holds_the_writer_as_a_slow_disk_does(mwms_cluster):
    fault = mwms_cluster.run(state_loop, faults=[SlowWrite(0, AT, 1.0)])
    twin = mwms_cluster.run(state_loop, kwargs={"slow_at": AT})
    fault.assert_completed()
    twin.assert_completed()
    assert not fault.faults_never_acted, fault.diagnosis
    # The fault acts at the write after step AT's boundary: the gap to the
    # next boundary holds the second, in the fault's run as in its twin's.
    assert _gap_after(fault, AT) >= 1.0 and _gap_after(twin, AT) >= 1.0


def test_a_file_fault_that_finds_nothing_to_write_never_acted(mwms_cluster):
    result = mwms_cluster.run(state_loop, faults=[TornWrite(1, AT)])
    assert result.outcome == "failed" and result.faults_never_acted, result.diagnosis


# The smallest plan of each: a torn write at the first write; a full disk
# at the second (at the first there is no file yet to empty, and the
# restart starts afresh).
@pytest.mark.parametrize("smallest", [TornWrite(0, 0), DiskFull(0, 1)], ids=repr)
def test_explore_finds_state_kept_in_place_lost(mwms_cluster, smallest):
    with pytest.raises(ExplorationFailed) as raised:
        mwms_cluster.explore(state_loop, kwargs={"in_place": True},
                             kinds=[type(smallest)], restarts=1, invariant=every_step_once,
                             budget=60, seed=1)
    found = raised.value.exploration.failure
    assert found.plan == (smallest,), raised.value.exploration.summary()
    assert not found.racy


def test_explore_finds_the_renamed_state_surviving_every_file_fault(mwms_cluster):
    kinds = ["TornWrite", "DiskFull", "LostRename"]
    clean = mwms_cluster.explore(state_loop, kinds=kinds, restarts=1,
                                 invariant=every_step_once, budget=150, seed=1)
    assert clean.failure is None and clean.exhausted, clean.summary()
    # Every one acted on the chief, even at the last step (its rename comes
    # before it returns); none on worker 1, which writes nothing.
    assert clean.coverage.by_kind == dict.fromkeys(kinds, STEPS), clean.summary()
    assert clean.coverage.never_acted == len(kinds) * STEPS, clean.summary()
