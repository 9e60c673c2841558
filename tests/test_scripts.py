"""mwms_cluster.run_script: a Python script (or module) on every worker, as
`python path argv...` (or `python -m module argv...`) would run it.

The scripts are written in the style of TensorFlow's multi-worker
tutorials: the strategy reads TF_CONFIG by itself, flags come from
argparse, data is synthetic.  Exit statuses map to outcomes as for a
process: returning or sys.exit(0) completes, an uncaught exception fails,
sys.exit(n) with n != 0 crashes.
"""
import json
import os
import sys
import textwrap

import pytest

from harness import SettingError
from harness.controller import Cluster
from harness.faults import Crash
from harness.controller.scripts import IMPORT_TIME_ENV, ScriptMain, check_import_time_env, script_main
from harness.settings import RunSettings
from helpers import LEAVE_TOGETHER

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leftover_workers")]

# A tutorial-style custom training loop: a linear model on synthetic data,
# distributed with distribute_datasets_from_function, one all-reduce of the
# gradients per step.  --end says how the script ends on which worker.
TRAIN = LEAVE_TOGETHER + textwrap.dedent('''\
    import argparse
    import json
    import os
    import sys

    import tensorflow as tf


    def dataset_fn(global_batch_size, input_context):
        batch = input_context.get_per_replica_batch_size(global_batch_size)
        x = tf.random.stateless_uniform((256, 4), seed=(1, input_context.input_pipeline_id))
        y = tf.reduce_sum(x, axis=1, keepdims=True)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch)
        return ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--out", required=True)
        parser.add_argument("--steps", type=int, default=4)
        parser.add_argument("--harness-steps", action="store_true",
                            help="count steps with harness.context().steps(), where faults act")
        parser.add_argument("--end", default="return")
        args = parser.parse_args()

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        task_id = strategy.cluster_resolver.task_id
        global_batch = 16 * strategy.num_replicas_in_sync
        dist_ds = strategy.distribute_datasets_from_function(
            lambda ctx: dataset_fn(global_batch, ctx))
        with strategy.scope():
            w = tf.Variable(tf.zeros((4, 1)))

        @tf.function
        def train_step(iterator):
            def step_fn(inputs):
                x, y = inputs
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2)
                w.assign_sub(0.1 * tape.gradient(loss, w))
                return loss
            losses = strategy.run(step_fn, args=(next(iterator),))
            return strategy.reduce("MEAN", losses, axis=None)

        iterator = iter(dist_ds)
        if args.harness_steps:
            import harness
            steps = harness.context().steps(args.steps)
        else:
            steps = range(args.steps)
        for _ in steps:
            loss = train_step(iterator)
        leave_together(strategy, args.out)

        with open(os.path.join(args.out, f"worker-{task_id}.json"), "w") as f:
            json.dump({"name": __name__, "argv": sys.argv, "cwd": os.getcwd(),
                       "path0": sys.path[0], "loss": float(loss),
                       "task": json.loads(os.environ["TF_CONFIG"])["task"]}, f)
        end = args.end
        if end == "exit0":
            sys.exit(0)
        if end == "exit":
            sys.exit()
        if end == "systemexit_none":
            raise SystemExit(None)
        if end == "exit3_on_1" and task_id == 1:
            sys.exit(3)
        if end == "raise_on_1" and task_id == 1:
            raise ValueError(f"worker {task_id} found a bad batch")


    if __name__ == "__main__":
        main()
''')


@pytest.fixture
def train_py(tmp_path):
    path = tmp_path / "scripts" / "train.py"
    path.parent.mkdir()
    path.write_text(TRAIN)
    out = tmp_path / "out"
    out.mkdir()
    return path, out


def _written(out, n):
    return [json.loads((out / f"worker-{i}.json").read_text()) for i in range(n)]


