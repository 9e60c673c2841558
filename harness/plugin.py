"""The pytest plugin: options, the ``mwms`` marker and the ``mwms_cluster`` fixture.

Installed packages register it through the ``pytest11`` entry point
``mwms = harness.plugin``, so a project that only installs pytest-mwms gets
all of this with no conftest import.

The options, their ini keys, defaults and trade-offs are declared once, in
:data:`harness.settings.OPTIONS`; ``pytest --help`` and README.md's table
are made from there.  The marker ``@pytest.mark.mwms(workers=N, timeout=S,
grace=S, restarts=K, network=MODE)`` overrides them for one test.  Every bad value is a usage error
naming the option, raised before any test runs.
"""
from __future__ import annotations

import os

import pytest

from . import reporting
from .errors import StateDirError
from .reporting import REPORT_MODES
from .settings import (BACKENDS, DEVICES, NETWORKS, OPTION, OPTIONS, START_METHODS,
                       RunSettings, SettingError, check_backend, gpu_assignment, parse_choice,
                       parse_marker, parse_modules, parse_ray_address, parse_ray_nodes,
                       parse_restarts, parse_seconds, parse_workers, visible_gpus)

SETTINGS_KEY = pytest.StashKey[RunSettings]()
RUNS_KEY = pytest.StashKey[list]()     # every run's summary this session, for the summary


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mwms", "MultiWorkerMirroredStrategy fault-injection harness")
    for option in OPTIONS:
        help_text = f"{option.help}; ini: {option.ini} (default {option.default_text})"
        help_text = help_text.replace("%", "%%")   # argparse formats help with %
        group.addoption(option.flag, dest=option.ini, metavar=option.metavar, default=None,
                        help=help_text)
        parser.addini(option.ini, option.help, default=option.default)


def _value(config: pytest.Config, name: str):
    key = OPTION[name].ini
    value = config.getoption(key)
    return config.getini(key) if value is None else value


def settings_from_config(config: pytest.Config) -> RunSettings:
    workers = parse_workers(_value(config, "workers"))
    timeout = parse_seconds(_value(config, "timeout"), "--mwms-timeout")
    grace = parse_seconds(_value(config, "grace"), "--mwms-grace", allow_zero=True)
    devices = parse_choice(_value(config, "devices"), "--mwms-devices", DEVICES)
    method = _value(config, "start-method")
    if method in (None, ""):
        method = "forkserver" if devices == "cpu" else "spawn"
    method = parse_choice(method, "--mwms-start-method", START_METHODS)
    if devices == "gpu":
        gpu_assignment(workers, visible_gpus())
    preload = parse_modules(_value(config, "preload"))
    restarts = parse_restarts(_value(config, "restarts"))
    report = parse_choice(_value(config, "report"), "--mwms-report", REPORT_MODES)
    network = parse_choice(_value(config, "network"), "--mwms-network", NETWORKS)
    if network == "isolated":
        from .netns import available
        ok, why = available()
        if not ok:
            raise SettingError(f"--mwms-network=isolated: this machine cannot give a cluster "
                               f"a network namespace of its own ({why}); use auto or host")
    settings = RunSettings(
        workers=workers, timeout=timeout, grace=grace, devices=devices, start_method=method,
        state_dir=_directory(config, "state-dir"), preload=preload, restarts=restarts,
        report_dir=_directory(config, "report-dir"), report=report, network=network,
        backend=parse_choice(_value(config, "backend"), "--mwms-backend", BACKENDS),
        ray_address=parse_ray_address(_value(config, "ray-address")),
        ray_nodes=parse_ray_nodes(_value(config, "ray-nodes")))
    check_backend(settings)
    return settings


def _directory(config: pytest.Config, name: str):
    """A directory option: absolute from the command line, relative to the
    ini file's folder from the ini file; None when unset."""
    key = OPTION[name].ini
    given = config.getoption(key)
    if given:
        return os.path.abspath(given)
    if config.getini(key):
        return os.path.join(str(config.rootpath), config.getini(key))
    return None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "mwms(workers=N, timeout=SECONDS, grace=SECONDS, restarts=K, network=MODE, "
        "backend=local|ray): "
        "override the pytest-mwms options for this test's mwms_cluster")
    try:
        config.stash[SETTINGS_KEY] = settings_from_config(config)
    except SettingError as e:
        raise pytest.UsageError(str(e)) from None
    config.stash[RUNS_KEY] = []
    config.pluginmanager.register(SessionRuns(config), "mwms-session-runs")


