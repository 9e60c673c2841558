"""The core against real TensorFlow workers: completion, errors, crashes,
hangs, logs, stacks, cleanup."""
import os
import signal
import time

import pytest

import harness
from harness.errors import SerializationError
from helpers import allreduce_steps

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_leftover_workers")]




def _trainer(fail_worker=None, how=None, at_step=3, steps=10):
    """A closure (defined per test) that misbehaves on one worker at one step."""
    def train():
        import tensorflow as tf
        ctx = harness.context()
        strategy = tf.distribute.MultiWorkerMirroredStrategy()

        @tf.function
        def step():
            return strategy.reduce(tf.distribute.ReduceOp.SUM,
                                   strategy.run(lambda: tf.constant(1.0)), axis=None)

        for k in ctx.steps(steps):
            if ctx.index == fail_worker and k == at_step:
                if how == "raise":
                    raise ValueError(f"worker {ctx.index} broke at step {k}")
                if how == "exit3":
                    os._exit(3)
                if how == "sigkill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if how == "block":
                    # One all-reduce nobody else joins: blocked forever in C++.
                    step()
            step()
        return ctx.index
    return train


def test_completes_with_a_value_per_worker(mwms_cluster):
    result = mwms_cluster.run(allreduce_steps, args=(20,))
    result.assert_completed()
    n = mwms_cluster.num_workers
    assert result.return_values == [float(n)] * n
    assert [w.last_step for w in result.workers] == [19] * n
    assert [w.exit_code for w in result.workers] == [0] * n
    assert result.culprits == ()


def test_allreduce_loop_that_ran_no_step_returns_zero(mwms_cluster):
    from harness.workloads import allreduce_loop
    result = mwms_cluster.run(allreduce_loop, args=(0,))
    result.assert_completed()
    assert result.return_values == [0.0] * mwms_cluster.num_workers


def _writes_at_every_level():
    import sys

    import tensorflow as tf
    print("from print")
    os.write(1, b"from fd 1\n")
    os.write(2, b"from fd 2\n")
    # C++ writing to its own stderr: unlike TensorFlow's logging, nothing in
    # the environment (TF_CPP_MIN_LOG_LEVEL) silences it.
    tf.print("from TensorFlow's C++", output_stream=sys.stderr)
    return harness.context().index


def test_output_at_fd_level_reaches_the_log(mwms_cluster):
    """fds 1 and 2 are captured, so what C++ code writes reaches the log.

    Not checked with TensorFlow's own INFO logging ("Started server with
    target"): the caller's TF_CPP_MIN_LOG_LEVEL silences that, and under the
    forkserver neither ``run(env=...)`` nor monkeypatch can lift it (the
    level is read once, when the forkserver imports TensorFlow).
    ``test_spawn_start_method`` checks TensorFlow's logging itself.
    """
    result = mwms_cluster.run(_writes_at_every_level).assert_completed()
    for w in result.workers:
        for line in ("from print", "from fd 1", "from fd 2", "from TensorFlow's C++"):
            assert line in w.log, (line, w.log)


def test_lambda_closure_and_two_runs_in_one_test(mwms_cluster):
    parent_tf_config = os.environ.get("TF_CONFIG")  # the caller may have one of its own
    offset = 10
    first = mwms_cluster.run(lambda: harness.context().index + offset)
    second = mwms_cluster.run(lambda: harness.context().tf_config)
    first.assert_completed()
    second.assert_completed()
    n = mwms_cluster.num_workers
    assert first.return_values == [offset + i for i in range(n)]
    ports = [c["cluster"]["worker"] for c in second.return_values]
    assert all(p == ports[0] for p in ports) and len(ports[0]) == n
    assert [c["task"]["index"] for c in second.return_values] == list(range(n))
    assert os.environ.get("TF_CONFIG") == parent_tf_config  # the parent's is untouched


def test_context_outside_a_worker_is_a_clear_error():
    with pytest.raises(harness.NotInWorkerError, match="only available inside"):
        harness.context()


def test_context_attributes(mwms_cluster):
    def describe():
        ctx = harness.context()
        return (ctx.index, ctx.num_workers, ctx.is_chief, os.environ["CUDA_VISIBLE_DEVICES"])
    result = mwms_cluster.run(describe).assert_completed()
    n = mwms_cluster.num_workers
    assert result.return_values == [(i, n, i == 0, "-1") for i in range(n)]


