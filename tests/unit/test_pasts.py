"""The past each worker resumed from (the checkpoint it restored) and the
stage ``different_pasts``, on hand-made observations: workers that resumed
from different checkpoints make a confident verdict "cannot tell", every
side named, unless the verdict names one worker by its own error or death."""
import dataclasses

import pytest

from harness.diagnosis import diagnose
from harness.diagnosis.observations import Event, WorkerObservation
from harness.diagnosis.pasts import checkpoint_name, differ, restored, sides
from harness.diagnosis.stages import conclude
from harness.diagnosis.story import Story
from harness.diagnosis.words import task_labels
from harness.diagnosis.render import restored_text
from observations import blocked, died, raised, returned, run

pytestmark = pytest.mark.timeout(30)


def restoring(w: WorkerObservation, *paths) -> WorkerObservation:
    """``w`` with a restore of each of ``paths`` (None: ``restore(None)``)
    reported right after its strategy was built, before its first step."""
    restores = tuple(Event(0.25, "restored", data={"path": p}) for p in paths)
    return dataclasses.replace(w, events=w.events[:3] + restores + w.events[3:])


def resumed_hang(n: int, chief_restores="/ckpt/ckpt-3"):
    """The wrong-directory restore: worker 0 resumed from its checkpoint,
    ran the 3 steps left and returned; the others restored nothing and wait
    in their 4th step."""
    chief = restoring(returned(0, n, steps=range(3), asked=3), chief_restores)
    rest = [restoring(blocked(i, n, steps=range(4)), None) for i in range(1, n)]
    return run(chief, *rest, ended_by="hang")


def test_a_workers_past_is_the_first_checkpoint_it_read():
    w = returned(0, 2)
    assert restored(w) is None
    assert restored(restoring(w, None)) is None
    assert restored(restoring(w, None, "/a/ckpt-2", "/a/ckpt-5")) == "/a/ckpt-2"
    assert checkpoint_name("/bucket/chief/ckpt-3") == "ckpt-3"
    assert checkpoint_name("/bucket/ckpt-3/") == "ckpt-3"


def test_workers_that_read_their_own_copies_of_one_save_have_one_past():
    ws = [restoring(returned(0, 2), "/b/ckpt-3"), restoring(returned(1, 2), "/b/workertemp_1/ckpt-3")]
    assert not differ(ws)
    assert not differ([returned(0, 2), returned(1, 2)])   # nobody restored: attempt 0
    ws = [restoring(returned(0, 3), "/b/ckpt-3"), returned(1, 3),
          restoring(returned(2, 3), "/b/ckpt-2")]
    assert differ(ws)
    assert sides(ws) == (("ckpt-3", (0,)), ("ckpt-2", (2,)), (None, (1,)))
    assert restored_text(sides(ws)) == ("worker 0 restored ckpt-3; worker 2 restored ckpt-2; "
                                        "worker 1 restored nothing")


@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_confident_verdict_on_different_pasts_becomes_cannot_tell_naming_every_side(n):
    obs = resumed_hang(n)
    v = conclude(diagnose(obs), obs, Story())
    assert v.ambiguous and v.culprits == tuple(range(n))
    assert "different_pasts" in v.stages
    head, line = v.text.splitlines()[:2]
    assert head.startswith("HANG: cannot tell who is to blame: the workers resumed from "
                           "different checkpoints")
    others = "worker 1" if n == 2 else f"workers {','.join(map(str, range(1, n)))}"
    assert line == f"resumed from: worker 0 restored ckpt-3; {others} restored nothing"


def test_the_sides_are_named_as_the_cluster_names_its_tasks():
    obs = dataclasses.replace(resumed_hang(2), tasks=(("chief", 0), ("worker", 0)))
    with task_labels(obs.labels()):
        v = conclude(diagnose(obs), obs, Story())
    assert "resumed from: chief restored ckpt-3; worker 0 restored nothing" in v.text


def test_the_same_past_on_every_worker_changes_nothing():
    obs = resumed_hang(3, chief_restores=None)
    v = diagnose(obs)
    assert conclude(v, obs, Story()) == v
    same = run(*(restoring(w, "/c/ckpt-3") for w in resumed_hang(3).workers), ended_by="hang")
    v = diagnose(same)
    assert conclude(v, same, Story()) == v


