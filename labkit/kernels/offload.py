"""Lab 04: the course's offload experiment. Per-sample backprop (lab 01's loop) with its two products,
``W^T delta`` and ``delta a^T``, run as kernels on the device.

    grad_fn = OffloadedBackprop("copy")        # every product: allocate, copy in, launch, copy out, free
    grad_fn = OffloadedBackprop("resident")    # weights copied once per batch, gradients summed on the device
    loss, grads = grad_fn(params, x, y)        # the signature of labkit.mlp.loss_and_grads: usable in mlp.train

``transfer_breakdown`` times the phases of one offloaded product, to show where the time goes.
On the emulator "device memory" is host memory and a "transfer" is a memcpy: the mechanics are the
same, the costs are not (say so when you show emulator timings).
"""

from __future__ import annotations

import contextlib
import statistics
import time

import numpy as np

from .. import mlp
from ._launch import array_module_for, resolve
from .layers import outer as outer_kernel
from .layers import wt_delta as wt_delta_kernel

MODES = ("copy", "resident")
PHASES = ("allocate", "copy in", "kernel", "copy out", "free")


class _Device:
    """Allocation and copies on the kernels' device: CuPy, or the emulator's host arrays."""

    def __init__(self, which: str, pool: bool):
        self.which, self.pool = which, pool
        self.xp = array_module_for(which)

    def allocator(self):
        """CuPy's memory pool recycles freed blocks; pool=False calls cudaMalloc/cudaFree every time, as C code does."""
        if self.which == "cupy" and not self.pool:
            import cupy

            return cupy.cuda.using_allocator(None)
        return contextlib.nullcontext()

    def empty(self, shape):
        return self.xp.empty(shape, np.float32)

    def to_device(self, a):
        """A new device array holding a (allocate + host-to-device copy)."""
        a = np.ascontiguousarray(a, dtype=np.float32)
        if self.which == "cupy":
            return self.xp.asarray(a)
        return a.copy()

    def to_host(self, d):
        if self.which == "cupy":
            return d.get()
        return d.copy()

    def sync(self) -> None:
        if self.which == "cupy":
            self.xp.cuda.get_current_stream().synchronize()


class OffloadedBackprop:
    """Per-sample backprop with ``W^T delta`` and ``delta a^T`` on the device; the rest stays on the host.

    ``mode="copy"``: each product allocates its device arrays, copies its operands in and its result out, then
    frees them: the course's first CUDA version. ``mode="resident"``: the weights go to the device once per
    batch (they only change between batches), the weight gradients are summed there (``outer`` with beta=1),
    and only the vectors delta and a travel per sample. ``pool=False`` (CuPy) allocates with cudaMalloc each
    time instead of from CuPy's memory pool. Gradients equal ``mlp.loss_and_grads_per_sample``'s (float32).
    """

    def __init__(self, mode: str = "copy", *, backend: str | None = None, pool: bool = True):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.dev = _Device(resolve(backend), pool)

    def __repr__(self):
        return f"OffloadedBackprop({self.mode!r}, backend={self.dev.which!r}, pool={self.dev.pool})"

    def __call__(self, params, x, y, activation: str = "sigmoid", cost: str = "quadratic", l2: float = 0.0):
        mlp.check_options(activation, cost)
        for i, (W, _) in enumerate(params):
            if not isinstance(W, np.ndarray) or W.dtype != np.float32:
                raise TypeError(f"layer {i}: the offloaded products take float32 NumPy weights (they are copied to the "
                                f"device here), got {type(W).__name__} of {getattr(W, 'dtype', '?')}: "
                                "init_params(..., dtype=np.float32)")
        Y = mlp.check_batch(params, x, y)
        dev = self.dev
        total = 0.0
        acc = mlp.zeros_like(params)
        with dev.allocator():
            if self.mode == "copy":
                def outer(i, delta, a):
                    d_out = dev.empty((delta.shape[0], a.shape[0]))
                    outer_kernel(dev.to_device(delta[:, 0]), dev.to_device(a[:, 0]), d_out, backend=dev.which)
                    return dev.to_host(d_out)

                def wt_delta(i, delta):
                    W = params[i][0]
                    d_out = dev.empty((W.shape[1],))
                    wt_delta_kernel(dev.to_device(W), dev.to_device(delta[:, 0]), d_out, backend=dev.which)
                    return dev.to_host(d_out)[:, None]

                for k in range(x.shape[0]):
                    value, g = mlp.backprop_one(params, x[k][:, None], Y[k][:, None], activation, cost, outer, wt_delta)
                    total += value
                    mlp.add_into(acc, g)
            else:
                d_W = [dev.to_device(W) for W, _ in params]
                d_gW = [dev.xp.zeros(W.shape, np.float32) for W, _ in params]

                def outer(i, delta, a):
                    outer_kernel(dev.to_device(delta[:, 0]), dev.to_device(a[:, 0]), d_gW[i], beta=1.0, backend=dev.which)
                    return None

                def wt_delta(i, delta):
                    d_out = dev.empty((d_W[i].shape[1],))
                    wt_delta_kernel(d_W[i], dev.to_device(delta[:, 0]), d_out, backend=dev.which)
                    return dev.to_host(d_out)[:, None]

                for k in range(x.shape[0]):
                    value, g = mlp.backprop_one(params, x[k][:, None], Y[k][:, None], activation, cost, outer, wt_delta)
                    total += value
                    for (_, gb), (_, b) in zip(acc, g):
                        gb += b
                for (gW, _), d in zip(acc, d_gW):
                    gW[...] = dev.to_host(d)
        return mlp.mean_from_sums(params, total, acc, x.shape[0], l2)


