"""``python -m harness.bench.cost.replica``: what ``run(check_replicas=True)``
and ``run(reference=True)`` cost.

Runs the seed article's loop (:func:`harness.workloads.seed_training_loop`,
3 epochs of 10 steps: a 784-128-10 model and Adam's slots, 14 mirrored
variables) on N workers (2): plain, with the replica check, with the
single-worker reference, alternating run by run so that drift on a shared
machine hits all alike.  Both checks are paid once, when ``fn`` returns
(fingerprints, the value files, the parent's comparison; the reference
also runs ``fn`` again on one worker), so they are measured on the whole
run: ``Cluster.run``'s wall time, paired round by round with the plain
run.  (The seed loop does not seed its weights, so its reference differs:
the cost is the same either way.)  It prints the figures as a small table.
"""
from __future__ import annotations

from harness.bench.cost.paired import alternate, render_walls, wall_benchmark_main


def measure(rounds: int, workers: int) -> dict:
    from harness.controller import Cluster
    from harness.settings import RunSettings
    from harness.workloads import seed_training_loop
    cluster = Cluster(RunSettings(workers=workers, timeout=60))
    cluster.run(seed_training_loop).assert_completed()      # the forkserver's cold start
    variants = {name: (lambda kw=kw: cluster.run(seed_training_loop, **kw))
                for name, kw in VARIANTS.items()}
    fig = alternate(variants, rounds, "off")
    checked = cluster.run(seed_training_loop, check_replicas=True).assert_completed()
    return {**fig, "variables": checked.replicas.variables, "rounds": rounds,
            "workers": workers}


# name -> Cluster.run keyword arguments; "off" is the one the others are paired with.
VARIANTS = {"off": {}, "check_replicas": {"check_replicas": True}, "reference": {"reference": True}}


def render(fig: dict) -> str:
    return (render_walls(fig, tuple(VARIANTS), "variant")
            + f"\n\n{fig['workers']} workers, {fig['rounds']} rounds, "
              f"{fig['variables'][0]} variables fingerprinted per worker")


def main(argv=None) -> None:
    wall_benchmark_main("python -m harness.bench.cost.replica", __doc__, measure, render,
                        argv)


if __name__ == "__main__":
    main()
