"""What the harness's features cost a run, each a program
(``python -m harness.bench.cost.<name>``, docs/benchmark.md): ``step``
(progress reporting, per training step), ``replica`` (the replica check and
the reference run), ``network`` (a network namespace per cluster) and
``plugin`` (the installed plugin, in a session that does not use it).

``paired`` alternates variants and pairs each with a reference round by
round (``replica`` and ``network`` use it); ``workers`` is ``step``'s worker
side.  It may import the harness and :mod:`harness.bench.common`, nothing
of another family of the benchmark.
"""