@pytest.mark.timeout(90)
def test_script_completes_as_main_with_its_argv(mwms_cluster, train_py, tmp_path, monkeypatch):
    path, out = train_py
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)   # it runs where run_script is called, not in the forkserver's cwd
    argv = ["--out", str(out), "--steps", "5"]
    result = mwms_cluster.run_script(path, argv, timeout=30)
    result.assert_completed()
    n = mwms_cluster.num_workers
    assert result.return_values == [None] * n
    seen = _written(out, n)
    for i, s in enumerate(seen):
        assert s["name"] == "__main__"
        assert s["argv"] == [str(path), *argv]
        assert s["path0"] == str(path.parent)
        assert s["cwd"] == str(here)
        assert s["task"] == {"type": "worker", "index": i}
    # One cluster: the loss is all-reduced, so every worker holds the same one.
    assert len({s["loss"] for s in seen}) == 1


@pytest.mark.timeout(90)
@pytest.mark.parametrize("end", ["exit0", "exit", "systemexit_none"])
def test_exit_status_zero_completes(mwms_cluster, train_py, end):
    path, out = train_py
    result = mwms_cluster.run_script(path, ["--out", str(out), "--end", end], timeout=30)
    result.assert_completed()
    assert [w.exit_code for w in result.workers] == [0] * mwms_cluster.num_workers


@pytest.mark.timeout(90)
def test_absl_app_run_completes(mwms_cluster, tmp_path):
    """absl's app.run parses flags from sys.argv and always ends in SystemExit."""
    script = tmp_path / "absl_main.py"
    script.write_text(LEAVE_TOGETHER + textwrap.dedent('''\
        import os
        from absl import app, flags
        import tensorflow as tf

        flags.DEFINE_string("out", None, "where to write")
        flags.DEFINE_integer("steps", 1, "steps")
        FLAGS = flags.FLAGS


        def main(argv):
            strategy = tf.distribute.MultiWorkerMirroredStrategy()
            total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
            leave_together(strategy, FLAGS.out)
            with open(os.path.join(FLAGS.out, f"{strategy.cluster_resolver.task_id}"), "w") as f:
                f.write(f"{FLAGS.steps} {float(total)} {argv[1:]}")


        if __name__ == "__main__":
            app.run(main)
    '''))
    result = mwms_cluster.run_script(script, [f"--out={tmp_path}", "--steps=7", "extra"],
                                     timeout=30)
    result.assert_completed()
    n = mwms_cluster.num_workers
    assert [(tmp_path / str(i)).read_text() for i in range(n)] == [f"7 {float(n)} ['extra']"] * n


@pytest.mark.timeout(90)
def test_nonzero_exit_status_crashes(mwms_cluster, train_py):
    path, out = train_py
    result = mwms_cluster.run_script(path, ["--out", str(out), "--end", "exit3_on_1"],
                                     timeout=30)
    result.assert_crashed(culprits=[1])
    assert result.workers[1].exit_code == 3
    assert result.workers[0].exit_code == 0 and result.workers[0].returned


@pytest.mark.timeout(90)
def test_uncaught_exception_fails_with_its_type(mwms_cluster, train_py):
    path, out = train_py
    result = mwms_cluster.run_script(path, ["--out", str(out), "--end", "raise_on_1"],
                                     timeout=30)
    result.assert_failed(culprits=[1], error="ValueError")
    exc = result.workers[1].exception
    assert exc.type_name == "ValueError" and "bad batch" in exc.message
    assert str(result.workers[1].exception.traceback).count("train.py") >= 1


@pytest.mark.timeout(90)
def test_faults_act_at_the_scripts_steps(mwms_cluster, train_py):
    path, out = train_py
    argv = ["--out", str(out), "--steps", "6", "--harness-steps"]
    result = mwms_cluster.run_script(path, argv, faults=[Crash(worker=1, step=3)],
                                     timeout=30, grace=1)
    result.assert_crashed(culprits=[1])
    assert result.workers[1].last_step == 3


