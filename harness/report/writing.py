"""Report files written all or none: no TensorFlow."""
from __future__ import annotations

import contextlib
import os
from typing import Dict, List


def write_together(texts: Dict[str, str]) -> None:
    """Write each ``{path: text}``, all or none: every text under a
    temporary name beside its place, then each renamed there; a failure
    removes what was written (renamed ones included) and raises, leaving
    no partial or empty file."""
    for path in texts:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    written: List[str] = []
    try:
        for target, text in texts.items():
            partial = f"{target}.partial-{os.getpid()}"
            written.append(partial)
            with open(partial, "w", encoding="utf-8") as f:
                f.write(text)
        for target in texts:
            os.replace(f"{target}.partial-{os.getpid()}", target)
            written.append(target)
    except BaseException:
        for name in written:
            with contextlib.suppress(OSError):
                os.unlink(name)
        raise
