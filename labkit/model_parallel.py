"""Model parallelism: split the network instead of the data.

* :class:`NeuronParallel` splits the neurons of the hidden layer of ``[n_in, hidden, n_out]`` over the
  ranks (floor + remainder): each rank holds its rows of W1 and b1 and computes its part of the hidden
  activations; one allgather gives every rank the whole hidden layer, and the (small, replicated) output
  layer runs everywhere. The backward pass needs no messages: the output error is known on every rank.
* :class:`Pipeline` gives each rank a contiguous block of layers and runs the mini-batch as ``m``
  micro-batches on a GPipe schedule: all forwards flow down the ranks, then all backwards flow up, the
  gradients of the micro-batches are summed, and the update is the serial one. It records when every
  forward and backward ran, and the *bubble*: the fraction of the time a rank sits idle, which GPipe
  predicts as (p - 1) / (m + p - 1) for equal stages.

Both compute the same gradients as :func:`labkit.mlp.backprop` (the tests check it), for float32 or
float64, any activation and cost of ``labkit.mlp``.

Lab 11's exercises, in labkit's own words (the checks' references): :func:`neuron_part` and
:func:`neuron_part_grads` (one rank's block of a layer, forward and backward), :func:`gpipe_schedule` (the step
of every task with unit times), :func:`pipeline_step_time` (one step with each stage's own times),
:func:`peak_activations` (the activations a schedule holds) and :func:`one_f_one_b_schedule` (1F1B); with
:func:`stage_times` (the stages' times from a measured timeline) and :func:`draw_schedule`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np

from . import mlp, plots
from .shards import shard_bounds


def _prime(a, activation):
    """The activation's derivative, from its output."""
    return mlp.act_prime_from_output(activation, a)


class NeuronParallel:
    """A ``[n_in, hidden, n_out]`` network whose hidden neurons are split over the ranks of ``comm``.

    Every rank builds the same full network from ``seed`` and keeps its slice, so results do not depend
    on the number of ranks. :meth:`loss_and_grads` returns this rank's gradients (its W1/b1 rows, the
    whole W2/b2), :meth:`step` applies SGD, :meth:`gather` assembles the full network on every rank.
    """

    def __init__(self, comm, sizes, seed: int = 0, dtype=np.float32, init: str = "scaled"):
        if len(sizes) != 3:
            raise ValueError(f"NeuronParallel splits the one hidden layer of [n_in, hidden, n_out]; got sizes {sizes}")
        self.comm, self.sizes = comm, list(sizes)
        full = mlp.init_params(sizes, seed=seed, dtype=dtype, init=init)
        self.bounds = shard_bounds(sizes[1], comm.Get_size())
        lo, hi = self.bounds[comm.Get_rank()]
        (W1, b1), (W2, b2) = full
        self.params = [(W1[lo:hi].copy(), b1[lo:hi].copy()), (W2.copy(), b2.copy())]
        self.lo, self.hi = lo, hi
        self.comm_seconds = self.compute_seconds = 0.0

    def _hidden(self, x, activation):
        """This rank's hidden activations, then everyone's (batch, hidden) through one allgather."""
        (W1, b1), _ = self.params
        t0 = time.perf_counter()
        z = x @ W1.T + b1
        mine = mlp.activate(z, activation)
        t1 = time.perf_counter()
        counts = np.array([(hi - lo) * x.shape[0] for lo, hi in self.bounds])
        everyone = np.empty(int(counts.sum()), dtype=mine.dtype)
        self.comm.Allgatherv(np.ascontiguousarray(mine), [everyone, counts])
        # each rank's block is (batch, its neurons): put the blocks side by side
        blocks, pos = [], 0
        for c, (lo, hi) in zip(counts, self.bounds):
            blocks.append(everyone[pos:pos + c].reshape(x.shape[0], hi - lo))
            pos += c
        self.compute_seconds += t1 - t0
        self.comm_seconds += time.perf_counter() - t1
        return mine, np.concatenate(blocks, axis=1)

    def loss_and_grads(self, x, y, activation: str = "sigmoid", cost: str = "quadratic"):
        """(mean loss, [(dW1 rows, db1 rows), (dW2, db2)]) for the batch; every rank passes the same batch."""
        Y = mlp.targets(np.asarray(y), self.sizes[-1], self.params[0][0].dtype)
        mine, h = self._hidden(x, activation)
        t0 = time.perf_counter()
        _, (W2, b2) = self.params
        z2 = h @ W2.T + b2
        if cost == "cross_entropy":
            out = mlp.softmax(z2)
        else:
            out = mlp.activate(z2, activation)
        n = x.shape[0]
        delta = out - Y
        if cost == "quadratic":
            value = 0.5 * float(np.vdot(delta, delta)) / n
            delta *= _prime(out, activation)
        else:
            value = -float((Y * np.log(np.maximum(out, 1e-30))).sum()) / n
        delta /= n
        g2 = (delta.T @ h, delta.sum(axis=0))
        d1 = (delta @ W2[:, self.lo:self.hi]) * _prime(mine, activation)  # only my neurons' error: no message
        g1 = (d1.T @ x, d1.sum(axis=0))
        self.compute_seconds += time.perf_counter() - t0
        return value, [g1, g2]

    def step(self, grads, lr: float) -> None:
        """Plain SGD on this rank's parameters."""
        mlp.SGD(lr).step(self.params, grads)

    def gather(self) -> mlp.Params:
        """The whole network, assembled on every rank."""
        (W1, b1), (W2, b2) = self.params
        rows = self.comm.allgather(W1)
        biases = self.comm.allgather(b1)
        return [(np.concatenate(rows), np.concatenate(biases)), (W2.copy(), b2.copy())]


