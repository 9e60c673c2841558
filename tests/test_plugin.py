"""The plugin as a user meets it: options, marker, entry point, side-by-side runs."""
import re
import sys
import textwrap

import pytest

from harness.validators import max_workers

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("args,needle", [
    (["--mwms-workers=0"], "--mwms-workers: 0 is out of range"),
    (["--mwms-workers=-1"], "--mwms-workers: -1 is out of range"),
    (["--mwms-workers=abc"], "--mwms-workers: 'abc' is not a whole number"),
    (["--mwms-workers=1000"], f"1 to {max_workers()} workers"),
    (["--mwms-timeout=0"], "--mwms-timeout: 0 is out of range"),
    (["--mwms-timeout=-5"], "--mwms-timeout: -5 is out of range"),
    (["--mwms-timeout=soon"], "--mwms-timeout: 'soon' is not a number"),
    (["--mwms-grace=-1"], "--mwms-grace: -1 is out of range"),
    (["--mwms-timeout=1e308"], "--mwms-timeout: 1e+308 is out of range"),
    (["--mwms-devices=tpu"], "--mwms-devices: 'tpu' is not one of cpu, gpu"),
    (["--mwms-start-method=fork"], "--mwms-start-method: 'fork' is not one of forkserver, spawn"),
    (["--mwms-restarts=-1"], "--mwms-restarts: '-1' is not a number of restarts"),
    (["--mwms-restarts=twice"], "--mwms-restarts: 'twice' is not a number of restarts"),
])
def test_bad_option_is_a_usage_error(pytester, args, needle):
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert needle in result.stderr.str()
    assert "Traceback" not in result.stderr.str()


def test_bad_ini_value_is_a_usage_error(pytester):
    pytester.makeini("[pytest]\nmwms_workers = lots\n")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "ini mwms_workers: 'lots' is not a whole number" in result.stderr.str()


def test_a_state_dir_that_takes_no_files_is_a_usage_error_before_any_test(pytester):
    """``/proc``: its mode lets root in, yet no file can be created there."""
    pytester.makepyfile("def test_x(mwms_cluster): pass\ndef test_y(): pass\n")
    result = pytester.runpytest_subprocess("--mwms-state-dir=/proc")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "cannot use /proc" in err and "a file cannot be created in it" in err
    assert "The path comes from --mwms-state-dir" in err and "Traceback" not in err
    assert "passed" not in result.stdout.str()


