"""Parameter servers over MPI: synchronous, asynchronous with sharded masters, and bounded staleness.

Every rank calls :func:`train` (SPMD). Ranks ``0 .. masters-1`` are masters: the flattened parameters
are split over them in contiguous slices (floor + remainder, so the load is balanced whatever the
layer sizes). The other ranks are workers, each with its own shard of the training data (so workers
finish unevenly when the shards differ). A worker step:

1. backprop one mini-batch of its shard (with the full weights it holds);
2. ``Isend`` every master its slice of the gradient, tagged with the version of that slice it used;
3. ``Irecv`` a fresh slice from every master, and wait (with a timeout) for all of them.

Masters poll with ``Iprobe``: a gradient is applied at once (``mode="async"``), or averaged with one
from every other active worker (``"sync"``), or applied at once but answered only when its worker is at
most ``staleness_bound`` = s steps ahead of the slowest active worker (``"ssp"``, stale-synchronous): then
no update is staler than (2 s + 1)(W - 1) for W workers, where ``"async"`` has no bound at all.
Each master records the staleness of every update it applies (its version now minus the version the
gradient was computed on) and how many updates it applied. At the end the slices are gathered on rank 0.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from . import mlp
from .cpu_parallel import shard_bounds
from .data_parallel import flatten, unflatten

GRAD, WEIGHTS, DONE = 301, 302, 303
MODES = ("async", "sync", "ssp")


@dataclass
class PSResult:
    """What a parameter-server run produced; the arrays are complete on rank 0 (empty elsewhere)."""

    params: mlp.Params | None
    staleness: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # one entry per applied update
    master_updates: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # updates per master
    worker_steps: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # steps per worker
    worker_loss: np.ndarray = field(default_factory=lambda: np.zeros(0))  # mean training loss per worker
    seconds: float = 0.0


def _master(comm, flat, lo, hi, n_masters, mode, staleness_bound, lr, timeout):
    """Serve gradients for flat[lo:hi] until every worker has said it is done."""
    from mpi4py import MPI

    from .collectives import wait_all

    size = comm.Get_size()
    workers = list(range(n_masters, size))
    mine = flat[lo:hi]
    version = 0
    clock = {w: 0 for w in workers}  # gradients received from each worker
    done: set[int] = set()
    held: list[int] = []  # ssp: workers whose reply waits for the slowest to catch up
    sync_grads: dict[int, np.ndarray] = {}
    staleness: list[int] = []
    updates = 0
    buf = np.empty(hi - lo + 1, dtype=flat.dtype)  # gradient slice, then the version it was computed on
    # one reply buffer and request per worker: a worker sends its next gradient only after it has
    # received the previous reply, so that send is complete by the time the buffer is needed again
    replies = {w: np.empty(hi - lo + 1, dtype=flat.dtype) for w in workers}
    sending = {w: MPI.REQUEST_NULL for w in workers}
    status = MPI.Status()
    last_heard, idle = time.monotonic(), 1e-5

    def send_weights(w):
        sending[w].Wait()
        replies[w][:-1] = mine
        replies[w][-1] = version
        sending[w] = comm.Isend(replies[w], dest=w, tag=WEIGHTS)

    def slowest():
        active = [clock[w] for w in workers if w not in done]
        return min(active) if active else math.inf

    while len(done) < len(workers):
        if not comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
            if time.monotonic() - last_heard > timeout:
                silent = [w for w in workers if w not in done]
                raise TimeoutError(f"master {comm.Get_rank()}: no message from workers {silent} for {timeout:g} s "
                                   "(a worker died or stalled)")
            time.sleep(idle)  # back off while idle, so masters leave the cores to the workers
            idle = min(idle * 2, 1e-3)
            continue
        last_heard, idle = time.monotonic(), 1e-5
        src, tag = status.Get_source(), status.Get_tag()
        if tag == DONE:
            comm.Recv(np.empty(0, dtype=flat.dtype), source=src, tag=DONE)
            done.add(src)
        elif tag == GRAD:
            comm.Recv(buf, source=src, tag=GRAD)
            clock[src] += 1
            used = int(buf[-1])
            if mode == "sync":
                sync_grads[src] = buf[:-1].copy()
            else:
                staleness.append(version - used)
                mine -= lr * buf[:-1]
                version += 1
                updates += 1
                if mode == "ssp" and clock[src] - slowest() > staleness_bound:
                    held.append(src)
                else:
                    send_weights(src)
        else:
            raise RuntimeError(f"master {comm.Get_rank()}: unexpected message tag {tag} from rank {src}")
        if mode == "sync":  # one gradient from every worker still running: average, apply, answer them all
            active = [w for w in workers if w not in done]
            if active and all(w in sync_grads for w in active):
                mine -= lr * np.mean([sync_grads[w] for w in active], axis=0)
                version += 1
                updates += 1
                staleness.extend([0] * len(active))
                for w in active:
                    send_weights(w)
                sync_grads.clear()
        if held:  # ssp: answer everyone the slowest worker has caught up with
            floor = slowest()
            ready = [w for w in held if clock[w] - floor <= staleness_bound]
            for w in ready:
                held.remove(w)
                send_weights(w)
    wait_all([r for r in sending.values() if r != MPI.REQUEST_NULL], timeout, "sending the last weights", comm)
    return np.array(staleness, dtype=np.int64), updates


def _worker(comm, params, flat, bounds, x, Y, epochs, batch_size, activation, cost, seed, timeout):
    """Train on this worker's shard; exchange gradients and weights with every master each step."""
    from .collectives import wait_all

    n_masters = len(bounds)
    G = np.empty_like(flat)
    grads = unflatten(G, params)
    send = [np.empty(hi - lo + 1, dtype=flat.dtype) for lo, hi in bounds]
    recv = [np.empty(hi - lo + 1, dtype=flat.dtype) for lo, hi in bounds]
    versions = np.zeros(n_masters)
    rng = np.random.default_rng(seed)
    steps, loss_sum, seen = 0, 0.0, 0
    n = x.shape[0]
    for _ in range(epochs):
        order = rng.permutation(n)
        for j in range(0, n, batch_size):
            idx = order[j:j + batch_size]
            value, _ = mlp._loss_and_grads(params, x[idx], Y[idx], activation, cost, 0.0, out=grads)
            loss_sum += value * len(idx)
            seen += len(idx)
            reqs = []
            for m, (lo, hi) in enumerate(bounds):
                send[m][:-1] = G[lo:hi]
                send[m][-1] = versions[m]
                reqs.append(comm.Isend(send[m], dest=m, tag=GRAD))
                reqs.append(comm.Irecv(recv[m], source=m, tag=WEIGHTS))
            wait_all(reqs, timeout, f"worker {comm.Get_rank()} waiting for the masters' weights", comm)
            for m, (lo, hi) in enumerate(bounds):
                flat[lo:hi] = recv[m][:-1]
                versions[m] = recv[m][-1]
            steps += 1
    for m in range(n_masters):
        comm.Send(np.empty(0, dtype=flat.dtype), dest=m, tag=DONE)
    return steps, loss_sum / max(seen, 1)


