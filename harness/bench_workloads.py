"""Worker side of the benchmark (:mod:`harness.bench`): the workloads themselves.

Every launcher runs the very same functions, so that the figures differ only
by how the workers were started, watched and stopped:

* the harness calls them through ``Cluster.run`` with ``harness=True`` (steps
  come from ``harness.context().steps(n)``, the skipped step from the
  ``SkipStep`` fault);
* the spawn-per-worker launcher runs :func:`spawn_entry` in a fresh
  ``python -c`` per worker;
* TensorFlow's ``multi_process_runner`` calls them from its own workers
  (they are pickled by reference, as functions of an importable module).

Importing this module does not import TensorFlow: each function imports it
when it runs, in the worker.

Each workload returns a small dict (JSON-friendly, so every launcher can
carry it back): the worker's index and pid, the last all-reduced value, and
its own PSS (proportional set size: resident pages, shared pages divided
among the processes sharing them) measured as its loop ends, while its peers
are still alive.  Reading ``/proc/self/smaps_rollup`` costs about 5 ms.

``stamp_dir``, when given, is where the worker leaves two marks the
benchmark reads afterwards, whatever the launcher:

* ``pid.<index>``: its pid, written first thing, so the benchmark can check
  that every worker is gone after a hang was reported, even one that never
  returned;
* ``loop_end.<index>``: ``time.monotonic()`` (system-wide on Linux, so
  comparable with the benchmark's clock) when its training loop ended.  In
  workload 4 only the worker that skipped a step gets there: its last
  collective paired with its peer's next-to-last, and from that moment its
  peer waits for a partner that will never come.  That mark is the start
  of the hang.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Iterable, Optional, Sequence

# What spawn_entry prints before its JSON result, so the parent can find the
# line among whatever else the worker writes to stdout.
RESULT_MARK = "BENCH_RESULT "

# The seed article's constants (shared/seed/000_151af5606005d280.txt).
FEATURES = 784
CLASSES = 10
GLOBAL_BATCH_SIZE = 64


def task_index() -> int:
    """This worker's index, from ``TF_CONFIG`` (every launcher sets it)."""
    return int(json.loads(os.environ["TF_CONFIG"])["task"]["index"])


def _mark(stamp_dir: Optional[str], name: str, value) -> None:
    if stamp_dir:
        # Written whole then renamed, so a reader never sees half a number.
        path = os.path.join(stamp_dir, name)
        with open(path + ".tmp", "w") as f:
            f.write(repr(value))
        os.replace(path + ".tmp", path)


def _own_pss() -> Optional[int]:
    try:
        import psutil
        return int(psutil.Process().memory_full_info().pss)
    except Exception:  # PSS needs /proc/PID/smaps; report nothing rather than fail the run
        return None


def _steps(n: int, harness: bool, skip: Optional[Sequence[int]], index: int) -> Iterable[int]:
    """Step numbers 0..n-1.  Under the harness they come from its context
    (progress reports; faults such as ``SkipStep`` act there).  Elsewhere
    the loop itself leaves out step ``skip[1]`` on worker ``skip[0]``."""
    if harness:
        import harness as harness_pkg
        return harness_pkg.context().steps(n)
    if skip is not None and index == skip[0]:
        return (k for k in range(n) if k != skip[1])
    return range(n)


def _index(harness: bool) -> int:
    if harness:
        import harness as harness_pkg
        return harness_pkg.context().index
    return task_index()


def _finish(stamp_dir: Optional[str], index: int, value: float, linger: float,
            started: float) -> dict:
    end = time.monotonic()
    _mark(stamp_dir, f"loop_end.{index}", end)
    # fn_s: from entering the function to the end of its loop (strategy,
    # model, steps): the same work under every launcher, so the rest of a
    # run's wall time is the launcher's own.
    out = {"index": index, "pid": os.getpid(), "value": value, "pss": _own_pss(),
           "fn_s": end - started}
    if linger:
        # Workload 4 outside the harness: the worker that skipped a step
        # stays alive (its gRPC server up), so its peer blocks forever
        # instead of getting UnavailableError when it exits.
        time.sleep(linger)
    return out


