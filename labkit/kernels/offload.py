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
from ..bench import measure
from ..costmodel import fit
from ..cpu_parallel import time_per_batch
from ..device import get_xp
from . import speed_of_light as sol
from . import synchronize, wt_delta
from ._launch import array_module_for, ceil_div, host_blas_beside, resolve
from .counts import traffic
from .device_mlp import DeviceMLP
from .layers import THREADS
from .layers import outer as outer_kernel
from .layers import wt_delta as wt_delta_kernel
from .loader import backend
from .loader import backend as kernels_backend

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


# ---- lab 04: offloading one product, as a model and as a measurement ---------------------------------------------

FLOAT_BYTES = 4  # the kernels take float32
OFFLOAD_MODES = ("copy", "resident")


def backward(xp, Ws, acts, delta) -> list:
    """One sample's weight gradients, from the output layer back, on the array module ``xp`` (numpy or cupy).

    ``Ws[i]`` (n_{i+1}, n_i) are the weights, ``acts[i]`` (n_i, 1) the sigmoid activations of the forward pass
    (``acts[0]`` the input), ``delta`` (n_L, 1) the output layer's error dC/dz. Returns [nabla_W_0, ...,
    nabla_W_{L-1}]. Lab 04's first exercise; :func:`labkit.mlp.backprop_one` does the same inside the whole step.
    """
    nabla = [None] * len(Ws)
    for i in range(len(Ws) - 1, -1, -1):
        nabla[i] = xp.dot(delta, acts[i].T)
        if i:
            delta = xp.dot(Ws[i].T, delta) * (acts[i] * (1 - acts[i]))
    return nabla


def sample_forward(params, x, y):
    """One sample's forward pass as :func:`backward` takes it: (Ws, acts, delta), column vectors, sigmoid layers and
    the quadratic cost's output error (a - y) a (1 - a); ``x`` one image (n_in,), ``y`` its label."""
    acts = [np.asarray(x, dtype=params[0][0].dtype)[:, None]]
    for W, b in params:
        acts.append(mlp.sigmoid(W @ acts[-1] + b[:, None]))
    target = np.zeros_like(acts[-1])
    target[int(y)] = 1
    return [W for W, _ in params], acts, (acts[-1] - target) * acts[-1] * (1 - acts[-1])


def offload_time(n_out: int, n_in: int, costs: dict, resident: bool = False) -> float:
    """Modelled seconds of one offloaded W^T delta, W (n_out, n_in) float32, from ``costs``: ``launch`` (s per kernel
    launch), ``copy`` (s per copy, before its bytes move), ``bandwidth`` (bytes/s of a copy) and ``throughput``
    (flop/s of the kernel). ``resident``: W is already on the device. The phases run one after another."""
    arrays = (n_out, n_in) if resident else (n_out * n_in, n_out, n_in)  # what crosses the link, in floats
    moving = sum(costs["copy"] + FLOAT_BYTES * n / costs["bandwidth"] for n in arrays)
    return moving + costs["launch"] + 2 * n_out * n_in / costs["throughput"]


def wt_delta_throughput(n_in: int, n_out: int = 1000, on=None) -> float:
    """Flop/s of labkit's ``wt_delta`` kernel on the GPU ``on`` (the one in use, else the default of
    :mod:`.speed_of_light`) by its speed of light: one launch for W (n_out, n_in) counted on the emulator, its 2 n_out
    n_in flops over the modelled bound. W is read once, so the rate hardly changes with n_out: a memory unit bounds it."""
    rng = np.random.default_rng(0)
    W, delta = rng.standard_normal((n_out, n_in)).astype(np.float32), rng.standard_normal(n_out).astype(np.float32)
    t = traffic("layers", "wt_delta", (ceil_div(n_in, THREADS),), (THREADS,),
                (W, delta, np.zeros(n_in, np.float32), np.int32(n_out), np.int32(n_in)))
    flops = 2 * n_out * n_in
    return flops / sol.model(sol.counted(t, flops=flops, footprint=4 * (W.size + n_out + n_in)), on).bound


def offload_crossover(widths, host, copy, kernel):
    """The smallest width from which offloading beats the host at that width and every wider one, or None.

    ``host``, ``copy``, ``kernel``: seconds, shape (repetitions, len(widths)); the offloaded time of a repetition is
    its copy plus its kernel time. Each width is judged by medians, so one fluke repetition decides nothing."""
    offloaded = np.median(np.asarray(copy, dtype=float) + np.asarray(kernel, dtype=float), axis=0)
    return winning_from(widths, offloaded < np.median(np.asarray(host, dtype=float), axis=0))


def winning_from(widths, wins):
    """The first width of the unbroken run of wins that reaches the widest width, or None when the widest loses."""
    if not wins[-1]:
        return None
    first = len(wins) - 1
    while first > 0 and wins[first - 1]:
        first -= 1
    return widths[first]