def train(comm, sizes, train_data, masters: int = 1, mode: str = "async", epochs: int = 1, batch_size: int = 32,
          lr: float = 0.05, staleness_bound: int = 2, activation: str = "relu", cost: str = "cross_entropy",
          seed: int = 0, timeout: float = 120.0, dtype=np.float32) -> PSResult:
    """Train ``sizes`` on ``train_data = (x, y)`` with a parameter server; every rank calls this.

    ``masters`` ranks serve, the others work (at least one of each). One epoch is one pass of every
    worker over its own shard of the data, so all workers together see the data once per epoch.
    """
    from mpi4py import MPI

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    size, rank = comm.Get_size(), comm.Get_rank()
    if not 1 <= masters < size:
        raise ValueError(f"need at least one master and one worker: masters={masters} on {size} ranks")
    if mode == "ssp" and staleness_bound < 0:
        raise ValueError(f"staleness_bound must be >= 0, got {staleness_bound}")
    n_workers = size - masters
    params = mlp.init_params(sizes, seed=seed, dtype=dtype, init="he" if activation == "relu" else "scaled")
    flat = flatten(params)
    params = unflatten(flat, params)  # the network's arrays are now views into one flat vector
    bounds = shard_bounds(flat.size, masters)
    t0 = time.perf_counter()
    staleness, updates, steps, wloss = np.zeros(0, np.int64), 0, 0, 0.0
    if rank < masters:
        lo, hi = bounds[rank]
        staleness, updates = _master(comm, flat, lo, hi, masters, mode, staleness_bound, lr, timeout)
    else:
        w = rank - masters
        x, y = train_data
        mlp.check_batch(params, x[:1], y[:1])
        lo, hi = shard_bounds(len(x), n_workers)[w]
        xs = np.asarray(x[lo:hi], dtype=dtype)
        Ys = mlp.targets(np.asarray(y[lo:hi]), sizes[-1], dtype)
        steps, wloss = _worker(comm, params, flat, bounds, xs, Ys, epochs, batch_size, activation, cost,
                               seed + 1000 + w, timeout)
    seconds = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    # collect on rank 0: the masters' slices, every master's staleness record and load, the workers' steps
    from .collectives import gather

    piece = flat[bounds[rank][0]:bounds[rank][1]].copy() if rank < masters else np.zeros(0, dtype=flat.dtype)
    whole = gather(comm, piece, root=0)
    stale = gather(comm, staleness, root=0)
    loads = gather(comm, np.array([updates] if rank < masters else [], dtype=np.int64), root=0)
    wsteps = gather(comm, np.array([steps] if rank >= masters else [], dtype=np.int64), root=0)
    wl = gather(comm, np.array([wloss] if rank >= masters else [], dtype=np.float64), root=0)
    if rank != 0:
        return PSResult(None, seconds=seconds)
    return PSResult(unflatten(whole, params), stale, loads, wsteps, wl, seconds)
