"""``python -m harness.bench.gpu``: the GPU check, one results file.

Run it through ``bash harness/bench/gpu.sh``, which makes a virtual
environment with a CUDA build of TensorFlow and this checkout first
(docs/gpu.md).  In the time it is given (``--budget``, 540 s by default,
so the whole check fits in 10 minutes) it:

1. records the machine: the GPUs nvidia-smi lists, the driver, the
   TensorFlow and Python in use, and how many GPUs TensorFlow finds;
2. runs the GPU tests (``pytest -m gpu tests/gpu``) and keeps each test's
   outcome, time and message;
3. times warm 2-worker runs on the GPU under spawn, and under the
   forkserver, whose server imports TensorFlow but hides every GPU, so
   CUDA is first initialised in each forked worker;
4. probes what the harness does not rely on, to decide whether it could:
   a process forked *after* CUDA was initialised in its parent, and NCCL
   with two workers on one GPU;

and writes it all as JSON to ``--out`` (``gpu-results.json``), printing a
summary.  Without a GPU it still writes the file: the tests all skip with
their reason, and the benchmark and probes say why they did not run.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from typing import Callable, Dict, List, Optional, Sequence, Union

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_BUDGET = 540.0
# What the benchmark and the probes need after the tests: two start
# methods' runs and two probes, on a GPU machine.
BENCH_RESERVE = 200.0
MEMORY_GROWTH = {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}
STEPS = 20


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: at least 2 (the first run is cold)")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not 60 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r}: between 60 and 3600 seconds")
    return value


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m harness.bench.gpu",
                                description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gpu-results.json", help="the results file (gpu-results.json)")
    p.add_argument("--budget", type=_seconds, default=DEFAULT_BUDGET,
                   help=f"seconds for everything ({DEFAULT_BUDGET:g})")
    p.add_argument("--runs", type=_positive_int, default=5,
                   help="runs per start method, the first cold (5)")
    p.add_argument("--skip-tests", action="store_true", help="leave out the GPU tests")
    p.add_argument("--skip-bench", action="store_true",
                   help="leave out the benchmark and the probes")
    p.add_argument("--probe", choices=("fork-after-cuda",), help=argparse.SUPPRESS)
    return p.parse_args(argv)


# -- the machine -----------------------------------------------------------------

def _command(*argv: str, timeout: float = 30) -> str:
    if not shutil.which(argv[0]):
        return ""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine() -> dict:
    from harness.launch.devices import tensorflow_gpus, visible_gpus
    visible = visible_gpus()
    found, version = tensorflow_gpus(visible) if visible else (0, _tensorflow_version())
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(), "cpus": os.cpu_count(),
        "nvidia_smi": _command("nvidia-smi", "-L").splitlines(),
        "driver": _command("nvidia-smi", "--query-gpu=driver_version",
                           "--format=csv,noheader").splitlines()[:1],
        "visible": visible,
        "tensorflow": version if found is not None else _tensorflow_version(),
        "tensorflow_gpus": found, "tensorflow_error": None if found is not None else version,
    }


def _tensorflow_version() -> str:
    import importlib.metadata
    try:
        return importlib.metadata.version("tensorflow")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def usable(info: dict) -> Optional[str]:
    """Why nothing can run on a GPU here, or None."""
    if not info["visible"]:
        return "no GPU visible"
    if not info["tensorflow_gpus"]:
        return info["tensorflow_error"] or f"TensorFlow {info['tensorflow']} finds no GPU"
    return None


# -- the tests -------------------------------------------------------------------

def junit_cases(xml_text: str) -> List[dict]:
    """Each test case of a JUnit XML report: name, outcome, seconds, message."""
    cases = []
    for case in ElementTree.fromstring(xml_text).iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                message = (found.get("message") or found.text or "")[:800]
                break
        cases.append({"name": case.get("name"), "outcome": outcome,
                      "seconds": round(float(case.get("time") or 0), 1), "message": message})
    return cases


def run_tests(timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="mwms-gpu-") as tmp:
        report = os.path.join(tmp, "junit.xml")
        argv = [sys.executable, "-m", "pytest", "-m", "gpu", "tests/gpu", "-q", "-rs",
                "-p", "no:cacheprovider", f"--junitxml={report}"]
        started = time.monotonic()
        status: Union[int, str]     # pytest's exit code, or "timeout"
        try:
            done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                                  check=False)
            status, tail = done.returncode, done.stdout[-3000:]
        except subprocess.TimeoutExpired as e:
            status, tail = "timeout", ((e.stdout or b"").decode(errors="replace"))[-3000:]
        cases = junit_cases(pathlib.Path(report).read_text()) if os.path.exists(report) else []
    return {"exit": status, "seconds": round(time.monotonic() - started, 1),
            "cases": cases, "output_tail": tail}


# -- the benchmark and the probes ---------------------------------------------------

def _settings(start_method: str, timeout: float = 120.0):
    """Two workers on a GPU each (the first two), as tests/gpu puts them, or
    both on the first where there is one."""
    from harness.launch.devices import visible_gpus
    from harness.settings import RunSettings
    visible = visible_gpus()
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(visible[:2])
    return RunSettings(workers=2, timeout=timeout, grace=15.0, start_method=start_method,
                       devices="gpu" if len(visible) >= 2 else "gpu-shared")


def warm_runs(start_method: str, runs: int, deadline: float) -> dict:
    """``runs`` 2-worker runs of ``STEPS`` all-reduce steps on the GPU, timed
    from the call to its return; the first is cold."""
    from harness.controller import Cluster
    from harness.workloads import variable_loop
    cluster = Cluster(_settings(start_method))
    seconds, outcomes = [], []
    for _ in range(runs):
        if time.monotonic() > deadline:
            break
        started = time.monotonic()
        result = cluster.run(variable_loop, args=(STEPS,), env=MEMORY_GROWTH)
        seconds.append(round(time.monotonic() - started, 3))
        outcomes.append(str(result.outcome))
        if result.outcome != "completed":
            return {"seconds": seconds, "outcomes": outcomes, "report": result.report()[-3000:]}
    warm = seconds[1:]
    return {"seconds": seconds, "outcomes": outcomes,
            "warm_median": statistics.median(warm) if warm else None}


def nccl_on_one_gpu() -> dict:
    """Two workers on the first GPU, all-reducing through NCCL."""
    from harness.controller import Cluster
    from harness.settings import RunSettings
    from harness.launch.devices import visible_gpus
    os.environ["CUDA_VISIBLE_DEVICES"] = visible_gpus()[0]
    cluster = Cluster(RunSettings(workers=2, timeout=60.0, grace=15.0, start_method="spawn",
                                  devices="gpu-shared"))
    result = cluster.run(_nccl_loop, env=MEMORY_GROWTH)
    return {"outcome": str(result.outcome), "culprits": list(result.culprits),
            "errors": [w.exception and f"{w.exception.type_name}: {w.exception.message[:300]}"
                       for w in result.workers],
            "headline": result.diagnosis.splitlines()[0] if result.diagnosis else ""}


def _nccl_loop(steps: int = 5) -> float:
    import tensorflow as tf

    from harness.workloads import steps as harness_steps
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.NCCL)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    with strategy.scope():
        w = tf.Variable(1.0)

    @tf.function
    def step():
        return strategy.reduce("SUM", strategy.run(lambda: w * 1.0), axis=None)

    return sum(float(step()) for _ in harness_steps(steps))


def fork_after_cuda() -> dict:
    """In this process: initialise CUDA, then fork a child that computes on
    the GPU.  What the child gives back within 120 s, or how it ended."""
    import multiprocess
    import tensorflow as tf
    with tf.device("/GPU:0"):
        float(tf.reduce_sum(tf.ones([1024])))
    context = multiprocess.get_context("fork")
    queue = context.Queue()

    def child():
        try:
            with tf.device("/GPU:0"):
                queue.put(("ok", float(tf.reduce_sum(tf.ones([1024])))))
        except Exception as e:   # what TensorFlow raises in the child is the finding
            queue.put(("raised", f"{type(e).__name__}: {str(e)[:500]}"))

    process = context.Process(target=child)
    process.start()
    process.join(120)
    if process.is_alive():
        process.kill()
        process.join()
        return {"result": "hung", "detail": "no answer in 120 s"}
    if queue.empty():
        return {"result": "died", "detail": f"exit code {process.exitcode}"}
    kind, detail = queue.get()
    return {"result": kind, "detail": detail, "exit_code": process.exitcode}


def _probe_in_a_process(name: str, timeout: float = 240) -> dict:
    argv = [sys.executable, "-m", "harness.bench.gpu", "--probe", name]
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        return {"result": "timeout", "detail": f"over {timeout:g} s"}
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        return {"result": "error", "detail": done.stderr[-800:], "exit_code": done.returncode}


def bench(runs: int, deadline: float) -> dict:
    steps: Dict[str, Callable[[], dict]] = {
        "spawn": lambda: warm_runs("spawn", runs, deadline),
        "forkserver": lambda: warm_runs("forkserver", runs, deadline),
        "fork_after_cuda": lambda: _probe_in_a_process("fork-after-cuda"),
        "nccl_on_one_gpu": nccl_on_one_gpu,
    }
    out = {}
    for name, step in steps.items():
        if time.monotonic() > deadline:
            out[name] = {"skipped": "out of time"}
            continue
        try:
            out[name] = step()
        except Exception as e:   # one part's failure is a finding, not the end of the check
            out[name] = {"error": f"{type(e).__name__}: {e}"[:800]}
    return out


# -- the whole check ---------------------------------------------------------------

def summary(results: dict) -> str:
    info = results["machine"]
    lines = [f"GPU check, {info['date']}: TensorFlow {info['tensorflow']}, "
             f"GPUs {info['nvidia_smi'] or 'none'}"]
    tests = results.get("tests") or {}
    counts = dict(collections.Counter(case["outcome"] for case in tests.get("cases", ())))
    if tests:
        lines.append(f"tests: {counts or 'none ran'} in {tests['seconds']} s "
                     f"(exit {tests['exit']})")
        lines += [f"  {c['outcome']}: {c['name']}: {c['message'][:160]}"
                  for c in tests.get("cases", ()) if c["outcome"] in ("failed", "error")]
    for name, found in (results.get("bench") or {}).items():
        lines.append(f"{name}: {json.dumps(found)[:300]}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> dict:
    started = time.monotonic()
    deadline = started + args.budget
    results: dict = {"machine": machine(), "budget_s": args.budget}
    why_not = usable(results["machine"])
    if not args.skip_tests:
        results["tests"] = run_tests(max(60.0, deadline - time.monotonic()
                                         - (0 if args.skip_bench else BENCH_RESERVE)))
    if not args.skip_bench:
        results["bench"] = {"skipped": why_not} if why_not else bench(args.runs, deadline)
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    return results


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.probe:
        print(json.dumps(fork_after_cuda()))
        return 0
    results = run(args)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    print(summary(results))
    print(f"written to {args.out}")
    tests = results.get("tests") or {}
    return 1 if any(c["outcome"] in ("failed", "error") for c in tests.get("cases", ())) else 0


if __name__ == "__main__":
    sys.exit(main())
