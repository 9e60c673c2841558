"""Run settings: the options table and the one pipeline that reads them.

Each :class:`Option` of :data:`OPTIONS` is one row: its name, default and
text, the parser that checks a value, and where it may be set (pytest's
command line, the ini file, the ``mwms`` marker, ``harness run``).  The
plugin, the marker and the command line all go through :func:`read_settings`
or :func:`apply_marker`, so a new option is one row, and every bad value is
a :class:`SettingError` naming where it came from (``--mwms-workers``,
``ini mwms_workers``, ``@pytest.mark.mwms(workers=...)``, ``--workers``).

Pure functions: no TensorFlow, no pytest.
"""
from __future__ import annotations

import dataclasses
import itertools
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from harness.core.tfconfig import ClusterShape
from harness.errors import SettingError, hide_in_setup_errors
from harness.validators import (BACKEND_NAMES, DEFAULT_BACKEND, DEFAULT_RESTART_POLICY, DEVICES,
                                NETWORK_MODES, REPORT_MODES, RESTART_POLICIES, START_METHODS,
                                parse_backend, parse_each,
                                parse_cluster, parse_devices, parse_directory, parse_grace,
                                parse_modules, parse_network, parse_ray_address,
                                parse_ray_nodes, parse_report, parse_restart_policy,
                                parse_restarts, parse_seconds, parse_start_method,
                                parse_workers)

# pytest leaves this module's frames out of a setup error's traceback.
__tracebackhide__ = hide_in_setup_errors

# Where an option can be set, and how an error names the place.
PLACES = ("command line", "ini", "marker", "cli")


@dataclasses.dataclass(frozen=True)
class Option:
    """One setting: the single source of its name, default, text and check.

    The plugin builds its command-line option (``--mwms-<name>``) and its ini
    key (``mwms_<name>`` with ``_`` for ``-``) from it, ``harness run`` its
    ``--<name>``, the marker its keyword (``<name>`` with ``_``), and the
    documentation's options table is generated from :data:`OPTIONS`
    (``python -m harness.settings`` prints it; a test fails when it differs).
    """

    name: str
    metavar: str
    default: Optional[str]   # as a user would type it; None: worked out at run time
    default_text: str        # the default, for people
    help: str                # what it does, one line
    tradeoff: str = ""       # what choosing a value costs, for the docs
    parse: Callable[[Any, str], Any] = parse_directory   # (value, where) -> checked value
    marker: bool = False     # settable per test by @pytest.mark.mwms(...)
    directory: bool = False  # a path: relative ones are resolved by the source
    # The marker may give a list (workers=[2, 3]): the test runs once per value.
    marker_list: bool = False

    @property
    def flag(self) -> str:
        return f"--mwms-{self.name}"

    @property
    def ini(self) -> str:
        return "mwms_" + self.field

    @property
    def field(self) -> str:
        """The :class:`RunSettings` field, and the marker's keyword."""
        return self.name.replace("-", "_")

    @property
    def places(self) -> Tuple[str, ...]:
        return tuple(p for p in PLACES if p != "marker" or self.marker)

    def where(self, place: str) -> str:
        """How an error names this option when the value came from ``place``."""
        return {"command line": self.flag, "ini": f"ini {self.ini}",
                "marker": f"@pytest.mark.mwms({self.field}=...)", "cli": f"--{self.name}"}[place]

    def help_for(self, place: str) -> str:
        """The help text with each option it mentions (written as pytest's
        ``--mwms-<name>``) named as it is set in ``place``: ``--<name>`` for
        ``harness run``."""
        return _FLAG.sub(lambda m: OPTION[m.group(1)].where(place), self.help)


# An option's flag as the help texts mention it.
_FLAG = re.compile(r"--mwms-([a-z]+(?:-[a-z]+)*)")


