"""The worker side of the harness: everything that runs inside a worker process.

One entry point, :func:`worker_main`, which the launcher starts in each
worker.  Like pytest-xdist's ``remote.py``, this package imports nothing of
the parent side (controller, launch, network, diagnosis, report, plugin):
only :mod:`harness.core`, :mod:`harness.errors` and :mod:`harness.faults`.
Inside it, imports run one way::

    main ──> context ──> actions ──> process
      │         ├──> sync     (lazily, with run(sync_check=True))
      │         └──> keras    (lazily, when fn asks for the callback) ──> actions
      ├──> strategy_hook ──> replicas (lazily, with the replica check)
      ├──> checkpoints (which checkpoint fn restored)
      ├──> ledger
      ├──> replicas (lazily)
      └──> process

``script`` is run_script's ``fn`` (standard library only); ``preload`` is
what the forkserver imports once, so that forked workers start with
TensorFlow and this package loaded.  Only ``worker_main`` (below),
``context`` (re-exported by :mod:`harness`) and ``script`` are meant for
other modules.
"""


def worker_main(spec, conn) -> None:
    """Run one worker process: see :func:`harness.worker.main.worker_main`.

    Imported from :mod:`.main` only when called, so that the parent, which
    names this function as the processes' target, and ``harness.context()``
    users import no more of the worker side than they need.
    """
    from harness.worker.main import worker_main as run_worker
    run_worker(spec, conn)
