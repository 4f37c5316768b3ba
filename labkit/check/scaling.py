"""Checks of lab 12, reading measured times: speedup and efficiency from a table, Gustafson's scaled speedup and serial
fraction from weak scaling, the Karp-Flatt metric, and Amdahl's serial fraction fitted to the times by least squares.

Each check runs the student's function on synthetic tables whose answer is known (exact Amdahl times, noisy ones, a
table of one worker count, faster-than-linear runs), on tables measured on a 2-core machine, and on one drawn afresh
whenever a notebook is graded; on a wrong answer it names the mistake it recognises.
"""

from __future__ import annotations

import numpy as np

from .. import bench
from ..scaling import GRADIENT_BYTES, predicted_step
from . import capture
from .common import ExerciseError, call, compare_series, each_case, fail, not_written, one_number, passed, recorded
from .exercises import Exercise

# Lab 12's data-parallel step ([784,256,10], one BLAS thread per rank), medians of 3 runs on a machine with 2 cores:
# past 2 ranks the ranks take turns on the cores.
MEASURED = {
    "strong, batch 4096": (np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.042861, 0.02246, 0.032156, 0.026431])),
    "strong, batch 128": (np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.001305, 0.000977, 0.002925, 0.003452])),
}
MEASURED_WEAK = (np.array([0.010563, 0.021834, 0.03352, 0.042202]),  # 1 rank on the problem of 1, 2, 3, 4 ranks
                 np.array([0.010563, 0.010964, 0.022567, 0.030665]))  # 1, 2, 3, 4 ranks on it


def _show(a) -> str:
    return np.array2string(np.asarray(a, dtype=float), precision=4, separator=", ")


def _amdahl_times(p, f: float, t1: float) -> np.ndarray:
    return t1 * (f + (1 - f) / np.asarray(p, dtype=float))


def _pair(ex: str, where: str, got, names: str) -> tuple:
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(ex, f"{where}: expected a pair {names}, got {type(got).__name__}"
             + (f" of length {len(got)}" if isinstance(got, (tuple, list)) else ""),
             f"end your function with `return {names[1:-1]}`")
    return got[0], got[1]


def _expect_value_error(ex: str, fn, where: str, why: str, *args) -> None:
    """The student's function must refuse this table with ValueError (builtins' own: the replay re-raises a recorded
    exception by its name, and only the built-in ones keep their class)."""
    try:
        got = fn(*args)
    except NotImplementedError:
        raise ExerciseError(not_written(ex)) from None
    except (ExerciseError, capture.NotRecorded):
        raise
    except Exception as e:
        if type(e) is ValueError:
            return
        fail(ex, f"{where}: your function raised {type(e).__name__}: {e}",
             f"{why}: check the table first and raise ValueError itself, not {type(e).__name__}")
    fail(ex, f"{where}: your function returned {got!r:.80} instead of raising ValueError", f"{why}: raise ValueError")


# ---- exercise 1: speedup and efficiency from a table of times --------------------------------------------------------

@recorded
def speedup_efficiency(fn) -> None:
    """Exercise (lab 12): ``fn(p, t) -> (S, E)``, the speedup and the efficiency of every row of a table of measured
    times (worker counts p, seconds t, rows in any order, one row per worker count), and ValueError for a table
    without a one-worker row."""
    ex = "speedup and efficiency"
    cases = [("exact Amdahl times", np.array([1, 2, 4, 8]), _amdahl_times([1, 2, 4, 8], 0.1, 2.0)),
             ("rows not sorted by p", np.array([4, 2, 1, 3]), np.array([0.31, 0.55, 1.0, 0.4])),
             ("faster than linear", np.array([1, 2, 4]), np.array([1.0, 0.47, 0.23])),
             ("slower with more workers", np.array([1, 2, 3]), np.array([0.2, 0.25, 0.31])),
             ("one worker only", np.array([1]), np.array([0.73])),
             *((f"measured, {k}", p.astype(int), t) for k, (p, t) in MEASURED.items())]
    rng = np.random.default_rng(capture.seed(120))  # and one drawn afresh whenever a notebook is graded
    p = rng.permutation(np.concatenate([[1], rng.choice(np.arange(2, 33), 4, replace=False)]))
    cases.append(("drawn at random", p, np.round(1.0 / p * rng.uniform(0.9, 3.0, p.size), 5)))
    fn = capture.student(fn, ex=ex)
    for name, p, t in each_case(cases, more=1):
        where = f"{name}, p = {p.tolist()}, t = {_show(t)}"
        s, e = _pair(ex, where, call(ex, fn, p.copy(), t.copy()), "(S, E)")
        want_s, want_e = bench.speedup_table(p, t)
        t1 = t[p == 1][0]
        compare_series(ex, where + "; speedup S", s, want_s, [
            (t / t1, "a speedup is above 1 where the run got faster: yours is upside down"),
            (t[0] / t, "your baseline is the table's first row, but the rows are not sorted by p: "
                       "take the time of the row where p is 1"),
            (t.max() / t, "your baseline is the slowest time; the baseline is the one-worker row, even when more "
                          "workers were slower"),
            (t.min() / t, "your baseline is the fastest time; the baseline is the one-worker row"),
        ])
        compare_series(ex, where + "; efficiency E", e, want_e, [
            (want_s, "your efficiency equals the speedup: efficiency divides the speedup by p"),
            (want_s * p, "efficiency divides the speedup by p; yours multiplies by it"),
            (want_s / np.arange(1, p.size + 1), "you divided by the row number, not by that row's p"),
            (np.minimum(want_e, 1.0), "you clipped the efficiency at 1: a measured efficiency above 1 (faster than "
                                      "linear: caches, or noise) is a reading; keep it"),
        ])
    where = "a table without a one-worker row, p = [2, 4, 8]"
    _expect_value_error(ex, fn, where, "with no row where p is 1 there is no baseline (do not guess one)",
                        np.array([2, 4, 8]), np.array([0.6, 0.35, 0.2]))
    passed(ex, len(cases) + 1)