@pytest.mark.timeout(90)
def test_module_form_runs_like_python_dash_m(mwms_cluster, tmp_path, monkeypatch):
    pkg = tmp_path / "proj" / "trainer"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "config.py").write_text("STEPS = 3\n")
    (pkg / "task.py").write_text(LEAVE_TOGETHER + textwrap.dedent('''\
        import argparse, json, os, sys
        import tensorflow as tf
        from . import config            # a relative import: it runs inside its package

        parser = argparse.ArgumentParser()
        parser.add_argument("--out")
        args = parser.parse_args()
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        total = 0.0
        for _ in range(config.STEPS):
            one = strategy.run(lambda: tf.constant(1.0))
            total += float(strategy.reduce("SUM", one, axis=None))
        leave_together(strategy, args.out)
        task_id = strategy.cluster_resolver.task_id
        with open(os.path.join(args.out, f"worker-{task_id}.json"), "w") as f:
            json.dump({"name": __name__, "package": __package__, "argv": sys.argv,
                       "path0": sys.path[0], "total": total}, f)
    '''))
    (pkg / "__main__.py").write_text("from trainer import task  # noqa\n")
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.chdir(tmp_path / "proj")   # `python -m` finds the package in the current directory
    n = mwms_cluster.num_workers
    result = mwms_cluster.run_script(module="trainer.task", argv=["--out", str(out)], timeout=30)
    result.assert_completed()
    for s in _written(out, n):
        assert (s["name"], s["package"]) == ("__main__", "trainer")
        assert s["argv"] == [str(pkg / "task.py"), "--out", str(out)]
        assert s["path0"] == str(tmp_path / "proj")
        assert s["total"] == 3.0 * n
    # A package runs its __main__, as `python -m trainer` does.
    for f in out.iterdir():
        f.unlink()
    mwms_cluster.run_script(module="trainer", argv=["--out", str(out)], timeout=30) \
        .assert_completed()
    assert len(list(out.iterdir())) == n


@pytest.fixture
def no_launch(mwms_cluster, monkeypatch):
    """A cluster whose launcher fails the test if any process is started."""
    def start(specs):
        raise AssertionError("a worker was started")
    monkeypatch.setattr(mwms_cluster.launcher, "start", start)
    return mwms_cluster


@pytest.mark.timeout(30)
@pytest.mark.parametrize("call, words", [
    (lambda c, d: c.run_script(d / "missing.py"), "no such file"),
    (lambda c, d: c.run_script(d), "is not a file"),
    (lambda c, d: c.run_script(d / "ok.py", "--epochs 2"), "list of str"),
    (lambda c, d: c.run_script(d / "ok.py", ["--epochs", 2]), "must be a str"),
    (lambda c, d: c.run_script(d / "ok.py", module="ok"), "exactly one"),
    (lambda c, d: c.run_script(), "exactly one"),
    (lambda c, d: c.run_script(module="no_such_module_here.train"), "no module named"),
    (lambda c, d: c.run_script(module="ok.sub"), "is a module, not a package"),
    (lambda c, d: c.run_script(module="pkg"), "no __main__"),
    (lambda c, d: c.run_script(module="not a name"), "not a dotted module name"),
], ids=["missing", "directory", "argv-str", "argv-int", "both", "neither", "no-module",
        "not-package", "no-main", "bad-name"])
def test_bad_script_arguments_are_clear_errors_before_any_process(no_launch, tmp_path,
                                                                    monkeypatch, call, words):
    (tmp_path / "ok.py").write_text("raise SystemExit('must not run')\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("raise SystemExit('must not be imported')\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SettingError, match=words):
        call(no_launch, tmp_path)
    assert no_launch.runs == []


