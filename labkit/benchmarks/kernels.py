"""labkit's CUDA kernels against the library (cuBLAS through CuPy on a GPU; NumPy on the emulator, for information).

Run: ``labkit bench kernels [--quick] [--json]``

Every figure comes from this one run, each kernel validated against its reference before it is
timed. On a GPU (keys only there):
  ``sgemm_fraction_of_cublas``   register-blocked matmul GFLOP/s / cupy.matmul's, float32, 4096^3 (2048^3 quick);
                                 CuPy leaves TF32 off unless CUPY_TF32=1, so both are true float32
  ``elementwise_fraction_of_copy`` fused bias+sigmoid GB/s / a device-to-device copy's GB/s
  ``mnist_epoch_vs_torch``       one epoch of [784,1024,1024,10] at batch 256: our device step / PyTorch eager
                                 (when PyTorch is installed)
and the measured copy bandwidths (device-to-device, host-to-device). Everywhere:
  ``emulator_matmul256_s``       seconds for the 256^3 tiled matmul on the CPU emulator;
  ``warp_overhead_matmul256``    that matmul's time with the block run warp by warp / run as one group of threads (the
                                 scheduler before warps, compiled with LABKIT_EMU_NO_WARPS), launches interleaved;
  ``emulator_warp_reduce_1e6_s`` seconds for a warp-shuffle sum of 10^6 floats (5 __shfl_down_sync a warp);
  ``modelled_tiled_vs_naive``    the speed-of-light bound of the naive matmul over the tiled one's, 1024^3 on H100 SXM,
                                 from the emulator's counts (labkit.kernels.speed_of_light); a published SGEMM series
                                 on an A6000 measured 1.5x at 4096^3 (2,980 against 1,987 GFLOP/s);
  ``modelled_regblock_vs_tiled`` the same for the tiled matmul over the register-blocked one (published: 5.4x, 15,972
                                 against 2,980 GFLOP/s).
"""

from __future__ import annotations

import time

import numpy as np

from .. import kernels as K
from .. import mlp
from ..bench import format_seconds, machine_info, measure, merge_rounds
from ..kernels import backend, time_kernel
from ..kernels import reference as R
from ..kernels import speed_of_light as S
from ..kernels.device_mlp import DeviceMLP, train_device
from ..kernels.matmul import TILE
from ..progress import progress_bar

MODELLED = ("H100 SXM", 1024)  # the GPU and the size of the modelled ratios
TARGETS = {"modelled_tiled_vs_naive": ("in", (1.2, 4.0)), "modelled_regblock_vs_tiled": ("in", (2.0, 8.0)),
           "emulator_matmul256_s": ("<=", 1.0), "warp_overhead_matmul256": ("<=", 1.1), "sgemm_fraction_of_cublas": (">=", 0.5),
           "elementwise_fraction_of_copy": (">=", 0.75), "mnist_epoch_vs_torch": ("<=", 1.5)}


def _timer(xp, fn, repeat: int) -> float:
    """Median seconds per call (after one warm-up), synchronising the GPU around each call."""
    return time_kernel(fn, repeat, backend="emulator" if xp is np else "cupy")


def emulator_part(quick: bool) -> dict:
    """The emulator's matmuls at 256^3 next to numpy, and the key figure."""
    n = 256
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
    rows = []
    for variant in ("naive", "tiled", "regblock"):
        c = K.matmul(a, b, variant=variant, backend="emulator")          # compiles once, and validates
        np.testing.assert_allclose(c, a @ b, rtol=1e-3, atol=1e-3)
        t = _timer(np, lambda v=variant, c=c: K.matmul(a, b, c, variant=v, backend="emulator"), 3 if quick else 5)
        rows.append({"kernel": f"matmul_{variant}", "n": n, "seconds": t, "GFLOPs": 2 * n**3 / t / 1e9})
    t_np = _timer(np, lambda: a @ b, 20)
    rows.append({"kernel": "numpy.matmul", "n": n, "seconds": t_np, "GFLOPs": 2 * n**3 / t_np / 1e9})
    return {"emulator_rows": rows, "emulator_matmul256_s": rows[1]["seconds"], **_warps(a, b, quick)}


WARP_REDUCE = r'''
extern "C" __global__ void warp_reduce(const float* x, float* out, int n)
{
    float v = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v += x[i];
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffff, v, offset);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, v);
}
'''


