"""The latency-bandwidth (alpha-beta) cost model: t(m) = alpha + m * beta for a message of m bytes.

Measure alpha and beta with a ping-pong between two ranks, fit them, and predict how long each
allreduce algorithm should take on p ranks for N bytes:

=====================  ====================================  ==========================
algorithm              predicted time                        bound by
=====================  ====================================  ==========================
naive                  (p - 1) (alpha + N beta)              bandwidth, badly
reduce + broadcast     2 log2(p) (alpha + N beta)            both
recursive doubling     log2(p) (alpha + N beta)              latency for small N
ring                   2 (p - 1) (alpha + N/p beta)          bandwidth (optimal for large N)
=====================  ====================================  ==========================

The functions that measure take a communicator and must run on every rank (under ``mpiexec``, on MPI
engines, or across hosts with :meth:`labkit.network.Wire.run`, as ``wire.run("labkit.costmodel:pingpong",
ranks=2, sizes=[...])``); the rest is plain arithmetic.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .bench import measure
from .cluster import run_mpi


@dataclass(frozen=True)
class AlphaBeta:
    """A fitted cost model: latency ``alpha`` (s) and inverse bandwidth ``beta`` (s/byte)."""

    alpha: float
    beta: float

    @property
    def bandwidth(self) -> float:
        """Bytes per second, 1 / beta."""
        return 1.0 / self.beta if self.beta > 0 else math.inf

    def time(self, nbytes) -> np.ndarray:
        """Predicted one-way time of a message of ``nbytes``."""
        return self.alpha + np.asarray(nbytes, dtype=float) * self.beta

    def half_performance_size(self) -> float:
        """n_1/2 = alpha / beta: the message size at which latency and bandwidth cost the same."""
        return self.alpha / self.beta if self.beta > 0 else math.inf

    def __str__(self) -> str:
        rate = self.bandwidth  # GB/s for memory, MB/s for a cable of 100 Mbit/s (12.5 MB/s)
        speed = f"{rate / 1e9:.2f} GB/s" if rate >= 1e9 else f"{rate / 1e6:.2f} MB/s"
        return f"alpha = {self.alpha * 1e6:.2f} µs, bandwidth = {speed}"


def fit(nbytes: Sequence[float], seconds: Sequence[float]) -> AlphaBeta:
    """Least-squares alpha and beta, weighting each point by 1/t so small and large messages count alike."""
    m, t = np.asarray(nbytes, dtype=float), np.asarray(seconds, dtype=float)
    if m.shape != t.shape or m.size < 2:
        raise ValueError("need at least two (size, time) points of equal count")
    if (t <= 0).any():
        raise ValueError("times must be positive")
    A = np.stack([np.ones_like(m), m], axis=1) / t[:, None]
    alpha, beta = np.linalg.lstsq(A, np.ones_like(t), rcond=None)[0]
    return AlphaBeta(max(float(alpha), 0.0), max(float(beta), 1e-18))


def _log2p(p: int) -> int:
    return math.ceil(math.log2(p)) if p > 1 else 0


PREDICTIONS: dict[str, Callable[[AlphaBeta, int, float], float]] = {
    "naive": lambda ab, p, n: (p - 1) * (ab.alpha + n * ab.beta),
    "reduce_broadcast": lambda ab, p, n: 2 * _log2p(p) * (ab.alpha + n * ab.beta),
    "recursive_doubling": lambda ab, p, n: _log2p(p) * (ab.alpha + n * ab.beta),
    "ring": lambda ab, p, n: 2 * (p - 1) * (ab.alpha + n / p * ab.beta),
}


def predict(algorithm: str, model: AlphaBeta, p: int, nbytes) -> np.ndarray:
    """Predicted allreduce time of ``algorithm`` on p ranks for arrays of ``nbytes`` bytes."""
    if algorithm not in PREDICTIONS:
        raise ValueError(f"no prediction for {algorithm!r}; known: {', '.join(PREDICTIONS)}")
    return np.array([PREDICTIONS[algorithm](model, p, float(n)) for n in np.atleast_1d(nbytes)])


def crossover(model: AlphaBeta, p: int, slow_small: str = "ring", fast_small: str = "recursive_doubling") -> float:
    """Message size (bytes) above which ``slow_small`` beats ``fast_small`` under the model (inf if never)."""
    a = PREDICTIONS[slow_small](model, p, 0.0) - PREDICTIONS[fast_small](model, p, 0.0)  # latency terms
    b = (PREDICTIONS[fast_small](model, p, 1.0) - PREDICTIONS[fast_small](model, p, 0.0)) - \
        (PREDICTIONS[slow_small](model, p, 1.0) - PREDICTIONS[slow_small](model, p, 0.0))  # bandwidth terms
    return a / b if b > 0 else math.inf


def cable_seconds(log, p: int, alpha: float, beta: float) -> float:
    """The alpha-beta time of the messages of a traffic log (:meth:`labkit.traffic.TrafficComm.gather_log`: rows of
    source, dest, bytes, round) when each of the ``p`` ranks has a cable of its own to a switch that never waits (lab
    07's exercise 4). A cable carries its rank's messages out and in at the same time, each way at 1/beta bytes per
    second, and every message pays alpha on the cable it leaves and on the one it enters. The messages of one round
    travel together and the round ends when its busiest cable, one way, is done; the rounds follow one another. For
    lab 07's naive allreduce this is (p - 1)(alpha + m beta), for its ring 2 (p - 1)(alpha + m / p beta)."""
    log = np.asarray(log, dtype=np.int64).reshape(-1, 4)
    total = 0.0
    for r in np.unique(log[:, 3]):
        msgs = log[log[:, 3] == r]
        cost = alpha + msgs[:, 2] * beta
        out = np.bincount(msgs[:, 0], weights=cost, minlength=p)
        into = np.bincount(msgs[:, 1], weights=cost, minlength=p)
        total += max(out.max(), into.max())
    return float(total)


# -- measuring (every rank calls these) --------------------------------------------------------------


def pingpong(comm, sizes: Sequence[int], repeat: int = 20, warmup: int = 3, a: int = 0, b: int = 1,
             fastest: bool = False) -> np.ndarray | None:
    """One-way times (s) for messages of each size in bytes between ranks a and b, the median of ``repeat`` round
    trips (``fastest``: the least, what the link carries when nothing else slows it); the array on rank a, None
    elsewhere."""
    from mpi4py import MPI

    r = comm.Get_rank()
    if comm.Get_size() < 2:
        raise ValueError("a ping-pong needs at least two ranks")
    out = []
    # untimed round trips first: between hosts, the first messages pay for opening the connection and TCP's start
    # (milliseconds for a 1 KB message here), which would otherwise land on the first size
    one = np.zeros(1, dtype=np.uint8)
    for _ in range(20):
        _round_trip(comm, one, a, b)
    for size in sizes:
        buf = np.zeros(int(size), dtype=np.uint8)
        best = []
        for i in range(warmup + repeat):
            comm.Barrier()
            t0 = MPI.Wtime()
            _round_trip(comm, buf, a, b)
            if i >= warmup:
                best.append((MPI.Wtime() - t0) / 2)
        out.append(float(np.min(best) if fastest else np.median(best)))
    return np.array(out) if r == a else None


def _round_trip(comm, buf: np.ndarray, a: int, b: int) -> None:
    """``buf`` from rank a to rank b and back; other ranks do nothing."""
    r = comm.Get_rank()
    if r == a:
        comm.Send(buf, dest=b, tag=11)
        comm.Recv(buf, source=b, tag=12)
    elif r == b:
        comm.Recv(buf, source=a, tag=11)
        comm.Send(buf, dest=a, tag=12)


def time_collective(comm, fn: Callable, x: np.ndarray, repeat: int = 5, warmup: int = 1, **kw) -> float:
    """Median over repetitions of the slowest rank's time for ``fn(comm, x, **kw)``; the same value on every rank."""
    return measure(lambda: fn(comm, x, **kw), repeat=repeat, warmup=warmup, clock="mpi", comm=comm).median


def allreduce_times(comm, sizes: Sequence[int], algorithms: Sequence[str] = ("naive", "ring"),
                    repeat: int = 3) -> dict:
    """Every rank: each allreduce of :data:`labkit.collectives.ALLREDUCES` named in ``algorithms`` timed on float32
    arrays of each of ``sizes`` elements, the median over ``repeat`` calls (after one warm-up) of the slowest rank's
    time (:func:`time_collective`). Returns ``{"sizes": [...], "nbytes": [...], name: [seconds, ...]}``, plain lists,
    the same on every rank (what :meth:`labkit.network.Wire.run` sends back)."""
    from .collectives import ALLREDUCES

    unknown = [name for name in algorithms if name not in ALLREDUCES]
    if unknown:  # every rank refuses, before any message
        raise ValueError(f"no allreduce named {', '.join(map(repr, unknown))}; known: {', '.join(ALLREDUCES)}")
    out: dict = {"sizes": [int(n) for n in sizes], "nbytes": [4 * int(n) for n in sizes]}
    for name in algorithms:
        out[name] = [float(time_collective(comm, ALLREDUCES[name], np.ones(int(n), np.float32), repeat=repeat,
                                           check=False)) for n in sizes]
    return out


PINGPONG = """
import json, sys
from mpi4py import MPI
from labkit.costmodel import pingpong
t = pingpong(MPI.COMM_WORLD, [int(sys.argv[1])], repeat=int(sys.argv[2]), warmup=1, fastest=True)
if t is not None:
    print("ONE_WAY", json.dumps(float(t[0])), flush=True)
"""


# What of a shaped cable's rate a TCP stream's payload can use: a full segment of 1,448 bytes (MTU 1,500 less 20 B of
# IP and 32 B of TCP with timestamps, Linux's default) rides in a frame of 1,514 bytes (14 B of Ethernet), and the
# token bucket counts the whole frame
PAYLOAD_SHARE = 1448 / 1514


def measure_link_rate(hosts, nbytes: int | None = None, repeat: int = 5, timeout: float = 120.0) -> dict:
    """The rate a ping-pong between host 0 and host 1 of namespace hosts (:func:`labkit.cluster.hosts.namespace_hosts`)
    gets: one rank on each, ``nbytes`` each way (by default a
    quarter of a second's worth at the cable's rate), the fastest of ``repeat`` round trips: a cable's rate is what
    it carries, and the work of the machine's other processes only ever slows a transfer. Returns a dict with
    ``bits_per_second`` measured (payload only: TCP's and Ethernet's headers ride on the cable too), ``set`` (the
    cable's rate, or None), ``ratio`` (measured over the payload the cable carries at that rate, set x
    :data:`PAYLOAD_SHARE`) and the message size."""
    if len(hosts.names) < 2:
        raise ValueError("measuring a cable needs two hosts: namespace_hosts(2, link=...)")
    rate = hosts.link_bits_per_second
    if nbytes is None:
        nbytes = 16 << 20 if rate is None else int(min(max(rate / 8 * 0.25, 1 << 20), 64 << 20))
    done = run_mpi(["-c", PINGPONG, str(int(nbytes)), str(int(repeat))], n=2, hosts=hosts, timeout=timeout)
    if done.returncode != 0 or "ONE_WAY " not in done.stdout:
        raise RuntimeError(f"the ping-pong between the hosts failed (exit {done.returncode}): {done.stderr[-2000:]}")
    one_way = json.loads(done.stdout.split("ONE_WAY ", 1)[1].split()[0])
    measured = nbytes * 8 / one_way
    return {"bits_per_second": measured, "set": rate, "ratio": None if rate is None else measured / (rate * PAYLOAD_SHARE),
            "nbytes": int(nbytes), "one_way_seconds": one_way}
