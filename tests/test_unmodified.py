"""Users' own training code, with no harness calls: progress comes from its
collectives and steps are its calls of a tf.function that launches them, so
hang detection and step-keyed faults work on it unchanged."""
import pytest

from harness import faults as F
from harness.core import versions
from helpers import tutorial_loop

pytestmark = pytest.mark.timeout(120)


def test_a_long_unmodified_job_is_not_called_hung_while_its_collectives_complete(mwms_cluster):
    # 30 steps 0.2 s apart: three times the 2 s hang timeout in all.
    result = mwms_cluster.run(tutorial_loop, kwargs={"steps": 30, "pause": 0.2}, timeout=2)
    result.assert_completed()
    assert result.duration > 6.0
    assert all(w.last_step == 29 for w in result.workers)   # each call was a step


FAULTS = {
    "Crash": (lambda w: F.Crash(w, 5), "crashed"),
    "RaiseError": (lambda w: F.RaiseError(w, 5), "failed"),
    "SkipStep": (lambda w: F.SkipStep(w, 5), "hang"),
    "Pause": (lambda w: F.Pause(w, 5), "hang"),
    "ExtraCollective": (lambda w: F.ExtraCollective(w, 5), "hang"),
}


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("kind", list(FAULTS))
def test_faults_act_on_an_unmodified_loop(mwms_cluster, kind, n):
    mwms_cluster.settings = mwms_cluster.settings.with_overrides(workers=n)
    make, outcome = FAULTS[kind]
    last = n - 1
    result = mwms_cluster.run(tutorial_loop, faults=[make(last)], timeout=3, grace=2)
    assert result.outcome == outcome, result.report()
    assert result.faults_never_acted == ()
    if n == 2 and kind == "SkipStep":
        # A skipped call is no step at all (as a `continue` before it would
        # be): one loop that ended a call early looks like one that made a
        # call too many.  It must not name the wrong worker.
        result.assert_cannot_tell([0, 1])
    else:
        result.assert_culprit(last)


def test_a_skipped_first_call_returns_zeros_so_user_code_goes_on(mwms_cluster):
    mwms_cluster.settings = mwms_cluster.settings.with_overrides(workers=3)
    result = mwms_cluster.run(tutorial_loop, faults=[F.SkipStep(2, 0)], timeout=3, grace=2)
    result.assert_hang().assert_culprit(2)


def test_step_fn_names_the_training_function(mwms_cluster):
    # Evaluation every 2 steps: with step_fn, only train_step calls are steps.
    result = mwms_cluster.run(tutorial_loop, kwargs={"steps": 6, "evaluate_every": 2},
                              timeout=30, step_fn="train_step")
    result.assert_completed()
    assert all(w.last_step == 5 for w in result.workers)
    counted = mwms_cluster.run(tutorial_loop, kwargs={"steps": 6, "evaluate_every": 2},
                               timeout=30)
    assert all(w.last_step == 8 for w in counted.workers)   # 6 train + 3 eval calls


def keras_fit(epochs=2, steps_per_epoch=5):
    """Keras 2's ``fit`` (tf_keras; on 2.15 tf.keras) as the multi-worker Keras
    tutorial writes it, no harness calls."""
    import tensorflow as tf

    from harness import workloads
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = workloads.build_model()
        model.compile(optimizer=tf.keras.optimizers.Adam(0.001),
                      loss="sparse_categorical_crossentropy")
    x, y = workloads.make_data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0).repeat()
    history = model.fit(dataset.batch(workloads.GLOBAL_BATCH_SIZE), epochs=epochs,
                        steps_per_epoch=steps_per_epoch, verbose=0)
    return len(history.history["loss"])


def test_keras_fit_unmodified_gets_steps_and_faults(mwms_cluster):
    env = versions.keras2_env(versions.installed_minor())
    done = mwms_cluster.run(keras_fit, timeout=30, env=env)
    done.assert_completed()
    assert all(w.last_step == 9 for w in done.workers), [w.last_step for w in done.workers]
    crashed = mwms_cluster.run(keras_fit, timeout=30, grace=2, env=env,
                               faults=[F.Crash(1, 3)])
    crashed.assert_crashed().assert_culprit(1)
