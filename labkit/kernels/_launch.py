"""What every launcher checks before it launches: back end, device, dtype, contiguity and shapes."""

from __future__ import annotations

import contextlib

import numpy as np
from threadpoolctl import threadpool_limits

from ..bench import measure
from .loader import backend


def ceil_div(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def array_module_for(which: str):
    if which == "cupy":
        import cupy

        return cupy
    return np


def require(a, name: str, *, ndim: int | None = None, dtype=np.float32, shape: tuple | None = None, which: str,
            writeable: bool = False):
    """Check one array argument; raise TypeError/ValueError naming ``name`` and the problem."""
    is_cupy = type(a).__module__.startswith("cupy")
    if which == "cupy" and not is_cupy:
        if isinstance(a, np.ndarray):
            raise TypeError(f"{name} is a NumPy array, but the kernels run on the GPU (back end 'cupy'): "
                            f"pass cupy.asarray({name}), or set LABKIT_DEVICE=cpu to use the CPU emulator")
        raise TypeError(f"{name} must be a CuPy array, got {type(a).__name__}")
    if which == "emulator" and not isinstance(a, np.ndarray):
        if is_cupy:
            raise TypeError(f"{name} is a CuPy array, but the kernels run on the CPU emulator: pass {name}.get()")
        raise TypeError(f"{name} must be a NumPy array, got {type(a).__name__}")
    if dtype is not None and a.dtype != np.dtype(dtype):
        want = np.dtype(dtype)
        raise TypeError(f"{name} has dtype {a.dtype}; the kernel takes {want}: convert it with .astype(np.{want})")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(a.shape)}")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(a.shape)}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} is not C-contiguous (a slice or a transpose?): pass an ascontiguousarray copy")
    if writeable and isinstance(a, np.ndarray) and not a.flags.writeable:
        raise ValueError(f"{name} is read-only, but the kernel writes it")
    if a.size == 0:
        raise ValueError(f"{name} is empty (shape {tuple(a.shape)})")
    return a


def output(out, name: str, shape: tuple, which: str, dtype=np.float32):
    """``out`` checked (the right shape, dtype and device), or a new array when it is None."""
    if out is None:
        return array_module_for(which).empty(shape, dtype=dtype)
    return require(out, name, shape=shape, dtype=dtype, which=which, writeable=True)


def resolve(which: str | None) -> str:
    return which or backend()


def synchronize(which: str | None = None) -> None:
    """Wait for the GPU's queued work (a no-op on the emulator, whose launches return when done)."""
    if resolve(which) == "cupy":
        import cupy

        cupy.cuda.get_current_stream().synchronize()


def host_blas_beside(which: str):
    """A context in which the host's BLAS runs on one thread beside the emulator (nothing changes on a GPU): the
    emulator's threads take the cores, and BLAS's own threads, waiting for a core another program holds, slowed the
    library's calls 13 to 30 times in some runs under load."""
    return contextlib.nullcontext() if which == "cupy" else threadpool_limits(1)


def time_kernel(fn, repeat: int = 5, *, warmup: int = 1, backend: str | None = None, best: bool = False) -> float:
    """Median seconds of ``fn()`` over ``repeat`` calls after ``warmup`` ones (the fastest call's with ``best``),
    synchronising the GPU before and after each call: a launch returns before the kernel has run, so timing without
    waiting measures only the launch. Beside the emulator the library's calls run on one BLAS thread: under two busy
    loops on 2 cores BLAS's threads, each waiting for a core another program held, made NumPy's convolution of lab 05's
    full profile take 16-20 ms in some runs instead of 1.2 ms, and the emulated kernel look faster than the library."""
    which = resolve(backend)
    synchronize(which)  # nothing queued earlier is counted in the first call
    with host_blas_beside(which):
        timing = measure(fn, repeat=repeat, warmup=warmup, sync=lambda: synchronize(which))
    return timing.best if best else timing.median
