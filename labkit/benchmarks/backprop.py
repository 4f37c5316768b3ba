"""Per-sample (network.py style) against vectorised backprop, against bare matrix products, and against network.py.

Run: ``labkit bench backprop [--quick] [--json]``

On MNIST (or MNIST-shaped data when it is absent), for [784,30,10] and [784,100,10] at batch 10 and 100: one
epoch of the per-sample reference, one vectorised epoch, test accuracy after each first epoch (they must agree),
and the time of only the matrix products such an epoch does; and network.py's own training loop, re-implemented
here line for line (:class:`NetworkPy`), on the same samples. Every timed job runs once per round, the rounds
interleaved (3, 1 with ``--quick``), and each figure is the median over the rounds, every round kept.

Keys: ``speedup_batch10``, ``speedup_batch100`` (per-sample / vectorised epoch, [784,30,10]), ``gemm_ratio``
(vectorised epoch / bare matmuls, [784,100,10], batch 100) and ``per_sample_vs_networkpy`` (labkit's per-sample
epoch / network.py's, [784,30,10], batch 10, eta 3: lab 01's speedups are measured against this baseline, so it must
be at least as fast as the program it stands for).
"""

from __future__ import annotations

import time

import numpy as np

from .. import mlp
from ..bench import format_seconds, interleaved, machine_info, measure
from ..data import load_mnist, locate
from ..progress import progress_bar

TARGETS = {"speedup_batch10": (">=", 10.0), "speedup_batch100": (">=", 20.0), "gemm_ratio": ("<=", 2.0),
           "per_sample_vs_networkpy": ("<=", 1.0)}


