"""Measuring: clocks, repeated timing with warm-up, speedup and efficiency, Amdahl and Gustafson, timelines.

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

:func:`measure` is the one timing loop of the package (the kernels', collectives' and thread pools' timings use it);
:func:`interleaved` runs several configurations in alternating rounds, so that one slow spell of a shared machine
moves every configuration alike instead of one. Scaling runs over 1..N MPI ranks, built on these, are in
:mod:`labkit.scaling`. :class:`Timeline` records each rank's compute and communication phases for a timeline plot
and a Chrome trace (:func:`chrome_trace`).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .machine import machine_info  # noqa: F401  (what every benchmark's numbers were measured on)

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


def measure(fn: Callable[[], object], repeat: int = 5, warmup: int = 1, clock: str = "wall", comm=None,
            sync: Callable[[], object] | None = None) -> Timing:
    """Run ``fn`` ``warmup`` times untimed, then ``repeat`` times timed with ``clock`` (see the module's docstring).

    With ``clock="mpi"`` every rank of ``comm`` calls it, and every rank gets the same times: the slowest rank's.
    ``sync`` is called after the warm-up and after each timed call, inside the timing: work that ``fn`` only starts
    (a kernel launch on a GPU, a batch of threads) is then timed until it has finished.
    """
    if repeat < 1 or warmup < 0:
        raise ValueError(f"need repeat >= 1 and warmup >= 0, got repeat={repeat}, warmup={warmup}")
    c = _Clock(clock, comm)
    for _ in range(warmup):
        fn()
    if sync is not None:
        sync()
    t = Timing()
    for _ in range(repeat):
        c.start()
        fn()
        if sync is not None:
            sync()
        t.times.append(c.stop())
    return t


def interleaved(jobs: dict[str, Callable[[], float]], rounds: int = 3) -> dict[str, Timing]:
    """Run every job once per round, in an order that rotates from round to round; each job returns its seconds.

    The result keeps every round's figure per job (:class:`Timing`: report its median). Measured side by side this
    way, a slow spell of a shared machine lands on every configuration of a round instead of skewing one ratio.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    names = list(jobs)
    out = {name: Timing() for name in names}
    for r in range(rounds):
        k = r % len(names) if names else 0
        for name in names[k:] + names[:k]:
            out[name].times.append(float(jobs[name]()))
    return out


def merge_rounds(results: list[dict]) -> dict:
    """Several rounds' results of one benchmark as one: every top-level number is the median over the rounds, with
    each round's value kept in ``result["rounds"][key]``; everything else (tables, names) comes from the last round."""
    if not results:
        raise ValueError("no rounds to merge")
    out = dict(results[-1])
    numbers = [k for k, v in out.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    out["rounds"] = {k: [r[k] for r in results if isinstance(r.get(k), (int, float))] for k in numbers}
    for k in numbers:
        out[k] = float(np.median(out["rounds"][k]))
    return out


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


def fit_gustafson_times(t_one_rank: Sequence[float], t_p_ranks: Sequence[float]) -> tuple[np.ndarray, float]:
    """(S, f) from weak scaling's times, one entry per rank count p = 1, 2, ...: the scaled speedups S = t_one_rank /
    t_p_ranks (each row's grown problem on one rank and on p ranks) and Gustafson's serial fraction f fitted to them
    (:func:`fit_gustafson`). ValueError when no row has more than one rank."""
    t1, tp = np.asarray(t_one_rank, dtype=float), np.asarray(t_p_ranks, dtype=float)
    if t1.shape != tp.shape or t1.ndim != 1:
        raise ValueError(f"two arrays of one time per rank count, got shapes {t1.shape} and {tp.shape}")
    s = t1 / tp
    return s, fit_gustafson(np.arange(1, s.size + 1), s)


def serial_fraction_reading(f: float, law: str = "Amdahl") -> str:
    """A fitted serial fraction in words, for headlines: outside [0, 1) it is not a fraction of anything.

    ``law`` is "Amdahl" (strong scaling: at most 1/f on any number of workers) or "Gustafson" (weak scaling).
    """
    if not math.isfinite(f):
        return "not measurable: no parallel run within the cores to fit"
    if f >= 1:
        return f"parallel runs slower than serial: overhead dominates (the fit gives {f:.2f}, above 1)"
    if f < 0:
        return (f"faster than linear: the runs beat p times serial (cache effects or noise; the fit gives {f:.3f}, "
                "below 0), so no serial part is measurable")
    if law == "Amdahl":
        if f == 0:
            return "0 %: no serial part measurable"
        return f"{f:.1%} of the work (Amdahl: at most {1 / f:.2g}x on any number of workers)"
    return f"{f:.1%} of the parallel run's time"


def karp_flatt(p, s) -> np.ndarray:
    """Experimentally determined serial fraction e = (1/S - 1/p) / (1 - 1/p), one per measurement; NaN where p = 1
    (one worker shows no serial part: every e fits S = 1 there)."""
    p, s = np.asarray(p, dtype=float), np.asarray(s, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(p == 1, np.nan, (1 / s - 1 / p) / (1 - 1 / p))[()]  # a number for numbers


def speedup_table(p, t) -> tuple[np.ndarray, np.ndarray]:
    """Speedup and efficiency of every row of a table of measured times: worker counts ``p`` and seconds ``t``, the
    rows in any order, each against the time of the row with one worker (the median of such rows). Efficiencies above
    1 (faster than linear) are kept. Raises ValueError without a one-worker row: there is no baseline."""
    p, t = np.asarray(p, dtype=float), np.asarray(t, dtype=float)
    if p.shape != t.shape or p.ndim != 1:
        raise ValueError(f"p and t must be 1-D of the same length, got shapes {p.shape} and {t.shape}")
    one = p == 1
    if not one.any():
        raise ValueError(f"no row with one worker among p = {p.tolist()}: no baseline for the speedup")
    s = float(np.median(t[one])) / t
    return s, s / p


def fit_amdahl_times(p, t) -> tuple[float, float]:
    """Amdahl's law fitted to measured times (one row per run, repeats and any order allowed): the least-squares
    line T = a + b/p, whose value at p = 1 is T1 = a + b and whose intercept is the serial time, f = a / T1.
    Returns ``(f, T1)``; f below 0 (faster than linear) or above 1 is returned as it is. Raises ValueError with
    fewer than two distinct worker counts: one worker count fixes no line.

    Unlike :func:`fit_amdahl` (speedups, T1 fixed at its measurement) both f and T1 come from every row here."""
    p, t = np.asarray(p, dtype=float), np.asarray(t, dtype=float)
    if p.shape != t.shape or p.ndim != 1:
        raise ValueError(f"p and t must be 1-D of the same length, got shapes {p.shape} and {t.shape}")
    if np.unique(p).size < 2:
        raise ValueError(f"need times on at least two worker counts to fit a line, got p = {p.tolist()}")
    slope, intercept = np.polyfit(1 / p, t, 1)
    t1 = float(intercept + slope)
    return float(intercept / t1), t1


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


def wait_breakdown(events: Sequence[dict]) -> np.ndarray:
    """One traced step's seconds on each rank, split three ways: an array of one row ``(compute, waiting, transfer)``
    per rank, in rank order, from :class:`Timeline` events.

    compute: the rank's ``"compute"`` events, summed. A collective (the ``"comm"`` events of one name, one per rank)
    cannot finish before its last rank has entered it: the time a rank spends in it before then is waiting for the
    slower ranks, the rest is transfer."""
    ranks = sorted({int(e["rank"]) for e in events})
    row = {r: i for i, r in enumerate(ranks)}
    out = np.zeros((len(ranks), 3))
    for e in events:
        if e["kind"] == "compute":
            out[row[int(e["rank"])], 0] += e["end"] - e["start"]
    for name in {e["name"] for e in events if e["kind"] == "comm"}:
        group = [e for e in events if e["kind"] == "comm" and e["name"] == name]
        last = max(e["start"] for e in group)  # the last rank to enter
        for e in group:
            waiting = min(e["end"], last) - e["start"]
            out[row[int(e["rank"])], 1:] += waiting, e["end"] - e["start"] - waiting
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