# ---- exercise 2: Gustafson's scaled speedup and serial fraction from weak scaling ---------------------------------------

@recorded
def gustafson_fit(fn) -> None:
    """Exercise (lab 12): ``fn(t_one_rank, t_p_ranks) -> (S, f)`` from weak scaling, one entry per rank count p = 1,
    2, ... (the problem grown p-fold, timed on one rank and on p ranks): Gustafson's scaled speedups S, and the serial
    fraction f of Gustafson's law S = p - f (p - 1) fitted to every row by least squares; ValueError for one rank
    count only."""
    ex = "Gustafson fit"
    cases = [("exact Gustafson, f = 0.2", np.array([1.0, 1.8, 2.6, 3.4]), np.array([1.0, 1.0, 1.0, 1.0])),
             ("ideal, f = 0", np.array([1.0, 2.0, 3.0]), np.array([1.0, 1.0, 1.0])),
             ("times rising with p", np.array([2.0, 3.8, 7.4, 14.2]), np.array([2.0, 2.1, 2.2, 2.6])),
             ("faster than linear", np.array([1.0, 2.3, 4.9]), np.array([1.0, 1.02, 1.1])),
             ("measured on 2 cores", *MEASURED_WEAK)]
    rng = np.random.default_rng(capture.seed(13))
    t1 = np.round(np.cumsum(rng.uniform(0.5, 2.0, 4)), 3)
    cases.append(("drawn at random", t1, np.round(t1[0] * rng.uniform(1.0, 1.5, 4), 3)))
    fn = capture.student(fn, ex=ex)
    for name, t1, tp in each_case(cases, more=1):
        where = f"{name}: t_one_rank = {_show(t1)}, t_p_ranks = {_show(tp)}"
        s, f = _pair(ex, where, call(ex, fn, t1.copy(), tp.copy()), "(S, f)")
        want_s, want_f = bench.fit_gustafson_times(t1, tp)
        p = np.arange(1, len(t1) + 1, dtype=float)
        compare_series(ex, where + "; scaled speedup S", s, want_s, [
            (tp / t1, "a speedup is above 1 where p ranks were faster: yours is upside down"),
            (t1[0] / tp, "that is the strong-scaling speedup of the smallest problem, which in weak scaling says how "
                         "well the time holds (the weak-scaling efficiency): each row's problem is p times larger, so "
                         "compare with one rank on that same problem"),
            (want_s / p, "that is the efficiency; the scaled speedup is not divided by p"),
            (p * t1[0] / tp, "that assumes one rank's time grows exactly p-fold with the problem; it was measured: "
                             "use the measured one-rank time of each row"),
        ])
        _compare_gustafson(ex, where, p, want_s, _as_number(ex, where, f, "f"), want_f)
    where = "one rank count only: t_one_rank = [0.5], t_p_ranks = [0.5]"
    _expect_value_error(ex, fn, where, "one row, p = 1, fixes no serial fraction (every f fits it)",
                        np.array([0.5]), np.array([0.5]))
    passed(ex, len(cases) + 1)


