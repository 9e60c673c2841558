"""Stands in for ``tensorflow.python.distribute.multi_process_runner``.

``from harness.compat import multi_process_runner`` is the only change a
test needs: :func:`run`, :class:`MultiProcessRunner`,
:class:`MultiProcessPoolRunner`, :func:`get_barrier`, :func:`manager`,
:func:`test_main`, :func:`create_cluster_spec` and the errors keep
TensorFlow's names, arguments and results; the tasks are the harness's
workers, so a failure or a timeout raises TensorFlow's error type with a
message that opens with the harness's verdict.  No ``test_main()`` is
needed: the tests run under pytest as they are.
"""
from __future__ import annotations

from harness.compat.errors import (NotInitializedError, OneTaskRestartError,
                                   SubprocessTimeoutError, UnexpectedSubprocessExitError,
                                   UnsupportedClusterError)
from harness.compat.runner import (DEFAULT_TIMEOUT_SEC, MultiProcessRunner, end_all_runners,
                                   manager, shutdown_manager)
from harness.compat.pool import MultiProcessPoolRunner
from harness.compat.spec import create_cluster_spec
from harness.compat.task import get_barrier
from harness.compat.verdict import MultiProcessRunnerResult

__all__ = ["run", "MultiProcessRunner", "MultiProcessPoolRunner", "MultiProcessRunnerResult",
           "get_barrier", "manager", "shutdown_manager", "end_all_runners", "test_main",
           "create_cluster_spec", "is_oss", "SubprocessTimeoutError", "UnexpectedSubprocessExitError",
           "NotInitializedError", "UnsupportedClusterError", "OneTaskRestartError"]


def run(fn, cluster_spec, rpc_layer=None, max_run_time=None, return_output=False,
        timeout=DEFAULT_TIMEOUT_SEC, args=None, kwargs=None):
    """Run ``fn`` on every task of ``cluster_spec`` and return a
    :class:`MultiProcessRunnerResult` (``return_value``: what each task
    returned, None left out, by task index; ``stdout``: the tasks' output
    lines, ``[worker-i]:``-prefixed, with ``return_output``).

    ``timeout`` is also the harness's hang timeout: a cluster without
    progress for that long is declared hung, with the verdict and stacks."""
    runner = MultiProcessRunner(fn, cluster_spec, rpc_layer, max_run_time=max_run_time,
                                return_output=return_output, args=args, kwargs=kwargs,
                                hang_timeout=timeout or None)
    runner.start()
    return runner.join(timeout)


def is_oss() -> bool:
    """TensorFlow's check for a Bazel test binary; False here."""
    return False


def test_main():
    """What TensorFlow's tests call under ``__main__``: the harness needs no
    initialization, so this runs the tests (``tf.test.main()``)."""
    from tensorflow.python.platform import test
    test.main()
