"""Checks of the C exercises (lab 03): the student's C is compiled with the sanitizers and run in a child process
first (an access out of bounds is a message with the line, never a crashed notebook), then built optimised and run
many times at 1 to 2x-cores threads against the NumPy reference, which names a race or a missing reduction."""

from __future__ import annotations

import re

import numpy as np

from . import capture
from .common import ExerciseError, fail, passed, recorded
from .exercises import Exercise
from .kernels import KERNEL_TODO

# the loop order of the formula g_ij = sum_s d_si x_sj: the inner loop strides through memory and is a dependent sum
NAIVE_OUTER = r"""
void outer_acc(const float* d, const float* x, float* g, int B, int n_out, int n_in)
{
    for (int i = 0; i < n_out; ++i)
        for (int j = 0; j < n_in; ++j)
            for (int s = 0; s < B; ++s) g[(size_t)i * n_in + j] += d[(size_t)s * n_out + i] * x[(size_t)s * n_in + j];
}
"""


def _compile(ex: str, source: str, name: str, helpers: bool, label: str, **options):
    from .. import hostc, openmp

    if not isinstance(source, str):
        fail(ex, f"expected the C source as a string, got {type(source).__name__}")
    if KERNEL_TODO in source:
        raise ExerciseError(f"{ex}: not written yet (the function still says {KERNEL_TODO})\nHint: write the code in "
                            "place of the comment, run the cell, then run this check again")
    text = openmp.with_helpers(source, "yours.c") if helpers else source

    def compile_():
        try:
            module = hostc.CModule(text, "yours.c", **options)
        except hostc.CompilerMissing as e:
            raise ExerciseError(f"{ex}: {e}") from None
        except hostc.CCompileError as e:
            fail(ex, f"your code does not compile:\n{e}", "the first error is usually the one to fix; the line numbers "
                  "are lines of your source")
        if name not in module.functions:
            fail(ex, f"no function called {name!r} in your source (found {', '.join(module.functions) or 'none'})",
                  "keep the name and the signature given in the exercise")
        return module.get_function(name)

    return capture.build(label, compile_, ex)


def _call(ex: str, fn, args, hint: str, **kw):
    from .. import hostc

    try:
        return fn(*args, **kw)
    except hostc.CError as e:
        fail(ex, str(e), hint)
    except (TypeError, ValueError) as e:
        fail(ex, f"your function's parameters do not fit: {e}", "keep the signature given in the exercise")