OPTIONS = (
    Option("workers", "N", "2", "2",
           "workers per cluster, 1 to what the machine holds (8 per core, one per 0.5 GiB "
           "RAM, at most 64)",
           "More workers than cores works (the workers mostly wait on each other), but "
           "start-up and steps slow down.",
           parse=parse_workers, marker=True, marker_list=True),
    Option("cluster", "chief:1,worker:N,evaluator:1", "", "workers only",
           "the cluster's shape by task type: a `chief` (MWMS numbers it first), `worker` "
           "tasks and an `evaluator` (outside the collectives), or `ps` tasks for a "
           "ParameterServerStrategy job (`chief:1,worker:2,ps:1`: the chief runs the job, "
           "the rest serve); each task gets the `TF_CONFIG` Kubeflow's TFJob gives it. Set, "
           "it replaces `workers`",
           "A chief is one more process in every collective; an evaluator one more process "
           "that the hang detector watches too; a parameter server one more server process.",
           parse=parse_cluster, marker=True),
    Option("timeout", "SECONDS", "30", "30",
           "a run is hung when no worker made progress (step boundary, phase change, "
           "finishing) for this long",
           "Lower reports faster; too low calls slow start-up (5-10 s under spawn) or long "
           "steps a hang.",
           parse=parse_seconds, marker=True),
    Option("grace", "SECONDS", "5", "5",
           "once a worker raised or died, how long the others get to finish or fail before "
           "they are dumped and killed",
           "TensorFlow tells survivors of a dead peer after about 10 s: raise it to record "
           "those errors, lower it to fail faster.",
           parse=parse_grace, marker=True),
    Option("devices", "|".join(DEVICES), "cpu", "cpu",
           "`cpu` hides all GPUs; `gpu` splits the visible GPUs among the workers via "
           "`CUDA_VISIBLE_DEVICES`; `gpu-shared` gives every worker every visible GPU",
           "`gpu`: each worker gets the same number of GPUs, leftovers stay unused. "
           "`gpu-shared` runs several workers on one GPU: turn memory growth on "
           "(`TF_FORCE_GPU_ALLOW_GROWTH=true`), or the first worker maps nearly all its memory.",
           parse=parse_devices),
    Option("start-method", "|".join(START_METHODS), None, "forkserver on cpu, spawn on gpu",
           "forkserver forks workers from a server that imported TensorFlow once; spawn "
           "starts a fresh Python per worker",
           "forkserver: a 2-worker run in ~0.3 s after the first. spawn: 5-10 s a run, "
           "nothing shared (forking a process that loaded CUDA is not shown safe).",
           parse=parse_start_method),
    Option("preload", "MODULES", "", "none",
           "comma-separated modules the forkserver imports once before it forks workers "
           "(your package, what a script imports), besides TensorFlow, pytest and hypothesis",
           "Each run then skips importing them. One that fails to import, or starts a thread, "
           "is a warning and is left out.",
           parse=parse_modules),
    Option("restarts", "K", "0", "0",
           "after a run crashed or failed, restart its whole cluster up to K times (same "
           "ports and `TF_CONFIG`, fresh processes), as a cluster manager would",
           "Each restart pays a cluster start-up again; a hang is restarted only when "
           "`run(restart_on=...)` asks.",
           parse=parse_restarts, marker=True),
    Option("restart-policy", "|".join(RESTART_POLICIES), DEFAULT_RESTART_POLICY,
           DEFAULT_RESTART_POLICY,
           "with restarts: `cluster` restarts every worker when one crashed or failed; `task` "
           "restarts only that worker (same address and `TF_CONFIG`, a fresh process; each "
           "worker up to K times) while the others keep running, as a pod restart does",
           "`task` is what Kubernetes does to one failed pod; TensorFlow's collectives then "
           "often fail on the others (the restarted task's incarnation is new): such an echo "
           "within 30 s of the restart starts every task again together, using none of their "
           "restarts ([api](api.md#task-restarts)).",
           parse=parse_restart_policy, marker=True),
    Option("network", "|".join(NETWORK_MODES), "auto", "auto",
           "`isolated` runs each cluster in a network namespace of its own, unreachable "
           "from the host; `auto` does where the machine allows it (the session summary "
           "says which); `switched` gives each worker a namespace of its own on a bridge, "
           "as network faults do, so that a run that ends without completing has its "
           "links tried ([network](network.md#links-tried-as-a-run-ends)); `host` runs on "
           "the host's loopback",
           "On the host, every worker is an unauthenticated TensorFlow server on all "
           "interfaces while a run lasts; isolation costs a few milliseconds a run.",
           parse=parse_network, marker=True),
    Option("backend", "|".join(BACKEND_NAMES), DEFAULT_BACKEND, DEFAULT_BACKEND,
           "where workers run: `local` processes on this machine, or `ray`: on the nodes of "
           "a Ray cluster (`pip install -e '.[ray]'`), one agent per node starting them",
           "Ray: a session pays the cluster's start-up (about 4 s for 2 local nodes), a "
           "warm 2-worker run about 40 ms more than local (benchmark); no network "
           "isolation or network faults.",
           parse=parse_backend, marker=True),
    Option("ray-address", "HOST:PORT|auto", "", "none: a local cluster for the session",
           "with `--mwms-backend=ray`: the Ray cluster to join (`auto`: the one Ray finds); "
           "unset, the session starts a local cluster and shuts it down at its end",
           "A cluster joined is left running; one started is gone at the end, even if "
           "pytest is killed.",
           parse=parse_ray_address),
    Option("ray-nodes", "K", "2", "2",
           "with `--mwms-backend=ray` and no address: the local cluster's simulated nodes "
           "(workers spread one per node, round-robin)",
           "Each node is a raylet and its agents: about 1 s of start-up and 100-200 MiB.",
           parse=parse_ray_nodes),
    Option("report-dir", "DIR", None, "none",
           "write a timeline of each run (a Chrome trace for Perfetto and an SVG picture) "
           "into DIR; the failure report names the files",
           "Costs a few milliseconds a run written; `--mwms-report` chooses which runs. A "
           "timeline that cannot be written is a `ReportWarning` and a line in its test's "
           "report; the session goes on.",
           parse=parse_directory, directory=True),
    Option("report", "|".join(REPORT_MODES), "failed", "failed",
           "with `--mwms-report-dir`: a timeline for the runs that did not complete, or for "
           "all",
           "`all` also draws the runs that completed, to compare a good run with a bad one.",
           parse=parse_report),
    Option("state-dir", "DIR", None, "$MWMS_STATE_DIR, else the temp directory's "
           "`pytest-mwms-ports-v2`",
           "where the harness coordinates the ports it reserves with other pytest processes "
           "and other users",
           "Set it when the shared default cannot be used; processes that should not "
           "collide must use the same one.",
           parse=parse_directory, directory=True),
)
OPTION = {o.name: o for o in OPTIONS}
BY_FIELD = {o.field: o for o in OPTIONS}
MARKER_KEYS = tuple(o.field for o in OPTIONS if o.marker)


