"""Checks of the C exercises (lab 03): the student's C is compiled with the sanitizers and run in a child process
first (an access out of bounds is a message with the line, never a crashed notebook), then built optimised and run
many times at 1 to 2x-cores threads against the NumPy reference, which names a race or a missing reduction."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from .. import hostc, mlp, openmp
from ..bench import interleaved, measure
from ..machine import usable_cores
from ..native.csource import matching_bracket, strip_comments
from . import capture
from .common import ExerciseError, each_case, fail, passed, recorded
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


def _call(ex: str, fn, args, hint: str, where: str = "", **kw):
    try:
        return fn(*args, **kw)
    except hostc.CError as e:
        fail(ex, f"{where}{e}", hint)
    except (TypeError, ValueError) as e:
        fail(ex, f"your function's parameters do not fit: {e}", "keep the signature given in the exercise")


def _simd_loops(code: str):
    """(pragma line, loop body) of every loop under ``#pragma omp simd`` (or ``omp for simd``, ``parallel for simd``)
    in comment-free C: the body is the braced block, or the one statement, after the loop's header."""
    for m in re.finditer(r"#\s*pragma\s+omp\s+(?:[\w\s]*\s)?simd\b[^\n]*", code):
        loop = re.compile(r"\bfor\s*\(").search(code, m.end())
        if loop is None:
            continue
        close = matching_bracket(code, loop.end() - 1, "(", ")")
        rest = code[close + 1:]
        start = len(rest) - len(rest.lstrip())
        if rest[start:start + 1] == "{":
            end = matching_bracket(rest, start, "{", "}")
            body = rest[start:end + 1]
        else:
            body = rest[start:rest.find(";", start) + 1]
        yield m.group(0), body


def _simd_races(code: str) -> list[str]:
    """The variables a simd loop sums into (``v += ...`` or ``v = v + ...``) that are declared outside the loop and
    not named in a reduction clause of its pragma: every vector lane adds into the one variable at once."""
    races = []
    for pragma, body in _simd_loops(code):
        reduced = set()
        for clause in re.findall(r"reduction\s*\(\s*[^:]*:([^)]*)\)", pragma):
            reduced |= {v.strip().split("[")[0] for v in clause.split(",")}
        declared = set(re.findall(r"\b(?:float|double|int|long)\s+(\w+)\s*[=;]", body))
        sums = re.findall(r"(?<![\w\].>])(\w+)\s*[+\-]=", body) + re.findall(r"(?<![\w\].>])(\w+)\s*=\s*\1\s*[+\-]", body)
        races += [v for v in dict.fromkeys(sums) if v not in reduced and v not in declared]
    return races


@recorded
def simd_forward(source: str, name: str = "layer_forward") -> None:
    """Lab 03: ``layer_forward(W, b, x, a, n_out, n_in)`` computes a = sigmoid(W x + b) for one sample in one fused
    pass per row, its dot product vectorised with ``omp simd`` and a reduction. Checked for values (with the
    sanitizers) on awkward sizes against NumPy in float64; the pragma and its reduction are read from the source."""
    ex = "simd forward"
    source = capture.source(source)
    if isinstance(source, str) and KERNEL_TODO not in source:
        code = strip_comments(source)
        if not re.search(r"#\s*pragma\s+omp\s+(?:[\w\s]*\s)?simd\b", code):
            fail(ex, "your code has no #pragma omp simd: without it the compiler must add the products one after the "
                 "other, in the order written (reordering a float sum changes its last bits), so the loop runs on one "
                 "vector lane", "put #pragma omp simd on the line before the loop over j")
        races = _simd_races(code)
        if races:
            fail(ex, f"a race between vector lanes: the simd loop adds into {', '.join(races)} from every lane at once, "
                 "and the pragma has no reduction for it; the compiler may then give a wrong sum", "each lane needs a "
                 "partial sum of its own, added up after the loop: that is what a reduction clause on the pragma asks")
    checked = _compile(ex, source, name, helpers=True, label="checked", opt="-O1", openmp=True, checked=True)
    rng = np.random.default_rng(capture.seed(4))
    n = 0
    for n_out, n_in in each_case(((1, 1), (5, 5), (3, 7), (30, 784), (10, 1001), (7, 33))):
        W = rng.standard_normal((n_out, n_in), dtype=np.float32) / np.sqrt(n_in).astype(np.float32)
        b = rng.standard_normal(n_out, dtype=np.float32)
        x = rng.random(n_in, dtype=np.float32)
        a = np.full(n_out, np.nan, np.float32)
        _call(ex, checked, (W, b, x, a, np.int32(n_out), np.int32(n_in)),
              "row i of W is n_in floats from W + i * n_in; a and b hold n_out floats, x n_in")
        z = W.astype(np.float64) @ x + b
        want = 1 / (1 + np.exp(-z))
        where = f"n_out={n_out}, n_in={n_in}"
        if np.allclose(a, want, rtol=1e-5, atol=1e-6):
            n += 1
            continue
        wrong = [(np.isnan(a).all(), "a is never written", "store each row's result in a[i]"),
                 (np.allclose(a, z, rtol=1e-4, atol=1e-5), "a holds z = W x + b: the sigmoid is missing",
                  "a[i] = sigmoid(z_i); sample.h's sigmoid(float) is there for you"),
                 (np.allclose(a, 1 / (1 + np.exp(-(W.astype(np.float64) @ x))), rtol=1e-5, atol=1e-6),
                  "the bias b is missing", "start each row's sum at b[i], or add it before the sigmoid"),
                 (n_out == n_in and np.allclose(a, 1 / (1 + np.exp(-(W.T.astype(np.float64) @ x + b))), rtol=1e-5,
                                                atol=1e-6),
                  "W is read by columns: you computed sigmoid(W^T x + b)", "row i of W starts at W + i * n_in, and "
                  "W[i][j] is at i * n_in + j")]
        for found, what, hint in wrong:
            if found:
                fail(ex, f"{where}: {what}", hint)
        k = int(np.argmax(~np.isclose(a, want, rtol=1e-5, atol=1e-6)))
        fail(ex, f"{where}: a[{k}] is {a[k]:.6g} (yours) but should be {want[k]:.6g} (spec)",
             "a[i] = sigmoid(b[i] + sum over j of W[i][j] * x[j])")
    passed(ex, n)


