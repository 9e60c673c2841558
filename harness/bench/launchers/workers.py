"""Worker side of the launcher comparison: a :mod:`harness.workloads` function, measured.

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

Importing this module does not import TensorFlow.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Callable, Dict, Optional, Sequence

from harness import workloads
from harness.bench.common import worker_index

# What spawn_entry prints before its JSON result, so the parent can find the
# line among whatever else the worker writes to stdout.
RESULT_MARK = "BENCH_RESULT "

# Each takes ``steps=`` and keyword arguments of its own.
WORKLOAD_FNS: Dict[str, Callable[..., object]] = {"allreduce": workloads.allreduce_loop,
                                                  "seed_training": workloads.seed_training_loop}


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