def options_markdown() -> str:
    """The documentation's options table, made from :data:`OPTIONS`."""
    rows = ["| option | ini key | default | meaning |", "|---|---|---|---|"]
    for o in OPTIONS:
        meaning = o.help + (f". {o.tradeoff}" if o.tradeoff else "")
        rows.append(f"| `{o.flag}={o.metavar.replace('|', chr(92) + '|')}` | `{o.ini}` | "
                    f"{o.default_text} | {meaning} |")
    return "\n".join(rows)


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """Everything that shapes a run besides ``fn`` and the faults: one field
    per option of :data:`OPTIONS` (:attr:`Option.field`: ``start_method``
    for ``start-method``), where each is documented."""

    workers: int = 2
    cluster: Optional[ClusterShape] = None
    timeout: float = 30.0
    grace: float = 5.0
    devices: str = "cpu"
    start_method: str = "forkserver"
    state_dir: Optional[str] = None
    preload: tuple = ()
    restarts: int = 0
    restart_policy: str = DEFAULT_RESTART_POLICY
    network: str = "auto"
    report_dir: Optional[str] = None
    report: str = "failed"
    backend: str = DEFAULT_BACKEND
    ray_address: Optional[str] = None
    ray_nodes: int = 2

    @property
    def shape(self) -> ClusterShape:
        """The cluster's shape: ``cluster``, else ``workers`` worker tasks."""
        return self.cluster if self.cluster is not None else ClusterShape(worker=self.workers)

    def with_overrides(self, **overrides: Any) -> RunSettings:
        """These settings with ``overrides`` (None: unchanged).  A shape sets
        ``workers`` to its number of tasks; ``workers`` alone is a cluster of
        workers only."""
        overrides = {k: v for k, v in overrides.items() if v is not None}
        if "cluster" in overrides:
            shape = tfconfig_shape(overrides["cluster"])
            overrides.update(cluster=None if shape.workers_only else shape, workers=shape.total)
        elif "workers" in overrides:
            overrides["cluster"] = None
        return dataclasses.replace(self, **overrides)