@pytest.mark.timeout(30)
def test_import_time_env_is_refused_under_forkserver(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("pass\n")
    cluster = Cluster(RunSettings(workers=2, start_method="forkserver"))
    # A value the forkserver was not started with (its environment is read
    # from /proc when it runs; else it will start with the parent's).
    level = "1" if os.environ.get("TF_CPP_MIN_LOG_LEVEL") != "1" else "2"

    def start(specs):
        raise AssertionError("a worker was started")
    cluster.launcher.start = start
    with pytest.raises(SettingError) as e:
        cluster.run_script(script, env={"TF_CPP_MIN_LOG_LEVEL": level})
    text = str(e.value)
    assert "TF_CPP_MIN_LOG_LEVEL" in text and "--mwms-start-method=spawn" in text
    assert cluster.runs == []
    # Read after import (first tf.keras use, first op): not refused.
    for fine in ({"TF_USE_LEGACY_KERAS": "1"}, {"TF_NUM_INTRAOP_THREADS": "1"}, None):
        check_import_time_env(fine, "forkserver")
    # Spawn imports TensorFlow in each worker, after the environment is set.
    for name in IMPORT_TIME_ENV:
        check_import_time_env({name: "x"}, "spawn")
    script_main(script, env={"TF_CPP_MIN_LOG_LEVEL": level}, start_method="spawn")


@pytest.mark.timeout(150)
def test_import_time_env_is_ignored_when_forked_and_honoured_when_spawned(tmp_path):
    """Why the refusal above: TF_ENABLE_ONEDNN_OPTS=0 set in a forked
    worker leaves oneDNN as the forkserver's import decided; under spawn
    the same script sees it off."""
    def onednn_after_setting_it_off():
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"   # what env= does before fn runs
        from tensorflow.python.util import _pywrap_util_port
        return bool(_pywrap_util_port.IsMklEnabled())

    if os.environ.get("TF_ENABLE_ONEDNN_OPTS") is not None:
        pytest.skip("TF_ENABLE_ONEDNN_OPTS is set in this environment")
    forked = Cluster(RunSettings(workers=1, start_method="forkserver", timeout=60))
    result = forked.run(onednn_after_setting_it_off).assert_completed()
    if result.return_values != [True]:
        pytest.skip("oneDNN is off by default on this platform: nothing to tell apart")
    script = tmp_path / "onednn.py"
    script.write_text(textwrap.dedent('''\
        import sys
        from tensorflow.python.util import _pywrap_util_port
        open(sys.argv[1], "w").write(str(_pywrap_util_port.IsMklEnabled()))
    '''))
    spawned = Cluster(RunSettings(workers=1, start_method="spawn", timeout=60))
    spawned.run_script(script, [str(tmp_path / "seen")],
                       env={"TF_ENABLE_ONEDNN_OPTS": "0"}).assert_completed()
    assert (tmp_path / "seen").read_text() == "False"


def test_script_main_is_a_plain_callable(tmp_path, monkeypatch):
    """In-process, no worker: exit statuses, and sys.argv / sys.path / cwd restored."""
    script = tmp_path / "s.py"
    script.write_text("import sys\nsys.exit(int(sys.argv[1]) if sys.argv[1:] else None)\n")
    before = (list(sys.argv), list(sys.path), os.getcwd())
    assert ScriptMain(path=str(script), cwd=str(tmp_path))() is None
    assert ScriptMain(path=str(script), argv=("0",), cwd=str(tmp_path))() is None
    with pytest.raises(SystemExit) as e:
        ScriptMain(path=str(script), argv=("4",), cwd=str(tmp_path))()
    assert e.value.code == 4
    assert (list(sys.argv), list(sys.path), os.getcwd()) == before


# The user-code twin of a skipped step, in a script: worker 1 runs one call
# of its all-reducing step fewer, so its script ends first.
SKIP_ONE_PY = textwrap.dedent('''\
    import argparse

    import tensorflow as tf

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    steps = parser.parse_args().steps

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task_index = strategy.cluster_resolver.task_id
    with strategy.scope():
        w = tf.Variable(1.0)


    @tf.function
    def train_step():
        return strategy.reduce("SUM", strategy.run(lambda: w * 2.0), axis=None)


    if task_index == 1:
        steps -= 1       # the bug: worker 1 runs one step fewer
    for _ in range(steps):
        train_step()
''')


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n", [pytest.param(n, marks=pytest.mark.mwms(workers=n))
                               for n in (2, 3, 4)])
