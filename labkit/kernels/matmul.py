"""Launchers for matmul.cu: C = op(A) op(B) with the naive, tiled or register-blocked kernel."""

from __future__ import annotations

import numpy as np

from ._launch import ceil_div, output, require, resolve
from .loader import load_file

VARIANTS = ("naive", "tiled", "regblock")
TILE = 16          # matmul_tiled's tile (matmul.cu's default)
BM = BN = 128      # matmul_regblock's block tile


def library_gflops(xp=np, repeat: int = 5, min_seconds: float = 2e-3, max_n: int = 16384) -> tuple[float, int]:
    """The library's float32 matmul rate (``xp.matmul``: BLAS or cuBLAS) in GFLOP/s and the size n it was timed at.

    n doubles from 256 until one n x n x n product takes ``min_seconds``, so the rate is not one call of a few
    microseconds dominated by its start-up (and a clock's resolution): the roofline's compute ceiling. The rate is
    the fastest call's: a ceiling is what the device can reach, and a busy neighbour only slows some calls down.
    """
    from ._launch import time_kernel

    n = 256
    while True:
        a = xp.ones((n, n), dtype=np.float32)
        c = xp.empty_like(a)
        seconds = time_kernel(lambda a=a, c=c: xp.matmul(a, a, out=c), repeat, best=True)
        if seconds >= min_seconds or 2 * n > max_n:
            return 2 * n**3 / seconds / 1e9, n
        n *= 2


def matmul(a, b, out=None, *, variant: str = "regblock", trans_a: bool = False, trans_b: bool = False,
           backend: str | None = None):
    """op(a) @ op(b) in float32: a (M, K) or, with trans_a, (K, M); b (K, N) or, with trans_b, (N, K)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    which = resolve(backend)
    require(a, "a", ndim=2, which=which)
    require(b, "b", ndim=2, which=which)
    M, K = (a.shape[1], a.shape[0]) if trans_a else a.shape
    Kb, N = (b.shape[1], b.shape[0]) if trans_b else b.shape
    if K != Kb:
        raise ValueError(f"inner dimensions differ: op(a) is {(M, K)} and op(b) is {(Kb, N)}")
    out = output(out, "out", (M, N), which)
    kernel = load_file("matmul", backend=which).get_function(f"matmul_{variant}")
    if variant == "regblock":
        grid, block = (ceil_div(N, BN), ceil_div(M, BM)), (256,)
    else:
        grid, block = (ceil_div(N, TILE), ceil_div(M, TILE)), (TILE, TILE)
    kernel(grid, block, (a, b, out, np.int32(M), np.int32(N), np.int32(K), np.int32(trans_a), np.int32(trans_b)))
    return out
