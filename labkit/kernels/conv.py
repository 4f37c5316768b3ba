"""Launchers for conv.cu: fused Conv2d + ReLU (stride 1, zero padding), forward and backward, NCHW float32."""

from __future__ import annotations

import numpy as np

from ..device import array_module
from ._launch import output, require, resolve
from .layers import THREADS, grid_for
from .loader import load_file


def _shapes(x, w, pad: int):
    N, C, H, W = x.shape
    K, Cw, R, S = w.shape
    if Cw != C:
        raise ValueError(f"w has {Cw} input channels but x has {C}: w must be (K, {C}, R, S)")
    if pad < 0:
        raise ValueError(f"pad must be >= 0, got {pad}")
    OH, OW = H + 2 * pad - R + 1, W + 2 * pad - S + 1
    if OH < 1 or OW < 1:
        raise ValueError(f"a {R}x{S} filter with pad {pad} does not fit a {H}x{W} input")
    return N, C, H, W, K, R, S, OH, OW


def conv2d_relu_forward(x, w, b, out=None, *, pad: int = 0, backend: str | None = None):
    """relu(conv2d(x, w) + b): x (N, C, H, W), w (K, C, R, S), b (K,) -> (N, K, OH, OW)."""
    which = resolve(backend)
    require(x, "x", ndim=4, which=which)
    require(w, "w", ndim=4, which=which)
    N, C, H, W, K, R, S, OH, OW = _shapes(x, w, pad)
    require(b, "b", shape=(K,), which=which)
    out = output(out, "out", (N, K, OH, OW), which)
    k = load_file("conv", backend=which).get_function("conv2d_relu_forward")
    k((grid_for(out.size),), (THREADS,), (x, w, b, out, *map(np.int32, (N, C, H, W, K, R, S, pad))))
    return out


def conv2d_relu_backward(dy, y, x, w, *, pad: int = 0, backend: str | None = None):
    """(dx, dw, db) from dy, the gradient at the output y = conv2d_relu_forward(x, w, b, pad=pad)."""
    which = resolve(backend)
    require(x, "x", ndim=4, which=which)
    require(w, "w", ndim=4, which=which)
    N, C, H, W, K, R, S, OH, OW = _shapes(x, w, pad)
    require(y, "y", shape=(N, K, OH, OW), which=which)
    require(dy, "dy", shape=(N, K, OH, OW), which=which)
    mod = load_file("conv", backend=which)
    dims = tuple(map(np.int32, (N, C, H, W, K, R, S, pad)))
    dx = output(None, "dx", x.shape, which)
    dw = output(None, "dw", w.shape, which)
    db = output(None, "db", (K,), which)
    mod.get_function("conv2d_relu_backward_input")((grid_for(dx.size),), (THREADS,), (dy, y, w, dx, *dims))
    mod.get_function("conv2d_relu_backward_weight")((dw.size,), (THREADS,), (dy, y, x, dw, *dims))
    mod.get_function("conv2d_relu_backward_bias")((K,), (THREADS,), (dy, y, db, *map(np.int32, (N, K, OH, OW))))
    return dx, dw, db


def im2col_conv2d_relu(x, w, b, *, pad: int = 0):
    """relu(conv2d(x, w) + b) as libraries without a direct convolution do it: unfold the input into columns
    (im2col, C*R*S rows) and make one matrix product, BLAS through NumPy or cuBLAS through CuPy (by x's array
    type). Same shapes and result as :func:`conv2d_relu_forward`; for comparing the fused kernel with a library."""
    xp = array_module(x)
    N, C, H, W, K, R, S, OH, OW = _shapes(x, w, pad)
    xpad = xp.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    cols = xp.empty((C, R, S, N, OH, OW), dtype=x.dtype)
    for r in range(R):
        for s in range(S):
            cols[:, r, s] = xpad[:, :, r:r + OH, s:s + OW].transpose(1, 0, 2, 3)
    z = w.reshape(K, C * R * S) @ cols.reshape(C * R * S, N * OH * OW)   # (K, N*OH*OW)
    z += b[:, None]
    xp.maximum(z, 0, out=z)
    return xp.ascontiguousarray(z.reshape(K, N, OH, OW).transpose(1, 0, 2, 3))


def library_convolutions(backend: str | None = None) -> dict:
    """The library Conv2d+ReLU forwards to time the fused kernel against, by name: im2col + matmul always, and
    PyTorch's (cuDNN) on a GPU where PyTorch with CUDA is installed. Each takes (x, w, b, pad=) like the kernel."""
    which = resolve(backend)
    found = {"im2col + cuBLAS" if which == "cupy" else "im2col + BLAS (NumPy)": im2col_conv2d_relu}
    if which == "cupy":
        try:
            import torch
            import torch.nn.functional as F

            if torch.cuda.is_available():
                import cupy

                def cudnn(x, w, b, *, pad=0):
                    xt, wt, bt = (torch.from_dlpack(a) for a in (x, w, b))  # no copies: the same device memory
                    return cupy.from_dlpack(F.relu(F.conv2d(xt, wt, bt, padding=pad)))

                found["PyTorch conv2d (cuDNN)"] = cudnn
        except ImportError:
            pass
    return found
