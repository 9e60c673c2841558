"""TensorFlow's runner's errors, and what the harness refuses to stand in for.

The three runner errors keep TensorFlow's names, bases and ``mpr_result``;
the harness adds ``run_result`` (the :class:`~harness.result.RunResult`
whose verdict opens the message).  The refusals subclass
``NotImplementedError``: each names the missing feature.
"""
from __future__ import annotations


class SubprocessTimeoutError(RuntimeError):
    """A task was still running when ``join(timeout)`` ran out, or the
    harness found the cluster hung; ``mpr_result`` holds what was gathered."""

    def __init__(self, msg, mpr_result, run_result=None):
        super().__init__(msg)
        self.mpr_result = mpr_result
        self.run_result = run_result


class UnexpectedSubprocessExitError(RuntimeError):
    """A task exited with a non-zero code (or died) without raising."""

    def __init__(self, msg, mpr_result, run_result=None):
        super().__init__(msg)
        self.mpr_result = mpr_result
        self.run_result = run_result


class NotInitializedError(RuntimeError):
    """TensorFlow's runner raises it without ``test_main()``; the harness's
    needs no initialization, so it is never raised here (kept for ``except``)."""


class UnsupportedClusterError(NotImplementedError):
    """A cluster spec with tasks the harness cannot run (chief, ps, evaluator)."""


class OneTaskRestartError(NotImplementedError):
    """What the harness cannot do with one task: start it into a running
    cluster of another size, or ``join()`` a cluster some of whose tasks
    were never asked for."""
