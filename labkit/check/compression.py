"""Check of lab 10: top-k sparsification with error feedback."""

from __future__ import annotations

import math

import numpy as np

from . import capture
from .common import call, fail, passed, recorded
from .exercises import Exercise

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
    for n, ratio, dtype in _CASES:
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
              "k = max(1, ceil(ratio * n)): at least one entry, never more than n")
    if idx.dtype.kind not in "iu" or len(set(idx.tolist())) != k or idx.min() < 0 or idx.max() >= n:
        fail(ex, f"{where}: the indices must be {k} different integers in 0..{n - 1}, got {idx[:8]}")


def _check_largest(ex, where, idx, corrected, g0, n, k) -> None:
    """The sent entries are the k largest in magnitude of g + residual; the hint names the likely mix-up."""
    kth = np.sort(np.abs(corrected))[n - k]
    if np.abs(corrected[idx]).min() < kth * (1 - 1e-6):
        plain = np.sort(np.argpartition(g0, n - k)[n - k:])
        if np.array_equal(np.sort(idx), plain) or np.array_equal(np.sort(idx), np.sort(np.argsort(corrected)[n - k:])):
            hint = "choose by magnitude, np.abs(...): large negative entries matter as much as large positive ones"
        elif np.abs(g0[idx]).min() >= np.sort(np.abs(g0))[n - k] * (1 - 1e-6):
            hint = "choose from g + residual, not from g alone: the residual is what earlier steps did not send"
        else:
            hint = "np.argpartition(np.abs(corrected), n - k)[n - k:] gives the k largest magnitudes"
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
        hint = ("the residual keeps what was NOT sent: g + residual with the sent entries set to 0"
                if np.shape(new_res) == (n,) else f"the residual has the shape of g, ({n},)")
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


EXERCISES = (
    Exercise("topk_feedback", "10", "compression", references=(
        "labkit.compression:top_k", "labkit.compression:ErrorFeedback", "labkit.compression:_SparsifyWithResidual")),
)
