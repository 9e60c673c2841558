"""The recorder's two settings, one validator each; an error names the
argument and the bad value."""
from __future__ import annotations

import math
import os
from typing import Optional

from harness.errors import SettingError


def check_dir(value, where: str = "dir") -> str:
    """``dir``: a directory path (made if missing); ``where`` names it in
    an error (``--dir`` from ``harness record``)."""
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise SettingError(f"{where}: a directory path is needed, got {value!r}")
    path = os.path.abspath(os.fspath(value))
    if os.path.exists(path) and not os.path.isdir(path):
        raise SettingError(f"{where}: {path} exists and is not a directory")
    return path


def check_timeout(value, where: str = "timeout") -> Optional[float]:
    """``timeout``: seconds without progress before a dump, 0 or None for never."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise SettingError(f"{where}: a number of seconds (0: never) is needed, "
                           f"got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(seconds) or seconds < 0:
        raise SettingError(f"{where}: a number of seconds, 0 or more, is needed, "
                           f"got {value!r}")
    return seconds