def neuron_part(W, b, x, rank: int, p: int, activation: str = "relu"):
    """Rank ``rank`` of ``p``'s block of a layer's neurons (floor + remainder, as :class:`NeuronParallel` splits
    them) and its part of the layer's output: ``(lo, hi, activate(x @ W[lo:hi].T + b[lo:hi]))``."""
    lo, hi = shard_bounds(W.shape[0], p)[rank]
    return lo, hi, mlp.activate(x @ W[lo:hi].T + b[lo:hi], activation)


def neuron_part_grads(x, h, delta, W2, lo: int, hi: int, activation: str = "relu"):
    """The gradients (dW rows lo:hi, db[lo:hi]) of the hidden neurons lo..hi-1 of ``[n_in, hidden, n_out]``, from
    their outputs ``h`` (batch, hi - lo) and the output layer's error ``delta`` (batch, n_out): no message needed."""
    d = (delta @ W2[:, lo:hi]) * _prime(h, activation)
    return d.T @ x, d.sum(axis=0)


# -- pipeline -------------------------------------------------------------------------------------------


def partition_layers(sizes, parts: int) -> list[tuple[int, int]]:
    """Contiguous blocks of layers (start, stop) for ``parts`` stages, balancing multiply-adds."""
    n_layers = len(sizes) - 1
    if not 1 <= parts <= n_layers:
        raise ValueError(f"cannot split {n_layers} layers into {parts} stages (need 1 <= stages <= layers)")
    cost = [a * b for a, b in zip(sizes[:-1], sizes[1:])]
    best = None
    # try every way of cutting (few layers): minimise the most expensive stage

    for cuts in combinations(range(1, n_layers), parts - 1):
        edges = (0, *cuts, n_layers)
        worst = max(sum(cost[a:b]) for a, b in zip(edges[:-1], edges[1:]))
        if best is None or worst < best[0]:
            best = (worst, edges)
    edges = best[1]
    return list(zip(edges[:-1], edges[1:]))


@dataclass
class Timeline:
    """When each stage ran each micro-batch: rows of (rank, kind 0=forward 1=backward, micro-batch, start, end)."""

    events: np.ndarray = field(default_factory=lambda: np.zeros((0, 5)))

    def bubble(self) -> float:
        """Mean over ranks of the idle fraction between the first start and the last end of the step."""
        ev = self.events
        t0, t1 = ev[:, 3].min(), ev[:, 4].max()
        busy = [(ev[ev[:, 0] == r, 4] - ev[ev[:, 0] == r, 3]).sum() for r in np.unique(ev[:, 0])]
        return float(1 - np.mean(busy) / (t1 - t0))

    def span(self) -> float:
        """Seconds from the first start to the last end: the step as the stages saw it."""
        return float(self.events[:, 4].max() - self.events[:, 3].min())


