"""What the harness's own tests and the scenario catalogue share: the one
check that no TensorFlow process a test started outlives it
(``no_leftover_workers``; "started" is defined once, in tests/helpers.py).

The plugin itself comes from the installed package's pytest11 entry point
(harness.plugin); nothing needs importing here.  This file also marks the
repository root as pytest's rootdir for tests/ and scenarios/.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "tests"))

from helpers import tensorflow_pids  # noqa: E402  (sets this session's mark, at import)
from harness.core import linux  # noqa: E402
from harness.plugin import SETTINGS_KEY  # noqa: E402


@pytest.fixture
def no_leftover_workers():
    """Fail the test if a TensorFlow process it started outlives it."""
    yield
    left = linux.wait_gone(tensorflow_pids(), 3)
    assert not left, f"TensorFlow processes outlived the test: {left}"


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session):
    """Before the first test, each pytest process runs one cluster of its
    own, outside every test's timeout: its fork server's import of
    TensorFlow, slowest when every process starts at once, is then no
    test's cost."""
    item = next((i for i in session.items
                 if "mwms_cluster" in getattr(i, "fixturenames", ())), None)
    if item is not None and not session.config.option.collectonly:
        from harness.controller import Cluster
        from harness.errors import SettingError
        from harness.plugin import _item_settings
        try:
            settings = _item_settings(item)
        except SettingError:   # a bad marker: that test's own setup says so
            settings = session.config.stash[SETTINGS_KEY]
        Cluster(settings).run(lambda: None, timeout=300)
    return (yield)