def offload_tables(widths, n_in: int, repeat: int = 5, *, backend: str | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Seconds of one W^T delta for W of each width x ``n_in``, per mode ("copy", "resident"): a dict of tables
    ``{"host", "copy", "kernel"}`` of shape (repeat, len(widths)), one row per repetition.

    ``host`` is NumPy's ``W.T @ delta``; ``copy`` is everything of the offloaded product but its kernel (allocate,
    copy in, copy out, free; in resident mode W is on the device already, so only delta and the result travel);
    ``kernel`` the launch until the kernel has finished. Host and both modes take turns in every repetition, so
    a slow moment of the machine touches them alike. The first round compiles and warms up and is not counted.
    Beside the emulator the host's product runs on one BLAS thread: the emulator's threads take the cores, and BLAS's
    own threads, waiting for a core that another program holds, made one product 30 times slower in some runs and
    not in others."""
    which = backend or kernels_backend()
    if repeat < 1 or len(widths) == 0:
        raise ValueError(f"need repeat >= 1 and at least one width, got {repeat} and {list(widths)}")
    transfers = _transfers(which)
    tables = {m: {k: np.zeros((repeat, len(widths))) for k in ("host", "copy", "kernel")} for m in OFFLOAD_MODES}
    rng = np.random.default_rng(0)
    with host_blas_beside(which):
        for j, w in enumerate(widths):
            W = rng.standard_normal((int(w), n_in)).astype(np.float32)
            delta = rng.standard_normal(int(w)).astype(np.float32)
            d_W = transfers[0](W)  # resident mode's weights, copied once
            for r in range(-1, repeat):  # round -1: compile and warm up
                for mode in OFFLOAD_MODES:
                    t = _offloaded_once(W, delta, d_W if mode == "resident" else None, transfers,
                                        lambda *a: wt_delta(*a, backend=which), lambda: synchronize(which))
                    if r >= 0:
                        tables[mode]["copy"][r, j], tables[mode]["kernel"][r, j] = t
                t0 = time.perf_counter()
                W.T @ delta
                if r >= 0:
                    for mode in OFFLOAD_MODES:
                        tables[mode]["host"][r, j] = time.perf_counter() - t0
            del d_W
    return tables


def _transfers(which: str):
    """(to_device, to_host, empty) of the kernels' back end: CuPy's copies and allocation, or the emulator's (host
    memory: a copy is a memcpy)."""
    if which == "cupy":
        import cupy

        return cupy.asarray, lambda d: d.get(), lambda n: cupy.empty(n, np.float32)
    return np.copy, np.copy, lambda n: np.empty(n, np.float32)


def _offloaded_once(W, delta, d_W, transfers, kernel, sync) -> tuple[float, float]:
    """(seconds outside the kernel, seconds of the kernel) of one offloaded W^T delta; d_W given: W is resident."""
    to_device, to_host, empty = transfers
    sync()
    t0 = time.perf_counter()
    d_W = to_device(W) if d_W is None else d_W
    d_delta, d_out = to_device(delta), empty(W.shape[1])
    sync()
    t1 = time.perf_counter()
    kernel(d_W, d_delta, d_out)
    sync()
    t2 = time.perf_counter()
    to_host(d_out)
    del d_W, d_delta, d_out  # freed here: copy mode's W too (resident mode's stays with the caller)
    sync()
    return (t1 - t0) + (time.perf_counter() - t2), t2 - t1


def fit_offload_costs(widths, n_in: int, tables: dict) -> tuple[dict[str, float], dict[str, float]]:
    """(costs, host) fitted to :func:`offload_tables`' medians: ``costs`` as :func:`offload_time` takes them (launch,
    copy, bandwidth, throughput), ``host`` the host product's ``latency`` (s) and ``throughput`` (flop/s).

    Copies: time = copies x copy + bytes / bandwidth over both modes (3 copies in copy mode, 2 resident); kernel and
    host: time = latency + flops / throughput (:func:`labkit.costmodel.fit`, each point weighted by 1/t)."""
    w = np.asarray(widths, dtype=float)
    med = {m: {k: np.median(t, axis=0) for k, t in tables[m].items()} for m in tables}
    copies = np.concatenate([np.full_like(w, 3.0), np.full_like(w, 2.0)])
    nbytes = FLOAT_BYTES * np.concatenate([w * n_in + w + n_in, w + n_in])
    t_copy = np.concatenate([med["copy"]["copy"], med["resident"]["copy"]])
    A = np.stack([copies, nbytes], axis=1) / t_copy[:, None]
    per_copy, per_byte = np.linalg.lstsq(A, np.ones_like(t_copy), rcond=None)[0]
    flops = 2 * w * n_in
    kernel = fit(np.concatenate([flops, flops]), np.concatenate([med[m]["kernel"] for m in OFFLOAD_MODES]))
    host = fit(flops, med["copy"]["host"])
    costs = {"launch": kernel.alpha, "copy": max(float(per_copy), 0.0), "bandwidth": 1 / max(float(per_byte), 1e-15),
             "throughput": kernel.bandwidth}
    return costs, {"latency": host.alpha, "throughput": host.bandwidth}


def host_time(n_out: int, n_in: int, host: dict) -> float:
    """Modelled seconds of NumPy's W^T delta on the host, from :func:`fit_offload_costs`' ``host``."""
    return host["latency"] + 2 * n_out * n_in / host["throughput"]


def offload_sweep(widths, x, y, repeat: int = 3, n_out: int = 10) -> dict[str, list[float]]:
    """Median seconds of one batch (x, y) of per-sample backprop on [n_in, width, n_out] for each width: the host
    loop (``mlp.loss_and_grads_per_sample``) and both modes of ``OffloadedBackprop``. Beside the emulator the host
    runs on one BLAS thread, as in :func:`offload_tables`: under two busy loops on 2 cores BLAS's waiting threads
    made the host loop at width 1000 up to 30 times slower in some runs, and the emulator's "offloading" look 1.14x
    faster than the host."""
    ways = {"host": mlp.loss_and_grads_per_sample, "offloaded, copy": OffloadedBackprop("copy"),
            "offloaded, resident": OffloadedBackprop("resident")}
    times: dict[str, list[float]] = {k: [] for k in ways}
    with host_blas_beside(backend()):
        for w in widths:
            p = mlp.init_params([x.shape[1], int(w), n_out])
            for k, fn in ways.items():
                times[k].append(time_per_batch(fn, p, x, y, repeat=repeat))
    return times


def batch_step_times(width: int, x, y, repeat: int = 3, n_out: int = 10) -> dict[str, float]:
    """Median seconds of the loss and gradients of one batch (x, y) on [n_in, width, n_out], cross-entropy, four
    ways: per sample on the host, per sample offloaded (resident), vectorised on the host, batched on the device
    (``DeviceMLP``: everything on the device, the batch copied in and the gradients out included). Beside the
    emulator the host runs on one BLAS thread (:func:`offload_sweep`)."""
    p = mlp.init_params([x.shape[1], int(width), n_out])
    net = DeviceMLP(p, batch_size=x.shape[0], cost="cross_entropy")
    ways = {"host, per sample": mlp.loss_and_grads_per_sample,
            "offloaded per sample, resident": OffloadedBackprop("resident"),
            "host, vectorised": mlp.loss_and_grads,
            f"device, batched ({backend()})": lambda _p, xb, yb, **kw: net.loss_and_grads(xb, yb)}
    with host_blas_beside(backend()):
        return {k: time_per_batch(fn, p, x, y, repeat=repeat, cost="cross_entropy") for k, fn in ways.items()}


def batch_step(xp, params, x, Y, lr: float) -> float:
    """One SGD step on a whole batch, on the array module ``xp``: the forward pass, the gradients of the mean quadratic
    cost (sigmoid layers) and ``W -= lr dW``, ``b -= lr db`` in place, so the weights stay where they are. ``params``
    is [(W (n_out, n_in), b (n_out,)), ...], ``x`` (B, n_in) one sample per row, ``Y`` (B, n_out) one-hot. Returns the
    batch's mean cost before the step. Lab 04's fourth exercise: exercise 1's B outer products summed as one product."""
    acts = [x]
    for W, b in params:
        acts.append(1 / (1 + xp.exp(-(acts[-1] @ W.T + b))))
    n, a = x.shape[0], acts[-1]
    loss = float(((a - Y) ** 2).sum()) / (2 * n)
    delta = (a - Y) * a * (1 - a) / n
    grads = [None] * len(params)
    for i in range(len(params) - 1, -1, -1):
        grads[i] = (delta.T @ acts[i], delta.sum(axis=0))
        if i:
            delta = (delta @ params[i][0]) * acts[i] * (1 - acts[i])
    for (W, b), (gW, gb) in zip(params, grads):
        W -= lr * gW
        b -= lr * gb
    return loss


