"""Worker side: the entry point of every worker process.

``worker_main`` sets the process up, runs ``fn`` and reports to the parent
over the channel of :mod:`harness.core.protocol`:

1. joins its cluster's network namespace when the run is isolated
   (:mod:`harness.network.namespace`), then ties its life to its parent's
   (``PR_SET_PDEATHSIG``) and leads a process group (:mod:`.process`);
   a worker with a ``StartDelay`` then waits it out (or, never starting,
   until it is killed) before anything else of it runs;
2. sends stdout and stderr to its log file;
3. arms ``faulthandler``: :data:`~harness.core.protocol.DUMP_SIGNAL` dumps every
   thread's Python stack to the stack file, and fatal signals dump to the log;
4. sets ``TF_CONFIG`` and the environment, unpickles ``fn`` and its
   arguments holding the parent's multiprocessing authkeys (a failure there
   is a ``SerializationError``, before STARTED), then runs ``fn`` with
   ``harness.context()`` available;
5. fingerprints the strategy's variables when the run checks replicas, then
   reports RETURNED and waits for the parent's RELEASE (or its SIGKILL), so a
   worker that returned stays in the cluster until the run is decided
   (unless the run asked it to exit, as a script that ends does); or
   reports RAISED and exits with status 1, as a process whose main raised.
"""
from __future__ import annotations

import faulthandler
import atexit
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from typing import Tuple, Union

import multiprocess

from harness.core import linux, progress, protocol, serialize
from harness.errors import HarnessError, SerializationError
from harness.faults import StartDelay
from harness.core.protocol import Message, VariablePrint, WorkerError, WorkerSpec
from harness.worker import context as context_module
from harness.worker.process import flush_output, lead_process_group, redirect_output
from harness.worker.coordinator import watch_coordinator
from harness.worker.strategy_hook import install_strategy_hook
from harness.worker.servers import serve
from harness.worker.checkpoints import watch_restores
from harness.worker.datasets import watch_datasets
from harness.worker import ledger as ledger_module

# Exit codes of a worker that could not do its job for the harness's own
# reasons (not fn's): its parent died before it was tied to it, or the parent
# went away while it was reporting.
EXIT_ORPHANED = 70
EXIT_PARENT_GONE = 71
# A worker whose fn raised exits as Python does on an uncaught exception.
EXIT_RAISED = 1


def worker_error(exc: BaseException) -> WorkerError:
    """``exc`` reduced to what crosses the process boundary (see WorkerError)."""
    name = type(exc).__name__
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable>"
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    fields = getattr(exc, "fields", None)
    return WorkerError(name, message, tb, dict(fields) if isinstance(fields, dict) else None)


class Channel:
    """The worker's end of its pipe to the parent; safe to use from any thread."""

    def __init__(self, conn, index: int):
        self._conn = conn
        self._index = index
        self._lock = threading.Lock()

    def send(self, kind: str, step=None, data=None) -> None:
        msg = Message(self._index, kind, time.time(), step, data)
        with self._lock:
            try:
                self._conn.send(msg)
            except (OSError, EOFError):
                os._exit(EXIT_PARENT_GONE)  # nobody to report to

    def wait_release(self) -> None:
        try:
            self._conn.recv()
        except (OSError, EOFError):
            pass

    def wait_applied(self) -> None:
        """Until the parent says a network fault is in place (:data:`protocol.APPLIED`)."""
        try:
            if self._conn.poll(protocol.APPLIED_WAIT) and self._conn.recv() == protocol.APPLIED:
                return
        except (OSError, EOFError):
            os._exit(EXIT_PARENT_GONE)  # nobody to act on the network
        raise HarnessError(f"the parent did not put a network fault in place within "
                           f"{protocol.APPLIED_WAIT:g} s")


def start_ledger(ctx, progress_map: progress.Writer, level: str, send) -> None:
    """Hook TensorFlow to keep the collective ledger; never fail the run for it."""
    try:
        why = ledger_module.install(ledger_module.Ledger(progress_map, send, level, ctx))
    except Exception as e:   # a TensorFlow whose internals moved in a way not foreseen
        why = f"{type(e).__name__}: {e}"
    if why is not None:
        send(protocol.LEDGER_OFF, data=why)


def send_replicas(ctx, path: str, send) -> None:
    """Fingerprint the strategy's variables for the replica check; a
    failure to do so is the harness's, reported as text, not fn's error."""
    from harness.worker.replicas import fingerprint
    data: Union[Tuple[VariablePrint, ...], str]
    try:
        data = fingerprint(ctx.replica_variables or [], path)
    except Exception as e:
        data = f"could not fingerprint its variables: {type(e).__name__}: {e}"
    send(protocol.REPLICAS, data=data)


def load_call(payload: bytes):
    """``fn``, its arguments and keyword arguments, unpickled here; what
    fails is a :class:`SerializationError`, which no restart cures (the
    parent sends the same bytes to every attempt)."""
    try:
        return serialize.load_call(payload)
    except Exception as e:
        raise SerializationError(f"fn or its arguments could not be unpickled in this worker: "
                                 f"{type(e).__name__}: {e}") from e


