"""Measuring: clocks, repeated timing with warm-up, speedup and efficiency, Amdahl and Gustafson, scaling runs.

Timings on shared machines are noisy, so every comparison is measured side by side in one run
and reported as a ratio; a :class:`Timing` keeps every repetition, its median and its spread.

Four clocks (``clock=`` of :func:`measure` and :func:`timer`):

* ``"wall"``: elapsed time (``time.perf_counter``), what a user waits for;
* ``"cpu"``: CPU time of this process, all its threads (``time.process_time``): above the wall time when
  threads run in parallel, below it when the process waits (for I/O, a GPU, another rank);
* ``"cuda"``: CUDA events recorded on the current stream around the work, read after the stop event
  completes: the GPU's own time, without the launch overhead a wall clock adds (CuPy and a GPU needed);
* ``"mpi"``: ``MPI.Wtime`` between two barriers, then the maximum over the ranks: a parallel step lasts
  as long as its slowest rank.

:func:`strong_scaling` and :func:`weak_scaling` launch a workload under ``mpiexec`` on 1..N ranks and
return a :class:`Scaling` with speedups, efficiencies, the fitted serial fraction and Karp-Flatt metric;
:class:`Timeline` records each rank's compute and communication phases for a timeline plot and a Chrome
trace (:func:`chrome_trace`).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

CLOCKS = ("wall", "cpu", "cuda", "mpi")


@dataclass
class Timing:
    """Seconds of repeated runs of one thing."""

    times: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return float(np.median(self.times))

    @property
    def best(self) -> float:
        return float(np.min(self.times))

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median (0.05 = runs within about 5 %)."""
        q1, q3 = np.percentile(self.times, [25, 75])
        return float((q3 - q1) / self.median) if self.median else 0.0

    def __str__(self) -> str:
        return f"{format_seconds(self.median)} (±{self.spread:.0%}, {len(self.times)} runs)"


def format_seconds(t: float) -> str:
    """3.2 ms, 41 µs, 1.25 s."""
    if t >= 1:
        return f"{t:.2f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.1f} ms"
    return f"{t * 1e6:.0f} µs"


class _Clock:
    """start() then stop() -> seconds."""

    def __init__(self, clock: str = "wall", comm=None):
        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
        self.clock, self.comm = clock, comm
        if clock == "cuda":
            try:
                import cupy

                cupy.cuda.runtime.getDeviceCount()
            except Exception as e:  # ImportError, or CUDARuntimeError without a GPU
                raise RuntimeError(f"clock='cuda' needs CuPy and a CUDA GPU ({type(e).__name__}: {e}); "
                                   "use clock='wall' on the CPU") from None
            self._cupy = cupy
        elif clock == "mpi":
            from mpi4py import MPI

            self._mpi = MPI
            self.comm = comm if comm is not None else MPI.COMM_WORLD

    def start(self) -> None:
        if self.clock == "wall":
            self._t0 = time.perf_counter()
        elif self.clock == "cpu":
            self._t0 = time.process_time()
        elif self.clock == "cuda":
            self._start, self._stop = self._cupy.cuda.Event(), self._cupy.cuda.Event()
            self._start.record()
        else:
            self.comm.Barrier()
            self._t0 = self._mpi.Wtime()

    def stop(self) -> float:
        if self.clock == "wall":
            return time.perf_counter() - self._t0
        if self.clock == "cpu":
            return time.process_time() - self._t0
        if self.clock == "cuda":
            self._stop.record()
            self._stop.synchronize()
            return self._cupy.cuda.get_elapsed_time(self._start, self._stop) / 1e3  # ms -> s
        mine = self._mpi.Wtime() - self._t0
        return float(self.comm.allreduce(mine, op=self._mpi.MAX))


class _Elapsed:
    seconds: float = float("nan")


@contextlib.contextmanager
def timer(clock: str = "wall", comm=None) -> Iterator[_Elapsed]:
    """``with timer("cuda") as t: ...`` then ``t.seconds``. With ``clock="mpi"`` every rank of ``comm`` (default
    COMM_WORLD) must enter and leave it, and all get the slowest rank's time."""
    c, e = _Clock(clock, comm), _Elapsed()
    c.start()
    yield e
    e.seconds = c.stop()


def measure(fn: Callable[[], object], repeat: int = 5, warmup: int = 1, clock: str = "wall", comm=None) -> Timing:
    """Run ``fn`` ``warmup`` times untimed, then ``repeat`` times timed with ``clock`` (see the module's docstring).

    With ``clock="mpi"`` every rank of ``comm`` calls it, and every rank gets the same times: the slowest rank's.
    """
    if repeat < 1 or warmup < 0:
        raise ValueError(f"need repeat >= 1 and warmup >= 0, got repeat={repeat}, warmup={warmup}")
    c = _Clock(clock, comm)
    for _ in range(warmup):
        fn()
    t = Timing()
    for _ in range(repeat):
        c.start()
        fn()
        t.times.append(c.stop())
    return t