def test_worker_that_raises_is_failed_with_index_and_type(mwms_cluster):
    last = mwms_cluster.num_workers - 1
    result = mwms_cluster.run(_trainer(last, "raise"), timeout=20, grace=2)
    assert result.outcome == "failed", result.report()
    assert last in result.culprits
    assert f"worker {last}" in result.diagnosis and "ValueError" in result.diagnosis
    exc = result.workers[last].exception
    assert exc.type_name == "ValueError" and "broke at step 3" in exc.message
    assert "Traceback" in exc.traceback and "train" in exc.traceback
    assert result.workers[last].last_step == 3
    with pytest.raises(AssertionError, match="expected outcome 'completed'") as e:
        result.assert_completed()
    assert "ValueError" in str(e.value)  # the message carries the diagnosis and log tail


@pytest.mark.parametrize("how,code", [("exit3", 3), ("sigkill", -signal.SIGKILL)])
def test_worker_that_dies_is_crashed(mwms_cluster, how, code):
    result = mwms_cluster.run(_trainer(0, how), timeout=20, grace=1)
    assert result.outcome == "crashed", result.report()
    assert result.workers[0].exit_code == code
    assert 0 in result.culprits
    assert result.workers[0].last_step == 3


def test_blocked_worker_is_a_hang_within_timeout_with_stack(mwms_cluster):
    timeout = 3.0
    t0 = time.monotonic()
    result = mwms_cluster.run(_trainer(0, "block", at_step=2, steps=5), timeout=timeout)
    elapsed = time.monotonic() - t0
    assert result.outcome == "hang", result.report()
    # Every other worker finished; worker 0 blocked in its extra all-reduce.
    stack = result.workers[0].stack
    assert "in train" in stack and "test_cluster.py" in stack, stack
    assert result.workers[0].exit_code == -signal.SIGKILL
    # Reported within timeout + 1 s of the last progress (generous bound here;
    # the benchmark prints the exact figure).
    last_progress = max(e.time for w in result.observation.workers for e in w.events)
    finishes = [w.finish_time for w in result.observation.workers if w.finish_time]
    last_progress = max([last_progress] + finishes)
    assert result.duration - last_progress < timeout + 1.0
    assert elapsed < 60


def test_unserializable_fn_fails_before_any_process(mwms_cluster):
    numbers = (i for i in range(3))  # dill cannot pickle a live generator
    with pytest.raises(SerializationError, match="cannot serialize"):
        mwms_cluster.run(lambda: next(numbers))


def test_unserializable_return_value_is_failed(mwms_cluster):
    def give_generator():
        return (i for i in range(3))
    result = mwms_cluster.run(give_generator)
    assert result.outcome == "failed"
    assert "cannot be sent to the parent" in result.workers[0].exception.message


def test_bad_fault_plan_rejected_before_start(mwms_cluster):
    with pytest.raises(harness.faults.FaultError, match="worker 7 does not exist"):
        mwms_cluster.run(allreduce_steps, faults=[harness.faults.Crash(7, 1)])


def test_spawn_start_method(mwms_cluster):
    """The fallback (and the GPU default): a fresh interpreter per worker.

    A spawned worker imports TensorFlow after ``env`` is applied, so
    ``TF_CPP_MIN_LOG_LEVEL=0`` there shows TensorFlow's C++ INFO logging
    reaching the log whatever the caller's environment says.
    """
    from harness.controller import Cluster
    cluster = Cluster(mwms_cluster.settings.with_overrides(start_method="spawn"))
    result = cluster.run(allreduce_steps, args=(5,), timeout=60,
                         env={"TF_CPP_MIN_LOG_LEVEL": "0"})
    result.assert_completed()
    n = cluster.num_workers
    assert result.return_values == [float(n)] * n
    assert "Started server with target: grpc://127.0.0.1:" in result.workers[0].log


def told_gpus_and_sum():
    """What the worker was told to see, and a two-step all-reduce."""
    return os.environ["CUDA_VISIBLE_DEVICES"], allreduce_steps(2)


