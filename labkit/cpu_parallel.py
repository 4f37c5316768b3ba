"""Backprop on several CPU cores, as the course did it with pthreads, and why Python makes that subtle.

Every class here is a drop-in for :func:`labkit.mlp.loss_and_grads`: call it with
``(params, x, y, activation=..., cost=..., l2=...)`` and get ``(mean loss, grads)``, so it can be
passed to ``mlp.train(..., method=pool)``. A mini-batch of n samples is split over p workers as
floor(n / p) samples each, the first n % p workers taking one more (:func:`labkit.shards.shard_bounds`).

* :class:`ThreadedBackprop` runs per-sample (or vectorised) backprop in a thread pool and combines
  the gradients through a lock-protected queue (``combine="queue"``, the course's way), a shared
  accumulator behind a lock (``"lock"``), or per-thread accumulators summed at the end (``"local"``).
  Threads share the interpreter: pure-Python work is serialised by the GIL; NumPy releases it
  inside large array operations.
* :class:`ProcessBackprop` runs data-parallel shards in separate processes (no GIL to share) that
  read the batch and the weights from shared memory and write their gradient sums back to it.
"""

from __future__ import annotations

import json
import os
import queue
import selectors
import socket
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from . import mlp
from .bench import interleaved, measure
from .errors import LabkitError
from .shards import shard_bounds


def shard_sums(params, x, Y, activation: str, cost: str, work: str):
    """Summed loss and summed gradients over the rows of one shard, by per-sample or vectorised work."""
    if work == "vectorised" and x.shape[0]:
        value, g = mlp.loss_and_grads_unchecked(params, x, Y, activation, cost, 0.0)
        k = x.shape[0]
        return value * k, [(gW * k, gb * k) for gW, gb in g]  # means back to sums
    return mlp.per_sample_sum(params, x, Y, activation, cost)