def speedup(t_serial: float, t_parallel) -> np.ndarray:
    """S = T_1 / T_p."""
    return t_serial / np.asarray(t_parallel, dtype=float)


def efficiency(s, p) -> np.ndarray:
    """E = S / p."""
    return np.asarray(s, dtype=float) / np.asarray(p, dtype=float)


def amdahl(p, f: float) -> np.ndarray:
    """Amdahl's law: speedup on p workers when a fraction f of the work is serial."""
    p = np.asarray(p, dtype=float)
    return 1.0 / (f + (1.0 - f) / p)


def gustafson(p, f: float) -> np.ndarray:
    """Gustafson's scaled speedup: p - f (p - 1), the work growing with p."""
    p = np.asarray(p, dtype=float)
    return p - f * (p - 1)


def fit_amdahl(p: Sequence[float], s: Sequence[float]) -> float:
    """Serial fraction f that best explains measured speedups (least squares on 1/S = f + (1 - f)/p)."""
    p, s = np.asarray(p, dtype=float), np.asarray(s, dtype=float)
    keep = p > 1
    if not keep.any():
        raise ValueError("need at least one measurement with more than one worker")
    a = 1 - 1 / p[keep]
    f = float(np.sum((1 / s[keep] - 1 / p[keep]) * a) / np.sum(a * a))
    return f  # may exceed 1 when parallel runs are slower than serial: overhead, not serial work


def fit_gustafson(p: Sequence[float], s: Sequence[float]) -> float:
    """Serial fraction f (of the parallel run's time) that best explains measured *scaled* speedups from weak
    scaling (least squares on S = p - f (p - 1))."""
    p, s = np.asarray(p, dtype=float), np.asarray(s, dtype=float)
    keep = p > 1
    if not keep.any():
        raise ValueError("need at least one measurement with more than one worker")
    a = p[keep] - 1
    return float(np.sum((p[keep] - s[keep]) * a) / np.sum(a * a))


def karp_flatt(p, s) -> np.ndarray:
    """Experimentally determined serial fraction e = (1/S - 1/p) / (1 - 1/p), one per measurement."""
    p, s = np.asarray(p, dtype=float), np.asarray(s, dtype=float)
    return (1 / s - 1 / p) / (1 - 1 / p)


