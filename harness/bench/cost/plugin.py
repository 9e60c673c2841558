"""``python -m harness.bench.cost.plugin``: what the installed plugin costs a
pytest session that does not use the harness.

A session of one trivial test, in a directory of its own (no ini file, so
no project options), run ``--rounds`` times with the plugin and as many
with ``-p no:mwms``, alternating, each a fresh ``python -m pytest``
process; it prints the medians and their difference, and whether the
session with the plugin started a process (it must not: the report
header probes nothing).  ``--check MS`` exits 1 when the difference of
the medians is above ``MS`` milliseconds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

from harness.bench.common import machine_info, machine_line

TEST = "def test_trivial():\n    assert 1 + 1 == 2\n"


def _session(directory: str, plugin: bool) -> float:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_trivial.py"]
    if not plugin:
        cmd[3:3] = ["-p", "no:mwms"]
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_ADDOPTS", "MWMS_NETWORK_PROBES")}
    start = time.perf_counter()
    subprocess.run(cmd, cwd=directory, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def _processes_started(directory: str) -> List[str]:
    """The programs the plugin's session runs: subprocess calls, traced."""
    code = ("import subprocess, sys, pytest\n"
            "seen = []\n"
            "real = subprocess.Popen.__init__\n"
            "def traced(self, args, *a, **k):\n"
            "    seen.append(str(args))\n"
            "    return real(self, args, *a, **k)\n"
            "subprocess.Popen.__init__ = traced\n"
            "pytest.main(['-q', '-p', 'no:cacheprovider', 'test_trivial.py'])\n"
            "print('STARTED', seen)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=directory, capture_output=True,
                         text=True, check=True).stdout
    line = [ln for ln in out.splitlines() if ln.startswith("STARTED")][-1]
    return eval(line.split(" ", 1)[1])


def measure(rounds: int) -> Dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="mwms-plugin-cost-") as directory:
        with open(os.path.join(directory, "test_trivial.py"), "w") as f:
            f.write(TEST)
        _session(directory, True)   # warm the page cache and the bytecode
        _session(directory, False)
        times: Dict[str, List[float]] = {"with": [], "without": []}
        for _ in range(rounds):
            times["with"].append(_session(directory, True))
            times["without"].append(_session(directory, False))
        started = _processes_started(directory)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"rounds": rounds, "with_ms": med["with"] * 1e3, "without_ms": med["without"] * 1e3,
            "added_ms": (med["with"] - med["without"]) * 1e3, "processes": started}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.bench.cost.plugin",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--check", type=float, default=None, metavar="MS")
    args = ap.parse_args(argv)
    fig = measure(args.rounds)
    print(machine_line(machine_info()))
    print(f"one trivial test, median of {fig['rounds']} sessions each: "
          f"{fig['with_ms']:.0f} ms with the plugin, {fig['without_ms']:.0f} ms with "
          f"-p no:mwms: {fig['added_ms']:+.1f} ms; processes started: "
          f"{fig['processes'] or 'none'}")
    if args.check is not None and (fig["added_ms"] > args.check or fig["processes"]):
        print(f"over the limit ({args.check:g} ms, no process)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
