"""Synchronous data-parallel SGD over MPI: every rank backprops its shard, an allreduce sums the gradients.

Every rank runs the ordinary training loop, ``mlp.train(params, data, method=DataParallel(comm))``, with
the same data and seed, so every rank sees the same global mini-batch. :class:`DataParallel` backprops
only this rank's shard of it (floor(n/p) samples, the first n % p ranks one more), sums gradients and
losses over the ranks with the chosen allreduce, and returns the mean gradient of the *global* batch:
every rank applies the same update and the weights stay identical, equal to a serial run's.

``fused=True`` packs all gradients (and the loss) into one buffer and does one allreduce, as Horovod's
tensor fusion does; ``fused=False`` does one allreduce per weight array and bias. ``overlap=True`` hides the
communication behind the backward pass, as PyTorch's DDP does: the gradients are cut into buckets of about
``bucket_bytes``, last layer first, and each bucket's non-blocking allreduce (MPI's ``Iallreduce`` with
``allreduce="mpi"``, labkit's :func:`labkit.collectives.ring_iallreduce` with ``"ring"``) starts as soon as backprop
has produced it, while the layers below are still computing; the step waits for all of them before the update.
With ``allreduce="shm"`` and ``shard_update=True`` (ranks on one machine) the optimizer step is sharded too
(:class:`ShardedSGD`): the weights live in shared memory for the run and each rank updates its block of them from
every rank's gradient. Time spent computing and communicating is accumulated in
:attr:`DataParallel.compute_seconds` and :attr:`comm_seconds`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from . import mlp
from .bench import Timeline
from .data import load_mnist
from .device import array_module
from .shards import flatten, ring_chunks, shard_bounds, unflatten

# overlap=True: how the allreduces in flight are moved on while backprop computes. "none": only when the step waits
# for them; "layers": a test of them after every layer; "thread": a thread that tests them every POLL_SECONDS while
# NumPy computes (BLAS lets go of Python's lock), as an MPI's own progress thread would
PROGRESS = ("none", "layers", "thread")
POLL_SECONDS = 0.0002


def _allreduce_fn(allreduce) -> Callable | None:
    from . import collectives

    if callable(allreduce):
        return allreduce
    if allreduce in ("shm", "nccl"):
        return None  # DataParallel keeps a SharedMemoryAllreduce or an NcclAllreduce for its buffer
    if allreduce not in collectives.ALLREDUCES:
        raise ValueError(f"allreduce must be one of {', '.join(collectives.ALLREDUCES)}, shm, nccl or a function, "
                         f"got {allreduce!r}")
    return collectives.ALLREDUCES[allreduce]


class DataParallel:
    """A drop-in for :func:`labkit.mlp.loss_and_grads` that splits each batch over the ranks of ``comm``.

    ``allreduce`` is ``"ring"`` (labkit's), ``"mpi"`` (the library's), another name from
    ``labkit.collectives.ALLREDUCES``, ``"nccl"`` (the parameters are CuPy arrays, one GPU per rank: NVIDIA's NCCL
    sums the gradients GPU to GPU, :class:`labkit.comm_backends.NcclAllreduce`; call :meth:`close` when done),
    ``"shm"`` (ranks on one machine: every rank backprops straight into
    an MPI shared-memory window and the sum is read from it, :class:`labkit.comm_backends.SharedMemoryAllreduce`;
    call :meth:`close` when done), or any function ``f(comm, x, op) -> summed array`` (a compressed allreduce,
    say). Every rank must call it with the same batch.

    ``shard_update=True`` (with ``"shm"``) splits the optimizer step over the ranks as well: inside
    :func:`labkit.mlp.train` (which takes :meth:`make_optimizer`), the call returns ``(loss, None)`` and
    :class:`ShardedSGD` applies the step; ``l2`` is not supported there.
    """

    def __init__(self, comm, allreduce="ring", fused: bool = True, timeout: float | None = None, shard_update: bool = False,
                 overlap: bool = False, bucket_bytes: int = 1 << 20, progress: str = "layers"):
        self.comm = comm
        if overlap and allreduce not in ("mpi", "ring"):
            raise ValueError("overlap=True starts a non-blocking allreduce for each bucket of gradients, MPI's "
                             f"Iallreduce or labkit's ring_iallreduce: use allreduce='mpi' or 'ring', got {allreduce!r}")
        if overlap and shard_update:
            raise ValueError("overlap=True and shard_update=True do not go together: choose one")
        if int(bucket_bytes) <= 0:
            raise ValueError(f"bucket_bytes must be a positive number of bytes, got {bucket_bytes!r}")
        if progress not in PROGRESS:
            raise ValueError(f"progress must be one of {', '.join(map(repr, PROGRESS))}, got {progress!r}")
        # overlap: buckets of gradients, each allreduced as soon as backprop has made it; progress: how MPI is entered
        # meanwhile, for an MPI that moves a non-blocking collective on only while it is called (PROGRESS)
        self.overlap, self.bucket_bytes, self.progress = bool(overlap), int(bucket_bytes), progress
        self._buckets = None
        self.allreduce_name = allreduce if isinstance(allreduce, str) else getattr(allreduce, "__name__", "custom")
        self._allreduce = _allreduce_fn(allreduce)
        self._builtin = isinstance(allreduce, str)
        if not self._builtin and not fused:
            raise ValueError("a custom allreduce needs fused=True (one buffer, so compression state stays per buffer)")
        if allreduce == "shm" and not fused:
            raise ValueError("allreduce='shm' works on one fused buffer: use fused=True")
        if shard_update and allreduce != "shm":
            raise ValueError("shard_update=True needs allreduce='shm' (the weights live in one shared-memory window)")
        self.shard_update = shard_update
        self._nccl = None
        if allreduce == "nccl":
            from .comm_backends import NcclAllreduce

            self._nccl = NcclAllreduce(comm, timeout)  # collective: every rank sets up (or fails) together
        self.optimizer: ShardedSGD | None = None  # the sharded optimizer of the current run (shard_update=True)
        self.fused, self.timeout = fused, timeout
        self.compute_seconds = self.comm_seconds = 0.0
        self.steps = 0
        self._key = self._flat = self._views = None
        self._shm = self._sum_views = None
        self.timeline = None  # a labkit.bench.Timeline: each step's backprop and allreduce phases are recorded in it

    def make_optimizer(self, params, lr: float, momentum: float = 0.0):
        """The optimizer :func:`labkit.mlp.train` uses with this method: plain :class:`labkit.mlp.SGD`, or with
        ``shard_update=True`` a :class:`ShardedSGD` that moves the weights into shared memory for the run."""
        if not self.shard_update:
            return mlp.SGD(lr, momentum)
        if self.optimizer is not None:
            self.optimizer.close()
        self.optimizer = ShardedSGD(self.shared_buffer(params), params, lr, momentum, record=self.record)
        return self.optimizer

    def close(self) -> None:
        """Free the shared-memory window of ``allreduce="shm"`` or the NCCL communicator of ``"nccl"`` (collective)."""
        if self._nccl is not None:
            self._nccl.close()
            self._nccl = None
        if self.optimizer is not None:
            self.optimizer.close()
            self.optimizer = None
        if self._shm is not None:
            self._shm.free()
            self._shm = None
            self._key = None

    def __repr__(self) -> str:
        how = f"overlap=True, bucket_bytes={self.bucket_bytes}" if self.overlap else f"fused={self.fused}"
        return f"DataParallel(ranks={self.comm.Get_size()}, allreduce={self.allreduce_name!r}, {how})"

    def buckets(self, params) -> dict[int, tuple[int, int]]:
        """overlap=True's buckets: {layer whose gradients complete the bucket: (start, end) in the flat buffer}.
        Layers are taken last first, as backprop makes them, and a bucket closes once it holds ``bucket_bytes``
        (a layer is never split); the layers of a bucket lie side by side in the buffer."""
        itemsize = np.dtype(params[0][0].dtype).itemsize
        ends, total = [], 0
        for W, b in params:
            total += W.size + b.size
            ends.append(total)
        out, hi, size = {}, ends[-1], 0
        for i in range(len(params) - 1, -1, -1):
            size += (params[i][0].size + params[i][1].size) * itemsize
            if size >= self.bucket_bytes or i == 0:
                lo = ends[i - 1] if i else 0
                out[i] = (lo, hi)
                hi, size = lo, 0
        return out

    def _sum_inplace(self, a: np.ndarray) -> None:
        """Replace ``a`` by its sum over the ranks."""
        from mpi4py import MPI

        if not self._builtin:
            a[...] = self._allreduce(self.comm, a, MPI.SUM)
            return
        if self.allreduce_name == "nccl":
            if self._nccl is None:
                raise RuntimeError("this DataParallel was closed: make a new one")
            self._nccl(a, check=False)
            return
        kw = {"out": a} if self.allreduce_name in ("ring", "mpi") else {}  # these two can work in place
        res = self._allreduce(self.comm, a, MPI.SUM, check=False, timeout=self.timeout, **kw)
        if res is not a:
            a[...] = res

    def _buffer(self, params):
        """One flat buffer (all gradients, then the loss) and params-shaped views into it, reused every step."""
        xp = array_module(params[0][0])
        key = (tuple((W.shape, b.shape) for W, b in params), params[0][0].dtype, xp.__name__)
        if key != self._key:
            size = sum(W.size + b.size for W, b in params)
            if self.allreduce_name == "nccl" and xp is np:
                raise TypeError("allreduce='nccl' sums CuPy arrays on GPUs: make the parameters with "
                                "mlp.init_params(..., xp=cupy)")
            if self.allreduce_name != "nccl" and xp is not np:
                raise TypeError(f"allreduce={self.allreduce_name!r} works on NumPy arrays; for CuPy parameters on GPUs "
                                "use allreduce='nccl'")
            if self.allreduce_name == "shm":
                from .comm_backends import SharedMemoryAllreduce

                self.close()
                self._shm = SharedMemoryAllreduce(self.comm, size + 1, params[0][0].dtype, self.timeout)
                self._flat = self._shm.mine  # backprop writes straight into shared memory
                self._sum_views = unflatten(self._shm.result[:-1], params)
            else:
                self._flat = xp.empty(size + 1, dtype=params[0][0].dtype)
            self._views = unflatten(self._flat[:-1], params)
            self._key = key
        return self._flat, self._views

    def shared_buffer(self, params):
        """The shared-memory allreduce (``allreduce="shm"``) whose window holds this run's gradients of ``params``:
        one slot per rank (every gradient, then the loss) and a result row. Collective the first time."""
        if self.allreduce_name != "shm":
            raise ValueError(f"only allreduce='shm' keeps its buffer in shared memory, this one is {self.allreduce_name!r}")
        self._buffer(params)
        return self._shm

    def __call__(self, params, x, y, activation="sigmoid", cost="quadratic", l2=0.0):
        """(mean loss, mean gradients) of the global batch; the gradients are views into a buffer reused next step
        (with ``"shm"``, one buffer shared by all ranks: read it, do not change it)."""
        Y = mlp.check_batch(params, x, y)
        n = x.shape[0]
        lo, hi = shard_bounds(n, self.comm.Get_size())[self.comm.Get_rank()]
        if self.shard_update:
            return self._sharded_call(params, x[lo:hi], Y[lo:hi], n, activation, cost, l2)
        if self.overlap:
            return self._overlapped_call(params, x[lo:hi], Y[lo:hi], n, activation, cost, l2)
        flat, grads = self._buffer(params)
        t0 = time.perf_counter()
        if hi > lo:  # my shard's share of the global mean, written straight into the buffer
            flat[-1], _ = mlp.loss_and_grads_unchecked(params, x[lo:hi], Y[lo:hi], activation, cost, 0.0, scale=1.0 / n,
                                                       out=grads)
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
        self._account(t0, t1, time.perf_counter())
        value = float(flat[-1])
        if l2:
            if self._shm is None:
                for (gW, _), (W, _) in zip(grads, params):
                    gW += l2 * W
            value += mlp.l2_penalty(params, l2)
        return value, grads

    def _overlapped_call(self, params, xs, Ys, n, activation, cost, l2):
        """overlap=True: each bucket's Iallreduce starts inside backprop, as soon as its last layer is done."""
        from mpi4py import MPI

        from .collectives import ring_iallreduce, wait_all

        flat, grads = self._buffer(params)
        ring = self.allreduce_name == "ring"

        def start(a):  # a non-blocking sum of a over the ranks, in place
            return ring_iallreduce(self.comm, a, MPI.SUM, self.timeout) if ring else \
                self.comm.Iallreduce(MPI.IN_PLACE, a, op=MPI.SUM)

        key = (self._key, self.bucket_bytes)
        if self._buckets is None or self._buckets[0] != key:
            self._buckets = (key, self.buckets(params))
        buckets = self._buckets[1]
        reqs, started, done = [], [], {}

        def poll() -> None:  # a non-blocking collective moves on only while it is tested (without a progress thread)
            for k, q in enumerate(reqs):
                if k not in done and q.Test():
                    done[k] = time.perf_counter()

        lock = threading.Lock()  # one caller of MPI at a time: the thread, or this one
        stop = threading.Event()

        def poll_locked() -> None:
            with lock:
                poll()

        def poller() -> None:
            while not stop.wait(POLL_SECONDS):
                poll_locked()

        def on_layer(i: int) -> None:
            if self.progress == "layers":
                poll()
            if i in buckets:
                b_lo, b_hi = buckets[i]
                with lock:
                    started.append((time.perf_counter(), b_hi - b_lo))
                    reqs.append(start(flat[b_lo:b_hi]))

        thread = threading.Thread(target=poller, daemon=True) if self.progress == "thread" else None
        if thread is not None:
            thread.start()
        t0 = time.perf_counter()
        try:
            if xs.shape[0]:
                flat[-1], _ = mlp.loss_and_grads_unchecked(params, xs, Ys, activation, cost, 0.0, scale=1.0 / n,
                                                           out=grads, on_layer=on_layer)
            else:  # no samples here: nothing to compute, every bucket goes at once
                flat[:] = 0
                for i in sorted(buckets, reverse=True):
                    on_layer(i)
        finally:
            if thread is not None:
                stop.set()
                thread.join()
        t1 = time.perf_counter()
        started.append((t1, 1))
        reqs.append(start(flat[-1:]))  # the loss
        if ring:
            for q in reqs:
                q.Wait()
        else:
            wait_all(reqs, self.timeout, "the overlapped allreduce of the gradients", self.comm)
        t2 = time.perf_counter()
        self.steps += 1
        self.record("backprop", "compute", t0, t1)
        self.record("wait for the allreduces", "comm", t1, t2)  # only what backprop did not hide counts as comm
        if self.timeline is not None:
            for k, (ts, count) in enumerate(started[:-1]):
                self.timeline.add(f"allreduce bucket {k} ({count} values)", "comm (in flight)", ts, done.get(k, t2))
        value = float(flat[-1])
        if l2:
            for (gW, _), (W, _) in zip(grads, params):
                gW += l2 * W
            value += mlp.l2_penalty(params, l2)
        return value, grads

    def _sharded_call(self, params, xs, Ys, n, activation, cost, l2):
        """shard_update: this rank's share of -lr x the mean gradient goes into its slot; the sum is never formed
        here: :meth:`ShardedSGD.step` adds the slots block by block straight into the weights."""
        opt = self.optimizer
        if opt is None or opt.closed:
            raise RuntimeError("DataParallel(shard_update=True) updates the weights itself: use it through "
                               "mlp.train(params, data, method=dp, ...), which takes dp.make_optimizer(...)")
        if l2:
            raise ValueError("shard_update=True does not apply l2; use shard_update=False for l2 regularisation")
        flat, grads = self._buffer(params)
        t0 = time.perf_counter()
        if xs.shape[0]:
            flat[-1], _ = mlp.loss_and_grads_unchecked(params, xs, Ys, activation, cost, 0.0, scale=opt.scale / n, out=grads)
        else:
            flat[:] = 0
        t1 = time.perf_counter()
        self._shm.barrier("sharded update, waiting for every rank's gradient")
        value = float(self._shm.slots[:, -1].sum()) / opt.scale
        self._account(t0, t1, time.perf_counter())
        return value, None

    def record(self, name: str, kind: str, t0: float, t1: float) -> None:
        """Count ``time.perf_counter()`` readings t0..t1 as compute or communication (``kind`` "compute" or
        "comm") time, and put the phase into :attr:`timeline` when there is one."""
        if kind == "compute":
            self.compute_seconds += t1 - t0
        else:
            self.comm_seconds += t1 - t0
        if self.timeline is not None:
            self.timeline.add(name, kind, t0, t1)

    def _account(self, t0: float, t1: float, t2: float) -> None:
        """One step: backprop from t0 to t1, then communication (and waiting) until t2."""
        self.steps += 1
        self.record("backprop", "compute", t0, t1)
        self.record(f"allreduce ({self.allreduce_name})", "comm", t1, t2)


