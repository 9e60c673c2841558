"""Worker side of the benchmark: a :mod:`harness.workloads` function, measured.

Every launcher runs :func:`measured_run` in each worker (the harness through
``Cluster.run``, the spawn launcher through :func:`spawn_entry`, TensorFlow's
runner by reference), so the figures differ only by how the workers were
started, watched and stopped.  It runs the workload with a ``steps`` of its
own that, when the loop ends, stamps the time and reads the worker's PSS:
the workload function is the product's, unchanged.

``stamp_dir``, when given, is where the worker leaves two marks the
benchmark reads afterwards, whatever the launcher: ``pid.<index>`` first
thing, and ``loop_end.<index>`` (``time.monotonic()``) as its loop ends.
See ``docs/benchmark.md`` for what the figures mean.

:func:`timed_allreduce` is the worker side of ``python -m
harness.bench.step_cost``: the all-reduce loop, its steps from ``range(n)``
or from ``harness.context().steps(n)``, timed from inside.

Importing this module does not import TensorFlow.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Optional, Sequence

from harness import NotInWorkerError, context, workloads

# What spawn_entry prints before its JSON result, so the parent can find the
# line among whatever else the worker writes to stdout.
RESULT_MARK = "BENCH_RESULT "

WORKLOAD_FNS = {"allreduce": workloads.allreduce_loop,
                "seed_training": workloads.seed_training_loop}


def worker_index() -> int:
    """This worker's index: from the harness context, else from ``TF_CONFIG``
    (every launcher sets it)."""
    try:
        return context().index
    except NotInWorkerError:
        return int(json.loads(os.environ["TF_CONFIG"])["task"]["index"])


def mark(stamp_dir: Optional[str], name: str, value) -> None:
    """Write ``value`` to ``stamp_dir/name``: whole then renamed, so a reader
    never sees half a number.  Nothing without a ``stamp_dir``."""
    if stamp_dir:
        path = os.path.join(stamp_dir, name)
        with open(path + ".tmp", "w") as f:
            f.write(repr(value))
        os.replace(path + ".tmp", path)


def own_pss() -> Optional[int]:
    """This process's PSS in bytes (about 5 ms to read), None where unreadable."""
    try:
        import psutil
        return int(psutil.Process().memory_full_info().pss)
    except Exception:  # PSS needs /proc/PID/smaps; report nothing rather than fail the run
        return None


def measured_run(fn: str, kwargs: dict, stamp_dir: Optional[str] = None,
                 skip: Optional[Sequence[int]] = None, linger: float = 0.0) -> dict:
    """Run ``WORKLOAD_FNS[fn](**kwargs)`` in this worker and return, JSON-friendly,
    its index and pid, the last value (the last sum or loss), its PSS as the
    loop ended (while its peers are still alive) and ``fn_s``, the time from
    entering here to the loop's end.

    ``skip=(worker, step)``: that worker's loop leaves out that step, as a
    user's ``continue`` would (under the harness the boundary is still
    reported, as it is for a ``continue``).
    ``linger``: seconds to stay alive afterwards (its gRPC server up), so a
    peer blocked for the step it skipped waits for ever instead of getting
    ``UnavailableError``.
    """
    started = time.monotonic()
    index = worker_index()
    mark(stamp_dir, f"pid.{index}", os.getpid())
    at_end: dict = {}

    def steps(n: int):
        numbers = workloads.steps(n)
        if skip is not None and index == skip[0]:
            numbers = (k for k in numbers if k != skip[1])
        yield from numbers
        # The loop has ended (its next step was asked for), inside the workload.
        at_end["t"] = time.monotonic()
        mark(stamp_dir, f"loop_end.{index}", at_end["t"])
        at_end["pss"] = own_pss()

    value = WORKLOAD_FNS[fn](steps=steps, **kwargs)
    if isinstance(value, list):  # the seed loop's losses: the last one
        value = value[-1] if value else None
    out = {"index": index, "pid": os.getpid(), "value": value, "pss": at_end.get("pss"),
           "fn_s": at_end["t"] - started if "t" in at_end else None}
    if linger:
        time.sleep(linger)
    return out


def spawn_entry() -> None:
    """Entry point of a spawn-per-worker worker: ``python -c "..." '<json>'``.

    The JSON holds :func:`measured_run`'s keyword arguments.  The result goes
    to stdout as one line after :data:`RESULT_MARK`; a hand-rolled script
    would have no channel at all, this one line is only so the benchmark can
    read each worker's PSS.
    """
    result = measured_run(**json.loads(sys.argv[1]))
    sys.stdout.write(RESULT_MARK + json.dumps(result) + "\n")
    sys.stdout.flush()


# How timed_allreduce's loop gets its step numbers: "range" reports nothing,
# "steps" is the harness's progress reporting (harness.context().steps(n)).
STEP_KINDS = ("range", "steps")


def timed_allreduce(n_steps: int, steps_kind: str = "steps", warmup: int = 10) -> dict:
    """``harness.workloads.allreduce_loop(n_steps)`` with its steps from
    ``range(n)`` or ``context().steps(n)`` (``steps_kind``), timed in this
    worker with ``time.perf_counter()``.

    Returns the index, the last sum, ``loop_s`` (first step number asked
    for to the loop's end: every step) and ``timed_s`` (from step ``warmup``
    on: the first steps trace the ``tf.function`` and set the collectives
    up, a one-time cost that is not a step's); ``cpu_timed_s``, this
    process's CPU time (all its threads) over the same steps, and
    ``cpu_total_s``, its CPU time from its start to the loop's end.  The
    clocks cost the same in every variant: one ``enumerate``, one comparison
    and one ``yield`` a step.
    """
    if steps_kind not in STEP_KINDS:
        raise ValueError(f"steps_kind must be one of {STEP_KINDS}, got {steps_kind!r}")
    if not 0 <= warmup < n_steps:
        raise ValueError(f"warmup must be 0 to n_steps - 1, got {warmup} for {n_steps} steps")
    clock, cpu = time.perf_counter, time.process_time
    marks: dict = {}

    def steps(n: int):
        numbers = range(n) if steps_kind == "range" else context().steps(n)
        marks["start"] = clock()
        for i, k in enumerate(numbers):
            if i == warmup:
                marks["warm"], marks["cpu_warm"] = clock(), cpu()
            yield k
        marks["end"], marks["cpu_end"] = clock(), cpu()

    value = workloads.allreduce_loop(n_steps, steps=steps)
    return {"index": worker_index(), "value": value, "steps": n_steps, "warmup": warmup,
            "loop_s": marks["end"] - marks["start"], "timed_s": marks["end"] - marks["warm"],
            "cpu_timed_s": marks["cpu_end"] - marks["cpu_warm"], "cpu_total_s": marks["cpu_end"]}
