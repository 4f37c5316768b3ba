"""The measurements lab 05 draws, one call each: every kernel is run once and its values held to NumPy's before it
is timed, so a fast wrong kernel is an error, never a bar in a plot.

    from labkit.kernels import measure
    gflops = measure.matmul_rates(256, repeat=3, tiled=MY_TILED_SOURCE)
    plots.plot_bars(gflops, ...)

Each function takes the sizes and returns plain numbers by name, in the order they are drawn. Arrays are made on the
kernels' device (CuPy on a GPU, NumPy on the emulator) from a fixed seed. The ``modelled_*`` functions count the same
launches on the emulator instead and return each one's speed of light on a named GPU (:mod:`.speed_of_light`): what a
GPU's order is where there is none to time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..device import to_numpy
from . import reference as ref
from . import speed_of_light as sol
from ._launch import array_module_for, time_kernel
from .conv import conv2d_relu_backward, conv2d_relu_forward, library_convolutions
from .counts import traffic
from .loader import backend, load
from .matmul import library_gflops, matmul
from .reduce import reduce_blocks, sum_reduce
from .source import define


def _device_arrays(seed: int = 0):
    """(xp, rng, put): the kernels' array module, a seeded generator, and a function putting a host array on it."""
    xp = array_module_for(backend())
    return xp, np.random.default_rng(seed), lambda a: xp.asarray(np.ascontiguousarray(a, dtype=np.float32))