# The settings of the pytest session in this process (the plugin sets them
# at its configure): what a cluster started without settings of its own
# (TensorFlow's runner's stand-in, under install()) runs with.
_session: Optional[RunSettings] = None


def use_session_settings(settings: Optional[RunSettings]) -> Optional[RunSettings]:
    """Make ``settings`` the session's (None: none); returns the ones before,
    for a session inside a session (pytester) to put back."""
    global _session
    before, _session = _session, settings
    return before


# The options as pytest read them before its first conftests ran, until the
# session's own are set: a conftest's ``harness.compat.install()`` starts the
# forkserver with them.
_starting: Optional[RunSettings] = None


def use_starting_settings(settings: Optional[RunSettings]) -> None:
    """The options as pytest read them before its first conftests (None:
    forget them, once the session's are set)."""
    global _starting
    _starting = settings


def session_settings() -> RunSettings:
    """The pytest session's settings in this process, else those it is
    starting with, else the defaults."""
    for settings in (_session, _starting):
        if settings is not None:
            return settings
    return RunSettings()


def tfconfig_shape(value: Any) -> ClusterShape:
    """``value`` (a shape, a mapping or ``chief:1,worker:2``) as a checked shape."""
    return parse_cluster(value, "cluster") or ClusterShape()


def check_backend(settings: RunSettings, option: str = "--mwms-backend") -> None:
    """A backend this machine can use with these settings, or a SettingError."""
    from harness.launch.backends import backend_of
    backend_of(settings).check(settings, option)


def finish(settings: RunSettings, where: Callable[[str], str],
           machine: bool = True) -> RunSettings:
    """The choices that join options (the shape's number of tasks, the start
    method by device when unset) and, with ``machine``, the checks of this
    machine: GPUs to share, the network mode and the backend possible here.
    ``where(name)`` names where option ``name`` was set."""
    if settings.cluster is not None:
        settings = dataclasses.replace(
            settings, workers=settings.cluster.total,
            cluster=None if settings.cluster.workers_only else settings.cluster)
    if settings.start_method is None:
        settings = dataclasses.replace(
            settings, start_method="forkserver" if settings.devices == "cpu" else "spawn")
    if machine:
        # Loaded here, not at import: the pytest plugin reads the options
        # in every session, and checks the machine only where a test uses it.
        from harness.launch.devices import device_assignment, uses_gpus
        from harness.network import check_mode
        if uses_gpus(settings.devices):
            device_assignment(settings.workers, settings.devices, option=where("devices"))
        check_mode(settings.network, where("network"))
        check_backend(settings, where("backend"))
    return settings


