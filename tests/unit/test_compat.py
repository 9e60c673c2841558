"""harness.compat without TensorFlow's workers: cluster specs, what join()
makes of a result, output lines, errors, and the runner's refusals."""
import threading
import types
import unittest

import pytest

from harness.compat import multi_process_runner as mpr
from harness.compat import multi_worker_test_base as mwtb
from harness.compat import spec, verdict
from harness.compat.runner import light_testcases
from harness.core import serialize
from harness.core.protocol import WorkerError

pytestmark = pytest.mark.timeout(30)


def _worker(index, returned=True, exception=None, exit_code=0, value=None, attempts=(),
            died_at_exit=False):
    return types.SimpleNamespace(index=index, returned=returned, exception=exception,
                                 exit_code=exit_code, return_value=value, log="",
                                 attempts=attempts, attempt=len(attempts) and len(attempts) - 1,
                                 died_at_exit=died_at_exit)


def _result(outcome, workers, culprits=(), ended_by="all_finished"):
    return types.SimpleNamespace(outcome=outcome, workers=tuple(workers), culprits=tuple(culprits),
                                 observation=types.SimpleNamespace(ended_by=ended_by),
                                 diagnosis="VERDICT", attempt=0, attempts=())


def _error(kind="ValueError", message="boom"):
    return WorkerError(kind, message, "Traceback ...")


# -- cluster specs ------------------------------------------------------------

def test_create_cluster_spec_has_tensorflows_shape_and_free_ports():
    cs = mwtb.create_cluster_spec(has_chief=True, num_workers=3, num_ps=2, has_eval=True)
    assert [len(cs[k]) for k in ("chief", "worker", "ps", "evaluator")] == [1, 3, 2, 1]
    addresses = [a for v in cs.values() for a in v]
    assert len(set(addresses)) == 7 and all(a.startswith("localhost:") for a in addresses)
    assert mpr.create_cluster_spec(num_workers=2).keys() == {"worker"}


@pytest.fixture(params=[True, False], ids=["shapes", "workers-only"])
def shapes(request, monkeypatch):
    """Whether the harness's settings take a cluster shape: both ways."""
    monkeypatch.setattr(spec, "shapes_supported", lambda: request.param)
    return request.param


def test_workers_only_map_and_other_types_are_refused_by_name(shapes):
    assert spec.num_workers({"worker": ["a", "b", "c"]}) == 3
    assert spec.num_workers({"worker": ["a"], "ps": []}) == 1
    refused = (("master", "'master'"),) + (() if shapes else (("ps", "'ps' tasks"),))
    for task, word in refused:
        with pytest.raises(mpr.UnsupportedClusterError, match=word) as e:
            spec.num_workers({"worker": ["a"], task: ["b"]})
        assert isinstance(e.value, NotImplementedError)
    if shapes:   # a parameter server runs fn, as every task of TensorFlow's runner
        assert spec.num_workers({"worker": ["a"], "ps": ["b", "c"]}) == 3
    with pytest.raises(ValueError, match="at most one chief"):
        spec.num_workers({"chief": ["a", "b"], "worker": ["c"]})
    with pytest.raises(ValueError, match="at most one evaluator"):
        spec.num_workers({"worker": ["c"], "evaluator": ["a", "b"]})
    with pytest.raises(ValueError, match="no 'chief' or 'worker'"):
        spec.num_workers({})


def test_a_chief_and_an_evaluator_map_in_mwms_order_where_the_settings_take_shapes(shapes):
    cs = mwtb.create_cluster_spec(has_chief=True, num_workers=2, has_eval=True)
    if not shapes:
        for task in ("chief", "evaluator"):
            with pytest.raises(mpr.UnsupportedClusterError, match=task):
                spec.shape({"worker": ["a"], task: ["b"]})
        return
    counts = spec.shape(cs)
    assert counts == {"chief": 1, "worker": 2, "evaluator": 1, "ps": 0}
    order = spec.tasks(counts)
    assert order == (("chief", 0), ("worker", 0), ("worker", 1), ("evaluator", 0))
    assert spec.check_task("worker", 1, order) == 2
    assert spec.check_task("evaluator", 0, order) == 3
    with pytest.raises(ValueError, match="chief-1 is not a task"):
        spec.check_task("chief", 1, order)
    assert spec.num_workers({"chief": ["a"]}) == 1


