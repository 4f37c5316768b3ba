"""Launchers for reduce.cu: whole-array sums finished with atomicAdd, returned as Python numbers."""

from __future__ import annotations

import numpy as np

from ._launch import array_module_for, ceil_div, require, resolve
from .loader import load_file

THREADS = 256      # reduce.cu's REDUCE_THREADS
MAX_BLOCKS = 1024  # each block folds a grid-stride share first, so few atomics reach the total


def reduce_blocks(n: int) -> int:
    """Blocks for the reductions' grid-stride loops over n items (each block adds its part with one atomicAdd)."""
    return max(1, min(ceil_div(n, THREADS), MAX_BLOCKS))


def sum_reduce(x, *, backend: str | None = None) -> float:
    """sum(x) over every element (float32 accumulation, as on the GPU)."""
    which = resolve(backend)
    require(x, "x", which=which)
    out = array_module_for(which).zeros(1, dtype=np.float32)
    kernel = load_file("reduce", backend=which).get_function("sum_reduce")
    kernel((reduce_blocks(x.size),), (THREADS,), (x, out, np.int32(x.size)))
    return float(out[0])


def sse_reduce(a, b, *, backend: str | None = None) -> float:
    """sum((a - b)^2): the squared error of outputs a against targets b (same shape)."""
    which = resolve(backend)
    require(a, "a", which=which)
    require(b, "b", shape=a.shape, which=which)
    out = array_module_for(which).zeros(1, dtype=np.float32)
    kernel = load_file("reduce", backend=which).get_function("sse_reduce")
    kernel((reduce_blocks(a.size),), (THREADS,), (a, b, out, np.int32(a.size)))
    return float(out[0])


def accuracy_count(scores, labels, *, backend: str | None = None) -> int:
    """How many rows of scores (rows, cols) have their arg-max at the label (labels int32, (rows,))."""
    which = resolve(backend)
    require(scores, "scores", ndim=2, which=which)
    rows, cols = scores.shape
    require(labels, "labels", shape=(rows,), dtype=np.int32, which=which)
    out = array_module_for(which).zeros(1, dtype=np.int32)
    load_file("reduce", backend=which).get_function("accuracy_count")(
        (reduce_blocks(rows),), (THREADS,), (scores, labels, out, np.int32(rows), np.int32(cols)))
    return int(out[0])