@recorded
def loop_interchange(source: str, name: str = "outer_acc", repeat: int = 7) -> None:
    """Lab 03: ``outer_acc(d, x, g, B, n_out, n_in)`` adds sum_s d_s x_s^T into g (n_out, n_in), with loops in an order
    whose inner loop walks along a row. Checked for values (with the sanitizers) and for speed against the naive order."""
    from .. import hostc
    from ..bench import interleaved, measure

    ex = "loop interchange"
    source = capture.source(source)
    checked = _compile(ex, source, name, helpers=False, label="checked", opt="-O1", checked=True)
    rng = np.random.default_rng(capture.seed(0))
    n = 0
    for B, n_out, n_in in ((1, 1, 1), (3, 5, 7), (10, 30, 784)):
        d, x = rng.standard_normal((B, n_out), dtype=np.float32), rng.standard_normal((B, n_in), dtype=np.float32)
        g0 = rng.standard_normal((n_out, n_in), dtype=np.float32)
        g = g0.copy()
        _call(ex, checked, (d, x, g, np.int32(B), np.int32(n_out), np.int32(n_in)),
              "the loops run i < n_out, j < n_in, s < B; g is n_out rows of n_in")
        want = g0 + d.T @ x
        if np.allclose(g, g0 + 0 * want) and B:
            fail(ex, f"B={B}, n_out={n_out}, n_in={n_in}: g is unchanged", "add into g: g[i][j] += d[s][i] * x[s][j]")
        if not np.allclose(g, want, rtol=1e-4, atol=1e-4):
            bad = np.argwhere(~np.isclose(g, want, rtol=1e-4, atol=1e-4))[0]
            fail(ex, f"B={B}, n_out={n_out}, n_in={n_in}: g[{bad[0]}][{bad[1]}] is {g[tuple(bad)]:.5g}, expected "
                  f"{want[tuple(bad)]:.5g}", "g[i * n_in + j] += d[s * n_out + i] * x[s * n_in + j], summed over "
                  "every sample s; g is added to, not overwritten")
        n += 1
    # timed at -O3: -O2's cheap vectoriser leaves the row loop scalar, and the two orders then differ by 0.95-2.2x from
    # round to round; at -O3 the row order measured 3.5-6.8x faster in every round, the formula's order 1.0x
    yours = _compile(ex, source, name, helpers=False, label="O3", opt="-O3")

    def timed():  # the student's process measures; the grader reads the two medians
        naive = hostc.load(NAIVE_OUTER, opt="-O3").get_function("outer_acc")
        mine = getattr(yours, "unrecorded", yours)  # timing calls are not recorded one by one
        B, n_out, n_in = 32, 100, 784
        d, x = rng.standard_normal((B, n_out), dtype=np.float32), rng.standard_normal((B, n_in), dtype=np.float32)
        g = np.zeros((n_out, n_in), np.float32)
        args = (d, x, g, np.int32(B), np.int32(n_out), np.int32(n_in))
        t = interleaved({k: (lambda f=f: measure(lambda: f(*args), repeat=repeat).median)
                         for k, f in (("naive", naive), ("yours", mine))}, rounds=3)
        return float(t["naive"].median), float(t["yours"].median)

    t_naive, t_yours = capture.step("timing", timed)
    speedup = t_naive / t_yours
    print(f"naive order {t_naive * 1e3:.2f} ms, yours {t_yours * 1e3:.2f} ms: {speedup:.2f}x")
    if speedup < 1.5:  # clearly faster
        fail(ex, f"your loop order is not clearly faster than the naive one ({speedup:.2f}x; at least 1.5x expected)",
             "make j (along a row of g and of x) the inner loop, and keep d[s][i] and the row pointers in local "
             "variables outside it, so the compiler can vectorise the inner loop")
    passed(f"{ex} ({speedup:.1f}x faster than the naive order)", n + 1)


