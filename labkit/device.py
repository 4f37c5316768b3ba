"""Array back ends: NumPy everywhere, CuPy when a CUDA device really works.

``LABKIT_DEVICE=cpu`` forces NumPy; ``LABKIT_DEVICE=gpu`` demands CuPy and fails loudly without it.
CuPy is imported only when asked for, so ``import labkit`` never needs a GPU.

Lab 04 (offloading backprop's products to a device) finds here the references of its exercises (:func:`backward`,
:func:`offload_time`, :func:`offload_crossover`) and its measurements: one offloaded product's copy and kernel
times per width (:func:`offload_tables`), the costs fitted to them (:func:`fit_offload_costs`), the per-sample sweep
(:func:`offload_sweep`) and one batch four ways (:func:`batch_step_times`).
"""

from __future__ import annotations

import functools
from types import ModuleType

import numpy as np

from . import settings


def array_module(*arrays) -> ModuleType:
    """The array module (numpy or cupy) that the given arrays live on."""
    for a in arrays:
        if type(a).__module__.startswith("cupy"):
            import cupy

            return cupy
    return np


@functools.cache
def gpu_status() -> tuple[bool, str]:
    """(usable, reason): whether CuPy imports and a kernel really runs on a CUDA device."""
    try:
        import cupy
    except ImportError:
        return False, "CuPy is not installed (pip install -e '.[gpu]')"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
        if n == 0:
            return False, "CuPy is installed but no CUDA device is visible"
        x = cupy.arange(4, dtype=cupy.float32)
        ok = float((x * 2).sum()) == 12.0  # a real kernel launch and copy back
        name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        return (ok, name if ok else f"{name}: a test kernel gave a wrong result")
    except Exception as e:  # CUDARuntimeError and friends, without importing their classes
        return False, f"CuPy is installed but CUDA does not work: {type(e).__name__}: {e}"


def get_xp(device: str | None = None) -> ModuleType:
    """The array module for ``device`` ("cpu", "gpu" or None: $LABKIT_DEVICE, else GPU if usable)."""
    device = (device or settings.device()).lower()
    if device == "cpu":
        return np
    ok, why = gpu_status()
    if device in ("gpu", "cuda"):
        if not ok:
            raise RuntimeError(f"LABKIT_DEVICE={device} but no GPU can be used: {why}")
        import cupy

        return cupy
    if device != "auto":
        raise ValueError(f"unknown device {device!r}; use 'cpu', 'gpu' or 'auto'")
    if ok:
        import cupy

        return cupy
    return np


def to_numpy(a) -> np.ndarray:
    """A NumPy copy (or view) of a NumPy or CuPy array."""
    if type(a).__module__.startswith("cupy"):
        return a.get()
    return np.asarray(a)
