"""Failures TensorFlow or Keras gives for a known reason, told as such:
what it is, what to do, and where it is written up.  A table of rows, each
matching a worker's error by its type and TensorFlow's own words, as the
catalogue's scenarios measured them (each row is held by the scenario that
names it, on TensorFlow 2.21).  The rules still decide who is to blame; a
row only adds what the error means.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

from harness.core.protocol import WorkerError
from harness.diagnosis.echoes import short_type
from harness.diagnosis.observations import WorkerObservation
from harness.diagnosis.words import names


@dataclasses.dataclass(frozen=True)
class Known:
    name: str
    type_name: str     # the error's type, short
    words: str         # what its message says, in TensorFlow's or Keras's words
    what: str          # what it means
    fix: str
    link: str
    # An error whose cause every task shares, so that who raised it is not
    # who is at fault: "race", a race every task ran (for one file: who
    # raised lost by chance); "job", the job's own setting (its files, say:
    # every task is at fault).  None: the raiser's own.
    shared: Optional[str] = None


DISTRIBUTED_GUIDE = "https://www.tensorflow.org/guide/distributed_training"

KNOWN: Tuple[Known, ...] = (
    # scenarios/test_keras.py::test_keras3_fit_under_mwms
    Known("keras3_fit", "ValueError", "Attempt to convert a value (PerReplica",
          "Keras 3's fit does not run under MultiWorkerMirroredStrategy",
          "fit with tf_keras (pip install tf_keras; TF_USE_LEGACY_KERAS=1), or a custom "
          "training loop", "https://github.com/keras-team/keras/issues/20585"),
    # scenarios/test_scope.py::test_model_outside_scope
    Known("model_outside_scope", "ValueError",
          "`colocate_vars_with` must only be passed a variable created in this",
          "the model's variables were created outside strategy.scope()",
          "build the model inside `with strategy.scope():`", DISTRIBUTED_GUIDE),
    # scenarios/test_scope.py::test_optimizer_outside_scope
    Known("optimizer_outside_scope", "RuntimeError",
          "Mixing different tf.distribute.Strategy objects",
          "the optimizer (or a variable) was created outside this strategy's scope",
          "create the model and its optimizer inside `with strategy.scope():`",
          DISTRIBUTED_GUIDE),
    # scenarios/test_scope.py::test_strategy_created_after_other_ops
    Known("strategy_after_ops", "RuntimeError",
          "Collective ops must be configured at program startup",
          "TensorFlow ran ops before MultiWorkerMirroredStrategy() was created",
          "create the strategy first, before any other TensorFlow call",
          "https://github.com/tensorflow/tensorflow/issues/34568"),
    # scenarios/test_cluster_shapes.py::test_the_evaluator_builds_the_strategy_from_tfjobs_tf_config
    Known("evaluator_outside_the_cluster", "KeyError", "'evaluator'",
          "the evaluator's TF_CONFIG has no 'evaluator' in its cluster",
          "evaluate without MultiWorkerMirroredStrategy (SidecarEvaluator)",
          "https://github.com/kubeflow/trainer/issues/1139"),
    # scenarios/test_fit.py::test_save_weights_to_the_same_path
    Known("file_locked", "BlockingIOError", "unable to lock file",
          "the tasks saved to one file at once; one holds its lock in the save's collective",
          "every task saves, the chief to the real path, the others to temporary ones",
          "https://github.com/tensorflow/tensorflow/issues/38635", shared="race"),
    # scenarios/test_data.py::test_file_autoshard_with_fewer_files_than_workers
    Known("file_sharding_too_few_files", "InvalidArgumentError",
          "Could not apply FILE based sharding",
          "the dataset has fewer files than the workers FILE sharding splits it among",
          "as many files as workers, or AutoShardPolicy.DATA",
          "https://www.tensorflow.org/tutorials/distribute/input#sharding", shared="job"),
)


def known_of(error: Optional[WorkerError]) -> Optional[Known]:
    """The row of :data:`KNOWN` that ``error`` is, or None."""
    if error is None:
        return None
    kind = short_type(error.type_name)
    return next((k for k in KNOWN if k.type_name == kind and k.words in (error.message or "")),
                None)


def known_lines(workers: Sequence[WorkerObservation]) -> List[str]:
    """A line for each known failure among the workers' errors: who raised
    it, what it means, the fix and the link."""
    raised: dict = {}
    for w in workers:
        k = known_of(w.error)
        if k is not None:
            raised.setdefault(k, []).append(w.index)
    return [f"known: {k.what} ({names(ws)} raised it): {k.fix}; see {k.link}"
            for k, ws in raised.items()]


def shared_cause(workers: Sequence[WorkerObservation]) -> Optional[Known]:
    """The first row of :data:`KNOWN` with a ``shared`` cause that one of
    ``workers`` raised, or None."""
    return next((k for k in map(known_of, (w.error for w in workers))
                 if k is not None and k.shared is not None), None)
