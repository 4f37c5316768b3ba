"""Lab 04, section 7: pinned host memory, and copies overlapped with kernels on two streams.

    pinned_vs_pageable(nbytes)           # {"pageable": GB/s, "pinned": GB/s} of host-to-device copies, and "device"
    stream_overlap(batches=8, rows=...)  # seconds for the batches on one stream and on two, and "overlap_shown"
    stream_time(copy, kernel, streams)   # the modelled seconds of those batches, from each one's copy and kernel times

On a GPU a copy from ordinary (pageable) host memory goes through a buffer the driver pins for it, a page at a time;
from pinned (page-locked) memory the GPU's copy engine reads host memory directly, faster, and without holding the
host thread. The copy engine and the multiprocessors work at the same time, so with two streams the copy of one batch
runs while the kernel of the previous batch computes.

On the emulator there is no device: "device memory" is host memory, a copy is a memcpy, and a stream is only a name.
The same code runs, in order, and the results say ``"device": False`` and ``"overlap_shown": False``.
"""

from __future__ import annotations

import contextlib
import statistics
import time

import numpy as np

from ._launch import array_module_for, resolve
from .matmul import matmul


def _sync(which: str) -> None:
    if which == "cupy":
        import cupy

        cupy.cuda.Device().synchronize()


def _pinned(shape, which: str) -> np.ndarray:
    """A host array in pinned memory on a GPU (cupyx.empty_pinned), an ordinary one on the emulator."""
    if which == "cupy":
        import cupyx

        return cupyx.empty_pinned(shape, np.float32)
    return np.empty(shape, np.float32)


def _copy_to(dst, src, which: str, stream=None) -> None:
    """Host ``src`` into device ``dst``: asynchronous on ``stream`` where ``src`` is pinned (CuPy), a memcpy on the
    emulator."""
    if which == "cupy":
        dst.set(src, stream=stream)
    else:
        np.copyto(dst, src)


