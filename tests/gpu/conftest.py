"""What the GPU tests share: whether this machine has a GPU TensorFlow can
use (every test here skips with the reason where it has none), and a
cluster that puts each worker on a GPU.

Run them with ``pytest -m gpu tests/gpu`` (docs/gpu.md).  The tests choose
their devices themselves: one GPU per worker where there are enough
(``--mwms-devices=gpu``), else every worker on the first GPU
(``gpu-shared``) with memory growth on.  Workers start under spawn unless
``--mwms-start-method`` says otherwise.
"""
import functools
from typing import List, Optional

import pytest

from harness.launch.devices import tensorflow_gpus, visible_gpus


@functools.lru_cache(maxsize=None)
def gpu_unavailable() -> Optional[str]:
    """Why the GPU tests cannot run here, or None when TensorFlow sees a GPU."""
    visible = visible_gpus()
    if not visible:
        return ("no GPU visible: CUDA_VISIBLE_DEVICES is empty or -1, or nvidia-smi is "
                "missing or lists none")
    found, version = tensorflow_gpus(visible)
    if found is None:
        return version
    if found == 0:
        return (f"{len(visible)} GPU(s) visible, but TensorFlow {version} sees none: install "
                f"the CUDA build of your TensorFlow (pip install 'tensorflow[and-cuda]=={version}')")
    return None


@pytest.fixture(autouse=True)
def _needs_a_gpu():
    reason = gpu_unavailable()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def gpus() -> List[str]:
    """The GPU ids this session may hand out."""
    return visible_gpus()


@pytest.fixture
def gpu_cluster(request, mwms_cluster, monkeypatch, gpus):
    """``gpu_cluster(workers=2, share=None)``: a Cluster whose workers compute
    on GPUs, one each (the first GPUs).  ``share=None`` puts every worker
    on the first GPU only where there are fewer GPUs than workers;
    ``share=True`` does whatever the machine has."""
    from harness.controller import Cluster

    start_method = request.config.getoption("mwms_start_method") or "spawn"

    def make(workers: int = 2, share: Optional[bool] = None) -> Cluster:
        shared = len(gpus) < workers if share is None else share
        # One GPU per worker (the first ones), or the first GPU for all.
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES",
                           gpus[0] if shared else ",".join(gpus[:workers]))
        return Cluster(mwms_cluster.settings.with_overrides(
            workers=workers, devices="gpu-shared" if shared else "gpu",
            start_method=start_method))
    return make