class ShardedSGD:
    """SGD with momentum whose update is split over the ranks (as ZeRO stage 1 splits optimizer state), for
    :class:`DataParallel` with ``shard_update=True`` on one machine (made by :meth:`DataParallel.make_optimizer`).

    The weights move into the shared-memory window ``shm`` for the run (``params`` then holds views into it). Every
    rank backprops its shard straight into its slot of the window, already scaled by -lr; after one barrier, rank r
    adds all slots of block r of the flat weight vector into its velocity and its weights, then a barrier: every
    rank sees the whole new weights without a message or a copy. Each rank keeps the velocity of its block only.
    The sum is formed once, in the update, and the update's work is shared instead of repeated on every rank.
    ``record(name, kind, t0, t1)`` is told the time of each update and barrier. :meth:`close` (called by
    :func:`labkit.mlp.train` when it ends) copies the weights back into the caller's arrays and puts them back into
    ``params``.
    """

    def __init__(self, shm, params, lr: float, momentum: float = 0.0, record=None):
        mlp.SGD(lr, momentum)  # the same checks of lr and momentum
        self.shm, self.lr, self.momentum, self.scale = shm, float(lr), float(momentum), -float(lr)
        self.record = record or (lambda name, kind, t0, t1: None)
        size = shm.n - 1  # the slots' last entry is the loss
        self.weights = shm.result[:size]
        self.block = shard_bounds(size, shm.p)[shm.rank]
        lo, hi = self.block
        self.weights[lo:hi] = flatten(params)[lo:hi]  # every rank holds the same weights: each copies its block
        shm.barrier("sharded update, copying the weights into shared memory")
        self.velocity = np.zeros(hi - lo, dtype=self.weights.dtype) if momentum else None
        self.params, self.original = params, list(params)
        params[:] = unflatten(self.weights, params)
        self.closed = False

    def step(self, params, grads=None) -> None:
        """Apply the step whose gradient shares the ranks wrote (``grads`` is not used). Collective."""
        shm = self.shm
        lo, hi = self.block
        t0 = time.perf_counter()
        target = self.velocity if self.velocity is not None else self.weights[lo:hi]
        if self.velocity is not None:
            self.velocity *= self.momentum
        for r in range(shm.p):
            target += shm.slots[r, lo:hi]
        if self.velocity is not None:
            self.weights[lo:hi] += self.velocity
        t1 = time.perf_counter()
        shm.barrier("sharded update, waiting for every rank's block of the weights")
        t2 = time.perf_counter()
        self.record("update (my block)", "compute", t0, t1)
        self.record("barrier", "comm", t1, t2)

    def close(self) -> None:
        """Copy the weights back into the caller's arrays and put those back into ``params`` (once)."""
        if self.closed:
            return
        for (W, b), (Wv, bv) in zip(self.original, self.params):
            W[...] = Wv
            b[...] = bv
        self.params[:] = self.original
        self.closed = True


