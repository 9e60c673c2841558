"""Worker side of ``python -m harness.bench.cost.step``: the all-reduce
loop, its steps from ``range(n)`` or from ``harness.context().steps(n)``,
timed from inside.

Importing this module does not import TensorFlow.
"""
from __future__ import annotations

import time

from harness import context, workloads
from harness.bench.common import worker_index


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
