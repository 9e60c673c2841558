"""``run_script``'s parent half: a script or module checked, before any
process starts, and made into the :class:`~harness.worker.script.ScriptMain`
that every worker runs as its ``fn``.

Checked here (:func:`script_main`): the file or module exists, the
arguments are strings, and no environment variable TensorFlow reads once,
at import, is asked of a worker that is forked from a forkserver which
imported TensorFlow already (:func:`check_import_time_env`).

A script's worker ends as a job's process does: ``Cluster.run_script`` and
``harness run`` run it with ``on_return="exit"``, so once the script ended
the worker's atexit handlers run and its process exits, and its peers see
it leave (``run(fn)`` keeps ``"stay"``).  A worker that leaves while the
others still need it in a collective is named as the one that left; one
whose process dies at exit after every worker returned makes the run
``crashed_at_exit``.
"""
from __future__ import annotations

import collections.abc
import importlib.machinery
import importlib.util
import os
from typing import Mapping, Optional, Sequence, Tuple

from harness.errors import SettingError, hide_in_setup_errors
from harness.worker.script import ScriptMain

# pytest leaves this module's frames out of a setup error's traceback.
__tracebackhide__ = hide_in_setup_errors

# Environment variables that TensorFlow (or Keras 3, which TensorFlow imports
# with it) reads once, when it is imported, and never again.  A worker forked
# from the forkserver starts with TensorFlow imported under the forkserver's
# environment, so a different value given for the run cannot take effect.
# Found by tracing getenv() and os.environ during `import tensorflow` in the
# forkserver's preload (TensorFlow 2.21), then reading each one's use;
# TF_CPP_MIN_LOG_LEVEL and TF_ENABLE_ONEDNN_OPTS were also measured: ignored
# in forked workers (the log lines stay, oneDNN stays on), honoured under
# spawn.  Variables TensorFlow reads later (at the first op:
# TF_NUM_INTRAOP_THREADS, TF_XLA_FLAGS, ...) take effect in forked workers.
# TF_USE_LEGACY_KERAS is left out on purpose (run(env=...) documents it):
# `tf.keras` reads it at first use, though `from tensorflow.keras import x`
# follows the value TensorFlow was imported with (measured: Keras 3 there).
IMPORT_TIME_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "TensorFlow's C++ logging fixes its level at import",
    "TF_CPP_MAX_VLOG_LEVEL": "TensorFlow's C++ logging fixes its level at import",
    "TF_CPP_VMODULE": "TensorFlow's C++ logging fixes its levels at import",
    "TF_ENABLE_ONEDNN_OPTS": "TensorFlow decides on oneDNN at import",
    "TF_USE_MODULAR_FILESYSTEM": "TensorFlow loads its file systems at import",
    "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "TensorFlow loads device plugins at import",
    "TF_ENABLE_CONTROL_FLOW_V2": "a module-level constant of tensorflow.python.ops."
                                 "control_flow_util",
    "TF_FORWARD_COMPATIBILITY_DELTA_DAYS": "computed once by tensorflow.python.compat.compat",
    "TF_FUNCTION_JIT_COMPILE_DEFAULT": "a module-level constant of tf.function's module",
    "TF_JIT_COMPILE_REWRITE": "a module-level constant of tensorflow.python.eager.context",
    "TF_XLA_SHARDING_FOR_RESOURCE_VARIABLES": "a module-level constant of "
                                              "tensorflow.python.eager.context",
    "TF_OPTIONALS_IN_GRADIENTS": "a module-level constant of tensorflow.python.eager.context",
    "KERAS_BACKEND": "Keras 3, imported with TensorFlow, picks its backend at import",
}


def _forkserver_environ() -> Mapping[str, str]:
    """The environment the workers' TensorFlow was imported under: the running
    forkserver's (it started with the parent's environment of that moment),
    or, before it runs, the parent's own, which it will start with."""
    from harness.launch.local import forkserver_pid   # parent side: imported only here
    pid = forkserver_pid()
    if pid:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                raw = f.read()
        except OSError:
            raw = None
        if raw is not None:
            env = {}
            for item in raw.split(b"\0"):
                name, sep, value = item.partition(b"=")
                if sep:
                    env[os.fsdecode(name)] = os.fsdecode(value)
            return env
    return os.environ


