"""Checks of labs 01-02.

Lab 01 builds the vectorised backward pass in three steps: the output layer's error (:func:`output_error`), one
layer's backward pass (:func:`layer_backward`), and the whole of backprop (:func:`backprop`); then a check of any
gradient from the cost alone, by central differences (:func:`numerical_gradient`). Lab 02 splits a batch
over workers (:func:`split_batch`), sums per-sample gradients into a per-thread accumulator (:func:`accumulate`) and
combines the workers' mean gradients into the batch's (:func:`combine_shards`), then puts the first two together
into a step on threads of its own (:func:`threaded_step`).

Each check runs the student's function on several sizes and edge cases drawn afresh when graded
(:func:`capture.seed`), compares with labkit's own at the tolerance its lab states, and names the typical mistakes.
"""

from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import mlp
from ..shards import shard_bounds
from . import capture
from .common import ExerciseError, call, compare_grads, each_case, fail, one_number, passed, problems, recorded
from .exercises import Exercise

RTOL, ATOL = 1e-9, 1e-12  # float64 throughout: only rounding separates a right answer from labkit's


def _array(ex: str, where: str, name: str, got) -> np.ndarray:
    try:
        a = np.asarray(got, dtype=float)
    except (TypeError, ValueError):
        fail(ex, f"{where}: {name} should be a NumPy array, got {type(got).__name__}",
              "compute it with NumPy on the whole arrays")
    return a


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.allclose(a, b, rtol=RTOL, atol=ATOL)


def _compare(ex: str, where: str, name: str, got, want: np.ndarray, mistakes, shape_hint: str = "") -> None:
    """``got`` must equal ``want`` to RTOL; where it equals one of ``mistakes`` ((array, why) pairs), that mistake is
    named, its why the hint; a wrong shape gets ``shape_hint``; anything else shows both, and the exercise's next step."""
    a = _array(ex, where, name, got)
    if _same(a, want):
        return
    if np.isnan(a).any() and not np.isnan(want).any():
        fail(ex, f"{where}: {name} holds NaN")
    for wrong, why in mistakes:
        if wrong is not None and _same(a, np.asarray(wrong, dtype=float)):
            fail(ex, f"{where}: {name} is wrong", why)
    if a.shape != want.shape:
        fail(ex, f"{where}: {name} has shape {a.shape}, expected {want.shape}", shape_hint)
    err = float(np.nanmax(np.abs(a - want)))
    fail(ex, f"{where}: {name} differs from labkit's by up to {err:.3g}\n"
              f"  yours, first values:    {np.array2string(a.ravel()[:4], precision=5)}\n"
              f"  expected, first values: {np.array2string(want.ravel()[:4], precision=5)}")


def _unchanged(ex: str, where: str, before, after, what: str) -> None:
    for b, a in zip(before, after):
        if not np.array_equal(b, a, equal_nan=True):
            fail(ex, f"{where}: your function changed {what}", "compute into new arrays; leave the inputs as they were")


# ---- lab 01 ---------------------------------------------------------------------------------------------------------

@recorded
def output_error(fn) -> None:
    """Exercise (lab 01): ``fn(A, Y) -> delta``, the output layer's error dC/dz of every row (sigmoid outputs A of
    shape (B, n_out), one-hot Y, quadratic cost), one row per sample and not divided by B."""
    ex = "output error"
    fn = capture.student(fn, ex=ex)
    rng = np.random.default_rng(capture.seed(10))
    cases = []
    for batch, n_out in ((1, 3), (8, 10), (13, 5)):
        cases.append((rng.uniform(0.02, 0.98, (batch, n_out)), rng.integers(0, n_out, batch)))
    # saturated outputs, near 0 and 1, right and wrong: sigma' is tiny there
    cases.append((np.array([[1e-6, 0.5, 1 - 1e-6], [0.999, 0.001, 0.3], [0.02, 0.97, 0.5]]), np.array([0, 1, 1])))
    for a, labels in each_case(cases):
        Y = mlp.targets(labels, a.shape[1], np.float64)
        batch, n_out = a.shape
        where = f"batch of {batch}, {n_out} outputs"
        a0, Y0 = a.copy(), Y.copy()
        got = call(ex, fn, a, Y)
        _unchanged(ex, where, (a0, Y0), (a, Y), "A or Y")
        want = mlp.output_error(a, Y)
        prime = a * (1 - a)
        s = 0.5 * (np.tanh(0.5 * a) + 1)  # sigma applied to a again
        _compare(ex, where, "delta", got, want, [
            (a - Y, "the factor sigma'(z) is missing: a - y is dC/da; you need dC/dz, and a depends on z"),
            ((Y - a) * prime, "the sign is flipped: the derivative of (a - y)^2 / 2 with respect to a is a - y"),
            ((a - Y) * s * (1 - s), "you applied sigma to a again: a is sigma(z) already, so sigma'(z) is "
                                    "written with a itself"),
            ((a - Y) * a, "sigma'(z) is not a alone"),
            ((a - Y) * (1 - a), "sigma'(z) is not (1 - a) alone"),
            (want / batch if batch > 1 else None, "you divided by the batch size: each row is one sample's error; "
                                                  "the 1/B of the mean comes in the backprop exercise"),
            (want.T, "it is transposed: one row per sample, shape (B, n_out)"),
        ], "one row per sample: (B, n_out), as A")
    passed(ex, len(cases))


@recorded
def layer_backward(fn) -> None:
    """Exercise (lab 01): ``fn(delta, A_in, W) -> (dW, db, dA_in)``, one layer's backward pass for a batch: the layer
    computes Z = A_in W^T + b; delta = dC/dZ (B, n_out) with any 1/B already inside."""
    ex = "one layer's backward pass"
    fn = capture.student(fn, ex=ex)
    rng = np.random.default_rng(capture.seed(11))
    shapes = [(5, 5, 4), (4, 3, 1), (3, 9, 2), (7, 6, 13)]  # (n_in, n_out, B); square first: a transpose fits there
    shapes.append((int(rng.integers(2, 12)), int(rng.integers(2, 12)), int(rng.integers(2, 20))))
    for n_in, n_out, batch in each_case(shapes):
        delta = rng.standard_normal((batch, n_out)) * 0.1
        a_in = rng.uniform(0.05, 0.95, (batch, n_in))
        W = rng.standard_normal((n_out, n_in))
        where = f"layer {n_in} -> {n_out}, batch of {batch}"
        before = [delta.copy(), a_in.copy(), W.copy()]
        got = call(ex, fn, delta, a_in, W)
        _unchanged(ex, where, before, (delta, a_in, W), "delta, A_in or W")
        if not isinstance(got, (list, tuple)) or len(got) != 3:
            fail(ex, f"{where}: expected three arrays (dW, db, dA_in), got {type(got).__name__}"
                 + (f" of length {len(got)}" if isinstance(got, (list, tuple)) else ""),
                 "return dW, db, dA_in")
        dW, db, da = mlp.layer_backward(delta, a_in, W)
        _compare(ex, where, "dW", got[0], dW, [
            (dW.T, "dW is transposed: it has W's shape (n_out, n_in), one row per output"),
            (dW / batch if batch > 1 else None, "dW is the mean over the batch, not the sum: the 1/B of the mean "
                                                "cost is already inside delta"),
        ], "dW has W's shape (n_out, n_in)")
        _compare(ex, where, "db", got[1], db, [
            (delta, "db is not summed over the batch: add up delta's rows, one entry per output"),
            (db / batch if batch > 1 else None, "db is the mean over the batch, not the sum: the 1/B is already "
                                                "inside delta"),
            (delta.sum(axis=1), "db is summed over the wrong axis: add up the rows (the samples), keep the outputs"),
        ], "db has b's shape (n_out,)")
        _compare(ex, where, "dA_in", got[2], da, [
            (delta @ W.T if n_in == n_out else None, "dA_in went through W transposed: z_j depends on a_i through "
                                                      "W[j, i], so sum delta_j W[j, i] over the outputs j"),
            (da * a_in * (1 - a_in), "you multiplied by sigma' of A_in: that factor belongs to the layer below, "
                                     "which knows its own activation; return dC/dA_in"),
            (da / batch if batch > 1 else None, "dA_in is divided by the batch size: every sample keeps its own row"),
        ], "dA_in has A_in's shape (B, n_in)")
    passed(ex, len(shapes))