# -- the pieces of a data-parallel step, written out (labkit's answers to labs 07 and 08's exercises) --------------


def ring_reduce_scatter(comm, x, op=None) -> np.ndarray:
    """The first half of :func:`labkit.collectives.ring_allreduce`, alone: p - 1 steps around the ring, after which
    rank r holds chunk (r + 1) mod p of the result; returns that chunk (a new array). ZeRO's sharded update
    (:class:`ShardedSGD`) needs no more than this: each rank its block of the summed gradient."""
    from mpi4py import MPI

    from .collectives import combiner

    combine = combiner(MPI.SUM if op is None else op)
    p, r = comm.Get_size(), comm.Get_rank()
    out = np.array(x).reshape(-1)
    chunks = shard_bounds(out.size, p)
    for step in range(p - 1):
        (s_lo, s_hi), (r_lo, r_hi) = (chunks[c] for c in ring_chunks(r, step, p))
        incoming = np.empty(r_hi - r_lo, dtype=out.dtype)
        comm.Sendrecv(out[s_lo:s_hi], dest=(r + 1) % p, recvbuf=incoming, source=(r - 1) % p)
        combine(out[r_lo:r_hi], incoming, out=out[r_lo:r_hi])
    lo, hi = chunks[(r + 1) % p]
    return out[lo:hi].copy()


