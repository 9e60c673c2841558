"""The backend table (``--mwms-backend``): the one place that names a backend.

Everything else asks :func:`backend_of` for the row of a run's settings
and calls its functions; see :class:`~harness.launch.base.Backend`.
"""
from __future__ import annotations

from typing import Dict

from harness import validators
from harness.launch import local
from harness.launch.ray import launcher as ray
from harness.launch.base import Backend, Launcher

BACKENDS: Dict[str, Backend] = {row.name: row for row in (local.BACKEND, ray.BACKEND)}
BACKEND_NAMES = validators.BACKEND_NAMES
DEFAULT_BACKEND = validators.DEFAULT_BACKEND


def backend_of(settings) -> Backend:
    """The row of ``settings.backend``."""
    return BACKENDS[settings.backend]


def launcher_for(settings) -> Launcher:
    """The launcher of ``settings.backend``."""
    return backend_of(settings).launcher(settings)


def close_sessions() -> None:
    """End what any backend started for this process's session."""
    for row in BACKENDS.values():
        row.close_session()