def modelled_part() -> dict:
    """The three matmuls' speed of light on MODELLED's GPU and size, from counts carried from small launches, and the
    two ratios of their bounds (deterministic: counted once, outside the timed rounds)."""
    on, n = MODELLED
    sol = {v: S.model(S.matmul_counts(v, n)[0], on) for v in ("naive", "tiled", "regblock")}
    rows = [{"kernel": f"matmul_{v}", "n": n, "gpu": on, "seconds": s.bound, "unit": s.unit, "GFLOPs": s.gflops,
             "intensity": s.counts.intensity, "times": s.times} for v, s in sol.items()]
    return {"modelled_rows": rows, "modelled_tiled_vs_naive": sol["naive"].bound / sol["tiled"].bound,
            "modelled_regblock_vs_tiled": sol["tiled"].bound / sol["regblock"].bound}


def _met(value: float, op: str, bound) -> bool:
    if op == "in":
        return bound[0] <= value <= bound[1]
    return value <= bound if op == "<=" else value >= bound


def _warps(a, b, quick: bool) -> dict:
    """What warps cost the emulator: the tiled matmul scheduled warp by warp against the same kernel scheduled as one
    group (medians of interleaved launches), and a warp-shuffle reduction of 10^6 floats."""
    n = a.shape[0]
    c = np.zeros((n, n), np.float32)
    args = (a, b, c, *(np.int32(n),) * 3, np.int32(0), np.int32(0))
    grid, block = (-(-n // TILE), -(-n // TILE)), (TILE, TILE)
    with_warps = K.load_file("matmul", backend="emulator", checked=False).get_function("matmul_tiled")
    before = K.load_file("matmul", backend="emulator", checked=False,
                         defines={"LABKIT_EMU_NO_WARPS": 1}).get_function("matmul_tiled")
    times: dict = {"warps": [], "before": []}
    for _ in range(3 if quick else 7):
        for name, k in (("warps", with_warps), ("before", before)):
            times[name].append(measure(lambda k=k: k(grid, block, args), repeat=1, warmup=0).median)
    np.testing.assert_allclose(c, a @ b, rtol=1e-3, atol=1e-3)
    x = np.random.default_rng(1).random(1_000_000).astype(np.float32)
    total = np.zeros(1, np.float32)
    reduce = K.load(WARP_REDUCE, backend="emulator", checked=False).get_function("warp_reduce")

    def run_reduce():
        total[0] = 0
        reduce((256,), (256,), (x, total, np.int32(x.size)))

    run_reduce()
    np.testing.assert_allclose(total[0], x.sum(dtype=np.float64), rtol=1e-4)
    return {"warp_overhead_matmul256": float(np.median(times["warps"]) / np.median(times["before"])),
            "emulator_warp_reduce_1e6_s": _timer(np, run_reduce, 3 if quick else 7)}


def gpu_part(quick: bool) -> dict:
    """Every kernel on the GPU next to CuPy/cuBLAS, and the copy bandwidths."""
    import cupy as cp

    out: dict = {"gpu_rows": []}
    rows = out["gpu_rows"]
    rep = 5 if quick else 10
    rng = np.random.default_rng(0)
    out.update(_copy_bandwidths(quick, rep))
    out["sgemm_fraction_of_cublas"] = _sgemm(rows, quick, rep, rng)
    z = cp.asarray(rng.standard_normal((8192, 4096) if quick else (16384, 8192)).astype(np.float32))
    out["elementwise_fraction_of_copy"] = _elementwise(rows, z, rep, rng)
    _other_kernels(rows, z, rep, rng)
    return out


def _copy_bandwidths(quick: bool, rep: int) -> dict:
    """Copy bandwidth in GB/s: device-to-device (read + write) and host-to-device."""
    import cupy as cp

    out = {}
    nbytes = (256 if quick else 1024) * 2**20
    src = cp.ones(nbytes // 4, cp.float32)
    dst = cp.empty_like(src)
    t = _timer(cp, lambda: dst.__setitem__(Ellipsis, src), rep)
    out["copy_d2d_GBs"] = 2 * nbytes / t / 1e9
    host = np.ones(nbytes // 4, np.float32)
    t = _timer(cp, lambda: dst.set(host), rep)
    out["copy_h2d_GBs"] = nbytes / t / 1e9
    return out


def _sgemm(rows: list, quick: bool, rep: int, rng) -> float:
    """cuBLAS and every matmul kernel (each validated against cuBLAS first) as rows; the register-blocked one's
    fraction of cuBLAS."""
    import cupy as cp

    n = 2048 if quick else 4096
    a = cp.asarray(rng.standard_normal((n, n)).astype(np.float32))
    b = cp.asarray(rng.standard_normal((n, n)).astype(np.float32))
    c = cp.empty((n, n), cp.float32)
    ref = cp.matmul(a, b)
    t_lib = _timer(cp, lambda: cp.matmul(a, b, out=c), rep)
    rows.append({"kernel": "cupy.matmul (cuBLAS)", "size": f"{n}^3", "seconds": t_lib, "GFLOPs": 2 * n**3 / t_lib / 1e9})
    for variant in ("regblock", "tiled", "naive"):
        K.matmul(a, b, c, variant=variant)
        err = float(cp.abs(c - ref).max() / cp.abs(ref).max())
        if err > 1e-4:
            raise AssertionError(f"matmul_{variant} differs from cuBLAS by {err:.2e} (relative to the largest entry)")
        t = _timer(cp, lambda v=variant: K.matmul(a, b, c, variant=v), rep if variant != "naive" else 3)
        rows.append({"kernel": f"matmul_{variant}", "size": f"{n}^3", "seconds": t, "GFLOPs": 2 * n**3 / t / 1e9,
                     "of_cublas": t_lib / t})
    return t_lib / next(r["seconds"] for r in rows if r["kernel"] == "matmul_regblock")


def _elementwise(rows: list, z, rep: int, rng) -> float:
    """Fused bias + sigmoid (reads z, writes out; bias is small) and a copy of the same bytes as rows; copy time over
    the kernel's."""
    import cupy as cp

    r_, c_ = z.shape
    bias = cp.asarray(rng.standard_normal(c_).astype(np.float32))
    o = cp.empty_like(z)
    K.bias_act_forward(z, bias, o, activation="sigmoid")
    np.testing.assert_allclose(cp.asnumpy(o[:4]), R.bias_act_forward(cp.asnumpy(z[:4]), cp.asnumpy(bias)), rtol=1e-5, atol=1e-6)
    t = _timer(cp, lambda: K.bias_act_forward(z, bias, o, activation="sigmoid"), rep)
    zb = 2 * z.nbytes
    t_copy = _timer(cp, lambda: o.__setitem__(Ellipsis, z), rep)
    rows.append({"kernel": "bias_act_forward (sigmoid)", "size": f"{r_}x{c_}", "seconds": t, "GBs": zb / t / 1e9})
    rows.append({"kernel": "copy (same bytes)", "size": f"{r_}x{c_}", "seconds": t_copy, "GBs": zb / t_copy / 1e9})
    return t_copy / t


def _other_kernels(rows: list, z, rep: int, rng) -> None:
    """The other kernels, for information, as rows: SGD with momentum, sum reductions, a convolution."""
    import cupy as cp

    v = cp.zeros_like(z)
    g = cp.asarray(rng.standard_normal(z.shape).astype(np.float32)) * 1e-3
    t = _timer(cp, lambda: K.sgd_momentum(z, g, v, lr=1e-3, momentum=0.9), rep)
    rows.append({"kernel": "sgd_momentum", "size": f"{z.size}", "seconds": t, "GBs": 5 * z.nbytes / t / 1e9})
    t = _timer(cp, lambda: K.sum_reduce(z), rep)
    rows.append({"kernel": "sum_reduce (atomicAdd)", "size": f"{z.size}", "seconds": t, "GBs": z.nbytes / t / 1e9})
    t2 = _timer(cp, lambda: float(z.sum()), rep)
    rows.append({"kernel": "cupy.sum", "size": f"{z.size}", "seconds": t2, "GBs": z.nbytes / t2 / 1e9})
    x = cp.asarray(rng.standard_normal((256, 1, 28, 28)).astype(np.float32))
    w = cp.asarray(rng.standard_normal((32, 1, 3, 3)).astype(np.float32))
    bb = cp.zeros(32, cp.float32)
    t = _timer(cp, lambda: K.conv2d_relu_forward(x, w, bb, pad=1), rep)
    rows.append({"kernel": "conv2d_relu_forward", "size": "256x1x28x28, 32 3x3", "seconds": t,
                 "GFLOPs": 2 * 256 * 32 * 28 * 28 * 9 / t / 1e9})


def _mnist_epoch(quick: bool) -> dict:
    """One epoch of [784, 1024, 1024, 10] at batch 256: labkit's device step (kernels and cuBLAS) and PyTorch eager."""
    n = 20_000 if quick else 60_000
    rng = np.random.default_rng(0)
    x = rng.random((n, 784)).astype(np.float32)  # the time of an epoch does not depend on the pixel values
    y = rng.integers(0, 10, n)
    sizes = [784, 1024, 1024, 10]
    res: dict = {"mnist_epoch": {"samples": n, "sizes": sizes, "batch": 256}}
    for kind in ("regblock", "library"):
        net = DeviceMLP(mlp.init_params(sizes, seed=0), batch_size=256, cost="cross_entropy", matmul=kind)
        train_device(net, (x[:2560], y[:2560]), epochs=1, lr=0.05, progress=False)  # warm-up: compile, allocate
        h = train_device(net, (x, y), epochs=1, lr=0.05, progress=False)
        res["mnist_epoch"][f"labkit_{kind}_s"] = h.epoch_time[0]
    try:
        import torch
    except ImportError:
        res["mnist_epoch"]["torch_s"] = None
        return res
    dev = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.Sigmoid(), torch.nn.Linear(1024, 1024), torch.nn.Sigmoid(),
                                torch.nn.Linear(1024, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    lossf = torch.nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x).to(dev), torch.from_numpy(y).to(dev)

    def epoch(m):
        perm = torch.randperm(m, device=dev)
        for s in range(0, m, 256):
            idx = perm[s:s + 256]
            opt.zero_grad(set_to_none=True)
            loss = lossf(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
        torch.cuda.synchronize()

    epoch(2560)
    t0 = time.perf_counter()
    epoch(n)
    res["mnist_epoch"]["torch_s"] = time.perf_counter() - t0
    res["mnist_epoch_vs_torch"] = res["mnist_epoch"]["labkit_regblock_s"] / res["mnist_epoch"]["torch_s"]
    res["mnist_epoch_library_vs_torch"] = res["mnist_epoch"]["labkit_library_s"] / res["mnist_epoch"]["torch_s"]
    return res


def run(quick: bool = False, progress: bool | None = None, rounds: int | None = None) -> dict:
    """Run the emulator part always, and the GPU part where CuPy has a device, in interleaved rounds (3, 1 with
    ``quick``): every figure is the median over the rounds, each round's kept under ``rounds``."""
    rounds = (1 if quick else 3) if rounds is None else rounds
    parts = [emulator_part]
    result = {"benchmark": "kernels", "quick": quick, "backend": backend(), "machine": machine_info(),
              "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    if result["backend"] == "cupy":
        import cupy as cp

        result["device"] = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
        parts += [gpu_part, _mnist_epoch]  # gpu_part's arrays are freed before the training runs
    each = [{} for _ in range(rounds)]
    with progress_bar(total=rounds * len(parts), enable=progress, desc="kernel bench", unit="part") as bar:
        for r in range(rounds):
            k = r % len(parts)
            for part in parts[k:] + parts[:k]:
                each[r].update(part(quick))
                bar.update(1)
    result.update(merge_rounds(each))
    result.update(modelled_part())
    result["targets_met"] = {k: _met(result[k], op, v) for k, (op, v) in TARGETS.items() if result.get(k) is not None}
    return result


def report(result: dict) -> str:
    """A table for people."""
    lines = [f"kernel benchmark ({'quick' if result['quick'] else 'full'}; back end {result['backend']}; "
             f"medians of {len(next(iter(result['rounds'].values()), [0]))} interleaved round(s))", "",
             "CPU emulator, 256^3 float32 (for information: the emulator teaches, it does not race):"]
    for r in result["emulator_rows"]:
        lines.append(f"  {r['kernel']:<18} {format_seconds(r['seconds']):>10}  {r['GFLOPs']:8.2f} GFLOP/s")
    rows = result.get("modelled_rows", [])
    if rows:
        lines += ["", f"Speed of light on {rows[0]['gpu']}, {rows[0]['n']}^3, from the emulator's counts (a lower bound):"]
        for r in rows:
            lines.append(f"  {r['kernel']:<18} {format_seconds(r['seconds']):>10}  {r['GFLOPs']:8.0f} GFLOP/s, set by "
                         f"{r['unit']}; {r['intensity']:.3g} FLOP per counted byte")
    if "gpu_rows" in result:
        lines += ["", f"GPU: {result['device']}; copy {result['copy_d2d_GBs']:.0f} GB/s device-to-device, "
                      f"{result['copy_h2d_GBs']:.1f} GB/s host-to-device"]
        for r in result["gpu_rows"]:
            rate = f"{r['GFLOPs']:9.0f} GFLOP/s" if "GFLOPs" in r else f"{r['GBs']:9.0f} GB/s   "
            extra = f"  ({r['of_cublas']:.2f} of cuBLAS)" if "of_cublas" in r else ""
            lines.append(f"  {r['kernel']:<28} {r['size']:>20} {format_seconds(r['seconds']):>10} {rate}{extra}")
        e = result.get("mnist_epoch", {})
        if e:
            torch_s = e.get("torch_s")
            lines.append(f"  MNIST epoch {e['sizes']} batch {e['batch']}: kernels {e['labkit_regblock_s']:.2f} s, "
                         f"kernels + cuBLAS {e['labkit_library_s']:.2f} s, PyTorch "
                         + (f"{torch_s:.2f} s" if torch_s else "not installed"))
    lines.append("")
    for k, (op, bound) in TARGETS.items():
        if k in result and result[k] is not None:
            want = f"in {bound[0]:g}-{bound[1]:g}" if op == "in" else f"{op} {bound:g}"
            lines.append(f"{k} = {result[k]:.3g}  (target {want}: {'met' if result['targets_met'][k] else 'NOT met'})")
    return "\n".join(lines)
