"""Running a Python script, or a module, in a worker as ``python`` would.

``mwms_cluster.run_script(path, argv)`` (and ``module=``, for ``python -m``)
hands ``Cluster.run`` a :class:`ScriptMain` as its ``fn``: an ordinary
picklable callable, so a script gets everything a function gets (the
forkserver's warm start, faults, the ledger, the diagnosis).  In the worker
it runs the script with ``runpy`` the way the interpreter does: ``__name__
== "__main__"``, ``sys.argv`` the script and its arguments, the script's
directory (for a module, the current directory) first on ``sys.path``, in
the directory the run was started from.

Exit status, as for a process: the script returning, or ``sys.exit(0)`` /
``sys.exit()`` / ``SystemExit(None)`` (absl's ``app.run`` always ends in
one), is a normal return (the run *completed*); an uncaught exception
*failed*, as for a function; ``sys.exit(n)`` with any other status
propagates, so the worker exits with it and the run *crashed*.

Importing this module imports nothing but the standard library: the workers
import it to unpickle :class:`ScriptMain`.
"""
from __future__ import annotations

import dataclasses
import os
import runpy
import sys
from typing import Optional, Tuple


@dataclasses.dataclass(frozen=True)
class ScriptMain:
    """``python path argv...`` (or ``python -m module argv...``) as a callable.

    Exactly one of ``path`` (absolute) and ``module`` is set; ``cwd`` is the
    directory to run in (the parent's at the call: a forked worker would
    otherwise run in the forkserver's).  Calling it runs the script and
    returns None when it ends normally or by ``SystemExit`` with status 0 or
    None; any other exit or exception propagates.  ``sys.argv``, ``sys.path``
    and the working directory are restored afterwards.
    """

    path: Optional[str] = None
    argv: Tuple[str, ...] = ()
    module: Optional[str] = None
    cwd: str = "/"

    def __repr__(self) -> str:
        what = f"-m {self.module}" if self.module else self.path
        return f"ScriptMain({' '.join([str(what), *self.argv])!r})"

    def __call__(self) -> None:
        saved = sys.argv, list(sys.path), os.getcwd()
        try:
            os.chdir(self.cwd)
            if self.module is not None:
                # As `python -m`: argv[0] is "-m" until runpy sets it to the
                # module's file; the current directory is first on sys.path.
                sys.argv = ["-m", *self.argv]
                sys.path.insert(0, self.cwd)
                runpy.run_module(self.module, run_name="__main__", alter_sys=True)
            elif self.path is not None:
                sys.argv = [self.path, *self.argv]
                sys.path.insert(0, os.path.dirname(self.path))
                runpy.run_path(self.path, run_name="__main__")
            else:
                raise ValueError("ScriptMain: neither a path nor a module to run")
        except SystemExit as e:
            if not exit_ok(e.code):
                raise
        finally:
            sys.argv = saved[0]
            sys.path[:] = saved[1]
            try:
                os.chdir(saved[2])
            except OSError:
                pass
        return None


def exit_ok(code) -> bool:
    """True for the ``SystemExit`` codes the interpreter exits 0 on."""
    return code is None or (isinstance(code, int) and code == 0)
