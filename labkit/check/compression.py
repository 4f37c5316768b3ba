"""Checks of lab 10, gradient compression: int8 quantisation with a per-tensor scale, top-k selection, summing every
rank's sparse pieces, top-k with error feedback, the compressed allreduce on MPI engines that puts them together, and
the bytes each rank's cable carries per step, dense ring against top-k. Each runs the student's function on fresh
inputs, edge cases included, and names the mistake; the compressed allreduce runs on every rank, on communicators of
1 to p ranks (:func:`.common.collective_check`)."""

from __future__ import annotations

import math

import numpy as np

from ..compression import bytes_per_step as model
from ..compression import top_k_with_feedback
from . import capture
from .common import (
    ExerciseError,
    call,
    collective_check,
    each_case,
    fail,
    not_written,
    on_given_comm,
    one_number,
    passed,
    recorded,
)
from .exercises import Exercise


def _pair(ex: str, where: str, got, names: str):
    if not isinstance(got, tuple) or len(got) != 2:
        fail(ex, f"{where}: expected a tuple {names}, got {type(got).__name__}"
              + (f" of length {len(got)}" if isinstance(got, tuple) else ""), f"end with `return {names[1:-1]}`")
    return got


def _unchanged(ex: str, where: str, g, g0) -> None:
    if not np.array_equal(g, g0):
        fail(ex, f"{where}: g was modified", "work on new arrays: the caller still needs g as it was")


# ---- int8 quantisation ---------------------------------------------------------------------------------------------

# (n, dtype, kind) of the cases, in the order they are drawn and checked
_INT8_CASES = ((1, np.float64, "normal"), (7, np.float32, "normal"), (1000, np.float32, "negative"),
               (4096, np.float64, "outlier"), (2000, np.float32, "tiny"), (64, np.float64, "constant"),
               (333, np.float32, "zeros"))


def _int8_input(rng, n, dtype, kind) -> np.ndarray:
    g = rng.standard_normal(n)
    if kind == "negative":  # the largest magnitude is a negative entry, well above the largest positive one
        g[int(rng.integers(n))] = -4 * np.abs(g).max()
    elif kind == "outlier":  # one entry a thousand times the typical one
        g[int(rng.integers(n))] = 1000.0
    elif kind == "tiny":  # gradients are often small numbers
        g *= 1e-6
    elif kind == "constant":
        g[:] = 0.25
    elif kind == "zeros":
        g[:] = 0
    return g.astype(dtype)


@recorded
def int8_quantise(fn) -> None:
    """Exercise (lab 10): ``fn(g) -> (q, scale)``, g as int8 with one scale per tensor, rounded to the nearest step.

    ``q`` is int8 of g's shape, ``scale`` one positive number, and the receiver rebuilds ``q * scale``. Checked on
    7 gradients (1 to 4,096 entries, float32 and float64; the largest magnitude negative; an outlier; tiny values;
    a constant; all zeros): the scale maps the largest magnitude to +-127 (to 1e-5 relative), every rebuilt entry is
    within half a step (scale / 2) of g, and g is left unchanged.
    """
    ex = "int8 quantisation"
    fn = capture.student(fn, ex=ex)
    rng = np.random.default_rng(capture.seed(10))
    for n, dtype, kind in each_case(_INT8_CASES):
        _int8_case(ex, fn, rng, n, dtype, kind)
    passed(ex, len(_INT8_CASES))


def _int8_case(ex, fn, rng, n, dtype, kind) -> None:
    g = _int8_input(rng, n, dtype, kind)
    g0 = g.copy()
    where = f"n={n}, {np.dtype(dtype)}, {kind} entries"
    hint = ("an all-zero gradient has largest magnitude 0: a scale of 0 makes g / scale divide by zero"
            if kind == "zeros" else "try your function by hand on a small array, printing q and scale")
    q, scale = _pair(ex, where, call(ex, fn, g, where=where, hint=hint), "(q, scale)")
    _unchanged(ex, where, g, g0)
    q = np.asarray(q)
    if q.dtype != np.int8:
        fail(ex, f"{where}: q is {q.dtype}, but what travels must be int8 (1 byte a value)",
             "convert the rounded values with .astype(np.int8) once they are in int8's range")
    if q.shape != g.shape:
        fail(ex, f"{where}: q has shape {q.shape}, expected {g.shape} (one int8 per entry of g)")
    s = _scale(ex, where, scale)
    if kind == "zeros":
        if not (math.isfinite(s) and s > 0):
            fail(ex, f"{where}: the scale is {s}, not a positive number", hint + " (any positive scale will do)")
        if np.any(q != 0):
            fail(ex, f"{where}: q holds {np.count_nonzero(q)} non-zero values for a gradient of zeros", hint)
        return
    peak = float(np.abs(g0.astype(np.float64)).max())
    want = peak / 127
    if not (math.isfinite(s) and math.isclose(s, want, rel_tol=1e-5)):
        fail(ex, f"{where}: scale {s:.6g}, expected {want:.6g} (the largest magnitude, {peak:.6g}, on +-127)",
             _scale_mistake(g0.astype(np.float64), s, peak))
    _check_rounding(ex, where, g0.astype(np.float64), q, s)


def _scale(ex, where, scale) -> float:
    return one_number(ex, where, scale, "the scale must be one number for the whole tensor",
                      "one scale per tensor: a single float")