@recorded
def omp_reduction(source: str, name: str = "my_bp_omp", runs: int = 6) -> None:
    """Lab 03: ``my_bp_omp`` (the signature of labkit's bp_* functions) parallelises network.py's per-sample backprop
    over the samples with OpenMP, combining the gradients without a race. Run with the sanitizers first, then at 1 to
    2x-cores threads, ``runs`` times each, against the NumPy reference."""
    from .. import mlp
    from ..machine import usable_cores

    ex = "OpenMP reduction"
    source = capture.source(source)
    if isinstance(source, str) and KERNEL_TODO not in source and "#pragma omp" not in source:
        fail(ex, "your code has no OpenMP directive", "parallelise the loop over the samples with #pragma omp parallel "
              "(and omp for), and combine the gradients with a reduction")
    checked = _compile(ex, source, name, helpers=True, label="checked", opt="-O1", openmp=True, checked=True)
    fast = _compile(ex, source, name, helpers=True, label="O2", opt="-O2", openmp=True)
    rng = np.random.default_rng(capture.seed(1))
    params = mlp.init_params([784, 30, 10], seed=3)
    B = 151  # enough samples per thread that a race loses updates in some run (at 37, one CI run in about ten saw none)
    x = rng.random((B, 784), dtype=np.float32)
    Y = mlp.targets(rng.integers(0, 10, B), 10, np.float32)
    loss, grads = mlp.loss_and_grads_per_sample(params, x, Y)
    want = [g * B for pair in grads for g in pair]
    (W1, b1), (W2, b2) = params

    def call(fn, threads):
        out = [np.full_like(w, np.nan) for w in want]  # nothing carried over: the function must zero or overwrite
        cost = _call(ex, fn, (W1, b1, W2, b2, x, Y, np.int32(B), np.int32(784), np.int32(30), np.int32(10), *out),
                     "each thread needs its own work array, and every index must stay inside its array",
                     threads=threads)
        return cost, out

    call(checked, 2)  # an access out of bounds or undefined behaviour stops here, with the line
    threads = capture.step("threads", lambda: sorted({1, 2, usable_cores(), 2 * usable_cores()}))
    n = 1
    for p in threads:
        results = [call(fast, p) for _ in range(runs)]
        n += runs
        wrong = [i for i, (c, out) in enumerate(results)
                 if not (np.isclose(c, loss * B, rtol=1e-4) and all(np.allclose(o, w, rtol=1e-3, atol=1e-5)
                                                                   for o, w in zip(out, want)))]
        if not wrong:
            continue
        first = results[0][1][0].ravel()
        differ = any(not np.array_equal(first, out[0].ravel()) for _, out in results[1:])
        ratio = float(np.sum(results[wrong[0]][1][0]) / np.sum(want[0])) if np.sum(want[0]) else float("nan")
        where = f"with {p} thread{'s' if p > 1 else ''}, {len(wrong)} of {runs} runs gave a wrong gradient or cost"
        if p == 1:
            fail(ex, f"{where} even with one thread", "start from labkit's serial loop: for every sample s, "
                  "cost += add_sample(...) into the gradients; get that right before adding OpenMP")
        if differ:
            fail(ex, f"{where}, and the runs differ from each other: a race",
                 "two threads add into the same gradient entries (or the cost) at the same time and lose updates. "
                 "Give every thread its own accumulators: reduction(+ : cost, gW1[:n], ...) on the parallel region")
        fail(ex, f"{where} (the first layer's gradient sums to {ratio:.2f} of the reference)",
             "each thread summed its share, but the shares were not combined: a missing reduction. Name every "
             "gradient array and the cost in reduction(+ : ...) with their lengths (array sections: gW1[:n_hid * n_in])")
    if _takes_turns(source):
        many = [p for p in threads if p > 1]
        most = capture.step("overlap", lambda: _most_inside_at_once(source, name, (W1, b1, W2, b2, x, Y), many, runs))
        if most <= 1:
            fail(ex, f"the gradients are right, but in {runs * len(many)} runs at {', '.join(map(str, many))} threads "
                     "no two threads were ever inside add_sample at the same time: the threads take turns, so the "
                     "loop over the samples runs serially", "omp critical (or atomic, ordered, a lock) around each "
                     "sample's work lets one thread in at a time. Let every thread add into gradients of its own, "
                     "and combine them once at the end")
        n += 1
    passed(f"{ex} at {', '.join(map(str, threads))} threads", n)


_TURNS = re.compile(r"#\s*pragma\s+omp\s+(?:critical|atomic|ordered)\b|\bomp_set_lock\s*\(")


def _takes_turns(source: str) -> bool:
    """Whether the source lets one thread at a time into some region (critical, atomic, ordered or a lock)."""
    from ..hostc import strip_comments

    return bool(_TURNS.search(strip_comments(source)))


def _most_inside_at_once(source: str, name: str, arrays, threads: list[int], runs: int) -> int:
    """The most threads inside labkit's add_sample at the same moment, over ``runs`` calls at each of ``threads``
    (the student's code built with -DLABKIT_OVERLAP, which counts them)."""
    from .. import hostc, openmp

    module = hostc.CModule(openmp.with_helpers(source, "yours.c"), "yours.c", opt="-O2", openmp=True,
                           options=("-DLABKIT_OVERLAP",))
    fn, overlap = module.get_function(name), module.get_function("labkit_overlap")
    W1, b1, W2, b2, x, Y = arrays
    B, n_hid, n_out = len(x), len(b1), len(b2)
    most = 0
    overlap(np.int32(1))
    for p in threads:
        for _ in range(runs):
            out = [np.zeros_like(w) for w in (W1, b1, W2, b2)]
            fn(W1, b1, W2, b2, x, Y, np.int32(B), np.int32(x.shape[1]), np.int32(n_hid), np.int32(n_out), *out,
               threads=p)
            most = max(most, int(overlap(np.int32(1))))
    return most


EXERCISES = (
    Exercise("loop_interchange", "03", "openmp"),
    Exercise("omp_reduction", "03", "openmp", sources=(("c/backprop.c", "bp_omp_reduction"),)),
)
