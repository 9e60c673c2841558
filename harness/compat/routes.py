"""What :func:`harness.compat.install` changes in TensorFlow, so that every
way its test utilities start multi-worker processes runs on the harness.

TensorFlow's test utilities bind ``multi_process_runner`` (and
``multi_worker_test_base``) at import: ``combinations`` (which starts the
tasks of a ``multi_worker_mirrored_*`` preset), ``strategy_combinations``
(its presets' deferred pool runners, and the barrier its strategy creator
waits on) and ``multi_worker_test_base`` (``MultiProcessCluster``).  Each such module attribute is pointed at
the harness's, as are the ``tf.__internal__`` trees tf-keras reaches the
runner through, and the two modules themselves in ``sys.modules``: a test
file imported afterwards that imports them by name (TensorFlow's own do)
binds the harness's.

``combinations`` sees the harness's runner through :class:`ForCombinations`:
a preset the harness does not run skips with the reason, as a preset whose
GPUs are missing skips under TensorFlow's runner, instead of failing on the
refusal.  Its parameter-server presets run as TensorFlow's runner runs
them: the test on every task, where the workers and parameter servers
start their servers as the strategy's creator asks and serve until the
chief ends.  A ``MultiProcessCluster``'s tasks listen at the spec's own
addresses, on the host's network, where its test process connects.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import unittest
from types import ModuleType
from typing import Mapping, Optional, Union

from harness.compat import multi_process_runner, multi_worker_test_base, originals, spec
from harness.compat.originals import original, tensorflows
from harness.compat.errors import UnsupportedClusterError
from harness.errors import HarnessError
from harness.settings import session_settings

# Where TensorFlow's own modules hold the runner and the test base, by attribute.
BOUND = {
    "tensorflow.python.distribute.combinations": ("multi_process_runner",
                                                  "multi_worker_test_base"),
    "tensorflow.python.distribute.strategy_combinations": ("multi_process_runner",
                                                           "multi_worker_test_base"),
    "tensorflow.python.distribute.multi_worker_test_base": ("multi_process_runner",),
}
# The API trees whose __internal__.distribute has a multi_process_runner.
API_TREES = ("tensorflow", "tensorflow.compat.v2")
# TensorFlow's modules a test file imports by name, and the harness's stand-ins.
MODULES = {
    "tensorflow.python.distribute.multi_process_runner": multi_process_runner,
    "tensorflow.python.distribute.multi_worker_test_base": multi_worker_test_base,
}


def skip_reason(cluster_spec: Optional[Mapping]) -> Optional[str]:
    """Why a test's cluster does not run on the harness (the test skips
    with it), or None when it runs."""
    try:
        spec.shape(cluster_spec)
    except UnsupportedClusterError as e:
        return str(e)
    return None


class ForCombinations:
    """``multi_process_runner`` as ``combinations`` and ``strategy_combinations``
    see it: the harness's, but a preset it does not run skips."""

    def __getattr__(self, name):
        return getattr(multi_process_runner, name)

    @staticmethod
    def MultiProcessRunner(fn, cluster_spec, *args, **kwargs):
        _skip_unless_runnable(cluster_spec)
        return multi_process_runner.MultiProcessRunner(fn, cluster_spec, *args, **kwargs)

    @staticmethod
    def MultiProcessPoolRunner(cluster_spec, *args, **kwargs):
        _skip_unless_runnable(cluster_spec)
        return multi_process_runner.MultiProcessPoolRunner(cluster_spec, *args, **kwargs)


def _skip_unless_runnable(cluster_spec) -> None:
    why = skip_reason(cluster_spec)
    if why is not None:
        raise unittest.SkipTest(why)


class ForTestBase(ForCombinations):
    """``multi_process_runner`` as ``multi_worker_test_base`` sees it: its
    ``MultiProcessCluster`` starts servers that the test process itself
    connects to, at the spec's addresses, so its tasks listen there, on
    the host's network."""

    @staticmethod
    def MultiProcessRunner(fn, cluster_spec, *args, **kwargs):
        _skip_unless_runnable(cluster_spec)
        return multi_process_runner.MultiProcessRunner(fn, cluster_spec, *args,
                                                       at_spec_addresses=True, **kwargs)


FOR_COMBINATIONS = ForCombinations()
FOR_TEST_BASE = ForTestBase()


def route_runner() -> None:
    """Point every bound reference of TensorFlow's to the harness's runner."""
    for name in API_TREES:
        try:
            distribute = importlib.import_module(name).__internal__.distribute
        except (ImportError, AttributeError):
            continue
        distribute.multi_process_runner = multi_process_runner
    for module_name, attributes in BOUND.items():
        try:
            module = tensorflows(module_name)
        except ImportError:
            continue
        for attribute in attributes:
            value: Union[ForCombinations, ModuleType]
            if attribute == "multi_process_runner":
                value = (FOR_TEST_BASE if module_name.endswith("multi_worker_test_base")
                         else FOR_COMBINATIONS)
            else:
                value = multi_worker_test_base
            if hasattr(module, attribute):
                setattr(module, attribute, value)


def route_imports() -> None:
    """A test file imported from now on that imports TensorFlow's runner
    or test base by name (``from tensorflow.python.distribute import
    multi_process_runner``, as TensorFlow's own tests do) gets the harness's."""
    for name, ours in MODULES.items():
        try:
            theirs = original.get(name) or importlib.import_module(name)
        except ImportError:
            continue
        original[name] = theirs
        sys.modules[name] = ours
        package, _, attribute = name.rpartition(".")
        setattr(sys.modules[package], attribute, ours)


def install() -> None:
    """The routes, after starting the session's launcher: its forkserver's
    TensorFlow import runs beside this process's own (the routes import
    TensorFlow), where the first cluster would wait for it."""
    start_launcher()
    route()


def route() -> None:
    """The routes alone: what a task runs first where its parent installed them."""
    originals.installed = route
    if "tensorflow" in sys.modules or importlib.util.find_spec("tensorflow") is not None:
        route_runner()
        route_imports()


def start_launcher() -> None:
    """The session's backend started in the background (the forkserver
    importing TensorFlow), with the options pytest has read so far."""
    from harness.launch.backends import backend_of
    settings = session_settings()
    try:
        backend_of(settings).prewarm(settings)
    except HarnessError:
        pass   # the first cluster meets it again, and says it
