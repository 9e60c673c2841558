"""How a run's workers are networked (``--mwms-network``), chosen by one
function, :func:`choose_network`, before any process starts.

- ``namespace``: a network namespace per cluster (:class:`Namespace`), or
  one per worker on a bridge (:class:`Switch`) for network faults;
- ``proxy``: the TCP proxy between workers, for ``Latency`` and
  ``ResetPeers``, run as its own process in the bridge's namespace.

A fault that lists a worker by a host name (``UnresolvedHost``) gets a
cluster namespace with an ``/etc/hosts`` of its own, in which the name
resolves when the fault says (:meth:`RunNetwork.new_attempt`).

It may import :mod:`harness.core`, :mod:`harness.errors` and
:mod:`harness.faults`; nothing here imports TensorFlow.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator, List, Optional, Sequence, Tuple

from harness import validators
from harness.core import tfconfig
from harness.errors import SettingError
from harness.faults import Fault
from harness.plan import in_attempt, needs_host_names, needs_network
from harness.diagnosis.rules_links import SHARED_NETWORK
from harness.network.namespace import (Namespace, Switch, available, names_available, needs_proxy,
                                       switch_available)

NETWORK_MODES = validators.NETWORK_MODES


def isolation(mode: str) -> Tuple[bool, str]:
    """``(isolated?, why not)`` for a ``--mwms-network`` value on this machine."""
    if mode == "host":
        return False, "--mwms-network=host"
    return available()


def check_mode(mode: str, where: str) -> None:
    """A SettingError when ``mode`` asks for isolation this machine cannot give."""
    if mode in ("isolated", "switched"):
        ok, why = available() if mode == "isolated" else switch_available()
        if not ok:
            raise SettingError(f"{where}: {mode!r}: this machine cannot give "
                               f"{'a cluster' if mode == 'isolated' else 'each worker'} a "
                               f"network namespace of its own ({why}); use auto or host")


def header(mode: str) -> str:
    """Where this session's clusters run, for pytest's header."""
    isolated, why = isolation(mode)
    if isolated and mode == "switched":
        return "network switched (a network namespace per worker, on a bridge)"
    if isolated:
        return "network isolated (a network namespace per cluster)"
    return f"network host loopback ({why})"


class RunNetwork:
    """The network of one run, as the controller uses it: the same calls
    whether the workers are on the host, in one namespace, or each in its
    own on a switch."""

    def __init__(self, namespace=None, plan: Sequence[Fault] = (),
                 ports: Sequence[int] = ()) -> None:
        self.namespace = namespace   # None, a Namespace or a Switch
        self.switch: Optional[Switch] = namespace if isinstance(namespace, Switch) else None
        self.plan = tuple(plan)      # for the host names its faults list
        self.ports = tuple(ports)    # each worker's own port
        self.attempt = 0             # the attempt new_attempt last began

    def hosts(self, placed: Optional[Tuple[str, ...]]) -> Optional[Sequence[str]]:
        """The workers' addresses in ``TF_CONFIG``: the switch's, or where
        the launcher placed them."""
        return self.switch.hosts if self.switch is not None else placed

    def new_attempt(self, attempt: int, configs: List[Optional[dict]]) -> List[Optional[dict]]:
        """Attempt ``attempt`` begins: every link up and unthrottled again,
        every host name of the plan unresolved again; each worker's view of
        the cluster."""
        self.attempt = attempt
        if isinstance(self.namespace, Namespace) and self.namespace.names:
            self.namespace.forget()
        if self.switch is None:
            return configs
        self.switch.reset()
        return self.switch.route(configs)

    def workers_started(self) -> None:
        """The attempt's workers exist (its clock starts): each host name
        of its faults resolves when its fault says, counted from now."""
        if not (isinstance(self.namespace, Namespace) and self.namespace.names):
            return
        for fault in in_attempt(self.plan, self.attempt):
            for name, seconds in fault.host_names():
                if seconds is not None:
                    self.namespace.resolve(name, tfconfig.HOST, seconds)

    def logical(self, config: Optional[dict]) -> Optional[dict]:
        """A worker's ``TF_CONFIG`` with the proxy's addresses mapped back:
        the harness's plumbing must never read as a wrong port."""
        return self.switch.logical(config) if self.switch is not None else config

    def command(self, command: str, index: int) -> None:
        """A network fault's command, on worker ``index``'s link."""
        if self.switch is not None:
            self.switch.command(command, index)

    @property
    def has_links(self) -> bool:
        """Whether each worker has a link of its own to try (a switch)."""
        return self.switch is not None

    def probe_links(self) -> Tuple[List[list], str]:
        """Every link of the cluster tried now (:meth:`Switch.probe`), and
        why none were where the prober failed, or where the workers share a
        network (only workers with a namespace each have links of their own
        to try: :data:`~harness.diagnosis.rules_links.SHARED_NETWORK`)."""
        if self.switch is None:
            return [], SHARED_NETWORK
        try:
            return self.switch.probe(self.ports), ""
        except (OSError, ValueError) as e:
            return [], f"the links could not be tried: {e}"

    def worker_namespaces(self, n: int) -> Optional[tuple]:
        """Per worker, the (user, network) namespaces it joins (None: the host's)."""
        if self.switch is not None:
            return tuple(self.switch.paths(i) for i in range(n))
        if self.namespace is not None:
            return (self.namespace.paths,) * n
        return None


