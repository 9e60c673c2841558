"""One validator per setting: each checks a value as typed (or passed) and
returns it checked, or raises a :class:`~harness.errors.SettingError` that
names where the value came from (``option``: ``--mwms-workers``, ``ini
mwms_workers``, ``@pytest.mark.mwms(workers=...)``, ``--workers``).
:mod:`harness.settings` puts them in its options table.

Pure functions: no TensorFlow, no pytest.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Optional

from harness.core.tfconfig import TASK_TYPES, ClusterShape
from harness.errors import SettingError, hide_in_setup_errors

# pytest leaves this module's frames out of a setup error's traceback.
__tracebackhide__ = hide_in_setup_errors

# The options' choices, declared with the table (the pytest plugin loads
# this module and nothing heavier): the modules they configure take them
# from here, and tests/unit/test_settings.py checks that each module's own
# table has exactly these rows.
DEVICES = ("cpu", "gpu", "gpu-shared")
START_METHODS = ("forkserver", "spawn")
NETWORK_MODES = ("auto", "isolated", "switched", "host")
BACKEND_NAMES = ("local", "ray")
DEFAULT_BACKEND = "local"
REPORT_MODES = ("failed", "all")

# A TensorFlow worker holds about 0.3-0.5 GiB once it has built a strategy;
# forked workers share TensorFlow's pages, but their heaps and gRPC threads
# do not.  More than this per GiB of RAM, or per core, only measures swapping.
GIB_PER_WORKER = 0.5
WORKERS_PER_CORE = 8
MAX_WORKERS_CAP = 64
MAX_RESTARTS = 100
MAX_RAY_NODES = 16
# A timeout, a grace or a fault's seconds beyond a day makes no sense for a
# test, and a sleep that long overflows.
MAX_SECONDS = 86_400.0


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


def _whole(value: Any) -> Optional[int]:
    try:
        return int(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        return None


def parse_workers(value: Any, option: str = "--mwms-workers", limit: Optional[int] = None) -> int:
    limit = max_workers() if limit is None else limit
    n = _whole(value)
    if n is None:
        raise SettingError(f"{option}: {value!r} is not a whole number; "
                           f"use an integer from 1 to {limit}")
    if not 1 <= n <= limit:
        raise SettingError(f"{option}: {n} is out of range; this machine holds "
                           f"1 to {limit} workers")
    return n


# Why a task type MWMS does not run in its collectives is refused.
OTHER_TASK_TYPES = {
    "master": "'master' is TensorFlow 1's name for the chief; use 'chief'",
}


def parse_cluster(value: Any, option: str = "--mwms-cluster",
                  limit: Optional[int] = None) -> Optional[ClusterShape]:
    """A cluster's shape: ``chief:1,worker:2,evaluator:1`` (or, for
    ParameterServerStrategy, ``chief:1,worker:2,ps:1``), a mapping of task
    type to count, or a :class:`ClusterShape`; empty or None: workers only
    (the ``workers`` setting)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    servers = True
    if isinstance(value, ClusterShape):
        counts, servers = value.counts(), value.servers
    elif isinstance(value, str):
        counts = {}
        for part in value.split(","):
            kind, sep, count = part.strip().partition(":")
            if not sep or _whole(count) is None:
                raise SettingError(f"{option}: {part.strip()!r} is not TYPE:COUNT; write the "
                                   f"shape as chief:1,worker:2,evaluator:1")
            if kind.strip() in counts:
                raise SettingError(f"{option}: {kind.strip()!r} is given twice in {value!r}")
            counts[kind.strip()] = _whole(count)
    elif hasattr(value, "items"):
        counts = dict(value.items())
    else:
        raise SettingError(f"{option}: {value!r} is not a cluster shape; give a mapping of "
                           f"task type to count, such as {{'chief': 1, 'worker': 2}}")
    for kind, count in counts.items():
        if kind not in TASK_TYPES:
            why = OTHER_TASK_TYPES.get(kind, "TensorFlow's strategies know "
                                             + ", ".join(TASK_TYPES))
            raise SettingError(f"{option}: task type {kind!r} is not one the harness runs: {why}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise SettingError(f"{option}: the count of {kind!r} must be a whole number 0 or "
                               f"more, got {count!r}")
    shape = ClusterShape(**{"worker": 0, **counts}, servers=servers)
    if shape.chief > 1:
        raise SettingError(f"{option}: {shape.chief} chiefs; a cluster has at most one chief")
    if shape.evaluator > 1:
        raise SettingError(f"{option}: {shape.evaluator} evaluators; a cluster has at most "
                           f"one evaluator")
    if shape.coordinated and not shape.chief:
        raise SettingError(f"{option}: {shape.spec()} has parameter servers but no chief; "
                           f"ParameterServerStrategy runs its job (the ClusterCoordinator) on "
                           f"the chief: add chief:1")
    if shape.coordinated and not shape.worker:
        raise SettingError(f"{option}: {shape.spec()} has no worker; the ClusterCoordinator "
                           f"runs the job's functions on workers: add worker:1 or more")
    if shape.coordinated and shape.evaluator:
        raise SettingError(f"{option}: {shape.spec()}: the harness runs no evaluator beside "
                           f"parameter servers; leave evaluator out")
    if shape.training < 1:
        raise SettingError(f"{option}: no training task in {shape.spec() or value!r}; a "
                           f"cluster needs a chief or a worker")
    limit = max_workers() if limit is None else limit
    if shape.total > limit:
        raise SettingError(f"{option}: {shape.total} tasks; this machine holds 1 to {limit}")
    return shape