def _compare_gustafson(ex: str, where: str, p, s, f: float, want_f: float) -> None:
    if abs(f - want_f) <= 1e-6 * max(1.0, abs(want_f)):
        return
    many = p > 1
    per_row = (p[many] - s[many]) / (p[many] - 1)
    wrong = [
        (1 - want_f, "f is 1 - your value: you fitted the parallel share; f is the serial one"),
        (float(per_row[-1]), "your f solves the law for the last row alone: least squares uses every row"),
        (float(per_row.mean()), "your f is the mean of each row's own f: that weighs a 2-rank row, whose f is the "
                                "noisiest, as much as the largest; least squares minimises the squared misses of S"),
        (bench.fit_amdahl(p, s), "that is Amdahl's law fitted to the scaled speedups: Gustafson's law is S = p - f (p - 1)"),
        (float(np.polyfit(p - 1, p - s, 1)[0]), "you fitted a line with an intercept: at p = 1 the law gives S = 1 "
                                                "whatever f is, so the line goes through the origin"),
    ]
    if (p - 1 > 1).any():  # rows numbered from 0: p - 1 used as the rank count
        q, sq = p[p - 1 > 1] - 1, s[p - 1 > 1]
        wrong.append((float(np.sum((q - sq) * (q - 1)) / np.sum((q - 1) ** 2)),
                      "your rank counts are off by one: the first row is p = 1, not 0"))
    why = next((w for v, w in wrong if abs(f - v) <= 1e-6 * max(1.0, abs(v))),
               "write p - S against p - 1 for every row: least squares gives the slope of that line through the origin")
    fail(ex, f"{where}\n  your f:   {f:.6g}\n  expected: {want_f:.6g}", why)


# ---- exercise 3: the Karp-Flatt metric --------------------------------------------------------------------------------

@recorded
def karp_flatt(fn) -> None:
    """Exercise (lab 12): ``fn(p, s) -> e``, the Karp-Flatt metric for arrays of worker counts p and measured speedups
    S: per row, the serial fraction that would explain that one measurement by Amdahl's law; NaN where p = 1."""
    ex = "Karp-Flatt metric"
    s4096 = MEASURED["strong, batch 4096"][1][0] / MEASURED["strong, batch 4096"][1]
    cases = [(np.array([2.0, 4.0, 8.0]), bench.amdahl([2.0, 4.0, 8.0], 0.1)),  # exact Amdahl, f = 0.1
             (np.array([2.0, 4.0, 8.0]), np.array([1.8, 3.1, 4.4])),
             (np.array([2.0, 3.0]), np.array([2.0, 3.0])),  # ideal: no serial work
             (np.array([2.0, 4.0, 16.0]), np.array([1.0, 1.0, 1.0])),  # no speedup at all: all serial
             (np.array([2.0, 4.0]), np.array([0.8, 0.5])),  # slower than serial: overhead, e > 1
             (np.array([2.0, 4.0]), np.array([2.1, 4.5])),  # faster than linear: e < 0
             (MEASURED["strong, batch 4096"][0], s4096),  # measured, with the p = 1 row
             (np.array([1.0]), np.array([1.0]))]  # one worker only
    rng = np.random.default_rng(capture.seed(12))  # and one drawn afresh whenever a notebook is graded
    p = np.sort(rng.choice(np.arange(2, 65), 4, replace=False)).astype(float)
    cases.append((p, np.round(rng.uniform(1.0, p), 3)))
    fn = capture.student(fn, ex=ex)
    for p, s in each_case(cases):
        where = f"p = {p.tolist()}, S = {_show(s)}"
        with np.errstate(divide="ignore", invalid="ignore"):  # p = 1: 0/0 is NaN, as it should be
            got = call(ex, fn, p.copy(), s.copy())
            want = np.where(p > 1, (1 / s - 1 / p) / (1 - 1 / p), np.nan)
            wrong = [
                (1 / s - 1 / p, "yours is e times (1 - 1/p): the terms with e share that factor; divide it out"),
                ((1 / p - 1 / s) / (1 - 1 / p), "your sign is flipped: a speedup below p means serial work, e > 0"),
                ((s - p) / (1 - p), "Amdahl's law is linear in e when written with 1/S and 1/p, not with S and p"),
                (1 - want, "yours is 1 - e: you solved for the parallel share, not the serial one"),
                (np.clip(want, 0, 1), "you clipped e to [0, 1]: e < 0 (faster than linear) and e > 1 (slower than "
                                      "one worker) are readings; keep them"),
            ]
        _wrong_only_at_one_worker(ex, where, got, want, p, "one worker shows nothing of a serial part (every e fits "
                                  "S = 1 there): e is undefined at p = 1; return NaN in those rows")
        compare_series(ex, where, got, want, wrong)
    passed(ex, len(cases))


def _wrong_only_at_one_worker(ex: str, where: str, got, want, p, hint: str) -> None:
    """Fail with ``hint`` where ``got`` is right on every row but those of one worker (p = 1)."""
    try:
        a = np.asarray(got, dtype=float)
    except (TypeError, ValueError):
        return  # compare_series says what came back
    one = p == 1
    if a.shape != want.shape or not one.any() or np.allclose(a[one], want[one], rtol=1e-9, atol=1e-12, equal_nan=True):
        return
    if np.allclose(a[~one], want[~one], rtol=1e-9, atol=1e-12):
        fail(ex, f"{where}: yours gives {_show(a[one])} at p = 1, expected {_show(want[one])}", hint)