def wait_for_start(spec: WorkerSpec, conn) -> None:
    """Wait out this worker's ``StartDelay``, if it has one, then report it
    (the record lists it as injected; no rule reads it).  A late worker
    does not exist yet: nothing of it runs or reports before.  One whose
    ``seconds`` is None waits until the parent kills it: it never starts."""
    delay = next((f for f in spec.faults if isinstance(f, StartDelay)), None)
    if delay is None:
        return
    while delay.seconds is None:
        time.sleep(3600)
    time.sleep(delay.seconds)
    Channel(conn, spec.index).send(protocol.FAULT, data=delay)


def end_as_script() -> None:
    """End the process as a script's ends once its main returned
    (``on_return="exit"``): its atexit handlers run, as the interpreter runs
    them at exit, then it exits 0, and its peers see it leave.  A handler
    may end it otherwise (a signal, ``os._exit(n)``): the parent reads that
    as a death at exit."""
    flush_output()
    atexit._run_exitfuncs()
    flush_output()
    os._exit(0)


def end_raised(channel: Channel, e: BaseException) -> None:
    """Report that the worker raised ``e`` and end its process."""
    traceback.print_exception(type(e), e, e.__traceback__)
    flush_output()
    channel.send(protocol.RAISED, data=worker_error(e))
    # A process whose main raised ends: its peers lose its heartbeats
    # and TensorFlow tells them (UnavailableError, about 10 s later), as
    # it would tell a real cluster.  Kept alive, it would hide that.
    os._exit(EXIT_RAISED)


def worker_main(spec: WorkerSpec, conn) -> None:
    # The cluster's own network first: joining a user namespace needs a
    # single-threaded process, and it changes credentials, which would
    # clear the parent-death signal set below.
    netns_error = None
    if spec.netns:
        try:
            linux.enter_namespaces(*spec.netns)
        except OSError as e:
            netns_error = e
    linux.die_with_parent(EXIT_ORPHANED)
    lead_process_group()
    wait_for_start(spec, conn)
    redirect_output(spec.log_path)
    # The name carried the log's path to the fork (protocol.process_name).
    multiprocess.current_process().name = f"mwms-worker-{spec.index}"
    stack_file = os.fdopen(os.open(spec.stack_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                           "w")
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(protocol.DUMP_SIGNAL, file=stack_file, all_threads=True)

    # The whole environment the parent chose, not an update of the
    # forkserver's: a variable unset in the parent since the server started
    # must not linger in its workers.
    os.environ.clear()
    os.environ.update(spec.env)
    tempfile.tempdir = None   # the forkserver cached its own: read TMPDIR again
    linux.note_inherited_mp_temp_dirs()   # the parent's: a cluster started here leaves them
    if spec.tf_config is None:
        os.environ.pop("TF_CONFIG", None)
    else:
        os.environ["TF_CONFIG"] = json.dumps(spec.tf_config)

    channel = Channel(conn, spec.index)
    progress_map = None
    if spec.progress_path:
        progress_map = progress.Writer(spec.progress_path, nudge=lambda: channel.send(protocol.DRAIN))
    ctx = context_module.WorkerContext(spec.index, spec.num_workers, spec.tf_config,
                                       channel.send, spec.faults, spec.sync_check, progress_map,
                                       spec.step_function, spec.attempt,
                                       bool(spec.replicas_path), spec.reference_workers,
                                       wait_applied=channel.wait_applied,
                                       run_dir=spec.run_dir or None, watch_state=spec.watch_state)
    ctx.coordinates = spec.coordinates
    ctx.holds = spec.holds
    context_module.activate(ctx)
    code = 1
    try:
        if netns_error is not None:
            raise HarnessError(f"could not join the cluster's network namespace: {netns_error}")
        if spec.serves_for:
            serve(ctx, spec.tf_config or {}, spec.serves_for,
                  lambda: channel.send(protocol.STARTED), lambda e: end_raised(channel, e))
        for install in (install_strategy_hook, watch_coordinator, watch_restores,
                        watch_datasets):
            install(ctx)
        if spec.ledger and progress_map is not None:
            start_ledger(ctx, progress_map, spec.ledger, channel.send)
        fn, args, kwargs = load_call(spec.payload)
        channel.send(protocol.STARTED)
        value = fn(*args, **(kwargs or {}))
        flush_output()
        try:
            payload = serialize.dumps(value)
        except Exception as e:
            raise TypeError(f"fn returned a value that cannot be sent to the parent "
                            f"({type(value).__name__}): {e}") from e
        if spec.replicas_path:
            send_replicas(ctx, spec.replicas_path, channel.send)
        channel.send(protocol.RETURNED, data=payload)
        code = 0
        if spec.exit_on_return:
            end_as_script()
    except (SystemExit, KeyboardInterrupt):
        flush_output()
        raise  # exiting without returning or raising: the parent calls it a crash
    except BaseException as e:
        end_raised(channel, e)
    channel.wait_release()
    flush_output()
    os._exit(code)
