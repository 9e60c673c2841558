"""Which TensorFlow is installed, read from its metadata (no import), and
what follows from it: the range the harness supports, the Keras that
``tf.keras`` is, and how to get Keras 2 beside it.

TensorFlow 2.15's ``tf.keras`` is Keras 2 (the ``keras`` 2.15 package it
depends on); from 2.16 it is Keras 3, unless ``TF_USE_LEGACY_KERAS=1`` and
tf_keras of the same minor are installed (tf_keras 2.N requires TensorFlow
2.N, so installing another minor's would change the user's TensorFlow).
tf_keras 2.15 exists, but TensorFlow 2.15's autograph converts its code
(only ``keras`` is on that version's do-not-convert list): a 10-step
``fit`` took 22.8 s against 1.2 s through ``tf.keras`` (measured, 2.15.1).
So on 2.15 Keras 2 is plain ``tf.keras``.
"""
from __future__ import annotations

import re
from importlib import metadata
from typing import Optional, Tuple

Minor = Tuple[int, int]

OLDEST: Minor = (2, 15)
NEWEST: Minor = (2, 21)
FIRST_KERAS_3: Minor = (2, 16)


def minor_of(version: str) -> Minor:
    """``"2.15.1"`` -> ``(2, 15)``; also ``"2.16.0rc0"`` and ``"2.21"``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if not match:
        raise ValueError(f"not a TensorFlow version: {version!r}")
    return int(match.group(1)), int(match.group(2))


def installed_tensorflow() -> Optional[str]:
    """The installed TensorFlow's version (any of its distributions), or None."""
    for name in ("tensorflow", "tensorflow-cpu", "tensorflow-intel", "tf-nightly"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def supported(minor: Minor) -> bool:
    return OLDEST <= minor <= NEWEST


def keras2_requirement(version: str) -> str:
    """What gives Keras 2 beside TensorFlow ``version``: the ``keras`` 2.15
    it already has on 2.15, tf_keras of the same minor from 2.16."""
    major, minor = minor_of(version)
    return f"{keras2_package((major, minor))}~={major}.{minor}.0"


def keras2_env(minor: Minor) -> dict:
    """The environment that makes ``tf.keras`` Keras 2 on ``minor``."""
    return {"TF_USE_LEGACY_KERAS": "1"} if minor >= FIRST_KERAS_3 else {}


def keras2_package(minor: Minor) -> str:
    """The package Keras 2's classes come from on ``minor``."""
    return "tf_keras" if minor >= FIRST_KERAS_3 else "keras"


def keras_of(minor: Minor, legacy: bool) -> str:
    """Which Keras ``tf.keras`` is on TensorFlow ``minor``: ``"keras2"`` or
    ``"keras3"``; ``legacy`` is ``TF_USE_LEGACY_KERAS=1`` (with tf_keras)."""
    return "keras2" if minor < FIRST_KERAS_3 or legacy else "keras3"


def installed_minor() -> Minor:
    """The installed TensorFlow's minor; the newest supported when none is."""
    version = installed_tensorflow()
    return minor_of(version) if version else NEWEST


def range_text() -> str:
    return f"tensorflow>={OLDEST[0]}.{OLDEST[1]},<{NEWEST[0]}.{NEWEST[1] + 1}"