def _scale_mistake(g, s, peak) -> str:
    """What a wrong scale most likely came from."""
    def near(x):
        return x > 0 and math.isclose(s, x, rel_tol=1e-4)
    if s < 0:
        return ("the scale uses the largest value, not the largest magnitude: here that value is negative, and a "
                "scale, the size of one step, is positive")
    if near(g.max() / 127) and g.max() < peak:
        return ("the scale uses the largest value, not the largest magnitude: the large negative entries clip "
                "(or wrap around past -128)")
    if near(float(np.abs(g).mean()) / 127) or near(float(np.abs(g).mean())):
        return "the scale uses the mean magnitude, not the largest: every entry above the mean clips at +-127"
    if near(peak / 128):
        return "with 128 steps the largest entry lands on 128, which int8 cannot hold: it wraps around to -128"
    if near(peak / 255) or near(peak / 256):
        return "int8 is signed: it reaches 127 on either side of 0, not 255 (that would be uint8)"
    if near(127 / peak) or near(1 / peak):
        return "your scale is upside down: the receiver multiplies, g ~ q * scale"
    if near(peak):
        return "that scale puts the largest magnitude on 1: q only takes the values -1, 0 and 1"
    if s > peak / 127:
        return (f"the largest magnitude lands on {peak / s:.3g} steps, not 127: the steps are coarser than they need "
                "to be")
    return f"the largest magnitude would need {peak / s:.4g} steps, beyond int8's 127: it clips or wraps around"


def _check_rounding(ex, where, g, q, s) -> None:
    """Every q * s within half a step of g; a wrong rounding is named."""
    x = g / s
    err = np.abs(q.astype(np.float64) - x)
    if err.max() <= 0.5 + 1e-4:
        return
    i = int(np.argmax(err))
    qi = q.astype(np.int64)

    def like(rounded):  # q follows this rounding where it differs from the nearest step (away from whole numbers:
        # the student's own float32 division may land on the other side of one)
        telling = (rounded != np.rint(x)) & (np.abs(x - np.rint(x)) > 1e-3)
        return telling.any() and np.array_equal(qi[telling], rounded[telling])
    if like(np.trunc(x)):
        hint = "astype(np.int8) cuts toward zero (3.9 becomes 3): round to the nearest step before converting"
    elif like(np.floor(x)):
        hint = "np.floor rounds down (-0.2 becomes -1): round to the nearest step instead"
    elif like(np.ceil(x)):
        hint = "np.ceil rounds up (0.2 becomes 1): round to the nearest step instead"
    elif np.any((np.abs(x) > 100) & (np.sign(qi) != np.sign(x))):
        hint = "an entry near +-127 came back with the wrong sign: it went past int8's range and wrapped around"
    else:
        hint = "each q should be g / scale rounded to the nearest whole number"
    fail(ex, f"{where}: q * scale is {err.max():.3g} steps away from g at index {i} (g = {g[i]:.6g}, q = {q[i]}); "
             "at most half a step is allowed", hint)


# ---- top-k selection -----------------------------------------------------------------------------------------------

# (n, k, dtype, kind) of the cases, in order
_TOPK_CASES = ((10, 3, np.float64, "normal"), (1, 1, np.float32, "normal"), (8, 0, np.float64, "normal"),
               (50, 50, np.float32, "normal"), (5, 9, np.float64, "normal"), (12, 4, np.float64, "ties"),
               (1000, 10, np.float32, "negative"), (10_000, 100, np.float32, "normal"))


def _topk_input(rng, n, dtype, kind) -> np.ndarray:
    g = rng.standard_normal(n) * rng.choice([1, 10], n)
    if kind == "ties":  # two clear winners, then four entries of equal magnitude for the last two places
        g = np.array([5.0, -5.0, 2.0, -2.0, 2.0, -2.0, 1.0, 0.5, -0.5, 0.25, 0.0, 0.125])
        g = g[rng.permutation(n)]
    elif kind == "negative":  # the largest magnitudes are all negative
        g = np.abs(g)
        g[rng.choice(n, 20, replace=False)] *= -50
    return g.astype(dtype)


@recorded
def topk_select(fn) -> None:
    """Exercise (lab 10): ``fn(g, k) -> (indices, values)``, the k entries of g of largest magnitude.

    Checked on 8 cases (n from 1 to 10,000, float32 and float64, k = 0, k = n, k > n, ties, large negative
    entries): min(k, n) different integer indices in any order, the values exactly g at them, every magnitude sent
    at least every magnitude left (ties may go either way), and g left unchanged.
    """
    ex = "top-k selection"
    fn = capture.student(fn, ex=ex)
    rng = np.random.default_rng(capture.seed(11))
    for n, k, dtype, kind in each_case(_TOPK_CASES):
        _topk_case(ex, fn, rng, n, k, dtype, kind)
    passed(ex, len(_TOPK_CASES))


def _topk_case(ex, fn, rng, n, k, dtype, kind) -> None:
    g = _topk_input(rng, n, dtype, kind)
    g0 = g.copy()
    where = f"n={n}, k={k}, {np.dtype(dtype)}" + ("" if kind == "normal" else f", {kind}")
    hint = ("k = 0 asks for nothing: return two empty arrays" if k == 0 else
            f"k can be larger than n (a layer with {n} entries): then send all of them" if k > n else
            "try your function by hand on a small array, printing what it returns")
    idx, values = _pair(ex, where, call(ex, fn, g, k, where=where, hint=hint), "(indices, values)")
    _unchanged(ex, where, g, g0)
    idx, values = np.asarray(idx), np.asarray(values)
    want = min(k, n)
    if idx.dtype == bool:
        fail(ex, f"{where}: the indices are a mask of {idx.size} booleans", "send the positions, not a mask")
    if idx.shape != (want,):
        fail(ex, f"{where}: sent {idx.size} indices, expected {want}", _count_mistake(n, k, idx.size))
    if values.shape != (want,):
        fail(ex, f"{where}: {values.size} values for {want} indices", "one value for each index")
    if want == 0:
        return
    if idx.dtype.kind not in "iu" or idx.min() < 0 or idx.max() >= n or len(set(idx.tolist())) != want:
        fail(ex, f"{where}: the indices must be {want} different integers in 0..{n - 1}, got {idx[:8]}",
             "the positions of the entries in g, each at most once")
    _check_topk_values(ex, where, g0, idx, values)
    mag = np.abs(g0.astype(np.float64))
    rest = np.ones(n, dtype=bool)
    rest[idx] = False
    if rest.any() and mag[idx].min() < mag[rest].max():
        fail(ex, f"{where}: an entry of magnitude {mag[rest].max():.4g} was left while {mag[idx].min():.4g} was sent",
             _which_mistake(g0.astype(np.float64), idx, want))