def _variant(params, x, Y, output_prime=True, hidden_prime=True, transposed_back=False):
    """Vectorised backprop (sigmoid, quadratic) with one of the typical mistakes, to name it when a student's matches."""
    acts = [x]
    for W, b in params:
        acts.append(mlp.sigmoid(acts[-1] @ W.T + b))
    out = acts[-1]
    delta = (out - Y) * (out * (1 - out) if output_prime else 1) / x.shape[0]
    grads = [None] * len(params)
    for i in range(len(params) - 1, -1, -1):
        grads[i] = (delta.T @ acts[i], delta.sum(axis=0))
        if i:
            W = params[i][0]
            back = delta @ (W.T if transposed_back else W)
            delta = back * (acts[i] * (1 - acts[i]) if hidden_prime else 1)
    return grads


def _matches(got, want) -> bool:
    try:
        return len(got) == len(want) and all(_same(np.asarray(g, dtype=float), w)
                                             for gp, wp in zip(got, want) for g, w in zip(gp, wp))
    except (TypeError, ValueError):
        return False


def _backprop_problems(seed: int):
    """Square layers first (a transposed W fits there, so the mistake can be named), then [5, 4, 3] at batches 1 and
    8 and [7, 6, 5, 3] at 13, then a network without a hidden layer."""
    rng = np.random.default_rng(seed + 100)
    extra = []
    for sizes, batch in (([5, 5, 5], 6), ([6, 4], 5)):
        params = mlp.init_params(sizes, seed=int(rng.integers(1000)), dtype=np.float64)
        extra.append((params, rng.random((batch, sizes[0])),
                      mlp.targets(rng.integers(0, sizes[-1], batch), sizes[-1], np.float64)))
    yield extra[0]
    yield from problems(seed)
    yield extra[1]


@recorded
def backprop(fn) -> None:
    """Exercise (lab 01): ``fn(params, x, Y) -> grads``, vectorised backprop, sigmoid and quadratic cost."""
    ex = "vectorised backprop"
    fn = capture.student(fn, ex=ex)
    n = 0
    for k, (params, x, Y) in enumerate(each_case(_backprop_problems(capture.seed(0)))):
        before = [(W.copy(), b.copy()) for W, b in params]
        got = call(ex, fn, params, x, Y)
        if any(not np.array_equal(W, W0) or not np.array_equal(b, b0) for (W, b), (W0, b0) in zip(params, before)):
            fail(ex, f"problem {k + 1}: your function changed params", "compute gradients into new arrays; leave W and b alone")
        want = mlp.backprop(params, x, Y, "sigmoid", "quadratic")
        where = f"problem {k + 1} (sizes {mlp.sizes_of(params)}, batch {x.shape[0]})"
        try:
            compare_grads(ex, got, want, x.shape[0], where)
        except ExerciseError:
            for mistake, why in (
                    ({"output_prime": False}, "the output error lacks sigma'(z): dC/dz, not dC/da"),
                    ({"hidden_prime": False}, "the error sent back to a hidden layer lacks that layer's sigma': "
                                              "multiply dC/dA by sigma' of that layer's output"),
                    ({"transposed_back": True}, "the error went back through W transposed: sum delta_j W[j, i] "
                                                "over the outputs j (your layer_backward's dA_in)")):
                try:
                    wrong = _variant(params, x, Y, **mistake)
                except ValueError:  # W transposed does not fit a layer that is not square
                    continue
                if _matches(got, wrong):
                    fail(ex, f"{where}: {why}")
            if len(params) > 1 and _matches(got, [(gW.T, gb) for gW, gb in want]):
                fail(ex, f"{where}: every dW is transposed: dW has W's shape (n_out, n_in)")
            raise
        n += 1
    passed(ex, n)


def _gradient_cases(seed: int):
    """(name, f, W, exact gradient): a cubic, a sine over a 2-D array, a single entry, a network's cost."""
    rng = np.random.default_rng(seed)
    W = rng.uniform(-1.5, 1.5, 4)
    yield "sum(W**3) / 3 for W of shape (4,)", (lambda W=W: float((W ** 3).sum() / 3)), W, W ** 2
    W, C = rng.uniform(-2, 2, (2, 3)), rng.uniform(0.5, 1.5, (2, 3))
    yield "sum(C * sin(W)) for W of shape (2, 3)", (lambda W=W, C=C: float((C * np.sin(W)).sum())), W, C * np.cos(W)
    W = rng.uniform(-1, 1, (1, 1))
    yield "exp(2 W) for W of shape (1, 1)", (lambda W=W: float(np.exp(2 * W).sum())), W, 2 * np.exp(2 * W)
    params = mlp.init_params([4, 3, 2], seed=int(rng.integers(1000)), dtype=np.float64)
    x, Y = rng.random((5, 4)), mlp.targets(rng.integers(0, 2, 5), 2, np.float64)
    W = params[0][0]
    yield ("the mean cost of a [4, 3, 2] network for its first W (3, 4)", (lambda: mlp.loss(params, x, Y)), W,
           mlp.backprop(params, x, Y)[0][0])


def _one_sided(f, W, eps: float) -> np.ndarray:
    G = np.zeros(W.shape)
    base = float(f())
    for idx in np.ndindex(W.shape):
        old = W[idx]
        W[idx] = old + eps
        G[idx] = (float(f()) - base) / eps
        W[idx] = old
    return G


