"""Parent side: a network namespace per cluster (``--mwms-network``).

TensorFlow's gRPC server listens on every interface whatever ``TF_CONFIG``
says, so a worker on the host's network is an unauthenticated TensorFlow
server for as long as a run lasts.  Isolated, a run's workers share a
network namespace of their own, holding only a loopback interface: they
reach each other on ``127.0.0.1`` as before, and nothing outside reaches
them (the host gets "connection refused" on those ports).

The namespace is made without privileges: ``unshare -Urn`` starts an
*anchor* process in a new user and network namespace, which brings ``lo``
up and then waits on its stdin.  Workers join both namespaces at the top
of their entry point (:func:`harness.linux.enter_namespaces`), while still
single-threaded, so the forkserver's warm start is kept.  The anchor holds
the namespace for the run; the run closes its stdin at the end, and if
pytest dies the pipe closes all the same: the anchor exits, and the
namespace goes with the last process in it (the workers die with their
parent).  Nothing named is created, so nothing can be left behind.

Where user namespaces are not allowed (some distributions restrict them;
containers often block ``unshare``), ``auto`` runs on the host's loopback
and says why once; ``isolated`` is then a usage error.
"""
from __future__ import annotations

import shutil
import subprocess
from typing import Optional, Tuple

# The anchor: bring lo up, say so, then hold the namespaces until stdin closes.
ANCHOR = "ip link set lo up && echo ready && exec cat >/dev/null"
START_WAIT = 5.0

_probed: Optional[Tuple[bool, str]] = None


class Namespace:
    """A user + network namespace held by an anchor process; a context manager."""

    def __init__(self) -> None:
        self.anchor = subprocess.Popen(["unshare", "-Urn", "sh", "-c", ANCHOR],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, close_fds=True)
        try:
            line = self.anchor.stdout.readline()
        except Exception:
            self.close()
            raise
        if line.strip() != b"ready":
            why = (self.anchor.stderr.read() or b"").decode(errors="replace").strip()
            self.close()
            raise OSError(why.splitlines()[-1] if why else "unshare -Urn did not start")

    @property
    def paths(self) -> Tuple[str, str]:
        """Where a worker joins: the anchor's user and network namespaces."""
        return (f"/proc/{self.anchor.pid}/ns/user", f"/proc/{self.anchor.pid}/ns/net")

    def close(self) -> None:
        """End the anchor: the namespace goes with the last process in it."""
        if self.anchor.poll() is None:
            try:
                self.anchor.stdin.close()
                self.anchor.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                self.anchor.kill()
                self.anchor.wait()
        for stream in (self.anchor.stdin, self.anchor.stdout, self.anchor.stderr):
            if stream is not None and not stream.closed:
                stream.close()

    def __enter__(self) -> "Namespace":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def available() -> Tuple[bool, str]:
    """Whether this machine lets this user make a network namespace per
    cluster, and why not; tried once per process."""
    global _probed
    if _probed is None:
        if not shutil.which("unshare") or not shutil.which("ip"):
            _probed = (False, "the unshare and ip commands are not installed")
        else:
            try:
                Namespace().close()
                _probed = (True, "")
            except OSError as e:
                _probed = (False, f"unshare -Urn failed: {e}")
    return _probed


def resolve(network: str) -> Tuple[bool, str]:
    """``(isolate?, why not)`` for a ``--mwms-network`` value."""
    if network == "host":
        return False, "--mwms-network=host"
    ok, why = available()
    return ok, why