@dataclasses.dataclass(frozen=True)
class NetworkChoice:
    """What :func:`choose_network` decided: ``kind`` is ``host``, ``shared``
    (one namespace for the cluster) or ``switched`` (one per worker)."""

    kind: str
    proxied: bool = False
    plan: Tuple[Fault, ...] = ()   # with host names to resolve: an /etc/hosts of its own

    @contextlib.contextmanager
    def open(self, num_workers: int, ports: Sequence[int]) -> Iterator[RunNetwork]:
        """The run's network for as long as the run lasts; gone after."""
        if self.kind == "host":
            yield RunNetwork(ports=ports)
            return
        made = (Switch(num_workers, ports if self.proxied else None)
                if self.kind == "switched" else Namespace(names=needs_host_names(self.plan)))
        with made as namespace:
            yield RunNetwork(namespace, self.plan, ports)


def choose_network(mode: str, no_namespace: Optional[str],
                   plan: Sequence[Fault]) -> NetworkChoice:
    """How a run with fault ``plan`` is networked under ``mode``, or a
    SettingError; ``no_namespace`` is why the backend cannot have a
    namespace (None: it can)."""
    isolate, why = (False, no_namespace) if no_namespace else isolation(mode)
    if mode in ("isolated", "switched") and not isolate:
        raise SettingError(f"network={mode!r}: this machine cannot give a cluster a "
                           f"network namespace of its own ({why})")
    if needs_host_names(plan):
        return _named(isolate, why, plan)
    if not needs_network(plan) and mode != "switched":
        return NetworkChoice("shared" if isolate else "host")
    able, why = switch_available() if isolate else (False, why)
    if not able:
        raise SettingError(f"{'network faults need' if needs_network(plan) else 'network=switched needs'}"
                           f" a network namespace per worker, and this run has none ({why})")
    commands = [command for fault in plan for _, command in fault.network_commands()]
    return NetworkChoice("switched", needs_proxy(commands))


def _named(isolate: bool, why: str, plan: Sequence[Fault]) -> NetworkChoice:
    """A cluster namespace with an ``/etc/hosts`` of its own, for a plan
    that lists a worker by a host name, or a SettingError saying why not."""
    named = [f for f in plan if f.host_names()]
    if needs_network(plan):
        raise SettingError(f"{named[0]!r} cannot be combined with network faults (they give "
                           f"each worker a namespace of its own, without a hosts file)")
    able, why = names_available() if isolate else (False, why)
    if not able:
        raise SettingError(f"{named[0]!r} needs a network and mount namespace with an "
                           f"/etc/hosts of its own, and this run has none ({why})")
    return NetworkChoice("shared", plan=tuple(plan))