def batch_against_samples(step, backward_one, params, x, Y, lr: float, repeat: int = 3) -> dict[str, float]:
    """Median seconds of one batch's forward pass and weight gradients on ``get_xp()`` (CuPy on a GPU, else NumPy),
    two ways: ``backward_one`` (lab 04's first exercise) once per sample, and ``step`` (its fourth) once on the batch,
    the SGD update included. The weights and the batch are copied there first; each call is timed until it ends."""
    xp = get_xp()
    sync = None if xp is np else xp.cuda.get_current_stream().synchronize
    d_params = [(xp.asarray(W), xp.asarray(b)) for W, b in params]
    d_x, d_Y = xp.asarray(x), xp.asarray(Y)

    def per_sample():
        for k in range(x.shape[0]):
            acts = [d_x[k][:, None]]
            for W, b in d_params:
                acts.append(1 / (1 + xp.exp(-(W @ acts[-1] + b[:, None]))))
            a = acts[-1]
            backward_one(xp, [W for W, _ in d_params], acts, (a - d_Y[k][:, None]) * a * (1 - a))

    return {"per sample (exercise 1)": measure(per_sample, repeat=repeat, warmup=1, sync=sync).median,
            "batched (exercise 4)": measure(lambda: step(xp, d_params, d_x, d_Y, lr), repeat=repeat, warmup=1,
                                            sync=sync).median}
