"""Measuring: repeated timing with warm-up, speedup and efficiency, Amdahl and Gustafson.

Timings on shared machines are noisy, so every comparison is measured side by side in one run
and reported as a ratio; a :class:`Timing` keeps every repetition, its median and its spread.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


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


def measure(fn: Callable[[], object], repeat: int = 5, warmup: int = 1) -> Timing:
    """Run ``fn`` ``warmup`` times untimed, then ``repeat`` times timed with a monotonic clock."""
    for _ in range(warmup):
        fn()
    t = Timing()
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t.times.append(time.perf_counter() - t0)
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
