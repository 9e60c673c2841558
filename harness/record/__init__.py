"""The recorder, for MWMS jobs that run outside pytest: the harness's
diagnosis on a real job (docs/recorder.md).

This package is public: :func:`install` turns the recorder on from inside
code that cannot change its command (``harness record --dir DIR -- train.py``
does it for a command), and returns the process's :class:`Recorder`.  Its
modules are the internal engine: the recorder (``recorder``), the files
each task writes (``files``) and ``harness analyze``'s reading of them
(``analyze``).

Importing this package does not import TensorFlow; :func:`install` does.
"""
from harness.record.recorder import DEFAULT_TIMEOUT, DUMP_SIGNAL, Recorder, install

__all__ = ["install", "Recorder", "DEFAULT_TIMEOUT", "DUMP_SIGNAL"]