@recorded
def numerical_gradient(fn) -> None:
    """Exercise (lab 01): ``fn(f, W, eps) -> G``, the gradient of the number ``f()`` with respect to every entry of the
    array ``W`` (which ``f`` reads), from calls of ``f`` alone, accurate to order eps^2; ``W`` restored on return."""
    ex = "numerical gradient"
    fn = capture.student(fn, ex=ex)
    eps = 1e-4
    n = 0
    for name, f, W, exact in each_case(_gradient_cases(capture.seed(12))):
        where = f"f = {name}, eps = {eps:g}"
        before = W.copy()
        got = call(ex, fn, f, W, eps)
        if not np.allclose(W, before, rtol=1e-12, atol=1e-15):
            fail(ex, f"{where}: W was left changed, by up to {np.abs(W - before).max():.3g}: put each entry back "
                      "after its calls of f, or the network would go on with perturbed weights")
        a = _array(ex, where, "your gradient", got)
        if a.shape != W.shape:
            fail(ex, f"{where}: your gradient has shape {a.shape}; it needs W's shape {W.shape}, one entry per "
                      "entry of W")
        if np.allclose(a, exact, rtol=1e-6, atol=1e-7):
            n += 1
            continue
        if not a.any():
            fail(ex, f"{where}: your gradient is all zeros: f() reads W itself, so change W in place (not a copy) "
                      "before each call")
        for wrong, why in ((_one_sided(f, W, eps), "a one-sided difference: its error shrinks only like eps "
                            "(here about 1e-4); step both ways from W so that the first-order errors cancel"),
                           (_one_sided(f, W, -eps), "a one-sided difference (backwards): its error shrinks only like "
                            "eps; step both ways from W"),
                           (2 * exact, "twice too large: the two points you compare are 2 eps apart")):
            if np.allclose(a, wrong, rtol=1e-6, atol=1e-9):
                fail(ex, f"{where}: {why}")
        err = float(np.abs(a - exact).max())
        fail(ex, f"{where}: your gradient differs from the exact one by up to {err:.3g} (allowed: 1e-7 plus 1e-6 "
                  f"relative)\n  yours, first values:    {np.array2string(a.ravel()[:4], precision=6)}\n"
                  f"  expected, first values: {np.array2string(exact.ravel()[:4], precision=6)}")
    passed(ex, n)


# ---- lab 02 ---------------------------------------------------------------------------------------------------------

def _pairs(ex: str, where: str, got, k: int) -> list[tuple[int, int]]:
    try:
        pairs = [(a, b) for a, b in got]
    except (TypeError, ValueError):
        fail(ex, f"{where}: expected a list of {k} (start, stop) pairs, got {type(got).__name__}",
              "return [(start, stop), ...], one pair per shard")
    for pair in pairs:
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in pair):
            fail(ex, f"{where}: the pair {pair} holds {', '.join(type(v).__name__ for v in pair)}: bounds are whole "
                      "numbers, as x[start:stop] needs (n / k is a float; n // k and n % k are ints)")
    return [(int(a), int(b)) for a, b in pairs]