def _access_counts(source: str, name: str) -> dict | None:
    """cachegrind's counts of one call of the naive order, the row order and the student's (None without Valgrind)."""
    found = {k: openmp.outer_counts(src, n) for k, src, n in (("naive", NAIVE_OUTER, "outer_acc"),
                                                              ("rows", openmp.ROW_OUTER, "outer_acc"),
                                                              ("yours", source, name))}
    return None if None in found.values() else found


def _judge_counts(ex: str, counts: dict, times: tuple[float, float]) -> None:
    """Pass a loop order whose memory instructions are within 1.5x the row order's; print the counts, then the time."""
    mine, rows, naive = (counts[k]["Dr"] + counts[k]["Dw"] for k in ("yours", "rows", "naive"))
    misses = {k: counts[k]["D1mr"] + counts[k]["D1mw"] for k in counts}
    print(f"one call on 32 samples into g (100 x 784), counted by cachegrind (exact, the same in every run): memory "
          f"instructions: naive order {naive:,}, yours {mine:,}, the row order {rows:,}; first-level cache misses "
          f"{misses['naive']:,}, {misses['yours']:,} and {misses['rows']:,}. Timed beside it (medians, this machine "
          f"as busy as it is): naive {times[0] * 1e3:.2f} ms, yours {times[1] * 1e3:.2f} ms")
    if mine > 1.5 * rows:
        fail(ex, f"your loop order runs {mine / rows:.1f}x the memory instructions of the row order ({mine:,} against "
                 f"{rows:,}; the naive order's {naive:,}): its inner loop does not walk along a row, so the compiler "
                 "cannot load and store 4 to 8 neighbouring floats with one instruction",
             "make j (along a row of g and of x) the inner loop; the other two may come in either order")


def _innermost_bound(source: str) -> str | None:
    """The size the source's innermost for loop runs to ("n_in", "n_out" or "B"), or None where it cannot tell."""
    code = strip_comments(source) if isinstance(source, str) else ""
    innermost = None
    for m in re.finditer(r"\bfor\s*\(", code):
        close = matching_bracket(code, m.end() - 1, "(", ")")
        if close < 0:
            return None
        header, rest = code[m.end():close], code[close + 1:]
        body = rest[:matching_bracket(rest, rest.index("{"), "{", "}") + 1] if rest.lstrip().startswith("{") else \
            rest.split(";", 1)[0]
        if not re.search(r"\bfor\s*\(", body):
            innermost = header
    parts = innermost.split(";") if innermost else []
    bounds = [b for b in ("n_in", "n_out", "B") if len(parts) == 3 and re.search(rf"\b{b}\b", parts[1])]
    return bounds[0] if len(bounds) == 1 else None


@recorded
def loop_interchange(source: str, name: str = "outer_acc", repeat: int = 7) -> None:
    """Lab 03: ``outer_acc(d, x, g, B, n_out, n_in)`` adds sum_s d_s x_s^T into g (n_out, n_in), with loops in an order
    whose inner loop walks along a row. Checked for values (with the sanitizers) and for speed against the naive order."""
    ex = "loop interchange"
    source = capture.source(source)
    checked = _compile(ex, source, name, helpers=False, label="checked", opt="-O1", checked=True)
    rng = np.random.default_rng(capture.seed(0))
    n = 0
    for B, n_out, n_in in each_case(((1, 1, 1), (3, 5, 7), (10, 30, 784)), more=1):  # then its speed
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
    # the verdict: cachegrind's exact count of memory instructions, the same in every run however busy the machine;
    # without Valgrind, the loop the source puts innermost, and the time
    counts = capture.step("counts", lambda: _access_counts(source, name))
    attempts = 1 if counts else 3

    def timed():  # the student's process measures; the grader reads the two medians
        naive = hostc.load(NAIVE_OUTER, opt="-O3").get_function("outer_acc")
        mine = getattr(yours, "unrecorded", yours)  # timing calls are not recorded one by one
        B, n_out, n_in = 32, 100, 784
        d, x = rng.standard_normal((B, n_out), dtype=np.float32), rng.standard_normal((B, n_in), dtype=np.float32)
        g = np.zeros((n_out, n_in), np.float32)
        args = (d, x, g, np.int32(B), np.int32(n_out), np.int32(n_in))
        best = None
        for _attempt in range(attempts):  # a busy moment (a neighbour's vector work on the other core) can slow the
            # row order alone for a whole measurement (seen: 0.74 ms against its usual 0.23); measured again, the best
            # kept. The naive order stays about 1.0x in every attempt, so a wrong order does not pass by luck.
            t = interleaved({k: (lambda f=f: measure(lambda: f(*args), repeat=repeat).median)
                             for k, f in (("naive", naive), ("yours", mine))}, rounds=3)
            pair = float(t["naive"].median), float(t["yours"].median)
            if best is None or pair[0] / pair[1] > best[0] / best[1]:
                best = pair
            if best[0] / best[1] >= 1.5:
                break
        return best

    t_naive, t_yours = capture.step("timing", timed)
    speedup = t_naive / t_yours
    if counts:
        _judge_counts(ex, counts, (t_naive, t_yours))
        passed(f"{ex} ({counts['yours']['Dr'] + counts['yours']['Dw']:,} memory instructions, "
               f"{speedup:.1f}x faster than the naive order)", n + 1)
        return
    print(f"naive order {t_naive * 1e3:.2f} ms, yours {t_yours * 1e3:.2f} ms: {speedup:.2f}x")
    inner = _innermost_bound(source)
    if inner in ("n_out", "B"):
        fail(ex, f"your innermost loop runs to {inner}, not along a row: each step of it jumps a whole row of "
                 f"{'g' if inner == 'n_out' else 'x'} (n_in floats) ahead, so no two of its accesses share a cache "
                 "line and the compiler cannot load 8 floats at once", "make j (along a row of g and of x) the inner "
                 "loop; the other two may come in either order")
    if speedup < 1.5:  # clearly faster
        fail(ex, f"your loop order is not clearly faster than the naive one ({speedup:.2f}x; at least 1.5x expected)",
             "make j (along a row of g and of x) the inner loop, and keep d[s][i] and the row pointers in local "
             "variables outside it, so the compiler can vectorise the inner loop")
    passed(f"{ex} ({speedup:.1f}x faster than the naive order)", n + 1)