def gpipe_bubble(p: int, m: int) -> float:
    """GPipe's idle fraction for p equal stages and m micro-batches: (p - 1) / (m + p - 1)."""
    return (p - 1) / (m + p - 1)


def gpipe_schedule(stages: int, micro_batches: int) -> tuple[np.ndarray, np.ndarray]:
    """GPipe's schedule when every task takes one step: ``(forward, backward)``, the step at which each stage runs
    each micro-batch's forward and backward, shape (stages, micro_batches). All forwards first, each task as soon
    as its stage is free and its input has arrived; the backwards last micro-batch first, as :class:`Pipeline`."""
    s = np.arange(stages)[:, None]
    m = np.arange(micro_batches)[None, :]
    forward = s + m
    backward = (micro_batches + stages - 1) + (stages - 1 - s) + (micro_batches - 1 - m)
    return forward, backward


def one_f_one_b_schedule(stages: int, micro_batches: int) -> tuple[np.ndarray, np.ndarray]:
    """1F1B's schedule when every task takes one step, in :func:`gpipe_schedule`'s form.

    Stage s keeps at most ``stages - s`` micro-batches in flight (forward run, backward not yet). Each step it runs
    the backward of its oldest micro-batch in flight if that backward's input has arrived (the error of stage s + 1;
    on the last stage its own forward), else its next forward if that forward's input has arrived and it has room,
    else it idles. The step takes as many steps as GPipe's, 2(M + S - 1); stage s holds min(S - s, M) micro-batches'
    activations at most, where GPipe holds all M."""
    S, M = stages, micro_batches
    forward, backward = np.full((S, M), -1), np.full((S, M), -1)
    n_forward, n_backward = [0] * S, [0] * S  # tasks each stage has run
    t = 0
    while S and n_backward[0] < M:
        for s in range(S):  # a task run at step t is seen by the others from step t + 1
            m = n_backward[s]
            if m < n_forward[s]:
                error = backward[s + 1, m] if s < S - 1 else forward[s, m]
                if 0 <= error < t:
                    backward[s, m], n_backward[s] = t, m + 1
                    continue
            m = n_forward[s]
            if m < M and m - n_backward[s] < S - s and (s == 0 or 0 <= forward[s - 1, m] < t):
                forward[s, m], n_forward[s] = t, m + 1
        t += 1
    return forward, backward


def peak_activations(forward, backward) -> np.ndarray:
    """The most micro-batches each stage holds activations for at once, in a schedule of :func:`gpipe_schedule`'s
    form: micro-batch m is held on stage s from the step of its forward through the step of its backward."""
    forward, backward = np.asarray(forward), np.asarray(backward)
    steps = np.arange(1 + int(max(forward.max(), backward.max()))) if forward.size else np.arange(0)
    held = (forward[:, :, None] <= steps) & (steps <= backward[:, :, None])  # (stage, micro-batch, step)
    return held.sum(axis=1).max(axis=1, initial=0)


def pipeline_step_time(forward_seconds, backward_seconds, micro_batches: int) -> float:
    """Seconds of one GPipe step when stage s takes ``forward_seconds[s]`` and ``backward_seconds[s]`` per
    micro-batch (messages free): the schedule of :func:`gpipe_schedule` with each stage's own times."""
    f, b = np.asarray(forward_seconds, dtype=float), np.asarray(backward_seconds, dtype=float)
    free = np.zeros(len(f))  # when each stage is next free
    ready = np.zeros(micro_batches)  # when each micro-batch's input has arrived at the stage in hand
    for s in range(len(f)):  # the forwards, down the stages
        for m in range(micro_batches):
            ready[m] = free[s] = max(free[s], ready[m]) + f[s]
    ready[:] = 0.0  # the last stage's errors: ready once its own forwards are done
    for s in reversed(range(len(b))):  # the backwards, up the stages
        for m in reversed(range(micro_batches)):
            ready[m] = free[s] = max(free[s], ready[m]) + b[s]
    return float(free.max()) if len(f) else 0.0