def mean_of_shards(comm, grads: list, n: int) -> list:
    """The mean gradient over every rank's samples, on every rank, from this rank's mean ``grads`` over its own ``n``
    samples (anything, NaN say, where n is 0): each rank's sum (mean times n) added up, divided by the batch size
    (every rank's n added up). Returns new arrays."""
    total = comm.allreduce(int(n))
    if total == 0:
        raise ValueError("no rank has any rows: the mean of no rows is undefined")
    out = []
    for gW, gb in grads:
        pair = []
        for a in (gW, gb):
            mine = a * n if n else np.zeros_like(a)
            summed = np.empty_like(mine)
            comm.Allreduce(mine, summed)
            pair.append(summed / total)
        out.append(tuple(pair))
    return out


# The measurements lab 08 draws, one call each on every engine (collective: every rank of comm calls them). Each
# trains [784, 256, 10] with ReLU and cross-entropy, batch 128, on sub-communicators of the first ranks of comm.


def _first_ranks(comm, k: int):
    """The first k ranks of comm as a communicator of their own (MPI.COMM_NULL on the others); free it after use."""
    from mpi4py import MPI

    return comm.Split(0 if comm.Get_rank() < k else MPI.UNDEFINED, comm.Get_rank())


def _train_one_epoch(data, method, batch_size=128, momentum=0.9, test_data=None, layers=(784, 256, 10)):
    params = mlp.init_params(list(layers), seed=0, init="he")
    history = mlp.train(params, data, epochs=1, batch_size=batch_size, lr=0.05, momentum=momentum, activation="relu",
                        cost="cross_entropy", method=method, test_data=test_data, progress=False)
    return params, history