BATCH = 601  # the samples of omp_reduction's runs


@recorded
def omp_reduction(source: str, name: str = "my_bp_omp", runs: int = 6) -> None:
    """Lab 03: ``my_bp_omp`` (the signature of labkit's bp_* functions) parallelises network.py's per-sample backprop
    over the samples with OpenMP, combining the gradients without a race. Run with the sanitizers first, then at 1 to
    2x-cores threads, ``runs`` times each, against the NumPy reference."""
    ex = "OpenMP reduction"
    source = capture.source(source)
    if isinstance(source, str) and KERNEL_TODO not in source and "#pragma omp" not in source:
        fail(ex, "your code has no OpenMP directive", "parallelise the loop over the samples with #pragma omp parallel "
              "(and omp for), and combine the gradients with a reduction")
    checked = _compile(ex, source, name, helpers=True, label="checked", opt="-O1", openmp=True, checked=True)
    fast = _compile(ex, source, name, helpers=True, label="O2", opt="-O2", openmp=True)
    rng = np.random.default_rng(capture.seed(1))
    params = mlp.init_params([784, 30, 10], seed=3)
    # enough samples per thread that a race loses updates in some run: at 37, one CI run in about ten saw none; at
    # 151, a run with three test workers on 2 cores saw none (each thread's share fitted in one time slice, so the
    # threads took turns); BATCH lasts several slices
    B = BATCH
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
    seen = _watch(ex, source, name, (W1, b1, W2, b2, x, Y), threads, race="Give every thread its own accumulators: "
                  "reduction(+ : cost, gW1[:n], ...) on the parallel region, with every gradient array and its length")
    n = 2
    for p in each_case(threads):
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
    _not_one_at_a_time(ex, seen, "omp critical (or atomic, ordered, a lock) around each sample's work lets one "
                       "thread in at a time. Let every thread add into gradients of its own, and combine them once at "
                       "the end" if _takes_turns(source) else "share the loop over the samples out among the threads: "
                       "#pragma omp parallel for (or omp for inside a parallel region)")
    passed(f"{ex} at {', '.join(map(str, threads))} threads", n + 1)


_TURNS = re.compile(r"#\s*pragma\s+omp\s+(?:critical|atomic|ordered)\b|\bomp_set_lock\s*\(")


def _takes_turns(source: str) -> bool:
    """Whether the source lets one thread at a time into some region (critical, atomic, ordered or a lock)."""
    return bool(_TURNS.search(strip_comments(source)))


# Compiled before sample.h in the checks' watched build: inside add_sample, how many threads were there at once, and
# whether two of them added into the same gradient arrays then; and a rendezvous, which makes a team's threads meet
# there instead of hoping a busy scheduler runs them at the same moment. Once armed, the first thread in waits until
# a second is inside too, or labkit_wait_ seconds pass: code whose threads run side by side meets within microseconds,
# and code that lets one thread in at a time (critical, a lock, one thread doing every sample) never does.
OVERLAP = r"""#line 1 "labkit-overlap.h"
#include <sched.h>
#include <time.h>
#define WATCH_SLOTS 512
static int labkit_inside_, labkit_most_, labkit_shared_, labkit_armed_;
static const void* labkit_acc_[WATCH_SLOTS];
static double labkit_wait_ = 2.0;
static double labkit_now_(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static int labkit_in_(const void* acc)
{
    const int now = __atomic_add_fetch(&labkit_inside_, 1, __ATOMIC_SEQ_CST);
    int most = __atomic_load_n(&labkit_most_, __ATOMIC_SEQ_CST), slot = -1;
    while (now > most && !__atomic_compare_exchange_n(&labkit_most_, &most, now, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    for (int i = 0; i < WATCH_SLOTS && slot < 0; ++i) {
        const void* none = 0;
        if (__atomic_compare_exchange_n(&labkit_acc_[i], &none, acc, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) slot = i;
    }
    for (int i = 0; i < WATCH_SLOTS; ++i)  /* each sees the other: both stored before they load (sequential order) */
        if (i != slot && __atomic_load_n(&labkit_acc_[i], __ATOMIC_SEQ_CST) == acc)
            __atomic_store_n(&labkit_shared_, 1, __ATOMIC_SEQ_CST);
    if (__atomic_exchange_n(&labkit_armed_, 0, __ATOMIC_SEQ_CST)) {
        const double end = labkit_now_() + labkit_wait_;
        while (__atomic_load_n(&labkit_inside_, __ATOMIC_SEQ_CST) < 2 && labkit_now_() < end) sched_yield();
    }
    return slot;
}
static void labkit_out_(int slot)
{
    if (slot >= 0) __atomic_store_n(&labkit_acc_[slot], (const void*)0, __ATOMIC_SEQ_CST);
    __atomic_sub_fetch(&labkit_inside_, 1, __ATOMIC_SEQ_CST);
}
#define SAMPLE_WATCH_IN(accumulators) labkit_in_(accumulators)
#define SAMPLE_WATCH_OUT(slot) labkit_out_(slot)
/* the most threads inside at once and (times 1000) whether two of them shared gradient arrays, since the last call;
   arm > 0: the next thread in waits up to arm seconds for a second one */
int labkit_watched(double arm)
{
    const int seen = __atomic_exchange_n(&labkit_most_, 0, __ATOMIC_SEQ_CST)
                     + 1000 * __atomic_exchange_n(&labkit_shared_, 0, __ATOMIC_SEQ_CST);
    if (arm > 0) { labkit_wait_ = arm; __atomic_store_n(&labkit_armed_, 1, __ATOMIC_SEQ_CST); }
    return seen;
}
"""
RENDEZVOUS_S = 2.0  # how long a thread waits inside add_sample for a second one: ample beside a busy neighbour


