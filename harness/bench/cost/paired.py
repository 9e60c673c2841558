"""Alternating wall-time runs, each variant paired round by round with a
reference, and the command line of a benchmark made of them
(:mod:`harness.bench.cost.replica`, :mod:`harness.bench.cost.network`).
"""
from __future__ import annotations

import argparse
import time
from typing import Callable, Dict, List, Mapping, Sequence

from harness.bench.common import machine_info, machine_line, stats


def alternate(variants: Mapping[str, Callable[[], object]], rounds: int,
              reference: str) -> dict:
    """Call each of ``variants`` once a round, in turn, for ``rounds`` rounds,
    timing each call; return each variant's :func:`stats` of wall seconds,
    and ``"paired NAME"``: its difference from ``reference``, round by round
    (alternating, so drift on a shared machine hits all alike)."""
    walls: Dict[str, List[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, call in variants.items():
            t = time.monotonic()
            call()
            walls[name].append(time.monotonic() - t)
    fig: dict = {name: stats(w) for name, w in walls.items()}
    for name in variants:
        if name != reference:
            fig["paired " + name] = stats([b - a for a, b in zip(walls[reference], walls[name])])
    return fig


def render_walls(fig: dict, names: Sequence[str], label: str) -> str:
    """:func:`alternate`'s figures as a markdown table, in milliseconds."""
    ms = lambda x: f"{1000 * x:.0f}"   # noqa: E731
    rows = [f"| {label} | wall per run, ms (median; min-max) | minus {names[0]}, paired "
            f"(median; min-max) |", "|---|---|---|"]
    for name in names:
        st, p = fig[name], fig.get("paired " + name)
        rows.append(f"| {name} | {ms(st['median'])}; {ms(st['min'])}-{ms(st['max'])} | "
                    + (f"{ms(p['median'])}; {ms(p['min'])}-{ms(p['max'])} |" if p else "– |"))
    return "\n".join(rows)


def wall_benchmark_main(prog: str, doc: str, measure: Callable[[int, int], dict],
                        render: Callable[[dict], str], argv=None) -> None:
    """The command line of a wall-time benchmark: ``--rounds``, ``--workers``,
    then the machine's line and ``render(measure(rounds, workers))``."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    print(machine_line(machine_info()), flush=True)
    print(render(measure(args.rounds, args.workers)))
