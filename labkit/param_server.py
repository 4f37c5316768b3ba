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
gradient was computed on), how many updates it applied, and how many of them came before the first worker was done.

A run's **mean staleness**, wherever lab 09 reports one (:attr:`PSResult.steady_staleness`, :func:`accuracy_table`,
:func:`remedies`), is the mean over the updates applied while every worker still runs. Then an asynchronous master's
updates are W - 1 old on average, whatever order they arrive in (each worker has one gradient in flight, and every
update counts once in each other worker's next staleness). The workers still running after the first is done are
fewer and their updates less stale, so a mean over all updates would mix in a tail that depends on how unevenly the
workers finish.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from . import mlp
from .cluster import first_ranks
from .errors import LabkitError
from .shards import flatten, shard_bounds, unflatten

GRAD, WEIGHTS, DONE = 301, 302, 303
MODES = ("async", "sync", "ssp")


@dataclass
class PSResult:
    """What a parameter-server run produced; the arrays are complete on rank 0 (empty elsewhere)."""

    params: mlp.Params | None
    staleness: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # one entry per applied update
    # the staleness of the updates each master applied before its first DONE came, while every worker still ran:
    # what the lab's mean staleness is the mean of (the module's text)
    steady_staleness: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    master_updates: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # updates per master
    worker_steps: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # steps per worker
    worker_loss: np.ndarray = field(default_factory=lambda: np.zeros(0))  # mean training loss per worker
    seconds: float = 0.0


class ParameterServerError(LabkitError, RuntimeError):
    """A rank of a parameter-server run failed; every rank raises it, with the first cause found."""


class _Master:
    """One master's state (its slice of the weights, the slice's version, what it knows of each worker), and its steps."""

    def __init__(self, comm, flat, lo, hi, n_masters, mode, staleness_bound, lr, timeout):
        from mpi4py import MPI

        self.comm, self.mode, self.staleness_bound, self.lr, self.timeout = comm, mode, staleness_bound, lr, timeout
        self.me = comm.Get_rank()
        self.workers = list(range(n_masters, comm.Get_size()))
        self.mine = flat[lo:hi]  # a view: updating it updates flat
        self.itemsize = flat.itemsize
        self.version = 0
        self.clock = {w: 0 for w in self.workers}  # gradients received from each worker
        self.done: set[int] = set()
        self.held: list[int] = []  # ssp: workers whose reply waits for the slowest to catch up
        self.sync_grads: dict[int, np.ndarray] = {}
        self.staleness: list[int] = []
        self.steady: int | None = None  # updates applied before the first worker said DONE
        self.problems: list[str] = []
        self.updates = 0
        self.n = hi - lo + 1
        self.buf = np.empty(self.n, dtype=flat.dtype)  # gradient slice, then the version it was computed on
        # one reply buffer and request per worker: a worker sends its next gradient only after it has
        # received the previous reply, so that send is complete by the time the buffer is needed again
        self.replies = {w: np.empty(self.n, dtype=flat.dtype) for w in self.workers}
        self.sending = {w: MPI.REQUEST_NULL for w in self.workers}
        self.status = MPI.Status()
        self.last_heard, self.idle = time.monotonic(), 1e-5

    def running(self) -> bool:
        """Whether some worker has not said DONE yet."""
        return len(self.done) < len(self.workers)

    def poll(self):
        """(source, tag, count of values) of the next message waiting, or None after a short back-off when none is."""
        from mpi4py import MPI

        if not self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=self.status):
            if time.monotonic() - self.last_heard > self.timeout:
                silent = [w for w in self.workers if w not in self.done]
                raise TimeoutError(f"master {self.me}: no message from workers {silent} for {self.timeout:g} s (they "
                                   f"sent {[self.clock[w] for w in silent]} gradients; a worker died, stalled, or never "
                                   "sent DONE)")
            time.sleep(self.idle)  # back off while idle, so masters leave the cores to the workers
            self.idle = min(self.idle * 2, 1e-3)
            return None
        self.last_heard, self.idle = time.monotonic(), 1e-5
        return self.status.Get_source(), self.status.Get_tag(), self.status.Get_count(MPI.BYTE) // self.itemsize

    def send_weights(self, w):
        """Send worker w this master's slice followed by its version (once the previous send to w has completed)."""
        from .collectives import wait_all

        wait_all([self.sending[w]], self.timeout, f"master {self.me} sending weights to worker {w} (is it receiving them?)",
                 self.comm)
        self.replies[w][:-1] = self.mine
        self.replies[w][-1] = self.version
        # synchronous mode: complete only once the worker has received it, so a worker that never receives
        # its weights is found (above, at its next gradient) instead of silently training on old weights
        self.sending[w] = self.comm.Issend(self.replies[w], dest=w, tag=WEIGHTS)

    def slowest(self):
        """The fewest gradients any worker still running has sent (infinity when none is running)."""
        active = [self.clock[w] for w in self.workers if w not in self.done]
        return min(active) if active else math.inf

    def apply(self, g):
        """w <- w - lr g on this master's slice, which makes a new version of it."""
        self.mine -= self.lr * g
        self.version += 1
        self.updates += 1

    def receive_done(self, src, count):
        """A worker's DONE: empty when it finished (then check it received its last weights), one value when it failed."""
        from mpi4py import MPI

        from .collectives import wait_all

        self.comm.Recv(np.empty(max(count, 0), dtype=self.buf.dtype), source=src, tag=DONE)
        self.done.add(src)
        if self.steady is None:
            self.steady = len(self.staleness)
        if src in self.sending and count:  # DONE with a value: the worker failed (it reports why itself)
            self.sending[src] = MPI.REQUEST_NULL
        elif src in self.sending:
            try:  # a worker that is done has received its last weights (allow the acknowledgement to arrive)
                wait_all([self.sending[src]], min(self.timeout, 2.0), "", self.comm)
            except TimeoutError:
                self.problems.append(f"master {self.me}: worker {src} said DONE without receiving its last weights "
                                     "(is it receiving them?)")
                self.sending[src] = MPI.REQUEST_NULL

    def receive_gradient(self, src):
        """A worker's gradient: kept for the mean ("sync"), or applied and answered ("ssp": held if too far ahead)."""
        self.comm.Recv(self.buf, source=src, tag=GRAD)
        self.clock[src] += 1
        used = int(self.buf[-1])
        if not 0 <= used <= self.version:
            self.problems.append(f"master {self.me}: worker {src} said its gradient was computed on version {used} of "
                                 f"this master's weights, but the newest is {self.version}")
        if self.mode == "sync":
            self.sync_grads[src] = self.buf[:-1].copy()
            return
        self.staleness.append(self.version - used)
        self.apply(self.buf[:-1])
        if self.mode == "ssp" and self.clock[src] - self.slowest() > self.staleness_bound:
            self.held.append(src)  # too far ahead of the slowest worker: its answer waits (release_held)
        else:
            self.send_weights(src)

    def drain_unexpected(self, src, tag, count):
        """Receive a message of the wrong length or tag, note what was wrong, answer a worker so it does not wait forever."""
        from mpi4py import MPI

        self.comm.Recv(np.empty(self.status.Get_count(MPI.BYTE), dtype=np.uint8), source=src, tag=tag)
        if src in self.clock and tag == GRAD and count * self.itemsize in (2 * self.n * self.itemsize,
                                                                            self.n * self.itemsize // 2):
            sent = "float64" if count > self.n else "float32"
            self.problems.append(f"master {self.me}: rank {src} sent its gradient as {sent} values, but the weights "
                                 f"are {self.buf.dtype} ({self.n} values of {self.itemsize} bytes expected, "
                                 f"{count * self.itemsize} bytes came): a mismatch of dtype, not of length")
            self.send_weights(src)
        elif src in self.clock:
            self.problems.append(f"master {self.me}: rank {src} sent {count} values with tag {tag}; expected tag "
                                 f"GRAD={GRAD} with {self.n} values (this master's {self.n - 1} gradient entries, then "
                                 "the version)")
            self.send_weights(src)
        else:
            self.problems.append(f"master {self.me}: unexpected message with tag {tag} from rank {src}")

    def sync_step(self):
        """``mode="sync"``: once every worker still running has sent a gradient, apply their mean and answer them all."""
        active = [w for w in self.workers if w not in self.done]
        if active and all(w in self.sync_grads for w in active):
            self.apply(np.mean([self.sync_grads[w] for w in active], axis=0))
            self.staleness.extend([0] * len(active))
            for w in active:
                self.send_weights(w)
            self.sync_grads.clear()

    def release_held(self):
        """``mode="ssp"``: answer every held worker that is now at most ``staleness_bound`` steps ahead of the slowest."""
        floor = self.slowest()
        ready = [w for w in self.held if self.clock[w] - floor <= self.staleness_bound]
        for w in ready:
            self.held.remove(w)
            self.send_weights(w)

    def finish(self):
        """Wait for the last replies to be received; raise the first problem seen, else return (staleness, updates,
        updates applied before the first worker was done)."""
        from mpi4py import MPI

        from .collectives import wait_all

        wait_all([r for r in self.sending.values() if r != MPI.REQUEST_NULL], self.timeout, "sending the last weights",
                 self.comm)
        if self.problems:
            more = f" (and {len(self.problems) - 1} more problems)" if len(self.problems) > 1 else ""
            raise ParameterServerError(self.problems[0] + more)
        return np.array(self.staleness, dtype=np.int64), self.updates, self.steady


def _master(comm, flat, lo, hi, n_masters, mode, staleness_bound, lr, timeout):
    """Serve gradients for flat[lo:hi] until every worker has said it is done: (staleness of each update, updates,
    updates before the first worker was done).

    A message of the wrong length or with an unknown tag is drained, answered with the current weights (so its
    worker does not wait forever) and reported when the run ends.
    """
    master = _Master(comm, flat, lo, hi, n_masters, mode, staleness_bound, lr, timeout)
    while master.running():
        message = master.poll()
        if message is None:
            continue
        src, tag, count = message
        if tag == DONE:
            master.receive_done(src, count)
        elif tag == GRAD and count == master.n and src in master.clock:
            master.receive_gradient(src)
        else:
            master.drain_unexpected(src, tag, count)
        if mode == "sync":  # one gradient from every worker still running: average, apply, answer them all
            master.sync_step()
        if master.held:  # ssp: answer everyone the slowest worker has caught up with
            master.release_held()
    return master.finish()


def worker_loop(comm, grad, flat, bounds, batches, timeout=None) -> None:
    """The asynchronous worker: for every batch, send each master its slice of the gradient, take fresh weights.

    ``grad(x, Y)`` backprops with the current weights (``flat``, which the network's arrays are views of) and
    returns the flat gradient; ``bounds[m] = (lo, hi)`` is master m's slice; ``batches`` yields (x, Y).
    The message to master m is ``gradient[lo:hi]`` followed by one number, the version of that slice these
    weights came from (0 at the start); the reply has the same layout: the new slice, then its version.
    At the end every master is told DONE. (The reference for the lab 09 exercise.)
    """
    from .collectives import wait_all

    versions = np.zeros(len(bounds), dtype=flat.dtype)
    send = [np.empty(hi - lo + 1, dtype=flat.dtype) for lo, hi in bounds]
    recv = [np.empty(hi - lo + 1, dtype=flat.dtype) for lo, hi in bounds]
    for x, Y in batches:
        g = grad(x, Y)
        reqs = []
        for m, (lo, hi) in enumerate(bounds):
            send[m][:-1] = g[lo:hi]
            send[m][-1] = versions[m]
            reqs.append(comm.Isend(send[m], dest=m, tag=GRAD))
            reqs.append(comm.Irecv(recv[m], source=m, tag=WEIGHTS))
        wait_all(reqs, timeout, f"worker {comm.Get_rank()} waiting for the masters' weights", comm)
        for m, (lo, hi) in enumerate(bounds):
            flat[lo:hi] = recv[m][:-1]
            versions[m] = recv[m][-1]
    for m in range(len(bounds)):
        comm.Send(np.empty(0, dtype=flat.dtype), dest=m, tag=DONE)


def worker_seed(seed: int, w: int) -> int:
    """The seed of worker ``w``'s batch order in a run started with ``seed``."""
    return seed + 1000 + w


def worker_batches(x, Y, epochs: int, batch_size: int, seed: int):
    """The (x, Y) batches one worker trains on: its shard reshuffled every epoch."""
    rng = np.random.default_rng(seed)
    n = x.shape[0]
    for _ in range(epochs):
        order = rng.permutation(n)
        for j in range(0, n, batch_size):
            idx = order[j:j + batch_size]
            yield x[idx], Y[idx]


def _worker(comm, loop, params, flat, bounds, x, Y, epochs, batch_size, activation, cost, seed, timeout):
    """Run ``loop`` over this worker's shard; returns (steps, mean training loss)."""
    G = np.empty_like(flat)
    grads = unflatten(G, params)
    stats = {"steps": 0, "loss": 0.0, "seen": 0}

    def grad(xb, Yb):
        value, _ = mlp.loss_and_grads_unchecked(params, xb, Yb, activation, cost, 0.0, out=grads)
        stats["steps"] += 1
        stats["loss"] += value * len(xb)
        stats["seen"] += len(xb)
        return G

    try:
        loop(comm, grad, flat, bounds, worker_batches(x, Y, epochs, batch_size, seed), timeout)
    except BaseException:
        for m in range(len(bounds)):  # "failed": the masters finish now instead of timing out; never wait for these
            comm.Isend(np.ones(1, dtype=flat.dtype), dest=m, tag=DONE)
        raise
    return stats["steps"], stats["loss"] / max(stats["seen"], 1)


def _agree(comm, error: BaseException | None, timeout: float) -> None:
    """Every rank says whether it failed; if any did, every rank raises the first cause (timeouts last)."""
    from .collectives import first_cause, wait_all

    flags = np.zeros(comm.Get_size(), dtype=np.int32)
    # a master needs up to one timeout to notice a failure; a rank that failed has a cause to report, so it
    # gives up waiting before the healthy ones do
    wait = (2 if error is not None else 3) * timeout + 5
    try:
        wait_all([comm.Iallgather(np.array([error is not None], dtype=np.int32), flags)], wait,
                 "waiting for the other ranks to finish (one of them is stuck or gone)", comm)
    except TimeoutError:
        if error is not None:
            raise error from None  # a rank is gone or stuck: say what went wrong here
        raise
    if not flags.any():
        return
    said = comm.allgather(None if error is None else f"rank {comm.Get_rank()}: {type(error).__name__}: {error}")
    first = first_cause(said)
    if error is not None and f"rank {comm.Get_rank()}:" in first:
        raise ParameterServerError(first) from error
    raise ParameterServerError(first)


def train(comm, sizes, train_data, masters: int = 1, mode: str = "async", epochs: int = 1, batch_size: int = 32,
          lr: float = 0.05, staleness_bound: int = 2, activation: str = "relu", cost: str = "cross_entropy",
          seed: int = 0, timeout: float = 120.0, dtype=np.float32, worker=None) -> PSResult:
    """Train ``sizes`` on ``train_data = (x, y)`` with a parameter server; every rank calls this.

    ``masters`` ranks serve, the others work (at least one of each). One epoch is one pass of every
    worker over its own shard of the data, so all workers together see the data once per epoch.
    ``worker`` replaces :func:`worker_loop` (same signature): the lab 09 exercise plugs in here.
    If any rank fails (a worker stalls, a message is malformed), every rank raises :class:`ParameterServerError`
    naming the first cause; a rank that is gone or stuck makes the others raise within about 3 ``timeout``.
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
    x, y = train_data
    mlp.check_batch(params, x[:1], y[:1])  # on every rank, before any message
    flat = flatten(params)
    params = unflatten(flat, params)  # the network's arrays are now views into one flat vector
    bounds = shard_bounds(flat.size, masters)
    comm = comm.Dup()  # this run's messages never mix with the caller's, even if a failed run leaves some behind
    t0 = time.perf_counter()
    staleness, updates, steady, steps, wloss = np.zeros(0, np.int64), 0, 0, 0, 0.0
    error = None
    try:
        if rank < masters:
            lo, hi = bounds[rank]
            staleness, updates, steady = _master(comm, flat, lo, hi, masters, mode, staleness_bound, lr, timeout)
        else:
            w = rank - masters
            lo, hi = shard_bounds(len(x), n_workers)[w]
            xs = np.asarray(x[lo:hi], dtype=dtype)
            Ys = mlp.targets(np.asarray(y[lo:hi]), sizes[-1], dtype)
            steps, wloss = _worker(comm, worker or worker_loop, params, flat, bounds, xs, Ys, epochs, batch_size,
                                   activation, cost, worker_seed(seed, w), timeout)
    except Exception as e:  # noqa: BLE001 - every failure is reported on every rank below
        error = e
    _agree(comm, error, timeout)
    seconds = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    # collect on rank 0: the masters' slices, every master's staleness record and load, the workers' steps
    from .collectives import gather

    piece = flat[bounds[rank][0]:bounds[rank][1]].copy() if rank < masters else np.zeros(0, dtype=flat.dtype)
    whole = gather(comm, piece, root=0)
    stale = gather(comm, staleness, root=0)
    stale_steady = gather(comm, staleness[:steady], root=0)
    loads = gather(comm, np.array([updates] if rank < masters else [], dtype=np.int64), root=0)
    wsteps = gather(comm, np.array([steps] if rank >= masters else [], dtype=np.int64), root=0)
    wl = gather(comm, np.array([wloss] if rank >= masters else [], dtype=np.float64), root=0)
    comm.Free()
    if rank != 0:
        return PSResult(None, seconds=seconds)
    return PSResult(unflatten(whole, params), stale, stale_steady, loads, wsteps, wl, seconds)


# -- the staleness model of lab 09 ------------------------------------------------------------------------------------

def round_robin_staleness(workers: int, updates: int) -> np.ndarray:
    """The staleness of each of ``updates`` updates when ``workers`` workers take turns at one asynchronous master
    (worker k mod W sends the k-th), each computing on the weights the master last sent it (version 0 at the start):
    the master's version when it applies the update minus the version the gradient was computed on."""
    if workers < 1 or updates < 0:
        raise ValueError(f"need workers >= 1 and updates >= 0, got {workers} and {updates}")
    have = [0] * workers  # the version each worker holds
    out = np.zeros(updates, dtype=np.int64)
    for k in range(updates):
        w = k % workers
        out[k] = k - have[w]  # k updates applied before this one
        have[w] = k + 1  # the master answers with the weights after it
    return out


def delayed_descent(step: float, delay: int, iterations: int) -> np.ndarray:
    """Gradient descent on f(w) = h w^2 / 2 whose gradient is ``delay`` updates old: w_{t+1} = w_t - (eta h) w_{t-delay},
    from w_t = 1 for every t <= 0; ``step`` is eta h. Returns w_0 .. w_iterations."""
    if delay < 0 or iterations < 0:
        raise ValueError(f"need delay >= 0 and iterations >= 0, got {delay} and {iterations}")
    w = np.ones(iterations + 1)
    for t in range(iterations):
        w[t + 1] = w[t] - step * (w[t - delay] if t >= delay else 1.0)
    return w


def converges(descent, step: float, delay: int, iterations: int = 2000) -> bool:
    """Whether ``descent(step, delay, iterations)`` (:func:`delayed_descent` or a student's) ends near 0."""
    w = np.asarray(descent(step, delay, iterations), dtype=float)
    return bool(np.isfinite(w).all() and np.abs(w[-50:]).max() < 1e-3)


def largest_stable_step(delay: int, descent=delayed_descent, tol: float = 1e-3) -> float:
    """The largest eta h for which delayed descent still converges, found by bisection on (0, 2]."""
    lo, hi = 0.0, 2.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if converges(descent, mid, delay) else (lo, mid)
    return lo


def stable_step_formula(delay: int) -> float:
    """The largest stable eta h of delayed descent, 2 sin(pi / (4 delay + 2)): 2 without delay, 1 for one, about
    pi / (2 delay + 1) for long delays."""
    return 2 * math.sin(math.pi / (4 * delay + 2))


def stable_steps(descent=delayed_descent, delays=range(6)) -> tuple[dict, dict]:
    """The largest stable eta h at each of ``delays``: ({label: found by bisection on ``descent``}, {label: given by
    the closed form}), each keyed by the label its line takes in a plot (:func:`largest_stable_step`,
    :func:`stable_step_formula`). Lab 09 calls this after its students predict the value at delay 2, so that its
    notebook shows no formula that would give the value away before the run."""
    delays = list(delays)
    return ({"found by bisection": [largest_stable_step(d, descent) for d in delays]},
            {"2 sin(pi / (4 delay + 2))": [stable_step_formula(d) for d in delays]})


# -- lab 09's experiments, each one call on every rank ----------------------------------------------------------------

def accuracy_table(comm, sizes, train_data, test_data, epochs: int = 1, lrs=(0.1, 0.6), masters=(1, 2)) -> list:
    """Train on the first W + M ranks for every W workers and M ``masters`` at every learning rate; on rank 0 the rows
    (workers, masters, lr, test accuracy, mean staleness while every worker ran, seconds), an empty list elsewhere.
    Progress is printed."""
    x_test, y_test = test_data
    rows = []
    for m in masters:
        for w in range(1, comm.Get_size() - m + 1):
            with first_ranks(comm, w + m) as sub:
                if sub:
                    for lr in lrs:
                        r = train(sub, sizes, train_data, masters=m, epochs=epochs, lr=lr)
                        if comm.Get_rank() == 0:
                            rows.append((w, m, lr, mlp.accuracy(r.params, x_test, y_test, "relu", "cross_entropy"),
                                         float(r.steady_staleness.mean()), r.seconds))
                            print(f"{w} worker{'s' * (w > 1)}, {m} master{'s' * (m > 1)}, lr {lr}: done", flush=True)
            comm.Barrier()
    return rows


def remedies(comm, sizes, train_data, test_data, epochs: int = 1, lr: float = 0.6) -> tuple[dict, dict]:
    """Every rank but one a worker, one master, at the high ``lr``: asynchronous, bounded staleness (s = 0), each with
    lr and with lr / W, and synchronous. On rank 0 ({name: test accuracy}, {name: staleness of each update applied
    while every worker ran}), the updates the lab's mean staleness counts, as :func:`accuracy_table`'s."""
    x_test, y_test = test_data
    workers = comm.Get_size() - 1
    runs = {f"asynchronous, lr {lr}": dict(mode="async", lr=lr),
            f"bounded staleness s=0, lr {lr}": dict(mode="ssp", staleness_bound=0, lr=lr),
            f"asynchronous, lr {lr}/{workers}": dict(mode="async", lr=lr / workers),
            f"bounded staleness s=0, lr {lr}/{workers}": dict(mode="ssp", staleness_bound=0, lr=lr / workers),
            f"synchronous, lr {lr}": dict(mode="sync", lr=lr)}
    accuracy, staleness = {}, {}
    for name, kw in runs.items():
        r = train(comm, sizes, train_data, masters=1, epochs=epochs, **kw)
        if comm.Get_rank() == 0:
            accuracy[name] = mlp.accuracy(r.params, x_test, y_test, "relu", "cross_entropy")
            staleness[name] = r.steady_staleness
    return accuracy, staleness

