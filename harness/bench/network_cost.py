"""``python -m harness.bench.network_cost``: what a network namespace per
cluster costs a warm run.

Alternates warm 2-worker runs of :func:`harness.workloads.allreduce_loop`
(20 all-reduce steps) on the host's loopback (``network="host"``) and in a
namespace of their own (``network="isolated"``), after one cold run each,
and prints ``Cluster.run``'s wall time per run, paired round by round.
"""
from __future__ import annotations

import argparse
import time

from . import machine_info, machine_line, stats


def measure(rounds: int, workers: int) -> dict:
    from ..controller import Cluster
    from ..settings import RunSettings
    from ..workloads import allreduce_loop
    clusters = {net: Cluster(RunSettings(workers=workers, timeout=60, network=net))
                for net in ("host", "isolated")}
    for cluster in clusters.values():
        cluster.run(allreduce_loop).assert_completed()      # cold start
    walls = {net: [] for net in clusters}
    for _ in range(rounds):
        for net, cluster in clusters.items():
            t = time.monotonic()
            cluster.run(allreduce_loop).assert_completed()
            walls[net].append(time.monotonic() - t)
    paired = [b - a for a, b in zip(walls["host"], walls["isolated"])]
    return {"host": stats(walls["host"]), "isolated": stats(walls["isolated"]),
            "paired": stats(paired), "rounds": rounds, "workers": workers}


def render(fig: dict) -> str:
    ms = lambda x: f"{1000 * x:.0f}"   # noqa: E731
    rows = ["| network | wall per warm run, ms (median; min-max) |", "|---|---|"]
    for name in ("host", "isolated"):
        st = fig[name]
        rows.append(f"| {name} | {ms(st['median'])}; {ms(st['min'])}-{ms(st['max'])} |")
    p = fig["paired"]
    rows.append(f"| isolated - host, paired | {ms(p['median'])}; {ms(p['min'])}-{ms(p['max'])} |")
    return "\n".join(rows) + f"\n\n{fig['workers']} workers, {fig['rounds']} rounds"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    print(machine_line(machine_info()), flush=True)
    print(render(measure(args.rounds, args.workers)))


if __name__ == "__main__":
    main()