def transfer_breakdown(n_out: int, n_in: int, repeat: int = 5, *, backend: str | None = None,
                       pool: bool = True) -> dict[str, float]:
    """Median seconds of each phase of one offloaded ``W^T delta`` with W (n_out, n_in), each phase synchronised:
    allocate (W, delta, out), copy in (W, delta), kernel, copy out, free. Also ``"host"``: NumPy's W.T @ delta."""
    if n_out < 1 or n_in < 1 or repeat < 1:
        raise ValueError(f"n_out, n_in and repeat must be >= 1, got {n_out}, {n_in}, {repeat}")
    dev = _Device(resolve(backend), pool)
    rng = np.random.default_rng(0)
    W = rng.standard_normal((n_out, n_in)).astype(np.float32)
    delta = rng.standard_normal(n_out).astype(np.float32)
    times: dict[str, list[float]] = {p: [] for p in (*PHASES, "host")}

    def timed(phase, fn, *args, **kw):
        dev.sync()
        t0 = time.perf_counter()
        r = fn(*args, **kw)
        dev.sync()
        times[phase].append(time.perf_counter() - t0)
        return r

    with dev.allocator():
        for it in range(repeat + 1):  # the first round compiles and warms up; it is not counted
            # bufs holds the only references, so clearing it frees the memory (cudaFree without the pool)
            bufs = timed("allocate", lambda: [dev.empty(W.shape), dev.empty(delta.shape), dev.empty((n_in,))])
            timed("copy in", _copy_in, dev, bufs, W, delta)
            timed("kernel", wt_delta_kernel, *bufs, backend=dev.which)
            got = timed("copy out", dev.to_host, bufs[2])
            timed("free", bufs.clear)
            timed("host", np.matmul, W.T, delta)
            if it == 0:
                err = float(np.abs(got - W.T @ delta).max())
                if err > 1e-3 * max(1.0, float(np.abs(got).max())):
                    raise RuntimeError(f"the wt_delta kernel gave a wrong result (largest difference {err:.3g}); "
                                       "run the kernel tests: pytest tests/test_kernels.py")
                for v in times.values():
                    v.clear()
    return {k: statistics.median(v) for k, v in times.items()}


def _copy_in(dev: _Device, bufs: list, W, delta) -> None:
    for d, h in zip(bufs, (W, delta)):
        if dev.which == "cupy":
            d.set(h)
        else:
            np.copyto(d, h)


__all__ = ["MODES", "PHASES", "OffloadedBackprop", "transfer_breakdown"]