def test_a_task_finds_its_index_in_the_runners_order():
    import json
    import os
    from harness.compat import task
    order = (("chief", 0), ("worker", 0), ("worker", 1))
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {}, "task": {"type": "worker", "index": 1}})
    try:
        assert task.task_index(order) == 2 and task.task_index() == 1
    finally:
        del os.environ["TF_CONFIG"]


def test_a_runner_checks_its_spec_and_fn_before_any_process_starts():
    with pytest.raises(mpr.UnsupportedClusterError):
        mpr.MultiProcessRunner(lambda: None, {"worker": ["a"], "master": ["b"]})
    with pytest.raises(ValueError, match="not a callable"):
        mpr.MultiProcessRunner(3, {"worker": ["a"]})
    with pytest.raises(mpr.UnsupportedClusterError):
        mpr.MultiProcessPoolRunner({"master": ["a"], "worker": ["b"]})


# -- what join() makes of a result --------------------------------------------

def test_completed_is_ok_and_return_values_skip_none_in_task_order():
    r = _result("completed", [_worker(0, value=1.0), _worker(1), _worker(2, value=3.0)])
    assert verdict.decide(r) == ("ok", None)
    assert verdict.return_values(r) == [1.0, 3.0]


def test_a_raised_error_comes_first_the_culprits_before_the_others():
    workers = [_worker(0, returned=False, exception=_error(), exit_code=1),
               _worker(1, returned=False, exit_code=1),
               _worker(2, returned=False, exception=_error(), exit_code=1)]
    assert verdict.decide(_result("crashed", workers, culprits=(1,))) == ("raise", 0)
    assert verdict.decide(_result("failed", workers, culprits=(2,))) == ("raise", 2)


def test_a_hang_or_a_peer_held_past_its_grace_is_a_timeout():
    held = [_worker(0, returned=False, exit_code=-9), _worker(1, returned=False, exit_code=1)]
    assert verdict.decide(_result("hang", held, ended_by="hang")) == ("timeout", None)
    assert verdict.decide(_result("crashed", held, ended_by="grace_expired")) == ("timeout", None)


def test_an_exit_without_an_error_names_the_non_zero_code_first():
    workers = [_worker(0, returned=False, exit_code=-11), _worker(1, returned=False, exit_code=3)]
    r = _result("crashed", workers)
    assert verdict.decide(r) == ("exit", 1)
    r.workers[1].exit_code = 3
    assert "exited with exit code 3" in verdict.exit_text(r, 1)
    assert "died by signal 11" in verdict.exit_text(r, 0)


def test_a_task_that_returned_then_exited_non_zero_is_an_exit_and_a_signal_is_not():
    """TensorFlow's join() reads every exit status, and only a positive one fails it."""
    status = [_worker(0), _worker(1, exit_code=3, died_at_exit=True)]
    assert verdict.decide(_result("crashed_at_exit", status)) == ("exit", 1)
    assert verdict.decide(_result("crashed_at_exit", status), terminated={1}) == ("ok", None)
    signal = [_worker(0), _worker(1, exit_code=-6, died_at_exit=True)]
    assert verdict.decide(_result("crashed_at_exit", signal)) == ("ok", None)


def test_tasks_the_test_terminated_are_no_error():
    workers = [_worker(0), _worker(1, returned=False, exit_code=-9)]
    assert verdict.decide(_result("crashed", workers), terminated={1}) == ("ok", None)
    assert verdict.decide(_result("crashed", workers)) == ("exit", 1)
    # Ended by the harness at the test's asking: the verdict calls it a hang,
    # the test ended it, and every other task returned.
    assert verdict.decide(_result("hang", workers, ended_by="all_finished"),
                          terminated={1}) == ("ok", None)
    assert verdict.decide(_result("hang", workers, ended_by="all_finished")) == \
        ("timeout", None)