def epochs_by_ranks(comm, x, y) -> list[tuple[int, float, float, float]]:
    """On comm's rank 0: (ranks, epoch seconds, backprop seconds, allreduce seconds) of one epoch on 1, 2 and all
    ranks (ring allreduce; 1 rank trains vectorised, without communication). An empty list on the other ranks."""
    timings = []
    for k in sorted({1, 2, comm.Get_size()}):
        sub = _first_ranks(comm, k)
        if sub != _comm_null():
            dp = DataParallel(sub, allreduce="ring") if k > 1 else "vectorised"
            _, h = _train_one_epoch((x, y), dp)
            if sub.Get_rank() == 0:
                epoch = h.epoch_time[0]
                timings.append((k, epoch, dp.compute_seconds if k > 1 else epoch, dp.comm_seconds if k > 1 else 0.0))
            sub.Free()
        comm.Barrier()
    return timings


class _Clock:
    """Every phase a DataParallel records (its ``timeline`` hook), as raw ``time.perf_counter()`` readings: on Linux
    one clock for all the processes of a machine, so that two ranks' phases can be set side by side."""

    def __init__(self):
        self.events: list[tuple[str, float, float]] = []

    def add(self, name: str, kind: str, t0: float, t1: float) -> None:
        self.events.append((kind, t0, t1))


