"""Per-sample (network.py style) against vectorised backprop, and against bare matrix products.

Run: ``labkit bench backprop [--quick] [--json]``

In one run, on MNIST (or MNIST-shaped data when it is absent), for [784,30,10] and [784,100,10]
at batch 10 and 100: one epoch of the per-sample reference, the median of several vectorised
epochs, test accuracy after each (they must agree), and the time of only the matrix products
those epochs do. Keys: ``speedup_batch10``, ``speedup_batch100`` (per-sample / vectorised,
[784,30,10]) and ``gemm_ratio`` (vectorised epoch / bare matmuls, [784,100,10], batch 100).
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from .. import mlp
from ..bench import format_seconds, machine_info, measure
from ..data import EmbeddedDataWarning, load_mnist, locate
from ..progress import progress_bar

TARGETS = {"speedup_batch10": (">=", 10.0), "speedup_batch100": (">=", 20.0), "gemm_ratio": ("<=", 2.0)}


def bare_matmul_epoch(sizes, batch: int, n: int, dtype=np.float32, repeat: int = 3):
    """Timing of only the matrix products of one vectorised epoch: forward, weight gradients, deltas."""
    rng = np.random.default_rng(0)
    Ws = [rng.standard_normal((b, a)).astype(dtype) for a, b in zip(sizes[:-1], sizes[1:])]
    acts = [rng.standard_normal((batch, s)).astype(dtype) for s in sizes]
    deltas = [rng.standard_normal((batch, s)).astype(dtype) for s in sizes[1:]]
    outs_f = [np.empty((batch, s), dtype) for s in sizes[1:]]
    outs_g = [np.empty(W.shape, dtype) for W in Ws]
    outs_d = [np.empty((batch, s), dtype) for s in sizes[:-1]]
    n_batches = -(-n // batch)

    def epoch():
        for _ in range(n_batches):
            for i, W in enumerate(Ws):
                np.matmul(acts[i], W.T, out=outs_f[i])  # forward  z = a W^T
            for i in range(len(Ws) - 1, -1, -1):
                np.matmul(deltas[i].T, acts[i], out=outs_g[i])  # gradient delta^T a
                if i:
                    np.matmul(deltas[i], Ws[i], out=outs_d[i])  # delta W (the W^T delta of the course)

    return measure(epoch, repeat=repeat)


def _data(n: int):
    """n training samples and the test set: MNIST when present, else the embedded digits tiled to n."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EmbeddedDataWarning)
        (x, y), test = load_mnist()
    if len(x) < n:
        reps = -(-n // len(x))
        x, y = np.tile(x, (reps, 1)), np.tile(y, reps)
    return (x[:n], y[:n]), test


def run(quick: bool = False, progress: bool | None = None) -> dict:
    """Measure everything; return a JSON-ready dict."""
    n = 5000 if quick else 50000
    vec_epochs = 3 if quick else 5
    (x, y), (xt, yt) = _data(n)
    configs = [(s, b) for s in ([784, 30, 10], [784, 100, 10]) for b in (10, 100)]
    rows = []
    for sizes, batch in progress_bar(configs, enable=progress, desc="backprop bench", unit="config"):
        row = {"sizes": sizes, "batch": batch}
        for method, epochs in (("per_sample", 1), ("vectorised", vec_epochs)):
            params = mlp.init_params(sizes, seed=1)  # the same start for both: the same first epoch
            h = mlp.train(params, (x, y), epochs=epochs, batch_size=batch, lr=3.0, method=method,
                          test_data=(xt, yt), progress=False)
            row[f"{method}_epoch_s"] = float(np.median(h.epoch_time))
            row[f"{method}_accuracy_1_epoch"] = h.test_accuracy[0]
        row["speedup"] = row["per_sample_epoch_s"] / row["vectorised_epoch_s"]
        row["bare_matmul_epoch_s"] = bare_matmul_epoch(sizes, batch, n).median
        row["gemm_ratio"] = row["vectorised_epoch_s"] / row["bare_matmul_epoch_s"]
        rows.append(row)

    def pick(sizes, batch):
        return next(r for r in rows if r["sizes"] == sizes and r["batch"] == batch)

    result = {
        "benchmark": "backprop",
        "quick": quick,
        "samples_per_epoch": n,
        "dtype": "float32",
        "data": locate().describe(),
        "speedup_batch10": pick([784, 30, 10], 10)["speedup"],
        "speedup_batch100": pick([784, 30, 10], 100)["speedup"],
        "gemm_ratio": pick([784, 100, 10], 100)["gemm_ratio"],
        "max_accuracy_gap": max(abs(r["per_sample_accuracy_1_epoch"] - r["vectorised_accuracy_1_epoch"]) for r in rows),
        "rows": rows,
        "machine": machine_info(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    result["targets_met"] = {k: _meets(result[k], *TARGETS[k]) for k in TARGETS}
    return result


def _meets(value: float, op: str, bound: float) -> bool:
    return value >= bound if op == ">=" else value <= bound


def report(result: dict) -> str:
    """A table for people."""
    m = result["machine"]
    lines = [f"backprop benchmark ({'quick' if result['quick'] else 'full'}, {result['samples_per_epoch']} samples/epoch, "
             f"{result['dtype']}, {m.get('blas', '?')} with {m.get('blas_threads', '?')} threads)",
             f"data: {result['data']}", "",
             f"{'network':<14}{'batch':>6}{'per-sample':>12}{'vectorised':>12}{'speedup':>9}{'matmuls':>10}"
             f"{'vec/mm':>8}{'acc p-s':>9}{'acc vec':>9}"]
    for r in result["rows"]:
        lines.append(
            f"{str(r['sizes']):<14}{r['batch']:>6}{format_seconds(r['per_sample_epoch_s']):>12}"
            f"{format_seconds(r['vectorised_epoch_s']):>12}{r['speedup']:>8.1f}x{format_seconds(r['bare_matmul_epoch_s']):>10}"
            f"{r['gemm_ratio']:>8.2f}{r['per_sample_accuracy_1_epoch']:>9.2%}{r['vectorised_accuracy_1_epoch']:>9.2%}"
        )
    lines.append("")
    for k, (op, bound) in TARGETS.items():
        ok = "met" if result["targets_met"][k] else "NOT met"
        lines.append(f"{k} = {result[k]:.2f}  (target {op} {bound:g}: {ok})")
    return "\n".join(lines)