def _inside_at_once(ex: str, source: str, name: str, arrays, threads: list[int], runs: int) -> tuple[int, bool]:
    """(the most threads inside labkit's add_sample at the same moment, whether two of them added into the same
    gradient arrays then) over ``runs`` calls at each of ``threads``, the student's code built with :data:`OVERLAP`,
    whose rendezvous makes the threads of a team that run side by side meet there."""
    module = hostc.CModule(OVERLAP + openmp.with_helpers(source, "yours.c"), "yours.c", opt="-O2", openmp=True)
    fn, watched = module.get_function(name), module.get_function("labkit_watched")
    W1, b1, W2, b2, x, Y = arrays
    B, n_hid, n_out = len(x), len(b1), len(b2)
    most, shared = 0, False
    watched(np.float64(0))
    for p in threads:
        for k in range(runs):
            if k == 0:
                watched(np.float64(RENDEZVOUS_S))  # once per team size: a team that takes turns waits it out once
            out = [np.zeros_like(w) for w in (W1, b1, W2, b2)]
            _call(ex, fn, (W1, b1, W2, b2, x, Y, np.int32(B), np.int32(x.shape[1]), np.int32(n_hid), np.int32(n_out),
                           *out), "each thread needs its own work array, and every index must stay inside its array",
                  f"with {p} threads: ", threads=p)
            seen = int(watched(np.float64(0)))
            most, shared = max(most, seen % 1000), shared or seen >= 1000
    return most, shared


def _watch(ex: str, source: str, name: str, arrays, threads: list[int], race: str) -> tuple[int, str]:
    """Fail a race (two threads inside add_sample at once, adding into the same gradient arrays: a verdict no
    scheduler can flip) with the hint ``race``; else (the most threads seen inside at once, the runs it watched)."""
    many, runs = [p for p in threads if p > 1], 2
    most, shared = capture.step("overlap", lambda: _inside_at_once(ex, source, name, arrays, many, runs))
    watched = f"{runs * len(many)} runs at {', '.join(map(str, many))} threads"
    if shared:
        fail(ex, f"a race: in {watched}, two threads were inside add_sample at the same moment, adding into the "
                 "same gradient arrays. It loses an update only when both write one entry at once, so a run may "
                 "still come out right", race)
    return most, watched


def _not_one_at_a_time(ex: str, seen: tuple[int, str], alone: str) -> None:
    """Fail samples run one at a time: never two threads inside add_sample, though the check waited for a second."""
    most, watched = seen
    if most <= 1:
        fail(ex, f"in {watched} no two threads were ever inside add_sample at the same time, though the check held "
                 f"the first one there for {RENDEZVOUS_S:g} s to wait for a second: the samples ran one at a time",
             alone)