def crossover(x: Sequence[float], y: Sequence[float], level: float = 1.0) -> float | None:
    """The x at which measured y first rises to ``level`` (interpolated linearly in log x, where x > 0), or None
    when no measurement reaches it. For "from which width does the GPU pay?": y = speedup, level = 1."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1 or x.size == 0:
        raise ValueError(f"x and y must be 1-D of the same length, got shapes {x.shape} and {y.shape}")
    if np.any(np.diff(x) <= 0):
        raise ValueError("x must increase")
    if y[0] >= level:
        return float(x[0])
    for i in range(1, x.size):
        if y[i] >= level:
            t = (level - y[i - 1]) / (y[i] - y[i - 1])
            if x[i - 1] > 0:
                return float(np.exp(np.log(x[i - 1]) + t * (np.log(x[i]) - np.log(x[i - 1]))))
            return float(x[i - 1] + t * (x[i] - x[i - 1]))
    return None


def machine_info() -> dict:
    """What the numbers were measured on: CPU count, Python, NumPy, BLAS library and its threads."""
    info = {"cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            "machine": platform.machine()}
    try:
        from threadpoolctl import threadpool_info

        blas = [d for d in threadpool_info() if d.get("user_api") == "blas"]
        if blas:
            info["blas"] = f"{blas[0].get('internal_api')} {blas[0].get('version')}"
            info["blas_threads"] = blas[0].get("num_threads")
    except ImportError:
        pass
    return info


# -- strong and weak scaling -------------------------------------------------------------------------


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

    def __post_init__(self):
        if self.mode not in ("strong", "weak"):
            raise ValueError(f"mode must be 'strong' or 'weak', got {self.mode!r}")
        if 1 not in self.ranks:
            raise ValueError(f"scaling needs a 1-rank baseline; ranks were {self.ranks}")

    @property
    def times(self) -> np.ndarray:
        return np.array([t.median for t in self.timings])

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
        """Fitted with Amdahl's law (strong) or Gustafson's law (weak) on :attr:`fitted_ranks`."""
        keep = [self.ranks.index(p) for p in self.fitted_ranks]
        return (fit_amdahl if self.mode == "strong" else fit_gustafson)(np.asarray(self.ranks)[keep], self.speedup[keep])

    @property
    def karp_flatt(self) -> np.ndarray:
        """Karp-Flatt's experimentally determined serial fraction per rank count (NaN at p = 1); a strong-scaling
        metric: rising with p means overhead (communication, waiting) grows, not a fixed serial part."""
        p, s = np.asarray(self.ranks, dtype=float), np.asarray(self.speedup, dtype=float)
        out = np.full(p.shape, np.nan)
        if self.mode == "strong":
            out[p > 1] = karp_flatt(p[p > 1], s[p > 1])
        return out

    def table(self) -> str:
        """A text table: ranks, time (median, spread), speedup, efficiency, Karp-Flatt."""
        head = "scaled speedup" if self.mode == "weak" else "speedup"
        weak = self.mode == "weak"
        rows = [f"{self.mode} scaling of {self.workload} (size {self.size}" + (" per rank" if weak else "") + ")",
                f"{'ranks':>5}  {'time':>20}  " + (f"{'1 rank, same problem':>20}  " if weak else "")
                + f"{head:>14}  {'efficiency':>10}" + ("  T1/Tp" if weak else "  Karp-Flatt")]
        serial = self.serial_timings if weak and self.serial_timings is not None else [None] * len(self.ranks)
        for i, (p, t, s, e, kf) in enumerate(zip(self.ranks, self.timings, self.speedup, self.efficiency, self.karp_flatt)):
            over = "  (more ranks than cores)" if self.cores and p > self.cores else ""
            one = f"{str(serial[i]) if serial[i] is not None else '-':>20}  " if weak else ""
            last = (f"  {self.weak_efficiency[i]:5.0%}" if weak else f"  {kf:10.3f}" if np.isfinite(kf) else f"  {'':>10}")
            rows.append(f"{p:>5}  {str(t):>20}  {one}{s:>14.2f}  {e:>10.0%}{last}{over}")
        law = "Amdahl" if self.mode == "strong" else "Gustafson"
        on = "" if self.fitted_ranks == list(self.ranks) else \
            f" on {self.fitted_ranks[0]}-{self.fitted_ranks[-1]} ranks (within the {self.cores} cores)"
        rows.append(f"serial fraction fitted with {law}'s law{on}: {self.serial_fraction:.3f}")
        return "\n".join(rows)

    __str__ = table

    def to_dict(self) -> dict:
        return {"workload": self.workload, "mode": self.mode, "size": self.size, "ranks": self.ranks,
                "times": [t.times for t in self.timings], "median": self.times.tolist(),
                "speedup": self.speedup.tolist(), "efficiency": self.efficiency.tolist(),
                "serial_fraction": self.serial_fraction, "fitted_ranks": self.fitted_ranks, "phases": self.phases,
                "cores": self.cores,
                "serial_times": None if self.serial_timings is None else [t.times for t in self.serial_timings]}

    @classmethod
    def from_dict(cls, d: dict) -> Scaling:
        """The inverse of :meth:`to_dict` (for results saved as JSON)."""
        serial = d.get("serial_times")
        return cls(d["workload"], d["mode"], d["size"], d["ranks"], [Timing(t) for t in d["times"]],
                   phases=d.get("phases", []), cores=d.get("cores"),
                   serial_timings=None if serial is None else [Timing(t) for t in serial])


def _scaling(mode: str, workload: str, ranks: Sequence[int], size: int | None, repeat: int, warmup: int,
             timeout: float, trace: bool, progress: bool | None, options: dict | None) -> Scaling:
    from .benchmarks import scaling
    from .progress import progress_bar

    ranks = sorted({int(p) for p in ranks})
    if not ranks or ranks[0] < 1:
        raise ValueError(f"ranks must be positive rank counts, got {ranks}")
    if 1 not in ranks:
        ranks = [1, *ranks]  # the baseline every speedup is relative to
    size = scaling.default_size(workload, mode) if size is None else int(size)
    timings, phases, traces, serial = [], [], {}, []
    runs = [(p, p) for p in ranks] + ([(1, p) for p in ranks if p > 1] if mode == "weak" else [])
    for n, scale in progress_bar(runs, enable=progress, desc=f"{mode} scaling of {workload}", unit="run"):
        out = scaling.launch(workload, mode, n, size, repeat=repeat, warmup=warmup, timeout=timeout,
                             trace=trace and n > 1, scale=scale, **(options or {}))
        if n == scale:  # the parallel runs
            timings.append(Timing(out["times"]))
            phases.append(out.get("phases", {}))
            if out.get("trace"):
                traces[n] = out["trace"]
        else:  # weak scaling: the p-rank problem on one rank
            serial.append(Timing(out["times"]))
    if mode == "weak":
        serial = [timings[0], *serial]  # ranks are sorted and start at 1
    return Scaling(workload, mode, size, ranks, timings, phases, traces, cores=os.cpu_count(),
                   serial_timings=serial if mode == "weak" else None)


def strong_scaling(workload: str = "backprop", ranks: Sequence[int] = (1, 2, 4), size: int | None = None,
                   repeat: int = 5, warmup: int = 1, timeout: float = 120, trace: bool = False,
                   progress: bool | None = None, options: dict | None = None) -> Scaling:
    """The same total work (``size``) on every rank count in ``ranks`` (1 is always included), each run launched
    under ``mpiexec`` and timed with the ``"mpi"`` clock. Workloads: ``labkit.benchmarks.scaling.WORKLOADS``.
    ``trace=True`` also records every rank's phases of one step (:attr:`Scaling.traces`). A run that fails or
    passes ``timeout`` seconds raises ``RuntimeError`` with the ranks' error output. ``options`` go to the workload
    (``{"serial": 0.3}`` for ``"synthetic"``)."""
    return _scaling("strong", workload, ranks, size, repeat, warmup, timeout, trace, progress, options)


def weak_scaling(workload: str = "backprop", ranks: Sequence[int] = (1, 2, 4), size: int | None = None,
                 repeat: int = 5, warmup: int = 1, timeout: float = 120, trace: bool = False,
                 progress: bool | None = None, options: dict | None = None) -> Scaling:
    """The work grows with the ranks (``size`` per rank) and each scaled problem is also timed on one rank, for the
    scaled speedup of Gustafson's law; otherwise as :func:`strong_scaling`."""
    return _scaling("weak", workload, ranks, size, repeat, warmup, timeout, trace, progress, options)


