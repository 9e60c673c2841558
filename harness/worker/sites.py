"""Worker side: the line of the user's code that led to a call, found by
walking the Python frames: the first frame outside Python's own library,
installed packages and the harness (:data:`~harness.core.user_code.HARNESS_USER_CODE`
aside)."""
from __future__ import annotations

import os
import sys
import sysconfig
import threading
from typing import Callable, Iterable, Optional, Tuple

from harness.core.user_code import HARNESS_USER_CODE

_HARNESS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_HARNESS_USER_CODE = tuple(os.path.join(_HARNESS_DIR, *part.split("/"))
                           for part in HARNESS_USER_CODE)
_LIBRARY_DIRS = tuple(sorted({os.path.join(os.path.realpath(p), "") for p in (
    sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    if p}))
_PACKAGES = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


def is_library_file(path: str, library_dirs: Iterable[str] = _LIBRARY_DIRS,
                    harness_dir: str = _HARNESS_DIR,
                    harness_user_code: Iterable[str] = _HARNESS_USER_CODE) -> bool:
    """Not the user's code: Python's own library and installed packages
    (TensorFlow, Keras, tf_keras), the harness, code with no file
    (``<frozen ...>``, ``<string>``)."""
    if not path or path.startswith("<"):
        return True
    if any(p in path for p in _PACKAGES) or path.startswith(tuple(library_dirs)):
        return True
    return path.startswith(harness_dir) and not path.startswith(tuple(harness_user_code))


Frame = Tuple[str, int, str]   # (file, line, function)


def first_user_frame(frames: Iterable[Frame],
                     library: Callable[[str], bool] = is_library_file) -> Optional[Frame]:
    """The innermost of ``frames`` (innermost first) in the user's code."""
    return next((f for f in frames if not library(f[0])), None)


def site_text(frame: Frame, source: str = "") -> str:
    """``train.py:57 in train: ckpt.save(path)`` (without the source when
    there is none)."""
    file, line, function = frame
    where = f"{os.path.basename(file)}:{line} in {function}"
    return f"{where}: {source.strip()}" if source.strip() else where


def _frames(frame) -> Iterable[Frame]:
    while frame is not None:
        code = frame.f_code
        yield code.co_filename, frame.f_lineno, code.co_name
        frame = frame.f_back


class LibraryFiles(dict):
    """``is_library_file`` of each file name, worked out once."""

    def __missing__(self, path: str) -> bool:
        self[path] = found = is_library_file(path)
        return found


def user_site(library: Callable[[str], bool]) -> Optional[Frame]:
    """The frame of the user's code that led here, innermost first, in this
    thread or, where this one has none (TensorFlow runs an eager all-reduce
    in a pool thread while the caller waits), the main thread or another."""
    found = first_user_frame(_frames(sys._getframe(1)), library)
    if found is not None:
        return found
    # The dict holds this very frame, which holds the dict: left to the
    # cyclic collector, that cycle would keep every other thread's locals
    # alive (TensorFlow's ThreadPool among them) and run their finalizers
    # later in whatever thread the collector happens to run, where a pool's
    # finalizer can deadlock. Deleting the name breaks the cycle now.
    frames = sys._current_frames()
    try:
        main = threading.main_thread().ident
        me = threading.get_ident()
        for ident in sorted(frames, key=lambda i: i != main):
            if ident != me:
                found = first_user_frame(_frames(frames[ident]), library)
                if found is not None:
                    return found
        return None
    finally:
        del frames
