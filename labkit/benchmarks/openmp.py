"""network.py's per-sample backprop in C (labkit/c/backprop.c) against labkit's NumPy per-sample loop, its
single-thread optimisations one at a time, and OpenMP over the samples.

Run: ``labkit bench openmp [--quick] [--json]``

Keys:
  ``c_per_sample_vs_numpy_per_sample``  one epoch of [784,30,10] at batch 10 (gradients and the SGD update):
                                        labkit's NumPy per-sample loop (one BLAS thread) / the optimised C program
                                        (epoch_simd: the whole epoch in C, -O3 -march=native)
  ``loop_interchange_speedup``          bp_naive / bp_interchanged, [784,100,10], a batch of 100, -O2; and
                                        ``loop_interchange_by_width`` the same at widths 30 to 3000
  ``omp_speedup_2threads``              bp_omp_reduction on 1 thread / on 2, wide layer [784,1000,10], batch 100
  ``atomic_over_reduction``             bp_omp_atomic / bp_omp_reduction, 2 threads, same batch
and ``versions``: seconds per batch of every single-thread version (with -O0 and -O3 for the fused one).
Every job runs in interleaved rounds (5 by default; 1 with --quick); each ratio is the median over the rounds of the
ratio measured within a round, and ``seconds`` the median time of each job.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..bench import format_seconds, interleaved, machine_info, measure

TARGETS = {"c_per_sample_vs_numpy_per_sample": (">=", 5.0), "omp_speedup_2threads": (">=", 1.7)}


def _data(n: int):
    from ..data import SubsetDataWarning, load_mnist, locate
    from ..mlp import targets

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SubsetDataWarning)
        (x, y), _ = load_mnist()
    return x[:n], targets(y[:n], 10, np.float32), locate().describe()


def run(quick: bool = False, progress: bool | None = None, rounds: int | None = None) -> dict:
    """Measure everything in interleaved rounds; return a JSON-ready dict."""
    from .. import mlp, openmp

    rounds = (1 if quick else 5) if rounds is None else rounds
    x, Y, source = _data(2000 if quick else 10000)
    repeat = 3 if quick else 5
    narrow = mlp.init_params([784, 30, 10], seed=0)
    mid = mlp.init_params([784, 100, 10], seed=0)
    wide = mlp.init_params([784, 1000, 10], seed=0)
    xb, Yb = x[:100], Y[:100]

    def epoch(grads) -> float:
        """One epoch of batch-10 SGD steps with ``grads(params, xb, Yb) -> mean gradients``, in seconds."""
        params = [(W.copy(), b.copy()) for W, b in narrow]

        def steps():
            for lo in range(0, len(x), 10):
                for (W, b), (gW, gb) in zip(params, grads(params, x[lo:lo + 10], Y[lo:lo + 10])):
                    W -= 3.0 * gW
                    b -= 3.0 * gb
        return measure(steps, repeat=1, warmup=0).median

    def c_epoch() -> float:
        params = [(W.copy(), b.copy()) for W, b in narrow]
        return measure(lambda: openmp.train_epoch_c(params, x, Y, 10, 3.0, "-O3", native=True), repeat=1,
                       warmup=0).median

    def per_batch(params, version, opt="-O2", threads=None):
        return lambda: measure(lambda: openmp.backprop_c(params, xb, Yb, version, opt, threads=threads),
                               repeat=repeat).median

    jobs = {
        "numpy per-sample epoch": lambda: epoch(lambda p, xs, Ys: mlp.loss_and_grads_per_sample(p, xs, Ys)[1]),
        "C per-sample epoch (-O3, native)": c_epoch,
        **{f"{v} -O2": per_batch(mid, v) for v in openmp.VERSIONS},
        "fused -O0": per_batch(mid, "fused", "-O0"),
        "fused -O3": per_batch(mid, "fused", "-O3"),
        "reduction, 1 thread, wide": per_batch(wide, "omp_reduction", threads=1),
        "reduction, 2 threads, wide": per_batch(wide, "omp_reduction", threads=2),
        "atomic, 2 threads, wide": per_batch(wide, "omp_atomic", threads=2),
        "critical, 2 threads, wide": per_batch(wide, "omp_critical", threads=2),
    }
    for v in openmp.VERSIONS:  # compile every build before anything is timed
        openmp.module("-O2").get_function(f"bp_{v}")
    for opt in ("-O0", "-O3"):
        openmp.module(opt)
    openmp.module("-O3", native=True)
    widths = (30, 1000) if quick else (30, 100, 300, 1000, 3000)
    for w in widths:  # the loop interchange where the weights fit in the caches and where they do not
        p = mlp.init_params([784, w, 10], seed=0)
        jobs[f"naive -O2, width {w}"] = per_batch(p, "naive")
        jobs[f"interchanged -O2, width {w}"] = per_batch(p, "interchanged")
    from threadpoolctl import threadpool_limits

    # one BLAS thread: NumPy's per-sample loop is a single-thread baseline, and idle BLAS threads spinning after a call
    # would take the second core from the OpenMP runs (OpenMP's own threads are set per call)
    with threadpool_limits(1, user_api="blas"):
        timings = interleaved(jobs, rounds)
    t = {k: v.median for k, v in timings.items()}

    def ratio(a: str, b: str) -> float:
        """The median over the rounds of a/b measured in the same round (a slow spell hits both sides of a ratio)."""
        return float(np.median(np.array(timings[a].times) / np.array(timings[b].times)))

    ratios = {"c_per_sample_vs_numpy_per_sample": ratio("numpy per-sample epoch", "C per-sample epoch (-O3, native)"),
              "loop_interchange_speedup": ratio("naive -O2", "interchanged -O2"),
              "omp_speedup_2threads": ratio("reduction, 1 thread, wide", "reduction, 2 threads, wide"),
              "atomic_over_reduction": ratio("atomic, 2 threads, wide", "reduction, 2 threads, wide")}
    return {
        "quick": quick, "rounds": rounds, "samples_per_epoch": len(x), "data": source, "machine": machine_info(),
        **ratios, "seconds": t,
        "loop_interchange_by_width": {w: ratio(f"naive -O2, width {w}", f"interchanged -O2, width {w}") for w in widths},
        "targets_met": {k: (ratios[k] >= bound) if op == ">=" else (ratios[k] <= bound) for k, (op, bound) in TARGETS.items()},
    }


def report(result: dict) -> str:
    """A table for people."""
    m = result["machine"]
    lines = [f"OpenMP benchmark ({'quick' if result['quick'] else 'full'}, {result['samples_per_epoch']} samples per "
             f"epoch, {m.get('cpus', '?')} cores, median of {result['rounds']} interleaved round(s))",
             f"data: {result['data']}", ""]
    for name, s in result["seconds"].items():
        lines.append(f"  {name:<34}{format_seconds(s):>12}")
    lines.append("\nloop interchange (naive / interchanged) by hidden width: " + ", ".join(
        f"{w}: {s:.2f}x" for w, s in result["loop_interchange_by_width"].items()))
    lines.append("")
    for key in ("c_per_sample_vs_numpy_per_sample", "loop_interchange_speedup", "omp_speedup_2threads",
                "atomic_over_reduction"):
        target = TARGETS.get(key)
        met = "" if target is None else (f"   (target {target[0]} {target[1]}: "
                                         f"{'met' if result['targets_met'][key] else 'NOT met'})")
        lines.append(f"{key}: {result[key]:.2f}{met}")
    return "\n".join(lines)
