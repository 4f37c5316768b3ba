"""Strong and weak scaling of the labs' workloads on 1..N MPI ranks: :func:`strong_scaling`, :func:`weak_scaling`,
and their results, :class:`Scaling` (speedups, efficiencies, Karp-Flatt, serial fractions fitted with Amdahl's or
Gustafson's law). ``labkit bench scaling`` and lab 12 use them.

Workloads (``size`` is the whole problem in strong scaling; in weak scaling the problem is scaled by ``scale``,
the rank count unless given, so that each rank's share stays ``size``):

* ``"backprop"``: one synchronous data-parallel SGD step of [784,256,10] (the step of lab 08): every rank
  backprops its shard of a batch of ``size`` samples, the gradients are summed with ``MPI_Allreduce``
  (:class:`labkit.data_parallel.DataParallel`) and every rank updates its weights; one BLAS thread per rank.
* ``"synthetic"``: a known serial fraction: rank 0 alone does ``serial`` (default 0.1) of ``size`` units of
  work (128x128 matrix products) while the others wait, then the rest is shared out. The fitted serial
  fraction should come back near ``serial`` while the ranks do not outnumber the cores.

Each run is a separate ``mpiexec`` job of this module (``python -m labkit.scaling CONFIG``); rank 0 prints one JSON
line with the step times (the ``"mpi"`` clock: the slowest rank's), the median seconds per phase, and optionally one
step's timeline on every rank.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import threadpool_limits

from . import cluster, mlp
from .bench import Timeline, Timing, efficiency, fit_amdahl_times, fit_gustafson, karp_flatt, measure
from .costmodel import AlphaBeta, predict
from .data_parallel import DataParallel
from .machine import usable_cores
from .progress import progress_bar

WORKLOADS = {
    "backprop": "one data-parallel SGD step of [784,256,10] (lab 08): shard backprop, MPI_Allreduce, update",
    "synthetic": "a known serial fraction: rank 0 alone does `serial` of the work, then all ranks share the rest",
}
_OPTIONS = {"backprop": set(), "synthetic": {"serial"}}
PHASES = ("compute", "comm")  # a step's parts on each rank: "comm" is its time in the collective, waiting included
_DEFAULT_SIZE = {("backprop", "strong"): 4096, ("backprop", "weak"): 1024,
                 ("synthetic", "strong"): 1000, ("synthetic", "weak"): 500}
UNIT = 128  # a unit of synthetic work: one UNIT x UNIT float64 matrix product
BACKPROP_LAYERS = (784, 256, 10)
GRADIENT_BYTES = 4 * sum(a * b + b for a, b in zip(BACKPROP_LAYERS, BACKPROP_LAYERS[1:]))  # float32: 814,120


def default_size(workload: str, mode: str) -> int:
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; available: {', '.join(WORKLOADS)}")
    return _DEFAULT_SIZE[(workload, mode)]


def _backprop_step(comm, cfg: dict, timeline):
    n = cfg["size"] * cfg["scale"]
    rng = np.random.default_rng(0)  # the same global batch on every rank
    x = rng.random((n, 784), dtype=np.float32)
    y = rng.integers(0, 10, n)
    params = mlp.init_params(list(BACKPROP_LAYERS), seed=0, init="he")
    dp = DataParallel(comm, allreduce="mpi")
    dp.timeline = timeline

    def step():
        _, grads = dp(params, x, y, activation="relu", cost="cross_entropy")
        if timeline is not None:
            t0 = time.perf_counter()
        for (W, b), (gW, gb) in zip(params, grads):
            W -= 0.05 * gW
            b -= 0.05 * gb
        if timeline is not None:
            timeline.add("update", "compute", t0, time.perf_counter())

    def phases():
        return {"compute": dp.compute_seconds, "comm": dp.comm_seconds}

    return step, phases


def _synthetic_step(comm, cfg: dict, timeline):
    p, rank = comm.Get_size(), comm.Get_rank()
    size, f = cfg["size"], cfg.get("serial", 0.1)
    if not 0 <= f <= 1:
        raise ValueError(f"serial must be in [0, 1], got {f}")
    serial = round(f * size)
    parallel = (size - serial) * cfg["scale"]  # weak scaling grows the parallel part only: Gustafson's model
    per_rank = parallel // p + (1 if rank < parallel % p else 0)
    a = np.random.default_rng(rank).random((UNIT, UNIT))
    b = np.random.default_rng(rank + 1).random((UNIT, UNIT)) / UNIT
    spent = {"compute": 0.0, "comm": 0.0}

    def work(units: int) -> None:
        c = a
        for _ in range(units):
            c = c @ b

    def timed(name, kind, fn, *args):
        t0 = time.perf_counter()
        fn(*args)
        t1 = time.perf_counter()
        spent[kind] += t1 - t0
        if timeline is not None:
            timeline.add(name, kind, t0, t1)

    def step():
        if rank == 0:
            timed("serial part", "compute", work, serial)
        timed("wait", "comm", comm.Barrier)
        timed("parallel part", "compute", work, per_rank)

    return step, lambda: dict(spent)


def worker(cfg: dict) -> None:
    """Runs on every rank of one job; rank 0 prints one JSON line."""
    threadpool_limits(1)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    make = {"backprop": _backprop_step, "synthetic": _synthetic_step}[cfg["workload"]]
    step, phases = make(comm, cfg, None)
    steps = []  # this rank's seconds per phase in each step

    def timed_step():
        before = phases()
        step()
        after = phases()
        steps.append([after[k] - before[k] for k in PHASES])

    timing = measure(timed_step, repeat=cfg["repeat"], warmup=cfg["warmup"], clock="mpi", comm=comm)
    every = comm.gather(np.array(steps[-cfg["repeat"]:]), root=0)  # the timed steps: rank x step x phase
    out = {"p": comm.Get_size(), "times": timing.times}
    if comm.Get_rank() == 0:
        every = np.array(every)
        longest = every.max(axis=0)  # per step, each phase's longest over the ranks
        out["phases"] = {k: float(np.median(longest[:, i])) for i, k in enumerate(PHASES)}
        if comm.Get_size() > 1:  # the rank that waited least, each step
            out["transfer"] = every[:, :, PHASES.index("comm")].min(axis=0).tolist()
    if cfg.get("trace"):
        tl = Timeline(comm.Get_rank())
        step, _ = make(comm, cfg, tl)
        step()  # warm the new buffers
        comm.Barrier()
        tl.reset()
        step()
        out["trace"] = tl.gather(comm)
    if comm.Get_rank() == 0:
        print(json.dumps(out), flush=True)


def launch(workload: str, mode: str, p: int, size: int, repeat: int = 5, warmup: int = 1, timeout: float = 120,
           trace: bool = False, scale: int | None = None, hosts=None, **extra) -> dict:
    """Run one workload on ``p`` ranks under ``mpiexec``; the parsed JSON of rank 0. In weak mode the problem is
    ``scale`` (default ``p``) times the one-rank problem: ``scale=p`` on one rank times the scaled problem serially.
    ``hosts``: spread the ranks over these (namespace hosts with shaped cables, say: :mod:`labkit.network`)."""
    default_size(workload, mode)  # checks the name
    if mode not in ("strong", "weak"):
        raise ValueError(f"mode must be 'strong' or 'weak', got {mode!r}")
    if size < 1 or repeat < 1:
        raise ValueError(f"size and repeat must be positive, got size={size}, repeat={repeat}")
    unknown = set(extra) - _OPTIONS[workload]
    if unknown:
        raise ValueError(f"the {workload!r} workload takes no option {', '.join(sorted(unknown))}; its options: "
                         f"{', '.join(sorted(_OPTIONS[workload])) or 'none'}")
    scale = 1 if mode == "strong" else p if scale is None else int(scale)
    if scale < 1:
        raise ValueError(f"scale must be >= 1, got {scale}")
    cfg = {"workload": workload, "mode": mode, "size": size, "scale": scale, "repeat": repeat, "warmup": warmup,
           "trace": trace, **extra}
    try:
        res = cluster.run_mpi(["-m", "labkit.scaling", json.dumps(cfg)], n=p, timeout=timeout, hosts=hosts)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"the {p}-rank {mode}-scaling run of {workload!r} did not finish in {timeout:g} s and was "
                           f"stopped; use a smaller size or fewer repeats, or a larger timeout\n"
                           f"{(e.stderr or '')[-2000:]}") from None
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        raise RuntimeError(f"the {p}-rank {mode}-scaling run of {workload!r} failed (exit {res.returncode}):\n"
                           f"{res.stderr[-3000:]}")
    return json.loads(lines[-1])


@dataclass
class Scaling:
    """Times of one workload on 1..N ranks.

    ``mode="strong"``: the same total work on every rank count; the speedup is T_1 / T_p, compared with Amdahl's
    law. ``mode="weak"``: the work grows with the ranks (each rank's share stays the same); the *scaled speedup*
    is the one-rank time of the scaled problem over its p-rank time, ``serial_timings[i] / timings[i]``, compared
    with Gustafson's law, whose serial fraction is the share of the p-rank run's time that only one rank works.
    Without ``serial_timings`` it is estimated as p T_1 / T_p, which assumes the whole problem grows p-fold.
    ``weak_efficiency`` is T_1 / T_p: 100 % when p ranks do p times the work in the same time."""

    workload: str
    mode: str
    size: int
    ranks: list[int]
    timings: list[Timing]
    phases: list[dict] = field(default_factory=list)  # per rank count: median seconds per phase ("compute", "comm")
    traces: dict = field(default_factory=dict)  # rank count -> Timeline events of one step on every rank
    cores: int | None = None
    serial_timings: list[Timing] | None = None  # weak: the scaled problem of each rank count, on one rank
    transfers: list[Timing] | None = None  # per rank count, each step's least time in the collective over the ranks

    def __post_init__(self):
        if self.mode not in ("strong", "weak"):
            raise ValueError(f"mode must be 'strong' or 'weak', got {self.mode!r}")
        if 1 not in self.ranks:
            raise ValueError(f"scaling needs a 1-rank baseline; ranks were {self.ranks}")

    @property
    def times(self) -> np.ndarray:
        return np.array([t.median for t in self.timings])

    @property
    def one_rank_times(self) -> np.ndarray:
        """Weak scaling: the median time of each rank count's scaled problem on one rank (the top of the scaled
        speedup)."""
        if self.serial_timings is None:
            raise ValueError("only a weak-scaling result with one-rank runs of its scaled problems has these times")
        return np.array([t.median for t in self.serial_timings])

    def samples(self, ranks: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Every timed repetition as a row (rank count, seconds), for a fit that sees the spread: of ``ranks`` (all by
        default; :attr:`fitted_ranks` for those within the cores)."""
        keep = set(self.ranks if ranks is None else ranks)
        rows = [(p, t) for p, timing in zip(self.ranks, self.timings) if p in keep for t in timing.times]
        return np.array([p for p, _ in rows], dtype=float), np.array([t for _, t in rows], dtype=float)

    @property
    def t1(self) -> float:
        return float(self.times[self.ranks.index(1)])

    @property
    def speedup(self) -> np.ndarray:
        """Strong: T_1 / T_p. Weak: the scaled speedup p T_1 / T_p."""
        p = np.asarray(self.ranks, dtype=float)
        if self.mode == "strong":
            return self.t1 / self.times
        if self.serial_timings is not None:
            return np.array([t.median for t in self.serial_timings]) / self.times
        return p * self.t1 / self.times

    @property
    def comm_share(self) -> np.ndarray:
        """Per rank count, the share of a step spent in the allreduce, waiting for the other ranks included
        (:attr:`phases`: each phase's longest over the ranks, the median over the steps). Another program on the
        cores moves it: a rank it slows makes the others wait. :attr:`transfer_share` is the allreduce's own share."""
        return np.array([ph.get("comm", 0.0) / (sum(ph.values()) or 1.0) for ph in self.phases])

    @property
    def transfer_share(self) -> np.ndarray:
        """Per rank count, the allreduce's own share of a step: the fastest time in it of the rank that waited least
        (the last to enter, whose time there is transfer) over the fastest step; 0 on one rank. Read from the fastest
        runs, it is the step's fixed cost: another program on the cores only adds time, to waiting most of all."""
        if not self.transfers:
            raise ValueError("this result has no transfer times (saved before they were measured); run it again")
        return np.array([t.best / s.best if t.times else 0.0 for t, s in zip(self.transfers, self.timings)])

    @property
    def weak_efficiency(self) -> np.ndarray:
        """T_1 / T_p: how well the time holds while the problem grows with p (weak scaling)."""
        return self.t1 / self.times

    @property
    def efficiency(self) -> np.ndarray:
        return efficiency(self.speedup, self.ranks)

    @property
    def fitted_ranks(self) -> list[int]:
        """The rank counts the serial fraction is fitted on: those up to the core count (both laws assume p
        processors; more ranks than cores only take turns), or all of them when none above 1 fits on the cores."""
        within = [p for p in self.ranks if not self.cores or p <= self.cores]
        return within if len(within) > 1 else list(self.ranks)

    @property
    def serial_fraction(self) -> float:
        """Fitted on :attr:`fitted_ranks`: strong, Amdahl's law by least squares on every timed repetition, f and T1
        together (:func:`labkit.bench.fit_amdahl_times`, lab 12's exercise 4); weak, Gustafson's law on the scaled
        speedups."""
        if self.mode == "strong":
            return fit_amdahl_times(*self.samples(self.fitted_ranks))[0]
        keep = [self.ranks.index(p) for p in self.fitted_ranks]
        return fit_gustafson(np.asarray(self.ranks)[keep], self.speedup[keep])

    def gustafson_times(self) -> tuple[np.ndarray, np.ndarray]:
        """Weak scaling: (one-rank times, p-rank times) of the rank counts 1, 2, ..., k among :attr:`fitted_ranks`,
        the rows that lab 12's ``gustafson_fit`` takes (it numbers its rows p = 1, 2, ...)."""
        k = 0
        while k < len(self.ranks) and self.ranks[k] == k + 1 and self.ranks[k] in self.fitted_ranks:
            k += 1
        return self.one_rank_times[:k], self.times[:k]

    @property
    def karp_flatt(self) -> np.ndarray:
        """Karp-Flatt's experimentally determined serial fraction per rank count (NaN at p = 1); a strong-scaling
        metric: rising with p means overhead (communication, waiting) grows, not a fixed serial part."""
        p, s = np.asarray(self.ranks, dtype=float), np.asarray(self.speedup, dtype=float)
        out = np.full(p.shape, np.nan)
        if self.mode == "strong":
            out[p > 1] = karp_flatt(p[p > 1], s[p > 1])
        return out

    def table(self, fit: bool = True) -> str:
        """A text table: ranks, time (median, spread), speedup, efficiency, Karp-Flatt and a last line with the fitted
        serial fraction; with ``fit=False`` the measurements alone, without Karp-Flatt and the fit (lab 12 asks for a
        prediction before its students compute them)."""
        head = "scaled speedup" if self.mode == "weak" else "speedup"
        weak = self.mode == "weak"
        rows = [f"{self.mode} scaling of {self.workload} (size {self.size}" + (" per rank" if weak else "") + ")",
                f"{'ranks':>5}  {'time':>20}  " + (f"{'1 rank, same problem':>20}  " if weak else "")
                + f"{head:>14}  {'efficiency':>10}" + ("  T1/Tp" if weak else "  Karp-Flatt" if fit else "")]
        serial = self.serial_timings if weak and self.serial_timings is not None else [None] * len(self.ranks)
        for i, (p, t, s, e, kf) in enumerate(zip(self.ranks, self.timings, self.speedup, self.efficiency, self.karp_flatt)):
            over = "  (more ranks than cores)" if self.cores and p > self.cores else ""
            one = f"{str(serial[i]) if serial[i] is not None else '-':>20}  " if weak else ""
            last = (f"  {self.weak_efficiency[i]:5.0%}" if weak else "" if not fit else
                    f"  {kf:10.3f}" if np.isfinite(kf) else f"  {'':>10}")
            rows.append(f"{p:>5}  {str(t):>20}  {one}{s:>14.2f}  {e:>10.0%}{last}{over}")
        law = "Amdahl" if self.mode == "strong" else "Gustafson"
        on = "" if self.fitted_ranks == list(self.ranks) else \
            f" on {self.fitted_ranks[0]}-{self.fitted_ranks[-1]} ranks (within the {self.cores} cores)"
        if fit:
            rows.append(f"serial fraction fitted with {law}'s law{on}: {self.serial_fraction:.3f}")
        return "\n".join(rows)

    __str__ = table

    def to_dict(self) -> dict:
        return {"workload": self.workload, "mode": self.mode, "size": self.size, "ranks": self.ranks,
                "times": [t.times for t in self.timings], "median": self.times.tolist(),
                "speedup": self.speedup.tolist(), "efficiency": self.efficiency.tolist(),
                "serial_fraction": self.serial_fraction, "fitted_ranks": self.fitted_ranks, "phases": self.phases,
                "cores": self.cores,
                "serial_times": None if self.serial_timings is None else [t.times for t in self.serial_timings],
                "transfers": None if self.transfers is None else [t.times for t in self.transfers]}

    @classmethod
    def from_dict(cls, d: dict) -> Scaling:
        """The inverse of :meth:`to_dict` (for results saved as JSON)."""
        serial, transfers = d.get("serial_times"), d.get("transfers")
        return cls(d["workload"], d["mode"], d["size"], d["ranks"], [Timing(t) for t in d["times"]],
                   phases=d.get("phases", []), cores=d.get("cores"),
                   serial_timings=None if serial is None else [Timing(t) for t in serial],
                   transfers=None if transfers is None else [Timing(t) for t in transfers])