def test_a_task_s_last_status_is_its_last_process_that_returned_or_raised():
    """TensorFlow's runner keeps each task's last status: a task ended by
    the test (or by the chief's exit) after a process of it raised, raises
    (test_auto_restart_and_chief); one whose later process returned does not."""
    raised = _worker(1, returned=False, exception=_error(), exit_code=1)
    killed = _worker(1, returned=False, exit_code=-9)
    restarted_then_killed = _worker(1, returned=False, exit_code=-9, attempts=(raised, killed))
    r = _result("crashed", [_worker(0), restarted_then_killed])
    assert verdict.decide(r, terminated={1}) == ("raise", 1)
    assert verdict.last_raised(restarted_then_killed) is raised
    back = _worker(1, attempts=(raised, _worker(1)))
    assert verdict.last_raised(back) is None
    assert verdict.decide(_result("crashed", [_worker(0), back])) == ("ok", None)


# -- output and errors --------------------------------------------------------

def test_lines_are_prefixed_as_tensorflows_runner_prefixes_them():
    assert verdict.prefixed(0, "a\nb") == ["[worker-0]:    a\n", "[worker-0]:    b\n"]
    assert verdict.prefixed(12, "x")[0].startswith("[worker-12]:   x")
    r = _result("completed", [_worker(0), _worker(1)])
    r.workers[0].log, r.workers[1].log = "zero", "one\n"
    assert verdict.output_lines([r]) == ["[worker-0]:    zero\n", "[worker-1]:    one\n"]
    # a task started again: each of its processes' lines, in turn
    ended = types.SimpleNamespace(log="first")
    again = _worker(1, attempts=(ended, None))
    again.attempts = (ended, again)
    again.log = "second"
    r = _result("completed", [_worker(0), again])
    assert verdict.output_lines([r]) == ["[worker-1]:    first\n", "[worker-1]:    second\n"]


def test_the_verdict_opens_the_message_of_a_plain_and_an_op_error():
    e = verdict.with_verdict(ValueError("boom"), "FAILED: worker 1")
    assert str(e).startswith("FAILED: worker 1\n\nboom")

    class OpLike(Exception):
        def __init__(self, message):
            super().__init__()
            self._message = message

        def __str__(self):
            return self._message

    assert str(verdict.with_verdict(OpLike("peer gone"), "V")).startswith("V\n\npeer gone")
    assert str(verdict.with_verdict(RuntimeError(), "V")) == "V"


def test_the_tasks_own_exception_comes_back_else_one_from_the_record():
    exc = verdict.rebuild_exception(serialize.dumps(KeyError("k")), _error("KeyError", "k"))
    assert isinstance(exc, KeyError)
    assert isinstance(verdict.rebuild_exception(None, _error("ZeroDivisionError", "z")),
                      ZeroDivisionError)
    other = verdict.rebuild_exception(b"not a pickle", _error("tf.errors.Weird", "w"))
    assert type(other) is RuntimeError and "tf.errors.Weird: w" in str(other)
    assert verdict.status_of({1: (0, b"x")}, 1, 0) == b"x"
    assert verdict.status_of({1: (0, b"x")}, 1, 1) is None   # a stale attempt's


def test_the_runners_errors_carry_mpr_result():
    result = mpr.MultiProcessRunnerResult(return_value=[1], stdout=[])
    for cls in (mpr.SubprocessTimeoutError, mpr.UnexpectedSubprocessExitError):
        e = cls("msg", result)
        assert isinstance(e, RuntimeError) and e.mpr_result is result and str(e) == "msg"
    assert issubclass(mpr.OneTaskRestartError, NotImplementedError)


def test_a_testcase_travels_without_its_running_record():
    class Case(unittest.TestCase):
        def test_it(self):
            pass

    case = Case("test_it")
    case._outcome = types.SimpleNamespace(running=(x for x in ()))   # pickles with no pickler
    with pytest.raises(TypeError):
        serialize.dumps(case)
    with light_testcases():
        copy = serialize.loads(serialize.dumps(case))
    assert "_outcome" not in vars(copy) and copy._testMethodName == "test_it"
    assert "__getstate__" not in unittest.TestCase.__dict__


# -- the runner's own checks, before any process --------------------------------

