"""Checks of lab 12: the Karp-Flatt metric and Gustafson's scaled speedup."""

from __future__ import annotations

import numpy as np

from . import capture
from .common import call, compare_series, passed, recorded
from .exercises import Exercise


@recorded
def karp_flatt(fn) -> None:
    """Exercise (lab 12): ``fn(p, s) -> e``, the Karp-Flatt metric e = (1/S - 1/p) / (1 - 1/p) for arrays of worker
    counts p > 1 and measured speedups S, the serial fraction that would explain each measurement by Amdahl's law."""
    ex = "Karp-Flatt metric"
    cases = [(np.array([2.0, 4.0, 8.0]), np.array([1.8, 3.1, 4.4])),
             (np.array([2.0, 3.0]), np.array([2.0, 3.0])),  # ideal: no serial work
             (np.array([2.0, 4.0, 16.0]), np.array([1.0, 1.0, 1.0])),  # no speedup at all: all serial
             (np.array([2.0, 4.0]), np.array([0.8, 0.5]))]  # slower than serial: overhead, e > 1
    rng = np.random.default_rng(capture.seed(12))  # and one drawn afresh whenever a notebook is graded
    p = np.sort(rng.choice(np.arange(2, 65), 4, replace=False)).astype(float)
    cases.append((p, np.round(rng.uniform(1.0, p), 3)))
    fn = capture.student(fn, ex=ex)
    for p, s in cases:
        where = f"p = {p.tolist()}, S = {s.tolist()}"
        got = call(ex, fn, p.copy(), s.copy())
        want = (1 / s - 1 / p) / (1 - 1 / p)
        compare_series(ex, where, got, want, [
            (1 / s - 1 / p, "divide by (1 - 1/p): without it the metric is not a fraction of the work"),
            ((1 / p - 1 / s) / (1 - 1 / p), "1/S comes first: e = (1/S - 1/p) / (1 - 1/p)"),
            ((s - p) / (1 - p), "use the reciprocals 1/S and 1/p, not S and p"),
        ], "start from Amdahl's 1/S = e + (1 - e)/p and solve for e")
    passed(ex, len(cases))


@recorded
def scaled_speedup(fn) -> None:
    """Exercise (lab 12): ``fn(t_one_rank, t_p_ranks) -> S``, Gustafson's scaled speedup from weak scaling: for each
    rank count, the time one rank needs for the scaled problem divided by the time p ranks need for it."""
    ex = "scaled speedup"
    cases = [(np.array([1.0, 1.9, 3.7]), np.array([1.0, 1.0, 1.0])),
             (np.array([2.0, 3.8, 7.4, 14.2]), np.array([2.0, 2.1, 2.2, 2.6])),
             (np.array([0.5]), np.array([0.5]))]
    rng = np.random.default_rng(capture.seed(13))
    t1 = np.round(np.cumsum(rng.uniform(0.5, 2.0, 4)), 3)
    cases.append((t1, np.round(t1[0] * rng.uniform(1.0, 1.5, 4), 3)))
    fn = capture.student(fn, ex=ex)
    for t1, tp in cases:
        where = f"t_one_rank = {t1.tolist()}, t_p_ranks = {tp.tolist()}"
        got = call(ex, fn, t1.copy(), tp.copy())
        want = t1 / tp
        p = np.arange(1, len(t1) + 1, dtype=float)
        compare_series(ex, where, got, want, [
            (tp / t1, "speedup is the slow time over the fast one: one rank's time / p ranks' time"),
            (t1[0] / tp, "that is the strong-scaling speedup T1/Tp of the smallest problem: in weak scaling each p "
                         "runs a p-times larger problem, so compare with one rank on that same problem"),
            (want / p, "that is the efficiency; the scaled speedup is not divided by p"),
        ], "S_p = t_one_rank[i] / t_p_ranks[i], element by element")
    passed(ex, len(cases))


EXERCISES = (
    Exercise("karp_flatt", "12", "speedup", references=("labkit.bench:karp_flatt",)),
    Exercise("scaled_speedup", "12", "speedup", references=("labkit.bench:speedup",)),
)