def _named_split_mistake(n: int, k: int, pairs: list[tuple[int, int]]) -> str:
    """What is wrong with ``pairs`` as k contiguous shards of range(n), longer ones first."""
    base, extra = divmod(n, k)
    if len(pairs) != k:
        nonempty = sum(1 for lo, hi in shard_bounds(n, k) if hi > lo)
        if k > n and len(pairs) == nonempty:
            return (f"{len(pairs)} pairs for {k} workers: with more workers than samples some shards are empty; "
                    "return all k pairs, an empty one as (i, i)")
        return f"expected {k} (start, stop) pairs, one per worker, got {len(pairs)}"
    sizes = [hi - lo for lo, hi in pairs]
    if pairs[0][0] != 0:
        return f"the first shard starts at {pairs[0][0]}, not at 0"
    for i in range(1, k):
        if pairs[i][0] != pairs[i - 1][1]:
            return (f"shard {i} starts at {pairs[i][0]} but shard {i - 1} stops at {pairs[i - 1][1]}: each shard "
                    "starts where the one before stops, with no gap and no overlap")
    if min(sizes) < 0:
        return f"a shard has a negative size (sizes {sizes})"
    if pairs[-1][1] < n and sizes == [base] * k:
        return (f"the last shard loses the remainder: the shards stop at {pairs[-1][1]}, so {n - pairs[-1][1]} of "
                f"the {n} samples (n % k) are never used")
    if pairs[-1][1] != n:
        return f"the shards cover range({pairs[-1][1]}), not range({n})"
    if k > 1 and sizes == [base] * (k - 1) + [base + extra]:
        return (f"the last shard takes the whole remainder (sizes {sizes}): its worker is the slowest; spread the "
                "n % k extra samples, one each")
    if max(sizes) - min(sizes) > 1:
        return (f"the sizes {sizes} differ by more than one: with ceil(n / k) per shard the last ones come up "
                "short" if sizes[0] == -(-n // k) else f"the sizes {sizes} differ by more than one")
    return f"the longer shards come last (sizes {sizes}); labkit's convention, which its pools use, puts them first"


@recorded
def split_batch(fn) -> None:
    """Exercise (lab 02): ``fn(n, k) -> [(start, stop), ...]``, k contiguous shards of range(n) whose sizes differ by
    at most one, the longer ones first (:func:`labkit.shards.shard_bounds`)."""
    ex = "splitting a batch into shards"
    fn = capture.student(fn, ex=ex)
    cases = [(10, 4), (12, 4), (10, 3), (7, 7), (3, 5), (0, 3), (1, 1), (100, 1), (5, 2)]
    rng = np.random.default_rng(capture.seed(30))
    cases += [(int(rng.integers(0, 1000)), int(rng.integers(1, 18))) for _ in range(3)]
    for n, k in each_case(cases):
        where = f"n = {n} samples, k = {k} workers"
        got = call(ex, fn, n, k)
        pairs = _pairs(ex, where, got, k)
        want = shard_bounds(n, k)
        if pairs != want:
            fail(ex, f"{where}: {_named_split_mistake(n, k, pairs)}\n  yours:    {pairs}\n  expected: {want}")
    passed(ex, len(cases))


@recorded
def accumulate(fn) -> None:
    """Exercise (lab 02): ``fn(params, x, Y, acc) -> loss_sum`` adds per-sample gradients of rows x into ``acc``.

    The check runs it in several threads, each with its own accumulator, and reduces them at the end.
    """
    ex = "per-thread accumulator"
    fn = capture.student(fn, ex=ex)
    n = 0
    for k, (params, x, Y) in enumerate(each_case(problems(seed=capture.seed(1)))):
        want_loss, want = mlp.loss_and_grads_per_sample(params, x, Y)
        batch = x.shape[0]
        want_sum = [(gW * batch, gb * batch) for gW, gb in want]
        # a single accumulator first: the plainest failure messages
        acc = mlp.zeros_like(params)
        loss_sum = call(ex, fn, params, x, Y, acc)
        where = f"problem {k + 1} (batch {batch}, one thread)"
        if all(not a.any() for pair in acc for a in pair):
            fail(ex, f"{where}: acc is still all zeros after your function returned",
                  "add into the arrays of acc in place, e.g. `acc_W += dW`; `acc_W = acc_W + dW` makes a new array")
        if batch > 1:
            _, last = mlp.loss_and_grads_per_sample(params, x[-1:], Y[-1:])
            if all(np.allclose(a, b) for (a, _), (b, _) in zip(acc, last)):
                fail(ex, f"{where}: acc holds only the last sample's gradient",
                      "add (+=) each sample's gradient; do not assign (=)")
        try:
            compare_grads(ex, acc, want_sum, 1, where)
        except ExerciseError as e:
            if all(np.allclose(a, b / batch) for (a, _), (b, _) in zip(acc, want_sum)):
                fail(ex, f"{where}: acc holds the mean, not the sum", "accumulate sums; the caller divides once at the end")
            raise e
        if not np.isclose(float(loss_sum), want_loss * batch, rtol=1e-6):
            fail(ex, f"{where}: returned loss {float(loss_sum):.6g}, expected the summed loss {want_loss * batch:.6g}")
        # then several threads, one accumulator each, reduced at the end
        shards = [(lo, hi) for lo, hi in shard_bounds(batch, 3) if hi > lo]
        accs = [mlp.zeros_like(params) for _ in shards]
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(fn, params, x[lo:hi], Y[lo:hi], a) for (lo, hi), a in zip(shards, accs)]
            losses = [f.result() for f in futures]
        total = [(sum(a[i][0] for a in accs), sum(a[i][1] for a in accs)) for i in range(len(params))]
        compare_grads(ex, total, want_sum, 1, f"problem {k + 1} (batch {batch}, 3 threads reduced)")
        if not np.isclose(sum(float(v) for v in losses), want_loss * batch, rtol=1e-6):
            fail(ex, f"problem {k + 1}: the threads' losses do not add up to the batch's summed loss")
        n += 2
    passed(ex, n)


def _scaled(grads, weights):
    """sum_i weights[i] grads[i], layer by layer (NaN where a weighted gradient is NaN)."""
    out = [(np.zeros_like(gW), np.zeros_like(gb)) for gW, gb in grads[0]]
    for g, w in zip(grads, weights):
        for (oW, ob), (gW, gb) in zip(out, g):
            oW += w * gW
            ob += w * gb
    return out


def _combine_cases(seed: int):
    """(params, x, Y, k): equal shards, uneven ones, more workers than samples, one worker, and a random draw."""
    rng = np.random.default_rng(seed)
    draw = (([6, 5, 4], int(rng.integers(2, 20)), int(rng.integers(2, 7))),)
    for sizes, batch, k in (([5, 4, 3], 8, 2), ([5, 4, 3], 13, 3), ([7, 6, 5, 3], 3, 5), ([5, 4, 3], 8, 1), *draw):
        params = mlp.init_params(sizes, seed=int(rng.integers(1000)), dtype=np.float64)
        x = rng.random((batch, sizes[0]))
        yield params, x, mlp.targets(rng.integers(0, sizes[-1], batch), sizes[-1], np.float64), k


@recorded
def combine_shards(fn) -> None:
    """Exercise (lab 02): ``fn(grads, counts) -> grads``, the batch's mean gradient from k workers' mean gradients
    over shards of ``counts`` samples; an empty shard's mean is NaN."""
    ex = "combining the workers' gradients"
    fn = capture.student(fn, ex=ex)
    n = 0
    for params, x, Y, k in each_case(_combine_cases(capture.seed(31))):
        bounds = shard_bounds(x.shape[0], k)
        counts = [hi - lo for lo, hi in bounds]
        grads = [mlp.backprop(params, x[lo:hi], Y[lo:hi]) if hi > lo else
                 [(np.full_like(W, np.nan), np.full_like(b, np.nan)) for W, b in params] for lo, hi in bounds]
        before = [a.copy() for g in grads for pair in g for a in pair]
        where = f"batch of {x.shape[0]} over {k} worker{'s' if k > 1 else ''} (counts {counts})"
        got = call(ex, fn, grads, counts)
        _unchanged(ex, where, before, [a for g in grads for pair in g for a in pair], "the workers' gradients (grads)")
        want = mlp.backprop(params, x, Y)
        if _matches(got, want):
            n += 1
            continue
        if not isinstance(got, (list, tuple)) or len(got) != len(params):
            fail(ex, f"{where}: expected a list of {len(params)} (dW, db) pairs, like params, got "
                 f"{type(got).__name__}" + (f" of length {len(got)}" if isinstance(got, (list, tuple)) else ""),
                 "return one (dW, db) pair per layer, as each worker's gradients are")
        full = [g for g, c in zip(grads, counts) if c]
        sizes = [c for c in counts if c]
        batch = sum(counts)
        try:
            has_nan = any(np.isnan(np.asarray(a, dtype=float)).any() for pair in got for a in pair)
        except (TypeError, ValueError):
            has_nan = False
        if has_nan and 0 in counts:
            fail(ex, f"{where}: your result holds NaN: an empty shard's gradient (NaN, the mean of no samples) got "
                      "in; 0 x NaN is still NaN, so leave out shards of size 0")
        for wrong, why in (
                (_scaled(full, [1 / len(full)] * len(full)), "a plain mean of the workers' gradients: right only when "
                 "every shard has the same size; weight each by its number of samples"),
                (_scaled(full, sizes), "the weighted sum is not divided by the batch size (the sum of counts)"),
                (_scaled(full, [c / k for c in sizes]), "divided by the number of workers, not by the number of samples"),
                (_scaled(full, [1] * len(full)), "the sum of the workers' means is no mean: weight each by its shard's "
                 "size and divide by the batch size"),
                (_scaled(full, [c / batch / batch for c in sizes]), "divided by the batch size twice")):
            if _matches(got, wrong):
                fail(ex, f"{where}: {why}")
        compare_grads(ex, got, want, 1, where)  # names the first layer that differs, from the output back
        n += 1
    passed(ex, n)


class _Tracked(np.ndarray):
    """A gradient array handed to the student's code by :class:`_Threads`: an operation that takes it as an input tells
    the watch which thread wrote into which array (``acc_W += dW``), read which other array beside it (``total + dW``)
    and made which new one. An accumulator a gradient was added into comes back from that addition as a tracked view
    of itself (``acc``, marked ``_acc``), so that adding it on into a total (``total += acc``) tells the watch too.
    Other arithmetic on it gives plain arrays; what keeps its type (a copy, ``np.zeros_like``) reports nothing."""

    _watch = None
    _acc = False

    def __array_finalize__(self, obj):
        self._watch, self._acc = None, False  # only the arrays the wrapper returned report: not what is derived

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        tracked = [a for a in inputs if isinstance(a, _Tracked) and a._watch is not None]
        watch = tracked[0]._watch if tracked else None
        plain = [np.asarray(a) if isinstance(a, _Tracked) else a for a in inputs]
        if watch is not None:  # a total that threads share is read, or written, beside their gradients
            others = [a for a in inputs if not isinstance(a, _Tracked)] + list(out or ())
            written = {o.__array_interface__["data"][0] for o in out or () if isinstance(o, np.ndarray)}
            sources = [a for a in tracked if a.__array_interface__["data"][0] not in written]
            # an accumulator added on into another array (total += acc): that array is a total
            watch.wrote(others, totals=bool(sources) and all(a._acc for a in sources))
        if out is not None:
            kwargs["out"] = tuple(np.asarray(o) if isinstance(o, _Tracked) else o for o in out)
        result = getattr(ufunc, method)(*plain, **kwargs)
        if out is not None:
            if watch is None or len(out) != 1 or not watch.open:
                return out[0] if len(out) == 1 else out
            view = np.asarray(out[0]).view(_Tracked)  # acc += dW: the name acc now holds a view that reports
            view._watch, view._acc = watch, True
            return view
        if watch is not None:
            watch.wrote([result])  # a new total: another thread that adds to it shares it
        return result


class _TrackedLoss(float):
    """A loss handed to the student's code by :class:`_Threads`, which remembers whose losses a sum holds: a worker
    thread that adds into a total holding another worker's loss (``total[0] += loss``, with a lock or without) tells
    the watch that the threads share one total. Other arithmetic gives plain floats."""

    def __new__(cls, value, watch, by: frozenset):
        self = super().__new__(cls, value)
        self._watch, self._by = watch, by
        return self

    def _sum(self, other, value):
        if value is NotImplemented:
            return value
        me, by = threading.current_thread(), self._by | getattr(other, "_by", frozenset())
        watch = self._watch
        if watch.open and me is not watch.caller and by - {me, watch.caller}:
            watch.shared_loss += 1
        return _TrackedLoss(value, watch, by | {me})

    def __add__(self, other):
        return self._sum(other, float.__add__(self, other))

    def __radd__(self, other):
        return self._sum(other, float.__radd__(self, other))


class _Threads:
    """While the student's function runs: labkit.mlp's gradient functions, wrapped in the module, note which threads
    compute gradients, when, and whether after the function returned; which thread adds into which array; and what
    the threads raise. A worker thread's first gradient waits (up to a quarter of a second) until the ``expected``
    threads have all begun, then 5 ms more: threads that run at once are seen to, a pool cannot hand a finished
    thread a second shard, and a thread left running is still at work when the function returns."""

    WRAPPED = ("loss_and_grads_per_sample", "backprop_per_sample", "loss_and_grads", "loss_and_grads_unchecked",
               "backprop", "backprop_one")

    def __init__(self, expected: int, x: np.ndarray, params):
        self.expected = expected
        self.row_of = {self._row_key(row): k for k, row in enumerate(x)}  # a sample's values -> its row in x
        self.n_in = x.shape[1]
        self.rows: dict = {}  # thread -> the rows of x it computed gradients of
        self.unknown = 0  # rows passed to labkit.mlp that are not x's
        self.inputs = {a.__array_interface__["data"][0] for pair in params for a in pair}  # read by all, written by none
        self.caller = threading.current_thread()
        self.cond = threading.Condition()
        self.inside = threading.local()
        self.spans: dict = {}  # thread (its object: an ident may be reused) -> [its first gradient's start, last's end]
        self.active = self.late = 0
        self.returned = False
        self.last = 0.0
        self.targets: dict = {}  # memory written -> (the array, the threads that wrote into it)
        self.totals: dict = {}  # memory an accumulator was added into -> (the array, the threads that added)
        self.errors: list[str] = []
        self.shared_loss = 0  # additions by a worker into a total holding another worker's loss
        self.saved: dict = {}
        self.open = True  # False once the check has its summary: arrays the student keeps report nothing more

    def __enter__(self):
        self.last = time.perf_counter()
        self.saved = {name: getattr(mlp, name) for name in self.WRAPPED}
        for name, f in self.saved.items():
            setattr(mlp, name, self._counted(f))
        self.hook, threading.excepthook = threading.excepthook, self._raised
        return self

    def __exit__(self, *exc):
        for name, f in self.saved.items():
            setattr(mlp, name, f)
        threading.excepthook = self.hook
        self.open = False

    def _raised(self, args) -> None:
        if args.exc_type is not SystemExit:
            self.errors.append(f"{args.exc_type.__name__}: {args.exc_value}")

    def wrote(self, arrays, totals: bool = False) -> None:
        """Note the arrays this thread wrote, read or made beside a gradient, or (``totals``) beside an accumulator
        (each kept, so that its memory is not reused for another array while the function runs)."""
        if not self.open:
            return
        me = threading.current_thread()
        into = self.totals if totals else self.targets
        with self.cond:
            for o in arrays:
                if isinstance(o, np.ndarray) and o.ndim:
                    key = o.__array_interface__["data"][0]
                    if key not in self.inputs:
                        into.setdefault(key, (o, set()))[1].add(me)

    @staticmethod
    def _row_key(row) -> bytes:
        return np.asarray(row, dtype=np.float32).tobytes()  # in float32 too: a student's cast keeps the sample known

    def _note_rows(self, me, args) -> None:
        """Which rows of the case's x the gradient call on ``args`` (params, x, ...) computes, for thread ``me``."""
        x = np.asarray(args[1]) if len(args) > 1 and isinstance(args[1], np.ndarray) else None
        if x is None or x.size % self.n_in:
            self.unknown += 1
            return
        for row in x.reshape(-1, self.n_in):
            k = self.row_of.get(self._row_key(row))
            if k is None:
                self.unknown += 1
            else:
                self.rows.setdefault(me, []).append(k)

    def _tracked(self, v):
        if isinstance(v, (float, np.floating)) and not isinstance(v, _TrackedLoss):
            return _TrackedLoss(v, self, frozenset({threading.current_thread()}))
        if isinstance(v, np.ndarray) and v.dtype.kind == "f":
            t = v.view(_Tracked)
            t._watch = self
            return t
        if isinstance(v, (list, tuple)):
            return type(v)(self._tracked(a) for a in v)
        return v

    def _counted(self, f):
        @functools.wraps(f)
        def counted(*args, **kwargs):
            if getattr(self.inside, "depth", 0) or not self.open:  # labkit's own calls inside it count as one
                return f(*args, **kwargs)
            me = threading.current_thread()
            with self.cond:
                now = self.last = time.perf_counter()
                first = me not in self.spans
                self.spans.setdefault(me, [now, now])
                self.active += 1
                self._note_rows(me, args)
                self.cond.notify_all()
                if first and me != self.caller:
                    self.cond.wait_for(lambda: len(self.spans) >= self.expected, timeout=0.25)
            if first and me != self.caller:
                time.sleep(0.005)
            self.inside.depth = 1
            try:
                result = f(*args, **kwargs)
            finally:
                self.inside.depth = 0
                with self.cond:
                    now = self.last = time.perf_counter()
                    self.spans[me][1] = now
                    self.active -= 1
                    self.late += self.returned
            return self._tracked(result)

        return counted

    def summary(self) -> tuple:
        """(threads that computed gradients, whether the calling thread did, the most of them at work at once,
        gradients finished after the function returned, arrays written by more than one thread, what the threads
        raised, the rows of x each thread computed in the order they began, the rows not x's, the losses added into a total
        another worker had added to, the totals more than one thread added its accumulator into): plain numbers, lists
        and text, recorded when graded. Waits first for threads still at work."""
        deadline = time.perf_counter() + 2.0
        while time.perf_counter() < deadline:
            with self.cond:
                if not self.active and time.perf_counter() - self.last > 0.02:
                    break
            time.sleep(0.002)
        with self.cond:
            spans = sorted(self.spans.values())
            at_once = max((sum(1 for s in spans if s[0] <= t <= s[1]) for t, _ in spans), default=0)
            shared = sum(1 for _, threads in self.targets.values() if len(threads) > 1)
            shared_totals = sum(1 for _, threads in self.totals.values() if len(threads) > 1)
            order = sorted(self.spans, key=lambda t: self.spans[t][0])
            rows = [sorted(self.rows.get(t, [])) for t in order]
            return (len(self.spans), self.caller in self.spans, at_once, self.late, shared, list(self.errors), rows,
                    self.unknown, self.shared_loss, shared_totals)


def _threaded_cases(seed: int):
    """(params, x, Y, p): p = 2, 3 and 1 threads on the usual problems, one drawn afresh, one in float32, then p > n."""
    probs = list(problems(seed))
    rng = np.random.default_rng(seed + 1)
    sizes = ([5, 4, 3], [7, 6, 5, 3])[int(rng.integers(2))]
    batch = int(rng.integers(2, 20))
    params = mlp.init_params(sizes, seed=int(rng.integers(1000)), dtype=np.float64)
    drawn = (params, rng.random((batch, sizes[0])), mlp.targets(rng.integers(0, sizes[-1], batch), sizes[-1], np.float64))
    for p in (2, 3, 1):  # threads from the start: p = 1 cannot tell a division by p from none
        for params, x, Y in probs:
            if p <= x.shape[0]:
                yield params, x, Y, p
    yield (*drawn, int(rng.integers(2, 7)))
    params = mlp.init_params([6, 5, 4], seed=int(rng.integers(1000)), dtype=np.float32)  # lab 02 trains in float32
    yield params, rng.random((9, 6)).astype(np.float32), mlp.targets(rng.integers(0, 4, 9), 4, np.float32), 2
    for params, x, Y in probs:
        for p in ((2, 3) if x.shape[0] == 1 else (x.shape[0] + 2,)):
            yield params, x, Y, p


def _row_text(rows) -> str:
    rows = [int(r) for r in rows]
    return ", ".join(map(str, rows[:6])) + (", ..." if len(rows) > 6 else "")


def _row_mistake(rows: list, unknown: int, n: int, p: int) -> str | None:
    """What is wrong with the rows of x that each thread computed gradients of (``rows``, one list per thread), if
    anything: the whole batch on every thread, a sample computed twice or never, shards of uneven sizes. Nothing is
    said where some rows were not x's (``unknown``): the values will say what is wrong."""
    if unknown or not rows:
        return None
    counts = np.bincount([r for t in rows for r in t], minlength=n)
    if n > 1 and len(rows) > 1 and all(t == list(range(n)) for t in rows):
        return (f"each of your {len(rows)} threads computed the gradients of all {n} samples: every thread worked on "
                "the whole batch instead of its shard, so the threads divide no work")
    if counts.max() > 1:
        twice = np.flatnonzero(counts > 1)
        return (f"the gradients of {len(twice)} of the {n} samples (rows {_row_text(twice)}) were computed more than "
                "once: shards that overlap, or a shard given to two threads; each sample belongs to exactly one shard")
    if counts.min() == 0:
        never = np.flatnonzero(counts == 0)
        return (f"the gradients of {len(never)} of the {n} samples (rows {_row_text(never)}) were never computed: "
                "your shards leave them out (the n % p samples of the remainder?)")
    sizes = sorted((len(t) for t in rows), reverse=True)
    want = sorted((hi - lo for lo, hi in shard_bounds(n, p) if hi > lo), reverse=True)
    if len(sizes) == len(want) and sizes != want:
        return (f"your threads computed {sizes} samples each, where shards whose sizes differ by at most one hold "
                f"{want}: the thread with the most samples sets the time, while the others wait")
    return None


def _dtype_mistake(ex: str, where: str, grads, params) -> None:
    """Fail where a gradient that is an array has another dtype than its parameter's."""
    if not isinstance(grads, (list, tuple)):
        return
    for i, (pair, (W, b)) in enumerate(zip(grads, params)):
        if not isinstance(pair, (list, tuple)):
            return
        for name, g, q in zip(("dW", "db"), pair, (W, b)):
            if isinstance(g, (np.ndarray, np.generic)) and g.dtype != q.dtype:
                why = ("an array made from a shape alone (np.zeros(shape)) is float64 whatever the parameters are"
                       if g.dtype == np.float64 else f"yours were made {g.dtype}")
                fail(ex, f"{where}, layer {i}: {name} is {g.dtype}, for parameters of {q.dtype}: the gradients take "
                          f"their dtype from the arrays they were summed into, and {why}",
                     "make every accumulator with its parameter's dtype, float32 parameters included")


def _close_in(params, got, want) -> bool:
    """Whether float32 gradients (params in float32) equal labkit's to float32's rounding; False for float64 ones, whose
    comparison is compare_grads's."""
    if params[0][0].dtype != np.float32:
        return False
    try:
        return len(got) == len(want) and all(np.allclose(np.asarray(g, dtype=float), w, rtol=1e-4, atol=1e-6)
                                             for gp, wp in zip(got, want) for g, w in zip(gp, wp))
    except (TypeError, ValueError):
        return False


def _sums(params, x, Y, bounds):
    """Each non-empty shard's (summed loss, summed gradients)."""
    out = []
    for lo, hi in bounds:
        if hi > lo:
            value, g = mlp.loss_and_grads_per_sample(params, x[lo:hi], Y[lo:hi])
            out.append((hi - lo, value * (hi - lo), [(gW * (hi - lo), gb * (hi - lo)) for gW, gb in g]))
    return out


def _threaded_mistake(got_loss, got, want_loss, want, shards, n: int, p: int) -> str | None:
    """The typical mistake that ``(got_loss, got)`` is, if it is one."""
    total = [(sum(s[2][i][0] for s in shards), sum(s[2][i][1] for s in shards)) for i in range(len(want))]
    loss_sum = sum(s[1] for s in shards)
    means = [[(gW / k, gb / k) for gW, gb in g] for k, _, g in shards]
    mean_loss = [v / k for k, v, _ in shards]

    def scaled(grads, w):
        return [(gW * w, gb * w) for gW, gb in grads]

    def plain_mean(over):
        return [(sum(m[i][0] for m in means) / over, sum(m[i][1] for m in means) / over) for i in range(len(want))]

    if _matches(got, want):
        if np.isclose(got_loss, want_loss, rtol=1e-6):
            return None
        if np.isclose(got_loss, loss_sum, rtol=1e-6):
            return "the loss is the batch's summed loss: the mean loss divides it by n, the batch size, as the gradients"
        if p > 1 and np.isclose(got_loss, loss_sum / p, rtol=1e-6):
            return "the loss is divided by p, the number of threads: the mean loss divides the summed loss by n"
        if len(shards) > 1 and np.isclose(got_loss, sum(mean_loss) / len(shards), rtol=1e-6):
            return "the loss is a plain mean of the shards' mean losses: add the summed losses, divide once by n"
        return None
    if n > 1 and _matches(got, total):
        return ("the gradients are the batch's sums, not divided by n: the mean gradient divides the added "
                "accumulators by the batch size")
    if p > 1 and n != p and _matches(got, scaled(total, 1 / p)):
        return ("the added accumulators are divided by p, the number of threads: the mean divides the sum over "
                "every sample by n, the number of samples")
    for over in sorted({len(shards), p}):
        if over > 1 and _matches(got, plain_mean(over)):
            return ("a plain mean of the shards' means: each thread divided by its shard's size, and the means were "
                    "averaged; right only when every shard has the same size. Add the sums, divide once by n")
    return None


@recorded
def threaded_step(fn) -> None:
    """Exercise (lab 02): ``fn(params, x, Y, p) -> (loss, grads)``, the batch's mean loss and mean gradients as
    :func:`labkit.mlp.loss_and_grads_per_sample` gives them, computed by p threads, one shard each, each summing into
    an accumulator of its own; the sums added and divided by the batch size once every thread is joined.

    Besides the values, the check counts the threads that computed gradients (through labkit.mlp, as the student's
    accumulate does): min(p, n), at work at the same time, all finished when the function returns, none adding into
    another's arrays. Those observations are made in the student's process and recorded as one step per case.
    """
    ex = "a threaded step"
    fn = capture.student(fn, ex=ex)
    n_checks = 0
    for params, x, Y, p in each_case(_threaded_cases(capture.seed(33))):
        n = x.shape[0]
        where = f"{mlp.sizes_of(params)}, batch of {n}, p = {p} thread{'s' if p > 1 else ''}"
        empty = (f"with p = {p} threads for n = {n} sample{'s' if n > 1 else ''} some shards are empty: a thread with "
                 "an empty shard adds nothing (accumulate loops over no rows), and the division is by n alone")
        want_loss, want = mlp.loss_and_grads_per_sample(params, x, Y)
        before = [a.copy() for a in (x, Y, *(v for pair in params for v in pair))]
        expected = min(p, n)
        with _Threads(expected, x, params) as watch:
            try:
                got = call(ex, fn, params, x, Y, p, where=where,
                           hint=empty if p > n else "run it on a small batch by hand and print the shapes of every array")
            finally:
                watch.returned = True
            threads, caller, at_once, late, shared, errors, rows, unknown, shared_loss, shared_totals = capture.step(
                "threads", watch.summary, key=capture.digest((params, x, Y, p), {}))
        _unchanged(ex, where, before, (x, Y, *(v for pair in params for v in pair)), "params, x or Y")
        if errors:
            if any(e.startswith("NotImplementedError") for e in errors):
                raise ExerciseError(f"{ex}: {where}: a thread raised NotImplementedError: a function it calls (your "
                                    "my_split or accumulate?) is not written yet")
            fail(ex, f"{where}: {len(errors)} of your threads raised {errors[0]}", empty if p > n else
                 "a thread's error does not reach the caller: run the thread's function once by hand on one shard")
        if late:
            fail(ex, f"{where}: your threads were still computing gradients after your function had returned "
                      f"({late} gradients finished later): they were started but not joined, so the sums you added were not "
                      "complete yet",
                 "wait for every thread (join each one, or the futures' results, or leave the pool's with-block) "
                 "before adding the accumulators")
        if shared:
            fail(ex, f"{where}: several threads added their gradients into the same accumulator arrays ({shared} "
                      "arrays): without a lock a race, even where the GIL happens to keep the sum right, and with one "
                      "the threads wait for each other at every addition",
                 "give every thread an accumulator of its own, made before the threads start ([...] * p repeats one "
                 "accumulator p times)")
        if shared_totals:
            fail(ex, f"{where}: several threads added their accumulators into one shared total ({shared_totals} "
                      "arrays), each thread as it finished: `total += acc` reads, adds and stores, so without a lock "
                      "two threads can interleave and one shard's gradients are lost, and with one they take turns",
                 "keep each thread's accumulator apart until every thread is joined, then add them in the calling "
                 "thread alone")
        if shared_loss:
            fail(ex, f"{where}: several threads added their losses into one shared total ({shared_loss} additions "
                      "into a total that held another thread's loss): `total += loss` reads, adds and stores in three "
                      "steps, so without a lock another thread can store between them and one loss is lost, and with "
                      "one the threads wait for each other",
                 "let each thread return or store its own shard's loss (a list with a slot per thread), and add them "
                 "once every thread is joined")
        if not isinstance(got, (list, tuple)) or len(got) != 2:
            fail(ex, f"{where}: expected (loss, grads), got {type(got).__name__}"
                 + (f" of length {len(got)}" if isinstance(got, (list, tuple)) else ""),
                 "return the mean loss and the list of (dW, db) pairs, as mlp.loss_and_grads_per_sample does")
        why = None if caller else _row_mistake(rows, unknown, n, p)  # work in the calling thread is named below
        if why:
            fail(ex, f"{where}: {why}", "each thread takes the samples of its own shard (my_split(n, p)), and only those")
        got_loss, got_grads = got
        _dtype_mistake(ex, where, got_grads, params)
        got_loss = one_number(ex, where, got_loss, "the loss should be a number")
        try:
            nan = np.isnan(got_loss) or any(np.isnan(np.asarray(a, dtype=float)).any() for pr in got_grads for a in pr)
        except (TypeError, ValueError):
            nan = False
        if nan:
            fail(ex, f"{where}: your result holds NaN" + (": an empty shard's 0 / 0?" if p > n else ""),
                 empty if p > n else "divide the added sums once, by n")
        why = _threaded_mistake(got_loss, got_grads, want_loss, want, _sums(params, x, Y, shard_bounds(n, p)), n, p)
        if why:
            fail(ex, f"{where}: {why}")
        if not _close_in(params, got_grads, want):
            compare_grads(ex, got_grads, want, n, where)
        if not np.isclose(got_loss, want_loss, rtol=1e-6 if params[0][0].dtype == np.float64 else 1e-5):
            fail(ex, f"{where}: the loss {got_loss:.6g} differs from the batch's mean loss {want_loss:.6g}")
        if threads == 0:
            fail(ex, f"{where}: the check saw no call of mlp.loss_and_grads_per_sample while your function ran: it "
                      "counts the threads by those calls", "compute each shard's sums with your accumulate (exercise "
                      "2), which calls mlp.loss_and_grads_per_sample for every sample")
        if threads == 1 and caller and expected > 1:
            fail(ex, f"{where}: every gradient was computed in the calling thread: no thread of yours did any work",
                 "give each thread its shard to work on (its target, or pool.submit), and let the calling thread "
                 "only start the threads, wait for them and add up")
        if threads < expected:
            fail(ex, f"{where}: the gradients were computed on {threads} thread{'s' if threads > 1 else ''}: "
                      f"min(p, n) = {expected} shards hold samples, each on a thread of its own",
                 "start one thread per shard (a pool needs max_workers=p)")
        if threads > expected:
            fail(ex, f"{where}: the gradients were computed on {threads} threads, more than min(p, n) = {expected}: "
                      "one thread per non-empty shard, and the calling thread computes none of them besides",
                 "split the batch into p shards (my_split(n, p)) and give each its own thread")
        if expected > 1 and at_once < 2:
            fail(ex, f"{where}: your {threads} threads ran one after another, never two at a time",
                 "start every thread first, then join them all: a join right after a start waits for that thread "
                 "before the next one begins")
        n_checks += 1
    passed(ex, n_checks)


# ---- the registry ---------------------------------------------------------------------------------------------------

_PER_SAMPLE = ("per_sample_sum", "_sample_forward", "_sample_output_error", "_sample_backward", "_times_act_prime")
_MLP = ("backprop", "loss_and_grads", "loss_and_grads_unchecked", "backprop_per_sample", "loss_and_grads_per_sample",
        "backprop_one", "output_error", "layer_backward", "act_prime_from_output", *_PER_SAMPLE)

EXERCISES = (
    Exercise("output_error", "01", references=tuple(f"labkit.mlp:{f}" for f in (
        "output_error", "act_prime_from_output", "_sample_output_error", "_times_act_prime")), hints=(
        "By the chain rule, dC/dz = dC/da * da/dz, element by element: each output a_j = sigma(z_j) depends on its "
        "own z_j only.",
        "For C = ||a - y||^2 / 2, dC/da is a - y.",
        "da/dz is sigma'(z). Differentiate sigma(z) = 1 / (1 + exp(-z)) and write the result with sigma(z) itself.",
        "sigma'(z) = sigma(z) (1 - sigma(z)), and the A you are given is sigma(z) already: no z needed. NumPy's * "
        "multiplies element by element, every row at once.",
    )),
    Exercise("layer_backward", "01", references=("labkit.mlp:layer_backward", "labkit.mlp:_sample_backward"),
             hints=(
        "Write one sample first: z_j = sum_i W[j, i] a_i + b_j. Which z does W[j, i] change, and by how much?",
        "dz_j/dW[j, i] = a_i, so for one sample dC/dW[j, i] = delta_j a_i: the outer product of delta and a. The "
        "batch's cost is a sum over samples, so its gradient adds up every row's outer product.",
        "Adding up the outer products of all rows is one matrix product of delta (B, n_out) and A_in (B, n_in): "
        "transpose the one that makes the shape (n_out, n_in).",
        "dz_j/db_j = 1, so db adds up delta's rows. And a_i reaches every z_j through W[j, i]: dC/da_i = sum_j "
        "delta_j W[j, i], for every row at once one more product of delta with W, of shape (B, n_in).",
    )),
    Exercise("backprop", "01", references=tuple(f"labkit.mlp:{f}" for f in _MLP), hints=(
        "Forward first, keeping every layer's output: A^0 = x, A^l = sigma(A^(l-1) W_l^T + b_l). The backward pass "
        "needs them all.",
        "The mean cost is (1/B) sum_k C_k: the last layer's error is your output error, divided by B.",
        "Then go from the last layer to the first: your layer_backward gives the layer's dW and db, and dC/dA of the "
        "layer below.",
        "dC/dA^(l-1) is not yet the error of layer l-1, which is dC/dZ^(l-1): multiply by that layer's sigma', "
        "written with its output A^(l-1). The input x has no sigma and needs no error.",
    )),
    Exercise("numerical_gradient", "01", references=("labkit.mlp:numerical_grad",), hints=(
        "df/dW[idx] is how much f changes per unit change of the one entry W[idx], the others held fixed: change "
        "that entry a little, call f again, and compare.",
        "A one-sided difference, from W[idx] to W[idx] + eps, is off by about eps f''/2. Step both ways, to "
        "W[idx] + eps and to W[idx] - eps: the first-order errors cancel, and the two points are 2 eps apart.",
        "f() reads W itself, so change the entry in place, call f, and put the old value back before the next "
        "entry. np.ndindex(W.shape) walks over every index of an array of any shape.",
    )),
    Exercise("split_batch", "02", references=("labkit.shards:shard_bounds",), hints=(
        "Every shard gets at least n // k samples, and n % k samples are left over.",
        "Give the left-over samples one each to the first n % k shards: shard i holds n // k + 1 samples if "
        "i < n % k, else n // k.",
        "Shard i starts where shard i - 1 stopped, and shard 0 at 0: keep a running start, or count what comes "
        "before shard i (i shards of n // k, plus min(i, n % k) extra samples).",
    )),
    Exercise("accumulate", "02", references=(*(f"labkit.mlp:{f}" for f in _PER_SAMPLE),
                                                      "labkit.cpu_parallel:shard_sums", "labkit.cpu_parallel:ThreadedBackprop"),
             hints=(
        "Loop over the rows of x: one sample is the batch x[k:k+1], Y[k:k+1], and "
        "mlp.loss_and_grads_per_sample gives its loss and its (dW, db) per layer.",
        "The mean over a batch of one sample is that sample's own gradient: add each layer's dW and db into acc's "
        "two arrays for that layer, and add up the losses.",
        "Add in place, acc_W += dW: acc_W = acc_W + dW makes a new array and leaves acc as it was. Return the "
        "summed loss.",
    )),
    Exercise("combine_shards", "02",
             references=("labkit.cpu_parallel:combine_means", "labkit.mlp:mean_from_sums"), hints=(
        "A shard's mean gradient times its number of samples is its sum.",
        "The batch's mean is the sum of every shard's sum, divided by the number of samples in the batch (all "
        "counts added up), not by the number of workers.",
        "An empty shard adds nothing, but 0 x NaN is NaN: skip the shards of size 0. Build new arrays layer by "
        "layer (np.zeros_like), leaving the workers' arrays as they are.",
    )),
    Exercise("threaded_step", "02", references=(
        "labkit.cpu_parallel:threaded_grads", "labkit.cpu_parallel:ThreadedBackprop", "labkit.cpu_parallel:shard_sums",
        "labkit.mlp:per_sample_sum", "labkit.mlp:mean_from_sums"), hints=(
        "The batch's mean gradient is the sum of its samples' gradients divided by n, and a sum can be taken in "
        "parts: each shard's sum, then the sums added. my_split(n, p) gives the shards; accumulate sums one shard "
        "into the accumulator it is given, and returns the shard's summed loss.",
        "Make one accumulator per thread before any thread starts: for every layer of params a pair of zeroed "
        "arrays of the shapes of W and b. A thread adds only into its own, so no two threads write the same "
        "array and no lock is needed.",
        "Each thread runs a function on its shard and its accumulator: threading.Thread's target (which cannot "
        "return a value: let it write its shard's loss into a list slot of its own), or pool.submit (whose future "
        "gives it back). Start every thread first; only then wait for them all.",
        "Once all are done, add the accumulators layer by layer and the losses, then divide both by n, the batch "
        "size: not by p, nor by a shard's size. With p > n some shards are empty; accumulate then loops over no "
        "rows and its accumulator stays zero.",
    )),
)
