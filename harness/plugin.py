"""The pytest plugin: options, the ``mwms`` marker and the ``mwms_cluster`` fixture.

Installed packages register it through the ``pytest11`` entry point
``mwms = harness.plugin``, so a project that only installs pytest-mwms gets
all of this with no conftest import.

Options (each also an ini key of the same name with ``_`` for ``-``):

``--mwms-workers=N`` (ini ``mwms_workers``, default 2)
    Workers per cluster.  From 1 to what the machine holds (8 per core, and
    one per half GiB of RAM, at most 64).  More workers than cores works (the
    workers mostly wait on each other), but start-up and steps slow down.
``--mwms-timeout=SECONDS`` (ini ``mwms_timeout``, default 30)
    A run is declared hung when no worker has made progress (a step
    boundary, a phase change, a worker finishing) for this long.  Lower is
    faster to report; too low flags slow start-up (TensorFlow import under
    ``spawn`` takes 5-10 s) or long steps as hangs.
``--mwms-grace=SECONDS`` (ini ``mwms_grace``, default 5)
    Once one worker has raised or died, how long its peers get to finish or
    fail on their own before they are dumped and killed.  TensorFlow tells
    survivors of a dead peer after about 10 s; raise this to record those
    errors, lower it to fail faster.
``--mwms-devices=cpu|gpu`` (ini ``mwms_devices``, default cpu)
    ``cpu`` hides every GPU from the workers; ``gpu`` gives each worker an
    equal share of the visible GPUs through ``CUDA_VISIBLE_DEVICES``.
``--mwms-start-method=forkserver|spawn`` (ini ``mwms_start_method``)
    ``forkserver`` (the default on CPU) forks workers from a server that has
    imported TensorFlow once: fast, after the first run.  ``spawn`` (the
    default on GPU) starts a fresh interpreter per worker: slow, isolated.

The marker ``@pytest.mark.mwms(workers=N, timeout=S, grace=S)`` overrides
the options for one test.  Every bad value is a usage error naming the
option, raised before any test runs.
"""
from __future__ import annotations

import pytest

from .settings import (DEVICES, START_METHODS, RunSettings, SettingError, gpu_assignment,
                       max_workers, parse_choice, parse_marker, parse_seconds, parse_workers,
                       visible_gpus)

SETTINGS_KEY = pytest.StashKey[RunSettings]()

_OPTIONS = [
    ("workers", "N", "2", "workers per cluster (1 to {max}); ini: mwms_workers"),
    ("timeout", "SECONDS", "30", "hang timeout: seconds without any worker's progress before "
     "the run is declared hung; ini: mwms_timeout"),
    ("grace", "SECONDS", "5", "seconds the other workers get to finish or fail once one has "
     "raised or died; ini: mwms_grace"),
    ("devices", "cpu|gpu", "cpu", "cpu hides GPUs from workers; gpu splits the visible GPUs "
     "among them via CUDA_VISIBLE_DEVICES; ini: mwms_devices"),
    ("start-method", "forkserver|spawn", None, "how workers start: forkserver forks them from "
     "a server that imported TensorFlow once (default on cpu), spawn starts a fresh Python per "
     "worker (default on gpu); ini: mwms_start_method"),
]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mwms", "MultiWorkerMirroredStrategy fault-injection harness")
    for name, metavar, default, help_text in _OPTIONS:
        key = "mwms_" + name.replace("-", "_")
        help_text = help_text.format(max=max_workers())
        if default is not None:
            help_text += f" (default {default})"
        group.addoption(f"--mwms-{name}", dest=key, metavar=metavar, default=None, help=help_text)
        parser.addini(key, help_text, default=default)


def _value(config: pytest.Config, key: str):
    value = config.getoption(key)
    return config.getini(key) if value is None else value


def settings_from_config(config: pytest.Config) -> RunSettings:
    workers = parse_workers(_value(config, "mwms_workers"))
    timeout = parse_seconds(_value(config, "mwms_timeout"), "--mwms-timeout")
    grace = parse_seconds(_value(config, "mwms_grace"), "--mwms-grace", allow_zero=True)
    devices = parse_choice(_value(config, "mwms_devices"), "--mwms-devices", DEVICES)
    method = _value(config, "mwms_start_method")
    if method in (None, ""):
        method = "forkserver" if devices == "cpu" else "spawn"
    method = parse_choice(method, "--mwms-start-method", START_METHODS)
    if devices == "gpu":
        gpu_assignment(workers, visible_gpus())
    return RunSettings(workers=workers, timeout=timeout, grace=grace, devices=devices,
                       start_method=method)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "mwms(workers=N, timeout=SECONDS, grace=SECONDS): override the "
        "pytest-mwms options for this test's mwms_cluster")
    try:
        config.stash[SETTINGS_KEY] = settings_from_config(config)
    except SettingError as e:
        raise pytest.UsageError(str(e)) from None


def _marker_overrides(item: pytest.Item) -> dict:
    marker = item.get_closest_marker("mwms")
    if marker is None:
        return {}
    return parse_marker(marker.kwargs, marker.args)


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
        # Overlap the forkserver's TensorFlow import with collection and the
        # first tests' setup.
        from .launcher import LocalLauncher
        LocalLauncher(settings.start_method).prewarm()


@pytest.fixture
def mwms_cluster(request: pytest.FixtureRequest):
    """An N-worker MultiWorkerMirroredStrategy cluster for this test.

    ``mwms_cluster.run(fn, args=(), kwargs=None, *, timeout=None, faults=(),
    grace=None)`` runs ``fn`` in N fresh worker processes that form one
    cluster and returns a ``RunResult``; ``mwms_cluster.num_workers`` is N.
    """
    from .controller import Cluster
    settings = request.config.stash[SETTINGS_KEY].with_overrides(
        **_marker_overrides(request.node))
    cluster = Cluster(settings)
    yield cluster