def _count_mistake(n, k, got) -> str:
    if k == 0 and got == n:
        return "for k = 0 you sent everything: x[-0:] is all of x, since -0 is 0"
    if k > n:
        return f"k = {k} is more than n = {n}: send all n entries, no more"
    if abs(got - k) == 1:
        return "off by one: check where your slice starts for k = 1 by hand"
    return "one index per entry sent"


def _check_topk_values(ex, where, g, idx, values) -> None:
    right = g[idx]
    if np.array_equal(values.astype(np.float64), right.astype(np.float64)):
        return
    if np.array_equal(values.astype(np.float64), np.abs(right).astype(np.float64)):
        hint = "you send |g|: the sign is lost, and the receiver adds the wrong number"
    else:
        hint = "values[i] must be g[indices[i]], exactly"
    fail(ex, f"{where}: the values sent are not g at the indices sent", hint)


def _which_mistake(g, idx, k) -> str:
    """Which wrong order the student's indices follow."""
    got = set(idx.tolist())

    def same(order):
        return got == set(order[:k].tolist())
    if same(np.argsort(np.abs(g), kind="stable")):
        return "you return the k smallest magnitudes: sorting puts the smallest first, the largest are at the end"
    if same(np.argsort(-g, kind="stable")):
        return "you choose by value: a large negative entry matters as much as a large positive one (magnitude)"
    if same(np.argsort(g, kind="stable")):
        return "you return the most negative entries: choose by magnitude, whatever the sign"
    return "choose the k entries whose magnitude, |g|, is largest"


# ---- summing every rank's sparse pieces -----------------------------------------------------------------------------

# (n, number of pieces, entries per piece, dtype, kind) of the cases, in order
_SUM_CASES = ((10, 1, 3, np.float64, "random"), (20, 3, 6, np.float32, "random"), (5, 4, 1, np.float64, "same"),
              (8, 3, 2, np.float64, "one empty"), (1000, 8, 50, np.float32, "random"), (6, 2, 6, np.float32, "random"))


def _sum_input(rng, n, p, k, dtype, kind) -> list:
    pieces = []
    for r in range(p):
        if kind == "one empty" and r == 1:  # a rank with nothing to send this step
            idx = np.zeros(0, dtype=np.int32)
        elif kind == "same":  # every rank sends the same entry
            idx = np.array([2], dtype=np.int32)
        else:
            idx = rng.choice(n, k, replace=False).astype(np.int32)
        pieces.append((idx, rng.standard_normal(idx.size).astype(dtype)))
    return pieces


@recorded
def sparse_sum(fn) -> None:
    """Exercise (lab 10): ``fn(pieces, n) -> dense``, the sum of every rank's sparse piece ``(indices, values)``.

    Checked on 6 cases (n from 5 to 1,000, 1 to 8 pieces, float32 and float64, indices shared between pieces, every
    piece on the same index, an empty piece): a dense array of n entries in the values' dtype, equal to the sum
    (to 1e-6 relative), the pieces left unchanged.
    """
    ex = "summing sparse pieces"
    fn = capture.student(fn, ex=ex)
    rng = np.random.default_rng(capture.seed(12))
    for n, p, k, dtype, kind in each_case(_SUM_CASES):
        _sum_case(ex, fn, rng, n, p, k, dtype, kind)
    passed(ex, len(_SUM_CASES))


def _sum_case(ex, fn, rng, n, p, k, dtype, kind) -> None:
    pieces = _sum_input(rng, n, p, k, dtype, kind)
    before = [(i.copy(), v.copy()) for i, v in pieces]
    where = f"n={n}, {p} piece{'s' if p > 1 else ''} of {k} entr{'y' if k == 1 else 'ies'}, {np.dtype(dtype)}" + (
        "" if kind == "random" else f", {kind}")
    hint = ("an empty piece (a rank that sent nothing) has indices and values of length 0" if kind == "one empty"
            else "try your function by hand on two small pieces, printing what it returns")
    got = call(ex, fn, pieces, n, where=where, hint=hint)
    if any(not (np.array_equal(i, i0) and np.array_equal(v, v0)) for (i, v), (i0, v0) in zip(pieces, before)):
        fail(ex, f"{where}: a piece was modified", "read the pieces; write only into your own result")
    want = np.zeros(n)
    for i, v in before:
        np.add.at(want, i, v.astype(np.float64))
    try:
        a = np.asarray(got)
    except (TypeError, ValueError):
        a = np.asarray(None)
    if a.shape != (n,):
        fail(ex, f"{where}: expected a dense array of {n} entries, got {type(got).__name__}"
                 + (f" of shape {a.shape}" if a.ndim else ""),
             "the sum has an entry for every position of the gradient, 0 where nobody sent anything")
    if a.dtype != np.dtype(dtype):
        fail(ex, f"{where}: the sum is {a.dtype}, the values sent are {np.dtype(dtype)}",
             "start from zeros of the values' dtype: the gradient keeps its precision")
    tol = 1e-6 if dtype == np.float64 else 1e-5
    if np.allclose(a, want, rtol=tol, atol=tol):
        return
    last = np.zeros(n)
    for i, v in before:
        last[i] = v
    if p > 1 and np.allclose(a, want / p, rtol=tol, atol=tol):
        why = f"you average over the {p} pieces: the allreduce sums (the training divides by the ranks later)"
    elif np.allclose(a, last, rtol=tol, atol=tol):
        why = ("where two pieces hold the same index only one value arrived: out[idx] = v overwrites, and out[idx] += v "
               "with an index repeated in idx adds it once")
    else:
        why = "every value of every piece goes into its index of the sum"
    i = int(np.argmax(np.abs(a - want)))
    fail(ex, f"{where}: entry {i} of the sum is {a[i]:.6g}, expected {want[i]:.6g}", why)


