"""The pytest plugin: options, the ``mwms`` marker and the ``mwms_cluster`` fixture.

Installed packages register it through the ``pytest11`` entry point
``mwms = harness.plugin``, so a project that only installs pytest-mwms gets
all of this with no conftest import.

The options, their ini keys, defaults, trade-offs and checks are declared
once, in :data:`harness.settings.OPTIONS`; ``pytest --help`` and the
documentation's table are made from there.  The marker
``@pytest.mark.mwms(...)`` overrides the options marked for it for one test;
``workers=[2, 3]`` runs the test once per size (``test_x[2workers]``).  A
bad option or ini value is a usage error naming where it was set, raised
before any test runs; a bad marker fails its own test, in one line, as
pytest's own ``skipif`` does with a bad condition.

Loading the plugin costs a session that does not use the harness nothing:
this module imports the standard library, pytest and the options table
only, and starts no process; the rest (the machine's checks, the
launchers, the diagnosis, the reports) loads when a collected test uses
the fixture or the marker, or a run's report needs it.
"""
from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Any, Callable, List, Optional, Tuple

import pytest

from harness.errors import ReportWarning, SettingError, StateDirError, TempDirFullError
from harness.settings import (MARKER_KEYS, OPTIONS, Option, RunSettings, apply_marker,
                              instance_id, marker_instances, read_settings,
                              use_session_settings, use_starting_settings)
from harness.validators import DEFAULT_BACKEND

SETTINGS_KEY = pytest.StashKey[RunSettings]()
RUNS_KEY = pytest.StashKey[list]()     # every run's summary this session, for the summary
TEST_SECONDS_KEY = pytest.StashKey[dict]()   # the tests' time by file, for --durations
ITEM_SETTINGS_KEY = pytest.StashKey[RunSettings]()   # one test's, with its marker
# The session settings of the session around this one (pytester's), or None.
OUTER_SETTINGS_KEY = pytest.StashKey[Optional[RunSettings]]()
REPORT_WARNED_KEY = pytest.StashKey[bool]()   # a report failed and was warned of
# The fixture a marker's list of values parametrizes (workers=[2, 3]): one
# test instance per value, its value in the id.
INSTANCE = "_mwms_instance"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mwms", "MultiWorkerMirroredStrategy fault-injection harness")
    for option in OPTIONS:
        help_text = (f"{option.help_for('command line')}; ini: {option.ini} "
                     f"(default {option.default_text})")
        help_text = help_text.replace("%", "%%")   # argparse formats help with %
        group.addoption(option.flag, dest=option.ini, metavar=option.metavar, default=None,
                        help=help_text)
        parser.addini(option.ini, option.help, default=option.default)


def settings_from_config(config: pytest.Config, machine: bool = True,
                         given_on_command_line: Optional[Callable[[str], Any]] = None
                         ) -> RunSettings:
    """The session's settings: each option from the command line, else the
    ini file, else its default.  A directory is absolute from the command
    line and relative to the ini file's folder from the ini file.
    ``machine``: also check this machine can run them (see
    :func:`harness.settings.finish`); ``given_on_command_line``: where the
    command line's values are read (``config.getoption`` once parsed)."""
    read = given_on_command_line or config.getoption

    def lookup(option: Option) -> Tuple[Any, str]:
        given = read(option.ini)
        if given is not None:
            return (os.path.abspath(given) if option.directory and given else given,
                    "command line")
        value = config.getini(option.ini)
        if option.directory and value:
            value = os.path.join(str(config.rootpath), value)
        return value, "ini"

    return read_settings(lookup, machine)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """The options as read so far, for a first conftest that calls
    ``harness.compat.install()``: it starts the forkserver with them,
    before the session is configured."""
    namespace = early_config.known_args_namespace
    try:
        use_starting_settings(settings_from_config(
            early_config, machine=False,
            given_on_command_line=lambda name: getattr(namespace, name, None)))
    except SettingError:
        use_starting_settings(None)   # said at configure, as a usage error


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"mwms({', '.join(MARKER_KEYS)}): override these pytest-mwms options "
        f"for this test's mwms_cluster")
    try:
        config.stash[SETTINGS_KEY] = settings_from_config(config, machine=options_given(config))
    except SettingError as e:
        raise pytest.UsageError(str(e)) from None
    config.stash[OUTER_SETTINGS_KEY] = use_session_settings(config.stash[SETTINGS_KEY])
    use_starting_settings(None)
    config.stash[RUNS_KEY] = []
    config.stash[TEST_SECONDS_KEY] = {}
    config.pluginmanager.register(SessionRuns(config), "mwms-session-runs")


