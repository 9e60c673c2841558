"""TensorFlow's own runner modules, kept when :func:`harness.compat.install`
puts the harness's stand-ins under their names, and what each task runs
first where the parent installed it.  A leaf: it imports nothing of the
harness, so the stand-ins, the runner and the tasks read it without an
import cycle."""
from __future__ import annotations

import importlib
from typing import Callable, Dict, Optional

# TensorFlow's own modules, once the imports reach the stand-ins.
original: Dict[str, object] = {}

# install() itself, once it ran in this process: a runner's tasks then run
# it too (a test that runs again in the task, as combinations' do, reaches
# the same bound references).  None where it never ran.
installed: Optional[Callable[[], None]] = None


def tensorflows(name: str):
    """TensorFlow's own module ``name``, whether or not the imports are routed."""
    return original.get(name) or importlib.import_module(name)
