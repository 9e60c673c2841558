"""The parent side of a run: from ``Cluster.run``'s arguments to its result.

- ``cluster``: :class:`Cluster`, the ``mwms_cluster`` fixture's object;
- ``request``: ``run()``'s arguments, checked into a frozen request;
- ``attempt``: one attempt (start, watch, stop, decide); ``watch``: the
  watch loop; ``memory``: each live worker's memory, sampled as it runs;
  ``teardown``: stacks and the end of every process;
- ``outcome``: what the controller alone knows of a verdict (the faults
  that did not act, the failures a restart cannot mend), handed to the
  diagnosis's stages, and attempts combined;
- ``restarts``: what a restart starts again (the whole cluster, or one
  task into its running attempt);
- ``ledger_view``, ``replicas``: what the workers recorded, and the replica
  and reference comparisons; ``scripts``: ``run_script``'s parent half.

It may import :mod:`harness.launch`, :mod:`harness.network`,
:mod:`harness.diagnosis`, :mod:`harness.report`, :mod:`harness.core` and
the top-level :mod:`harness.settings`, :mod:`harness.faults`,
:mod:`harness.result` and :mod:`harness.errors`; nothing imports it but
the plugin, the command line and :mod:`harness`'s lazy ``Cluster``.
"""
from harness.controller.cluster import Cluster
from harness.controller.outcome import combine_attempts
from harness.controller.watch import Progress, Steer

__all__ = ["Cluster", "Progress", "Steer", "combine_attempts"]
