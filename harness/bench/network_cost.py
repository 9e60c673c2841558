"""``python -m harness.bench.network_cost``: what a network namespace per
cluster costs a warm run.

Alternates warm 2-worker runs of :func:`harness.workloads.allreduce_loop`
(20 all-reduce steps) on the host's loopback (``network="host"``) and in a
namespace of their own (``network="isolated"``), after one cold run each,
and prints ``Cluster.run``'s wall time per run, paired round by round.
"""
from __future__ import annotations

from . import alternate, render_walls, wall_benchmark_main


def measure(rounds: int, workers: int) -> dict:
    from ..controller import Cluster
    from ..settings import RunSettings
    from ..workloads import allreduce_loop
    clusters = {net: Cluster(RunSettings(workers=workers, timeout=60, network=net))
                for net in NAMES}
    for cluster in clusters.values():
        cluster.run(allreduce_loop).assert_completed()      # cold start
    variants = {net: (lambda c=c: c.run(allreduce_loop).assert_completed())
                for net, c in clusters.items()}
    return {**alternate(variants, rounds, "host"), "rounds": rounds, "workers": workers}


NAMES = ("host", "isolated")


def render(fig: dict) -> str:
    return (render_walls(fig, NAMES, "network")
            + f"\n\n{fig['workers']} workers, {fig['rounds']} warm rounds")


def main(argv=None) -> None:
    wall_benchmark_main(__doc__, measure, render, argv)


if __name__ == "__main__":
    main()
