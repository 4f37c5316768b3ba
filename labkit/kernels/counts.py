"""Counting what a kernel reads: how many times each element of one input array is loaded from global memory.

    counts = loads(source, "matmul_naive", "A", grid, block, args)   # an array shaped like A: loads per element

The kernel runs on the CPU emulator (on any machine, GPU or not) with that one pointer parameter wrapped in a counter:
every subscript through it, in the kernel or in a macro the kernel uses, adds one to the element's count. A count is
what a GPU would fetch without caches, and it is exact, where the emulator's timings mean little: the naive matmul
reads each element of A N times, a tiled one N / TILE times.
"""

from __future__ import annotations

import re

import numpy as np

from .loader import Module, read_source
from .source import find_kernels, matching_bracket, strip_comments

COUNTER = "labkit_loads_"
NOT_WRITTEN = "YOUR CODE HERE"  # the stub of a kernel handed out (labkit.check.KERNEL_TODO)
_WRAPPER = (
    "template <class T> struct labkit_counted {"
    " const T* p; unsigned int* c; long long off;"
    " const T& operator[](long long i) const { atomicAdd(&c[off + i], 1u); return p[off + i]; }"
    " const T& operator*() const { return (*this)[0]; }"
    " labkit_counted operator+(long long i) const { return labkit_counted{p, c, off + i}; }"
    " };\n"
)


def counting_source(source: str, name: str, array: str) -> str:
    """``source`` with kernel ``name``'s pointer parameter ``array`` counted: the parameter is renamed, a counter
    array (``unsigned int*``) is added as the kernel's last parameter, and the body sees ``array`` as a counting
    wrapper of the same name."""
    text = strip_comments(source)
    decl = next((k for k in find_kernels(text) if k.name == name), None)
    if decl is None:
        raise KeyError(f"no kernel {name!r} in the source; it has {[k.name for k in find_kernels(text)]}")
    param = next((p for p in decl.params if p.name == array), None)
    if param is None or not param.pointer or not param.const:
        raise ValueError(f"kernel {name}: {array!r} must be one of its const pointer parameters (an input to count)")
    a, b = decl.params_span
    params = [re.sub(rf"\b{re.escape(array)}\s*$", f"{COUNTER}{array}", p.text) if p.name == array else p.text
              for p in decl.params]
    head = text[:a] + ", ".join(params) + f", unsigned int* {COUNTER}" + text[b:]
    body = head.find("{", a + len(", ".join(params)))
    matching_bracket(head, body, "{", "}")  # the body is whole
    wrap = f" const labkit_counted<{param.ctype}> {array}{{{COUNTER}{array}, {COUNTER}, 0}};"
    return _WRAPPER + head[:body + 1] + wrap + head[body + 1:]


def loads(source: str, name: str, array: str, grid, block, args, shared_mem: int = 0) -> np.ndarray:
    """Loads of each element of kernel ``name``'s input ``array`` in one launch (``args`` as for the kernel itself,
    NumPy arrays), counted on the emulator; an array of the input's shape. ``source``: CUDA C text, a .cu path or a
    labkit kernel file's name ("matmul")."""
    text, filename = read_source(source)
    decl = next((k for k in find_kernels(strip_comments(text)) if k.name == name), None)
    if decl is None:
        raise KeyError(f"no kernel {name!r} in {filename}")
    index = [p.name for p in decl.params].index(array) if array in [p.name for p in decl.params] else None
    if index is None:
        raise ValueError(f"kernel {name} has no parameter {array!r}")
    target = np.asarray(args[index])
    counts = np.zeros(target.size, np.uint32)
    module = Module(counting_source(text, name, array), filename, backend="emulator", checked=False, isolated=True)
    module.get_function(name)(grid, block, (*args, counts), shared_mem=shared_mem)
    return counts.reshape(target.shape)


def matmul_loads(source: str | None, variant: str, n: int = 64) -> tuple[float, str]:
    """(mean loads of each element of A, whose kernel) for an n x n x n product by ``variant`` ("naive" or "tiled"):
    your kernel from ``source`` (signature (A, B, C, M, N, K); the tiled one with its ``#define TILE``), or labkit's
    own where ``source`` is None or not written yet."""
    from .matmul import TILE
    from .source import define

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    c = np.zeros((n, n), np.float32)
    size = (np.int32(n),) * 3
    mine = source is not None and NOT_WRITTEN not in source
    tile = (define(source, "TILE", TILE) if mine else TILE) if variant == "tiled" else 16
    grid, block = (-(-n // tile), -(-n // tile)), (tile, tile)
    if mine:
        counts = loads(source, f"matmul_{variant}", "A", grid, block, (a, b, c, *size))
        return float(counts.mean()), "yours"
    counts = loads("matmul", f"matmul_{variant}", "A", grid, block, (a, b, c, *size, np.int32(0), np.int32(0)))
    return float(counts.mean()), "labkit's (yours is not written yet)"
