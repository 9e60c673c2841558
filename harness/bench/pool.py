"""``python -m harness.bench.pool``: what TensorFlow's pool runner costs a
light test case on the harness, the pool's cluster kept against a fresh
cluster a case.

``--cases`` light cases (each makes a MultiWorkerMirroredStrategy and sums
one value across ``--workers`` tasks, as a case of TensorFlow's
``strategy_common_test`` run on ``strategy_combinations``' pool does), run
``--repeats`` times each way:

- ``pool``: ``MultiProcessPoolRunner.run`` on one pool (its cluster started
  by the first case and kept, as TensorFlow's pool keeps its processes);
- ``fresh``: ``multi_process_runner.run``, a cluster a case (what every
  pool call cost before the pool kept its processes).

Prints each way's seconds for all the cases, the first case apart.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time
from typing import Callable, List

from harness.bench.common import machine_info, machine_line


def light_case() -> float:
    import tensorflow as tf
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    return float(strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None))


def _timed(cases: int, call: Callable[[], object]) -> List[float]:
    seconds = []
    for _ in range(cases):
        t0 = time.monotonic()
        call()
        seconds.append(time.monotonic() - t0)
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.bench.pool")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cases", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from harness.compat import multi_process_runner as mpr
    spec = mpr.create_cluster_spec(num_workers=args.workers)
    print(machine_line(machine_info()), flush=True)
    mpr.run(light_case, spec)   # the forkserver's start (TensorFlow's import), not counted
    rows: dict = {"pool": [], "fresh": []}
    for _ in range(args.repeats):
        pool = mpr.MultiProcessPoolRunner(spec)
        rows["pool"].append(_timed(args.cases, functools.partial(pool.run, light_case)))
        pool.shutdown()
        rows["fresh"].append(_timed(args.cases, lambda: mpr.run(light_case, spec)))
    for way, runs in rows.items():
        totals = [sum(r) for r in runs]
        later = [statistics.median(r[1:]) for r in runs if len(r) > 1]
        print(f"{way}: {args.cases} cases in {statistics.median(totals):.1f} s (median of "
              f"{len(runs)}; {min(totals):.1f}-{max(totals):.1f}); the first case "
              f"{statistics.median(r[0] for r in runs):.2f} s, each later one "
              f"{statistics.median(later) if later else 0:.2f} s", flush=True)
    mpr.shutdown_manager()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