# ---- exercise 4: Amdahl's serial fraction fitted to measured times ----------------------------------------------------

def _line(x, t) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line t = a + b x."""
    slope, intercept = np.polyfit(np.asarray(x, dtype=float), np.asarray(t, dtype=float), 1)
    return float(intercept), float(slope)


def _as_number(ex: str, where: str, v, name: str) -> float:
    return one_number(ex, where, v, f"{name} should be one number", "return two plain numbers, (f, T1)",
                      not_finite="a division by zero? print the line you fitted")


@recorded
def amdahl_fit(fn) -> None:
    """Exercise (lab 12): ``fn(p, t) -> (f, T1)``, Amdahl's law fitted to measured times by least squares on the times
    themselves (every row counts, repeats and any order allowed), and ValueError for a table of one worker count."""
    ex = "Amdahl fit"
    noise = np.random.default_rng(1212).normal(0, 0.03, 6)
    cases = [("exact Amdahl times, f = 0.1, T1 = 2 s", np.array([1, 2, 4, 8]), _amdahl_times([1, 2, 4, 8], 0.1, 2.0)),
             ("exact, f = 0.3, T1 = 0.8 s, rows unsorted and repeated", np.array([4, 1, 2, 1, 2, 4]),
              _amdahl_times([4, 1, 2, 1, 2, 4], 0.3, 0.8)),
             ("noisy (3 %), f = 0.2, T1 = 1.5 s", np.array([1, 2, 3, 4, 6, 8]),
              np.round(_amdahl_times([1, 2, 3, 4, 6, 8], 0.2, 1.5) * (1 + noise), 5)),
             ("faster than linear", np.array([1, 2, 4]), np.array([1.0, 0.46, 0.22])),
             *((f"measured, {k}", p.astype(int), t) for k, (p, t) in MEASURED.items())]
    rng = np.random.default_rng(capture.seed(121))  # and one drawn afresh whenever a notebook is graded
    p = rng.permutation(np.repeat(np.concatenate([[1], rng.choice(np.arange(2, 17), 3, replace=False)]), 2))
    t = _amdahl_times(p, rng.uniform(0.02, 0.5), rng.uniform(0.1, 5.0)) * rng.normal(1, 0.02, p.size)
    cases.append(("drawn at random, noisy", p, np.round(t, 6)))
    fn = capture.student(fn, ex=ex)
    for name, p, t in each_case(cases, more=1):
        where = f"{name}: p = {p.tolist()}, t = {_show(t)}"
        got = _pair(ex, where, call(ex, fn, p.copy(), t.copy()), "(f, T1)")
        f, t1 = (_as_number(ex, where, v, k) for v, k in zip(got, ("f", "T1")))
        _compare_fit(ex, where, p, t, f, t1)
    where = "one worker count only, p = [1, 1, 1]"
    _expect_value_error(ex, fn, where, "three times of one worker count fix no line (any serial fraction fits them)",
                        np.array([1, 1, 1]), np.array([0.51, 0.49, 0.5]))
    passed(ex, len(cases) + 1)


def _compare_fit(ex: str, where: str, p, t, f: float, t1: float) -> None:
    want_f, want_t1 = bench.fit_amdahl_times(p, t)
    measured_t1 = float(np.mean(t[p == 1]))
    if abs(f - want_f) > 1e-6:
        a, b = want_f * want_t1, (1 - want_f) * want_t1
        ap, bp = _line(p, t)
        lo, hi = p == p.min(), p == p.max()
        x2 = 1 / np.array([p.min(), p.max()])
        a2, b2 = _line(x2, [t[lo].mean(), t[hi].mean()])
        wrong = [
            ((ap / (ap + bp), ap / measured_t1, bp / (ap + bp)),
             "you fitted T against p, not against 1/p: the time is no straight line in p"),
            ((1 - want_f,), "f is 1 - your value: you swapped the serial and the parallel parts (np.polyfit returns "
                            "the slope first)"),
            ((a,), "your f is in seconds: the serial time, not yet a fraction of T1"),
            ((a / measured_t1,), "you divided by the measured one-worker time; f is a share of the fitted T1"),
            ((bench.fit_amdahl(p, measured_t1 / t),), "you fitted the speedups, with T1 fixed at its one measurement; "
                                                     "fit the times: the line gives T1 too"),
            ((max(want_f, 0.0), min(want_f, 1.0)), "you clipped f to [0, 1]: a fit outside it is a reading (faster "
                                                   "than linear, or slower than one worker); keep it"),
            ((a2 / (a2 + b2),), "your f fits two rows, the smallest and the largest p: least squares uses every row"),
        ]
        why = next((w for values, w in wrong if any(abs(f - v) <= 1e-6 for v in values)),
                   "print the times your (f, T1) predicts beside the table's: least squares makes the sum of the "
                   "squared differences the smallest")
        fail(ex, f"{where}\n  your f:   {f:.6g}\n  expected: {want_f:.6g}", why)
    if abs(t1 - want_t1) > 1e-6 * abs(want_t1):
        a, b = want_f * want_t1, (1 - want_f) * want_t1
        wrong = [(measured_t1, "your T1 is the measured one-worker time; T1 is the fitted line's value at p = 1"),
                 (a, "your T1 is the line's value at 1/p = 0, on infinitely many workers; T1 is its value at p = 1"),
                 (b, "your T1 is the slope alone; T1 is the line's value at p = 1")]
        why = next((w for v, w in wrong if abs(t1 - v) <= 1e-6 * abs(v)), "T1 is the time the fitted line gives at p = 1")
        fail(ex, f"{where}\n  your T1:  {t1:.6g} s\n  expected: {want_t1:.6g} s", why)


# ---- exercise 5: waiting or sending? ----------------------------------------------------------------------------------

def _step(rank: int, backprop: float, comm_end: float, update: float = 0.05, name: str = "allreduce") -> list[dict]:
    """One rank's traced step: backprop from 0, the collective until comm_end, then the update."""
    return [{"rank": rank, "name": "backprop", "kind": "compute", "start": 0.0, "end": backprop},
            {"rank": rank, "name": name, "kind": "comm", "start": backprop, "end": comm_end},
            {"rank": rank, "name": "update", "kind": "compute", "start": comm_end, "end": comm_end + update}]


