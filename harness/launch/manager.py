"""A Manager for what a test shares with its workers (``.dict()``,
``.Barrier(n)``, ``.Event()``), that nothing outlives.

``Manager()`` starts a server process with no tie to its parent: when the
pytest that started it is SIGKILLed, the server goes on running, and the
directory of its socket (``pymp-*``, in the temp directory) stays
(measured, Python 3.11, ``multiprocessing`` and ``multiprocess`` alike).
:func:`guarded_manager` ties the server to its parent with SIGKILL and has
the harness's sweeper (:mod:`harness.launch.scratch`) remove that
directory, so a killed session leaves neither.
"""
from __future__ import annotations

import contextlib
import importlib
from typing import Iterator

from harness.core import linux
from harness.launch import scratch


@contextlib.contextmanager
def guarded_manager(library=None, address=None) -> Iterator[object]:
    """A started ``library.managers.SyncManager`` (``library``:
    ``multiprocess`` by default, or ``multiprocessing``) whose server dies
    with this process and whose socket directory is swept; shut down on
    leaving.  ``address``: where it listens (a TCP ``(host, port)``, say),
    else a Unix socket."""
    if library is None:
        import multiprocess
        library = multiprocess
    managers = importlib.import_module(library.__name__ + ".managers")
    connection = importlib.import_module(library.__name__ + ".connection")
    util = importlib.import_module(library.__name__ + ".util")
    # The socket's path is chosen here, in this process's own temp
    # directory, which the sweeper is told of; left to the server, it is
    # in a directory of the server's own that only the server's exit removes.
    scratch.remove_mp_temp_dir_at_end(util)
    manager = managers.SyncManager(address=address or connection.arbitrary_address("AF_UNIX"))
    manager.start(linux.die_with_parent)
    try:
        yield manager
    finally:
        manager.shutdown()