# ---- top-k with error feedback -------------------------------------------------------------------------------------

# (n, ratio, dtype) of the one-step cases, in the order they are drawn and checked
_CASES = ((10, 0.3, np.float64), (1, 0.5, np.float64), (7, 0.01, np.float32), (1000, 0.01, np.float32),
          (333, 0.1, np.float64), (64, 1.0, np.float32))


@recorded
def topk_feedback(fn) -> None:
    """Exercise (lab 10): ``fn(g, residual, ratio) -> (indices, values, new_residual)``, top-k with error feedback.

    Sends the k = ceil(ratio * n) (at least 1) entries of largest magnitude of ``g + residual``; the new
    residual is ``g + residual`` with the sent entries zeroed. Checked on several sizes, ratios and
    dtypes, with negative entries, and over many steps: what was sent plus the residual left is exactly
    the sum of all gradients (nothing is lost, only delayed).
    """
    ex = "top-k with error feedback"
    fn = capture.student(fn, ex=ex)
    rng = np.random.default_rng(capture.seed(9))
    for n, ratio, dtype in each_case(_CASES, more=1):
        _one_step(ex, fn, rng, n, ratio, dtype)
    _many_steps(ex, fn, rng)
    passed(ex, len(_CASES) + 1)


def _one_step(ex, fn, rng, n, ratio, dtype) -> None:
    """One call on fresh inputs: the inputs stay untouched, the right k entries are sent, the rest is kept."""
    g = (rng.standard_normal(n) * rng.choice([1, 10], n)).astype(dtype)
    residual = (rng.standard_normal(n) * 0.5).astype(dtype)
    g0, r0 = g.copy(), residual.copy()
    where = f"n={n}, ratio={ratio}, {np.dtype(dtype)}"
    idx, values, new_res = _unpacked(ex, where, call(ex, fn, g, residual, ratio))
    if not np.array_equal(g, g0):
        fail(ex, f"{where}: g was modified", "work on corrected = g + residual, a new array")
    if not np.array_equal(residual, r0):
        fail(ex, f"{where}: the residual passed in was modified", "return a new residual instead")
    corrected = g0 + r0
    k = min(n, max(1, math.ceil(ratio * n)))
    _check_indices(ex, where, idx, values, n, k)
    _check_largest(ex, where, idx, corrected, g0, n, k)
    _check_values(ex, where, idx, values, corrected, g0)
    _check_residual(ex, where, idx, new_res, corrected, n)


def _unpacked(ex, where, got):
    """The returned (indices, values, new_residual) as arrays; fails on anything but a 3-tuple."""
    if not isinstance(got, tuple) or len(got) != 3:
        fail(ex, f"{where}: expected a tuple (indices, values, new_residual), got {type(got).__name__}")
    return (np.asarray(a) for a in got)


def _check_indices(ex, where, idx, values, n, k) -> None:
    """k indices and k values, the indices k different integers in 0..n-1."""
    if idx.shape != (k,) or values.shape != (k,):
        fail(ex, f"{where}: sent {idx.shape} indices and {values.shape} values, expected {k} of each",
              "k is ratio * n rounded up: at least one entry, never more than n")
    if idx.dtype.kind not in "iu" or len(set(idx.tolist())) != k or idx.min() < 0 or idx.max() >= n:
        fail(ex, f"{where}: the indices must be {k} different integers in 0..{n - 1}, got {idx[:8]}")


def _check_largest(ex, where, idx, corrected, g0, n, k) -> None:
    """The sent entries are the k largest in magnitude of g + residual; the hint names the likely mix-up."""
    kth = np.sort(np.abs(corrected))[n - k]
    if np.abs(corrected[idx]).min() < kth * (1 - 1e-6):
        plain = np.sort(np.argpartition(g0, n - k)[n - k:])
        if np.array_equal(np.sort(idx), plain) or np.array_equal(np.sort(idx), np.sort(np.argsort(corrected)[n - k:])):
            hint = "choose by magnitude: large negative entries matter as much as large positive ones"
        elif np.abs(g0[idx]).min() >= np.sort(np.abs(g0))[n - k] * (1 - 1e-6):
            hint = "choose from g + residual, not from g alone: the residual is what earlier steps did not send"
        else:
            hint = "send the k entries of g + residual with the largest magnitudes (your my_topk finds them)"
        fail(ex, f"{where}: the sent entries are not the {k} largest in magnitude of g + residual", hint)


def _check_values(ex, where, idx, values, corrected, g0) -> None:
    """The values sent are those of g + residual at the indices."""
    if not np.allclose(values, corrected[idx], rtol=1e-6):
        hint = ("send the values of g + residual, not of g" if np.allclose(values, g0[idx]) else
                "values[i] must be corrected[indices[i]]")
        fail(ex, f"{where}: the values sent are not those of g + residual at the indices", hint)


def _check_residual(ex, where, idx, new_res, corrected, n) -> None:
    """The new residual is g + residual with the sent entries set to 0."""
    want_res = corrected.copy()
    want_res[idx] = 0
    if np.shape(new_res) != (n,) or not np.allclose(new_res, want_res, rtol=1e-6, atol=1e-7):
        if np.shape(new_res) != (n,):
            hint = f"the residual has the shape of g, ({n},)"
        elif np.allclose(new_res, np.zeros(n)):
            hint = ("the residual is not carried to the next step: it must keep what was NOT sent, g + residual with "
                    "the sent entries set to 0")
        else:
            hint = "the residual keeps what was NOT sent: g + residual with the sent entries set to 0"
        fail(ex, f"{where}: wrong new residual", hint)