def pytest_report_header(config: pytest.Config):
    """One line: where this session's clusters run, as far as it is known
    without starting a process (the summary says the rest)."""
    settings = config.stash.get(SETTINGS_KEY, None)
    if settings is None:
        return None
    if settings.backend != DEFAULT_BACKEND:
        from harness.launch.backends import backend_of
        return f"pytest-mwms: {backend_of(settings).where(settings)}"
    if settings.network == "auto" and not network_known():
        return ("pytest-mwms: network auto (a network namespace per cluster where this "
                "machine allows it; the summary says which)")
    from harness import network
    return f"pytest-mwms: {network.header(settings.network)}"


def options_given(config: pytest.Config) -> bool:
    """Whether the session sets an ``--mwms-*`` option or ini key: it means
    to use the harness, so this machine is checked at once."""
    return any(config.getoption(o.ini) is not None
               or (o.default or "") != (config.getini(o.ini) or "") for o in OPTIONS)


def network_known() -> bool:
    """Whether this process (or its parent) has already probed the network."""
    return "namespace" in os.environ.get("MWMS_NETWORK_PROBES", "")


def _item_settings(item: pytest.Item) -> RunSettings:
    """The session's settings as this test's marker (and its instance of
    the marker's list, ``workers=[2, 3]``) changes them."""
    settings = item.config.stash[SETTINGS_KEY]
    marker = item.get_closest_marker("mwms")
    if marker is None:
        return settings
    callspec = getattr(item, "callspec", None)
    instance = callspec.params.get(INSTANCE) if callspec is not None else None
    return apply_marker(settings, marker.kwargs, marker.args, instance)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``@pytest.mark.mwms(workers=[2, 3])``: the test once per size, its
    size in its id (``test_x[2workers]``), so ``-k`` and ``--collect-only``
    see each.  A bad list leaves the one test, whose setup says why."""
    marker = metafunc.definition.get_closest_marker("mwms")
    if marker is None or INSTANCE not in metafunc.fixturenames:
        return
    try:
        instances = marker_instances(marker.kwargs)
    except SettingError:
        return
    if instances:
        metafunc.parametrize(INSTANCE, instances, ids=[instance_id(i) for i in instances])


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A bad ``mwms`` marker fails its own test, in one line, before its
    fixtures are set up; the session's other tests run."""
    if item.get_closest_marker("mwms") is None:
        return
    try:
        item.stash[ITEM_SETTINGS_KEY] = _item_settings(item)
        return
    except SettingError as e:
        problem = str(e)
    pytest.fail(problem, pytrace=False)   # outside the except: no chained traceback


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items) -> None:
    uses_cluster = any("mwms_cluster" in getattr(item, "fixturenames", ()) for item in items)
    settings = config.stash.get(SETTINGS_KEY, None)
    if uses_cluster and settings is not None and not config.option.collectonly:
        from harness.launch.backends import backend_of
        from harness.launch.state_dir import check_state_dir
        # What this machine cannot run, and a port directory this user
        # cannot use, would fail every test the same way: say so once, as a
        # usage error, before any test runs.
        try:
            settings = settings_from_config(config)
            config.stash[SETTINGS_KEY] = settings
            check_state_dir(settings.state_dir,
                            "--mwms-state-dir" if config.getoption("mwms_state_dir")
                            else "ini mwms_state_dir")
        except (SettingError, StateDirError) as e:
            raise pytest.UsageError(str(e)) from None
        # Overlap the slow start of shared machinery (the forkserver's
        # TensorFlow import) with collection and the first tests' setup.
        try:
            backend_of(settings).prewarm(settings)
        except TempDirFullError as e:
            raise pytest.UsageError(str(e)) from None


def pytest_unconfigure(config: pytest.Config) -> None:
    """End what a backend started for this session (a Ray cluster); put
    back the settings of the session around this one (pytester's)."""
    if OUTER_SETTINGS_KEY in config.stash:
        use_session_settings(config.stash[OUTER_SETTINGS_KEY])
    backends = sys.modules.get("harness.launch.backends")
    if backends is not None:   # never loaded: nothing was started
        backends.close_sessions()


@pytest.fixture
def _mwms_instance():
    """This test's value of each option its marker lists: parametrized by
    :func:`pytest_generate_tests`; None for a test with no list."""
    return None


@pytest.fixture
def mwms_cluster(request: pytest.FixtureRequest, _mwms_instance):
    """An N-worker MultiWorkerMirroredStrategy cluster for this test: a
    :class:`harness.controller.Cluster` with the session's settings and the
    test's ``mwms`` marker.  ``mwms_cluster.run(fn, ...)`` runs ``fn`` on N
    fresh worker processes that form one cluster and returns a
    :class:`~harness.result.RunResult`; ``run_script`` runs a script the same
    way; ``num_workers`` is N.
    """
    from harness.controller import Cluster
    settings = request.node.stash.get(ITEM_SETTINGS_KEY, None)
    yield Cluster(settings if settings is not None else _item_settings(request.node))