def read_settings(lookup: Callable[[Option], Tuple[Any, str]],
                  machine: bool = True) -> RunSettings:
    """Every option from one source: ``lookup(option)`` gives the value as
    typed (the option's default when unset) and the place it came from
    (one of :data:`PLACES`); ``machine``: see :func:`finish`."""
    found = {o.name: lookup(o) for o in OPTIONS}
    values = {o.field: o.parse(found[o.name][0], o.where(found[o.name][1])) for o in OPTIONS}
    return finish(RunSettings(**values), lambda name: OPTION[name].where(found[name][1]),
                  machine)


def parse_marker(kwargs: Mapping[str, Any], args: tuple = ()) -> Dict[str, Any]:
    """``@pytest.mark.mwms(...)``'s arguments, checked: the overrides (a
    tuple of values for an option the marker may list)."""
    if args:
        raise SettingError(f"@pytest.mark.mwms takes keyword arguments only "
                           f"({', '.join(MARKER_KEYS)}), got positional {args!r}")
    unknown = sorted(set(kwargs) - set(MARKER_KEYS))
    if unknown:
        raise SettingError(f"@pytest.mark.mwms: unknown argument(s) {', '.join(unknown)}; "
                           f"allowed: {', '.join(MARKER_KEYS)}")
    listed = [k for k, v in kwargs.items()
              if BY_FIELD[k].marker_list and isinstance(v, (list, tuple))]
    if listed and "cluster" in kwargs:
        raise SettingError(f"@pytest.mark.mwms: {listed[0]}={kwargs[listed[0]]!r} and "
                           f"cluster=... both set the cluster's size; give one")
    return {k: parse_each(v, BY_FIELD[k].parse, BY_FIELD[k].where("marker")) if k in listed
            else BY_FIELD[k].parse(v, BY_FIELD[k].where("marker")) for k, v in kwargs.items()}


def marker_instances(kwargs: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """The test instances a marker asks for: one per combination of the
    values it lists (``workers=[2, 3]``: ``[{"workers": 2}, {"workers": 3}]``),
    none when it lists nothing."""
    listed = {k: v for k, v in parse_marker(kwargs).items()
              if BY_FIELD[k].marker_list and isinstance(v, tuple)}
    if not listed:
        return []
    return [dict(zip(listed, values)) for values in itertools.product(*listed.values())]


def instance_id(instance: Mapping[str, Any]) -> str:
    """A test instance's part of its id: ``2workers``, which ``-k`` selects."""
    return "-".join(f"{value}{field}" for field, value in instance.items())


def apply_marker(settings: RunSettings, kwargs: Mapping[str, Any], args: tuple = (),
                 instance: Optional[Mapping[str, Any]] = None) -> RunSettings:
    """``settings`` as one test's ``@pytest.mark.mwms(...)`` changes them;
    ``instance``: this test's value of each option the marker lists
    (:func:`marker_instances`; without one, a listed option is unchanged)."""
    overrides = parse_marker(kwargs, args)
    overrides.update({k: (instance or {}).get(k) for k, v in overrides.items()
                      if BY_FIELD[k].marker_list and isinstance(v, tuple)})
    if not overrides:
        return settings
    return finish(settings.with_overrides(**overrides),
                  lambda name: OPTION[name].where("marker" if OPTION[name].field in overrides
                                                  else "command line"))


def write_options_page(path: str) -> bool:
    """Put :func:`options_markdown` between the ``options:start`` and
    ``options:end`` markers of ``path``; True when it changed."""
    start, end = "<!-- options:start -->\n", "\n<!-- options:end -->"
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if start not in text or end not in text:
        raise SystemExit(f"{path} has no {start.strip()} ... {end.strip()} region")
    head, rest = text.split(start, 1)
    new = head + start + options_markdown() + end + rest.split(end, 1)[1]
    if new != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
    return new != text


if __name__ == "__main__":
    import sys
    if sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
        print(sys.argv[2] + (" updated" if write_options_page(sys.argv[2]) else " up to date"))
    else:
        print(options_markdown())