def stage_times(events) -> tuple[np.ndarray, np.ndarray]:
    """Each stage's mean seconds per micro-batch, (forward, backward), from a :class:`Timeline`'s events: with them,
    M micro-batches keep the stages busy exactly as long as they were in the step measured."""
    ev = np.asarray(events, dtype=float).reshape(-1, 5)
    took = ev[:, 4] - ev[:, 3]
    ranks = np.unique(ev[:, 0])
    return tuple(np.array([took[(ev[:, 0] == r) & (ev[:, 1] == kind)].mean() for r in ranks]) for kind in (0, 1))


def draw_schedule(forward, backward, title: str = "pipeline schedule"):
    """A schedule in steps (:func:`gpipe_schedule`'s form) drawn as :func:`labkit.plots.plot_timeline` draws a
    measured one: one lane per stage, a bar per task numbered with its micro-batch, white where a stage is idle."""
    forward, backward = np.asarray(forward), np.asarray(backward)
    rows = [(s, kind, m, steps[s, m] / 1e3, (steps[s, m] + 1) / 1e3)  # one step drawn as one "ms"
            for kind, steps in ((0, forward), (1, backward)) for s, m in np.ndindex(steps.shape)]
    fig = plots.plot_timeline(np.array(rows, dtype=float), title=title)
    fig.axes[0].set_xlabel("step")
    return fig