def pinned_vs_pageable(nbytes: int = 64 << 20, repeat: int = 5, *, backend: str | None = None) -> dict:
    """Host-to-device copy bandwidth from pageable and from pinned host memory, GB/s, medians of ``repeat``
    interleaved copies of ``nbytes``; ``"device"`` is False on the emulator, where both are one memcpy."""
    which = resolve(backend)
    xp = array_module_for(which)
    n = max(1, int(nbytes) // 4)
    pageable = np.random.default_rng(0).random(n, dtype=np.float32)
    pinned = _pinned((n,), which)
    pinned[...] = pageable
    dev = xp.empty(n, np.float32)
    times: dict[str, list[float]] = {"pageable": [], "pinned": []}
    for r in range(repeat + 1):  # the first round warms up
        for name, src in (("pageable", pageable), ("pinned", pinned)):
            _sync(which)
            t0 = time.perf_counter()
            _copy_to(dev, src, which)
            _sync(which)
            if r:
                times[name].append(time.perf_counter() - t0)
    if not bool((dev[:16] == xp.asarray(pageable[:16])).all()):
        raise RuntimeError("the copy to the device lost data")
    gbs = {k: n * 4 / statistics.median(v) / 1e9 for k, v in times.items()}
    return {**gbs, "bytes": n * 4, "device": which == "cupy"}


def stream_time(copy, kernel, streams: int) -> float:
    """Modelled seconds from the first copy's start to the last kernel's end, for batches whose copies take ``copy[i]``
    and kernels ``kernel[i]`` seconds, on ``streams`` streams (1 or 2).

    One copy engine runs the copies one at a time in batch order, one compute unit the kernels; a kernel starts once
    its batch's copy has ended. On one stream each copy also waits for the previous kernel. On two streams with two
    device buffers, batch i uses buffer i % 2, so its copy waits for the kernel of batch i - 2, that buffer's last
    reader. For equal batches (c, k) that gives n(c + k) on one stream and c + k + (n - 1) max(c, k) on two."""
    if streams not in (1, 2):
        raise ValueError(f"streams must be 1 or 2, not {streams!r}")
    copy, kernel = np.asarray(copy, dtype=float), np.asarray(kernel, dtype=float)
    if copy.ndim != 1 or copy.shape != kernel.shape:
        raise ValueError(f"copy and kernel must be 1-d arrays of one entry per batch, of the same length: got shapes "
                         f"{copy.shape} and {kernel.shape}")
    copy_end, kernel_end = 0.0, [0.0, 0.0]  # the kernel ends so far, after two zeros for the batches before the first
    for c, k in zip(copy, kernel):
        buffer_free = kernel_end[-1] if streams == 1 else kernel_end[-2]
        copy_end = max(copy_end, buffer_free) + c
        kernel_end.append(max(copy_end, kernel_end[-1]) + k)
    return float(kernel_end[-1])


def stream_overlap(batches: int = 8, rows: int = 4096, n_in: int = 1024, width: int = 1024, repeat: int = 3, *,
                   backend: str | None = None) -> dict:
    """Seconds to copy ``batches`` batches of (rows, n_in) floats from pinned host memory to the device and multiply
    each by a resident (n_in, width) weight matrix with labkit's matmul: on one stream, each copy waiting for the
    previous kernel, and on two streams with a pair of buffers each, the copy of batch i + 1 beside the kernel of
    batch i. Medians of ``repeat`` interleaved runs; the results are checked against NumPy. ``"copy"`` and
    ``"kernel"`` are each batch's copy and kernel seconds (arrays, medians over the runs), timed apart in the
    one-stream runs, which wait for the device after each."""
    which = resolve(backend)
    xp = array_module_for(which)
    rng = np.random.default_rng(0)
    host = [_pinned((rows, n_in), which) for _ in range(batches)]
    for h in host:
        h[...] = rng.standard_normal((rows, n_in), dtype=np.float32)
    w_host = (rng.standard_normal((n_in, width), dtype=np.float32) / np.sqrt(n_in)).astype(np.float32)
    W = xp.asarray(w_host)
    if which == "cupy":
        import cupy

        streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    else:
        streams = [None, None]
    x = [xp.empty((rows, n_in), np.float32) for _ in range(2)]
    out = [xp.empty((rows, width), np.float32) for _ in range(2)]

    def on(stream):
        return stream if stream is not None else contextlib.nullcontext()

    phases: dict[str, list[list[float]]] = {"copy": [], "kernel": []}  # per one-stream run: each batch's seconds

    def one_stream():
        copies, kernels = [], []
        for h in host:
            t0 = time.perf_counter()
            _copy_to(x[0], h, which)
            _sync(which)
            t1 = time.perf_counter()
            matmul(x[0], W, out[0], backend=which)
            _sync(which)
            copies.append(t1 - t0)
            kernels.append(time.perf_counter() - t1)
        phases["copy"].append(copies)
        phases["kernel"].append(kernels)

    def two_streams():
        for i, h in enumerate(host):
            s = streams[i % 2]
            with on(s):  # the copy and the kernel of batch i on stream i % 2, in order there
                _copy_to(x[i % 2], h, which, stream=s)
                matmul(x[i % 2], W, out[i % 2], backend=which)
        _sync(which)

    times: dict[str, list[float]] = {"one stream": [], "two streams": []}
    for r in range(repeat + 1):  # the first round compiles and warms up
        for name, fn in (("one stream", one_stream), ("two streams", two_streams)):
            _sync(which)
            t0 = time.perf_counter()
            fn()
            if r:
                times[name].append(time.perf_counter() - t0)
    got = out[(batches - 1) % 2]
    got = got.get() if which == "cupy" else got
    want = np.asarray(host[-1]) @ w_host
    if not np.allclose(got, want, rtol=1e-3, atol=1e-3):
        raise RuntimeError("the overlapped batches gave a wrong product: a buffer was reused before its kernel ended")
    t = {k: statistics.median(v) for k, v in times.items()}
    per_batch = {k: np.median(np.array(v[1:]), axis=0) for k, v in phases.items()}  # the warm-up run left out
    return {**t, **per_batch, "gain": t["one stream"] / t["two streams"], "batches": batches, "device": which == "cupy",
            "overlap_shown": which == "cupy"}
