"""The Ray backend (``--mwms-backend=ray``): workers on the nodes of a Ray
cluster, one agent per node starting them with its node's local launcher.

- ``launcher``: the parent side (:class:`~harness.launch.ray.launcher.RayLauncher`);
- ``agent``: the actor on each node;
- ``holder``: the process that holds a session's local Ray cluster;
- ``link``: a worker's channel, progress records and files over TCP.

Importing it imports nothing of Ray: only a run does.  Its modules may
import :mod:`harness.launch.base`, :mod:`harness.launch.local`,
:mod:`harness.launch.ports`, :mod:`harness.core` and :mod:`harness.errors`.
"""