def _many_steps(ex, fn, rng) -> None:
    """Many steps: sent + left over = everything (error feedback loses nothing)."""
    n, residual, sent, total = 200, np.zeros(200), np.zeros(200), np.zeros(200)
    for _ in range(30):
        g = rng.standard_normal(n)
        idx, values, residual = (np.asarray(a) for a in call(ex, fn, g, residual, 0.05))
        np.add.at(sent, idx, values)
        total += g
    if not np.allclose(sent + residual, total):
        fail(ex, "after 30 steps, what was sent plus the residual is not the sum of the gradients",
              "return the new residual and pass it back in at the next step")


# ---- the compressed allreduce (MPI) --------------------------------------------------------------------------------

# (n, ratio, dtype) of the cases on every number of ranks, in order: the first tells the most mistakes apart
_ALLREDUCE_CASES = ((50, 0.1, np.float64), (10, 0.3, np.float32), (1, 0.5, np.float64), (7, 0.01, np.float32),
                    (997, 0.01, np.float32), (333, 0.05, np.float64), (64, 1.0, np.float32))


def _allreduce_inputs(k: int, case: int, j: int, n: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Rank j's (g, residual) in one case on k ranks (every rank can draw every rank's). Every rank's g has a large
    entry at the same index, so that the ranks' pieces share it."""
    rng = np.random.default_rng(capture.seed(400 + 100 * k + 10 * case + j))
    g = rng.standard_normal(n) * rng.choice([1, 10], n)
    g[n // 3] = 60.0 * (1 + j)
    residual = rng.standard_normal(n) * 0.5
    return g.astype(dtype), residual.astype(dtype)


@recorded
def compressed_allreduce(fn, comm=None, timeout: float = 20.0) -> None:
    """Exercise (lab 10): ``fn(comm, g, residual, ratio) -> (mean, new_residual)`` on every rank (``%%px``).

    Every rank takes top-k with error feedback of its own flat ``g`` (k = ceil(ratio * n), at least 1), the ranks
    exchange their pieces, and ``mean`` is the dense mean over the ranks of every rank's piece, the same on every rank,
    in g's dtype; ``new_residual`` is this rank's. Checked on 1..p ranks, n from 1 to 997 (997 a prime), ratios 0.01
    to 1 (k = 1 and k = n among them), float32 and float64, every rank's pieces sharing an index: the mean and the
    residual match NumPy's to 1e-5 relative (1e-9 in float64), and g and residual are left unchanged.
    """
    from mpi4py import MPI

    comm = comm or MPI.COMM_WORLD
    ex = "compressed allreduce"
    fn = on_given_comm(capture.student(fn, ex=ex), ex)

    def run(sub, k):
        for case, (n, ratio, dtype) in enumerate(_ALLREDUCE_CASES):
            yield lambda case=case, n=n, ratio=ratio, dtype=dtype: _allreduce_case(fn, sub, k, case, n, ratio, dtype,
                                                                                    timeout, ex)

    collective_check(comm, ex, run)


def _allreduce_case(fn, sub, k, case, n, ratio, dtype, timeout, ex) -> str | None:
    """One case on one sub-communicator; returns what went wrong (or None), never raises."""
    from ..traffic import TrafficComm

    r = sub.Get_rank()
    where = f"{k} rank{'s' if k > 1 else ''}, n={n}, ratio={ratio}, {np.dtype(dtype)}, rank {r}"
    inputs = [_allreduce_inputs(k, case, j, n, dtype) for j in range(k)]
    pieces = [top_k_with_feedback(g, res, ratio) for g, res in inputs]
    g, residual = (a.copy() for a in inputs[r])
    work = sub.Dup()  # the student's messages stay apart from the check's own, even if some are abandoned
    try:
        got, error = fn(TrafficComm(work, timeout=timeout), g, residual, ratio), None
    except Exception as e:  # noqa: BLE001 - the student's code: say what it raised, on which input
        got, error = None, _allreduce_raised(e, where, ex)
    if error is None:
        error = _allreduce_error(got, g, residual, inputs, pieces, k, r, n, ratio, where, ex)
    if error:
        return error  # work is not freed: a rank may have abandoned an operation on it
    work.Free()
    return None


def _allreduce_raised(e: Exception, where: str, ex: str) -> str:
    """What a student's function that raised is told."""
    from mpi4py import MPI

    if isinstance(e, NotImplementedError):
        return not_written(ex)
    if isinstance(e, (ExerciseError, capture.NotRecorded)):
        return f"{e} ({where})"
    if isinstance(e, TimeoutError):  # named as such: a rank that failed comes first (collectives.first_cause)
        return (f"{ex} ({where}): your function raised TimeoutError: {e}\nHint: every rank must call the same "
                "collectives, in the same order, with pieces of the same length")
    if isinstance(e, MPI.Exception):
        return (f"{ex} ({where}): MPI reported an error: {e.Get_error_string()}\nHint: an Allgather's receive buffer "
                "holds p times what each rank sends, in the same dtype")
    hint = ""
    if isinstance(e, IndexError) and "integer" in str(e):
        hint = ("\nHint: the indices you add at are not integers. An Allgather copies bytes, it does not convert them: "
                "receive int64 indices into an int64 buffer, not one of g's dtype")
    elif isinstance(e, NameError):
        hint = ("\nHint: the engines do not know that name: a function written in a plain cell reaches them only once "
                "pushed (the cell before the exercise pushes yours)")
    elif isinstance(e, TypeError) and "'NoneType' object is not callable" in str(e):
        hint = ("\nHint: a function you call is None on the engines: is my_topk_feedback written, and the cell that "
                "pushes it run?")
    return f"{ex} ({where}): your function raised {type(e).__name__}: {e}{hint}"


def _allreduce_error(got, g, residual, inputs, pieces, k, r, n, ratio, where, ex) -> str | None:
    """What is wrong with the returned (mean, new_residual), or with g and residual afterwards, or None."""
    g0, r0 = inputs[r]
    if not isinstance(got, tuple) or len(got) != 2:
        return (f"{ex} ({where}): expected a tuple (mean, new_residual), got {type(got).__name__}"
                + (f" of length {len(got)}" if isinstance(got, tuple) else "")
                + "\nHint: end with `return mean, new_residual`")
    if not np.array_equal(g, g0):
        return f"{ex} ({where}): g was modified\nHint: my_topk_feedback works on g + residual, a new array"
    if not np.array_equal(residual, r0):
        return f"{ex} ({where}): the residual passed in was modified\nHint: return the new residual instead"
    mean, new_res = got
    dtype = g0.dtype
    want = np.zeros(n)
    for idx, values, _ in pieces:
        np.add.at(want, idx, values.astype(np.float64))
    want /= k
    error = _mean_error(mean, want, dtype, inputs, pieces, k, r, n, ratio, where, ex)
    return error or _new_residual_error(new_res, pieces[r][2], g0, r0, n, where, ex)


def _close(a, b, dtype) -> bool:
    tol = 1e-5 if dtype == np.float32 else 1e-9
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=tol, atol=tol * max(1.0, float(np.abs(b).max(initial=0)))))


