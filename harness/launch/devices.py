"""Which devices each worker sees: every GPU hidden (``cpu``), or an equal
share of the visible GPUs (``gpu``), told to each worker by its
``CUDA_VISIBLE_DEVICES``.  Pure functions; CUDA is never initialised here."""
from __future__ import annotations

import os
from typing import List, Optional

from harness.errors import SettingError

DEVICES = ("cpu", "gpu")


def gpu_assignment(num_workers: int, visible: list[str]) -> list[str]:
    """Split the visible GPU ids among the workers: a ``CUDA_VISIBLE_DEVICES``
    value per worker.  Each worker gets ``len(visible) // num_workers`` GPUs;
    leftovers stay unused, so every replica is the same size (MWMS needs the
    same number of devices per worker)."""
    if not visible:
        raise SettingError("--mwms-devices=gpu: no GPU is visible "
                           "(CUDA_VISIBLE_DEVICES is empty and nvidia-smi lists none)")
    per = len(visible) // num_workers
    if per == 0:
        raise SettingError(f"--mwms-devices=gpu: {num_workers} workers but only "
                           f"{len(visible)} GPU(s) visible; use at most {len(visible)} workers")
    return [",".join(visible[i * per:(i + 1) * per]) for i in range(num_workers)]


def visible_gpus(env: Optional[dict] = None) -> list[str]:
    """GPU ids the parent may hand out, without initialising CUDA here."""
    env = os.environ if env is None else env
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return [g for g in (x.strip() for x in cvd.split(",")) if g and g != "-1"]
    import shutil
    import subprocess
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(l for l in out.splitlines() if l.startswith("GPU "))]


def worker_environments(num_workers: int, devices: str = "cpu",
                        base: Optional[dict] = None) -> List[dict]:
    """The environment of each of ``num_workers`` workers: ``base`` (the
    parent's environment by default) without ``TF_CONFIG``, and for ``cpu``
    every GPU hidden, for ``gpu`` an equal share of the visible GPUs."""
    base = dict(os.environ if base is None else base)
    base.pop("TF_CONFIG", None)
    if devices == "gpu":
        shares = gpu_assignment(num_workers, visible_gpus())
        return [{**base, "CUDA_VISIBLE_DEVICES": share} for share in shares]
    return [{**base, "CUDA_VISIBLE_DEVICES": "-1"} for _ in range(num_workers)]