def test_gpu_without_gpus_is_a_usage_error(pytester, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess("--mwms-devices=gpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "no GPU is visible" in result.stderr.str()


BAD_MARKER = """
    import pytest

    def test_before():
        pass

    @pytest.mark.mwms(workers=99)
    def test_too_many(mwms_cluster):
        pass

    @pytest.mark.mwms(wokers=3)
    def test_misspelt():
        pass

    def test_after():
        pass
"""


def test_a_bad_marker_fails_its_own_test_in_one_line_and_the_others_run(pytester):
    pytester.makepyfile(test_marked=BAD_MARKER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rE")
    result.assert_outcomes(passed=2, errors=2)
    out = result.stdout.str()
    limit = max_workers()
    # The error is the message alone: no traceback, no harness frames.
    for test, message in [
            ("test_too_many", f"@pytest.mark.mwms(workers=...): 99 is out of range; this "
                              f"machine holds 1 to {limit} workers"),
            ("test_misspelt", "@pytest.mark.mwms: unknown argument(s) wokers; allowed: ")]:
        section = out.split(f"ERROR at setup of {test} _", 1)[1].split("\n_", 1)[0]
        body = [line for line in section.split("=" * 10, 1)[0].splitlines()[1:] if line]
        assert len(body) == 1 and body[0].startswith(message), section
    assert "Traceback" not in out and "harness/" not in out
    # Deselected, the bad tests are never checked.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "before or after")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.OK


SIZES = """
    import pytest

    def replicas():
        import tensorflow as tf
        return tf.distribute.MultiWorkerMirroredStrategy().num_replicas_in_sync

    @pytest.mark.mwms(workers=[2, 3])
    def test_sizes(mwms_cluster):
        result = mwms_cluster.run(replicas).assert_completed()
        assert result.return_values == [mwms_cluster.num_workers] * mwms_cluster.num_workers
        print(f"ran at {mwms_cluster.num_workers}")

    @pytest.mark.mwms(workers=[])
    def test_empty(mwms_cluster):
        pass

    @pytest.mark.mwms(workers=[2, "three"])
    def test_not_a_number(mwms_cluster):
        pass

    @pytest.mark.mwms(workers=[2, 1000])
    def test_too_many(mwms_cluster):
        pass
"""


def test_a_list_of_workers_runs_the_test_once_per_size_and_a_bad_list_fails_its_test(pytester):
    pytester.makepyfile(test_sizes=SIZES)
    collected = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--collect-only", "-q")
    assert [line for line in collected.stdout.lines if "::" in line] == [
        "test_sizes.py::test_sizes[2workers]", "test_sizes.py::test_sizes[3workers]",
        "test_sizes.py::test_empty", "test_sizes.py::test_not_a_number",
        "test_sizes.py::test_too_many"]
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", "-rE")
    result.assert_outcomes(passed=2, errors=3)
    out = result.stdout.str()
    assert "ran at 2" in out and "ran at 3" in out
    for test, message in [("test_empty", "the list is empty"),
                          ("test_not_a_number", "'three' is not a whole number"),
                          ("test_too_many", "1000 is out of range")]:
        assert re.search(rf"ERROR at setup of {test} _+\n@pytest\.mark\.mwms\(workers=\.\.\.\): "
                         rf".*{re.escape(message)}", out), out
    only = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "3workers", "-s")
    only.assert_outcomes(passed=1)
    assert "ran at 3" in only.stdout.str() and "ran at 2" not in only.stdout.str()


def test_ini_option_and_marker_override(pytester):
    pytester.makeini("[pytest]\nmwms_workers = 3\nmwms_timeout = 7\nmwms_restarts = 2\n")
    pytester.makepyfile("""
        import pytest
        def test_ini(mwms_cluster):
            assert mwms_cluster.num_workers == 3
            assert mwms_cluster.settings.timeout == 7
            assert mwms_cluster.settings.restarts == 2
        @pytest.mark.mwms(workers=1, timeout=2.5, restarts=0)
        def test_marker(mwms_cluster):
            assert mwms_cluster.num_workers == 1
            assert mwms_cluster.settings.timeout == 2.5
            assert mwms_cluster.settings.restarts == 0
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_help_lists_options(pytester):
    result = pytester.runpytest_subprocess("--help")
    out = result.stdout.str()
    for option in ("--mwms-workers", "--mwms-timeout", "--mwms-grace", "--mwms-devices",
                   "--mwms-start-method"):
        assert option in out


def test_unrelated_project_gets_fixture_from_entry_point(pytester):
    """A project with no conftest of ours: the pytest11 entry point is enough."""
    pytester.makepyfile(test_their_training=textwrap.dedent("""
        import harness

        def train():
            import tensorflow as tf
            strategy = tf.distribute.MultiWorkerMirroredStrategy()
            return strategy.num_replicas_in_sync * 100 + harness.context().index

        def test_four_workers(mwms_cluster):
            result = mwms_cluster.run(train)
            result.assert_completed()
            assert result.return_values == [400, 401, 402, 403]
    """))
    assert not list(pytester.path.glob("conftest.py"))
    result = pytester.runpytest_subprocess("--mwms-workers=4", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


SIDE_BY_SIDE = """
import pytest
from helpers import allreduce_steps

@pytest.mark.parametrize("i", range(4))
def test_cluster(mwms_cluster, i):
    for _ in range(3):
        result = mwms_cluster.run(allreduce_steps, args=(5,), timeout=30)
        result.assert_completed()
"""


@pytest.mark.xdist_group("heavy")
def test_two_xdist_runs_side_by_side_do_not_collide(pytester):
    """Two ``pytest -n 2`` processes at once: 4 pytest workers, 24 clusters,
    each picking ports at the same time; none may collide."""
    import subprocess
    import os
    pytester.makepyfile(test_side=SIDE_BY_SIDE)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__))
    cmd = [sys.executable, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider",
           "test_side.py"]
    procs = [subprocess.Popen(cmd, cwd=pytester.path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=170)[0] for p in procs]
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, out
        assert "4 passed" in out, out


def test_preload_imports_in_the_forkserver_and_warns_of_what_it_could_not(pytester):
    pytester.makepyfile(threaded="""
        import threading, time
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    """, mymod="VALUE = 41\n")
    pytester.makeini("[pytest]\nmwms_preload = mymod, no_such_module_here, threaded\n")
    pytester.makepyfile(test_x="""
        import sys

        def uses_preloaded():
            # Imported by the forkserver, so already there when the worker runs.
            return "mymod" in sys.modules, __import__("mymod").VALUE + 1

        def test_runs(mwms_cluster):
            result = mwms_cluster.run(uses_preloaded, timeout=60).assert_completed()
            assert result.return_values == [(True, 42)] * mwms_cluster.num_workers
    """)
    result = pytester.runpytest_subprocess("-W", "default", "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert result.ret == 0, out
    assert "mwms_preload: no_such_module_here: ModuleNotFoundError" in out
    assert "mwms_preload: threaded: started a thread" in out


def test_preload_names_are_checked(pytester):
    pytester.makepyfile("def test_x(): pass")
    result = pytester.runpytest_subprocess("--mwms-preload=good, not-a-module")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--mwms-preload: 'not-a-module' is not a module name" in result.stderr.str()


REPORTED = textwrap.dedent("""
    from harness.faults import SkipStep
    from harness.workloads import variable_loop

    def test_hangs_unexpectedly(mwms_cluster):
        mwms_cluster.run(variable_loop, args=(8,), timeout=2,
                         faults=[SkipStep(1, 4)]).assert_completed()

    def test_expected_hang(mwms_cluster):
        mwms_cluster.run(variable_loop, args=(8,), timeout=2,
                         faults=[SkipStep(1, 4)]).assert_hang(culprits=[1])

    def test_completes(mwms_cluster):
        mwms_cluster.run(variable_loop, args=(8,)).assert_completed()

    def test_without_a_cluster():
        pass
""")


@pytest.mark.xdist_group("heavy")   # its inner run has two xdist processes of its own
@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["plain", "xdist"])
def test_reports_junit_properties_timelines_and_the_session_summary(pytester, xdist):
    """A failing test's traceback is the test's line and the diagnosis;
    logs are sections; timelines are written for the runs that did not
    complete; every test that ran a cluster carries its properties in
    JUnit; the session summary counts the runs, with and without xdist."""
    import re
    import xml.etree.ElementTree as ET
    pytester.makepyfile(test_reported=REPORTED)
    junit = pytester.path / "junit.xml"
    report_dir = pytester.path / "timelines"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tb=short", "-rA",
                                           f"--junitxml={junit}",
                                           f"--mwms-report-dir={report_dir}", *xdist)
    result.assert_outcomes(passed=3, failed=1)
    out = result.stdout.str()
    failure = out.split("_ test_hangs_unexpectedly _", 1)[1]
    assert re.search(r"test_reported\.py:\d+: in test_hangs_unexpectedly", failure)
    assert not re.search(r"harness/\w+\.py:\d+: in ", failure)    # no harness frames
    first_error = next(line for line in failure.splitlines() if line.startswith("E "))
    # The skipper returns, so the ledgers prove the hang before the timeout.
    assert first_error.startswith("E   AssertionError: HANG: certain deadlock (worker 1 "
                                  "returned after "), first_error
    assert "; culprit: worker 1" in first_error, first_error
    assert "mwms run: worker 0 log tail (exit code -9)" in failure
    assert "mwms run: worker 0 stack" in failure
    assert "expected outcome 'completed', got 'hang'" in failure
    assert "3 cluster runs: 1 completed, 0 failed, 0 crashed, 2 hang" in out
    assert "of the 2 that did not complete: 2 named exactly one culprit" in out
    assert f"timelines in {report_dir}" in out
    assert sorted(p.name for p in report_dir.iterdir()) == [
        "test_reported.py_test_expected_hang-run1.svg",
        "test_reported.py_test_expected_hang-run1.trace.json",
        "test_reported.py_test_hangs_unexpectedly-run1.svg",
        "test_reported.py_test_hangs_unexpectedly-run1.trace.json"]
    cases = {c.get("name"): {p.get("name"): p.get("value") for p in c.iter("property")}
             for c in ET.parse(junit).getroot().iter("testcase")}
    assert cases["test_without_a_cluster"] == {}
    assert cases["test_completes"]["mwms_outcome"] == "completed"
    for name in ("test_hangs_unexpectedly", "test_expected_hang"):
        props = cases[name]
        assert (props["mwms_outcome"], props["mwms_culprits"], props["mwms_step"],
                props["mwms_ambiguous"], props["mwms_workers"]) == ("hang", "1", "4", "false",
                                                                      "2")
        assert float(props["mwms_duration"]) > 0.0, props


def test_every_option_reaches_pytest_help(pytester):
    from harness.settings import OPTIONS
    result = pytester.runpytest_subprocess("--help")
    out = result.stdout.str()
    for option in OPTIONS:
        assert option.flag in out and option.ini in out


def test_a_setup_error_shows_the_test_s_line_and_the_error_not_the_harness_s_source(pytester):
    pytester.makepyfile("""
        from harness.faults import Crash

        def test_fault_on_a_missing_worker(mwms_cluster):
            mwms_cluster.run(print, faults=[Crash(5, 1)])

        def test_missing_script(mwms_cluster):
            mwms_cluster.run_script("/nonexistent/train.py")
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "0")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "E       harness.errors.FaultError: Crash(worker=5, step=1, how='exit'): worker 5" in out
    assert "E       harness.errors.SettingError: run_script: '/nonexistent/train.py'" in out
    assert "harness/controller" not in out and "harness/faults.py" not in out
