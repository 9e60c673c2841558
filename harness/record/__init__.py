"""The recorder for MWMS jobs that run outside pytest, and the analyzer for
what it leaves: the harness's diagnosis on a real job.

- ``harness record --dir DIR [--timeout S] [--] train.py ARGS...`` (or
  ``-m package.train``) runs the job's script in this process with the
  recorder on; :func:`install` turns it on from inside code that cannot
  change its command.  Each task writes its files into ``DIR``
  (:mod:`harness.record.files` documents them).
- ``harness analyze DIR [DIR...]`` reads the files of every task (one
  directory, or one per host) and prints the verdict a test would get
  (:mod:`harness.record.analyze`).

Importing this package does not import TensorFlow; :func:`install` does.
"""
from harness.record.recorder import DEFAULT_TIMEOUT, DUMP_SIGNAL, Recorder, install

__all__ = ["install", "Recorder", "DEFAULT_TIMEOUT", "DUMP_SIGNAL"]