# Compiled between sample.h and the student's code in the reduction-by-hand check. The memory their malloc returns is
# NaN bytes: malloc's memory holds whatever was there (zeros on a fresh page, an earlier call's sums when reused), so a
# block never zeroed is wrong every time here, not only now and then. Every allocation of theirs is kept with its line
# until it is freed (labkit_leaked), and add_sample notes the size of the team it ran in (labkit_team).
DIRTY_MALLOC = r"""#line 1 "labkit-check.h"
#define TRACKED_MAX 8192
static struct { void* p; int line; } labkit_live_[TRACKED_MAX];
static int labkit_live_lock_, labkit_team_most_, labkit_team_least_ = 1 << 30;
static void labkit_note_(void* p, void* gone, int line)
{
    while (__atomic_test_and_set(&labkit_live_lock_, __ATOMIC_ACQUIRE)) {}
    for (int i = 0; gone && i < TRACKED_MAX; ++i)
        if (labkit_live_[i].p == gone) { labkit_live_[i].p = 0; break; }
    for (int i = 0; p && i < TRACKED_MAX; ++i)
        if (!labkit_live_[i].p) { labkit_live_[i].p = p; labkit_live_[i].line = line; break; }
    __atomic_clear(&labkit_live_lock_, __ATOMIC_RELEASE);
}
int labkit_leaked(int* lines, int room)
{
    int n = 0;
    for (int i = 0; i < TRACKED_MAX; ++i)
        if (labkit_live_[i].p) { if (n < room) lines[n] = labkit_live_[i].line; ++n; labkit_live_[i].p = 0; }
    return n;
}
int labkit_team(int* least)
{
    const int most = labkit_team_most_;
    *least = labkit_team_most_ ? labkit_team_least_ : 0;
    labkit_team_most_ = 0;
    labkit_team_least_ = 1 << 30;
    return most;
}
__attribute__((unused)) static void* labkit_dirty_malloc(size_t n, int line)
{ void* p = malloc(n); if (p) memset(p, 0xff, n); labkit_note_(p, 0, line); return p; }
__attribute__((unused)) static void* labkit_dirty_aligned_alloc(size_t a, size_t n, int line)
{ void* p = aligned_alloc(a, n); if (p) memset(p, 0xff, n); labkit_note_(p, 0, line); return p; }
__attribute__((unused)) static void* labkit_calloc(size_t k, size_t n, int line)
{ void* p = calloc(k, n); labkit_note_(p, 0, line); return p; }
__attribute__((unused)) static void* labkit_realloc(void* q, size_t n, int line)
{ void* p = realloc(q, n); if (p || !n) labkit_note_(p, q, line); return p; }
__attribute__((unused)) static void labkit_free(void* p) { labkit_note_(0, p, 0); free(p); }
__attribute__((unused)) static double labkit_sample(const float* W1, const float* b1, const float* W2, const float* b2,
    const float* xs, const float* ys, int n_in, int n_hid, int n_out, float* work, float* gW1, float* gb1, float* gW2,
    float* gb2)
{
    const int team = omp_get_num_threads();
    int most = __atomic_load_n(&labkit_team_most_, __ATOMIC_RELAXED);
    while (team > most && !__atomic_compare_exchange_n(&labkit_team_most_, &most, team, 1, __ATOMIC_RELAXED,
                                                       __ATOMIC_RELAXED)) {}
    int least = __atomic_load_n(&labkit_team_least_, __ATOMIC_RELAXED);
    while (team < least && !__atomic_compare_exchange_n(&labkit_team_least_, &least, team, 1, __ATOMIC_RELAXED,
                                                        __ATOMIC_RELAXED)) {}
    return add_sample(W1, b1, W2, b2, xs, ys, n_in, n_hid, n_out, work, gW1, gb1, gW2, gb2);
}
#define malloc(n) labkit_dirty_malloc(n, __LINE__)
#define aligned_alloc(a, n) labkit_dirty_aligned_alloc(a, n, __LINE__)
#define calloc(k, n) labkit_calloc(k, n, __LINE__)
#define realloc(q, n) labkit_realloc(q, n, __LINE__)
#define free(p) labkit_free(p)
#define add_sample(...) labkit_sample(__VA_ARGS__)
#line 1 "yours.c"
"""
# Appended after the student's code: their function called where no parallel region may be active (as inside
# another region, once nesting is used up). A region in it then gets one thread, while omp_get_max_threads() still
# says the run's count.
NESTED = r"""
#line 1 "labkit-check-nested.c"
double labkit_nested(const float* W1, const float* b1, const float* W2, const float* b2, const float* x, const float* y,
                     int B, int n_in, int n_hid, int n_out, float* gW1, float* gb1, float* gW2, float* gb2)
{
    const int levels = omp_get_max_active_levels();
    omp_set_max_active_levels(0);
    const double cost = NAME(W1, b1, W2, b2, x, y, B, n_in, n_hid, n_out, gW1, gb1, gW2, gb2);
    omp_set_max_active_levels(levels);
    return cost;
}
"""
LARGE_TEAM = 100  # above the 8, 16 or 64 threads a buffer of fixed size is made for
# what a reduction by hand may not use: OpenMP's own reduction (a simd loop's is allowed: it is not between threads)
# and anything that lets one thread at a time add into a shared sum
_BUILT_IN = ((re.compile(r"#\s*pragma\s+omp\s+(?!simd\b)[^\n]*\breduction\s*\("), "a reduction clause"),
             (re.compile(r"#\s*pragma\s+omp\s+atomic\b"), "omp atomic"),
             (re.compile(r"#\s*pragma\s+omp\s+critical\b"), "omp critical"),
             (re.compile(r"#\s*pragma\s+omp\s+(?:[\w\s]*\s)?ordered\b"), "omp ordered"),
             (re.compile(r"\bomp_(?:init|set|unset|test|destroy)_(?:nest_)?lock\s*\(|\bomp_(?:nest_)?lock_t\b"),
              "an OpenMP lock"))
_WORKSHARED_LOOP = re.compile(r"#\s*pragma\s+omp\s+(?:parallel\s+)?for\b")
_COST_RACE = re.compile(r"(?<![\w.\]>])cost\s*(?:\+=|=\s*cost\s*\+)\s*add_sample\s*\(")
_SAMPLES_NOWAIT = re.compile(r"#\s*pragma\s+omp\s+for\b[^\n]*\bnowait\b[^#]*\badd_sample\s*\(")  # no barrier
_COST_DECLARED = re.compile(r"\bdouble\b[^;(){}]*\bcost\b")
_SAMPLES_SHARED = re.compile(r"#\s*pragma\s+omp\s+(?:parallel\s+)?for\b[^#]*\badd_sample\s*\(")


def _cost_race(code: str) -> bool:
    """Whether the samples' costs are added into the function's one shared ``cost`` (declared once: no private
    ``cost`` of a thread's own shadows it), a race that loses an update only now and then."""
    return bool(_COST_RACE.search(code)) and len(_COST_DECLARED.findall(code)) <= 1



def _teams_and_leaks(fast, run, counts: list[int]) -> list[list]:
    """[threads asked, the largest and the smallest team add_sample ran in, the lines of the allocations left] for
    one call at each of ``counts`` threads: the counters DIRTY_MALLOC compiles in, read after each call."""
    module = getattr(fast, "unrecorded", fast).module
    team, leaked = module.get_function("labkit_team"), module.get_function("labkit_leaked")
    least, lines = np.zeros(1, np.int32), np.zeros(256, np.int32)
    team(least), leaked(lines, np.int32(len(lines)))  # what the earlier calls left
    rows = []
    for p in counts:
        run(p)
        most = int(team(least))
        left = int(leaked(lines, np.int32(len(lines))))
        rows.append([p, most, int(least[0]), [int(v) for v in lines[:min(left, len(lines))]]])
    return rows