def pytest_report_header(config: pytest.Config):
    """One line: where this session's clusters run, and why when not isolated."""
    settings = config.stash.get(SETTINGS_KEY, None)
    if settings is None:
        return None
    if settings.backend == "ray":
        where = settings.ray_address or f"a local cluster of {settings.ray_nodes} nodes"
        return f"pytest-mwms: backend ray ({where}); network: the nodes' own"
    from .netns import resolve
    isolated, why = resolve(settings.network)
    if isolated:
        return "pytest-mwms: network isolated (a network namespace per cluster)"
    return f"pytest-mwms: network host loopback ({why})"


def _marker_overrides(item: pytest.Item) -> dict:
    marker = item.get_closest_marker("mwms")
    if marker is None:
        return {}
    overrides = parse_marker(marker.kwargs, marker.args)
    if "backend" in overrides:
        check_backend(item.config.stash[SETTINGS_KEY].with_overrides(**overrides),
                      "@pytest.mark.mwms(backend=...)")
    return overrides


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items) -> None:
    uses_cluster = False
    for item in items:
        try:
            _marker_overrides(item)
        except SettingError as e:
            raise pytest.UsageError(f"{item.nodeid}: {e}") from None
        uses_cluster = uses_cluster or "mwms_cluster" in getattr(item, "fixturenames", ())
    settings = config.stash.get(SETTINGS_KEY, None)
    if uses_cluster and settings is not None and not config.option.collectonly:
        # A port directory this user cannot use would fail every test the
        # same way: say so once, as a usage error, before any test runs.
        from .ports import check_state_dir
        try:
            check_state_dir(settings.state_dir)
        except StateDirError as e:
            raise pytest.UsageError(str(e)) from None
        # Overlap the forkserver's TensorFlow import with collection and the
        # first tests' setup (a Ray cluster is started by the first run that
        # needs one).
        if settings.backend == "local":
            from .launcher import LocalLauncher
            LocalLauncher(settings.start_method, settings.preload).prewarm()


def pytest_unconfigure(config: pytest.Config) -> None:
    """End this session's Ray cluster, if a run started one."""
    import sys
    if "harness.raylaunch" in sys.modules:
        sys.modules["harness.raylaunch"].close_session()


@pytest.fixture
def mwms_cluster(request: pytest.FixtureRequest):
    """An N-worker MultiWorkerMirroredStrategy cluster for this test.

    ``mwms_cluster.run(fn, args=(), kwargs=None, *, timeout=None, faults=(),
    grace=None, sync_check=False, env=None, ledger=True, step_fn=None,
    restarts=None, restart_on="crash,fail", check_replicas=False)`` runs
    ``fn`` in N fresh worker processes that form one cluster and returns a
    ``RunResult`` (see :meth:`harness.controller.Cluster.run`);
    ``run_script`` runs a script the same way; ``mwms_cluster.num_workers``
    is N.
    """
    from .controller import Cluster
    settings = request.config.stash[SETTINGS_KEY].with_overrides(
        **_marker_overrides(request.node))
    cluster = Cluster(settings)
    yield cluster


def _runs(item: pytest.Item) -> list:
    cluster = getattr(item, "funcargs", {}).get("mwms_cluster")
    return list(cluster.runs) if cluster is not None else []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A test that ran clusters: its last verdict as JUnit properties, a
    timeline per run in ``--mwms-report-dir``, each run that did not
    complete as report sections, and every run on the report for the
    session summary (which xdist carries to the controller)."""
    runs = _runs(item) if call.when == "call" else []
    if runs:
        item.user_properties.extend(reporting.junit_properties(runs))
    report = yield
    if runs:
        settings = item.config.stash[SETTINGS_KEY]
        timelines = {}
        if settings.report_dir:
            for number, run in enumerate(runs, 1):
                if reporting.wants_timeline(run, settings.report):
                    timelines[number] = run.timeline(
                        reporting.timeline_stem(settings.report_dir, item.nodeid, number))
        report.sections.extend(reporting.report_sections(runs, timelines, report.failed))
        report.mwms_runs = [reporting.run_summary(r, item.nodeid) for r in runs]
    return report


class SessionRuns:
    """Collects every run's summary from the test reports: on the
    controller under xdist, the reports come from the workers."""

    def __init__(self, config: pytest.Config):
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        runs = getattr(report, "mwms_runs", None)
        if runs:
            self.config.stash[RUNS_KEY].extend(runs)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):   # an xdist worker: the controller summarizes
        return
    settings = config.stash.get(SETTINGS_KEY, None)
    lines = reporting.summary_lines(config.stash.get(RUNS_KEY, []),
                                    settings.report_dir if settings else None)
    if lines:
        terminalreporter.write_sep("=", "pytest-mwms")
        for line in lines:
            terminalreporter.write_line(line)