# -- timelines ---------------------------------------------------------------------------------------


class Timeline:
    """Records named phases of one rank's work: ``with tl.phase("allreduce", "comm"): ...``.

    Times are seconds since :meth:`reset` (called by the constructor; call it on every rank right after a
    barrier to line the ranks up). :meth:`gather` collects every rank's events on rank 0.
    """

    def __init__(self, rank: int = 0):
        self.rank = rank
        self.events: list[dict] = []
        self.reset()

    def reset(self) -> None:
        self.events.clear()
        self._origin = time.perf_counter()

    @contextlib.contextmanager
    def phase(self, name: str, kind: str = "compute") -> Iterator[None]:
        t0 = time.perf_counter() - self._origin
        try:
            yield
        finally:
            self.events.append({"rank": self.rank, "name": name, "kind": kind, "start": t0,
                                "end": time.perf_counter() - self._origin})

    def add(self, name: str, kind: str, t0: float, t1: float) -> None:
        """Record a phase measured elsewhere with ``time.perf_counter()`` readings ``t0`` and ``t1``."""
        self.events.append({"rank": self.rank, "name": name, "kind": kind, "start": t0 - self._origin,
                            "end": t1 - self._origin})

    def gather(self, comm, root: int = 0) -> list[dict] | None:
        """Every rank's events, on ``root`` (None elsewhere). Collective."""
        got = comm.gather(self.events, root=root)
        return None if got is None else [e for events in got for e in events]

    def totals(self) -> dict[str, float]:
        """Seconds per kind ("compute", "comm", ...) on this rank."""
        out: dict[str, float] = {}
        for e in self.events:
            out[e["kind"]] = out.get(e["kind"], 0.0) + e["end"] - e["start"]
        return out


def chrome_trace(events: Sequence[dict], path: Path | str | None = None, process: str = "labkit") -> dict:
    """The events of :class:`Timeline` (rank, name, kind, start, end in seconds) as a Chrome trace: one thread
    per rank, complete ("X") events in microseconds. Open the file in Perfetto (ui.perfetto.dev) or
    chrome://tracing. Written to ``path`` when given."""
    trace = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": process}}]
    for r in sorted({int(e["rank"]) for e in events}):
        trace.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}})
        trace.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": r, "args": {"sort_index": r}})
    for e in events:
        if e["end"] < e["start"]:
            raise ValueError(f"event {e['name']!r} on rank {e['rank']} ends before it starts")
        trace.append({"name": e["name"], "cat": e.get("kind", "compute"), "ph": "X", "pid": 0, "tid": int(e["rank"]),
                      "ts": round(e["start"] * 1e6, 3), "dur": round((e["end"] - e["start"]) * 1e6, 3)})
    doc = {"traceEvents": trace, "displayTimeUnit": "ms"}
    if path is not None:
        Path(path).write_text(json.dumps(doc))
    return doc
