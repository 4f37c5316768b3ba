"""Gradient compression: send fewer bytes per step, and keep what was dropped for later (error feedback).

* quantisation: :func:`to_float16`; :func:`to_int8` with one scale per tensor and *stochastic rounding*
  (round up with probability equal to the fraction), so the rounding is unbiased on average;
* sparsification: :func:`top_k` keeps the k largest magnitudes, :func:`threshold` those above tau;
* :class:`ErrorFeedback` adds back, at the next step, what the compressor dropped;
* the lab 10 exercises' reference solutions, on plain arrays: :func:`int8_nearest` (per-tensor scale, nearest
  rounding), :func:`top_k_indices` (the k largest magnitudes), :func:`sparse_sum` (every rank's pieces, summed)
  and :func:`top_k_with_feedback`; :func:`table` prints what each method costs one gradient;
* :class:`CompressedAllreduce` is an allreduce for :class:`labkit.data_parallel.DataParallel`: every rank
  compresses its gradient, the compressed pieces are exchanged with an allgather (sparse ones as index and
  value lists of different lengths), and every rank sums them. It counts the bytes each rank sends;
* :func:`bytes_per_step` models the bytes that reach one rank per step, dense ring against top-k (the lab 10
  exercise), and :func:`time_to_accuracy`, run on every rank by :meth:`labkit.network.Wire.run`, trains dense and
  top-k across a cable that costs and times how soon each reaches an accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from . import mlp
from .data import load_mnist
from .data_parallel import DataParallel


@dataclass
class Compressed:
    """A compressed 1-D gradient: ``kind`` plus the arrays that travel, and what is needed to expand it."""

    kind: str
    size: int
    dtype: np.dtype
    parts: dict = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes on the wire (every array that travels, scales included)."""
        return int(sum(np.asarray(a).nbytes for a in self.parts.values()))

    def decompress(self) -> np.ndarray:
        """The dense gradient this stands for."""
        out = np.zeros(self.size, dtype=self.dtype)
        if self.kind == "float16":
            out[:] = self.parts["values"]
        elif self.kind == "int8":
            out[:] = self.parts["values"].astype(self.dtype) * self.parts["scale"][0]
        else:  # sparse
            out[self.parts["indices"]] = self.parts["values"]
        return out


def _flat(g: np.ndarray) -> np.ndarray:
    g = np.asarray(g)
    if g.ndim != 1:
        raise ValueError(f"compress 1-D gradient buffers (flatten first), got shape {g.shape}")
    if g.dtype.kind != "f":
        raise TypeError(f"gradients must be floating point, got {g.dtype}")
    return g


def to_float16(g: np.ndarray) -> Compressed:
    """Half precision: 2 bytes per value (overflows above 65504, so scale huge gradients first)."""
    g = _flat(g)
    return Compressed("float16", g.size, g.dtype, {"values": g.astype(np.float16)})


def to_int8(g: np.ndarray, rng: np.random.Generator | None = None) -> Compressed:
    """int8 with scale max|g|/127 and stochastic rounding: E[decompress] = g."""
    g = _flat(g)
    rng = rng or np.random.default_rng()
    peak = float(np.abs(g).max()) if g.size else 0.0
    scale = peak / 127 if peak > 0 else 1.0
    q = np.floor(g / scale + rng.random(g.size, dtype=np.float32 if g.dtype == np.float32 else np.float64))
    q = np.clip(q, -127, 127).astype(np.int8)
    return Compressed("int8", g.size, g.dtype, {"values": q, "scale": np.array([scale], dtype=np.float32)})


def top_k(g: np.ndarray, ratio: float) -> Compressed:
    """The ceil(ratio * n) entries of largest magnitude, as int32 indices and their values."""
    g = _flat(g)
    if not 0 < ratio <= 1:
        raise ValueError(f"ratio must be in (0, 1], got {ratio}")
    k = min(g.size, max(1, math.ceil(ratio * g.size))) if g.size else 0
    idx = np.argpartition(np.abs(g), g.size - k)[g.size - k:] if k else np.zeros(0, dtype=np.int64)
    idx = np.sort(idx).astype(np.int32)
    return Compressed("sparse", g.size, g.dtype, {"indices": idx, "values": g[idx]})


