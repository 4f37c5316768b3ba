"""Launcher for optim.cu: the SGD-with-momentum update of labkit.mlp.SGD, in place on the device."""

from __future__ import annotations

import numpy as np

from ._launch import require, resolve
from .layers import THREADS, grid_for
from .loader import load_file


def sgd_momentum(w, g, v, *, lr: float, momentum: float = 0.0, l2: float = 0.0, backend: str | None = None):
    """v = momentum v - lr (g + l2 w); w += v. Updates w and v in place and returns w."""
    which = resolve(backend)
    require(w, "w", which=which, writeable=True)
    require(g, "g", shape=w.shape, which=which)
    require(v, "v", shape=w.shape, which=which, writeable=True)
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr}")
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum must be in [0, 1), got {momentum}")
    k = load_file("optim", backend=which).get_function("sgd_momentum")
    k((grid_for(w.size),), (THREADS,), (w, g, v, np.int32(w.size), np.float32(lr), np.float32(momentum), np.float32(l2)))
    return w
