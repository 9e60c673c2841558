"""Stand-ins for TensorFlow's multi-worker test runner, on the harness.

``from harness.compat import multi_process_runner`` and ``from
harness.compat import multi_worker_test_base`` take the place of
``tensorflow.python.distribute.multi_process_runner`` and
``multi_worker_test_base`` with only the import changed; files that reach
the runner through ``tf.__internal__.distribute.multi_process_runner`` get
it from :func:`install`.  Underneath are the harness's workers, watch loop
and diagnosis: a timeout or a failure raises TensorFlow's error type, its
message opening with the harness's verdict.

- ``multi_process_runner``: the public module (``run``, ``MultiProcessRunner``,
  ``MultiProcessPoolRunner``, ``get_barrier``, ``manager``, ``test_main``, errors);
- ``runner``: :class:`~harness.compat.runner.MultiProcessRunner` itself, each
  cluster it starts one ``Cluster.run`` in a thread (``incarnation``);
- ``pool``: :class:`~harness.compat.pool.MultiProcessPoolRunner`, one cluster
  whose tasks run call after call;
- ``task``: the worker side (the function every worker runs, the pool's
  loop, the barrier);
- ``verdict``: pure functions from a ``RunResult`` to TensorFlow's result or error;
- ``spec``: cluster specs, what maps onto the harness and what does not;
- ``routes``: what :func:`install` changes in TensorFlow's modules;
- ``originals``: TensorFlow's own modules that ``routes`` replaced, and whether it ran (a leaf);
- ``errors``: TensorFlow's runner's errors, and the harness's refusals.

It may import :mod:`harness.controller`, :mod:`harness.settings`,
:mod:`harness.result`, :mod:`harness.errors`, :mod:`harness.core` and
:mod:`harness.launch.scratch` (the session's temp directory),
:mod:`harness.launch.backends` (``install()`` starts the session's
launcher before TensorFlow's import), absl's
flags (marked parsed on import: pytest's options are not absl's) and
TensorFlow lazily; nothing else in :mod:`harness` imports it.  What is
supported, and what is not and why: ``docs/compat.md``.
"""

import importlib
from typing import TYPE_CHECKING

__all__ = ["install", "multi_process_runner", "multi_worker_test_base"]
# The stand-in modules, imported on first use (as ``harness.compat.multi_process_runner``).
_MODULES = ("multi_process_runner", "multi_worker_test_base")

if TYPE_CHECKING:
    from harness.compat import multi_process_runner, multi_worker_test_base


def install() -> None:
    """Make every way TensorFlow's test utilities start multi-worker
    processes run on the harness: call it once, from a ``conftest.py``,
    before the tests run.

    ``tf.__internal__.distribute.multi_process_runner`` becomes this
    package's ``multi_process_runner`` (tf-keras's tests reach the runner
    that way), as do the references TensorFlow's ``combinations``,
    ``strategy_combinations`` and ``multi_worker_test_base`` bound at
    import (:mod:`harness.compat.routes`)."""
    from harness.compat import routes
    routes.install()


def __getattr__(name: str):
    if name in _MODULES:
        return importlib.import_module(f"harness.compat.{name}")
    raise AttributeError(f"module 'harness.compat' has no attribute {name!r}")


def _absl_flags_at_their_defaults() -> None:
    """absl's flags, unparsed, are marked parsed at their defaults, in every
    process that imports this package (the test process, by either way in,
    and each task): TensorFlow's wrapper of the flags parses ``sys.argv``
    the first time a flag is read unparsed (``combinations``' TPU check
    reads one), and under pytest ``sys.argv`` is pytest's command line,
    whose options absl refuses.  TensorFlow's runner gives its tasks the
    same (``absl.app.run`` with the program name only); ``absl.app.run``
    (``test_main()``) still parses its own command line."""
    try:
        from absl import flags
    except ImportError:
        return
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


_absl_flags_at_their_defaults()