def threshold(g: np.ndarray, tau: float) -> Compressed:
    """The entries with |g| >= tau (how many depends on the gradient)."""
    g = _flat(g)
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    idx = np.flatnonzero(np.abs(g) >= tau).astype(np.int32)
    return Compressed("sparse", g.size, g.dtype, {"indices": idx, "values": g[idx]})


def table(g: np.ndarray, methods: dict[str, Compressed]) -> dict[str, dict]:
    """Print, and return by name, what each compressed version of ``g`` costs: ``bytes`` on the wire, ``share`` of the
    dense bytes, and the relative ``error`` ||decompressed - g|| / ||g||; the dense float32 row comes first."""
    g = _flat(g)
    norm = float(np.linalg.norm(g)) or 1.0
    rows = {f"{g.dtype} (dense)": dict(bytes=g.nbytes, share=1.0, error=0.0)}
    for name, c in methods.items():
        rows[name] = dict(bytes=c.nbytes, share=c.nbytes / g.nbytes,
                          error=float(np.linalg.norm(c.decompress() - g)) / norm)
    print(f"{'method':18s} {'bytes':>9s} {'of dense':>9s} {'relative error':>15s}")
    for name, r in rows.items():
        print(f"{name:18s} {r['bytes']:9d} {r['share']:9.2%} {r['error']:15.4f}")
    return rows


def int8_nearest(g: np.ndarray) -> tuple[np.ndarray, float]:
    """int8 with the finest scale that fits, max|g| / 127, rounded to the nearest step: ``(q, scale)``, g ~ q * scale.

    The lab 10 exercise (each entry within half a step of g); training uses :func:`to_int8`, rounded stochastically.
    An all-zero gradient gets scale 1.0.
    """
    g = _flat(g)
    peak = float(np.abs(g).max()) if g.size else 0.0
    scale = peak / 127 if peak > 0 else 1.0
    q = np.clip(np.rint(g / scale), -127, 127).astype(np.int8)
    return q, scale


