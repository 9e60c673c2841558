"""The GPU check's parts that need no GPU and no TensorFlow: its shell
script's arguments (run dry), its own arguments, the JUnit reading and the
summary."""
import os
import subprocess

import pytest

from harness.bench import gpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "harness", "bench", "gpu.sh")


def _script(*args):
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=60)


def test_the_script_installs_tensorflow_first_then_the_checkout_then_runs_the_check(tmp_path):
    done = _script("--dry-run", "--venv", str(tmp_path / "v"), "--", "--out", "r.json")
    assert done.returncode == 0, done.stderr
    commands = [line[2:] for line in done.stdout.splitlines() if line.startswith("+ ")]
    python = f"{tmp_path}/v/bin/python"
    assert commands == [
        f"python3 -m venv {tmp_path}/v",
        f"{python} -m pip install -q tensorflow[and-cuda]>=2.15,<2.22",
        f"{python} -m pip install -q -e .[test]",
        f"{python} -m pip install -q $(python -m harness keras2)",
        f"{python} -m harness.bench.gpu --out r.json",
    ]
    assert not (tmp_path / "v").exists()


def test_the_script_installs_only_from_wheels_when_told(tmp_path):
    done = _script("--dry-run", "--venv", str(tmp_path / "v"), "--wheels", str(tmp_path),
                   "--tensorflow", "tensorflow[and-cuda]==2.15.1")
    assert done.returncode == 0, done.stderr
    assert (f"-m pip install -q --no-index --find-links {tmp_path} "
            f"tensorflow[and-cuda]==2.15.1") in done.stdout


@pytest.mark.parametrize("args,says", [
    (["--bogus"], "unknown argument '--bogus'"),
    (["--venv"], "--venv needs a value"),
    (["--wheels", "/nonexistent/wheels"], "--wheels /nonexistent/wheels is not a directory"),
    (["--no-install", "--venv", "/nonexistent/venv"], "/nonexistent/venv has no python"),
])
def test_the_script_refuses_bad_arguments_before_doing_anything(args, says):
    done = _script(*args)
    assert done.returncode == 2 and says in done.stderr, done.stderr


@pytest.mark.parametrize("argv,flag", [(["--runs", "1"], "--runs"),
                                       (["--budget", "5"], "--budget"),
                                       (["--runs", "many"], "--runs")])
def test_the_check_names_a_bad_argument(capsys, argv, flag):
    with pytest.raises(SystemExit) as e:
        gpu.parse_args(argv)
    assert e.value.code == 2 and flag in capsys.readouterr().err


def test_junit_cases_read_each_outcome():
    xml = """<testsuites><testsuite>
      <testcase classname="tests.gpu.test_gpu" name="test_a" time="12.5"/>
      <testcase name="test_b" time="1"><failure message="assert 'hang' == 'failed'">tb</failure></testcase>
      <testcase name="test_c" time="0"><skipped message="no GPU visible"/></testcase>
      <testcase name="test_d" time="3"><error message="fixture broke"/></testcase>
    </testsuite></testsuites>"""
    assert gpu.junit_cases(xml) == [
        {"name": "test_a", "outcome": "passed", "seconds": 12.5, "message": ""},
        {"name": "test_b", "outcome": "failed", "seconds": 1.0,
         "message": "assert 'hang' == 'failed'"},
        {"name": "test_c", "outcome": "skipped", "seconds": 0.0, "message": "no GPU visible"},
        {"name": "test_d", "outcome": "error", "seconds": 3.0, "message": "fixture broke"},
    ]


def test_nothing_is_usable_without_a_gpu_tensorflow_finds():
    assert gpu.usable({"visible": [], "tensorflow_gpus": 0}) == "no GPU visible"
    assert "finds no GPU" in gpu.usable({"visible": ["0"], "tensorflow_gpus": 0,
                                         "tensorflow_error": None, "tensorflow": "2.21.0"})
    assert gpu.usable({"visible": ["0"], "tensorflow_gpus": 1}) is None


def test_the_summary_counts_the_tests_and_shows_each_failure():
    results = {"machine": {"date": "2026-12-02", "tensorflow": "2.21.0",
                           "nvidia_smi": ["GPU 0: NVIDIA H200"]},
               "tests": {"exit": 1, "seconds": 80.0, "cases": [
                   {"name": "test_a", "outcome": "passed", "seconds": 1, "message": ""},
                   {"name": "test_b", "outcome": "failed", "seconds": 1, "message": "boom"}]},
               "bench": {"spawn": {"warm_median": 7.5}}}
    text = gpu.summary(results)
    assert "{'passed': 1, 'failed': 1} in 80.0 s (exit 1)" in text
    assert "failed: test_b: boom" in text and '"warm_median": 7.5' in text