def _team_as_asked(ex: str, rows) -> None:
    """Fail code whose samples ran in a team of another size than the threads asked for (the count ignored)."""
    asked = [p for p, most, _, _ in rows if most]  # add_sample not called: nothing to say
    ran = [f"{most}" if most == least else f"{least}-{most}" for p, most, least, _ in rows if most]
    if all(most == least == p for p, most, least, _ in rows if most):
        return
    where = (f"asked for {', '.join(map(str, asked))} threads (as any caller does: omp_set_num_threads, or "
             f"OMP_NUM_THREADS), your samples ran in teams of {', '.join(ran)}")
    if all(most == 1 for _, most, _, _ in rows if most):
        fail(ex, f"the values are right, but {where}: your code runs on one thread",
             "omp for shares out a loop only among the threads of a team: outside a #pragma omp parallel region "
             "there is a team of one. Open the team with #pragma omp parallel")
    fail(ex, f"the values are right, but {where}: your code sets the size of its team itself, and ignores the count "
             "it is asked for", "leave the team's size to the caller: num_threads(...) with a number of your own, "
         "omp_set_num_threads() or omp_get_num_procs() in your function override it")


def _freed(ex: str, rows) -> None:
    """Fail code that leaves memory allocated after a call, naming the lines of the allocations."""
    for p, _, _, lines in rows:
        if lines:
            at = ", ".join(f"{k} from line {line}" for line, k in sorted(Counter(lines).items()))
            fail(ex, f"the values are right, but after one call with {p} thread{'s' if p > 1 else ''} {len(lines)} "
                 f"allocation{'s' if len(lines) > 1 else ''} of your code {'were' if len(lines) > 1 else 'was'} never "
                 f"freed ({at}): memory not freed, lost again at every call (a training run calls this once per "
                 "batch)", "every malloc or calloc needs its free once the memory is no longer used: a thread's own "
                 "arrays before it leaves the parallel region, the shared ones after it")


def _smaller_team(ex: str, result, cost: float, asked: int, right) -> None:
    """Fail code that is wrong when its parallel region gets fewer threads than omp_get_max_threads() said."""
    c, out = result
    if np.isclose(c, cost, rtol=1e-4) and right(out):
        return
    got = "NaN in the gradients" if any(np.isnan(o).any() for o in out) else (
        "a wrong cost" if right(out) else "wrong gradients")
    fail(ex, f"{got} when the team is smaller than asked for: the check called your function as if from inside "
             "another parallel region (no more levels of teams allowed), where the region in your function gets 1 "
             f"thread while omp_get_max_threads() still says {asked}. Your code counts on every thread it asked for "
             "having run: the blocks or the costs of threads that never ran hold whatever malloc left there",
         "a parallel region may get fewer threads than asked for (inside another region, under OMP_THREAD_LIMIT or "
         "OMP_DYNAMIC): size the buffer by the team that did start, omp_get_num_threads() inside the region, or zero "
         "every block and cost before the region")


