"""Worker side: whether the host names of ``TF_CONFIG``'s cluster resolve,
as this worker's own lookups see them.

TensorFlow's gRPC looks a peer's name up with ``getaddrinfo`` when it first
connects (TensorFlow 2.21, measured: "errors resolving HOST:PORT ...
os_error: Name or service not known syscall: getaddrinfo"), and a lookup
of the coordination leader's name that fails is retried in silence, so a
cluster whose chief's name does not resolve waits in strategy creation with
nothing in any log.  So when a worker makes its strategy, a thread of its
own looks up each name of the cluster (an IP address needs no lookup: an
ordinary run does none) and tells the parent which did not resolve
(``name_unresolved``, with the resolver's error) and, later, which then did
(``name_resolved``): what a start-up check of the user's would log, the
same for a harness fault and for a user's TF_CONFIG.
"""
from __future__ import annotations

import ipaddress
import socket
import threading
import time
from typing import Callable, List, Optional

from harness.core import protocol

# How often a name that did not resolve is looked up again.
RETRY_EVERY = 0.25


def named_addresses(tf_config: Optional[dict]) -> List[str]:
    """The ``HOST:PORT`` entries of the cluster whose host is a name, not an
    IP address, each once, in order."""
    try:
        cluster = (tf_config or {})["cluster"]
    except (TypeError, KeyError):
        return []
    out: List[str] = []
    for tasks in (cluster.values() if isinstance(cluster, dict) else ()):
        for address in (tasks if isinstance(tasks, list) else ()):
            host = host_of(address)
            if host and not _is_ip(host) and address not in out:
                out.append(address)
    return out


def host_of(address) -> str:
    """``HOST`` of ``HOST:PORT`` (brackets of an IPv6 literal removed)."""
    if not isinstance(address, str):
        return ""
    return address.rpartition(":")[0].strip("[]") if ":" in address else address


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def lookup_error(host: str) -> Optional[str]:
    """Why ``host`` does not resolve (the resolver's words), or None."""
    try:
        socket.getaddrinfo(host, None)
        return None
    except OSError as e:
        return getattr(e, "strerror", None) or str(e)


def watch(tf_config: Optional[dict], send: Callable,
          lookup: Callable[[str], Optional[str]] = lookup_error) -> Optional[threading.Thread]:
    """Start the thread that reports this cluster's names (None: it has
    none).  A name that fails is reported once, then looked up again every
    :data:`RETRY_EVERY` s until it resolves, which is reported too."""
    addresses = named_addresses(tf_config)
    if not addresses:
        return None

    def run() -> None:
        pending = list(addresses)
        reported = set()
        while pending:
            for address in list(pending):
                error = lookup(host_of(address))
                if error is None:
                    pending.remove(address)
                    if address in reported:
                        send(protocol.NAME_RESOLVED, data={"address": address})
                elif address not in reported:
                    reported.add(address)
                    send(protocol.NAME_UNRESOLVED, data={"address": address, "error": error})
            if pending:
                time.sleep(RETRY_EVERY)

    thread = threading.Thread(target=run, name="mwms-names", daemon=True)
    thread.start()
    return thread