def matmul_rates(n: int, repeat: int, *, tiled: str | None = None) -> dict[str, float]:
    """GFLOP/s of an n x n x n float32 product: labkit's three kernels, ``tiled`` (the source of a ``matmul_tiled``
    kernel with ``#define TILE``, launched on TILE x TILE blocks) when given, and the library's matmul, last."""
    xp, rng, put = _device_arrays()
    a, b = put(rng.standard_normal((n, n))), put(rng.standard_normal((n, n)))
    c = xp.empty((n, n), np.float32)
    want = to_numpy(a) @ to_numpy(b)
    runs = {"naive": lambda: matmul(a, b, c, variant="naive")}
    if tiled is not None:
        yours = load(tiled, checked=False).get_function("matmul_tiled")
        tile = define(tiled, "TILE")
        grid = ((n + tile - 1) // tile, (n + tile - 1) // tile)
        runs["yours (tiled)"] = lambda: yours(grid, (tile, tile), (a, b, c, np.int32(n), np.int32(n), np.int32(n)))
    runs["tiled (labkit)"] = lambda: matmul(a, b, c, variant="tiled")
    runs["register-blocked"] = lambda: matmul(a, b, c, variant="regblock")
    runs["cuBLAS (cupy.matmul)" if backend() == "cupy" else "BLAS (numpy.matmul)"] = lambda: xp.matmul(a, b, out=c)
    rates = {}
    for name, fn in runs.items():
        c[...] = np.nan  # a kernel that writes nothing cannot pass for right
        fn()
        err = float(np.abs(to_numpy(c) - want).max() / np.abs(want).max())
        if not err < 1e-4:
            raise AssertionError(f"{name}: wrong result (relative error {err:.1e}), so it is not timed")
        rates[name] = 2 * n**3 / time_kernel(fn, repeat) / 1e9
    return rates


def scaling_rates(source: str, rows: int, cols: int, repeat: int) -> dict[str, float]:
    """GB/s (x read and out written) of ``source``'s four kernels ``scale_{rows,cols}_{global,const}``: each row or
    column of a (rows, cols) array multiplied by one entry of s, read from global memory or from ``s_const``."""
    xp, rng, put = _device_arrays()
    x = put(rng.standard_normal((rows, cols)))
    out = xp.empty_like(x)
    s_rows, s_cols = put(rng.standard_normal(rows)), put(rng.standard_normal(cols))
    mod = load(source, checked=False)
    grid, block, dims = ((cols + 255) // 256, rows), (256,), (np.int32(rows), np.int32(cols))
    wants = {"rows": to_numpy(x) * to_numpy(s_rows)[:, None], "cols": to_numpy(x) * to_numpy(s_cols)[None, :]}
    rates = {}
    for case, s in (("rows", s_rows), ("cols", s_cols)):
        mod.set_constant("s_const", to_numpy(s))
        for where in ("global", "const"):
            k = mod.get_function(f"scale_{case}_{where}")
            args = (x, s, out, *dims) if where == "global" else (x, out, *dims)
            k(grid, block, args)
            np.testing.assert_allclose(to_numpy(out), wants[case], rtol=1e-6, err_msg=f"scale_{case}_{where}")
            seconds = time_kernel(lambda k=k, args=args: k(grid, block, args), repeat)
            rates[f"scale {case}, s in {'constant' if where == 'const' else 'global'} memory"] = 2 * x.nbytes / seconds / 1e9
    return rates


def copy_rates(source: str, rows: int, cols: int, repeat: int) -> dict[str, float]:
    """GB/s (read and write) of ``source``'s ``copy_coalesced`` and ``copy_strided`` on a (rows, cols) float32 array,
    256 threads a block, and of the library's copy of the same array ("library copy")."""
    xp, rng, put = _device_arrays()
    src = put(rng.standard_normal((rows, cols)))
    dst = xp.empty_like(src)
    mod = load(source, checked=False)
    grid, args = ((rows * cols + 255) // 256,), (src, dst, np.int32(rows), np.int32(cols))
    rates = {}
    for name in ("copy_coalesced", "copy_strided"):
        k = mod.get_function(name)
        dst[...] = 0
        k(grid, (256,), args)
        if not bool((dst == src).all()):
            raise AssertionError(f"{name} did not copy everything, so it is not timed")
        rates[name.replace("_", " ")] = 2 * src.nbytes / time_kernel(lambda k=k: k(grid, (256,), args), repeat) / 1e9
    rates["library copy"] = 2 * src.nbytes / time_kernel(lambda: xp.copyto(dst, src), repeat) / 1e9
    return rates


def reduction_rates(n: int, repeat: int, *, atomic_only: str, block_sum: str | None = None) -> dict[str, float]:
    """GB/s read when summing n floats: ``block_sum`` (a kernel ``block_sum(x, out, n)``, 256 threads a block) when
    given, ``atomic_only``'s ``sum_atomic_only``, labkit's ``sum_reduce`` and the library's sum."""
    xp, rng, put = _device_arrays()
    v = put(rng.random(n))
    total = xp.zeros(1, np.float32)
    blocks = min((n + 255) // 256, 1024)
    want = float(to_numpy(v).sum(dtype=np.float64))

    def launcher(source, name):
        k = load(source, checked=False).get_function(name)

        def launch():
            total[...] = 0
            k((blocks,), (256,), (v, total, np.int32(n)))
        return launch

    runs = {}
    if block_sum is not None:
        runs["yours: tree + one atomicAdd per block"] = launcher(block_sum, "block_sum")
    runs["every thread atomicAdd"] = launcher(atomic_only, "sum_atomic_only")
    for name, launch in runs.items():
        launch()
        if not abs(float(total[0]) - want) <= 1e-3 * want:
            raise AssertionError(f"{name}: {float(total[0])} != {want}, so it is not timed")
    runs["labkit sum_reduce"] = lambda: sum_reduce(v)
    runs["library sum"] = lambda: float(v.sum())
    return {name: v.nbytes / time_kernel(fn, repeat) / 1e9 for name, fn in runs.items()}


def conv_times(shape: tuple[int, int, int, int, int], repeat: int) -> tuple[dict[str, float], float, float]:
    """(seconds by name, flops, bytes) of a 3x3 Conv2d+ReLU forward with padding 1 on x of (N, C, H, W) and K
    filters, ``shape = (N, C, H, W, K)``: labkit's fused kernel first, then the library's convolutions. The fused
    forward and its backward are held to NumPy's first, and the backward's largest relative differences printed."""
    N, C, H, W, K = shape
    _, rng, put = _device_arrays()
    x, w = put(rng.standard_normal((N, C, H, W))), put(rng.standard_normal((K, C, 3, 3)) / 3)
    bias = put(rng.standard_normal(K) * 0.1)
    y = conv2d_relu_forward(x, w, bias, pad=1)
    xh, wh, yh = to_numpy(x), to_numpy(w), to_numpy(y)
    np.testing.assert_allclose(yh, ref.conv2d_relu_forward(xh, wh, to_numpy(bias), pad=1), rtol=1e-4, atol=1e-4)
    dy = put(rng.standard_normal(y.shape))
    grads = conv2d_relu_backward(dy, y, x, w, pad=1)
    for name, g, r in zip(("dx", "dw", "db"), grads, ref.conv2d_relu_backward(to_numpy(dy), yh, xh, wh, pad=1)):
        err = float(np.abs(to_numpy(g) - r).max() / max(np.abs(r).max(), 1e-6))
        print(f"backward {name}: largest difference from the NumPy reference {err:.1e} (relative)")
        if not err < 1e-3:
            raise AssertionError(f"the fused backward's {name} is wrong (relative error {err:.1e})")
    times = {"fused kernel (labkit)": time_kernel(lambda: conv2d_relu_forward(x, w, bias, pad=1), repeat)}
    for name, fn in library_convolutions().items():
        np.testing.assert_allclose(to_numpy(fn(x, w, bias, pad=1)), yh, rtol=1e-3, atol=1e-3, err_msg=name)
        times[name] = time_kernel(lambda fn=fn: fn(x, w, bias, pad=1), repeat)
    return times, 2 * N * K * H * W * C * 9, 4 * (x.size + w.size + y.size)


def library_peak(repeat: int) -> tuple[float, int]:
    """(GFLOP/s, n): the library's best float32 matmul rate on the kernels' device, the roofline's compute ceiling."""
    return library_gflops(array_module_for(backend()), repeat)


def last_level_cache_bytes() -> int | None:
    """The size of the kernels' device's last cache before its main memory: a GPU's L2, or the CPU's largest cache
    as Linux reports it; None where it cannot be read."""
    if backend() == "cupy":
        import cupy

        return int(cupy.cuda.Device().attributes["L2CacheSize"])

    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip()
        sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
    return max(sizes, default=None)


def library_bandwidth(repeat: int, *, least: int = 256 << 20, most: int = 1 << 30) -> tuple[float, int]:
    """(GB/s read and written, bytes copied): the library's copy of one float32 buffer into another on the kernels'
    device, the roofline's bandwidth ceiling. The buffer is four times the last-level cache (within ``least`` and
    ``most``), so the copy streams from main memory: a buffer that fits in a cache measures the cache. The fastest
    of ``repeat`` copies counts, as for :func:`library_peak`."""
    xp, _, _ = _device_arrays()
    cache = last_level_cache_bytes() or 0
    nbytes = min(max(4 * cache, least), most)
    src = xp.ones(nbytes // 4, np.float32)
    dst = xp.empty_like(src)  # the untimed warm-up copy touches its pages first: a page fault is no copy's cost
    return 2 * nbytes / time_kernel(lambda: xp.copyto(dst, src), repeat, best=True) / 1e9, nbytes


def modelled_matmuls(n: int, *, tiled: str | None = None, on=None) -> dict:
    """Speed of light (:class:`.speed_of_light.SpeedOfLight`) by name of an n x n x n float32 product on the GPU ``on``
    (see :func:`.speed_of_light.gpu`): labkit's naive kernel, ``tiled`` (a ``matmul_tiled`` source) when given, labkit's
    tiled and register-blocked ones; counted at small sizes and carried to n (:func:`.speed_of_light.matmul_counts`)."""
    runs = {"naive": ("naive", None)}
    if tiled is not None:
        runs["yours (tiled)"] = ("tiled", tiled)
    runs.update({"tiled (labkit)": ("tiled", None), "register-blocked": ("regblock", None)})
    return {name: sol.model(sol.matmul_counts(variant, n, source)[0], on) for name, (variant, source) in runs.items()}


def modelled_reductions(n: int, *, atomic_only: str, block_sum: str | None = None, on=None) -> dict:
    """Speed of light by name of summing n floats, launched as :func:`reduction_rates` launches them: ``block_sum``
    when given (else labkit's ``sum_reduce``) and ``atomic_only``'s ``sum_atomic_only``. One flop per float; the
    atomics are the emulator's count where it counts them, else what each kernel makes: one per block for the tree,
    n on the one address for the atomics-only sum."""
    x = np.random.default_rng(0).random(n).astype(np.float32)
    blocks = reduce_blocks(n)
    runs = {"yours: tree + one atomicAdd per block" if block_sum else "labkit sum_reduce":
            (block_sum or "reduce", "block_sum" if block_sum else "sum_reduce", blocks),
            "every thread atomicAdd": (atomic_only, "sum_atomic_only", n)}
    out = {}
    for name, (source, kernel, atomics) in runs.items():
        t = traffic(source, kernel, (blocks,), (256,), (x, np.zeros(1, np.float32), np.int32(n)))
        declared = {} if hasattr(t, "atomics") else {"atomics": atomics, "atomics_max_per_address": atomics}
        out[name] = sol.model(sol.counted(t, flops=n, footprint=x.nbytes + 4, **declared), on)
    return out


def modelled_copies(source: str, rows: int, cols: int, *, on=None) -> dict:
    """Speed of light by name ("copy coalesced", "copy strided") of ``source``'s two copies of a (rows, cols) float32
    array, launched as :func:`copy_rates` launches them (no flops: their bound is a memory unit's)."""
    a = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols)
    grid, args = ((rows * cols + 255) // 256,), (a, np.zeros_like(a), np.int32(rows), np.int32(cols))
    return {name.replace("_", " "): sol.model(sol.counted(traffic(source, name, grid, (256,), args), flops=0,
                                                          footprint=2 * a.nbytes), on)
            for name in ("copy_coalesced", "copy_strided")}


# the every-thread-atomicAdd sum lab 05 sets against the block tree, timed and modelled beside labkit's own kernels
ATOMIC_ONLY = r"""
extern "C" __global__ void sum_atomic_only(const float* x, float* out, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) atomicAdd(out, x[i]);
}
"""


def against_model(n: int = 1024, n_sum: int = 1 << 24, repeat: int = 20) -> list[dict]:
    """On a GPU: each of labkit's matmuls at n x n x n and both sums of n_sum floats, timed and modelled on the GPU in use
    (:func:`.speed_of_light.in_use`): measured seconds over the speed of light's, which a kernel can approach but not
    beat (a ratio under 1 says the model's figures for this card are wrong)."""
    if backend() != "cupy":
        raise RuntimeError("measured against the model needs a CUDA GPU: on the emulator there is nothing to hold it to")
    rows = []
    timed = matmul_rates(n, repeat)
    for name, s in modelled_matmuls(n).items():
        rows.append(_row(name, 2 * n**3 / timed[name] / 1e9, s))
    timed = reduction_rates(n_sum, repeat, atomic_only=ATOMIC_ONLY)
    for name, s in modelled_reductions(n_sum, atomic_only=ATOMIC_ONLY).items():
        rows.append(_row(name, 4 * n_sum / timed[name] / 1e9, s))
    return rows


def _row(name: str, measured: float, s) -> dict:
    return {"kernel": name, "gpu": s.gpu.name, "measured_s": measured, "modelled_s": s.bound, "bound_by": s.unit,
            "measured_over_modelled": measured / s.bound if s.bound else None}


def modelled_roofline(groups: dict[str, dict], on) -> tuple[dict, dict]:
    """(points, roof) of a roofline drawn from speed-of-light models where no GPU is timed: each launch of ``groups``
    ({"matmul ": {name: SpeedOfLight}}) at its counted intensity and modelled rate, named by its group's prefix and its
    name ("matmul naive"), under the FP32 peak and the L2 bandwidth of the GPU ``on``, as
    :func:`labkit.plots.plot_roofline` takes them."""
    points = {f"{group}{name}": (s.counts.intensity, s.gflops) for group, sols in groups.items() for name, s in sols.items()}
    roof = dict(peak_gflops=on.fp32_flops_s / 1e9, bandwidth_gbs=on.l2_bytes_s / 1e9, peak_label=f"{on.name} FP32",
                bandwidth_label=f"{on.name} L2 (modelled)")
    return points, roof


def measured_roofline(gflops: dict, n: int, conv: tuple[float, float, float], peak: tuple[float, int],
                      repeat: int) -> tuple[dict, dict]:
    """(points, roof) of the roofline timed on a GPU: the matmuls of ``gflops`` (:func:`matmul_rates` at n) at 2n^3
    flops over A, B and C moved once, the fused convolution at ``conv`` = (its flops, bytes, seconds), under the
    library's best matmul rate ``peak`` = (GFLOP/s, at n) and main memory's bandwidth (a copy no cache holds)."""
    bandwidth, nbytes = library_bandwidth(repeat)
    points = {f"matmul {k}": (2 * n**3 / (3 * 4 * n**2), gflops[k]) for k in ("naive", "yours (tiled)", "register-blocked")
              if k in gflops}
    flops, moved, seconds = conv
    points["fused conv + ReLU"] = (flops / moved, flops / seconds / 1e9)
    roof = dict(peak_gflops=peak[0], bandwidth_gbs=bandwidth, peak_label=f"{list(gflops)[-1]} at {peak[1]}^3 (measured)",
                bandwidth_label=f"library copy of {nbytes >> 20} MiB (measured)")
    return points, roof
