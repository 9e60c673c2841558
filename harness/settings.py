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


from .errors import SettingError  # raised by every parse_* below


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


MAX_RESTARTS = 100


def parse_count(value: Any, option: str, what: str, lo: int, hi: int) -> int:
    """A whole number of ``what`` from ``lo`` to ``hi``, as typed or given."""
    try:
        n = int(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        n = None
    if n is None or not lo <= n <= hi:
        raise SettingError(f"{option}: {value!r} is not a number of {what}; use a whole "
                           f"number from {lo} to {hi}")
    return n


def parse_restarts(value: Any, option: str = "--mwms-restarts") -> int:
    """A number of restarts: a whole number from 0 to :data:`MAX_RESTARTS`."""
    return parse_count(value, option, "restarts", 0, MAX_RESTARTS)


# What a restart can follow: the names ``run(restart_on=...)`` takes, and
# the outcome each stands for.
RESTART_ON = {"crash": "crashed", "fail": "failed", "hang": "hang"}
DEFAULT_RESTART_ON = "crash,fail"


def parse_restart_on(value: Any, option: str = "run(restart_on=...)") -> frozenset:
    """``"crash,fail"`` (or a sequence of those words) as the set of outcomes
    after which a run with restarts left starts again."""
    words = value if isinstance(value, (list, tuple, set, frozenset)) else str(value).split(",")
    out = set()
    for word in (str(w).strip().lower() for w in words):
        if word not in RESTART_ON:
            raise SettingError(f"{option}: {word!r} is not one of {', '.join(RESTART_ON)} "
                               f"(comma-separated)")
        out.add(RESTART_ON[word])
    if not out:
        raise SettingError(f"{option}: name at least one of {', '.join(RESTART_ON)}")
    return frozenset(out)


def parse_choice(value: Any, option: str, choices: tuple) -> str:
    v = str(value).strip().lower()
    if v not in choices:
        raise SettingError(f"{option}: {value!r} is not one of {', '.join(choices)}")
    return v


@dataclasses.dataclass(frozen=True)
class Option:
    """One setting of the plugin: the single source of its name, default and text.

    The plugin builds its command-line option (``--mwms-<name>``) and its ini
    key (``mwms_<name>`` with ``_`` for ``-``) from it, and README.md's
    options table is generated from :data:`OPTIONS` (``python -m
    harness.settings`` prints it; a test fails when the README differs).
    """

    name: str
    metavar: str
    default: Optional[str]   # as a user would type it; None: worked out at run time
    default_text: str        # the default, for people
    help: str                # what it does, one line
    tradeoff: str = ""       # what choosing a value costs, for the README

    @property
    def flag(self) -> str:
        return f"--mwms-{self.name}"

    @property
    def ini(self) -> str:
        return "mwms_" + self.name.replace("-", "_")


OPTIONS = (
    Option("workers", "N", "2", "2",
           "workers per cluster, 1 to what the machine holds (8 per core, one per 0.5 GiB "
           "RAM, at most 64)",
           "More workers than cores works (the workers mostly wait on each other), but "
           "start-up and steps slow down."),
    Option("timeout", "SECONDS", "30", "30",
           "a run is hung when no worker made progress (step boundary, phase change, "
           "finishing) for this long",
           "Lower reports faster; too low calls slow start-up (5-10 s under spawn) or long "
           "steps a hang."),
    Option("grace", "SECONDS", "5", "5",
           "once a worker raised or died, how long the others get to finish or fail before "
           "they are dumped and killed",
           "TensorFlow tells survivors of a dead peer after about 10 s: raise it to record "
           "those errors, lower it to fail faster."),
    Option("devices", "cpu|gpu", "cpu", "cpu",
           "`cpu` hides all GPUs; `gpu` splits the visible GPUs among the workers via "
           "`CUDA_VISIBLE_DEVICES`",
           "Each worker gets the same number of GPUs; leftovers stay unused."),
    Option("start-method", "forkserver|spawn", None, "forkserver on cpu, spawn on gpu",
           "forkserver forks workers from a server that imported TensorFlow once; spawn "
           "starts a fresh Python per worker",
           "forkserver: a 2-worker run in ~0.3 s after the first. spawn: 5-10 s a run, "
           "nothing shared (forking a process that loaded CUDA is not shown safe)."),
    Option("preload", "MODULES", "", "none",
           "comma-separated modules the forkserver imports once before it forks workers "
           "(your package, what a script imports), besides TensorFlow, pytest and hypothesis",
           "Each run then skips importing them. One that fails to import, or starts a thread, "
           "is a warning and is left out."),
    Option("restarts", "K", "0", "0",
           "after a run crashed or failed, restart its whole cluster up to K times (same "
           "ports and `TF_CONFIG`, fresh processes), as a cluster manager would",
           "Each restart pays a cluster start-up again; a hang is restarted only when "
           "`run(restart_on=...)` asks."),
    Option("network", "auto|isolated|host", "auto", "auto",
           "`isolated` runs each cluster in a network namespace of its own, unreachable "
           "from the host; `auto` does where the machine allows it (the session header "
           "says which); `host` runs on the host's loopback",
           "On the host, every worker is an unauthenticated TensorFlow server on all "
           "interfaces while a run lasts; isolation costs a few milliseconds a run."),
    Option("backend", "local|ray", "local", "local",
           "where workers run: `local` processes on this machine, or `ray`: on the nodes of "
           "a Ray cluster (`pip install -e '.[ray]'`), one agent per node starting them",
           "Ray: a session pays the cluster's start-up (about 4 s for 2 local nodes), a "
           "warm 2-worker run about 40 ms more than local (benchmark); no network "
           "isolation or network faults."),
    Option("ray-address", "HOST:PORT|auto", "", "none: a local cluster for the session",
           "with `--mwms-backend=ray`: the Ray cluster to join (`auto`: the one Ray finds); "
           "unset, the session starts a local cluster and shuts it down at its end",
           "A cluster joined is left running; one started is gone at the end, even if "
           "pytest is killed."),
    Option("ray-nodes", "K", "2", "2",
           "with `--mwms-backend=ray` and no address: the local cluster's simulated nodes "
           "(workers spread one per node, round-robin)",
           "Each node is a raylet and its agents: about 1 s of start-up and 100-200 MiB."),
    Option("report-dir", "DIR", None, "none",
           "write a timeline of each run (a Chrome trace for Perfetto and an SVG picture) "
           "into DIR; the failure report names the files",
           "Costs a few milliseconds a run written; `--mwms-report` chooses which runs."),
    Option("report", "failed|all", "failed", "failed",
           "with `--mwms-report-dir`: a timeline for the runs that did not complete, or for "
           "all",
           "`all` also draws the runs that completed, to compare a good run with a bad one."),
    Option("state-dir", "DIR", None, "$MWMS_STATE_DIR, else the temp directory's "
           "`pytest-mwms-ports`",
           "where the harness coordinates the ports it reserves with other pytest processes "
           "and other users",
           "Set it when the shared default cannot be used; processes that should not "
           "collide must use the same one."),
)
OPTION = {o.name: o for o in OPTIONS}


def parse_modules(value: Any, option: str = "--mwms-preload") -> tuple:
    """``"pkg.a, pkg.b"`` (or a list) as module names, each checked for shape."""
    names = value if isinstance(value, (list, tuple)) else str(value or "").replace("\n", ",").split(",")
    out = []
    for name in (str(n).strip() for n in names):
        if not name:
            continue
        if not all(part.isidentifier() for part in name.split(".")):
            raise SettingError(f"{option}: {name!r} is not a module name")
        out.append(name)
    return tuple(out)


def options_markdown() -> str:
    """README.md's options table, made from :data:`OPTIONS`."""
    rows = ["| option | ini key | default | meaning |", "|---|---|---|---|"]
    for o in OPTIONS:
        meaning = o.help + (f". {o.tradeoff}" if o.tradeoff else "")
        rows.append(f"| `{o.flag}={o.metavar.replace('|', chr(92) + '|')}` | `{o.ini}` | "
                    f"{o.default_text} | {meaning} |")
    return "\n".join(rows)


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """Everything that shapes a run besides ``fn`` and the faults: one field
    per option of :data:`OPTIONS` (``start_method`` for ``start-method``,
    ``state_dir`` for ``state-dir``, ``report_dir`` for ``report-dir``),
    where each is documented."""

    workers: int = 2
    timeout: float = 30.0
    grace: float = 5.0
    devices: str = "cpu"
    start_method: str = "forkserver"
    state_dir: Optional[str] = None
    preload: tuple = ()
    restarts: int = 0
    network: str = "auto"
    report_dir: Optional[str] = None
    report: str = "failed"
    backend: str = "local"
    ray_address: Optional[str] = None
    ray_nodes: int = 2

    def with_overrides(self, **overrides: Any) -> "RunSettings":
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})