def test_a_script_that_ends_early_is_named_as_the_worker_that_left(mwms_cluster, tmp_path, n):
    """run_script's default is on_return="exit": worker 1's script ends
    after 3 calls of `train_step` and its process exits, while the others
    need it in call 4.  TensorFlow 2.21, measured: the worker that receives
    from it fails at once (UnavailableError, "Connection reset by peer"),
    the others after the coordination service's 10 s heartbeat timeout
    (UnavailableError, "tasks are unhealthy").  Worker 1 is named, alone;
    the workers that failed because it left are not."""
    path = tmp_path / "skip_one.py"
    path.write_text(SKIP_ONE_PY)
    result = mwms_cluster.run_script(path, ["--steps", "4"], timeout=30, grace=20)
    result.assert_failed(culprits=[1])
    result.assert_culprit(1)
    assert result.verdict.rule == "left_early"
    assert result.workers[1].returned and result.workers[1].exit_code == 0
    stayed = [w for w in result.workers if w.index != 1]
    assert all(w.exception is not None and w.exception.type_name.endswith("UnavailableError")
               for w in stayed)
    others = ",".join(str(w.index) for w in stayed)
    assert result.diagnosis.startswith(
        f"FAILED: worker 1 returned and its process ended after 3 calls of `train_step`; "
        f"worker{'s' if n > 2 else ''} {others} then failed in call 4 with UnavailableError; "
        f"culprit: worker 1 (it left while they still needed it in a collective"), \
        result.diagnosis


# Ends cleanly, then an atexit handler ends the process on worker 0.
AT_EXIT_PY = LEAVE_TOGETHER + textwrap.dedent('''\
    import atexit
    import os
    import signal
    import sys

    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = tf.Variable(1.0)


    @tf.function
    def train_step():
        return strategy.reduce("SUM", strategy.run(lambda: w * 2.0), axis=None)


    for _ in range(3):
        train_step()
    leave_together(strategy, sys.argv[2])
    if strategy.cluster_resolver.task_id == 0:
        if sys.argv[1] == "abort":
            atexit.register(lambda: os.kill(os.getpid(), signal.SIGABRT))
        else:
            atexit.register(lambda: os._exit(3))
''')


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how, code", [("abort", -6), ("exit3", 3)])
def test_a_script_that_dies_at_exit_after_training_crashed_at_exit(mwms_cluster, tmp_path,
                                                                   how, code):
    """Every worker's script ran to its end; worker 0's atexit handler then
    kills its process (SIGABRT, the signal of tensorflow#56684's abort) or
    exits 3.  Training completed, and a cluster manager sees a failed job:
    the run is crashed_at_exit, naming worker 0 and saying both."""
    path = tmp_path / "at_exit.py"
    path.write_text(AT_EXIT_PY)
    result = mwms_cluster.run_script(path, [how, str(tmp_path)], timeout=30)
    result.assert_crashed_at_exit(culprits=[0])
    assert result.verdict.rule == "died_at_exit"
    assert all(w.returned for w in result.workers)
    assert result.workers[0].exit_code == code
    assert all(w.exit_code == 0 for w in result.workers[1:])
    assert result.diagnosis.startswith(
        f"CRASHED_AT_EXIT: training completed (all {len(result.workers)} workers returned "
        f"their values), then worker 0 died at exit ("), result.diagnosis
    assert "worker 0: returned, then died at exit" in result.diagnosis
    assert f"--- worker 0 (exit code {code})" in result.report()   # its log tail


@pytest.mark.timeout(90)
def test_run_keeps_a_returned_worker_so_its_atexit_handlers_never_run(mwms_cluster):
    """run(fn) keeps on_return="stay": a worker whose fn returned stays in
    the cluster until the run is decided and is then released, and its
    process ends without running the atexit handlers fn registered."""
    def train():
        import atexit
        import os
        import signal

        import tensorflow as tf
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            w = tf.Variable(1.0)
        atexit.register(lambda: os.kill(os.getpid(), signal.SIGABRT))
        return float(strategy.reduce("SUM", strategy.run(lambda: w * 2.0), axis=None))

    result = mwms_cluster.run(train, timeout=30)
    result.assert_completed()
    assert all(w.exit_code == 0 for w in result.workers)
    assert result.return_values == [2.0 * len(result.workers)] * len(result.workers)
