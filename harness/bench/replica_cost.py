"""``python -m harness.bench.replica_cost``: what ``run(check_replicas=True)`` costs.

Runs the seed article's loop (:func:`harness.workloads.seed_training_loop`,
3 epochs of 10 steps: a 784-128-10 model and Adam's slots, 12 mirrored
variables) on N workers (2), with and without the replica check,
alternating run by run so that drift on a shared machine hits both alike.
The check's cost is paid once, when ``fn`` returns (fingerprints, the
value files, the parent's comparison), so it is measured on the whole run:
``Cluster.run``'s wall time, paired round by round.  It prints the figures
as a small table.
"""
from __future__ import annotations

import argparse
import time

from . import machine_info, machine_line, stats


def measure(rounds: int, workers: int) -> dict:
    from ..controller import Cluster
    from ..settings import RunSettings
    from ..workloads import seed_training_loop
    cluster = Cluster(RunSettings(workers=workers, timeout=60))
    cluster.run(seed_training_loop).assert_completed()      # the forkserver's cold start
    walls = {"off": [], "on": []}
    variables = None
    for _ in range(rounds):
        for variant in ("off", "on"):
            t = time.monotonic()
            result = cluster.run(seed_training_loop, check_replicas=variant == "on")
            walls[variant].append(time.monotonic() - t)
            result.assert_completed()
            if variant == "on":
                variables = result.replicas.variables
    paired = [on - off for off, on in zip(walls["off"], walls["on"])]
    return {"off": stats(walls["off"]), "on": stats(walls["on"]), "paired": stats(paired),
            "variables": variables, "rounds": rounds, "workers": workers}


def render(fig: dict) -> str:
    ms = lambda x: f"{1000 * x:.0f}"   # noqa: E731
    rows = ["| check_replicas | wall per run, ms (median; min-max) |", "|---|---|"]
    for name in ("off", "on"):
        st = fig[name]
        rows.append(f"| {name} | {ms(st['median'])}; {ms(st['min'])}-{ms(st['max'])} |")
    p = fig["paired"]
    rows.append(f"| on - off, paired | {ms(p['median'])}; {ms(p['min'])}-{ms(p['max'])} |")
    return "\n".join(rows) + (f"\n\n{fig['workers']} workers, {fig['rounds']} rounds, "
                              f"{fig['variables'][0]} variables fingerprinted per worker")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    print(machine_line(machine_info()), flush=True)
    print(render(measure(args.rounds, args.workers)))


if __name__ == "__main__":
    main()
