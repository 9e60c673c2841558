"""What the job recorder (``harness record``, ``harness analyze``) costs,
each a program (``python -m harness.bench.recorder.<name>``,
docs/benchmark.md): ``cost`` (a training step with and without the
recorder) and ``scale`` (``harness analyze`` over 8 to 256 tasks).

``job`` is one job of ``cost`` (its script, its processes, its figures) and
``probe`` the probed run inside that job's processes.  It may import the
harness and :mod:`harness.bench.common`, nothing of another family of the
benchmark.
"""