def _breakdown_cases(rng) -> list[tuple[str, list[dict]]]:
    equal = _step(0, 1.0, 1.3) + _step(1, 1.0, 1.3)
    uneven = _step(0, 1.0, 2.3) + _step(1, 1.5, 2.3) + _step(2, 2.0, 2.3)
    shuffled = [uneven[i] for i in rng.permutation(len(uneven))]
    later = [dict(e, rank=e["rank"] + 5) for e in _step(2, 0.5, 1.4)] + _step(0, 1.2, 1.4) + _step(1, 0.9, 1.4)
    two = _step(0, 1.0, 1.6) + _step(1, 1.4, 1.6)
    two += [{"rank": 0, "name": "allreduce loss", "kind": "comm", "start": 1.7, "end": 2.0},
            {"rank": 1, "name": "allreduce loss", "kind": "comm", "start": 1.65, "end": 2.0}]
    leave = _step(0, 0.8, 1.5) + _step(1, 1.1, 1.45) + _step(2, 1.2, 1.6)  # a rank may leave before another
    early = _step(0, 0.5, 0.9) + _step(1, 0.7, 1.3) + _step(2, 1.1, 1.4)  # rank 0 leaves before rank 2 enters
    return [("one rank", _step(0, 1.0, 1.2)), ("2 ranks, equal", equal), ("3 ranks, uneven", uneven),
            ("3 ranks that leave at different times", leave),
            ("3 ranks, uneven, events in any order", shuffled), ("ranks 0, 1 and 7, listed 7 first", later),
            ("2 ranks, two collectives", two),
            ("3 ranks, rank 0 leaves before rank 2 enters", early),
            ("3 ranks, two collectives, events in any order", _two_shuffled(rng)), _drawn_breakdown(rng)]


def _two_shuffled(rng) -> list[dict]:
    """Two collectives of 3 ranks, each with its own last rank, listed in an order where some rank's second
    collective comes before its first and another's does not: order and position say nothing, names do."""
    events = _step(0, 1.0, 1.6) + _step(1, 1.4, 1.6) + _step(2, 1.2, 1.6)
    events += [{"rank": r, "name": "allreduce loss", "kind": "comm", "start": a, "end": 2.0}
               for r, a in ((0, 1.7), (1, 1.65), (2, 1.8))]
    while True:
        order = [events[i] for i in rng.permutation(len(events))]
        first = {r: next(e["name"] for e in order if e["rank"] == r and e["kind"] == "comm") for r in range(3)}
        if len(set(first.values())) == 2:
            return order


def _drawn_breakdown(rng) -> tuple[str, list[dict]]:
    """2 to 6 ranks, each leaving its collective at its own time (some before the last enters), events shuffled."""
    p = int(rng.integers(2, 7))
    done = np.round(rng.uniform(0.5, 2.0, p), 4)
    stay = np.round(rng.uniform(0.05, 0.8, p), 4)
    events = [e for r in range(p) for e in _step(r, float(done[r]), float(done[r] + stay[r]))]
    return f"{p} ranks, drawn at random", [events[i] for i in rng.permutation(len(events))]