def allreduce_variants(comm, x, y, steps: int = 40, batch: int = 128,
                       layers=(784,) + (64,) * 7 + (10,)) -> dict[str, float]:
    """On the first 2 ranks: seconds of allreduce in the median of ``steps`` gradient steps of ``layers`` (by default
    8 layers of at most 64 neurons: 16 arrays of gradients) at ``batch`` rows, for each allreduce ("ring", "mpi",
    "shm"), fused into one buffer and per layer ("shm" fused only), by name such as "ring, fused". Empty on the
    others. A step's allreduce counts from the moment both ranks have ended backprop, so a rank slowed down in
    backprop by another program does not count as communication; the variants take turns step by step, so that a
    busy moment of the machine slows them alike."""
    variants = {}
    sub = _first_ranks(comm, 2)
    if sub != _comm_null():
        dps = {}
        for allreduce in ("ring", "mpi", "shm"):
            for fused in (True, False) if allreduce != "shm" else (True,):
                dp = dps[f"{allreduce}, {'fused' if fused else 'per layer'}"] = DataParallel(sub, allreduce, fused)
                dp.timeline = _Clock()
        params = mlp.init_params(list(layers), seed=0, init="he")
        for s in range(steps):
            lo = s * batch % max(len(x) - batch, 1)
            for dp in dps.values():
                dp(params, x[lo:lo + batch], y[lo:lo + batch], "relu", "cross_entropy")
        for name, dp in dps.items():
            phases = np.array([[t0, t1] for _, t0, t1 in dp.timeline.events]).reshape(-1, 2, 2)  # step, phase, (t0, t1)
            both = np.empty_like(phases)
            sub.Allreduce(phases, both, op=_max())  # the later rank's readings
            variants[name] = float(np.median(both[:, 1, 1] - both[:, 0, 1]))  # both done, less both backpropped
            dp.close()
        sub.Free()
    return variants


