"""Worker side: the strategy's variables, recorded as they are created, and
their fingerprints once ``fn`` has returned (``run(check_replicas=...)``).

TensorFlow 2 keeps no registry of variables, so the harness wraps the
strategy's own variable creator (``strategy.extended._create_variable``,
which every variable made under ``strategy.scope()`` goes through, Keras's
included) on the instance ``fn`` created: it sees the distributed variable
the strategy returns, whatever the user's code looks like.  What is kept is
a reference per variable; reading them waits until ``fn`` has returned.
"""
from __future__ import annotations

import hashlib
from typing import List, Tuple

from harness.core.protocol import VariablePrint


def watch_variables(strategy, recorded: List[tuple]) -> None:
    """Append ``(name, variable)`` to ``recorded`` for each variable
    ``strategy`` creates from now on."""
    extended = strategy.extended
    original = extended._create_variable

    def _create_variable(next_creator, **kwargs):
        variable = original(next_creator, **kwargs)
        recorded.append((kwargs.get("name"), variable))
        return variable

    extended._create_variable = _create_variable


def mirrored(variable) -> bool:
    """Whether the variable is meant to be equal on every worker: not a
    sync-on-read one (metrics, batch-norm moving statistics)."""
    import tensorflow as tf
    from tensorflow.python.distribute import values as values_lib
    if isinstance(variable, values_lib.SyncOnReadVariable):
        return False
    return getattr(variable, "synchronization", None) != tf.VariableSynchronization.ON_READ


def local_value(variable):
    """The variable's value on this worker's first device, as numpy; a
    local read that launches no collective."""
    import numpy as np
    components = getattr(variable, "values", None)
    first = components[0] if isinstance(components, (tuple, list)) and components else variable
    value = np.asarray(first.numpy())
    if value.dtype.kind == "O":   # strings: their text, not their pointers
        value = value.astype(str)
    return np.ascontiguousarray(value)


def fingerprint(recorded: List[tuple], path: str) -> Tuple[VariablePrint, ...]:
    """Fingerprint the mirrored variables of ``recorded``; write their values
    to ``path`` (an .npz file, array ``v<number>`` each)."""
    import numpy as np
    prints: List[VariablePrint] = []
    arrays = {}
    for name, variable in recorded:
        if not mirrored(variable):
            continue
        value = local_value(variable)
        number = len(prints)
        label = getattr(variable, "name", None) or name or f"variable {number}"
        prints.append(VariablePrint(number, str(label), tuple(int(d) for d in value.shape),
                                    str(value.dtype), hashlib.sha256(value.tobytes()).hexdigest()))
        arrays[f"v{number}"] = value
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return tuple(prints)