@recorded
def wait_breakdown(fn) -> None:
    """Exercise (lab 12): ``fn(events) -> array``, one row ``(compute, waiting, transfer)`` per rank of a traced
    step (:class:`labkit.bench.Timeline` events: dicts of rank, name, kind, start, end), rows in rank order; against
    :func:`labkit.bench.wait_breakdown` to a relative 1e-9: one rank, equal and uneven ranks, ranks that leave at
    different times, a rank that leaves before the last one enters, events in any order, rank numbers with gaps, two
    collectives in one step, listed in order and shuffled, and one drawn at random (ranks leaving at their own
    times, events shuffled)."""
    ex = "waiting or sending"
    fn = capture.student(fn, ex=ex)
    cases = _breakdown_cases(np.random.default_rng(capture.seed(124)))
    for name, events in each_case(cases):
        got = call(ex, fn, [dict(e) for e in events], where=name,
                   hint="events is a list of dicts with the keys rank, name, kind, start and end")
        _compare_breakdown(ex, name, events, got, bench.wait_breakdown(events))
    passed(ex, len(cases))


def _compare_breakdown(ex: str, where: str, events, got, want) -> None:
    try:
        a = np.asarray(got, dtype=float)
    except (TypeError, ValueError):
        fail(ex, f"{where}: expected an array of numbers, got {type(got).__name__}")
    p = want.shape[0]
    if a.shape != want.shape:
        hint = ("one row per rank, the three columns compute, waiting, transfer: you have it transposed"
                if a.shape == want.shape[::-1] else "one row per rank: (compute, waiting, transfer)")
        fail(ex, f"{where}: shape {a.shape}, expected ({p}, 3)", hint)
    if np.allclose(a, want, rtol=1e-9, atol=1e-12):
        return
    shown = f"\n  yours:    {np.round(a, 4).tolist()}\n  expected: {np.round(want, 4).tolist()}"
    if not np.allclose(a[:, 0], want[:, 0], rtol=1e-9, atol=1e-12):
        order = [int(e["rank"]) for e in events]
        by_event = list(dict.fromkeys(order))
        backprop_only = np.array([sum(e["end"] - e["start"] for e in events if e["rank"] == r and e["name"] == "backprop")
                                  for r in sorted(set(order))])
        if by_event != sorted(by_event) and np.allclose(np.sort(a[:, 0]), np.sort(want[:, 0])):
            hint = "the rows go in rank order, whatever order the events come in"
        elif np.allclose(a[:, 0], backprop_only):
            hint = "every event of kind \"compute\" counts, the update too, not only the one named backprop"
        else:
            hint = "compute is the sum of the rank's events of kind \"compute\""
        fail(ex, f"{where}: wrong compute column{shown}", hint)
    total = want[:, 1] + want[:, 2]
    if np.allclose(a[:, 1], 0) and np.allclose(a[:, 2], total):
        fail(ex, f"{where}: no waiting at all{shown}",
             "a rank that enters the collective early cannot finish it before the last rank enters: that part is "
             "waiting, not transfer")
    for w, hint in _wrong_splits(events):
        if not np.allclose(w, want[:, 1:], rtol=1e-9, atol=1e-12) and np.allclose(a[:, 1:], w, rtol=1e-9, atol=1e-12):
            fail(ex, f"{where}: wrong waiting column{shown}", hint)
    if (a[:, 1:] < -1e-12).any():
        fail(ex, f"{where}: a negative time{shown}", "waiting and transfer are parts of a rank's time in a collective: "
             "neither is below 0, and together they are that time")
    if np.allclose(a[:, 1], want[:, 1], rtol=1e-9, atol=1e-12):
        fail(ex, f"{where}: wrong transfer column{shown}",
             "transfer is the rest of the rank's time in the collective: its whole time there, less the waiting")
    fail(ex, f"{where}: wrong waiting column{shown}",
         "a rank waits from the start of its collective until the last rank has entered it")


def _split(events, groups, last_of=None, waiting=None) -> np.ndarray:
    """(waiting, transfer) per rank, in rank order, with the collectives taken as ``groups`` (lists of events),
    each's last entry as ``last_of(group)`` and a rank's waiting as ``waiting(event, last)``: labkit's rule, or a
    student's mistaken one."""
    last_of = last_of or (lambda g: max(e["start"] for e in g))
    waiting = waiting or (lambda e, last: min(e["end"], last) - e["start"])
    ranks = sorted({int(e["rank"]) for e in events})
    out = np.zeros((len(ranks), 2))
    for group in groups:
        last = last_of(group)
        for e in group:
            w = waiting(e, last)
            out[ranks.index(int(e["rank"]))] += w, e["end"] - e["start"] - w
    return out