def _mean_error(mean, want, dtype, inputs, pieces, k, r, n, ratio, where, ex) -> str | None:
    """What is wrong with the mean (its type, shape, dtype, values), the mistake named where it is recognised."""
    try:
        a = np.asarray(mean)
    except (TypeError, ValueError):
        a = np.asarray(None)
    if a.shape != (n,) or a.dtype.kind not in "fiu":
        return (f"{ex} ({where}): expected the mean as a dense array of {n} entries, got {type(mean).__name__}"
                + (f" of shape {a.shape}" if a.ndim else "") + "\nHint: the mean has an entry for every position of "
                "g, 0 where no rank sent anything")
    if a.dtype != dtype:
        return (f"{ex} ({where}): the mean is {a.dtype}, g is {np.dtype(dtype)}\nHint: add up in zeros of g's dtype: "
                "the gradient keeps its precision")
    x = a.astype(np.float64)
    if _close(x, want, dtype):
        return None
    mine = np.zeros(n)
    mine[pieces[r][0]] = pieces[r][1]
    overwritten = np.zeros(n)
    for idx, values, _ in pieces:
        overwritten[idx] = values
    alone = np.zeros(n)
    for g, _ in inputs:
        idx, values, _ = top_k_with_feedback(g, np.zeros_like(g), ratio)
        np.add.at(alone, idx, values.astype(np.float64))
    named = [
        (want * k, "that is the sum over the ranks, not the mean\nHint: divide the sum by the number of ranks, "
                   "comm.Get_size()"),
        (mine, "that is this rank's own piece alone: the other ranks' pieces never arrived\nHint: exchange the pieces "
               "with comm.Allgather, so that every rank holds all p of them"),
        (mine / k, "that is this rank's own piece alone, divided by p: the other ranks' pieces never arrived\nHint: "
                   "exchange the pieces with comm.Allgather, so that every rank holds all p of them"),
        (overwritten / k, "where several ranks sent the same index, only one value counted\nHint: total[idx] = v "
                          "overwrites, and total[idx] += v adds once for an index repeated in idx: np.add.at adds every one"),
        (overwritten, "where several ranks sent the same index, only one value counted, and the sum is not divided by "
                      "p\nHint: np.add.at adds every value at a repeated index; then divide by comm.Get_size()"),
        (alone / k, "the pieces were chosen from g alone, without the residual\nHint: pass this rank's residual to "
                    "my_topk_feedback: it chooses from g + residual"),
    ]
    for wrong, why in named:
        if not _close(wrong, want, dtype) and _close(x, wrong, dtype):
            return f"{ex} ({where}): {why}"
    garbled = _garbled(x, float(np.abs(want).max(initial=0)))
    if garbled:
        return (f"{ex} ({where}): the mean holds {garbled}, values no gradient here has: the values came back garbled"
                "\nHint: an Allgather copies bytes, it does not convert them: receive the values into a buffer of their "
                "own dtype, g's")
    if math.isclose(float(x.sum()), float(want.sum()), rel_tol=1e-4, abs_tol=1e-4 * float(np.abs(want).sum())):
        return (f"{ex} ({where}): the right values arrived, but at the wrong entries: the indices did not survive the "
                "exchange\nHint: an Allgather copies bytes, it does not convert them: receive int64 indices into an "
                "int64 buffer, not one of g's dtype (which reads them as tiny floats, 0 once rounded)")
    i = int(np.argmax(np.abs(x - want)))
    return (f"{ex} ({where}): entry {i} of the mean is {x[i]:.6g}, expected {want[i]:.6g}\nHint: every rank's piece "
            "is its top-k of g + residual (your my_topk_feedback); the mean adds all p pieces and divides by p")


def _garbled(x: np.ndarray, scale: float) -> str:
    """What in the mean ``x`` no mean of these gradients holds (entries of at most ``scale``), or ""."""
    if not np.isfinite(x).all():
        return "NaN or inf"
    if np.abs(x).max() > 1e3 * max(scale, 1e-30):
        return f"entries up to {np.abs(x).max():.3g}"
    tiny = (x != 0) & (np.abs(x) < 1e-30)
    return f"tiny non-zero entries such as {x[tiny][0]:.3g}" if tiny.any() else ""


