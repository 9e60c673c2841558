"""The GPU path on real GPUs: workers on their GPUs, several workers on
one GPU with and without memory growth, NCCL's all-reduce, the fault
matrix with the CPU's verdicts, the ledger on the GPU's collectives, and
nothing left on a GPU after a run.

Skipped, with the reason, where TensorFlow sees no GPU (conftest.py).  Run
with ``pytest -m gpu tests/gpu``; ``python -m harness.bench.gpu`` runs them
and the GPU benchmark and writes one results file (docs/gpu.md).

What TensorFlow does on a GPU here is the CPU's measured behaviour, NCCL's
and TensorFlow's documentation, and the users' reports each test names;
docs/gpu.md says which of them a GPU run has confirmed.
"""
import subprocess
import time

import pytest

from harness.launch.devices import visible_gpus
from harness.workloads import steps as harness_steps, variable_loop
from test_faults import EXPECTED, FAULT_STEP, STEPS, make_fault

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

# TensorFlow maps nearly all of a GPU's memory into the first process that
# uses it; workers that share a GPU need memory growth.
MEMORY_GROWTH = {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}
# A spawned worker imports TensorFlow and opens its GPU before its first
# step: start-up the watch sees no progress in for several seconds.
TIMEOUT = 60.0
GRACE = 15.0

RING = "RING"
NCCL = "NCCL"
needs_two_gpus = pytest.mark.skipif(len(visible_gpus()) < 2,
                                    reason="needs 2 GPUs, one per worker")
NCCL_NEEDS_TWO = "needs 2 GPUs: NCCL refuses two ranks on one GPU"
# Of the GPU's memory, what each of two workers sharing it holds: both fit
# only where each maps what it uses.
SHARE = 0.35


def where_it_runs(steps=4, implementation=RING):
    """Each worker: what it was given to see, the GPUs TensorFlow found, the
    device of its variable and the all-reduced sum of ``steps`` steps."""
    import os

    import tensorflow as tf
    kinds = tf.distribute.experimental.CommunicationImplementation
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=getattr(kinds, implementation)))
    with strategy.scope():
        w = tf.Variable(1.0)

    @tf.function
    def step():
        return strategy.reduce("SUM", strategy.run(lambda: w * 1.0), axis=None)

    total = sum(float(step()) for _ in harness_steps(steps))
    return {"visible": os.environ["CUDA_VISIBLE_DEVICES"],
            "gpus": len(tf.config.list_logical_devices("GPU")),
            "device": w.device, "total": total}