def _wrong_splits(events) -> list[tuple[np.ndarray, str]]:
    """The (waiting, transfer) columns of the typical mistakes, each with its hint: rules right only while every rank
    leaves after the last one enters, the events come sorted, or a step holds one collective."""
    comm = [e for e in events if e["kind"] == "comm"]
    by_name = [[e for e in comm if e["name"] == n] for n in dict.fromkeys(e["name"] for e in comm)]
    per_rank: dict[int, list[dict]] = {}
    for e in comm:
        per_rank.setdefault(int(e["rank"]), []).append(e)
    by_place = [[v[k] for v in per_rank.values() if len(v) > k] for k in range(max(map(len, per_rank.values()), default=0))]
    gone = [(e, max(x["start"] for x in g)) for g in by_name for e in g if e["end"] < max(x["start"] for x in g)]
    left = (f"rank {gone[0][0]['rank']} left {gone[0][0]['name']} at {gone[0][0]['end']:g} s, before the last rank "
            f"entered it at {gone[0][1]:g} s" if gone else "a rank left before the last one entered")

    def last_rank_transfer(e, last, groups=by_name):  # every rank's transfer taken as the last rank's
        g = next(g for g in groups if e in g)
        final = max(g, key=lambda x: x["start"])
        return e["end"] - e["start"] - (final["end"] - final["start"])

    return [
        (_split(events, by_name, waiting=lambda e, last: last - e["start"]),
         f"{left}: ranks need not leave together, and no rank waits past its own leaving"),
        (_split(events, by_name, waiting=last_rank_transfer),
         "that gives every rank the last rank's time in the collective as its transfer: each rank leaves at its own "
         "time, its event's end"),
        (_split(events, by_name, last_of=lambda g: g[-1]["start"]),
         "the events come in any order: the last rank to enter is the one whose start is latest, not the one listed "
         "last"),
        (_split(events, by_name, last_of=lambda g: g[-1]["start"], waiting=lambda e, last: max(0.0, min(e["end"], last)
                                                                                             - e["start"])),
         "the events come in any order: the last rank to enter is the one whose start is latest, not the one listed "
         "last"),
        (_split(events, [list({int(e["rank"]): e for e in comm}.values())]),
         "a step may hold several collectives, one event each per rank: add up each rank's waiting and transfer over "
         "all of them"),
        (_split(events, by_place),
         "the events come in any order: a rank's k-th event listed need not be its k-th collective. Group the events "
         "by their name"),
        (_split(events, [comm], waiting=lambda e, last: max(0.0, min(e["end"], last) - e["start"])),
         "each collective waits for its own last rank: take the latest start among the events of that name only"),
    ]


# ---- exercise 6: the step on a network that costs -----------------------------------------------------------------

@recorded
def wire_step(fn) -> None:
    """Exercise (lab 12): ``fn(t1, ranks, cores, alpha, beta, nbytes) -> array``, the alpha-beta model of the
    data-parallel step on each rank count of ``ranks``, one rank per host: the one-rank step ``t1`` shared over the
    ranks, over the ``cores`` where ranks outnumber them, plus an allreduce of ``nbytes`` moved as the ring moves it,
    2(p - 1) messages of nbytes / p; against :func:`labkit.scaling.predicted_step` to a relative 1e-9."""
    ex = "the step on a network that costs"
    cases = [(0.042, [1, 2, 4], 2, 1.2e-5, 8.2e-8, GRADIENT_BYTES),  # lab 12's step across 100 Mbit/s cables
             (0.042, [1, 2, 3, 4], 8, 1.2e-5, 8.2e-8, GRADIENT_BYTES),  # as many cores as ranks
             (1.0, [1], 4, 1e-3, 1e-9, 1e6),  # one rank: no allreduce at all
             (0.5, [2, 8, 16], 4, 2e-6, 1e-10, 4e8),  # a fast network, a large gradient, no p = 1 row
             (0.01, [1, 2, 64], 16, 5e-5, 0.0, 1e6)]  # latency only: beta = 0
    rng = np.random.default_rng(capture.seed(126))  # and one drawn afresh whenever a notebook is graded
    cases.append((float(rng.uniform(0.01, 1)), sorted(rng.choice(np.arange(1, 33), 4, replace=False).tolist()),
                  int(rng.integers(1, 17)), float(rng.uniform(1e-6, 1e-4)), float(rng.uniform(1e-10, 1e-7)),
                  float(rng.integers(1_000, 10_000_000))))
    fn = capture.student(fn, ex=ex)
    for t1, ranks, cores, alpha, beta, nbytes in each_case(cases):
        where = f"t1 = {t1:g} s, ranks {ranks}, {cores} cores, alpha = {alpha:g} s, beta = {beta:g} s/byte, {nbytes:g} bytes"
        got = call(ex, fn, t1, list(ranks), cores, alpha, beta, nbytes)
        want = predicted_step(t1, ranks, cores, alpha, beta, nbytes)
        p = np.array(ranks, dtype=float)
        compute = t1 / np.minimum(p, cores)
        ring = np.where(p > 1, 2 * (p - 1) * (alpha + nbytes / p * beta), 0.0)
        wrong = [
            (t1 / p + ring, "past the cores, ranks take turns: the compute shares out over min(p, cores), not over p"),
            (compute + np.where(p > 1, 2 * (p - 1) * (alpha + nbytes * beta), 0.0),
             "each of the ring's messages carries nbytes / p, one block of the gradient, not the whole of it"),
            (compute + np.where(p > 1, (p - 1) * (alpha + nbytes / p * beta), 0.0),
             "that is half the ring: a reduce-scatter, then an allgather of as many messages"),
            (compute + np.where(p > 1, 2 * (p - 1) * nbytes / p * beta, 0.0),
             "every message pays the latency alpha as well"),
            (t1 + ring, "the compute divides between the ranks: each backprops its share of the batch"),
        ]
        _wrong_only_at_one_worker(ex, where, got, want, p, "one rank has no one to send to: no allreduce at p = 1, "
                                  "only t1")
        compare_series(ex, where, got, want, wrong)
    passed(ex, len(cases))


