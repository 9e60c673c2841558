"""``python -m harness.bench.memory_rate``: how often the memory rate names a
leak in a fast job, and passes the same job without it.

A job of ``--steps`` all-reduce steps (about 2.5 s for 200 on 2 cores) in
which worker 1 keeps ``--mib`` MiB more at each step, and the same job
keeping nothing, ``--runs`` times each at each worker count.  For each it
counts the runs where worker 1 alone was named as growing steadily at the
leak's rate (within 20 %), and where the job without the leak passed
``assert_memory_flat()``.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from typing import Dict, List, Optional

from harness.bench.common import machine_info, machine_line


def leaking_loop(steps: int = 200, keep_on: Optional[int] = None, mib: int = 1) -> int:
    """``steps`` all-reduces; worker ``keep_on`` keeps ``mib`` MiB more at each
    (written, so the pages are resident).  Returns the MiB kept."""
    import numpy as np
    import tensorflow as tf

    import harness
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    @tf.function
    def step():
        return strategy.reduce(tf.distribute.ReduceOp.SUM,
                               strategy.run(lambda: tf.ones([256])), axis=None)

    kept = []
    for _ in ctx.steps(steps):
        step()
        if ctx.index == keep_on:
            kept.append(np.ones(mib << 20, dtype=np.uint8))
    return sum(a.nbytes for a in kept) >> 20


def named(result, mib: int) -> bool:
    """Worker 1 alone grows steadily, at ``mib`` MiB per step within 20 %."""
    leak = result.memory[1]
    return (result.outcome == "completed" and leak.steady
            and abs(leak.mib_per_step - mib) <= 0.2 * mib
            and not any(g.steady for g in result.memory if g.worker != 1))


def flat(result) -> bool:
    try:
        result.assert_completed().assert_memory_flat()
    except AssertionError:
        return False
    return True


@dataclasses.dataclass
class Counts:
    """One worker count's runs, counted."""

    named: int = 0      # leaking runs that named worker 1 at the leak's rate
    flat: int = 0       # runs without the leak that passed assert_memory_flat()
    seconds: List[float] = dataclasses.field(default_factory=list)      # those runs' durations
    rates: List[Optional[float]] = dataclasses.field(default_factory=list)  # worker 1's, leaking


def measure(workers: List[int], runs: int, steps: int, mib: int) -> Dict[int, Counts]:
    from harness.controller import Cluster
    from harness.settings import RunSettings
    out = {}
    for n in workers:
        cluster = Cluster(RunSettings(workers=n, timeout=30))
        cluster.run(leaking_loop, kwargs={"steps": 5})   # a cold start, not counted
        counts = Counts()
        for _ in range(runs):
            leak = cluster.run(leaking_loop, kwargs={"steps": steps, "keep_on": 1, "mib": mib})
            counts.named += named(leak, mib)
            counts.rates.append(leak.memory[1].mib_per_step)
            clean = cluster.run(leaking_loop, kwargs={"steps": steps})
            counts.flat += flat(clean)
            counts.seconds.append(clean.duration)
        out[n] = counts
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.bench.memory_rate",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="2,3")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--mib", type=int, default=1)
    args = ap.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",")]
    figures = measure(workers, args.runs, args.steps, args.mib)
    print(machine_line(machine_info()))
    print(f"| workers | job ({args.steps} steps) | leak of {args.mib} MiB/step named | "
          f"its rate (median) | no leak: assert_memory_flat() passes |")
    print("|---|---|---|---|---|")
    for n, c in figures.items():
        rates = [r for r in c.rates if r is not None]
        rate = f"{statistics.median(rates):.2f} MiB/step" if rates else "none"
        print(f"| {n} | {statistics.median(c.seconds):.1f} s | {c.named}/{args.runs} | "
              f"{rate} | {c.flat}/{args.runs} |")
    return 0 if all(c.named == c.flat == args.runs for c in figures.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
