"""A process's memory on this machine, read from ``/proc`` by its pid: what
a backend's :meth:`~harness.launch.base.WorkerHandle.memory_bytes` answers
with when its worker runs here.

Two readings, each one small read of a file the kernel writes on demand:

- :func:`resident_bytes`: the resident set (RSS), from ``/proc/PID/statm``;
  the kernel keeps the count, so the read costs the same whatever the
  process maps: 22-40 µs on a TensorFlow 2.21 process that holds an MWMS
  strategy and a traced model (553 MiB resident, 832 mappings), measured.
- :func:`proportional_bytes`: the proportional set (PSS), from
  ``/proc/PID/smaps_rollup``, which counts a page shared with the
  forkserver or a peer as a share; the kernel walks every page of every
  mapping to sum it: 30 ms on the same process (about 1000 times RSS's),
  and in 2 of 4 tries some reads came back without their ``Pss`` line
  (Linux 6.18), measured.

The parent samples RSS (:data:`READERS`, ``"rss"``): it is what grows when a
worker keeps memory (a page a worker allocates and touches is its own under
both measures), what a cluster manager's limit counts, and its read is
cheap enough to take every 0.1 s of a run without taking time from the
workers on a small machine (PSS, read for 4 workers every 0.1 s, would
take more than a core).  The shared pages RSS also counts (the libraries
mapped from the forkserver) are a constant: they do not change a rate of
growth.
"""
from __future__ import annotations

import os
from typing import Callable, Dict, Optional

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes(pid: int) -> Optional[int]:
    """Process ``pid``'s resident set in bytes, None when it cannot be read
    (the process is gone, or not on this machine)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


def proportional_bytes(pid: int) -> Optional[int]:
    """Process ``pid``'s proportional set (PSS) in bytes, None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


READERS: Dict[str, Callable[[int], Optional[int]]] = {
    "rss": resident_bytes,
    "pss": proportional_bytes,
}
# What the handles of this machine's workers sample.
READ = READERS["rss"]