EXERCISES = (
    Exercise("speedup_efficiency", "12", references=("labkit.bench:speedup_table",), hints=(
        "A speedup compares each row's time with the time of one worker: find the row where p is 1 (it need not be "
        "the first).",
        "A speedup above 1 means faster: which of the two times goes on top?",
        "Efficiency is the speedup each worker contributes: share the row's speedup among that row's workers. Keep "
        "values above 1.",
        "No row where p is 1: no baseline. Check for it first and raise ValueError rather than guess one.",
    )),
    Exercise("gustafson_fit", "12", references=("labkit.bench:fit_gustafson_times",), hints=(
        "In weak scaling every rank count solves a different problem: p ranks get p times the work of one. The scaled "
        "speedup asks how much longer one rank took on the problem p ranks just solved.",
        "Gustafson's law, S = p - f (p - 1), is linear in f: write it as p - S = f (p - 1). For every row, x = p - 1 "
        "and y = p - S lie on a line through the origin, and f is its slope.",
        "Least squares for a slope through the origin: minimise the sum over rows of (y - f x)^2. Set its derivative "
        "in f to zero and solve.",
        "The p = 1 row has x = y = 0 and adds nothing. With no row of p > 1 there is nothing to fit: raise ValueError.",
    )),
    Exercise("karp_flatt", "12", references=("labkit.bench:karp_flatt",), hints=(
        "Amdahl's law in times: on p workers a share e of T1 still takes e T1, the rest takes (1 - e) T1 / p. "
        "Divide by T1: the left side is 1/S.",
        "S and p are measured; e is the unknown, and the equation is linear in it: collect the terms with e on one "
        "side.",
        "e multiplies a factor that depends on p alone. At p = 1 that factor is 0: every e fits, so return NaN there.",
    )),
    Exercise("amdahl_fit", "12",
             references=("labkit.bench:fit_amdahl_times", "labkit.bench:fit_amdahl"), hints=(
        "Write Amdahl's law for the time: on p workers the serial part takes f T1, the rest (1 - f) T1 is shared "
        "by p.",
        "Read T(p) as a function of x = 1/p: it is a straight line. What are its intercept and its slope, in terms "
        "of f and T1?",
        "Fit that line to every row by least squares: np.polyfit(x, t, 1) (slope first) or np.linalg.lstsq.",
        "Back from the line to the law: T1 is the line at x = 1, f the share of T1 that the intercept is. With one "
        "worker count there is no line: raise ValueError.",
    )),    Exercise("wait_breakdown", "12", references=("labkit.bench:wait_breakdown",), hints=(
        "Compute first: for each rank, add up the lengths (end - start) of its events of kind \"compute\". Keep one "
        "row per rank, in rank order, whatever order the events come in.",
        "An allreduce needs every rank's data: no rank can leave it before the last rank has entered. When did the "
        "last rank enter? Look at the starts of the events of that collective.",
        "A rank that entered earlier spent the time until then waiting for the others, at most its whole time in "
        "the collective; the rest of that time is transfer.",
        "A step may hold several collectives (events of kind \"comm\" with different names): each has its own last "
        "rank. Add each rank's waiting and transfer over them.",
    )),
    Exercise("wire_step", "12", references=("labkit.scaling:predicted_step",), hints=(
        "Two parts add up: the backprop, which the ranks share, and the allreduce, which every rank waits for. "
        "Model each on its own, for one rank count p at a time.",
        "The compute: one rank took t1. p ranks on p cores take a p-th of it; past the cores, ranks only take "
        "turns, so no more than the cores divide it.",
        "The ring allreduce (lab 07): a reduce-scatter, then an allgather, each p - 1 steps; in each step a rank "
        "sends one block of the gradient through its cable. How large is a block, and what does lab 06's model "
        "say one message of that size costs?",
        "On one rank nothing is sent. Return one time per entry of ranks, as an array.",
    )),
)
