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


@pytest.fixture
def no_leftover_workers():
    """Fail the test if a TensorFlow process it started outlives it."""
    yield
    left = linux.wait_gone(tensorflow_pids(), 3)
    assert not left, f"TensorFlow processes outlived the test: {left}"