@recorded
def reduction_by_hand(source: str, name: str = "my_bp_private", runs: int = 6) -> None:
    """Lab 03: ``my_bp_private`` (``my_bp_omp``'s signature) is what ``reduction(+ : ...)`` does inside, written out:
    each thread adds its samples into a zeroed private block of one shared buffer, and after the samples the threads
    combine the blocks into gW1, gb1, gW2, gb2, split over the entries; the cost likewise. No reduction clause,
    atomic, critical, ordered or lock. Run with the sanitizers first, in a team of LARGE_TEAM threads (larger than a
    buffer of fixed size holds), then at 1 to 2x-cores threads, ``runs`` times each, and once where its region gets
    fewer threads than omp_get_max_threads() says, against the NumPy reference, with the memory malloc returns filled
    with NaN; then the team its samples ran in must be the size asked for, and all it allocated freed."""
    ex = "reduction by hand"
    source = capture.source(source)
    code = strip_comments(source) if isinstance(source, str) and KERNEL_TODO not in source else None
    if code is not None:
        if not re.search(r"#\s*pragma\s+omp\b", code):
            fail(ex, "your code has no OpenMP directive", "open a team of threads with #pragma omp parallel, and "
                 "share out the samples among them with #pragma omp for")
        used = [what for pattern, what in _BUILT_IN if pattern.search(code)]
        if used:
            fail(ex, f"your code uses {' and '.join(used)}: this exercise builds the reduction itself, so OpenMP's "
                 "reduction clause, atomic, critical, ordered and locks are out", "give every thread a block of its "
                 "own to add into, and combine the blocks after the samples, each entry by one thread")
    dirty = source
    if isinstance(source, str):
        dirty = DIRTY_MALLOC + source + (NESTED.replace("NAME", name) if code and re.search(rf"\b{name}\s*\(", code)
                                         else "")
    checked = _compile(ex, dirty, name, helpers=True, label="checked", opt="-O1", openmp=True, checked=True)
    fast = _compile(ex, dirty, name, helpers=True, label="O2", opt="-O2", openmp=True)
    rng = np.random.default_rng(capture.seed(2))
    params = mlp.init_params([784, 30, 10], seed=3)
    B = 151  # enough samples per thread that a race loses updates in some run
    x = rng.random((B, 784), dtype=np.float32)
    Y = mlp.targets(rng.integers(0, 10, B), 10, np.float32)
    loss, grads = mlp.loss_and_grads_per_sample(params, x, Y)
    want = [g * B for pair in grads for g in pair]
    names = ("gW1", "gb1", "gW2", "gb2")
    (W1, b1), (W2, b2) = params
    threads = capture.step("threads", lambda: sorted({1, 2, usable_cores(), 2 * usable_cores()}))
    print(f"{ex}: gW1..gb2 and the cost of a [784, 30, 10] network on {B} samples against NumPy, once under the "
          f"sanitizers with {LARGE_TEAM} threads, {runs} times at each of {', '.join(map(str, threads))} threads and "
          "once in a team smaller than asked for; then the size of the team your samples ran in, and the memory your "
          "code left allocated")

    def call(fn, threads, fill=np.nan, hint="thread t's block is total floats from t * total, and the buffer must "
             "hold one block per thread of the team", where=""):
        out = [np.full_like(w, fill) for w in want]  # NaN: nothing carried over, the function must overwrite
        cost = _call(ex, fn, (W1, b1, W2, b2, x, Y, np.int32(B), np.int32(784), np.int32(30), np.int32(10), *out),
                     hint, where, threads=threads)
        return cost, out

    def right(out):
        return all(np.allclose(o, w, rtol=1e-3, atol=1e-5) for o, w in zip(out, want))

    # an access out of bounds or undefined behaviour stops here, with the line; a team larger than any fixed size
    call(checked, LARGE_TEAM, hint=f"the check ran your code with a team of {LARGE_TEAM} threads: thread t's block is "
         "total floats from t * total, and every buffer must hold one block (and one cost) per thread of the team, "
         "however many that is. A buffer of a fixed size (blocks[8], costs[64]) or one sized by the cores overflows "
         "in a larger team", where=f"with a team of {LARGE_TEAM} threads: ")
    n = 1
    if code is not None and _cost_race(code):  # before any run: a race named by the code, not by a lost update
        fail(ex, "every thread adds its samples' cost into the one shared cost (cost += add_sample(...)): a race on "
                 "the cost, which loses an update only now and then", "sum the cost per thread, as the gradients: one "
                 "double per thread, all of them added into cost after the samples")
    seen = _watch(ex, source, name, (W1, b1, W2, b2, x, Y), threads, race="two threads add into the same block: does "
                  "every thread add only into its own block, from t * total, t its omp_get_thread_num()?")
    n += 1
    for p in each_case(threads):
        results = [call(fast, p) for _ in range(runs)]
        n += runs
        wrong = [i for i, (c, out) in enumerate(results) if not (np.isclose(c, loss * B, rtol=1e-4) and right(out))]
        if wrong:
            _name_the_mistake(ex, code or "", p, runs, results, wrong, want, loss * B, names,
                              lambda p=p: call(fast, p, fill=0.0), right)
    if "labkit_nested" in (dirty if isinstance(dirty, str) else ""):
        nested = _compile(ex, dirty, "labkit_nested", helpers=True, label="O2 nested", opt="-O2", openmp=True)
        _smaller_team(ex, call(nested, threads[-1]), loss * B, threads[-1], right)
        n += 1
    rows = capture.step("team", lambda: _teams_and_leaks(fast, lambda p: call(getattr(fast, "unrecorded", fast), p),
                                                         [*threads, LARGE_TEAM]))
    _team_as_asked(ex, rows)
    _freed(ex, rows)
    _not_one_at_a_time(ex, seen, "omp single or master lets one thread do the work its block holds; put the loop over "
                       "the samples under #pragma omp for, so the threads share it out")
    n += 3
    if code is not None:
        if len(_WORKSHARED_LOOP.findall(code)) < 2:
            fail(ex, "the values are right, but your source has one loop shared out with omp for: the combine of "
                     "the blocks runs on one thread (or every thread does all of it)",
                 "the combine is a loop over the gradient entries: put it under #pragma omp for too, each entry "
                 "summed over the threads' blocks by one thread")
        n += 2
    passed(f"{ex} at {', '.join(map(str, threads))} threads", n)


