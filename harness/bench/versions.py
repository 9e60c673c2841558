"""``python -m harness.bench.versions``: the catalogue's outcome on each
TensorFlow minor, each in a virtual environment of its own.

For each minor (2.15 to 2.21 by default) it makes (or reuses) a virtual
environment under ``--venvs``, installs ``tensorflow~=2.N.0`` first, then
this checkout (``-e .[test]``) and what gives Keras 2 beside it
(``python -m harness keras2``), checks that the install left TensorFlow as
it was, and runs ``pytest scenarios/`` there.  Each scenario writes the
outcome of its run (``MWMS_SCENARIO_OUTCOMES``, scenarios/conftest.py) and
whether its test passed, that is whether the outcome is the one
``@scenario`` declares for that version.  Then it writes the table
into docs/versions.md (``--write``): one row per scenario, one column per
version, with the date and the machine.

Downloads TensorFlow once per minor (about 500 MB each); on a 2-core
machine each minor takes 4-7 minutes.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from typing import Dict, List, Sequence

from harness.core import versions

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "versions.md")
START, END = "<!-- outcomes:start -->", "<!-- outcomes:end -->"
ALL_MINORS = tuple(f"{versions.OLDEST[0]}.{m}"
                   for m in range(versions.OLDEST[1], versions.NEWEST[1] + 1))


def _pip(venv: str, *args: str) -> None:
    subprocess.run([os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q", *args],
                   check=True)


def _version_of(venv: str, package: str) -> str:
    return subprocess.run(
        [os.path.join(venv, "bin", "python"), "-c",
         f"import importlib.metadata as m; print(m.version({package!r}))"],
        check=True, capture_output=True, text=True).stdout.strip()


def prepare(minor: str, venvs: str) -> str:
    """A virtual environment with TensorFlow ``minor`` and this checkout."""
    venv = os.path.join(venvs, f"tf{minor}")
    if not os.path.exists(os.path.join(venv, "bin", "python")):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        _pip(venv, "--upgrade", "pip")
        _pip(venv, f"tensorflow~={minor}.0")
    before = _version_of(venv, "tensorflow")
    _pip(venv, "-e", f"{ROOT}[test]")
    _pip(venv, versions.keras2_requirement(before))
    after = _version_of(venv, "tensorflow")
    if after != before:
        raise SystemExit(f"installing the project changed TensorFlow {before} to {after}")
    return venv


def run_catalogue(venv: str, workers: int, parallel: int) -> dict:
    """Each scenario's outcome and whether its test passed, on ``venv``'s TensorFlow."""
    with tempfile.TemporaryDirectory(prefix="mwms-versions-") as tmp:
        outcomes = os.path.join(tmp, "outcomes.jsonl")
        cmd = [os.path.join(venv, "bin", "python"), "-m", "pytest", "scenarios/", "-q",
               "-p", "no:randomly", f"--mwms-workers={workers}"]
        cmd += ["-n", str(parallel if parallel > 1 else 0)]   # 0: no xdist (the default has it)
        env = dict(os.environ, MWMS_SCENARIO_OUTCOMES=outcomes)
        subprocess.run(cmd, cwd=ROOT, env=env, check=False)
        with open(outcomes) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    found = {row["test"]: row for row in rows}
    return {"tensorflow": _version_of(venv, "tensorflow"),
            "keras": _keras_of(venv), "scenarios": found}


def _keras_of(venv: str) -> str:
    keras = _version_of(venv, "keras")
    try:
        return f"Keras {keras}, tf_keras {_version_of(venv, 'tf_keras')}"
    except subprocess.CalledProcessError:
        return f"Keras {keras}"


def _supported_text(minor: str) -> bool:
    try:
        return versions.supported(versions.minor_of(minor))
    except ValueError:
        return False


def cell(row: dict) -> str:
    if row is None:
        return "–"
    text = row["outcome"] + (f" ({row['error']})" if row.get("error") else "")
    return text if row["passed"] else f"{text} ✗"


def table(results: Sequence[dict], machine: str, day: str, workers: int) -> str:
    """The markdown between the markers of docs/versions.md."""
    tests = sorted({t for r in results for t in r["scenarios"]})
    head = [f"| Scenario | {' | '.join(r['tensorflow'] for r in results)} |",
            f"|---|{'---|' * len(results)}"]
    rows = [f"| `{t.removeprefix('scenarios/')}` | "
            f"{' | '.join(cell(r['scenarios'].get(t)) for r in results)} |" for t in tests]
    differ = [t for t in tests if len({cell(r["scenarios"].get(t)).removesuffix(" ✗")
                                       for r in results}) > 1]
    lines = [f"Made by `python -m harness.bench.versions --write` on {day}, {machine}; "
             f"{workers} workers. Each column: "
             + "; ".join(f"{r['tensorflow']} ({r['keras']})" for r in results) + ".",
             "A cell is the outcome of the scenario's run there; ✗ marks a test that failed "
             "there (the outcome is not the one declared for that version).", "",
             f"Outcomes that differ by version ({len(differ)} of {len(tests)} scenarios):", ""]
    lines += head + [rows[tests.index(t)] for t in differ]
    lines += ["", "Every scenario:", ""] + head + rows
    return "\n".join(lines)


def write(doc: str, body: str) -> None:
    with open(doc) as f:
        text = f.read()
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    with open(doc, "w") as f:
        f.write(f"{before}{START}\n{body}\n{END}{after}")


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.bench.versions",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--minors", default=",".join(ALL_MINORS),
                        help="comma-separated TensorFlow minors (default: %(default)s)")
    parser.add_argument("--venvs", default=os.path.join(tempfile.gettempdir(), "mwms-tf-venvs"),
                        help="where the virtual environments are made and reused")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("-n", "--parallel", type=int, default=2, help="pytest-xdist workers")
    parser.add_argument("--json", help="also write the results as JSON here")
    parser.add_argument("--write", action="store_true", help="write the table into docs/versions.md")
    ns = parser.parse_args(list(argv))
    minors = [m.strip() for m in ns.minors.split(",") if m.strip()]
    bad = [m for m in minors if not _supported_text(m)]
    if bad:
        parser.error(f"--minors: {', '.join(bad)} not a minor within {versions.range_text()}")
    results: List[Dict] = []
    for minor in minors:
        print(f"== TensorFlow {minor}", flush=True)
        results.append(run_catalogue(prepare(minor, ns.venvs), ns.workers, ns.parallel))
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    body = table(results, machine, datetime.date.today().isoformat(), ns.workers)
    print(body)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(results, f, indent=1)
    if ns.write:
        write(DOC, body)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