def two_rank_epochs(comm, x, y, test_data) -> dict[str, tuple[float, float | None]]:
    """On the first 2 ranks: (epoch seconds, test accuracy) of one epoch on 1 rank, on 2 ranks with the whole update on
    each and with the update sharded (shared memory), and of 2 processes that never communicate, each training on
    half the samples at batch 64: the yardstick no 2-process design can beat (accuracy None: never combined)."""
    from mpi4py import MPI

    epochs = {}
    if comm.Get_rank() == 0:  # the serial epoch, measured now beside the two others
        _, h = _train_one_epoch((x, y), "vectorised", test_data=test_data)
        epochs["1 rank"] = (h.epoch_time[0], h.final_accuracy)
    comm.Barrier()
    sub = _first_ranks(comm, 2)
    if sub != _comm_null():
        for name, sharded in (("2 ranks, whole update on each", False), ("2 ranks, sharded update", True)):
            dp = DataParallel(sub, allreduce="shm", shard_update=sharded)
            _, h = _train_one_epoch((x, y), dp, test_data=test_data)
            epochs[name] = (h.epoch_time[0], h.final_accuracy)
            dp.close()
        r = sub.Get_rank()
        _, h = _train_one_epoch((x[r::2], y[r::2]), "vectorised", batch_size=64)
        epochs["2 independent processes"] = (sub.allreduce(h.epoch_time[0], op=MPI.MAX), None)
        sub.Free()
    return epochs


def overlapped_end(ready, seconds) -> float:
    """When the last bucket's allreduce ends in an overlapped step (lab 08's exercise 5), from the time each bucket
    is ready (``ready``, seconds since backprop began, in the order the buckets start) and the time its allreduce
    takes alone (``seconds``): one network, so an allreduce starts when its bucket is ready and the one before it has
    ended. 0.0 for no bucket."""
    end = 0.0
    for r, s in zip(ready, seconds, strict=True):
        end = max(end, float(r)) + float(s)
    return end


def step_model(backprop: float, ready, seconds) -> tuple[float, float]:
    """(blocking, overlapped): the time of one step's backprop and allreduces without overlap (backprop, then every
    bucket's allreduce) and with it (:func:`overlapped_end`, but never before backprop ends); lab 08's exercise 5."""
    return float(backprop) + float(np.sum(seconds)), max(float(backprop), overlapped_end(ready, seconds))


def bucket_sizes(events, rank: int = 0) -> list[int]:
    """The number of values in each bucket of one overlapped step's timeline (:func:`overlap_runs`' events) on
    ``rank``, in the order the buckets started."""
    buckets = sorted((e for e in events if e["rank"] == rank and e["name"].startswith("allreduce bucket")),
                     key=lambda e: e["start"])
    return [int(e["name"].rsplit("(", 1)[1].split()[0]) for e in buckets]


def bucket_times(events, allreduce_seconds: float, rank: int = 0) -> tuple[float, list[float], list[float]]:
    """From the timeline of one overlapped step (:func:`overlap_runs`' events), on ``rank``: (backprop seconds, each
    bucket's ready time since backprop began, each bucket's share of ``allreduce_seconds``, a blocking allreduce of
    all the gradients, by its number of values)."""
    mine = [e for e in events if e["rank"] == rank]
    backprop = next(e for e in mine if e["name"] == "backprop")
    starts = sorted(e["start"] for e in mine if e["name"].startswith("allreduce bucket"))
    counts = np.array(bucket_sizes(events, rank), dtype=float)
    return (backprop["end"] - backprop["start"], [t - backprop["start"] for t in starts],
            (allreduce_seconds * counts / max(counts.sum(), 1.0)).tolist())