def parse_seconds(value: Any, option: str = "--mwms-timeout", allow_zero: bool = False) -> float:
    try:
        s = float(str(value).strip()) if not isinstance(value, bool) else None
    except ValueError:
        s = None
    if s is None or s != s or s in (float("inf"), float("-inf")):
        raise SettingError(f"{option}: {value!r} is not a number of seconds")
    if s < 0 or (s == 0 and not allow_zero) or s > MAX_SECONDS:
        bound = "from 0" if allow_zero else "greater than 0 and"
        raise SettingError(f"{option}: {s:g} is out of range; use a number of seconds {bound} "
                           f"up to {MAX_SECONDS:g} (a day)")
    return s


def parse_grace(value: Any, option: str = "--mwms-grace") -> float:
    return parse_seconds(value, option, allow_zero=True)


def parse_count(value: Any, option: str, what: str, lo: int, hi: int) -> int:
    """A whole number of ``what`` from ``lo`` to ``hi``, as typed or given."""
    n = _whole(value)
    if n is None or not lo <= n <= hi:
        raise SettingError(f"{option}: {value!r} is not a number of {what}; use a whole "
                           f"number from {lo} to {hi}")
    return n


def parse_restarts(value: Any, option: str = "--mwms-restarts") -> int:
    """A number of restarts: a whole number from 0 to :data:`MAX_RESTARTS`."""
    return parse_count(value, option, "restarts", 0, MAX_RESTARTS)


def parse_ray_nodes(value: Any, option: str = "--mwms-ray-nodes") -> int:
    return parse_count(value, option, "nodes", 1, MAX_RAY_NODES)


# What a restart can follow: the names ``run(restart_on=...)`` takes, and
# the outcome each stands for.
# run(restart_on=...)'s words and the outcomes they name (Outcome's values).
RESTART_ON = {"crash": "crashed", "fail": "failed", "hang": "hang"}
DEFAULT_RESTART_ON = "crash,fail"
# explore's plans hold up to this many faults.  One: a second fault is
# worth drawing in a restart attempt that leaves a restart after it
# (restarts >= 2 under "survives"), and a search asked for more says so.
DEFAULT_MAX_FAULTS = 1


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
    from harness.diagnosis.observations import Outcome
    return frozenset(Outcome(v) for v in out)


# What a restart starts again: the whole cluster, or only the task that
# crashed or failed (a pod restart: the others keep their processes).
RESTART_POLICIES = ("cluster", "task")
DEFAULT_RESTART_POLICY = "cluster"


def parse_restart_policy(value: Any, option: str = "--mwms-restart-policy") -> str:
    return parse_choice(value, option, RESTART_POLICIES)


def parse_choice(value: Any, option: str, choices: tuple) -> str:
    v = str(value).strip().lower()
    if v not in choices:
        raise SettingError(f"{option}: {value!r} is not one of {', '.join(choices)}")
    return v


def parse_devices(value: Any, option: str = "--mwms-devices") -> str:
    return parse_choice(value, option, DEVICES)


def parse_start_method(value: Any, option: str = "--mwms-start-method") -> Optional[str]:
    """A start method, or None (unset: :func:`finish` chooses by device)."""
    return None if value in (None, "") else parse_choice(value, option, START_METHODS)


def parse_network(value: Any, option: str = "--mwms-network") -> str:
    return parse_choice(value, option, NETWORK_MODES)


def parse_backend(value: Any, option: str = "--mwms-backend") -> str:
    return parse_choice(value, option, BACKEND_NAMES)


def parse_report(value: Any, option: str = "--mwms-report") -> str:
    return parse_choice(value, option, REPORT_MODES)


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


def parse_ray_address(value: Any, option: str = "--mwms-ray-address") -> Optional[str]:
    """Empty (a local cluster: None), ``auto`` or ``HOST:PORT``."""
    text = str(value or "").strip()
    if not text or text == "auto":
        return text or None
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SettingError(f"{option}: {text!r} is not auto or HOST:PORT")
    return text


def parse_whole(value: Any, option: str, least: int = 0) -> int:
    """A whole number, ``least`` or more, with no upper bound (a seed, a
    number of faults in one plan)."""
    n = _whole(value)
    if n is None or n < least:
        raise SettingError(f"{option}: {value!r} is not a whole number {least} or more")
    return n


def parse_seed(value: Any, option: str = "explore(seed=...)") -> Optional[int]:
    """A seed, or None (unset: a fresh one)."""
    return None if value is None or value == "" else parse_whole(value, option, 0)


def parse_each(values: Any, parse: Callable[[Any, str], Any], option: str) -> tuple:
    """A list of values for one setting (``@pytest.mark.mwms(workers=[2, 3])``):
    at least one, each checked by ``parse``, none twice."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise SettingError(f"{option}: {values!r} is not a list of values")
    if not values:
        raise SettingError(f"{option}: the list is empty; give at least one value, "
                           f"such as [2, 3]")
    out = tuple(parse(v, option) for v in values)
    twice = sorted({v for v in out if out.count(v) > 1}, key=str)
    if twice:
        raise SettingError(f"{option}: {twice[0]!r} is given twice in {list(values)!r}")
    return out


def parse_directory(value: Any, option: str = "--mwms-state-dir") -> Optional[str]:
    """A directory, already made absolute by the source that read it; None when unset."""
    text = str(value or "").strip()
    return text or None