MARKER_KEYS = ("workers", "timeout", "grace", "restarts", "network", "backend")
NETWORKS = ("auto", "isolated", "host")
BACKENDS = ("local", "ray")
MAX_RAY_NODES = 16


def parse_ray_address(value: Any, option: str = "--mwms-ray-address") -> Optional[str]:
    """Empty (a local cluster: None), ``auto`` or ``HOST:PORT``."""
    text = str(value or "").strip()
    if not text or text == "auto":
        return text or None
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SettingError(f"{option}: {text!r} is not auto or HOST:PORT")
    return text


def parse_ray_nodes(value: Any, option: str = "--mwms-ray-nodes") -> int:
    return parse_count(value, option, "nodes", 1, MAX_RAY_NODES)


def check_backend(settings: "RunSettings", option: str = "--mwms-backend") -> None:
    """A backend this machine can use with these settings, or a SettingError."""
    if settings.backend != "ray":
        return
    import importlib.util
    if importlib.util.find_spec("ray") is None:
        raise SettingError(f"{option}=ray: Ray is not installed; install it with "
                           f"pip install -e '.[ray]' (or pip install ray)")
    if settings.network == "isolated":
        raise SettingError(f"{option}=ray: workers run on the Ray nodes' own network, so "
                           f"network='isolated' cannot be had; use auto or host")
    if settings.devices == "gpu":
        raise SettingError(f"{option}=ray: GPUs are not handed out on Ray yet; use "
                           f"--mwms-devices=cpu")


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
    if "restarts" in kwargs:
        out["restarts"] = parse_restarts(kwargs["restarts"], "@pytest.mark.mwms(restarts=...)")
    if "network" in kwargs:
        out["network"] = parse_choice(kwargs["network"], "@pytest.mark.mwms(network=...)",
                                      NETWORKS)
    if "backend" in kwargs:
        out["backend"] = parse_choice(kwargs["backend"], "@pytest.mark.mwms(backend=...)",
                                      BACKENDS)
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


if __name__ == "__main__":
    print(options_markdown())
