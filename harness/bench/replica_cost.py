"""``python -m harness.bench.replica_cost``: what ``run(check_replicas=True)``
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

import argparse
import time

from . import machine_info, machine_line, stats


def measure(rounds: int, workers: int) -> dict:
    from ..controller import Cluster
    from ..settings import RunSettings
    from ..workloads import seed_training_loop
    cluster = Cluster(RunSettings(workers=workers, timeout=60))
    cluster.run(seed_training_loop).assert_completed()      # the forkserver's cold start
    walls: dict = {name: [] for name in VARIANTS}
    variables = None
    for _ in range(rounds):
        for name, kwargs in VARIANTS.items():
            t = time.monotonic()
            result = cluster.run(seed_training_loop, **kwargs)
            walls[name].append(time.monotonic() - t)
            if name == "check_replicas":
                result.assert_completed()
                variables = result.replicas.variables
    fig = {name: stats(w) for name, w in walls.items()}
    for name in VARIANTS:
        if name != "off":
            fig["paired " + name] = stats([b - a for a, b in zip(walls["off"], walls[name])])
    return {**fig, "variables": variables, "rounds": rounds, "workers": workers}


# name -> Cluster.run keyword arguments; "off" is the reference the others are paired with.
VARIANTS = {"off": {}, "check_replicas": {"check_replicas": True}, "reference": {"reference": True}}


def render(fig: dict) -> str:
    ms = lambda x: f"{1000 * x:.0f}"   # noqa: E731
    rows = ["| variant | wall per run, ms (median; min-max) | minus off, paired (median; min-max) |",
            "|---|---|---|"]
    for name in VARIANTS:
        st, p = fig[name], fig.get("paired " + name)
        rows.append(f"| {name} | {ms(st['median'])}; {ms(st['min'])}-{ms(st['max'])} | "
                    + (f"{ms(p['median'])}; {ms(p['min'])}-{ms(p['max'])} |" if p else "– |"))
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