@pytest.fixture
def mwms_manager():
    """A started ``multiprocess`` Manager, for what the test shares with its
    workers (``mwms_manager.dict()``, ``.Barrier(n)``, ``.Event()``); its
    server dies with pytest, however pytest ends
    (:mod:`harness.launch.manager`)."""
    from harness.launch.manager import guarded_manager
    with guarded_manager() as manager:
        yield manager


def _runs(item: pytest.Item) -> list:
    cluster = getattr(item, "funcargs", {}).get("mwms_cluster")
    return list(cluster.runs) if cluster is not None else []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A test that ran clusters: its last verdict as JUnit properties, a
    timeline per run in ``--mwms-report-dir``, each run that did not
    complete as report sections, and every run on the report for the
    session summary (which xdist carries to the controller).  Each is made
    by :func:`_reported`: one that fails is left out, and the test's report
    and the session go on."""
    runs = _runs(item) if call.when == "call" else []
    problems: List[str] = []
    if runs:
        from harness.report import pytest_report
        item.user_properties.extend(_reported(
            item.config, problems, "its JUnit properties", pytest_report.junit_properties,
            runs) or ())
    report = yield
    if runs:
        settings = item.config.stash[SETTINGS_KEY]
        timelines = {}
        if settings.report_dir:
            for number, run in enumerate(runs, 1):
                if pytest_report.wants_timeline(run, settings.report):
                    stem = pytest_report.timeline_stem(settings.report_dir, item.nodeid, number)
                    written = _reported(item.config, problems, f"the timeline of run {number}",
                                        run.timeline, stem)
                    if written:
                        timelines[number] = written
        report.sections.extend(_reported(item.config, problems, "its report sections",
                                         pytest_report.report_sections, runs, timelines,
                                         report.failed) or ())
        summaries = [_reported(item.config, problems, f"the summary of run {number}",
                               pytest_report.run_summary, r, item.nodeid)
                     for number, r in enumerate(runs, 1)]
        report.mwms_runs = [s for s in summaries if s is not None]
        if problems:
            report.sections.append(("pytest-mwms: reports not made", "\n".join(problems)))
    return report


def _reported(config: pytest.Config, problems: List[str], what: str,
              make: Callable[..., Any], *args: Any) -> Any:
    """``make(*args)``, or None where it raises: the report is left out, its
    problem added to ``problems`` and warned of once a session
    (:class:`~harness.errors.ReportWarning`), and the session goes on.  A
    report must never end a session: pytest ends one whose hook raised with
    INTERNALERROR, the session's other tests never run."""
    try:
        return make(*args)
    except Exception as e:   # any failure of a report is the same to the session
        problem = f"pytest-mwms could not make {what}: {type(e).__name__}: {e}"
        problems.append(problem)
        if not config.stash.get(REPORT_WARNED_KEY, False):
            config.stash[REPORT_WARNED_KEY] = True
            # Under -W error the warning itself raises: the problem is in
            # the report's section, or the summary's line, all the same.
            with contextlib.suppress(Warning):
                warnings.warn(ReportWarning(f"{problem}; the session goes on without it "
                                            f"(later reports that fail are not warned of)"),
                              stacklevel=2)
        return None


class SessionRuns:
    """Collects every run's summary from the test reports: on the
    controller under xdist, the reports come from the workers."""

    def __init__(self, config: pytest.Config):
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        runs = getattr(report, "mwms_runs", None)
        if runs:
            self.config.stash[RUNS_KEY].extend(runs)
        seconds = self.config.stash[TEST_SECONDS_KEY]
        path = report.nodeid.split("::", 1)[0]
        seconds[path] = seconds.get(path, 0.0) + float(getattr(report, "duration", 0.0) or 0.0)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):   # an xdist worker: the controller summarizes
        return
    runs = config.stash.get(RUNS_KEY, [])
    if not runs:
        return
    problems: List[str] = []
    lines = _reported(config, problems, "the session summary", _summary_lines, config, runs)
    lines = (lines or []) + problems
    if lines:
        terminalreporter.write_sep("=", "pytest-mwms")
        for line in lines:
            terminalreporter.write_line(line)


def _summary_lines(config: pytest.Config, runs: list) -> List[str]:
    from harness.report import pytest_report
    settings = config.stash.get(SETTINGS_KEY, None)
    # pytest's --durations also asks where each file's time went.
    wants_phases = config.getoption("durations", None) is not None
    lines = pytest_report.summary_lines(
        runs, settings.report_dir if settings else None,
        test_seconds=config.stash.get(TEST_SECONDS_KEY, {}) if wants_phases else None)
    if settings is not None and settings.network == "auto" \
            and settings.backend == DEFAULT_BACKEND:
        from harness import network
        lines.append(f"clusters ran with {network.header(settings.network)}")
    return lines
