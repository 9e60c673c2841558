"""Worker side: the opt-in sync check (``run(sync_check=True)``)."""
from __future__ import annotations

from harness.errors import StepDesyncError


def check_step_sync(ctx, step: int) -> None:
    """All-reduce every worker's step number; raise if they disagree.

    Each worker puts ``step + 1`` in its own slot of an N-vector (zeros
    elsewhere) and the cluster sums the vectors, so every worker learns every
    worker's step in one tiny collective.  Like PyTorch's
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` fingerprints, it turns a silent
    misalignment (a skipped step pairs step k with k+1 and hangs only at the
    end) into an error at the first divergent step.  Every worker raises
    :class:`~harness.errors.StepDesyncError` with the same ``steps``, which
    the diagnosis reads as data.  A collective skipped or added inside a step
    makes this check pair with a training collective of another shape, which
    TensorFlow reports at once as a shape mismatch.  Its cost is one extra
    all-reduce per step (see the figures in docs/benchmark.md).
    """
    if ctx.task_type == "evaluator":
        return   # outside the collectives: nothing to compare with
    import numpy as np
    import tensorflow as tf
    strategy = ctx.strategy
    n = ctx.num_workers
    check = ctx.traced.get("sync_check")
    if check is None:
        @tf.function
        def check(vec):
            return strategy.reduce(tf.distribute.ReduceOp.SUM,
                                   strategy.run(lambda: tf.identity(vec)), axis=None)
        ctx.traced["sync_check"] = check
    mine = np.zeros(n, dtype=np.float32)
    mine[ctx.index] = step + 1
    per_worker = max(1, strategy.num_replicas_in_sync // n)
    seen = [int(round(v / per_worker)) - 1  # noqa: RUF046 - numpy's round gives a float
            for v in check(tf.constant(mine)).numpy()]
    if len(set(seen)) > 1:
        raise StepDesyncError(seen)