def _new_residual_error(new_res, want, g0, r0, n, where, ex) -> str | None:
    """What is wrong with this rank's new residual, the mistake named where it is recognised."""
    try:
        a = np.asarray(new_res, dtype=np.float64)
    except (TypeError, ValueError):
        a = None
    if a is None or a.shape != (n,):
        return (f"{ex} ({where}): expected the new residual as an array of {n} entries, got {type(new_res).__name__}"
                + ("" if a is None or not a.ndim else f" of shape {a.shape}")
                + "\nHint: return the residual my_topk_feedback gave this rank")
    if _close(a, want, g0.dtype):
        return None
    if _close(a, r0.astype(np.float64), g0.dtype):
        why = ("the residual came back as it was passed in: it was not updated\nHint: return the new residual "
               "my_topk_feedback gave, what this step did not send")
    elif not a.any():
        why = ("the new residual is all zeros: what was not sent is dropped\nHint: return the new residual "
               "my_topk_feedback gave, what this step did not send")
    elif _close(a, g0.astype(np.float64) + r0, g0.dtype):
        why = "the new residual still holds the entries sent\nHint: return the new residual my_topk_feedback gave"
    else:
        why = "wrong new residual\nHint: return the new residual my_topk_feedback gave, what this step did not send"
    return f"{ex} ({where}): {why}"


# ---- the bytes on each cable ---------------------------------------------------------------------------------------

