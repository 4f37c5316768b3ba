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

import numpy as np
from threadpoolctl import threadpool_limits

from .. import mlp, openmp
from ..bench import format_seconds, interleaved, machine_info, measure
from ..data import load_mnist, locate
from ..mlp import targets

TARGETS = {"c_per_sample_vs_numpy_per_sample": (">=", 5.0), "omp_speedup_2threads": (">=", 1.7)}


def _data(n: int):
    (x, y), _ = load_mnist(quiet=True)
    return x[:n], targets(y[:n], 10, np.float32), locate().describe()


def run(quick: bool = False, progress: bool | None = None, rounds: int | None = None) -> dict:
    """Measure everything in interleaved rounds; return a JSON-ready dict."""
    rounds = (1 if quick else 5) if rounds is None else rounds
    x, Y, source = _data(2000 if quick else 10000)
    per_batch = _per_batch_jobs(x[:100], Y[:100], repeat=3 if quick else 5)
    jobs = _jobs(x, Y, per_batch)
    _compile_every_build()
    widths = (30, 1000) if quick else (30, 100, 300, 1000, 3000)
    jobs.update(_interchange_jobs(per_batch, widths))
    timings = _interleaved_one_blas_thread(jobs, rounds)
    return _result(quick, rounds, len(x), source, timings, widths)


def _epoch_job(narrow, x, Y, grads):
    """A job: one epoch of batch-10 SGD steps with ``grads(params, xb, Yb) -> mean gradients``, in seconds."""
    def job() -> float:
        params = [(W.copy(), b.copy()) for W, b in narrow]

        def steps():
            for lo in range(0, len(x), 10):
                for (W, b), (gW, gb) in zip(params, grads(params, x[lo:lo + 10], Y[lo:lo + 10])):
                    W -= 3.0 * gW
                    b -= 3.0 * gb
        return measure(steps, repeat=1, warmup=0).median
    return job


def _c_epoch_job(narrow, x, Y):
    """A job: the same epoch as one call of the optimised C program (-O3, native), in seconds."""
    def job() -> float:
        params = [(W.copy(), b.copy()) for W, b in narrow]
        return measure(lambda: openmp.train_epoch_c(params, x, Y, 10, 3.0, "-O3", native=True), repeat=1,
                       warmup=0).median
    return job


def _per_batch_jobs(xb, Yb, repeat: int):
    """A maker of jobs ``per_batch(params, version, opt, threads)``: the median seconds of one C backprop of xb."""
    def per_batch(params, version, opt="-O2", threads=None):
        return lambda: measure(lambda: openmp.backprop_c(params, xb, Yb, version, opt, threads=threads),
                               repeat=repeat).median
    return per_batch


def _jobs(x, Y, per_batch) -> dict:
    """The epochs (NumPy and C), every single-thread version and the OpenMP ones, by name in the order they run."""
    narrow = mlp.init_params([784, 30, 10], seed=0)
    mid = mlp.init_params([784, 100, 10], seed=0)
    wide = mlp.init_params([784, 1000, 10], seed=0)
    return {
        "numpy per-sample epoch": _epoch_job(narrow, x, Y, lambda p, xs, Ys: mlp.loss_and_grads_per_sample(p, xs, Ys)[1]),
        "C per-sample epoch (-O3, native)": _c_epoch_job(narrow, x, Y),
        **{f"{v} -O2": per_batch(mid, v) for v in openmp.VERSIONS},
        "fused -O0": per_batch(mid, "fused", "-O0"),
        "fused -O3": per_batch(mid, "fused", "-O3"),
        "reduction, 1 thread, wide": per_batch(wide, "omp_reduction", threads=1),
        "reduction, 2 threads, wide": per_batch(wide, "omp_reduction", threads=2),
        "atomic, 2 threads, wide": per_batch(wide, "omp_atomic", threads=2),
        "critical, 2 threads, wide": per_batch(wide, "omp_critical", threads=2),
    }


def _compile_every_build() -> None:
    """Compile every build before anything is timed."""
    for v in openmp.VERSIONS:
        openmp.module("-O2").get_function(f"bp_{v}")
    for opt in ("-O0", "-O3"):
        openmp.module(opt)
    openmp.module("-O3", native=True)


def _interchange_jobs(per_batch, widths) -> dict:
    """The loop interchange where the weights fit in the caches and where they do not: naive and interchanged."""
    jobs = {}
    for w in widths:
        p = mlp.init_params([784, w, 10], seed=0)
        jobs[f"naive -O2, width {w}"] = per_batch(p, "naive")
        jobs[f"interchanged -O2, width {w}"] = per_batch(p, "interchanged")
    return jobs


def _interleaved_one_blas_thread(jobs: dict, rounds: int) -> dict:
    """Every job once a round, the rounds interleaved, with BLAS on one thread."""
    # one BLAS thread: NumPy's per-sample loop is a single-thread baseline, and idle BLAS threads spinning after a call
    # would take the second core from the OpenMP runs (OpenMP's own threads are set per call)
    with threadpool_limits(1, user_api="blas"):
        return interleaved(jobs, rounds)


def _ratio(timings: dict, a: str, b: str) -> float:
    """The median over the rounds of a/b measured in the same round (a slow spell hits both sides of a ratio)."""
    return float(np.median(np.array(timings[a].times) / np.array(timings[b].times)))


def _result(quick: bool, rounds: int, samples: int, source: str, timings: dict, widths) -> dict:
    """The JSON-ready dict: the ratios, the median seconds of every job, the interchange by width, the targets."""
    t = {k: v.median for k, v in timings.items()}
    ratios = {"c_per_sample_vs_numpy_per_sample": _ratio(timings, "numpy per-sample epoch",
                                                         "C per-sample epoch (-O3, native)"),
              "loop_interchange_speedup": _ratio(timings, "naive -O2", "interchanged -O2"),
              "omp_speedup_2threads": _ratio(timings, "reduction, 1 thread, wide", "reduction, 2 threads, wide"),
              "atomic_over_reduction": _ratio(timings, "atomic, 2 threads, wide", "reduction, 2 threads, wide")}
    return {
        "quick": quick, "rounds": rounds, "samples_per_epoch": samples, "data": source, "machine": machine_info(),
        **ratios, "seconds": t,
        "loop_interchange_by_width": {w: _ratio(timings, f"naive -O2, width {w}", f"interchanged -O2, width {w}")
                                      for w in widths},
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
