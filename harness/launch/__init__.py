"""Where and how workers are started: the backends behind one interface.

- ``base``: the :class:`~harness.launch.base.Launcher` interface, the
  :class:`~harness.launch.base.WorkerHandle` protocol, a backend's row;
- ``backends``: the backend table (``--mwms-backend``), the one place that
  names a backend;
- ``local``: processes of this machine (forkserver or spawn); ``memory``:
  a process's memory on this machine, read from ``/proc``;
  ``ray``: workers on the nodes of a Ray cluster;
- ``devices``: which GPUs each worker sees; ``ports`` and ``state_dir``:
  the ports a cluster listens on, reserved safely among users.

It may import :mod:`harness.core` and :mod:`harness.errors`, and never the
controller, the diagnosis or TensorFlow.
"""