class ThreadedBackprop:
    """Backprop of one mini-batch spread over ``n_threads`` threads.

    ``work="per_sample"`` has each thread loop over its samples one by one (the course's pthreads
    program); ``work="vectorised"`` has each thread run matrix backprop on its shard.
    ``combine`` is ``"queue"``, ``"lock"`` or ``"local"`` (see the module docstring).
    """

    COMBINES = ("queue", "lock", "local")
    WORK = ("per_sample", "vectorised")

    def __init__(self, n_threads: int, combine: str = "local", work: str = "per_sample"):
        if n_threads < 1:
            raise ValueError(f"n_threads must be >= 1, got {n_threads}")
        if combine not in self.COMBINES:
            raise ValueError(f"combine must be one of {self.COMBINES}, got {combine!r}")
        if work not in self.WORK:
            raise ValueError(f"work must be one of {self.WORK}, got {work!r}")
        self.n_threads, self.combine, self.work = n_threads, combine, work
        self._pool = ThreadPoolExecutor(max_workers=n_threads, thread_name_prefix="backprop")

    def __repr__(self) -> str:
        return f"ThreadedBackprop(n_threads={self.n_threads}, combine={self.combine!r}, work={self.work!r})"

    def __call__(self, params, x, y, activation="sigmoid", cost="quadratic", l2=0.0):
        """(mean loss, mean gradients) of the batch: its shards backpropagated on the threads, combined by ``combine``."""
        Y = mlp.check_batch(params, x, y)
        n = x.shape[0]
        shards = [(a, b) for a, b in shard_bounds(n, self.n_threads) if b > a]

        def partial(lo, hi):
            """Summed loss and gradients of the rows lo:hi (one thread's shard)."""
            return shard_sums(params, x[lo:hi], Y[lo:hi], activation, cost, self.work)

        def items(lo, hi):
            """What a thread hands over: every sample's (loss, gradient), or its shard's sums when vectorised."""
            if self.work == "vectorised":
                yield partial(lo, hi)
            else:
                for k in range(lo, hi):
                    yield mlp.backprop_one(params, x[k][:, None], Y[k][:, None], activation, cost)

        if self.combine == "local":
            total, acc = self._combine_local(partial, shards)
        elif self.combine == "queue":
            total, acc = self._combine_queue(items, shards, n, params)
        else:
            total, acc = self._combine_lock(items, shards, params)
        return mlp.mean_from_sums(params, total, acc, n, l2)

    def _combine_local(self, partial, shards):
        """``combine="local"``: each thread sums its own shard into its own arrays (``partial``); one reduction at the end."""
        results = list(self._pool.map(lambda s: partial(*s), shards))
        total = sum(r[0] for r in results)
        acc = results[0][1]
        for _, g in results[1:]:
            mlp.add_into(acc, g)
        return total, acc

    def _combine_queue(self, items, shards, n, params):
        """``combine="queue"``: every item (a sample's gradient, or a shard's sums) passes through one lock-protected queue."""
        q: queue.Queue = queue.Queue()

        def produce(lo, hi):
            try:
                for item in items(lo, hi):
                    q.put(item)
            except BaseException as e:  # the consumer must not wait forever for a dead producer
                q.put(e)
                raise

        futures = [self._pool.submit(produce, lo, hi) for lo, hi in shards]
        expected = len(shards) if self.work == "vectorised" else n  # one item per shard, or one per sample
        total, acc = 0.0, mlp.zeros_like(params)
        for _ in range(expected):
            item = q.get()
            if isinstance(item, BaseException):
                raise item
            value, g = item
            total += value
            mlp.add_into(acc, g)
        for f in futures:
            f.result()
        return total, acc

    def _combine_lock(self, items, shards, params):
        """``combine="lock"``: one shared accumulator; every thread adds each of its items into it in a critical section."""
        lock = threading.Lock()
        acc = mlp.zeros_like(params)
        total = [0.0]

        def add_under_lock(lo, hi):
            for value, g in items(lo, hi):
                with lock:
                    total[0] += value
                    mlp.add_into(acc, g)

        for f in [self._pool.submit(add_under_lock, lo, hi) for lo, hi in shards]:
            f.result()
        return total[0], acc

    def close(self) -> None:
        """Stop the threads."""
        self._pool.shutdown(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# -- processes ------------------------------------------------------------------------------------


class WorkerError(LabkitError, RuntimeError):
    """A worker process failed, died or did not answer in time."""


def _views(buf, shapes, dtype, offset=0):
    """Arrays of the given shapes laid out one after another in a buffer (offset in elements)."""
    out, pos = [], offset
    for shape in shapes:
        out.append(np.ndarray(shape, dtype=dtype, buffer=buf, offset=pos * np.dtype(dtype).itemsize))
        pos += int(np.prod(shape))
    return out


def _layer_shapes(sizes):
    return [s for a, b in zip(sizes[:-1], sizes[1:]) for s in ((b, a), (b,))]


def _attach(name: str) -> shared_memory.SharedMemory:
    """Attach to a segment the parent owns, without this process's resource tracker adopting it."""
    try:
        return shared_memory.SharedMemory(name=name, track=False)  # Python >= 3.13
    except TypeError:
        from multiprocessing import resource_tracker

        shm = shared_memory.SharedMemory(name=name)
        resource_tracker.unregister(shm._name, "shared_memory")  # else it unlinks the parent's memory at exit
        return shm


def _worker_main(argv=None) -> None:
    """Entry point of a worker process: answer "step" messages until "stop" (JSON lines on a socket)."""
    cfg = json.loads((argv or sys.argv)[1])

    threadpool_limits(cfg["blas_threads"])
    sock = socket.socket(fileno=cfg["fd"])
    rfile, wfile = sock.makefile("rb"), sock.makefile("wb")

    def send(*msg):
        wfile.write(json.dumps(msg).encode() + b"\n")
        wfile.flush()

    sizes, dtype, rank, max_batch = cfg["sizes"], np.dtype(cfg["dtype"]), cfg["rank"], cfg["max_batch"]
    shm = [_attach(n) for n in cfg["shm"]]
    try:
        shapes = _layer_shapes(sizes)
        flat = _views(shm[0].buf, shapes, dtype)
        params = list(zip(flat[0::2], flat[1::2]))
        xbuf = np.ndarray((max_batch, sizes[0]), dtype=dtype, buffer=shm[1].buf)
        Ybuf = np.ndarray((max_batch, sizes[-1]), dtype=dtype, buffer=shm[2].buf)
        slot = _views(shm[3].buf, shapes, dtype, offset=rank * sum(int(np.prod(s)) for s in shapes))
        send("ready", os.getpid())
        for line in rfile:
            msg = json.loads(line)
            if msg[0] == "stop":
                break
            try:
                _, lo, hi, activation, cost, work = msg
                total, g = shard_sums(params, xbuf[lo:hi], Ybuf[lo:hi], activation, cost, work)
                for dst, src in zip(slot, (a for pair in g for a in pair)):
                    dst[...] = src
                send("ok", total)
            except Exception:
                send("error", traceback.format_exc())
    finally:
        del flat, params, xbuf, Ybuf, slot
        for s in shm:
            s.close()


def _cleanup(procs, socks, shms):
    for s in socks:
        try:
            s.sendall(b'["stop"]\n')
        except OSError:
            pass
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    for s in socks:
        s.close()
    for s in shms:
        s.close()
        try:
            s.unlink()
        except FileNotFoundError:
            pass


class ProcessBackprop:
    """Data-parallel backprop of each mini-batch over ``n_procs`` worker processes.

    The batch and the current weights are copied into shared memory; every worker backprops its
    shard (``work="vectorised"`` or ``"per_sample"``) with ``blas_threads`` BLAS threads and writes
    the summed gradients into its own slot; the caller adds the slots up. Workers are separate
    Python processes (no GIL to share) started once, about a second each, and stopped by
    :meth:`close`, by ``with``, or when the object is collected. Control messages are JSON lines.
    """

    def __init__(self, sizes, n_procs: int, max_batch: int = 1024, dtype=np.float32,
                 work: str = "vectorised", blas_threads: int = 1, timeout: float = 120.0):
        if n_procs < 1:
            raise ValueError(f"n_procs must be >= 1, got {n_procs}")
        if work not in ThreadedBackprop.WORK:
            raise ValueError(f"work must be one of {ThreadedBackprop.WORK}, got {work!r}")
        self.sizes = [int(s) for s in sizes]
        self.n_procs, self.max_batch, self.work, self.timeout = n_procs, max_batch, work, timeout
        self.dtype = np.dtype(dtype)
        self._shapes = _layer_shapes(self.sizes)
        n_par = sum(int(np.prod(s)) for s in self._shapes)
        item = self.dtype.itemsize
        nbytes = [n_par * item, max_batch * self.sizes[0] * item, max_batch * self.sizes[-1] * item,
                  n_procs * n_par * item]
        self._shm = [shared_memory.SharedMemory(create=True, size=max(b, 1)) for b in nbytes]
        self._procs: list[subprocess.Popen] = []
        self._socks: list[socket.socket] = []
        self._files: list = []
        self._finalizer = weakref.finalize(self, _cleanup, self._procs, self._socks, self._shm)
        flat = _views(self._shm[0].buf, self._shapes, self.dtype)
        self._params = list(zip(flat[0::2], flat[1::2]))
        self._x = np.ndarray((max_batch, self.sizes[0]), dtype=self.dtype, buffer=self._shm[1].buf)
        self._Y = np.ndarray((max_batch, self.sizes[-1]), dtype=self.dtype, buffer=self._shm[2].buf)
        self._slots = np.ndarray((n_procs, n_par), dtype=self.dtype, buffer=self._shm[3].buf)
        env = dict(os.environ)
        here = str(Path(__file__).resolve().parent.parent)  # so workers import this very labkit
        env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        for r in range(n_procs):
            mine, theirs = socket.socketpair()
            cfg = {"rank": r, "fd": theirs.fileno(), "shm": [s.name for s in self._shm], "sizes": self.sizes,
                   "dtype": self.dtype.str, "max_batch": max_batch, "blas_threads": blas_threads}
            code = "import sys; from labkit.cpu_parallel import _worker_main; _worker_main(sys.argv)"
            p = subprocess.Popen([sys.executable, "-c", code, json.dumps(cfg)], pass_fds=[theirs.fileno()], env=env)
            theirs.close()
            self._procs.append(p)
            self._socks.append(mine)
            self._files.append(mine.makefile("rb"))
        for r in range(n_procs):
            self._recv(r, "start")

    def __repr__(self) -> str:
        return f"ProcessBackprop(sizes={self.sizes}, n_procs={self.n_procs}, work={self.work!r})"

    def _recv(self, r: int, what: str):
        sock, proc = self._socks[r], self._procs[r]
        with selectors.DefaultSelector() as waiting:  # epoll: no limit on the descriptor's number, as select() has
            waiting.register(sock, selectors.EVENT_READ)
            ready = waiting.select(self.timeout)
        if not ready:
            state = "is still running" if proc.poll() is None else f"exited with code {proc.returncode}"
            self.close()
            raise WorkerError(f"worker {r} did not answer within {self.timeout:g} s during {what}; it {state}")
        line = self._files[r].readline()
        if not line:
            code = proc.wait()
            self.close()
            raise WorkerError(f"worker {r} died during {what} (exit code {code}); its error is printed above")
        msg = json.loads(line)
        if msg[0] == "error":
            self.close()
            raise WorkerError(f"worker {r} failed during {what}:\n{msg[1]}")
        return msg[1]

    def __call__(self, params, x, y, activation="sigmoid", cost="quadratic", l2=0.0):
        if not self._procs or any(p.poll() is not None for p in self._procs):
            dead = [r for r, p in enumerate(self._procs) if p.poll() is not None]
            self.close()
            if dead:
                raise WorkerError(f"worker(s) {dead} died, so the pool was closed; create a new ProcessBackprop")
            raise WorkerError("the worker processes are not running (closed, or one died); create a new ProcessBackprop")
        Y = mlp.check_batch(params, x, y)
        if mlp.sizes_of(params) != self.sizes:
            raise ValueError(f"params have sizes {mlp.sizes_of(params)} but this pool was built for {self.sizes}")
        n = x.shape[0]
        if n > self.max_batch:
            raise ValueError(f"batch of {n} exceeds max_batch={self.max_batch}; build the pool with a larger max_batch")
        for (dW, db), (W, b) in zip(self._params, params):
            dW[...] = W
            db[...] = b
        self._x[:n] = x
        self._Y[:n] = Y
        for r, (lo, hi) in enumerate(shard_bounds(n, self.n_procs)):
            self._socks[r].sendall(json.dumps(["step", lo, hi, activation, cost, self.work]).encode() + b"\n")
        total = sum(self._recv(r, "a step") for r in range(self.n_procs))
        summed = self._slots.sum(axis=0)
        acc_flat = _views(summed, self._shapes, self.dtype)
        return mlp.mean_from_sums(params, total, list(zip(acc_flat[0::2], acc_flat[1::2])), n, l2)

    def close(self) -> None:
        """Stop the workers and free the shared memory (safe to call twice)."""
        for f in self._files:
            f.close()
        self._files.clear()
        self._params = self._x = self._Y = self._slots = None  # drop views before the memory goes
        self._finalizer()
        self._procs.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# -- combining the workers' results ---------------------------------------------------------------


def combine_means(grads, counts):
    """The whole batch's mean gradient from ``k`` workers' mean gradients (lab 02's third exercise).

    ``grads[i]`` is worker i's params-like list of (dW, db), the mean over its shard of ``counts[i]`` samples. The
    batch's mean is sum_i counts[i] grads[i] / sum_i counts[i]; an empty shard's mean (NaN, the mean of nothing)
    is left out. Returns new arrays; ``grads`` is left as it was.
    """
    total = sum(int(c) for c in counts)
    if total < 1:
        raise ValueError(f"the shards hold no samples (counts {list(counts)})")
    out = None
    for g, c in zip(grads, counts):
        if not c:
            continue
        scaled = [(gW * (c / total), gb * (c / total)) for gW, gb in g]
        out = scaled if out is None else mlp.add_into(out, scaled)
    return out


def threaded_grads(params, x, Y, p: int):
    """The batch's (mean loss, mean gradients), as :func:`labkit.mlp.loss_and_grads_per_sample` gives them, from ``p``
    threads (lab 02's fourth exercise, labkit's way): thread i sums the per-sample gradients of shard i
    (:func:`labkit.shards.shard_bounds`) into an accumulator of its own; once every thread is joined, the
    accumulators and the losses are added and divided by the batch size. An empty shard (p > n) adds nothing."""
    n = x.shape[0]
    if n < 1 or p < 1:
        raise ValueError(f"need at least one sample and one thread, got n={n}, p={p}")
    shards = shard_bounds(n, p)

    def work(lo: int, hi: int):
        acc, value = mlp.zeros_like(params), 0.0  # this thread's own: no other thread writes into it
        for k in range(lo, hi):  # one sample at a time, as the exercise's accumulate does
            loss, g = mlp.loss_and_grads_per_sample(params, x[k:k + 1], Y[k:k + 1])
            value += loss
            mlp.add_into(acc, g)
        return value, acc

    with ThreadPoolExecutor(max_workers=p, thread_name_prefix="threaded_grads") as pool:
        results = list(pool.map(work, *zip(*shards)))  # every shard submitted before any result is awaited
    total = results[0][1]
    for _, acc in results[1:]:
        mlp.add_into(total, acc)
    return mlp.mean_from_sums(params, sum(v for v, _ in results), total, n)


# -- measuring ------------------------------------------------------------------------------------


def time_per_batch(grad_fn, params, x, y, repeat: int = 5, **kw) -> float:
    """Median seconds of one gradient computation on the batch (x, y), after one warm-up call."""
    return measure(lambda: grad_fn(params, x, y, **kw), repeat=repeat, warmup=1).median


def _seconds_of(fn, *args) -> Callable[[], float]:
    """A job for :func:`labkit.bench.interleaved`: one call of ``fn(*args)``, its wall seconds."""
    def job() -> float:
        t0 = time.perf_counter()
        fn(*args)
        return time.perf_counter() - t0
    return job


def thread_speedups(params, x, y, threads, repeat: int = 3, work: str = "per_sample"):
    """Lab 02's first timing: (serial seconds per batch, {"threads, <combine>": speedups over ``threads``}) of every
    :class:`ThreadedBackprop` combine, each with one BLAS thread per call so that only the pool's threads overlap.
    Every configuration runs once per round, side by side with the serial one (:func:`labkit.bench.interleaved`), so
    a slow spell of a shared machine lands on all of them; each figure is the median over ``4 * repeat + 1`` rounds
    (a round takes milliseconds, and a few rounds let one slow spell decide which pool looks best)."""

    t_serial, timed = _pools_against_serial(
        lambda: {(c, n): ThreadedBackprop(n, c, work) for c in ThreadedBackprop.COMBINES for n in threads},
        params, x, y, work, rounds=4 * repeat + 1)
    speedups = {f"threads, {c}": t_serial / np.array([timed[(c, n)] for n in threads]) for c in ThreadedBackprop.COMBINES}
    return t_serial, speedups


def _pools_against_serial(make_pools, params, x, y, work: str, rounds: int) -> tuple[float, dict]:
    """(median seconds of the serial loop, {key: median seconds} of each pool ``make_pools()`` returns), all with one
    BLAS thread (the pools made under that limit, so that worker processes inherit it), warmed up, then side by side
    in ``rounds`` interleaved rounds (:func:`labkit.bench.interleaved`); the pools are closed whatever happens."""
    serial = mlp.loss_and_grads_per_sample if work == "per_sample" else mlp.loss_and_grads
    pools: dict = {}
    try:
        with threadpool_limits(1):
            pools.update(make_pools())
            jobs = {"serial": _seconds_of(serial, params, x, y)}
            jobs.update({key: _seconds_of(pool, params, x, y) for key, pool in pools.items()})
            for job in jobs.values():  # warm up
                job()
            timed = interleaved(jobs, rounds=rounds)
    finally:
        for pool in pools.values():
            pool.close()
    return timed.pop("serial").median, {key: t.median for key, t in timed.items()}


def _against_one(one, pool, repeat: int) -> float:
    """The speedup of ``pool`` over ``one`` (two timed callables), warmed up, in interleaved rounds, medians."""
    one(), pool()
    timed = interleaved({"one": one, "pool": pool}, rounds=2 * repeat + 1)
    return timed["one"].median / timed["pool"].median


def _cores_kept(fn, *args) -> tuple[Callable[[], float], list[float]]:
    """A job as :func:`_seconds_of` gives it, and the list into which each call puts the cores this process kept
    busy meanwhile: its CPU seconds, every thread's, over the wall seconds. Two threads that take turns keep one
    core busy however many are free; two that compute at once keep up to two. A neighbour's load lowers it, never
    raises it."""
    kept: list[float] = []

    def job() -> float:
        c0, t0 = time.process_time(), time.perf_counter()
        fn(*args)
        wall = time.perf_counter() - t0
        kept.append((time.process_time() - c0) / wall if wall > 0 else 0.0)
        return wall
    return job, kept


CORES_KEPT = "cores the 2 threads kept busy"  # two_worker_speedups' count of the threads computing at once


def two_worker_speedups(widths, x, y, repeat: int = 3, classes: int = 10) -> dict:
    """Lab 02's width sweep: per hidden-layer width, the speedup of 2 threads (per-thread accumulators) and of 2
    processes over one thread, per-sample backprop of [n_in, width, classes], one BLAS thread everywhere. The three
    run side by side in ``2 * repeat + 1`` interleaved rounds (:func:`labkit.bench.interleaved`); each speedup is the
    ratio of the medians. ``CORES_KEPT``: the median cores the two threads kept busy at once (:func:`_cores_kept`),
    which says whether they computed at once whatever the neighbours did: beside a busy loop on every core two
    threads get two shares of the cores where one thread gets one, and finish sooner without computing at once."""
    sweep = {"threads (2), per-sample": [], "processes (2), per-sample": [], CORES_KEPT: []}
    with threadpool_limits(1):  # the workers' processes use one BLAS thread too
        for width in widths:
            sizes = [x.shape[1], int(width), classes]
            p = mlp.init_params(sizes)
            one = _seconds_of(mlp.loss_and_grads_per_sample, p, x, y)
            # each pool against one thread, the other pool not alive: its idle workers would share the cores
            with ThreadedBackprop(2, "local", "per_sample") as threads:
                job, kept = _cores_kept(threads, p, x, y)
                t = _against_one(one, job, repeat)
            with ProcessBackprop(sizes, 2, max_batch=len(x), work="per_sample") as procs:
                q = _against_one(one, _seconds_of(procs, p, x, y), repeat)
            sweep["threads (2), per-sample"].append(t)
            sweep["processes (2), per-sample"].append(q)
            sweep[CORES_KEPT].append(float(np.median(kept[1:])))  # the warm-up call left out
    return sweep


def threaded_step_times(yours, params, x, Y, repeat: int = 3) -> dict[str, float]:
    """Lab 02's fourth exercise timed beside labkit's: median seconds per batch of ``yours(params, x, Y, p)`` and of
    :func:`threaded_grads`, which both call :func:`labkit.mlp.loss_and_grads_per_sample` once per row, and of
    ``ThreadedBackprop(p, "local")``, whose threads run the per-sample loop once per shard; p = 1 and 2, one BLAS
    thread, side by side in ``2 * repeat + 1`` interleaved rounds (:func:`labkit.bench.interleaved`)."""
    pools = {p: ThreadedBackprop(p, "local") for p in (1, 2)}
    jobs = {}
    for p in (1, 2):
        jobs[f"yours, {p} thread{'s' * (p > 1)}"] = _seconds_of(yours, params, x, Y, p)
        jobs[f"threaded_grads, {p} thread{'s' * (p > 1)}"] = _seconds_of(threaded_grads, params, x, Y, p)
        jobs[f"ThreadedBackprop, {p} thread{'s' * (p > 1)}"] = _seconds_of(pools[p], params, x, Y)
    try:
        with threadpool_limits(1):
            for job in jobs.values():  # warm up
                job()
            timed = interleaved(jobs, rounds=2 * repeat + 1)
    finally:
        for pool in pools.values():
            pool.close()
    return {name: t.median for name, t in timed.items()}


def process_speedups(params, x, y, procs, repeat: int = 3, work: str = "per_sample") -> tuple[float, np.ndarray]:
    """Lab 02's Amdahl reading: (serial seconds per batch, the speedup of ``ProcessBackprop(k)`` for each k in
    ``procs``), one BLAS thread everywhere. The serial loop and every pool run once per round, side by side in
    ``2 * repeat + 1`` interleaved rounds (:func:`labkit.bench.interleaved`); each figure is a median. Idle pools
    wait on a socket and take no core from the one being timed."""
    sizes = mlp.sizes_of(params)
    t_serial, timed = _pools_against_serial(
        lambda: {int(k): ProcessBackprop(sizes, int(k), max_batch=len(x), dtype=params[0][0].dtype, work=work)
                 for k in procs}, params, x, y, work, rounds=2 * repeat + 1)
    return t_serial, np.array([t_serial / timed[int(k)] for k in procs])
