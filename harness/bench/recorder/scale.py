"""How ``harness analyze`` grows with the number of tasks.

``python -m harness.bench.recorder.scale SOURCE [--tasks 8 32 128 256]``:
``SOURCE`` is the directory of a real 2-task recorded job whose worker 1 is
the culprit (the lingering skipped step of ``tests/test_record.py``,
killed after its dumps).  For each size N it builds a job of N tasks from
those files, each in a directory of its own (a host each): worker 1 from
the culprit's files, every other worker from worker 0's, each with the
``TF_CONFIG`` of an N-task cluster and its host's clock set off by up to
5 s (the analyzer has to take it off again); the progress maps and stacks
are the real ones, byte for byte.  Then it times ``python -m harness
analyze`` over the N directories in a process of its own, and reads that
process's peak memory from the kernel (``wait4``).  One table row per
size: tasks, seconds, peak MiB, seconds per task, and the verdict's first
line, which must name worker 1.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Sequence, Tuple

from harness.record import files

SIZES = (8, 32, 128, 256)
CULPRIT = 1
MAX_SKEW = 5.0


def _sources(folder: str) -> Dict[int, str]:
    """Worker index -> the base path (``STEM``) of its files in ``folder``."""
    tasks, problems = files.read_dirs([folder])
    if problems:
        raise SystemExit("\n".join(problems))
    sources: Dict[int, str] = {}
    for t in tasks:
        index = t.task[1]
        if index is None:
            raise SystemExit(f"{os.path.join(t.folder, t.stem)}: no TF_CONFIG task index")
        sources[index] = os.path.join(t.folder, t.stem)
    return sources


def _config(n: int, i: int) -> dict:
    return {"cluster": {"worker": [f"host{k}:2222" for k in range(n)]},
            "task": {"type": "worker", "index": i}}


def _events(path: str, config: dict, n: int) -> bytes:
    out = []
    with open(path, "rb") as f:
        for line in f:
            e = json.loads(line)
            if e.get("kind") == "strategy_creating" and isinstance(e.get("data"), dict):
                e["data"]["tf_config"] = config
            elif e.get("kind") == "strategy_created":
                e["data"] = n
            out.append(json.dumps(e) + "\n")
    return "".join(out).encode()


def replicate(source: str, n: int, out: str, seed: int = 0) -> List[str]:
    """A job of ``n`` tasks in ``out`` built from the 2-task job in
    ``source`` (see the module docstring); the list of its directories."""
    bases = _sources(source)
    rng = random.Random(seed)
    dirs = []
    for i in range(n):
        base = bases[CULPRIT if i == CULPRIT else 0]
        folder = os.path.join(out, f"host{i}")
        os.makedirs(folder)
        stem = os.path.join(folder, f"worker-{i}.host{i}.{1000 + i}")
        config = _config(n, i)
        with open(base + files.META) as f:
            meta = json.load(f)
        meta.update(tf_config=config, host=f"host{i}", pid=1000 + i,
                    task={"type": "worker", "index": i})
        meta["clock"]["wall"] += rng.uniform(-MAX_SKEW, MAX_SKEW)
        files.write_meta(stem + files.META, meta)
        with open(stem + files.EVENTS, "wb") as f:
            f.write(_events(base + files.EVENTS, config, n))
        for ext in (files.PROGRESS, files.STACKS, files.WATCH):
            if os.path.exists(base + ext):
                shutil.copyfile(base + ext, stem + ext)
        dirs.append(folder)
    return dirs


def analyze(dirs: Sequence[str]) -> Tuple[float, float, int, str]:
    """(seconds, peak MiB, exit status, first line of the verdict) of
    ``harness analyze`` over ``dirs``, in a process of its own."""
    with tempfile.TemporaryFile("w+") as out:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "harness", "analyze", *dirs],
                                stdout=out, stderr=subprocess.STDOUT, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        lines = out.read().splitlines()
    first = next((ln for ln in lines if not ln.startswith("note:")), "")
    return seconds, usage.ru_maxrss / 1024, proc.returncode, first


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.bench.recorder.scale",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="the directory of a real 2-task recorded job, worker 1 to blame")
    p.add_argument("--tasks", type=int, nargs="+", default=list(SIZES))
    ns = p.parse_args(argv)
    print("| tasks | seconds | peak MiB | ms per task | verdict |")
    print("|---:|---:|---:|---:|---|")
    for n in ns.tasks:
        out = tempfile.mkdtemp(prefix="record-scale-")
        try:
            dirs = replicate(ns.source, n, out)
            seconds, peak, _, first = analyze(dirs)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        print(f"| {n} | {seconds:.2f} | {peak:.0f} | {1000 * seconds / n:.1f} | {first[:100]} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
