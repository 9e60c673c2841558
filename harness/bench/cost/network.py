"""``python -m harness.bench.cost.network``: what a network namespace per
cluster costs a warm run.

Alternates warm 2-worker runs of :func:`harness.workloads.allreduce_loop`
(20 all-reduce steps) on the host's loopback (``network="host"``), in a
namespace of their own (``network="isolated"``) and, as ``proxied``, in a
namespace each on a bridge with the TCP proxy between them (what a
``Latency`` or ``ResetPeers`` run pays: here ``Latency(1, 0, ms=0)``, a
proxy that delays nothing), after one cold run each, and prints
``Cluster.run``'s wall time per run, paired round by round.
"""
from __future__ import annotations

from harness.bench.cost.paired import alternate, render_walls, wall_benchmark_main


def measure(rounds: int, workers: int) -> dict:
    from harness.controller import Cluster
    from harness.settings import RunSettings
    from harness.workloads import allreduce_loop
    from harness.faults import Latency
    clusters = {name: Cluster(RunSettings(workers=workers, timeout=60,
                                          network="host" if name == "host" else "isolated"))
                for name in NAMES}
    plans = {name: [Latency(1, 0, ms=0)] if name == "proxied" else [] for name in NAMES}
    for name, cluster in clusters.items():
        cluster.run(allreduce_loop, faults=plans[name]).assert_completed()      # cold start
    variants = {name: (lambda c=c, plan=plans[name]: c.run(allreduce_loop, faults=plan)
                       .assert_completed())
                for name, c in clusters.items()}
    return {**alternate(variants, rounds, "host"), "rounds": rounds, "workers": workers}


NAMES = ("host", "isolated", "proxied")


def render(fig: dict) -> str:
    return (render_walls(fig, NAMES, "network")
            + f"\n\n{fig['workers']} workers, {fig['rounds']} warm rounds")


def main(argv=None) -> None:
    wall_benchmark_main("python -m harness.bench.cost.network", __doc__, measure, render,
                        argv)


if __name__ == "__main__":
    main()
