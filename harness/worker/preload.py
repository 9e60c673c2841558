"""Imported once by the forkserver, so that every worker forked from it
starts with TensorFlow already loaded (5-10 s saved per worker).

The forkserver only serves ``--mwms-devices=cpu`` runs, so it hides GPUs
before TensorFlow could look for them.  It is Keras-neutral: tf_keras is not
preloaded, and the server starts without ``TF_USE_LEGACY_KERAS`` (see
:mod:`harness.launch.local`), so each run's workers choose their Keras.
"""
import gc
import os
import signal

from harness.core.linux import set_parent_death_signal
from harness.worker import process as _process

# Die with pytest, and take every worker's process group along (what fn
# started in them included): the workers' own reaper.  The server's "alive"
# pipe is not enough: every worker inherits its write end, so while a
# worker lives (blocked in a collective, say) the server would never see it
# close.  The signal fires when the *thread* that started the server ends,
# which is pytest's main thread.
_parent = os.getppid()
signal.signal(signal.SIGTERM, _process.end_with_the_workers)
set_parent_death_signal(signal.SIGTERM)
if os.getppid() != _parent:
    os._exit(0)
_process.SERVER_KILLS_GROUPS = True

os.environ["CUDA_VISIBLE_DEVICES"] = "-1"

# The server inherits whatever pytest's stdout/stderr were when it started
# (during collection, pytest's own capture files).  TensorFlow's start-up
# chatter belongs nowhere; each worker redirects its output to its own log.
_devnull = os.open(os.devnull, os.O_WRONLY)
os.dup2(_devnull, 1)
os.dup2(_devnull, 2)
os.close(_devnull)

import tensorflow  # noqa: E402
import tensorflow.python.distribute.collective_all_reduce_strategy  # noqa: E402,F401
import dill  # noqa: E402,F401

import harness.worker  # noqa: E402
import harness.worker.sync  # noqa: E402
import harness.worker.ledger  # noqa: E402,F401

# Not tf_keras: importing it here would make tf.keras tf_keras in every
# worker of the session, whatever its own TF_USE_LEGACY_KERAS says (the
# server starts without that variable, so each run chooses).  A run that
# asks for tf_keras imports it itself, a second or two.

# A worker imports fn's module to unpickle it, and a test module imports
# pytest and hypothesis, and the harness's own modules a test reads results
# and faults with (harness.result pulls in the diagnosis; harness.network,
# the probes): imported here once, by name, not again by every worker of
# every run.  None of them is the worker side's: this only warms the
# imports of the module fn lives in.  Then what the user named (mwms_preload), each
# guarded: one that fails or starts a thread is reported (the parent warns),
# and the server goes on without it.
import importlib  # noqa: E402
import threading  # noqa: E402

for _name in ("pytest", "hypothesis", "harness.result", "harness.faults", "harness.network"):
    try:
        importlib.import_module(_name)
    except Exception:
        pass
_problems = []
for _name in filter(None, (n.strip() for n in os.environ.get("MWMS_PRELOAD", "").split(","))):
    _threads = threading.active_count()
    try:
        importlib.import_module(_name)
    except BaseException as _e:   # a SystemExit at import must not end the server
        _problems.append(f"{_name}: {type(_e).__name__}: {_e}")
        continue
    if threading.active_count() > _threads:
        _problems.append(f"{_name}: started a thread at import; forking a process with "
                         f"threads can deadlock its children, so keep it out of mwms_preload")
if os.environ.get("MWMS_PRELOAD_REPORT"):
    with open(os.environ["MWMS_PRELOAD_REPORT"], "w") as _report:
        _report.write("\n".join(_problems))


# What multiprocess's preparation data would have a forked child import:
# the parent's main module, again.  A worker runs harness.worker's entry
# point and fn, which dill carries by value when it lives in __main__, so
# that import is only cost (the whole parent side, when the main module is
# a benchmark or a user's script) and, for a script that starts a cluster
# at its top level, a second cluster inside the worker.
_MAIN_MODULE_KEYS = ("init_main_from_path", "init_main_from_name")


def _prepared_as_a_worker(prepare):
    """Before multiprocess prepares a forked child, point the child's
    stdout and stderr at the worker's log, named in its process name (what
    fails there is in the log, not lost in the server's /dev/null); then
    prepare it without importing the parent's main module."""
    def prepare_in_the_log(data):
        path = protocol.log_path_of(str(data.get("name", "")))
        if path:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
        return prepare({k: v for k, v in data.items() if k not in _MAIN_MODULE_KEYS})
    return prepare_in_the_log


from multiprocess import spawn as _spawn  # noqa: E402

from harness.core import protocol  # noqa: E402

_spawn.prepare = _prepared_as_a_worker(_spawn.prepare)

# Last: what the server holds now is shared by every worker forked from it.
# Frozen, the workers' garbage collections never walk it: a full collection
# in a worker would otherwise visit TensorFlow's millions of objects, and
# writing their headers would copy the pages they live on.
gc.collect()
gc.freeze()