def top_k_indices(g: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The indices of the ``k`` entries of largest magnitude (all of them when k >= n, none when k = 0), and g there."""
    g = _flat(g)
    k = max(0, min(int(k), g.size))
    idx = np.argpartition(np.abs(g), g.size - k)[g.size - k:] if k else np.zeros(0, dtype=np.int64)
    return idx, g[idx]


def sparse_sum(pieces, n: int) -> np.ndarray:
    """The dense sum, ``n`` entries, of every rank's sparse piece ``(indices, values)``: what each rank computes once the
    allgather has brought it everyone's pieces. Two ranks may send the same index; both values count."""
    dtype = np.result_type(*[np.asarray(v).dtype for _, v in pieces]) if pieces else np.float64
    out = np.zeros(int(n), dtype=dtype)
    for indices, values in pieces:
        np.add.at(out, np.asarray(indices), np.asarray(values))
    return out


def top_k_with_feedback(g: np.ndarray, residual: np.ndarray, ratio: float):
    """Top-k of ``g + residual`` with k = max(1, ceil(ratio * n)): ``(indices, values, new_residual)``, the new
    residual being ``g + residual`` with the sent entries zeroed (the lab 10 exercise; see :class:`ErrorFeedback`)."""
    corrected = _flat(g) + residual
    k = min(corrected.size, max(1, math.ceil(ratio * corrected.size)))
    idx, values = top_k_indices(corrected, k)
    left = corrected.copy()
    left[idx] = 0
    return idx, values, left


class ErrorFeedback:
    """Wraps a compressor: compress (gradient + residual), keep the new residual = what was not sent."""

    def __init__(self, compress: Callable[[np.ndarray], Compressed]):
        self.compress = compress
        self.residual: np.ndarray | None = None

    def __call__(self, g: np.ndarray) -> Compressed:
        g = _flat(g)
        if self.residual is None or self.residual.shape != g.shape:
            self.residual = np.zeros_like(g)
        corrected = g + self.residual
        c = self.compress(corrected)
        self.residual = corrected - c.decompress()
        return c


def sparse_allreduce(comm, indices: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """Sum of every rank's sparse vector (indices, values) as a dense array of ``size``, via two allgathers."""
    from mpi4py import MPI

    counts = np.array(comm.allgather(int(len(indices))), dtype=np.int64)
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
    all_idx = np.empty(int(counts.sum()), dtype=np.int32)
    all_val = np.empty(int(counts.sum()), dtype=values.dtype)
    comm.Allgatherv(np.ascontiguousarray(indices, dtype=np.int32), [all_idx, counts, displs, MPI.INT32_T])
    comm.Allgatherv(np.ascontiguousarray(values), [all_val, counts, displs, MPI._typedict[values.dtype.char]])
    out = np.zeros(size, dtype=values.dtype)
    np.add.at(out, all_idx, all_val)  # indices repeat across ranks: add, do not overwrite
    return out


class _SparsifyWithResidual:
    """Adapts ``f(g, residual, ratio) -> (indices, values, residual)`` to a compressor, keeping the residual."""

    def __init__(self, f: Callable, ratio: float):
        self.f, self.ratio, self.residual = f, ratio, None

    def __call__(self, g: np.ndarray) -> Compressed:
        g = _flat(g)
        if self.residual is None or self.residual.shape != g.shape:
            self.residual = np.zeros_like(g)
        idx, values, residual = self.f(g, self.residual, self.ratio)
        idx, values = np.asarray(idx), np.asarray(values)
        if idx.shape != values.shape or idx.ndim != 1 or np.shape(residual) != g.shape:
            raise ValueError(f"the sparsifier must return 1-D indices and values of one length and a residual of shape "
                             f"{g.shape}; got {idx.shape}, {values.shape} and {np.shape(residual)}")
        self.residual = np.asarray(residual, dtype=g.dtype)
        return Compressed("sparse", g.size, g.dtype, {"indices": idx.astype(np.int32), "values": values.astype(g.dtype)})


class CompressedAllreduce:
    """``f(comm, x, op=SUM) -> sum over ranks of decompress(compress(x))``, for DataParallel(allreduce=f).

    ``method``: "float16", "int8", "topk" (with ``ratio``) or "threshold" (with ``tau``).
    ``error_feedback`` keeps each rank's dropped part and adds it to its next gradient.
    ``sparsify``, a function ``(g, residual, ratio) -> (indices, values, new residual)`` (the lab 10 exercise),
    replaces top-k and error feedback; its residual is kept between steps.
    :attr:`bytes_sent` and :attr:`bytes_dense` count what this rank sent and would have sent uncompressed.
    """

    METHODS = ("float16", "int8", "topk", "threshold")

    def __init__(self, method: str = "topk", ratio: float = 0.01, tau: float = 1e-3, error_feedback: bool = True,
                 seed: int = 0, sparsify: Callable | None = None):
        if method not in self.METHODS:
            raise ValueError(f"method must be one of {self.METHODS}, got {method!r}")
        rng = np.random.default_rng(seed)
        compress = {"float16": to_float16, "int8": lambda g: to_int8(g, rng),
                    "topk": lambda g: top_k(g, ratio), "threshold": lambda g: threshold(g, tau)}[method]
        self.method, self.ratio, self.tau = method, ratio, tau
        self._compress = ErrorFeedback(compress) if error_feedback else compress
        if sparsify is not None:
            self.method, self._compress = "topk", _SparsifyWithResidual(sparsify, ratio)
        self.bytes_sent = self.bytes_dense = 0
        self.__name__ = f"compressed_{method}"

    @property
    def compression_ratio(self) -> float:
        """Bytes sent / bytes an uncompressed exchange would send (smaller is better)."""
        return self.bytes_sent / self.bytes_dense if self.bytes_dense else 1.0

    def __call__(self, comm, x: np.ndarray, op=None) -> np.ndarray:
        from mpi4py import MPI

        if op is not None and op != MPI.SUM:
            raise ValueError("compressed allreduce only sums")
        c = self._compress(x)
        self.bytes_sent += c.nbytes
        self.bytes_dense += x.nbytes
        if c.kind == "sparse":
            return sparse_allreduce(comm, c.parts["indices"], c.parts["values"], x.size).astype(x.dtype, copy=False)
        p = comm.Get_size()
        values = c.parts["values"]
        everyone = np.empty((p, values.size), dtype=values.dtype)
        comm.Allgather(values, everyone)  # every rank's quantised vector, as it travels
        if c.kind == "float16":
            return everyone.astype(x.dtype).sum(axis=0)
        scales = np.empty(p, dtype=np.float32)
        comm.Allgather(c.parts["scale"], scales)
        return (everyone.astype(x.dtype) * scales[:, None].astype(x.dtype)).sum(axis=0)


def bytes_per_step(n: int, k: int, p: int) -> tuple[float, float]:
    """The bytes one rank's cable carries *into* the rank in one step, ``(dense, topk)``, for a float32 gradient of
    ``n`` entries on ``p`` ranks (the lab 10 exercise; 0 and 0 on one rank):

    * ``dense``, labkit's ring allreduce: a reduce-scatter, then an allgather, p - 1 messages each, every message one
      block of n / p float32 entries: 2(p - 1)/p * 4n bytes. Where p does not divide n the blocks differ by one entry;
      the model keeps the exact n / p;
    * ``topk``, top-k with ``k`` entries per rank exchanged by two allgathers (:func:`sparse_allreduce`): every rank
      receives the k int32 indices and k float32 values of each of the p - 1 other ranks, (p - 1) * 8k bytes.
      The small allgather of the counts (one integer per rank) is left out.
    """
    n, k, p = float(n), float(k), int(p)
    if p < 1:
        raise ValueError(f"p must be at least 1, got {p}")
    return 2 * (p - 1) / p * 4 * n, (p - 1) * 8 * k


def time_to_accuracy(comm, samples: int, epochs: int, ratio: float = 0.01) -> dict:
    """Dense against top-k on every rank of ``comm`` (for :meth:`labkit.network.Wire.run`): [784,100,10] trained
    by :class:`~labkit.data_parallel.DataParallel` on the first ``samples`` MNIST images, batch 64, lr 0.05, momentum
    0.9: ``"dense"`` with the ring allreduce for ``epochs`` epochs, ``"topk"`` (top-k of ``ratio`` with error feedback,
    :class:`CompressedAllreduce`) for twice as many.

    For each: ``accuracy`` (test accuracy after each epoch), ``seconds`` (training time so far after each epoch, by the
    slowest rank's clock), ``comm_ms`` (this rank's exchange per step, compression included, in ms) and
    ``bytes_per_step`` (what :func:`bytes_per_step` says reaches a rank). Also ``target`` (dense's final accuracy),
    ``topk_seconds`` (top-k's training time until it first reached it, None if never) and ``share`` (that over dense's
    training time; inf if never). Plain lists and floats, the same on every rank.
    """
    from mpi4py import MPI

    (x, y), test = load_mnist(quiet=True)  # the notebook that runs this says which data set it used
    x, y = x[:samples], y[:samples]
    p = comm.Get_size()
    out: dict = {"p": p, "samples": len(x), "ratio": ratio}
    for name, n_epochs in (("dense", epochs), ("topk", 2 * epochs)):
        params = mlp.init_params([784, 100, 10], seed=0, init="he")
        dp = DataParallel(comm, allreduce="ring" if name == "dense" else CompressedAllreduce("topk", ratio=ratio))
        h = mlp.train(params, (x, y), epochs=n_epochs, batch_size=64, lr=0.05, momentum=0.9, activation="relu",
                      cost="cross_entropy", method=dp, test_data=test, progress=False)
        slowest = np.empty(len(h.epoch_time))
        comm.Allreduce(np.array(h.epoch_time, dtype=float), slowest, op=MPI.MAX)
        n = sum(W.size + b.size for W, b in params)
        dense, topk = bytes_per_step(n, min(n, max(1, math.ceil(ratio * n))), p)
        out[name] = {"epochs": n_epochs, "accuracy": [float(a) for a in h.test_accuracy],
                     "seconds": np.cumsum(slowest).tolist(), "comm_ms": dp.comm_seconds / max(dp.steps, 1) * 1e3,
                     "bytes_per_step": dense if name == "dense" else topk}
    target = out["dense"]["accuracy"][-1]
    reached = [t for t, a in zip(out["topk"]["seconds"], out["topk"]["accuracy"]) if a >= target]
    out.update(target=target, topk_seconds=reached[0] if reached else None,
               share=reached[0] / out["dense"]["seconds"][-1] if reached else math.inf)
    return out