def check_import_time_env(env: Optional[Mapping], start_method: Optional[str],
                          where: str = "run_script(env=...)") -> None:
    """Refuse ``env`` entries that cannot take effect under ``start_method``.

    Under ``forkserver`` a worker's TensorFlow was imported by the server,
    so a variable of :data:`IMPORT_TIME_ENV` set for the run, to a value the
    server was not started with, would be ignored without a word: raise
    :class:`~harness.errors.SettingError` naming it and the fix instead.
    """
    if start_method != "forkserver" or not env:
        return
    names = [k for k in env if k in IMPORT_TIME_ENV]
    if not names:
        return
    had = _forkserver_environ()
    bad = [k for k in names if had.get(k) != env[k]]
    if bad:
        why = "; ".join(f"{k}: {IMPORT_TIME_ENV[k]}" for k in bad)
        raise SettingError(
            f"{where}: {', '.join(bad)} cannot take effect in workers forked from the "
            f"forkserver, which imported TensorFlow already ({why}). Use "
            f"--mwms-start-method=spawn (ini mwms_start_method = spawn), where each worker "
            f"imports TensorFlow itself, or set it in the environment pytest starts with.")


def _find_module(name: str, cwd: str, where: str) -> str:
    """Where ``python -m name`` run in ``cwd`` would find ``name``: its file.

    Walks the dotted name with the import system's finders, without
    importing (running) any package on the way, the current directory first
    as ``python -m`` puts it.  Raises SettingError when it is not there.
    """
    parts = name.split(".")
    if not name or not all(p.isidentifier() for p in parts):
        raise SettingError(f"{where}: not a dotted module name")
    try:
        spec = (importlib.machinery.PathFinder.find_spec(parts[0], [cwd])
                or importlib.util.find_spec(parts[0]))
    except (ImportError, ValueError) as e:
        raise SettingError(f"{where}: cannot look up {parts[0]!r}: {e}") from None

    def missing(found: str) -> SettingError:
        return SettingError(f"{where}: no module named {found!r} (searched {cwd!r}, the "
                            f"current directory, and sys.path)")

    for i in range(1, len(parts)):   # each package on the way
        found = ".".join(parts[:i])
        if spec is None:
            raise missing(found)
        if spec.submodule_search_locations is None:
            raise SettingError(f"{where}: {found!r} is a module, not a package")
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:i + 1]),
                                                        list(spec.submodule_search_locations))
    if spec is None:
        raise missing(name)
    if spec.submodule_search_locations is not None:   # a package runs its __main__
        main = importlib.machinery.PathFinder.find_spec(name + ".__main__",
                                                        list(spec.submodule_search_locations))
        if main is None:
            raise SettingError(f"{where}: {name!r} is a package and has no __main__ module "
                               f"to run")
        spec = main
    return spec.origin or name


def check_argv(argv, where: str = "run_script") -> Tuple[str, ...]:
    if isinstance(argv, (str, bytes)) or not isinstance(argv, collections.abc.Sequence):
        raise SettingError(f"{where}(argv=...): give a list of str, one per argument, got "
                           f"{argv!r}" + (" (split it: argv=shlex.split(...))"
                                          if isinstance(argv, str) else ""))
    bad = [a for a in argv if not isinstance(a, str)]
    if bad:
        raise SettingError(f"{where}(argv=...): every argument must be a str, as on a "
                           f"command line; got {bad[0]!r} ({type(bad[0]).__name__}); "
                           f"pass str(value)")
    return tuple(argv)


def script_main(path=None, argv: Sequence[str] = (), *, module: Optional[str] = None,
                env: Optional[Mapping] = None, start_method: Optional[str] = None,
                where: str = "run_script", module_where: Optional[str] = None) -> ScriptMain:
    """Check a script run up front and return the :class:`ScriptMain` to run.


    Raises :class:`~harness.errors.SettingError` for: neither or both of
    ``path`` and ``module``; a path that is missing or not a file; a module
    that cannot be found; ``argv`` not a sequence of str; ``env`` naming a
    variable TensorFlow reads at import under the forkserver.  ``where``
    and ``module_where`` name the script and the module in an error as the
    caller took them (``harness run``'s SCRIPT and ``-m``).
    """
    argv = check_argv(argv)
    cwd = os.getcwd()
    if (path is None) == (module is None):
        raise SettingError(f"{where}: give a script path or module=..., exactly one")
    if module is not None:
        if not isinstance(module, str):
            raise SettingError(f"{where}(module=...): a dotted module name, got {module!r}")
        _find_module(module, cwd, module_where or f"{where}(module={module!r})")
        main = ScriptMain(argv=argv, module=module, cwd=cwd)
    else:
        try:
            path = os.fspath(path)
        except TypeError:
            raise SettingError(f"{where}: path must be a str or os.PathLike, "
                               f"got {path!r}") from None
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        full = os.path.abspath(path)
        if not os.path.exists(full):
            raise SettingError(f"{where}: {path!r}: no such file (looked for {full!r})")
        if not os.path.isfile(full):
            raise SettingError(f"{where}: {path!r} is not a file; give the script itself "
                               f"(for a package, module='name')")
        main = ScriptMain(path=full, argv=argv, cwd=cwd)
    check_import_time_env(env, start_method, f"{where}(env=...)")
    return main