def allreduce(n_steps: int = 20, harness: bool = False, skip: Optional[Sequence[int]] = None,
              stamp_dir: Optional[str] = None, linger: float = 0.0) -> dict:
    """Workloads 1, 2 and 4: ``n_steps`` all-reduces (SUM) of a scalar."""
    started = time.monotonic()
    index = _index(harness)
    _mark(stamp_dir, f"pid.{index}", os.getpid())
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    @tf.function
    def step():
        value = strategy.run(lambda: tf.constant(1.0))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)

    total = None
    for _ in _steps(n_steps, harness, skip, index):
        total = step()
    return _finish(stamp_dir, index, None if total is None else float(total), linger, started)


def make_data(n: int = 2048, seed: int = 0):
    """MNIST-shaped arrays made here (no download): ``x`` (n, 784) float32 in
    [0, 1), ``y`` (n,) int64 labels 0-9."""
    import numpy as np
    rng = np.random.default_rng(seed)
    x = rng.random((n, FEATURES), dtype=np.float32)
    y = rng.integers(0, CLASSES, size=n, dtype=np.int64)
    return x, y


def seed_training(n_steps: int = 100, harness: bool = False, stamp_dir: Optional[str] = None,
                  linger: float = 0.0) -> dict:
    """Workload 3: the seed article's custom training loop, its bugs fixed.

    Fixed as the facts file says: ``input_context.num_input_pipelines``
    (the article has ``num_inputpipelines``), the chief is
    ``strategy.cluster_resolver.task_id == 0`` (the default replica context
    has no ``is_chief``), and the data are random arrays of MNIST's shape
    instead of a download.  Keras 3 layers in a custom loop work under MWMS
    (``model.fit`` does not).
    """
    started = time.monotonic()
    index = _index(harness)
    _mark(stamp_dir, f"pid.{index}", os.getpid())
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input(shape=(FEATURES,)),
            tf.keras.layers.Dense(10, activation="relu"),
            tf.keras.layers.Dense(CLASSES, activation="softmax"),
        ])
        optimizer = tf.keras.optimizers.Adam(learning_rate=0.001)
        # "none" is Reduction.NONE in tf_keras and the spelling Keras 3 accepts.
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=False, reduction="none")

    def compute_loss(labels, predictions):
        per_example_loss = loss_object(labels, predictions)
        return tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH_SIZE)

    def train_step(inputs):
        images, labels = inputs
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            loss = compute_loss(labels, predictions)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def distributed_train_step(dist_inputs):
        per_replica_losses = strategy.run(train_step, args=(dist_inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    x, y = make_data()
    # A fixed shuffle seed: every worker shuffles alike, so the shards are disjoint.
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0).repeat()

    def dataset_fn(input_context):
        ds = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return ds.batch(GLOBAL_BATCH_SIZE // input_context.num_input_pipelines)

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    is_chief = strategy.cluster_resolver.task_id == 0
    total_loss = None
    for step in _steps(n_steps, harness, None, index):
        total_loss = distributed_train_step(next(iterator))
        if is_chief and step % 10 == 0:
            print(f"Step {step}, Loss: {float(total_loss):.4f}")
    return _finish(stamp_dir, index, None if total_loss is None else float(total_loss), linger,
                   started)


WORKLOAD_FNS = {"allreduce": allreduce, "seed_training": seed_training}


def spawn_entry() -> None:
    """Entry point of a spawn-per-worker worker: ``python -c "..." '<json>'``.

    The JSON names the function and its keyword arguments.  The result goes
    to stdout as one line after :data:`RESULT_MARK`; a hand-rolled script
    would have no channel at all, this one line is only so the benchmark can
    read each worker's PSS.
    """
    spec = json.loads(sys.argv[1])
    result = WORKLOAD_FNS[spec["fn"]](**spec["kwargs"])
    sys.stdout.write(RESULT_MARK + json.dumps(result) + "\n")
    sys.stdout.flush()