def _scaling(mode: str, workload: str, ranks: Sequence[int], size: int | None, repeat: int, warmup: int,
             timeout: float, trace: bool, progress: bool | None, options: dict | None, rounds: int = 1,
             hosts=None) -> Scaling:
    ranks = sorted({int(p) for p in ranks})
    if not ranks or ranks[0] < 1:
        raise ValueError(f"ranks must be positive rank counts, got {ranks}")
    if 1 not in ranks:
        ranks = [1, *ranks]  # the baseline every speedup is relative to
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    size = default_size(workload, mode) if size is None else int(size)
    runs = [(p, p) for p in ranks] + ([(1, p) for p in ranks if p > 1] if mode == "weak" else [])
    times: dict = {run: [] for run in runs}
    phases_of: dict = {}
    transfers: dict = {}
    traces = {}
    with progress_bar(total=rounds * len(runs), enable=progress, desc=f"{mode} scaling of {workload}", unit="run") as bar:
        for r in range(rounds):  # interleaved: a slow spell of the machine lands on every rank count of a round
            k = r % len(runs)
            for n, scale in runs[k:] + runs[:k]:
                out = launch(workload, mode, n, size, repeat=repeat, warmup=warmup, timeout=timeout,
                             trace=trace and n > 1 and n not in traces, scale=scale, hosts=hosts, **(options or {}))
                times[(n, scale)] += out["times"]
                if n == scale:
                    phases_of.setdefault(n, []).append(out.get("phases", {}))
                    transfers.setdefault(n, []).extend(out.get("transfer", []))
                    if out.get("trace"):
                        traces[n] = out["trace"]
                bar.update(1)
    timings = [Timing(times[(p, p)]) for p in ranks]  # the parallel runs, every round's repetitions
    phases = [{k: float(np.median([ph.get(k, 0.0) for ph in phases_of[p]])) for k in phases_of[p][0]} for p in ranks]
    serial = [timings[0], *(Timing(times[(1, p)]) for p in ranks if p > 1)] if mode == "weak" else []
    return Scaling(workload, mode, size, ranks, timings, phases, traces, cores=usable_cores(),
                   serial_timings=serial if mode == "weak" else None,
                   transfers=[Timing(transfers.get(p, [])) for p in ranks])


