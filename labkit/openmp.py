"""network.py's per-sample backprop in C (``labkit/c/backprop.c``), single-threaded in the versions the course's C
program went through, and over OpenMP threads in three ways of combining the gradients.

    loss, grads = openmp.backprop_c(params, x, Y, version="fused", opt="-O2")
    loss, grads = openmp.backprop_c(params, x, Y, version="omp_reduction", threads=2)

Like :func:`labkit.mlp.loss_and_grads_per_sample` with a sigmoid network of one hidden layer and the quadratic
cost, but the loss and gradients are *summed* over the batch, as network.py's ``update_mini_batch`` sums them.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from . import bench, hostc, mlp
from .cpu_parallel import ThreadedBackprop

SOURCE = Path(__file__).resolve().parent / "c" / "backprop.c"
HELPERS = Path(__file__).resolve().parent / "c" / "sample.h"  # add_sample and zero_grads, for labkit's code and yours
VERSIONS = ("naive", "interchanged", "hoisted", "fused", "simd")  # one single-thread optimisation at a time
OMP_VERSIONS = ("omp_atomic", "omp_critical", "omp_reduction")    # OpenMP over samples: how the gradients combine


def with_helpers(source: str, filename: str) -> str:
    """C source preceded by sample.h (add_sample, add_sample_plain, zero_grads); a #line directive keeps the
    compiler's and the sanitizers' line numbers those of ``source`` itself."""
    return f'#line 1 "{HELPERS.name}"\n' + HELPERS.read_text() + f'\n#line 1 "{filename}"\n' + source


@functools.cache
def module(opt: str = "-O2", native: bool = False) -> hostc.CModule:
    """backprop.c compiled with OpenMP at one optimisation level (cached per process and on disk)."""
    return hostc.CModule(with_helpers(SOURCE.read_text(), SOURCE.name), SOURCE.name, opt=opt, openmp=True, native=native)


def _arrays(params, x, Y):
    """float32 C-contiguous arrays of a one-hidden-layer network and a batch, with its sizes, checked."""
    if len(params) != 2:
        raise ValueError(f"the C backprop takes a network with one hidden layer ([n_in, n_hid, n_out]), "
                         f"got {len(params)} layers")
    (W1, b1), (W2, b2) = params
    W1, b1, W2, b2, x, Y = (np.ascontiguousarray(a, dtype=np.float32) for a in (W1, b1, W2, b2, x, Y))
    n_hid, n_in = W1.shape
    n_out = W2.shape[0]
    if x.ndim != 2 or x.shape[1] != n_in or Y.shape != (x.shape[0], n_out) or W2.shape != (n_out, n_hid):
        raise ValueError(f"shapes do not fit a [{n_in}, {n_hid}, {n_out}] network: x {x.shape}, Y {Y.shape}, "
                         f"W2 {W2.shape}")
    return (W1, b1, W2, b2, x, Y), (np.int32(n_in), np.int32(n_hid), np.int32(n_out))


def train_epoch_c(params, x, Y, batch_size: int = 10, lr: float = 3.0, opt: str = "-O3", native: bool = True) -> float:
    """One epoch of mini-batch SGD entirely in C (``epoch_simd``: batches in order, no shuffling), updating the
    float32 ``params`` in place; returns the mean cost. The same steps as ``mlp.SGD`` on per-sample gradients."""
    for W, b in params:
        if W.dtype != np.float32 or b.dtype != np.float32 or not (W.flags.c_contiguous and b.flags.c_contiguous):
            raise TypeError("train_epoch_c updates the weights in place: they must be C-contiguous float32 arrays")
    (W1, b1, W2, b2, x, Y), (n_in, n_hid, n_out) = _arrays(params, x, Y)
    grads = [np.empty_like(a) for a in (W1, b1, W2, b2)]
    fn = module(opt, native).get_function("epoch_simd")
    (pW1, pb1), (pW2, pb2) = params
    cost = fn(pW1, pb1, pW2, pb2, x, Y, np.int32(len(x)), n_in, n_hid, n_out, np.int32(batch_size), np.float32(lr),
              *grads)
    return float(cost) / len(x)


def load_exercise(source: str, opt: str = "-O2", checked: bool = False) -> hostc.CModule:
    """Your C (the lab's exercise) compiled after sample.h, with OpenMP: its functions take backprop_c's ``function=``."""
    return hostc.CModule(with_helpers(source, "yours.c"), "yours.c", opt=opt, openmp=True, checked=checked)


def set_schedule(kind: str = "static", chunk: int = 0, opt: str = "-O2") -> None:
    """The loop schedule of the OpenMP versions (``schedule(runtime)``): static, dynamic or guided, with a chunk size
    (0: OpenMP's default for the kind). Applies to calls from this thread until set again."""
    kinds = {"static": 1, "dynamic": 2, "guided": 3}
    if kind not in kinds or not isinstance(chunk, int) or chunk < 0:
        raise ValueError(f"schedule must be one of {', '.join(kinds)} with a chunk >= 0, got {kind!r}, {chunk!r}")
    module(opt).get_function("set_schedule")(np.int32(kinds[kind]), np.int32(chunk))


def backprop_c(params, x, Y, version: str = "fused", opt: str = "-O2", threads: int | None = None,
               native: bool = False, function: hostc.CFunction | None = None
               ) -> tuple[float, list[tuple[np.ndarray, np.ndarray]]]:
    """Summed quadratic cost and summed gradients of a [n_in, n_hid, n_out] sigmoid network over the batch, by one
    of the C versions (:data:`VERSIONS`, :data:`OMP_VERSIONS`), or by ``function``, a C function with the same
    parameters (yours, from :func:`load_exercise`); ``threads`` for the OpenMP ones."""
    if function is None and version not in VERSIONS + OMP_VERSIONS:
        raise ValueError(f"version must be one of {', '.join(VERSIONS + OMP_VERSIONS)}, got {version!r}")
    (W1, b1, W2, b2, x, Y), (n_in, n_hid, n_out) = _arrays(params, x, Y)
    grads = [(np.empty_like(W1), np.empty_like(b1)), (np.empty_like(W2), np.empty_like(b2))]
    fn = function or module(opt, native).get_function(f"bp_{version}")
    loss = fn(W1, b1, W2, b2, x, Y, np.int32(x.shape[0]), n_in, n_hid, n_out,
              grads[0][0], grads[0][1], grads[1][0], grads[1][1], threads=threads)
    return float(loss), grads


def without_simd(source: str) -> str:
    """``source`` with its ``#pragma omp simd`` lines taken out: the same loops, which the compiler must then run in
    the order written, one lane wide (a float sum may not be reordered unasked)."""
    return re.sub(r"(?m)^[ \t]*#\s*pragma\s+omp\s+simd\b[^\n]*$", "", source)


def time_simd(source: str, name: str = "layer_forward", n_out: int = 1000, n_in: int = 784, repeat: int = 25,
              rounds: int = 3) -> dict[str, float]:
    """Median seconds of lab 03's fused layer pass ``name(W, b, x, a, n_out, n_in)`` from ``source``, compiled at -O2
    as written and again :func:`without_simd`, timed side by side in interleaved rounds on an (n_out, n_in) layer."""
    rng = np.random.default_rng(0)
    W = rng.standard_normal((n_out, n_in), dtype=np.float32)
    b, x = rng.standard_normal(n_out, dtype=np.float32), rng.random(n_in, dtype=np.float32)
    a = np.empty(n_out, np.float32)
    args = (W, b, x, a, np.int32(n_out), np.int32(n_in))
    fns = {"with omp simd": load_exercise(source).get_function(name),
           "without": load_exercise(without_simd(source)).get_function(name)}
    t = bench.interleaved({k: (lambda f=f: bench.measure(lambda: f(*args, threads=1), repeat=repeat).median)
                           for k, f in fns.items()}, rounds)  # one thread: no team of idle OpenMP threads to wake
    return {k: v.median for k, v in t.items()}


def batch_times(runs: dict[str, dict], x, Y, repeat: int = 5, rounds: int = 3) -> dict[str, float]:
    """Median seconds of one :func:`backprop_c` call on the batch (x, Y) for each named run, measured side by side in
    ``rounds`` interleaved rounds of ``repeat`` calls. ``runs[name]`` holds backprop_c's keyword arguments, ``params``
    included, and may add ``schedule=(kind, chunk)`` for :func:`set_schedule` (set back to static afterwards)."""
    def job(kw):
        kw = dict(kw)
        schedule, params = kw.pop("schedule", None), kw.pop("params")

        def timed():
            if schedule is not None:
                set_schedule(*schedule)
            return bench.measure(lambda: backprop_c(params, x, Y, **kw), repeat=repeat).median
        return timed

    try:
        times = bench.interleaved({name: job(kw) for name, kw in runs.items()}, rounds)
    finally:
        if any("schedule" in kw for kw in runs.values()):
            set_schedule("static")
    return {name: t.median for name, t in times.items()}


SIMD_NATIVE = "C per-sample, one thread (simd, -O3 -march=native)"  # the C program at its best on one core


def line_up(params, x, Y, cores: int, repeat: int = 3, rounds: int = 3) -> dict[str, float]:
    """Lab 03's line-up of one batch's gradients: median seconds of NumPy's per-sample loop (lab 01), two Python
    threads (lab 02), the C program on one thread (simd at -O3 for this processor's vector width) and on two OpenMP
    threads, and NumPy's batched products on one
    BLAS thread and on ``cores``. All are measured side by side in at least 3 interleaved rounds of ``repeat`` calls, so
    that a slow spell of a shared machine lands on every entry of a round rather than deciding one ratio."""
    def timed(fn, blas=1):
        def job():
            with threadpool_limits(blas):
                return bench.measure(lambda: fn(params, x, Y), repeat=repeat).median
        return job

    with ThreadedBackprop(2, "local", "per_sample") as pool:
        jobs = {
            "NumPy per-sample (lab 01)": timed(mlp.loss_and_grads_per_sample),
            "2 Python threads, per-sample (lab 02)": timed(pool),
            SIMD_NATIVE: timed(lambda *a: backprop_c(*a, "simd", opt="-O3", native=True)),
            "C per-sample, 2 OpenMP threads": timed(lambda *a: backprop_c(*a, "omp_reduction", threads=2)),
            "NumPy vectorised, 1 BLAS thread": timed(mlp.loss_and_grads),
            f"NumPy vectorised, {cores} BLAS threads": timed(mlp.loss_and_grads, cores),
        }
        return {k: t.median for k, t in bench.interleaved(jobs, max(3, rounds)).items()}


# Lab 03's readings of its timings. Interleaved rounds on a laptop shared with other programs still vary by about
# this much, so a ratio closer to 1 is read as no difference rather than as a win or a loss.
NOISE = 0.1


def _side(ratio: float) -> int:
    """+1 when a speedup ``ratio`` is a gain beyond NOISE, -1 a loss beyond it, 0 within it."""
    return 1 if ratio > 1 + NOISE else -1 if ratio < 1 - NOISE else 0


def _and(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return " and ".join([", ".join(items[:-1]), items[-1]] if len(items) > 1 else items)


# one call of outer_acc (or a function of its signature) on zeroed arrays, through a pointer the compiler cannot see
# through, so the function is counted as itself and not inlined into main
OUTER_DRIVER = r"""
#line 1 "labkit-driver.c"
void NAME(const float* d, const float* x, float* g, int B, int n_out, int n_in);
void (*volatile labkit_counted_)(const float*, const float*, float*, int, int, int) = NAME;
int main(void)
{
    const int B = SIZE_B, n_out = SIZE_OUT, n_in = SIZE_IN;
    float* d = calloc((size_t)B * n_out, sizeof(float));
    float* x = calloc((size_t)B * n_in, sizeof(float));
    float* g = calloc((size_t)n_out * n_in, sizeof(float));
    labkit_counted_(d, x, g, B, n_out, n_in);
    return g[0] != 0.0f;
}
"""
ROW_OUTER = r"""
void outer_acc(const float* d, const float* x, float* g, int B, int n_out, int n_in)
{
    for (int s = 0; s < B; ++s)
        for (int i = 0; i < n_out; ++i)
            for (int j = 0; j < n_in; ++j) g[(size_t)i * n_in + j] += d[(size_t)s * n_out + i] * x[(size_t)s * n_in + j];
}
"""


def outer_counts(source: str, name: str = "outer_acc", B: int = 32, n_out: int = 100, n_in: int = 784,
                 opt: str = "-O3") -> dict[str, int] | None:
    """cachegrind's exact counts of one call of ``name`` (outer_acc's signature, from ``source``) on a batch of B
    samples into g (n_out, n_in): memory instructions (``Dr`` + ``Dw``), first-level misses (``D1mr``) and more
    (:func:`hostc.cache_counts`); None without Valgrind."""
    driver = OUTER_DRIVER.replace("NAME", name).replace("SIZE_B", str(B)).replace("SIZE_OUT", str(n_out))
    head = '#include <stddef.h>\n#include <stdlib.h>\n#line 1 "yours.c"\n'
    return hostc.cache_counts(head + source + driver.replace("SIZE_IN", str(n_in)), name, opt=opt)


VERSION_DRIVER = r"""
#line 1 "labkit-driver.c"
double NAME(const float*, const float*, const float*, const float*, const float*, const float*, int, int, int, int,
            float*, float*, float*, float*);
double (*volatile labkit_counted_)(const float*, const float*, const float*, const float*, const float*, const float*,
                                   int, int, int, int, float*, float*, float*, float*) = NAME;
int main(void)
{
    const int B = SIZE_B, n_in = SIZE_IN, n_hid = SIZE_HID, n_out = SIZE_OUT;
    size_t weights = (size_t)n_hid * n_in + n_hid + (size_t)n_out * n_hid + n_out;
    float* m = calloc(2 * weights + (size_t)B * (n_in + n_out), sizeof(float));
    float *W1 = m, *b1 = W1 + (size_t)n_hid * n_in, *W2 = b1 + n_hid, *b2 = W2 + (size_t)n_out * n_hid;
    float *x = b2 + n_out, *y = x + (size_t)B * n_in, *g = y + (size_t)B * n_out;
    volatile double cost = labkit_counted_(W1, b1, W2, b2, x, y, B, n_in, n_hid, n_out, g, g + (size_t)n_hid * n_in,
                                           g + (size_t)n_hid * n_in + n_hid, g + (size_t)n_hid * n_in + n_hid +
                                           (size_t)n_out * n_hid);
    free(m);
    return cost < 0;
}
"""


def version_counts(runs: dict[str, tuple[str, str]], B: int = 4, sizes: tuple[int, int, int] = (784, 100, 10)
                   ) -> dict[str, dict[str, int]] | None:
    """cachegrind's exact counts of one batch of ``B`` samples through each named run's (version, opt) of
    backprop.c, the whole program (the functions each version calls, expf included; the driver's few allocations
    are the same for all): ``Ir`` instructions executed, ``Dr`` + ``Dw`` memory instructions, misses. The same on
    every run, however busy the machine. None without Valgrind."""
    source = '#include <stddef.h>\n#include <stdlib.h>\n' + with_helpers(SOURCE.read_text(), SOURCE.name)
    driver = VERSION_DRIVER
    for key, value in zip(("SIZE_B", "SIZE_IN", "SIZE_HID", "SIZE_OUT"), (B, *sizes)):
        driver = driver.replace(key, str(value))
    found = {}
    for name, (version, opt) in runs.items():
        counts = hostc.cache_counts(source + driver.replace("NAME", f"bp_{version}"), None, opt=opt,
                                    flags=("-fopenmp",))
        if counts is None:
            return None
        found[name] = counts
    return found


def work_of(runs: dict[str, dict], times: dict[str, float]) -> tuple[dict[str, float], dict[str, str]]:
    """Lab 03's evidence for each of :func:`batch_times`'s ``runs`` (their ``times``): (the instructions one batch of
    4 executes, counted by cachegrind, the same on every run however busy the machine; without Valgrind, the times),
    and each in words, the time beside the count."""
    counted = version_counts({k: (r["version"], r.get("opt", "-O2")) for k, r in runs.items()})
    if counted is None:
        return dict(times), {k: f"{t * 1e3:.2f} ms (timed: Valgrind, which counts, is not installed)"
                             for k, t in times.items()}
    return ({k: float(v["Ir"]) for k, v in counted.items()},
            {k: f"{v['Ir']:,} instructions ({times[k] * 1e3:.2f} ms)" for k, v in counted.items()})


def interchange_reading(speedup: float) -> str:
    """What lab 03's run says of the loop interchange alone (``speedup``: naive's time over interchanged's)."""
    chain = ("the row-wise dot product is one long chain of dependent additions that the compiler may not reorder, "
             "where the column-wise loop updates independent sums. Vector instructions (omp simd) break the chain, "
             "and only then does the row-major order pay.")
    return {1: f"Here the interchange alone gave {speedup:.2f}x: row-major access paid off at this size.",
            0: f"Here the interchange alone gave {speedup:.2f}x, no more than these timings vary: at this size the "
               f"weights stay in the caches, and {chain}",
            -1: f"Here the interchange alone gave {speedup:.2f}x, a loss: at this size the weights stay in the caches, "
                f"and {chain}"}[_side(speedup)]


def schedule_reading(times: dict[str, float]) -> str:
    """What lab 03's run says of its schedules (``times``: seconds by 'kind, chunk c'), dynamic's chunk 1 against
    static's default."""
    best = min(times, key=times.get)
    ratio = times["dynamic, chunk 1"] / times["static, chunk default"]
    said = f"Here the fastest schedule was {best}; dynamic with chunk 1 took {ratio:.2f}x the time of static"
    return said + {
        -1: ": every sample costs the same, so handing out work at run time only added its own cost.",
        0: ", no more than these timings vary: every sample costs the same, so dynamic had nothing to balance, and "
           "its price, one chunk handed out per sample, is small beside the samples' work.",
        1: ", less, although every sample costs the same. The likely cause: the two cores did not run alike. When "
           "another program takes a core for a while, static leaves that thread's block waiting for it; dynamic "
           "hands the remaining samples to the thread that is free."}[_side(1 / ratio)]


def layer_scaling_reading(threads, speedups: dict[str, np.ndarray], narrow: str, wide: str) -> str:
    """Where lab 03's run had the ``narrow`` layer fall behind the ``wide`` one: their speedups' ratio at each thread
    count past one, grouped by NOISE."""
    gap = {p: w / n for p, w, n in zip(threads, speedups[wide], speedups[narrow]) if p > 1}
    said = "wide speedup / narrow speedup: " + ", ".join(f"{p} threads {g:.2f}" for p, g in gap.items())
    groups = {1: "the narrow layer fell behind at", 0: "the two scaled alike (within 10 %) at",
              -1: "the narrow layer scaled better at"}
    found = [f"{words} {_and([str(p) for p, g in gap.items() if _side(g) == k])} threads"
             for k, words in groups.items() if any(_side(g) == k for g in gap.values())]
    return f"{said}. Here {'; '.join(found)}."