def test_join_checks_its_timeout_and_refuses_a_cluster_not_wholly_asked_for():
    runner = mpr.MultiProcessRunner(lambda: None, {"worker": ["a", "b"]})
    with pytest.raises(ValueError, match="integer"):
        runner.join(timeout=1.5)
    runner = mpr.MultiProcessRunner(lambda: None, {"worker": ["a", "b"]})
    runner.start_single_process("worker", 1)
    assert runner.process_exists("worker", 1) and runner.get_process_id("worker", 1) is None
    with pytest.raises(ValueError, match="already started"):
        runner.start_single_process("worker", 1)
    with pytest.raises(mpr.OneTaskRestartError, match="worker-0 not started"):
        runner.join()
    with pytest.raises(ValueError, match="joined twice"):
        runner.join()


def test_join_on_a_cluster_that_never_ends_raises_timeout(monkeypatch):
    # The harness's run of the cluster did not end even after its tasks were
    # killed (a stand-in thread that never returns): join() times out as
    # TensorFlow's runner does, with no result to judge.
    from harness.compat import runner as runner_module
    monkeypatch.setattr(runner_module, "STOP_MARGIN_SEC", 0.1)
    runner = mpr.MultiProcessRunner(lambda: None, {"worker": ["a"]})
    stuck = threading.Event()
    inc = runner_module.Incarnation(runner._cluster, None, (), None)
    inc.thread = threading.Thread(target=stuck.wait, daemon=True)
    inc.started.set()
    runner._incarnations.append(inc)
    inc.thread.start()
    try:
        with pytest.raises(mpr.SubprocessTimeoutError, match="did not end") as e:
            runner.join(timeout=1)
    finally:
        stuck.set()
        inc.thread.join()
    assert e.value.run_result is None and e.value.mpr_result.return_value == []


def test_unsupported_calls_say_what_is_missing(shapes):
    runner = mpr.MultiProcessRunner(lambda: None, {"worker": ["a"]})
    with pytest.raises(NotImplementedError, match="worker process of its own"):
        runner.start_in_process_as("worker", 0)
    with pytest.raises(mpr.UnsupportedClusterError if not shapes else ValueError):
        runner.start_single_process("ps", 0)
    with pytest.raises(mpr.UnsupportedClusterError if not shapes else ValueError):
        runner.start_single_process("chief", 0)
    with pytest.raises(ValueError, match="worker-3"):
        runner.start_single_process("worker", 3)
    with pytest.raises(mpr.OneTaskRestartError, match="shape"):
        runner.start_single_process("worker", 0, cluster_spec={"worker": ["a", "b"]})
    with pytest.raises(KeyError):
        runner.get_process_exit_code("worker", 0)
    with pytest.raises(ValueError, match="main process"):
        mpr.get_barrier()


def test_tf_config_readers():
    import json
    import os
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": ["a", "b"]},
                                          "task": {"type": "worker", "index": 0}})
    try:
        assert mwtb.get_task_type() == "worker" and mwtb.get_task_index() == 0
        assert mwtb.is_chief() and mwtb.get_tf_config_cluster_spec() == {"worker": ["a", "b"]}
    finally:
        del os.environ["TF_CONFIG"]


@pytest.mark.parametrize("devices,share_gpu,runs_on", [
    ("cpu", True, "cpu"), ("cpu", False, "cpu"),
    ("gpu", True, "gpu-shared"), ("gpu-shared", False, "gpu")])
def test_share_gpu_chooses_how_workers_given_gpus_get_them(devices, share_gpu, runs_on):
    from harness.settings import RunSettings
    runner = mpr.MultiProcessRunner(lambda: None, {"worker": ["a", "b"]}, share_gpu=share_gpu,
                                    settings=RunSettings(devices=devices))
    assert runner._cluster.settings.devices == runs_on