def _name_the_mistake(ex, code, p, runs, results, wrong, want, cost, names, rerun_zeroed, right) -> None:
    """Fail reduction_by_hand with what the wrong runs at ``p`` threads show: NaN left in the gradients (arrays
    never written, added into, or blocks never zeroed, told apart by a run on zeroed arrays), a lost cost, every
    thread running every sample, a race, or a missing barrier before the combine."""
    c, out = results[wrong[0]]
    where = f"with {p} thread{'s' if p > 1 else ''}, {len(wrong)} of {runs} runs gave a wrong gradient or cost"
    if any(np.isnan(o).any() for o in out):
        c0, out0 = rerun_zeroed()  # the same call on gradients that arrive as zeros instead of NaN
        if right(out0):
            fail(ex, f"{where}: NaN in the gradients, which are right when gW1..gb2 arrive holding zeros: your code "
                     "adds into them", "gW1, gb1, gW2 and gb2 arrive holding anything (here NaN): the combine must "
                     "write each entry (=), or zero the arrays first")
        never = [k for k, (o, o0) in enumerate(zip(out, out0)) if np.isnan(o).all() and not o0.any()]
        if never:
            fail(ex, f"{where}: {', '.join(names[k] for k in never)} never written (still the NaN the check filled "
                     "them with): the private blocks were not combined into them",
                 "after the samples, every entry of gW1, gb1, gW2 and gb2 is the sum of that entry over the threads' "
                 "blocks: the combine writes all four arrays")
        fail(ex, f"{where}: NaN in the gradients. The check fills the memory malloc gives your code with NaN: "
                 "malloc's memory holds whatever was there before, so a block never zeroed adds onto garbage",
             "zero the blocks before the samples are added into them: calloc zeroes what it allocates, or memset")
    if right(out):
        if len({float(r[0]) for r in results}) > 1 or _cost_race(code):
            fail(ex, f"{where}: the gradients are right, but the cost changes from run to run: a race on the cost",
                 "every thread adds its samples' cost into the one shared cost and loses updates. Sum the cost per "
                 "thread, as the gradients: one double per thread, all of them added into cost after the samples")
        fail(ex, f"{where}: the gradients are right, but the cost is " + (
            "0: the threads' costs were never added into it" if c == 0 else
            f"{c / cost:.3g} of the reference: not every thread's cost was added, once"),
             "sum the cost per thread, as the gradients: one double per thread, all of them added into cost after "
             "the samples")
    if p > 1 and not _SAMPLES_SHARED.search(code):
        fail(ex, f"{where}: your loop over the samples is not under omp for, so every thread runs every sample, and "
                 "nothing makes the combine wait until all the threads have finished theirs",
             "#pragma omp for on the loop over the samples shares them out among the threads, and the end of omp for "
             "is a barrier: after it, every block is complete")
    if p == 1:
        fail(ex, f"{where} even with one thread", "with one thread your buffer is one block: the samples add into it, "
             "and the combine copies it into gW1, gb1, gW2 and gb2 at their offsets (0, nW1, nW1 + n_hid, ...); check "
             "those offsets against add_sample's arguments")
    if _SAMPLES_NOWAIT.search(code):
        fail(ex, f"{where}: the combine starts before every thread has finished its samples",
             "nowait takes away the barrier at the end of omp for: without it a thread combines entries of blocks "
             "that other threads are still adding into. The combine must wait for all the samples")
    first = results[0][1][0].ravel()
    if any(not np.array_equal(first, o[0].ravel()) for _, o in results[1:]):
        fail(ex, f"{where}, and the runs differ from each other: a race",
             "two threads add into the same entries at the same time and lose updates: does every thread add only "
             "into its own block, thread t's from t * total? And does the combine start only after the samples?")
    ratio = float(np.sum(out[0]) / np.sum(want[0])) if np.sum(want[0]) else float("nan")
    fail(ex, f"{where} (the first layer's gradient sums to {ratio:.2f} of the reference)",
         "every entry of the result is the sum of that entry over all the threads' blocks: are all p blocks combined, "
         "and is each block laid out as add_sample filled it?")


EXERCISES = (
    Exercise("simd_forward", "03", "openmp", hints=(
        "One row at a time: row i of W is n_in contiguous floats starting at W + i * n_in, and z_i is its dot product "
        "with x, plus b[i]. Fuse the three steps into one pass per row: start a sum at b[i], add the products, then "
        "store a[i] = sigmoid(sum).",
        "The dot product is one loop over j along contiguous memory. Vectorising it means running several j at once, "
        "one per vector lane: #pragma omp simd on the line before that loop tells the compiler it may.",
        "The lanes all add into the one running sum: a race between lanes, unless each lane keeps a partial sum of its "
        "own that the compiler adds up after the loop. Name the sum in a reduction(+ : ...) clause of the pragma.",
    )),
    Exercise("loop_interchange", "03", "openmp", hints=(
        "Write down what each index walks through in memory. g (n_out, n_in), d (B, n_out) and x (B, n_in) are "
        "row-major: consecutive j are neighbours in g and in x; consecutive s are a whole row apart in d and x.",
        "The three loops may run in any order: every (i, j, s) adds one product into g[i][j], and additions commute. "
        "Choose the order whose innermost loop walks along a row: j innermost.",
        "For each row i of g, for each sample s, add d[s][i] times the row x[s] to the row g[i]. d[s][i] is one number "
        "for the whole inner loop: keep it, and the two row pointers, in local variables outside the inner loop, so "
        "the compiler can vectorise the inner loop.",
    )),
    Exercise("omp_reduction", "03", "openmp", sources=(("c/backprop.c", "bp_omp_reduction"),), hints=(
        "The samples are independent: #pragma omp parallel opens a team of threads, and #pragma omp for on the loop "
        "over s splits the samples among them. add_sample needs a work array of 2 * n_hid floats per thread: "
        "allocate it inside the parallel region, so each thread has its own.",
        "Every thread adds into the same gW1, gb1, gW2, gb2 and cost: a race, which loses updates. Give each thread "
        "private accumulators that OpenMP adds up once at the end: a reduction(+ : ...) clause on the parallel region.",
        "A reduction over an array needs the array's length, as an array section: gW1[:nW1]. Name the cost and all "
        "four gradient arrays in the clause, each with its length (nW1, n_hid, nW2, n_out).",
    )),
    Exercise("reduction_by_hand", "03", "openmp", hints=(
        "A reduction clause gives every thread private copies of the sums, zeroed; the thread adds into its copies; at "
        "the end the copies are added up into the originals. Build the copies as one buffer of p blocks: thread t's "
        "block starts at t * total and holds its gW1, gb1, gW2 and gb2 one after the other.",
        "p, the size of the team: omp_get_max_threads() before the parallel region is what the region will get (ask "
        "for it with num_threads(p)). Or let one thread allocate inside the region, under #pragma omp single, with "
        "omp_get_num_threads(): the end of single is a barrier, so every thread then sees the pointer. calloc zeroes "
        "what it allocates; malloc does not.",
        "Inside the region, omp_get_thread_num() is t. In the loop over the samples, under #pragma omp for, give "
        "add_sample the four parts of the thread's own block (from mine, mine + nW1, mine + nW1 + n_hid, ...) and a "
        "work array of its own. The costs the same way: an array of p doubles, thread t adding into its entry t.",
        "The end of omp for waits for every thread: after it, every block is complete. The combine is a second loop "
        "under #pragma omp for, over the total entries: entry e is the sum over u < p of the buffer at u * total + e, "
        "written into gW1, gb1, gW2 or gb2 at e minus that array's offset. Each entry has one writer: no race.",
        "After the parallel region, add the p costs into cost, and free what you allocated.",
    )),
)
