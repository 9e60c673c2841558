"""The launcher comparison (``python -m harness.bench``, docs/benchmark.md):
the same workloads under the floor, the harness, a fresh ``python`` per
worker, TensorFlow's ``multi_process_runner`` and the harness on Ray.

``compare`` is the program; ``plan`` (the workloads, the run order) and
``table`` (the summary and the table, pure) are its parts; ``floor``,
``cluster``, ``spawn`` and ``runner`` are the launchers, which share
``measure`` (what each run reads alike); ``workers`` is the worker side
every launcher runs.  The floor's fork server also serves
:mod:`harness.bench.warm`.

It may import the harness and :mod:`harness.bench.common`; inside it, a
launcher imports ``measure`` and ``workers``, ``compare`` imports them all,
and nothing imports ``compare``.
"""