def test_a_culprit_named_by_its_own_error_or_death_is_kept():
    n = 2
    own = run(restoring(raised(0, n, "ValueError", "bad shape", 1.0), "/c/ckpt-3"),
              restoring(blocked(1, n), None), ended_by="grace_expired")
    v = diagnose(own)
    assert v.culprits == (0,) and not v.ambiguous
    assert conclude(v, own, Story()) == v
    dead = run(restoring(died(0, n, -9, 1.0), "/c/ckpt-3"), restoring(blocked(1, n), None),
               ended_by="grace_expired")
    v = diagnose(dead)
    assert v.culprits == (0,) and not v.ambiguous
    assert conclude(v, dead, Story()) == v


def test_a_completed_run_is_left_alone():
    obs = run(restoring(returned(0, 2), "/c/ckpt-3"), restoring(returned(1, 2), None))
    v = diagnose(obs)
    assert conclude(v, obs, Story()) == v


def test_under_task_restarts_only_the_restarted_tasks_resumed_from_a_checkpoint():
    """A task never restarted goes on from where its process is: restoring
    nothing is its past only when it was restarted."""
    obs = resumed_hang(2)
    first_of_1 = died(1, 2, 1, 0.5)
    restarted_both = Story(restarted=(first_of_1, raised(0, 2, "AbortedError", "x", 0.6)))
    v = conclude(diagnose(obs), obs, restarted_both)
    assert v.ambiguous and v.culprits == (0, 1)
    only_1 = Story(restarted=(first_of_1,))
    v = conclude(diagnose(obs), obs, only_1)
    assert "different_pasts" not in v.stages


def test_an_ambiguous_verdict_is_widened_to_every_side():
    n = 3
    chief = restoring(blocked(0, n, steps=range(3)), "/c/ckpt-3")
    obs = run(chief, *(restoring(blocked(i, n, steps=range(4)), None) for i in (1, 2)),
              ended_by="hang")
    v = dataclasses.replace(diagnose(obs), culprits=(1, 2), ambiguous=True)
    found = conclude(v, obs, Story())
    assert found.culprits == (0, 1, 2) and found.ambiguous
    whole = dataclasses.replace(v, culprits=(0, 1, 2))
    told = conclude(whole, obs, Story())
    assert (told.culprits, told.ambiguous) == (whole.culprits, True)
    assert told.text.splitlines()[0] == whole.text.splitlines()[0]
    assert told.text.splitlines()[1] == ("resumed from: worker 0 restored ckpt-3; "
                                         "workers 1,2 restored nothing")
    assert conclude(told, obs, Story()) == told   # once, at the attempt's level or the run's


def _position_outside_the_checkpoint(n: int):
    """Every worker restored ckpt-3 after a restart of the cluster, but
    worker 0 resumed at the step its own file kept (3 steps left, then it
    returned) while the others started over and wait in their 4th step."""
    chief = restoring(returned(0, n, steps=range(3), asked=3), "/ckpt/ckpt-3")
    rest = [restoring(blocked(i, n, steps=range(4)), "/ckpt/ckpt-3") for i in range(1, n)]
    return run(chief, *rest, ended_by="hang")


@pytest.mark.parametrize("n", [2, 3])
def test_after_a_restart_of_the_cluster_progress_compared_cannot_tell(n):
    obs = _position_outside_the_checkpoint(n)
    alone = diagnose(obs)
    assert alone.rule in ("left_early", "majority", "collective_counts")
    v = conclude(alone, obs, Story())                       # no restart: the rule stands
    assert "different_pasts" not in v.stages
    restarted = Story(attempts=(alone, alone))
    v = conclude(alone, obs, restarted)
    if alone.ambiguous:
        assert "different_pasts" not in v.stages
        return
    assert v.ambiguous and v.culprits == tuple(range(n)), v.text
    assert "different_pasts" in v.stages
    assert "\nHANG: cannot tell who is to blame: after the restart" in v.text, v.text
    assert "<- culprit" not in v.text.split("--- attempt 0 ---")[0]
    assert "resumed from: workers 0,1" in v.text or "resumed from: workers 0,1,2" in v.text


def test_after_a_restart_a_worker_named_by_its_own_error_stays_named():
    obs = run(restoring(raised(0, 2, "ValueError", "bad batch", 1.0), "/c/ckpt-1"),
              restoring(blocked(1, 2, steps=range(2)), "/c/ckpt-1"), ended_by="hang")
    alone = diagnose(obs)
    v = conclude(alone, obs, Story(attempts=(alone, alone)))
    assert "different_pasts" not in v.stages
    assert v.culprits == alone.culprits and v.ambiguous == alone.ambiguous
