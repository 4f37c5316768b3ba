"""Memory per rank, and data parallelism that shards it: ZeRO's stages and fully sharded data parallelism (lab 13).

Plain data parallelism keeps on every rank the whole parameters, gradients and optimizer state. ZeRO shards them
over the p ranks, one kind more at each stage: 1 the optimizer state, 2 the gradients too, 3 the parameters too
(fully sharded data parallelism, FSDP). :func:`memory_per_rank` gives the paper's bytes per rank; :class:`MemoryMeter`
counts the bytes of the arrays a rank really holds, by kind, and their peak within a step.

* :class:`Zero2`: each rank backprops its shard of the batch; the flat gradient is reduce-scattered (lab 07's ring,
  :func:`labkit.data_parallel.ring_reduce_scatter`); each rank updates its slice of the weights and of the momentum;
  the weights are all-gathered (:func:`ring_allgather`, the ring's second half).
* :class:`FullySharded`: each rank keeps a 1/p slice of every layer; a layer is all-gathered before its forward and
  again before its backward, and freed after each; its gradient is reduce-scattered as soon as backprop makes it.
  It sends 1.5x the bytes of data parallelism's allreduce: one more all-gather of the parameters.
* :func:`accumulated_grads`: k micro-batches give the large batch's gradient, holding one micro-batch's activations.
* :func:`backprop_layers` with ``every=k``: activation checkpointing, keeping every k-th layer's input and recomputing
  the rest in backward; :func:`checkpoint_every` is sqrt(L), which minimises the L/k + k activations held.

Every step gives the serial step's weights (:func:`labkit.mlp.loss_and_grads` then :class:`labkit.mlp.SGD` on the
whole batch) to float tolerance. MPI steps take ``comm`` and run on ``MPI.COMM_SELF`` too.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from . import mlp
from .data_parallel import ring_reduce_scatter
from .shards import flatten, ring_chunks, shard_bounds, shard_of, unflatten

KINDS = ("parameters", "gradients", "optimizer", "activations")

# which kinds each stage shards over the ranks: (parameters, gradients, optimizer state)
STAGES = {
    "dp": (False, False, False),
    "zero1": (False, False, True),
    "zero2": (False, True, True),
    "zero3": (True, True, True),
}

# K, bytes of optimizer state per parameter
STATE_BYTES = {
    "sgd": 0,
    "sgd_momentum_fp32": 4,  # the velocity
    "adam_fp32": 8,  # two moments
    "adam_mixed": 12,  # fp32 master weights and two moments, beside fp16 weights and gradients (ZeRO's K = 12)
}


def memory_per_rank(psi: float, ranks: int, stage: str = "dp", weight_bytes: int = 2, state_bytes: float = 12) -> dict:
    """Bytes per rank for ``psi`` parameters on ``ranks`` ranks (ZeRO's formula), by kind and "total": parameters and
    gradients of ``weight_bytes`` each, K = ``state_bytes`` of optimizer state per parameter; a sharded kind / ranks."""
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    per = (weight_bytes, weight_bytes, state_bytes)
    out = {kind: psi * b / (ranks if sharded else 1) for kind, b, sharded in zip(KINDS, per, STAGES[stage])}
    out["total"] = sum(out.values())
    return out


class MemoryMeter:
    """The bytes of the arrays a rank holds, by kind (:data:`KINDS`), counted from their ``.nbytes``.

    ``hold(kind, name, *arrays)`` records (or replaces) a named holding, ``free(kind, name)`` drops it. ``peak`` is
    the holdings by kind when the total was largest since :meth:`reset_peak`; ``most`` each kind's own largest.
    """

    def __init__(self):
        self.held: dict[tuple[str, object], int] = {}
        self.reset_peak()

    def now(self) -> dict[str, int]:
        """Bytes held now, by kind."""
        out = dict.fromkeys(KINDS, 0)
        for (kind, _), nbytes in self.held.items():
            out[kind] += nbytes
        return out

    def reset_peak(self) -> None:
        """Start a new peak from what is held now (a step calls this first)."""
        self.peak = self.now()
        self.most = dict(self.peak)

    def hold(self, kind: str, name, *arrays) -> None:
        """Count ``arrays`` as the holding ``name`` of ``kind`` (replacing what it held), and update the peaks."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.held[(kind, name)] = sum(int(a.nbytes) for a in arrays)
        now = self.now()
        if sum(now.values()) > sum(self.peak.values()):
            self.peak = now
        self.most = {k: max(self.most[k], now[k]) for k in KINDS}

    def free(self, kind: str, name) -> None:
        """Drop the holding ``name`` of ``kind`` (nothing if there is none)."""
        self.held.pop((kind, name), None)


# -- the MLP layer by layer: one body for plain backprop, checkpointing and FSDP ------------------------------------


def _layer_forward(layer, a, last: bool, activation: str, cost: str):
    """f(a W^T + b): softmax on the last layer under cross-entropy, as :func:`labkit.mlp.forward`."""
    W, b = layer
    z = a @ W.T + b  # (batch, n_out)
    return mlp.softmax(z) if last and cost == "cross_entropy" else mlp.activate(z, activation)


def _output_error(out, Y, activation: str, cost: str, scale: float):
    """(loss, dL/dz of the last layer), both times ``scale`` (1/batch for the mean)."""
    d = out - Y
    if cost == "quadratic":
        return 0.5 * float(np.vdot(d, d)) * scale, d * mlp.act_prime_from_output(activation, out) * scale
    return -float((Y * np.log(np.maximum(out, 1e-30))).sum()) * scale, d * scale


def backprop_layers(fetch: Callable, n_layers: int, x, Y, activation: str = "sigmoid", cost: str = "quadratic",
                    scale: float | None = None, on_grad: Callable | None = None, every: int = 1,
                    memory: MemoryMeter | None = None, release: Callable | None = None) -> float:
    """Backprop through layers that ``fetch(i)`` gives as (W, b) and ``release(i)`` lets go (FSDP gathers and frees
    them); ``on_grad(i, gW, gb)`` gets each layer's gradient at once, last layer first. Returns the loss.

    Keeps every ``every``-th layer's input (and the output) and recomputes the others from the checkpoint below them
    in backward: activation checkpointing, one more forward for fewer activations held (counted in ``memory``).
    """
    if every < 1:
        raise ValueError(f"every must be >= 1 (1 keeps every layer's input), got {every}")
    memory = memory if memory is not None else MemoryMeter()
    release = release or (lambda i: None)
    scale = 1.0 / max(len(x), 1) if scale is None else scale
    kept = {0: x}
    memory.hold("activations", 0, x)
    a = x
    for i in range(n_layers):  # forward
        a = _layer_forward(fetch(i), a, i == n_layers - 1, activation, cost)
        release(i)
        if (i + 1) % every == 0 or i + 1 == n_layers:
            kept[i + 1] = a
            memory.hold("activations", i + 1, a)
        else:  # passed on, not kept
            memory.hold("activations", "passing", a)
    memory.free("activations", "passing")
    loss, delta = _output_error(kept.pop(n_layers), Y, activation, cost, scale)
    memory.free("activations", n_layers)
    for start in range(every * ((n_layers - 1) // every), -1, -every):  # segments, last first
        acts = {start: kept[start]}
        for i in range(start, min(start + every, n_layers) - 1):  # recompute the segment from its checkpoint
            acts[i + 1] = _layer_forward(fetch(i), acts[i], False, activation, cost)
            release(i)
            memory.hold("activations", i + 1, acts[i + 1])
        for i in range(min(start + every, n_layers) - 1, start - 1, -1):
            gW, gb, d_in = mlp.layer_backward(delta, acts[i], fetch(i)[0])
            release(i)
            if on_grad is not None:
                on_grad(i, gW, gb)
            if i:  # layer i's input is used for the last time: let it go
                delta = d_in * mlp.act_prime_from_output(activation, acts.pop(i))
                kept.pop(i, None)
                memory.free("activations", i)
    memory.free("activations", 0)
    return loss


def checkpoint_every(n_layers: int) -> int:
    """k = round(sqrt(L)): about L/k checkpoints plus k recomputed activations, fewest at k = sqrt(L)."""
    return max(1, round(math.sqrt(n_layers)))


def accumulated_grads(params, x, y, micro: int, activation: str = "sigmoid", cost: str = "quadratic"):
    """(mean loss, mean gradient) of the batch from ``micro`` micro-batches, each backpropped alone and added in with
    the weight rows / batch: the large batch's gradient, holding one micro-batch's activations at a time."""
    Y = mlp.check_batch(params, x, y)
    n = len(x)
    total, acc = 0.0, mlp.zeros_like(params)
    for lo, hi in shard_bounds(n, micro):
        if hi > lo:
            value, grads = mlp.loss_and_grads_unchecked(params, x[lo:hi], Y[lo:hi], activation, cost, 0.0, scale=1.0 / n)
            total += value
            mlp.add_into(acc, grads)
    return total, acc


# -- the ring's halves, and the sharded steps -------------------------------------------------------------------


def ring_allgather(comm, flat: np.ndarray) -> np.ndarray:
    """The second half of :func:`labkit.collectives.ring_allreduce`, alone and in place: rank r brings chunk
    (r + 1) mod p of ``flat`` (where :func:`labkit.data_parallel.ring_reduce_scatter` leaves it); after p - 1 steps
    to the right every rank holds every chunk. Returns ``flat``."""
    p, r = comm.Get_size(), comm.Get_rank()
    chunks = shard_bounds(flat.size, p)
    for step in range(p - 1):
        (s_lo, s_hi), (r_lo, r_hi) = (chunks[c] for c in ring_chunks(r + 1, step, p))  # one chunk behind the scatter
        comm.Sendrecv(flat[s_lo:s_hi], dest=(r + 1) % p, recvbuf=flat[r_lo:r_hi], source=(r - 1) % p)
    return flat


def _mine(n: int, comm) -> tuple[int, int]:
    """The slice of n values this rank owns: the chunk the ring's reduce-scatter finishes here."""
    return shard_bounds(n, comm.Get_size())[(comm.Get_rank() + 1) % comm.Get_size()]


def _momentum(w, v, g, lr: float, mu: float) -> None:
    """v = mu v - lr g; w += v, in place: :class:`labkit.mlp.SGD`'s step on one slice."""
    v *= mu
    v -= lr * g
    w += v


class _Sharded:
    """What both sharded steps share: the communicator, SGD's settings and the meter."""

    def __init__(self, comm, lr: float, momentum: float):
        mlp.SGD(lr, momentum)  # the same checks of lr and momentum
        self.comm, self.lr, self.momentum = comm, float(lr), float(momentum)
        self.memory = MemoryMeter()

    def _batch(self, like, x, y):
        """This rank's rows of the checked batch, and 1 / global batch."""
        Y = mlp.check_batch(like, x, y)
        lo, hi = shard_of(len(x), self.comm.Get_size(), self.comm.Get_rank())
        return x[lo:hi], Y[lo:hi], 1.0 / len(x)


class Zero2(_Sharded):
    """ZeRO stage 2 for the MLP with SGD + momentum: whole weights on every rank, gradient and momentum in slices.

    ``params`` (the same on every rank) becomes views of one flat vector, which :meth:`step` updates in place;
    ``memory`` counts one step's arrays.
    """

    def __init__(self, comm, params, lr: float, momentum: float = 0.9):
        super().__init__(comm, lr, momentum)
        self.flat = flatten(params)
        self.params = params
        params[:] = unflatten(self.flat, params)  # the caller's list now views the flat weights
        self.block = _mine(self.flat.size, comm)
        self.velocity = np.zeros(self.block[1] - self.block[0], dtype=self.flat.dtype)
        self.memory.hold("parameters", "all", self.flat)
        self.memory.hold("optimizer", "velocity", self.velocity)

    def step(self, x, y, activation: str = "sigmoid", cost: str = "quadratic") -> float:
        """One step on the global batch (x, y), the same on every rank; returns its mean loss. Collective."""
        self.memory.reset_peak()
        xs, Ys, scale = self._batch(self.params, x, y)
        grads = np.zeros_like(self.flat)  # the whole gradient lives through backprop (ZeRO's buckets free it sooner)
        views = unflatten(grads, self.params)
        self.memory.free("gradients", "mine")
        self.memory.hold("gradients", "all", grads)

        def into(i, gW, gb):
            views[i][0][...] = gW
            views[i][1][...] = gb

        loss = backprop_layers(lambda i: self.params[i], len(self.params), xs, Ys, activation, cost, scale, into,
                               memory=self.memory)
        mine = ring_reduce_scatter(self.comm, grads)  # the sum of my slice (the ring's own copy is not counted)
        self.memory.free("gradients", "all")
        self.memory.hold("gradients", "mine", mine)
        lo, hi = self.block
        _momentum(self.flat[lo:hi], self.velocity, mine, self.lr, self.momentum)
        ring_allgather(self.comm, self.flat)
        return self.comm.allreduce(loss)


class FullySharded(_Sharded):
    """ZeRO stage 3 (FSDP) for the MLP with SGD + momentum: each rank keeps its slice of every layer's (W, b) and of
    its gradient and momentum; a layer is whole only between its all-gather and its release.

    :meth:`gather` gives the whole weights (for a check); ``memory`` counts one step's arrays.
    """

    def __init__(self, comm, params, lr: float, momentum: float = 0.9):
        super().__init__(comm, lr, momentum)
        self.like = [(np.empty_like(W), np.empty_like(b)) for W, b in params]  # shapes and dtype; not counted
        self.blocks = [_mine(W.size + b.size, comm) for W, b in params]
        self.shards = [flatten([layer])[lo:hi].copy() for layer, (lo, hi) in zip(params, self.blocks)]
        self.velocity = [np.zeros_like(s) for s in self.shards]
        self.grads = [np.zeros_like(s) for s in self.shards]
        for i, (s, v) in enumerate(zip(self.shards, self.velocity)):
            self.memory.hold("parameters", ("shard", i), s)
            self.memory.hold("optimizer", i, v)
            self.memory.hold("gradients", i, self.grads[i])

    def _gather_layer(self, i: int) -> np.ndarray:
        """Layer i's (W, b) flat, whole, from every rank's slice."""
        W, b = self.like[i]
        flat = np.empty(W.size + b.size, dtype=W.dtype)
        lo, hi = self.blocks[i]
        flat[lo:hi] = self.shards[i]
        return ring_allgather(self.comm, flat)

    def gather(self) -> list:
        """The whole weights, as a new params list (collective)."""
        return [tuple(a.copy() for a in unflatten(self._gather_layer(i), [self.like[i]])[0]) for i in range(len(self.like))]

    def step(self, x, y, activation: str = "sigmoid", cost: str = "quadratic") -> float:
        """One step on the global batch (x, y), the same on every rank; returns its mean loss. Collective."""
        self.memory.reset_peak()
        xs, Ys, scale = self._batch(self.like, x, y)
        whole = {}

        def fetch(i):
            if i not in whole:
                flat = self._gather_layer(i)
                whole[i] = unflatten(flat, [self.like[i]])[0]
                self.memory.hold("parameters", ("whole", i), flat)
            return whole[i]

        def release(i):
            del whole[i]
            self.memory.free("parameters", ("whole", i))

        def reduce_scatter(i, gW, gb):
            g = flatten([(gW, gb)])
            self.memory.hold("gradients", ("whole", i), g)
            self.grads[i][...] = ring_reduce_scatter(self.comm, g)
            self.memory.free("gradients", ("whole", i))

        loss = backprop_layers(fetch, len(self.like), xs, Ys, activation, cost, scale, reduce_scatter,
                               memory=self.memory, release=release)
        for s, v, g in zip(self.shards, self.velocity, self.grads):
            _momentum(s, v, g, self.lr, self.momentum)
        return self.comm.allreduce(loss)