def predicted_step(t1: float, ranks: Sequence[int], cores: int | None, alpha: float, beta: float,
                   nbytes: float = GRADIENT_BYTES) -> np.ndarray:
    """The alpha-beta model's time of the ``"backprop"`` step on each of ``ranks``, one rank per host (lab 12's
    exercise 6): the one-rank step ``t1`` (seconds) shared over the ranks (over the ``cores`` where ranks outnumber
    them; None: no limit), plus an allreduce of ``nbytes`` that moves what the ring moves, 2(p - 1) messages of
    nbytes / p, each costing alpha + its bytes times beta (:func:`labkit.costmodel.predict`)."""
    model = AlphaBeta(alpha, beta)
    out = []
    for p in ranks:
        share = min(p, cores) if cores else p
        out.append(t1 / share + (float(predict("ring", model, p, nbytes)[0]) if p > 1 else 0.0))
    return np.array(out)


def strong_scaling(workload: str = "backprop", ranks: Sequence[int] = (1, 2, 4), size: int | None = None,
                   repeat: int = 5, warmup: int = 1, timeout: float = 120, trace: bool = False,
                   progress: bool | None = None, options: dict | None = None, rounds: int = 1, hosts=None) -> Scaling:
    """The same total work (``size``) on every rank count in ``ranks`` (1 is always included), each run launched
    under ``mpiexec`` and timed with the ``"mpi"`` clock. Workloads: :data:`WORKLOADS`. With ``rounds`` > 1 every run
    is repeated in interleaved rounds and its times pooled.
    ``trace=True`` also records every rank's phases of one step (:attr:`Scaling.traces`). A run that fails or
    passes ``timeout`` seconds raises ``RuntimeError`` with the ranks' error output. ``options`` go to the workload
    (``{"serial": 0.3}`` for ``"synthetic"``). ``hosts``: run every rank count across these hosts, rank r on host
    r mod their number (:attr:`labkit.network.Wire.hosts`; None: this machine)."""
    return _scaling("strong", workload, ranks, size, repeat, warmup, timeout, trace, progress, options, rounds, hosts)


def weak_scaling(workload: str = "backprop", ranks: Sequence[int] = (1, 2, 4), size: int | None = None,
                 repeat: int = 5, warmup: int = 1, timeout: float = 120, trace: bool = False,
                 progress: bool | None = None, options: dict | None = None, rounds: int = 1) -> Scaling:
    """The work grows with the ranks (``size`` per rank) and each scaled problem is also timed on one rank, for the
    scaled speedup of Gustafson's law; otherwise as :func:`strong_scaling`."""
    return _scaling("weak", workload, ranks, size, repeat, warmup, timeout, trace, progress, options, rounds)


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