def overlap_runs(comm, x, y, batch: int, layers=(784, 1024, 1024, 10), steps: int = 8, drawn=("none", "layers")):
    """On the first 2 ranks, ``layers`` trained for ``steps`` steps of ``batch`` rows with MPI's allreduce in 1 MiB
    buckets, blocking and overlapped with each progress ("none", "layers", "thread"): ({name: (step seconds, backprop
    seconds, seconds waiting after backprop, W1[:4, :4], sum of |W1|)}, {name: the timeline of one more step, gathered
    on rank 0} for each progress in ``drawn``). ({}, {}) on the other ranks."""
    runs, timelines = {}, {}
    sub = _first_ranks(comm, 2)
    if sub != _comm_null():
        xb, yb = x[: steps * batch], y[: steps * batch]
        modes = {"blocking": {}, "none": dict(overlap=True, progress="none"),
                 "layers": dict(overlap=True, progress="layers"), "thread": dict(overlap=True, progress="thread")}
        for name, kw in modes.items():
            dp = DataParallel(sub, allreduce="mpi", bucket_bytes=1 << 20, **kw)
            params = mlp.init_params(list(layers), seed=0, init="he")
            h = mlp.train(params, (xb, yb), epochs=1, batch_size=batch, lr=0.01, activation="relu",
                          cost="cross_entropy", method=dp, progress=False)
            runs[name] = (h.epoch_time[0] / dp.steps, dp.compute_seconds / dp.steps, dp.comm_seconds / dp.steps,
                          params[0][0][:4, :4].copy(), float(np.abs(params[0][0]).sum()))
            if name in drawn:  # one more step, drawn
                dp.timeline = Timeline(sub.Get_rank())
                sub.Barrier()
                dp.timeline.reset()
                dp(params, xb[:batch], yb[:batch], "relu", "cross_entropy")
                timelines[name] = dp.timeline.gather(sub)
        sub.Free()
    return runs, timelines


def across_the_wire(comm, samples: int, batch: int, overlap_batch: int, overlap_layers=(784, 512, 512, 10),
                    steps: int = 20) -> dict:
    """Lab 08's experiments for a job across hosts (:mod:`labkit.network`), on the first 2 ranks: ``"split"``, the
    blocking step of [784, 256, 10] at ``batch`` rows (MPI's allreduce), per step (backprop seconds, allreduce
    seconds) over ``steps`` steps; ``"overlap"``, :func:`overlap_runs` of ``overlap_layers`` at ``overlap_batch`` rows
    (4 steps), and ``"events"``, the timeline of its "layers" step. Loads MNIST's first ``samples`` training images
    itself."""
    (x, y), _ = load_mnist(quiet=True)
    x, y = x[:samples], y[:samples]
    split = None
    sub = _first_ranks(comm, 2)
    if sub != _comm_null():
        dp = DataParallel(sub, allreduce="mpi")
        params = mlp.init_params([784, 256, 10], seed=0, init="he")
        n = min(len(x), (steps + 1) * batch)
        mlp.train(params, (x[:batch], y[:batch]), epochs=1, batch_size=batch, lr=0.05, activation="relu",
                  cost="cross_entropy", method=dp, progress=False)  # a warm-up step: buffers, connections
        c0, m0, s0 = dp.compute_seconds, dp.comm_seconds, dp.steps
        mlp.train(params, (x[batch:n], y[batch:n]), epochs=1, batch_size=batch, lr=0.05, activation="relu",
                  cost="cross_entropy", method=dp, progress=False)
        k = dp.steps - s0
        split = ((dp.compute_seconds - c0) / k, (dp.comm_seconds - m0) / k)
        sub.Free()
    runs, timelines = overlap_runs(comm, x, y, overlap_batch, layers=overlap_layers, steps=4, drawn=("layers",))
    return {"split": split, "overlap": runs, "events": timelines.get("layers")}


def _max():
    from mpi4py import MPI

    return MPI.MAX


def _comm_null():
    from mpi4py import MPI

    return MPI.COMM_NULL