class Pipeline:
    """Layers split over the ranks of ``comm``; :meth:`loss_and_grads` runs one mini-batch as micro-batches.

    Every rank builds the same full network from ``seed`` and keeps its stage's layers. Rank 0 needs the
    inputs and the last rank the targets; passing the same batch everywhere is simplest.
    """

    def __init__(self, comm, sizes, seed: int = 0, dtype=np.float32, init: str = "scaled", timeout: float | None = 120):
        self.comm, self.sizes, self.timeout = comm, list(sizes), timeout
        p, r = comm.Get_size(), comm.Get_rank()
        self.stages = partition_layers(sizes, p)
        full = mlp.init_params(sizes, seed=seed, dtype=dtype, init=init)
        lo, hi = self.stages[r]
        self.first_layer, self.params = lo, [(W.copy(), b.copy()) for W, b in full[lo:hi]]
        self.dtype = np.dtype(dtype)
        self.timeline = Timeline()

    def _stage_forward(self, a, activation, cost):
        """This stage's layers on one micro-batch a (rows, width): [a, a1, ..., its output], kept for the backward."""
        n_layers = len(self.sizes) - 1
        layer_acts = [a]
        for j, (W, b) in enumerate(self.params):
            z = layer_acts[-1] @ W.T + b  # (rows, n_out)
            if self.first_layer + j == n_layers - 1 and cost == "cross_entropy":
                layer_acts.append(mlp.softmax(z))
            else:
                layer_acts.append(mlp.activate(z, activation))
        return layer_acts

    def _forwards(self, x, chunks, activation, cost, start, events, sends):
        """All forwards: each micro-batch's input from the stage before (rank 0: from x), through my layers, on to the next.

        Returns every micro-batch's activations; appends to ``events`` when each ran and to ``sends`` the sends to wait for.
        """
        from mpi4py import MPI

        from .collectives import wait_all

        comm, p, r = self.comm, self.comm.Get_size(), self.comm.Get_rank()
        width = self.sizes[self.stages[r][0]]
        acts: dict[int, list] = {}
        for i, (a, b) in enumerate(chunks):
            if r == 0:
                inp = np.asarray(x[a:b], dtype=self.dtype)
            else:
                inp = np.empty((b - a, width), dtype=self.dtype)
                wait_all([comm.Irecv(inp, source=r - 1, tag=10 + i)], self.timeout, f"stage {r} waiting for activations", comm)
            t0 = MPI.Wtime()
            acts[i] = self._stage_forward(inp, activation, cost)
            events.append((r, 0, i, t0 - start, MPI.Wtime() - start))
            if r < p - 1:
                sends.append(comm.Isend(acts[i][-1], dest=r + 1, tag=10 + i))
        return acts

    @staticmethod
    def _output_error(out, Y, n, activation, cost):
        """The last stage's summed loss over a micro-batch and its error dL/dz of the mean loss over all n samples."""
        delta = out - Y  # (rows, n_out)
        if cost == "quadratic":
            value = 0.5 * float(np.vdot(delta, delta))
            delta *= _prime(out, activation)
        else:
            value = -float((Y * np.log(np.maximum(out, 1e-30))).sum())
        delta /= n  # of the mean loss over the whole mini-batch; the stages above receive it scaled
        return value, delta

    def _stage_backward(self, layer_acts, delta, grads, activation):
        """Add this stage's gradients (delta^T a, sum of delta) of one micro-batch into grads; return the stage before's error."""
        first_stage = self.comm.Get_rank() == 0
        for j in range(len(self.params) - 1, -1, -1):
            gW, gb = grads[j]
            gW += delta.T @ layer_acts[j]
            gb += delta.sum(axis=0)
            if j or not first_stage:  # the error of this layer's input (the first stage's input needs none)
                delta = (delta @ self.params[j][0]) * _prime(layer_acts[j], activation)  # (rows, n_in)
        return delta

    def _backwards(self, Y, chunks, acts, n, activation, cost, start, events, sends):
        """All backwards, last micro-batch first: the error from the next stage (the last stage: from the loss), through
        my layers, on to the stage before. Returns (the summed loss on the last stage, 0.0 elsewhere; my gradients)."""
        from mpi4py import MPI

        from .collectives import wait_all

        comm, p, r = self.comm, self.comm.Get_size(), self.comm.Get_rank()
        grads = mlp.zeros_like(self.params)
        total = 0.0
        for i in reversed(range(len(chunks))):
            a, b = chunks[i]
            layer_acts = acts.pop(i)
            if r == p - 1:
                t0 = MPI.Wtime()
                value, delta = self._output_error(layer_acts[-1], Y[a:b], n, activation, cost)
                total += value
            else:
                delta = np.empty_like(layer_acts[-1])
                wait_all([comm.Irecv(delta, source=r + 1, tag=1000 + i)], self.timeout, f"stage {r} waiting for errors", comm)
                t0 = MPI.Wtime()
            delta = self._stage_backward(layer_acts, delta, grads, activation)
            events.append((r, 1, i, t0 - start, MPI.Wtime() - start))
            if r:
                sends.append(comm.Isend(delta, dest=r - 1, tag=1000 + i))
        return total, grads

    def loss_and_grads(self, x, y, micro_batches: int = 4, activation: str = "sigmoid", cost: str = "quadratic"):
        """GPipe: (mean loss on the last rank, 0.0 elsewhere; this stage's gradients of the mean loss)."""
        from mpi4py import MPI

        from .collectives import wait_all

        comm, p, r = self.comm, self.comm.Get_size(), self.comm.Get_rank()
        n = x.shape[0]
        if micro_batches < 1:
            raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
        chunks = [(a, b) for a, b in shard_bounds(n, micro_batches) if b > a]
        last_stage = r == p - 1
        Y = mlp.targets(np.asarray(y), self.sizes[-1], self.dtype) if last_stage else None
        events, sends = [], []  # (rank, 0 forward / 1 backward, micro-batch, start, end); pending sends
        comm.Barrier()
        start = MPI.Wtime()
        acts = self._forwards(x, chunks, activation, cost, start, events, sends)
        total, grads = self._backwards(Y, chunks, acts, n, activation, cost, start, events, sends)
        wait_all(sends, self.timeout, f"stage {r} finishing its sends", comm)
        gathered = comm.allgather(np.array(events, dtype=float))
        self.timeline = Timeline(np.concatenate(gathered))
        return (total / n if last_stage else 0.0), grads

    def step(self, grads, lr: float) -> None:
        """Plain SGD on this stage's layers."""
        mlp.SGD(lr).step(self.params, grads)

    def gather(self) -> mlp.Params:
        """The whole network, assembled on every rank."""
        return [layer for stage in self.comm.allgather(self.params) for layer in stage]
