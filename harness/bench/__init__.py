"""The benchmark: what the harness costs and how well it tells, measured.

A development tool run from a checkout, not part of the installed plugin
(pyproject.toml leaves ``harness.bench*`` out of the wheel).  Each program
is a module run with ``python -m harness.bench.<name>`` (docs/benchmark.md):

- ``launchers/``: the harness against the other ways to launch MWMS
  workers (``python -m harness.bench``); ``warm``: the harness's warm run
  against the floor of ``launchers/``, CI's guard of the warm path;
- ``cost/``: what progress reporting, the replica checks, a network
  namespace and the plugin cost; ``recorder/``: what ``harness record``
  costs a step and how ``harness analyze`` scales;
- ``accuracy``: how often the diagnosis names the faulted worker;
  ``memory_rate``: how often the memory rate names a leak; ``explore``:
  how fast ``explore`` runs plans and whether it finds a recovery bug;
- ``versions``: the catalogue on each TensorFlow minor; ``gpu`` (and
  ``gpu.sh``): the GPU check; ``picture``: the docs' timeline picture.

Every module may import the harness and :mod:`harness.bench.common` (the
shared library, not a program); a family imports no other, but ``warm``
runs the floor's fork server of ``launchers/`` and ``explore`` searches
the recovery jobs of ``corpus/``.  Nothing outside
``harness/bench`` imports the benchmark.
"""
