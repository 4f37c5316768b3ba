"""Synchronous data-parallel SGD over MPI: every rank backprops its shard, an allreduce sums the gradients.

Every rank runs the ordinary training loop, ``mlp.train(params, data, method=DataParallel(comm))``, with
the same data and seed, so every rank sees the same global mini-batch. :class:`DataParallel` backprops
only this rank's shard of it (floor(n/p) samples, the first n % p ranks one more), sums gradients and
losses over the ranks with the chosen allreduce, and returns the mean gradient of the *global* batch:
every rank applies the same update and the weights stay identical, equal to a serial run's.

``fused=True`` packs all gradients (and the loss) into one buffer and does one allreduce, as Horovod's
tensor fusion does; ``fused=False`` does one allreduce per weight array and bias. Time spent computing
and communicating is accumulated in :attr:`DataParallel.compute_seconds` and :attr:`comm_seconds`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from . import mlp
from .cpu_parallel import shard_bounds


def flatten(grads: mlp.Params, extra: tuple[float, ...] = ()) -> np.ndarray:
    """All arrays of a params-like list (then ``extra`` scalars) as one contiguous 1-D buffer."""
    parts = [a.reshape(-1) for pair in grads for a in pair]
    dtype = grads[0][0].dtype
    if extra:
        parts.append(np.asarray(extra, dtype=dtype))
    return np.concatenate(parts)


def unflatten(vec: np.ndarray, like: mlp.Params) -> mlp.Params:
    """Views into ``vec`` shaped like ``like`` (the inverse of :func:`flatten` without its extras)."""
    out, pos = [], 0
    for W, b in like:
        gW = vec[pos:pos + W.size].reshape(W.shape)
        pos += W.size
        gb = vec[pos:pos + b.size]
        pos += b.size
        out.append((gW, gb))
    return out


def _allreduce_fn(allreduce) -> Callable | None:
    from . import collectives

    if callable(allreduce):
        return allreduce
    if allreduce == "shm":
        return None  # DataParallel keeps a SharedMemoryAllreduce for its buffer
    if allreduce == "nccl":
        raise ValueError("allreduce='nccl' needs CuPy arrays on GPUs; the NumPy path uses 'ring' or 'mpi'")
    if allreduce not in collectives.ALLREDUCES:
        raise ValueError(f"allreduce must be one of {', '.join(collectives.ALLREDUCES)}, shm or a function, "
                         f"got {allreduce!r}")
    return collectives.ALLREDUCES[allreduce]


class DataParallel:
    """A drop-in for :func:`labkit.mlp.loss_and_grads` that splits each batch over the ranks of ``comm``.

    ``allreduce`` is ``"ring"`` (labkit's), ``"mpi"`` (the library's), another name from
    ``labkit.collectives.ALLREDUCES``, ``"shm"`` (ranks on one machine: every rank backprops straight into
    an MPI shared-memory window and the sum is read from it, :class:`labkit.collectives.SharedMemoryAllreduce`;
    call :meth:`close` when done), or any function ``f(comm, x, op) -> summed array`` (a compressed allreduce,
    say). Every rank must call it with the same batch.
    """

    def __init__(self, comm, allreduce="ring", fused: bool = True, timeout: float | None = None):
        self.comm = comm
        self.allreduce_name = allreduce if isinstance(allreduce, str) else getattr(allreduce, "__name__", "custom")
        self._allreduce = _allreduce_fn(allreduce)
        self._builtin = isinstance(allreduce, str)
        if not self._builtin and not fused:
            raise ValueError("a custom allreduce needs fused=True (one buffer, so compression state stays per buffer)")
        if allreduce == "shm" and not fused:
            raise ValueError("allreduce='shm' works on one fused buffer: use fused=True")
        self.fused, self.timeout = fused, timeout
        self.compute_seconds = self.comm_seconds = 0.0
        self.steps = 0
        self._key = self._flat = self._views = None
        self._shm = self._sum_views = None
        self.timeline = None  # a labkit.bench.Timeline: each step's backprop and allreduce phases are recorded in it

    def close(self) -> None:
        """Free the shared-memory window of ``allreduce="shm"`` (collective; nothing to do otherwise)."""
        if self._shm is not None:
            self._shm.free()
            self._shm = None
            self._key = None

    def __repr__(self) -> str:
        return (f"DataParallel(ranks={self.comm.Get_size()}, allreduce={self.allreduce_name!r}, "
                f"fused={self.fused})")

    def _sum_inplace(self, a: np.ndarray) -> None:
        """Replace ``a`` by its sum over the ranks."""
        from mpi4py import MPI

        if not self._builtin:
            a[...] = self._allreduce(self.comm, a, MPI.SUM)
            return
        kw = {"out": a} if self.allreduce_name in ("ring", "mpi") else {}  # these two can work in place
        res = self._allreduce(self.comm, a, MPI.SUM, check=False, timeout=self.timeout, **kw)
        if res is not a:
            a[...] = res

    def _buffer(self, params):
        """One flat buffer (all gradients, then the loss) and params-shaped views into it, reused every step."""
        key = (tuple((W.shape, b.shape) for W, b in params), params[0][0].dtype)
        if key != self._key:
            size = sum(W.size + b.size for W, b in params)
            if self.allreduce_name == "shm":
                from .collectives import SharedMemoryAllreduce

                self.close()
                self._shm = SharedMemoryAllreduce(self.comm, size + 1, params[0][0].dtype, self.timeout)
                self._flat = self._shm.mine  # backprop writes straight into shared memory
                self._sum_views = unflatten(self._shm.result[:-1], params)
            else:
                self._flat = np.empty(size + 1, dtype=params[0][0].dtype)
            self._views = unflatten(self._flat[:-1], params)
            self._key = key
        return self._flat, self._views

    def __call__(self, params, x, y, activation="sigmoid", cost="quadratic", l2=0.0):
        """(mean loss, mean gradients) of the global batch; the gradients are views into a buffer reused next step
        (with ``"shm"``, one buffer shared by all ranks: read it, do not change it)."""
        Y = mlp.check_batch(params, x, y)
        n = x.shape[0]
        lo, hi = shard_bounds(n, self.comm.Get_size())[self.comm.Get_rank()]
        flat, grads = self._buffer(params)
        t0 = time.perf_counter()
        if hi > lo:  # my shard's share of the global mean, written straight into the buffer
            flat[-1], _ = mlp._loss_and_grads(params, x[lo:hi], Y[lo:hi], activation, cost, 0.0, scale=1.0 / n, out=grads)
        else:
            flat[:] = 0
        t1 = time.perf_counter()
        if self._shm is not None:
            if l2 and self.comm.Get_rank() == 0:  # the shared sum must not be changed afterwards: add l2 W once, here
                for (gW, _), (W, _) in zip(grads, params):
                    gW += l2 * W
            flat, grads = self._shm.reduce(), self._sum_views  # the sum, read where every rank can see it
        elif self.fused and self._builtin:
            self._sum_inplace(flat)
        elif self.fused:  # a custom (e.g. compressed) allreduce gets the gradients only; the loss is summed exactly
            self._sum_inplace(flat[:-1])
            flat[-1] = self.comm.allreduce(float(flat[-1]))
        else:
            for gW, gb in grads:
                self._sum_inplace(gW)
                self._sum_inplace(gb)
            self._sum_inplace(flat[-1:])
        t2 = time.perf_counter()
        self.compute_seconds += t1 - t0
        self.comm_seconds += t2 - t1
        self.steps += 1
        if self.timeline is not None:
            self.timeline.add("backprop", "compute", t0, t1)
            self.timeline.add(f"allreduce ({self.allreduce_name})", "comm", t1, t2)
        value = float(flat[-1])
        if l2:
            if self._shm is None:
                for (gW, _), (W, _) in zip(grads, params):
                    gW += l2 * W
            value += mlp.l2_penalty(params, l2)
        return value, grads
