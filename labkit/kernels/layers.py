"""Launchers for layers.cu: the two products the course offloaded, and the fused element-wise steps."""

from __future__ import annotations

import numpy as np

from ._launch import ceil_div, output, require, resolve
from .loader import load_file

ACTIVATIONS = {"identity": 0, "sigmoid": 1, "relu": 2}
THREADS = 256


def _act(activation: str) -> np.int32:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
    return np.int32(ACTIVATIONS[activation])


def grid_for(n: int) -> int:
    """Blocks for a grid-stride loop over n items: enough to fill a GPU, never more than needed."""
    return max(1, min(ceil_div(n, THREADS), 4096))


def wt_delta(W, delta, out=None, *, backend: str | None = None):
    """W^T delta for one sample: W (n_out, n_in), delta (n_out,) -> (n_in,)."""
    which = resolve(backend)
    require(W, "W", ndim=2, which=which)
    n_out, n_in = W.shape
    require(delta, "delta", shape=(n_out,), which=which)
    out = output(out, "out", (n_in,), which)
    k = load_file("layers", backend=which).get_function("wt_delta")
    k((ceil_div(n_in, THREADS),), (THREADS,), (W, delta, out, np.int32(n_out), np.int32(n_in)))
    return out


def outer(delta, a, out=None, *, beta: float = 0.0, backend: str | None = None):
    """beta * out + delta a^T: delta (n_out,), a (n_in,) -> (n_out, n_in). beta=1 accumulates into out."""
    which = resolve(backend)
    require(delta, "delta", ndim=1, which=which)
    require(a, "a", ndim=1, which=which)
    if beta != 0.0 and out is None:
        raise ValueError("beta != 0 adds to out, so out must be given")
    out = output(out, "out", (delta.shape[0], a.shape[0]), which)
    k = load_file("layers", backend=which).get_function("outer")
    k((ceil_div(a.shape[0], 16), ceil_div(delta.shape[0], 16)), (16, 16),
      (delta, a, out, np.int32(delta.shape[0]), np.int32(a.shape[0]), np.float32(beta)))
    return out


def bias_act_forward(z, bias, out=None, *, activation: str = "sigmoid", backend: str | None = None):
    """act(z + bias) with bias broadcast over rows: z (rows, cols), bias (cols,). out may be z (in place)."""
    which = resolve(backend)
    require(z, "z", ndim=2, which=which)
    rows, cols = z.shape
    require(bias, "bias", shape=(cols,), which=which)
    act = _act(activation)
    out = output(out, "out", (rows, cols), which)
    k = load_file("layers", backend=which).get_function("bias_act_forward")
    k((grid_for(z.size),), (THREADS,), (z, bias, out, np.int32(rows), np.int32(cols), act))
    return out


def act_backward(grad_out, a, out=None, *, activation: str = "sigmoid", backend: str | None = None):
    """grad_out * act'(a), with a the activation's output; any shape. out may be grad_out (in place)."""
    which = resolve(backend)
    require(grad_out, "grad_out", which=which)
    require(a, "a", shape=grad_out.shape, which=which)
    act = _act(activation)
    out = output(out, "out", grad_out.shape, which)
    k = load_file("layers", backend=which).get_function("act_backward")
    k((grid_for(a.size),), (THREADS,), (grad_out, a, out, np.int32(a.size), act))
    return out


def col_sum(x, out=None, *, backend: str | None = None):
    """Column sums of x (rows, cols) -> (cols,): the bias gradient from a batch of deltas."""
    which = resolve(backend)
    require(x, "x", ndim=2, which=which)
    rows, cols = x.shape
    out = output(out, "out", (cols,), which)
    k = load_file("layers", backend=which).get_function("col_sum")
    k((ceil_div(cols, THREADS),), (THREADS,), (x, out, np.int32(rows), np.int32(cols)))
    return out