class NetworkPy:
    """network.py's sigmoid network and mini-batch SGD as the book's program runs them: float64 weights drawn from
    N(0, 1), samples as (784, 1) columns, one backprop per sample whose gradients are summed into new lists, then
    ``w - (eta / m) nabla_w``. Written here to time the program labkit's per-sample baseline stands for."""

    def __init__(self, sizes, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.sizes = list(sizes)
        self.biases = [rng.standard_normal((n, 1)) for n in sizes[1:]]
        self.weights = [rng.standard_normal((n, m)) for m, n in zip(sizes[:-1], sizes[1:])]

    @staticmethod
    def sigmoid(z):
        return 1.0 / (1.0 + np.exp(-z))

    def sigmoid_prime(self, z):
        return self.sigmoid(z) * (1 - self.sigmoid(z))

    def update_mini_batch(self, batch, eta: float) -> None:
        nabla_b = [np.zeros(b.shape) for b in self.biases]
        nabla_w = [np.zeros(w.shape) for w in self.weights]
        for x, y in batch:
            delta_b, delta_w = self.backprop(x, y)
            nabla_b = [nb + dnb for nb, dnb in zip(nabla_b, delta_b)]
            nabla_w = [nw + dnw for nw, dnw in zip(nabla_w, delta_w)]
        self.weights = [w - (eta / len(batch)) * nw for w, nw in zip(self.weights, nabla_w)]
        self.biases = [b - (eta / len(batch)) * nb for b, nb in zip(self.biases, nabla_b)]

    def backprop(self, x, y):
        nabla_b = [np.zeros(b.shape) for b in self.biases]
        nabla_w = [np.zeros(w.shape) for w in self.weights]
        activation, activations, zs = x, [x], []
        for b, w in zip(self.biases, self.weights):
            z = np.dot(w, activation) + b
            zs.append(z)
            activation = self.sigmoid(z)
            activations.append(activation)
        delta = (activations[-1] - y) * self.sigmoid_prime(zs[-1])
        nabla_b[-1] = delta
        nabla_w[-1] = np.dot(delta, activations[-2].transpose())
        for layer in range(2, len(self.sizes)):
            delta = np.dot(self.weights[-layer + 1].transpose(), delta) * self.sigmoid_prime(zs[-layer])
            nabla_b[-layer] = delta
            nabla_w[-layer] = np.dot(delta, activations[-layer - 1].transpose())
        return nabla_b, nabla_w

    def epoch(self, data: list, batch_size: int, eta: float, seed: int = 0) -> float:
        """One epoch of SGD over ``data`` (a list of (x, y) columns) in shuffled mini-batches; its seconds."""
        data = list(data)
        np.random.default_rng(seed).shuffle(data)
        t0 = time.perf_counter()
        for k in range(0, len(data), batch_size):
            self.update_mini_batch(data[k:k + batch_size], eta)
        return time.perf_counter() - t0


def networkpy_data(x, y, classes: int = 10) -> list:
    """Samples as network.py's loader gives them: (784, 1) float32 columns and one-hot (10, 1) float64 targets."""
    eye = np.eye(classes)
    return [(xi.reshape(-1, 1), eye[yi].reshape(-1, 1)) for xi, yi in zip(x, y)]


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
    """n training samples and the test set: MNIST when present, else the shipped subset tiled to n."""
    (x, y), test = load_mnist(quiet=True)
    if len(x) < n:
        reps = -(-n // len(x))
        x, y = np.tile(x, (reps, 1)), np.tile(y, reps)
    return (x[:n], y[:n]), test


def run(quick: bool = False, progress: bool | None = None, rounds: int | None = None) -> dict:
    """Measure everything in interleaved rounds; return a JSON-ready dict."""
    n = 5000 if quick else 50000
    rounds = (1 if quick else 3) if rounds is None else rounds
    (x, y), (xt, yt) = _data(n)
    configs = [(s, b) for s in ([784, 30, 10], [784, 100, 10]) for b in (10, 100)]
    accuracy: dict[str, float] = {}
    jobs = _jobs(configs, x, y, (xt, yt), n, accuracy)
    bar = progress_bar(total=rounds * len(jobs), enable=progress, desc="backprop bench", unit="job")
    with bar:
        timed = interleaved({k: (lambda f=f: (f(), bar.update(1))[0]) for k, f in jobs.items()}, rounds)
    rows = [_row(timed, accuracy, sizes, batch) for sizes, batch in configs]
    return _result(quick, rounds, n, timed, rows)


def _epoch_job(method: str, sizes, batch: int, x, y, test, accuracy: dict):
    """A job: one epoch of ``method`` from the same start, its seconds; the test accuracy after it goes in ``accuracy``."""
    def job() -> float:
        params = mlp.init_params(sizes, seed=1)  # the same start for both methods: the same first epoch
        h = mlp.train(params, (x, y), epochs=1, batch_size=batch, lr=3.0, method=method, test_data=test,
                      progress=False)
        accuracy.setdefault(f"{method} {sizes} {batch}", h.test_accuracy[0])
        return h.epoch_time[0]
    return job


def _jobs(configs, x, y, test, n: int, accuracy: dict) -> dict:
    """Per configuration the per-sample epoch, the vectorised one and the bare matmuls; then network.py's epoch."""
    jobs = {}
    for sizes, batch in configs:
        for method in ("per_sample", "vectorised"):
            jobs[f"{method} {sizes} {batch}"] = _epoch_job(method, sizes, batch, x, y, test, accuracy)
        jobs[f"matmuls {sizes} {batch}"] = lambda sizes=sizes, batch=batch: bare_matmul_epoch(sizes, batch, n, repeat=1).median
    samples = networkpy_data(x, y)
    jobs["network.py [784, 30, 10] 10"] = lambda: NetworkPy([784, 30, 10], seed=1).epoch(samples, 10, 3.0)
    return jobs


def _row(timed: dict, accuracy: dict, sizes, batch: int) -> dict:
    """One configuration's row: the median epochs, the ratios within rounds, the accuracies, every round."""
    key = f"{sizes} {batch}"
    ps, vec, mm = (timed[f"{m} {key}"] for m in ("per_sample", "vectorised", "matmuls"))
    return {"sizes": sizes, "batch": batch, "per_sample_epoch_s": ps.median, "vectorised_epoch_s": vec.median,
            "bare_matmul_epoch_s": mm.median,
            "speedup": float(np.median(np.array(ps.times) / np.array(vec.times))),
            "gemm_ratio": float(np.median(np.array(vec.times) / np.array(mm.times))),
            "per_sample_accuracy_1_epoch": accuracy[f"per_sample {key}"],
            "vectorised_accuracy_1_epoch": accuracy[f"vectorised {key}"],
            "rounds_s": {m: timed[f"{m} {key}"].times for m in ("per_sample", "vectorised", "matmuls")}}


def _result(quick: bool, rounds: int, n: int, timed: dict, rows: list) -> dict:
    """The JSON-ready dict: the key figures from the rows, labkit's per-sample epoch against network.py's, the targets."""
    def pick(sizes, batch):
        return next(r for r in rows if r["sizes"] == sizes and r["batch"] == batch)

    ours, theirs = timed["per_sample [784, 30, 10] 10"], timed["network.py [784, 30, 10] 10"]
    per_round = (np.array(ours.times) / np.array(theirs.times)).tolist()
    result = {
        "benchmark": "backprop",
        "quick": quick,
        "rounds": rounds,
        "samples_per_epoch": n,
        "dtype": "float32",
        "data": locate().describe(),
        "speedup_batch10": pick([784, 30, 10], 10)["speedup"],
        "speedup_batch100": pick([784, 30, 10], 100)["speedup"],
        "gemm_ratio": pick([784, 100, 10], 100)["gemm_ratio"],
        "per_sample_vs_networkpy": float(np.median(per_round)),
        "networkpy": {"epoch_s": theirs.median, "rounds_s": theirs.times, "per_sample_epoch_s": ours.median,
                      "ratio_per_round": per_round, "us_per_sample_networkpy": theirs.median / n * 1e6,
                      "us_per_sample_labkit": ours.median / n * 1e6},
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
             f"{result['dtype']}, {m.get('blas', '?')} with {m.get('blas_threads', '?')} threads, "
             f"median of {result['rounds']} interleaved round(s))",
             f"data: {result['data']}", "",
             f"{'network':<14}{'batch':>6}{'per-sample':>12}{'vectorised':>12}{'speedup':>9}{'matmuls':>10}"
             f"{'vec/mm':>8}{'acc p-s':>9}{'acc vec':>9}"]
    for r in result["rows"]:
        lines.append(
            f"{str(r['sizes']):<14}{r['batch']:>6}{format_seconds(r['per_sample_epoch_s']):>12}"
            f"{format_seconds(r['vectorised_epoch_s']):>12}{r['speedup']:>8.1f}x{format_seconds(r['bare_matmul_epoch_s']):>10}"
            f"{r['gemm_ratio']:>8.2f}{r['per_sample_accuracy_1_epoch']:>9.2%}{r['vectorised_accuracy_1_epoch']:>9.2%}"
        )
    npy = result["networkpy"]
    lines.append(f"\nnetwork.py's own loop, [784,30,10], batch 10: {npy['us_per_sample_networkpy']:.1f} µs per sample; "
                 f"labkit's per-sample epoch {npy['us_per_sample_labkit']:.1f} µs per sample")
    lines.append("")
    for k, (op, bound) in TARGETS.items():
        ok = "met" if result["targets_met"][k] else "NOT met"
        lines.append(f"{k} = {result[k]:.2f}  (target {op} {bound:g}: {ok})")
    return "\n".join(lines)
