"""The interface between the controller and a backend: :class:`Launcher`
starts a run's workers and gives one :class:`WorkerHandle` per worker.

The controller sees nothing else of a backend: where the workers will
listen (:meth:`Launcher.place`), starting them from their specs, and per
worker its channel, its exit status, a signal, and a kill of everything it
started.  :mod:`harness.launch.local` and :mod:`harness.launch.ray` each
implement both.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Callable, ContextManager, Optional, Protocol, Sequence, Tuple

from harness.core.protocol import WorkerSpec
from harness.launch.ports import reserve_ports

if TYPE_CHECKING:
    from multiprocess import connection

    from harness.settings import RunSettings


class WorkerHandle(Protocol):
    """One running worker, as the controller drives it."""

    index: int
    conn: connection.Connection   # the parent's end of the worker's duplex channel

    @property
    def sentinel(self) -> int:
        """Ready for ``multiprocess.connection.wait`` once the worker exited."""

    @property
    def exitcode(self) -> Optional[int]:
        """The exit status (negative: the signal), None while it runs."""

    def join(self, timeout: Optional[float] = None) -> None: ...

    def send_signal(self, sig: int) -> bool:
        """Signal the worker; False when it is gone."""

    def is_stopped(self) -> bool:
        """True while the worker is stopped by SIGSTOP (it cannot dump a stack)."""

    def descendants(self) -> list:
        """What the worker started, listed now, for :meth:`kill_tree` later."""

    def kill_tree(self, known: Sequence = ()) -> None:
        """SIGKILL the worker with all it started."""

    def memory_bytes(self) -> Optional[int]:
        """The worker's memory now (its resident set, in bytes), read from
        this machine at no cost to the worker; None where the backend cannot
        read it from here (see :mod:`harness.launch.memory`)."""

    def close(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a run's workers will be: worker ``i`` listens on ``ports[i]``
    at ``hosts[i]`` (None: the local loopback, :data:`harness.core.tfconfig.HOST`);
    ``spare`` is a port nobody listens on (for ``BadTFConfig``)."""

    ports: Tuple[int, ...]
    spare: int
    hosts: Optional[Tuple[str, ...]] = None


class Launcher:
    """What the controller asks of a backend.

    A run asks :meth:`place` for its workers' addresses once (every attempt
    of a restarted run uses them), then :meth:`start` for each attempt's
    processes.  ``start_method`` is the local start method the workers are
    made with (None where the backend does not say)."""

    start_method: Optional[str] = None

    def place(self, num_workers: int,
              state_dir: Optional[str] = None) -> ContextManager[Placement]:
        """A context manager giving a :class:`Placement`: ports reserved on
        this machine (see :func:`harness.launch.ports.reserve_ports`) until it exits."""
        return local_placement(num_workers, state_dir)

    def start(self, specs: Sequence[WorkerSpec]) -> Sequence[WorkerHandle]:
        raise NotImplementedError

    def prewarm(self) -> None:
        """Start any slow shared machinery now (optional)."""


@contextlib.contextmanager
def local_placement(num_workers: int, state_dir: Optional[str]):
    """Ports for ``num_workers`` workers and a spare one, on this machine."""
    with reserve_ports(num_workers + 1, state_dir=state_dir) as reservation:
        yield Placement(tuple(reservation.ports[:num_workers]), reservation.ports[num_workers])


@dataclasses.dataclass(frozen=True)
class Backend:
    """One row of :data:`harness.launch.backends.BACKENDS`: what the rest of
    the harness may know of a backend, each a small function of the run's
    settings (a :class:`~harness.settings.RunSettings`)."""

    name: str
    launcher: Callable[[RunSettings], Launcher]
    # A SettingError when the backend cannot serve these settings here; the
    # second argument names where the backend was chosen, for the message.
    check: Callable[[RunSettings, str], None]
    # Why the backend's workers cannot have a network namespace of the
    # harness's (None: they can).
    no_network_namespace: Optional[str]
    # Where this session's clusters run, for pytest's header (None: the
    # network decides the line).
    where: Callable[[RunSettings], Optional[str]]
    # Started while pytest collects, so the first run does not wait for it.
    prewarm: Callable[[RunSettings], None]
    # Ends what the session started (called once, as pytest ends).
    close_session: Callable[[], None]