@pytest.mark.parametrize("devices,told", [("gpu", ["3", "5"]), ("gpu-shared", ["3,5", "3,5"]),
                                          ("cpu", ["-1", "-1"])])
def test_each_worker_is_told_the_gpus_its_device_mode_gives(mwms_cluster, monkeypatch,
                                                            devices, told):
    """Forked from a server that hides every GPU, each worker still gets
    its own ``CUDA_VISIBLE_DEVICES``.  Here no GPU stands behind the ids:
    TensorFlow finds none and computes on the CPU (tests/gpu runs on GPUs)."""
    from harness.controller import Cluster
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    cluster = Cluster(mwms_cluster.settings.with_overrides(workers=2, devices=devices))
    result = cluster.run(told_gpus_and_sum).assert_completed()
    assert result.return_values == [(share, 2.0) for share in told]


def test_env_reaches_the_workers_only(mwms_cluster):
    result = mwms_cluster.run(lambda: os.environ.get("MWMS_TEST_FLAG"), env={"MWMS_TEST_FLAG": "on"})
    assert result.assert_completed().return_values == ["on"] * mwms_cluster.num_workers
    assert "MWMS_TEST_FLAG" not in os.environ
    with pytest.raises(ValueError, match="no TF_CONFIG"):
        mwms_cluster.run(lambda: 1, env={"TF_CONFIG": "{}"})


def test_unbounded_steps(mwms_cluster):
    def loop():
        ctx = harness.context()
        # The data first: when it runs out, no further boundary is reported.
        return [k for _, k in zip(range(4), ctx.steps())]
    result = mwms_cluster.run(loop).assert_completed()
    assert result.return_values == [[0, 1, 2, 3]] * mwms_cluster.num_workers
    assert [w.last_step for w in result.workers] == [3] * mwms_cluster.num_workers
    assert result.ambiguous is False


@pytest.mark.timeout(120)
def test_a_fault_that_never_acts_fails_the_run_and_says_why(mwms_cluster):
    from harness.faults import Crash, Delay
    from harness.workloads import allreduce_loop
    result = mwms_cluster.run(allreduce_loop, args=(3,), timeout=30,
                              faults=[Crash(1, 5), Delay(0, 1, 0.1)])
    assert result.outcome == "failed"
    first = result.diagnosis.splitlines()[0]
    assert first == ("FAILED: Crash(worker=1, step=5, how='exit') never acted: worker 1 never "
                     "reached step 5: its last step was 2")
    assert [f for f, _ in result.faults_never_acted] == ["Crash(worker=1, step=5, how='exit')"]
    with pytest.raises(AssertionError, match="never acted"):
        result.assert_completed()
    # A function with no steps at all is told how to get them.
    nothing = mwms_cluster.run(lambda: 1, faults=[Crash(0, 0)], timeout=30)
    assert nothing.outcome == "failed" and "it reported no steps; use ctx.steps()" in \
        nothing.diagnosis


@pytest.mark.timeout(120)
def test_a_fault_left_behind_by_an_earlier_crash_is_listed_not_failed(mwms_cluster):
    from harness.faults import Crash, Delay
    from harness.workloads import allreduce_loop
    result = mwms_cluster.run(allreduce_loop, args=(8,), timeout=30, grace=2,
                              faults=[Crash(1, 2), Delay(0, 6, 0.1)])
    assert result.outcome == "crashed" and result.faults_never_acted == ()
    assert "not acted: Delay(worker=0, step=6, seconds=0.1): did not act (the run ended first)" \
        in result.diagnosis


def test_a_run_says_where_its_time_went(mwms_cluster):
    """RunResult.phases: the parent's steps and the workers' (start,
    strategy, steps, the wait) add up to the whole call."""
    began = time.monotonic()
    result = mwms_cluster.run(allreduce_steps, args=(5,))
    wall = time.monotonic() - began
    result.assert_completed()
    phases = result.phases
    assert list(phases) == ["request", "setup", "launch", "start", "strategy", "steps",
                            "wait: finish", "stacks", "teardown", "diagnosis", "cleanup"]
    assert all(seconds >= 0 for seconds in phases.values())
    assert phases["strategy"] > 0 and phases["steps"] > 0
    assert wall - 0.05 <= sum(phases.values()) <= wall