def _bytes_cases() -> list[tuple[str, int, int, int]]:
    """(what, n, k, p) of the cases, in the order they are checked; the last drawn afresh when a notebook is graded."""
    cases = [("lab 10's gradient on 2 ranks", 79_510, 796, 2), ("lab 10's gradient on 4 ranks", 79_510, 796, 4),
             ("one rank", 79_510, 796, 1), ("n not divisible by p", 1_001, 11, 3),
             ("k = n, top-k of everything", 500, 500, 4)]
    rng = np.random.default_rng(capture.seed(129))
    n = int(rng.integers(1_000, 100_000_000))
    cases.append(("drawn at random", n, int(rng.integers(1, n // 20 + 1)), int(rng.integers(2, 65))))
    return cases


def _bytes(ex: str, where: str, v, name: str) -> float:
    return one_number(ex, where, v, f"{name} should be one number of bytes", "return two plain numbers, (dense, topk)",
                      not_finite="a division by zero? try your function by hand on p = 1")


def _close_bytes(a, b) -> bool:
    """Equal to within a byte (an integer division of the whole count may round it down), or to 1e-9 relative."""
    return bool(np.allclose(a, b, rtol=1e-9, atol=1.0))


# the mistakes the check names, as functions of (n, k, p), with what it says
_DENSE_MISTAKES = (
    (lambda n, k, p: 2 * (p - 1) * 4 * n,
     "every message of yours carries the whole gradient: each of the ring's messages carries one block, a p-th of it"),
    (lambda n, k, p: (p - 1) / p * 4 * n,
     "that is half the ring, the reduce-scatter alone: then the allgather sends the summed blocks round, as many "
     "messages again"),
    (lambda n, k, p: 2 * (p - 1) / p * 8 * n,
     "a float32 entry is 4 bytes. The dense ring sends no indices: a block's entries travel in their order, so the "
     "receiver knows where each goes"),
    (lambda n, k, p: 2 * (p - 1) * (n // p) * 4,
     "n // p rounds the block down; the model keeps n / p, exact (the ring's blocks then differ by one entry)"),
)
_TOPK_MISTAKES = (
    (lambda n, k, p: (p - 1) * 4 * k,
     "you counted only the values: each entry travels as an int32 index and a float32 value, or the receiver cannot "
     "tell where it goes"),
    (lambda n, k, p: p * 8 * k,
     "you counted this rank's own piece as received: it never crosses the cable, only the other p - 1 pieces do"),
    (lambda n, k, p: 8 * k,
     "that is one piece, as if sent once to one neighbour: the allgather brings each rank every other rank's piece"),
)


@recorded
def bytes_per_step(fn) -> None:
    """Exercise (lab 10): ``fn(n, k, p) -> (dense, topk)``, the bytes one rank's cable carries into the rank in one
    step, for a float32 gradient of n entries on p ranks: labkit's ring allreduce (2(p - 1) messages of n / p entries),
    and top-k of k entries per rank exchanged by two allgathers (int32 indices, float32 values), the counts left out.

    Checked against :func:`labkit.compression.bytes_per_step`, to within a byte, on 6 cases: lab 10's gradient (n =
    79,510, k = 796) on 2 and 4 ranks, one rank, n not divisible by p, k = n, and one drawn afresh when graded.
    """
    ex = "bytes per step"
    cases = _bytes_cases()
    fn = capture.student(fn, ex=ex)
    rows = []
    for what, n, k, p in each_case(cases, more=2):  # and then the dense ring's bytes and topk's, each in every case
        where = f"{what}, n = {n:,}, k = {k:,}, p = {p}"
        dense, topk = _pair(ex, where, call(ex, fn, n, k, p, where=where,
                                             hint="try your function by hand on n = 100, k = 1, p = 2"), "(dense, topk)")
        rows.append((where, (_bytes(ex, where, dense, "dense"), _bytes(ex, where, topk, "topk")), model(n, k, p)))
    got = np.array([r[1] for r in rows])
    want = np.array([r[2] for r in rows])
    if not _close_bytes(got, want) and _close_bytes(got[:, ::-1], want):
        fail(ex, f"{rows[0][0]}: your pair is (topk, dense)", "return the dense ring's bytes first: (dense, topk)")
    for i, (part, mistakes) in enumerate(each_case((("dense", _DENSE_MISTAKES), ("topk", _TOPK_MISTAKES)))):
        _bytes_part(ex, part, mistakes, cases, rows, got[:, i], want[:, i])
    passed(ex, len(cases))


def _bytes_part(ex, part, mistakes, cases, rows, got, want) -> None:
    """Fail on the first case where the student's ``part`` differs, naming the mistake if every case of p > 1 shows it."""
    if _close_bytes(got, want):
        return
    i = next(j for j in range(len(got)) if not _close_bytes(got[j], want[j]))
    many = np.array([p > 1 for *_, p in cases])
    if _close_bytes(got[many], want[many]):
        hint = "on one rank there is no one to send to, and no cable: both are 0 at p = 1"
    else:
        hint = ("count it message by message: how many reach a rank, and how many entries, of how many bytes, each "
                "carries" if part == "dense" else
                "count it piece by piece: how many pieces reach a rank, and how many bytes each one is")
        for wrong, why in mistakes:
            bad = np.array([wrong(n, k, p) for _, n, k, p in cases], dtype=float)
            if not _close_bytes(bad[many], want[many]) and _close_bytes(got[many], bad[many]):
                hint = why
                break
    fail(ex, f"{rows[i][0]}: your {part} is {got[i]:,.1f} bytes, expected {want[i]:,.1f}", hint)


EXERCISES = (
    Exercise("int8_quantise", "10", references=(
        "labkit.compression:int8_nearest", "labkit.compression:to_int8"), hints=(
        "The receiver gets only q and scale, and rebuilds each entry as q * scale. Read that backwards: what is q, "
        "given an entry of g and the scale?",
        "q must stay within -127..127. Which entry of g decides how large the scale has to be? Mind the sign: a "
        "large negative entry needs room too.",
        "Make that one entry land exactly on +-127: solve for the scale. np.abs(g).max() is its size. A larger "
        "scale would fit as well, but its steps are coarser than they need to be.",
        "Round to the nearest step (np.rint) before converting to int8: .astype(np.int8) alone cuts 3.9 down to 3.",
        "An all-zero gradient has largest magnitude 0: dividing by a scale of 0 gives NaN. Any positive scale "
        "works there; q is all zeros.",
    )),
    Exercise("topk_select", "10", references=(
        "labkit.compression:top_k_indices", "labkit.compression:top_k"), hints=(
        "Rank the entries by size whatever their sign: np.abs(g) gives the magnitudes.",
        "np.argsort(a) gives the positions of a from smallest to largest; np.argpartition(a, m) only splits them "
        "at position m, which is faster. Either way, the largest come last.",
        "Take the last k positions. Try k = 0 by hand: x[-0:] is all of x, because -0 is 0. Slice from n - k "
        "instead, or handle k = 0 on its own.",
        "k may be larger than n (a small layer): clip it to n first. The values are g at your indices, sign "
        "and all.",
    )),
    Exercise("sparse_sum", "10", references=(
        "labkit.compression:sparse_sum", "labkit.compression:sparse_allreduce"), hints=(
        "Start from n zeros in the dtype of the values: the entries nobody sent stay 0.",
        "Within one piece the indices are all different, but two pieces may hold the same index: both values "
        "must count.",
        "out[idx] = v overwrites what an earlier piece put there. And try out[idx] += v by hand with idx = [1, 1]: "
        "NumPy adds only once for a repeated index. Add one piece at a time, or look up np.add.at.",
    )),
    Exercise("topk_feedback", "10", references=(
        "labkit.compression:top_k", "labkit.compression:ErrorFeedback", "labkit.compression:_SparsifyWithResidual",
        "labkit.compression:top_k_with_feedback", "labkit.compression:top_k_indices"), hints=(
        "Before choosing, add back what earlier steps did not send: work on g + residual, a new array, and leave "
        "both inputs as they are.",
        "k is the fraction ratio of the n entries, rounded up (math.ceil), at least 1 and at most n.",
        "Choose the k entries of the corrected gradient with your my_topk; send the corrected gradient's values "
        "there, not g's.",
        "The new residual is what did not go out this step: a copy of the corrected gradient with the sent "
        "entries set to 0. It comes back as `residual` at the next step.",
    )),
    Exercise("compressed_allreduce", "10", mpi=True, references=(
        "labkit.compression:sparse_allreduce", "labkit.compression:CompressedAllreduce"), hints=(
        "Each rank first runs your my_topk_feedback on its own g and residual. Every rank has the same n and ratio, "
        "so every rank's piece has the same number of entries, k.",
        "With pieces of one length, comm.Allgather(send, recv) exchanges them: recv holds the p pieces one after the "
        "other, p * k entries. Exchange the indices and the values in two calls.",
        "An Allgather copies bytes and does not convert them: each receive buffer needs the dtype of what is sent. "
        "Send the indices as int64 into an int64 buffer, the values into a buffer of g's dtype.",
        "Add every value into n zeros of g's dtype; two ranks may send the same index, and both count. Divide by "
        "the number of ranks for the mean, and return this rank's new residual with it.",
    )),
    Exercise("bytes_per_step", "10", references=("labkit.compression:bytes_per_step",), hints=(
        "Count bytes in what crosses the cable into one rank. A float32 value is 4 bytes, an int32 index 4 more. "
        "Which of the two methods must send indices with its values, and why does the other not need them?",
        "The dense ring (lab 07) is a reduce-scatter, then an allgather, each of p - 1 steps. In each step a rank "
        "receives one block from its neighbour. Into how many blocks is the gradient cut, so how many entries are in "
        "one? Keep that division exact.",
        "Top-k: each rank's piece is its k indices and k values. An allgather brings every rank the piece of every "
        "rank: one of those pieces it already had, and that one never crosses its cable.",
        "On one rank nothing travels: both counts are 0 at p = 1. Return the pair with the dense ring first: "
        "(dense, topk).",
    )),
)