def hold_a_share_of_the_gpu(nbytes, steps=3):
    """Hold ``nbytes`` on the worker's GPU once its strategy is up, then
    train.  A worker whose GPU could not be opened says so rather than
    holding them in host memory."""
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        w = tf.Variable(1.0)
    with tf.device("/GPU:0"):
        held = tf.zeros([nbytes // 4], tf.float32)
    if not held.device.endswith("GPU:0"):
        raise RuntimeError(f"no GPU in this worker: the tensor went to {held.device}")

    @tf.function
    def step():
        return strategy.reduce("SUM", strategy.run(lambda: w * 1.0), axis=None)

    total = sum(float(step()) for _ in harness_steps(steps))
    return {"held": int(held.shape[0]) * 4, "total": total}


def _smi(query: str) -> list:
    out = subprocess.run(["nvidia-smi", f"--query-{query}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def gpu_memory_used_mib() -> list:
    return [int(v) for v in _smi("gpu=memory.used")]


def gpu_memory_total_bytes(gpu: str) -> int:
    return int(_smi("gpu=index,memory.total")[int(gpu)].split(",")[1]) * 2**20


def test_each_worker_computes_on_the_gpu_it_was_given(gpu_cluster, gpus):
    cluster = gpu_cluster()
    result = cluster.run(where_it_runs, timeout=TIMEOUT, grace=GRACE, env=MEMORY_GROWTH)
    result.assert_completed()
    shares = [r["visible"] for r in result.return_values]
    assert shares == ([gpus[0]] * 2 if len(gpus) < 2 else [gpus[0], gpus[1]]), shares
    for r in result.return_values:
        assert r["gpus"] == 1 and r["device"].endswith("GPU:0"), r
        assert r["total"] == 2.0 * 4


@needs_two_gpus
def test_two_workers_on_two_gpus_keep_to_their_own(gpu_cluster, gpus):
    result = gpu_cluster(share=False).run(where_it_runs, timeout=TIMEOUT, grace=GRACE)
    result.assert_completed()
    assert [r["visible"] for r in result.return_values] == gpus[:2]


def test_two_workers_on_one_gpu_with_memory_growth_complete(gpu_cluster, gpus):
    """Each maps only what it uses, so both hold their share of the GPU."""
    nbytes = int(SHARE * gpu_memory_total_bytes(gpus[0]))
    result = gpu_cluster(share=True).run(hold_a_share_of_the_gpu, args=(nbytes,),
                                         timeout=TIMEOUT, grace=GRACE, env=MEMORY_GROWTH)
    result.assert_completed()
    assert [r["held"] for r in result.return_values] == [nbytes // 4 * 4] * 2


def test_two_workers_on_one_gpu_without_memory_growth_fail_on_the_one_left_short(
        gpu_cluster, gpus):
    """tensorflow#39110, #47861: without memory growth the first worker to
    allocate maps nearly all of the GPU (its allocator takes the whole
    limit, figured from the memory free when both opened the GPU), and the
    other's allocator backs off to what is left (TensorFlow leaves 1.5-1.8
    GiB free on a recent GPU).  Which worker is first is a race; that the other
    cannot hold its share of the GPU is not.  It raises
    ResourceExhaustedError, and the diagnosis names it, whichever it is."""
    nbytes = int(SHARE * gpu_memory_total_bytes(gpus[0]))
    result = gpu_cluster(share=True).run(hold_a_share_of_the_gpu, args=(nbytes,),
                                         timeout=TIMEOUT, grace=GRACE)
    assert result.outcome == "failed", result.report()
    short = [w.index for w in result.workers
             if w.exception is not None and w.exception.type_name == "ResourceExhaustedError"]
    assert len(short) == 1, result.report()
    assert result.culprits == tuple(short), result.report()


@pytest.mark.skipif(len(visible_gpus()) < 2, reason=NCCL_NEEDS_TWO)
def test_an_nccl_all_reduce_job_completes(gpu_cluster, gpus):
    result = gpu_cluster(share=False).run(where_it_runs, kwargs={"implementation": NCCL},
                                          timeout=TIMEOUT, grace=GRACE)
    result.assert_completed()
    assert [r["total"] for r in result.return_values] == [2.0 * 4] * 2


def _ledger_steps(result) -> list:
    return [[c.step for c in w.collectives if c.function == "step" and c.state == "completed"]
            for w in result.workers]


@pytest.mark.parametrize("implementation", [RING, NCCL])
def test_the_ledger_records_the_gpu_collectives(gpu_cluster, gpus, implementation):
    if implementation == NCCL and len(gpus) < 2:
        pytest.skip(NCCL_NEEDS_TWO)
    result = gpu_cluster().run(where_it_runs, kwargs={"implementation": implementation},
                               timeout=TIMEOUT, grace=GRACE, env=MEMORY_GROWTH)
    result.assert_completed()
    assert _ledger_steps(result) == [[0, 1, 2, 3]] * 2, result.report()


GPU_MATRIX = ["SkipStep", "ExtraCollective", "Crash-kill", "Pause-forever", "RaiseError"]


@pytest.mark.parametrize("kind", GPU_MATRIX)
def test_fault_matrix_on_the_gpu_gives_the_cpu_verdicts(gpu_cluster, kind):
    """The CPU's fault matrix (tests/test_faults.py) at 2 workers, the last
    at fault: the same outcome and culprit on GPU workers."""
    result = gpu_cluster().run(variable_loop, args=(STEPS,), faults=[make_fault(kind, 1)],
                               timeout=TIMEOUT, grace=GRACE, env=MEMORY_GROWTH)
    expected = EXPECTED[kind]
    assert result.outcome == (expected[1] if isinstance(expected, tuple) else expected), \
        result.report()
    assert result.culprits == (1,), result.report()
    assert max(w.last_step or 0 for w in result.workers) >= FAULT_STEP, result.report()


def test_nothing_is_left_on_the_gpu_after_a_run(gpu_cluster, no_leftover_workers):
    """A hang's workers are killed; their processes and their GPU memory go
    with them (allowing 256 MiB for what another program does meanwhile)."""
    before = gpu_memory_used_mib()
    result = gpu_cluster().run(variable_loop, args=(STEPS,),
                               faults=[make_fault("Pause-forever", 1)],
                               timeout=TIMEOUT, grace=GRACE, env=MEMORY_GROWTH)
    assert result.outcome == "hang", result.report()
    pids = {str(w.pid) for w in result.workers}
    assert not pids & set(_smi("compute-apps=pid")), _smi("compute-apps=pid")
    # The driver frees a dead process's memory a moment after it is reaped.
    deadline = time.monotonic() + 10
    while True:
        after = gpu_memory_used_mib()
        if all(a - b < 256 for a, b in zip(after, before)) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert all(a - b < 256 for a, b in zip(after, before)), (before, after)
