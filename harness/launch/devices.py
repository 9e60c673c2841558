"""Which devices each worker sees, told to it by its ``CUDA_VISIBLE_DEVICES``:
a table of small functions, one per ``--mwms-devices`` value.  CUDA is
never initialised here: the GPUs are listed by nvidia-smi, and whether
TensorFlow can use them is asked of a fresh interpreter
(:func:`tensorflow_gpus`).

``cpu``
    every GPU hidden;
``gpu``
    an equal share of the visible GPUs each, none shared;
``gpu-shared``
    every visible GPU for every worker, as TensorFlow's own test runner
    gives them (``share_gpu=True``): several workers on one GPU, which is
    how a one-GPU machine runs a cluster.  TensorFlow maps nearly all of a
    GPU's memory into the first process that uses it unless memory growth
    is on (``TF_FORCE_GPU_ALLOW_GROWTH=true`` in ``env``, or
    ``tf.config.experimental.set_memory_growth`` in the job).
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from harness import validators
from harness.errors import SettingError, hide_in_setup_errors

# pytest leaves this module's frames out of a setup error's traceback.
__tracebackhide__ = hide_in_setup_errors

HIDDEN = "-1"


def _none_visible(mode: str) -> SettingError:
    return SettingError("no GPU is visible (CUDA_VISIBLE_DEVICES is empty and nvidia-smi "
                        "lists none)")


def gpu_assignment(num_workers: int, visible: list[str]) -> list[str]:
    """Split the visible GPU ids among the workers: a ``CUDA_VISIBLE_DEVICES``
    value per worker.  Each worker gets ``len(visible) // num_workers`` GPUs;
    leftovers stay unused, so every replica is the same size (MWMS needs the
    same number of devices per worker)."""
    if not visible:
        raise _none_visible("gpu")
    per = len(visible) // num_workers
    if per == 0:
        raise SettingError(f"{num_workers} workers but only {len(visible)} GPU(s) visible; "
                           f"use at most {len(visible)} workers, or gpu-shared to share them")
    return [",".join(visible[i * per:(i + 1) * per]) for i in range(num_workers)]


def shared_assignment(num_workers: int, visible: list[str]) -> list[str]:
    """Every visible GPU for every worker."""
    if not visible:
        raise _none_visible("gpu-shared")
    return [",".join(visible)] * num_workers


# mode -> (workers, visible GPU ids) -> each worker's CUDA_VISIBLE_DEVICES
ASSIGNMENTS: Dict[str, Callable[[int, List[str]], List[str]]] = {
    "cpu": lambda num_workers, visible: [HIDDEN] * num_workers,
    "gpu": gpu_assignment,
    "gpu-shared": shared_assignment,
}
DEVICES = validators.DEVICES


def uses_gpus(devices: str) -> bool:
    return devices != "cpu"


def visible_gpus(env: Optional[Mapping[str, str]] = None) -> list[str]:
    """GPU ids the parent may hand out, without initialising CUDA here."""
    cvd = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return [g for g in (x.strip() for x in cvd.split(",")) if g and g != HIDDEN]
    import shutil
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20,
                             check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, _ in enumerate(ln for ln in out.splitlines() if ln.startswith("GPU "))]


_TF_GPUS = ("import tensorflow as tf; "
            "print(len(tf.config.list_physical_devices('GPU')), tf.__version__)")


def tensorflow_gpus(visible: List[str], timeout: float = 180) -> Tuple[Optional[int], str]:
    """How many of the ``visible`` GPUs TensorFlow finds, and its version,
    asked of a fresh interpreter so that CUDA stays uninitialised here;
    ``(None, why)`` when it could not say."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(visible), "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        done = subprocess.run([sys.executable, "-c", _TF_GPUS], env=env, capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, f"TensorFlow took over {timeout:g} s to list the GPUs"
    words = done.stdout.split()
    if done.returncode != 0 or len(words) != 2 or not words[0].isdigit():
        return None, f"TensorFlow could not list the GPUs: {done.stderr.strip()[-300:]}"
    return int(words[0]), words[1]


def device_assignment(num_workers: int, devices: str = "cpu",
                      env: Optional[dict] = None, option: str = "--mwms-devices") -> List[str]:
    """Each worker's ``CUDA_VISIBLE_DEVICES`` under ``devices``; a
    SettingError naming ``option`` (as the user set it) when the GPUs
    visible in ``env`` cannot serve it."""
    visible = visible_gpus(env) if uses_gpus(devices) else []
    try:
        return ASSIGNMENTS[devices](num_workers, visible)
    except SettingError as e:
        raise SettingError(f"{option}={devices}: {e}") from None


def worker_environments(num_workers: int, devices: str = "cpu",
                        base: Optional[dict] = None) -> List[dict]:
    """The environment of each of ``num_workers`` workers: ``base`` (the
    parent's environment by default) without ``TF_CONFIG``, and the
    worker's ``CUDA_VISIBLE_DEVICES`` under ``devices``."""
    base = dict(os.environ if base is None else base)
    base.pop("TF_CONFIG", None)
    return [{**base, "CUDA_VISIBLE_DEVICES": share}
            for share in device_assignment(num_workers, devices, base)]

