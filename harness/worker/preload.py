"""Imported once by the forkserver, so that every worker forked from it
starts with TensorFlow already loaded (4-10 s saved per worker).

The forkserver only serves ``--mwms-devices=cpu`` runs, so it hides GPUs
before TensorFlow could look for them.  tf_keras is preloaded only when the
environment asks for legacy Keras (``TF_USE_LEGACY_KERAS=1``), as importing
it costs a second or two that most runs would not use.
"""
import os
import signal

from harness.linux import set_parent_death_signal

# Die with pytest.  The server's own "alive" pipe is not enough: every
# worker inherits its write end, so while a worker lives (blocked in a
# collective, say) the server would never see it close, and the workers
# (which die with the server) would never be told.  The signal fires when
# the *thread* that started the server ends, which is pytest's main thread.
_parent = os.getppid()
set_parent_death_signal(signal.SIGKILL)
if os.getppid() != _parent:
    os._exit(0)

os.environ["CUDA_VISIBLE_DEVICES"] = "-1"

# The server inherits whatever pytest's stdout/stderr were when it started
# (during collection, pytest's own capture files).  TensorFlow's start-up
# chatter belongs nowhere; each worker redirects its output to its own log.
_devnull = os.open(os.devnull, os.O_WRONLY)
os.dup2(_devnull, 1)
os.dup2(_devnull, 2)
os.close(_devnull)

import tensorflow  # noqa: E402,F401
import tensorflow.python.distribute.collective_all_reduce_strategy  # noqa: E402,F401
import dill  # noqa: E402,F401

import harness.worker  # noqa: E402,F401
import harness.worker.sync  # noqa: E402,F401
import harness.worker.ledger  # noqa: E402,F401

if os.environ.get("TF_USE_LEGACY_KERAS") == "1":
    try:
        import tf_keras  # noqa: F401
    except ImportError:
        pass
