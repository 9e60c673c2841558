"""Run settings and their validation: pure functions, no TensorFlow, no pytest.

Each ``parse_*`` function takes what a user typed (a string from the command
line or an ini file, or a value from a marker) and returns the checked value,
or raises :class:`SettingError` with a message that names the option and the
allowed range.  The plugin turns that into a pytest usage error, so a bad
value never becomes a hang or a traceback.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

DEVICES = ("cpu", "gpu")
START_METHODS = ("forkserver", "spawn")
# A TensorFlow worker holds about 0.3-0.5 GiB once it has built a strategy;
# forked workers share TensorFlow's pages, but their heaps and gRPC threads
# do not.  More than this per GiB of RAM, or per core, only measures swapping.
GIB_PER_WORKER = 0.5
WORKERS_PER_CORE = 8
MAX_WORKERS_CAP = 64


class SettingError(ValueError):
    """A bad option or marker value; the message is for the user."""


def max_workers(cpu_count: Optional[int] = None, mem_bytes: Optional[int] = None) -> int:
    """The most workers this machine can hold, by cores and by memory."""
    cpu_count = cpu_count or os.cpu_count() or 1
    if mem_bytes is None:
        try:
            mem_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            mem_bytes = 8 << 30
    by_mem = int(mem_bytes / (GIB_PER_WORKER * (1 << 30)))
    return max(1, min(MAX_WORKERS_CAP, cpu_count * WORKERS_PER_CORE, by_mem))


def parse_workers(value: Any, option: str = "--mwms-workers", limit: Optional[int] = None) -> int:
    limit = max_workers() if limit is None else limit
    try:
        n = int(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        n = None
    if n is None:
        raise SettingError(f"{option}: {value!r} is not a whole number; "
                           f"use an integer from 1 to {limit}")
    if not 1 <= n <= limit:
        raise SettingError(f"{option}: {n} is out of range; this machine holds "
                           f"1 to {limit} workers")
    return n


def parse_seconds(value: Any, option: str, allow_zero: bool = False) -> float:
    try:
        s = float(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        s = None
    if s is None or s != s or s in (float("inf"), float("-inf")):
        raise SettingError(f"{option}: {value!r} is not a number of seconds")
    if s < 0 or (s == 0 and not allow_zero):
        bound = "zero or more" if allow_zero else "greater than 0"
        raise SettingError(f"{option}: {s:g} is out of range; use a number of seconds {bound}")
    return s


def parse_choice(value: Any, option: str, choices: tuple) -> str:
    v = str(value).strip().lower()
    if v not in choices:
        raise SettingError(f"{option}: {value!r} is not one of {', '.join(choices)}")
    return v


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """Everything that shapes a run besides ``fn`` and the faults.

    ``timeout``: seconds without progress (a step boundary, a phase change or
    a worker finishing) after which the run is declared hung.

    ``grace``: once a worker has raised or died, seconds its peers get to
    finish or fail on their own before they are dumped and killed.
    TensorFlow reports a dead peer to the others as ``UnavailableError``
    after about 10 s (the coordination service's heartbeat); a shorter grace
    reports faster but records fewer of those echoes.

    ``start_method``: ``forkserver`` forks workers from a server that has
    already imported TensorFlow (about 0.4 s per 2-worker run instead of
    5-10 s); ``spawn`` starts a fresh interpreter per worker.
    """

    workers: int = 2
    timeout: float = 30.0
    grace: float = 5.0
    devices: str = "cpu"
    start_method: str = "forkserver"

    def with_overrides(self, **overrides: Any) -> "RunSettings":
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})


MARKER_KEYS = ("workers", "timeout", "grace")


def parse_marker(kwargs: dict, args: tuple = (), limit: Optional[int] = None) -> dict:
    """Validate ``@pytest.mark.mwms(...)`` arguments; return the overrides."""
    if args:
        raise SettingError(f"@pytest.mark.mwms takes keyword arguments only "
                           f"({', '.join(MARKER_KEYS)}), got positional {args!r}")
    unknown = sorted(set(kwargs) - set(MARKER_KEYS))
    if unknown:
        raise SettingError(f"@pytest.mark.mwms: unknown argument(s) {', '.join(unknown)}; "
                           f"allowed: {', '.join(MARKER_KEYS)}")
    out: dict = {}
    if "workers" in kwargs:
        out["workers"] = parse_workers(kwargs["workers"], "@pytest.mark.mwms(workers=...)", limit)
    if "timeout" in kwargs:
        out["timeout"] = parse_seconds(kwargs["timeout"], "@pytest.mark.mwms(timeout=...)")
    if "grace" in kwargs:
        out["grace"] = parse_seconds(kwargs["grace"], "@pytest.mark.mwms(grace=...)", allow_zero=True)
    return out


def gpu_assignment(num_workers: int, visible: list[str]) -> list[str]:
    """Split the visible GPU ids among the workers: a ``CUDA_VISIBLE_DEVICES``
    value per worker.  Each worker gets ``len(visible) // num_workers`` GPUs;
    leftovers stay unused, so every replica is the same size (MWMS needs the
    same number of devices per worker)."""
    if not visible:
        raise SettingError("--mwms-devices=gpu: no GPU is visible "
                           "(CUDA_VISIBLE_DEVICES is empty and nvidia-smi lists none)")
    per = len(visible) // num_workers
    if per == 0:
        raise SettingError(f"--mwms-devices=gpu: {num_workers} workers but only "
                           f"{len(visible)} GPU(s) visible; use at most {len(visible)} workers")
    return [",".join(visible[i * per:(i + 1) * per]) for i in range(num_workers)]


def visible_gpus(env: Optional[dict] = None) -> list[str]:
    """GPU ids the parent may hand out, without initialising CUDA here."""
    env = os.environ if env is None else env
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return [g for g in (x.strip() for x in cvd.split(",")) if g and g != "-1"]
    import shutil
    import subprocess
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(l for l in out.splitlines() if l.startswith("GPU "))]