def test_a_runner_with_a_chief_runs_that_shape_and_names_its_tasks_as_tensorflow_does():
    if not spec.shapes_supported():
        pytest.skip("the harness's settings take no cluster shape yet")
    runner = mpr.MultiProcessRunner(lambda: None, mwtb.create_cluster_spec(has_chief=True,
                                                                           num_workers=2))
    shape = runner._cluster.settings.shape
    assert (shape.chief, shape.worker, shape.evaluator) == (1, 2, 0)
    assert runner._names == ["chief-0", "worker-0", "worker-1"]
    runner.start_single_process("worker", 1)
    with pytest.raises(mpr.OneTaskRestartError, match="chief-0, worker-0 not started"):
        runner.join()
    assert verdict.prefixed(0, "hi", runner._names) == ["[chief-0]:     hi\n"]


# -- install(): TensorFlow's test utilities on the harness --------------------

def test_parameter_server_presets_run_and_a_multi_process_cluster_listens_at_its_spec():
    from harness.compat import routes
    ps = mwtb.create_cluster_spec(has_chief=True, num_workers=1, num_ps=2)
    assert routes.skip_reason(ps) is None
    # A MultiProcessCluster's test process connects to its servers at the
    # spec's addresses: its tasks list them, on the host's network.
    runner = routes.FOR_TEST_BASE.MultiProcessRunner(lambda: None, ps)
    assert runner._addresses == ps and runner._cluster.settings.network == "host"
    preset = routes.FOR_COMBINATIONS.MultiProcessRunner(lambda: None, ps)
    assert preset._addresses is None
    workers = routes.FOR_TEST_BASE.MultiProcessRunner(lambda: None, {"worker": ["a:1", "b:2"]})
    assert workers._addresses == {"worker": ["a:1", "b:2"]}
    # a cluster the harness does not run skips with the reason
    with pytest.raises(unittest.SkipTest, match="a 'controller' task"):
        routes.FOR_COMBINATIONS.MultiProcessRunner(lambda: None,
                                                   {"worker": ["a"], "controller": ["b"]})
    # anything else is the harness's runner, as combinations calls it
    assert isinstance(routes.FOR_COMBINATIONS.MultiProcessRunner(
        lambda: None, {"worker": ["a", "b"]}, share_gpu=False, args=(1,),
        dependence_on_chief=False), mpr.MultiProcessRunner)
    assert routes.FOR_COMBINATIONS.get_barrier is mpr.get_barrier


ABSL_UNDER_PYTEST = """
import sys
sys.argv = ["pytest", "-q", "-x", "-k", "not slow", "-n", "2", "--mwms-workers=3"]
from absl import flags
flags.DEFINE_string("tpu", "", "as TensorFlow's TPU tests define it")
IMPORT
flags.DEFINE_string("zone", "z", "defined after")
print(repr(flags.FLAGS.tpu), repr(flags.FLAGS.zone), sys.argv[1])
"""


@pytest.mark.parametrize("line", ["from harness.compat import multi_process_runner",
                                  "from harness.compat import multi_worker_test_base",
                                  "import harness.compat"])
def test_absls_flags_never_read_pytests_command_line(line):
    """TensorFlow's wrapper of absl's flags parses ``sys.argv`` when a flag is
    read unparsed (``combinations``' TPU check reads one): pytest's options
    there made absl raise UnrecognizedFlagError.  Importing the stand-ins
    (the drop-in by import) or the package (``install()``) marks the flags
    parsed at their defaults."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", ABSL_UNDER_PYTEST.replace("IMPORT", line)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["''", "'z'", "-q"]


ABSL_APP = """
import sys
sys.argv = ["job", "--zone=y"]
import harness.compat
from absl import app, flags
flags.DEFINE_string("zone", "z", "")
app.run(lambda argv: print(flags.FLAGS.zone))
"""


def test_absls_own_parse_still_reads_its_command_line():
    """``test_main()`` under ``__main__`` parses the command line through
    ``absl.app.run``, flags marked parsed or not."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", ABSL_APP], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["y"]


def test_the_packages_public_names_are_install_and_the_two_stand_ins():
    import harness.compat
    assert harness.compat.__all__ == ["install", "multi_process_runner",
                                      "multi_worker_test_base"]
    assert [getattr(harness.compat, name) for name in harness.compat.__all__] == [
        harness.compat.install, mpr, mwtb]
    with pytest.raises(AttributeError, match="routing"):
        harness.compat.routing
