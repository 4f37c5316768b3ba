"""Strong and weak scaling of the labs' workloads on 1..N MPI ranks, behind :func:`labkit.bench.strong_scaling`,
:func:`labkit.bench.weak_scaling` and ``labkit bench scaling [--quick] [--json]``.

Workloads (``size`` is the whole problem in strong scaling; in weak scaling the problem is scaled by ``scale``,
the rank count unless given, so that each rank's share stays ``size``):

* ``"backprop"``: one synchronous data-parallel SGD step of [784,256,10] (the step of lab 07): every rank
  backprops its shard of a batch of ``size`` samples, the gradients are summed with ``MPI_Allreduce``
  (:class:`labkit.data_parallel.DataParallel`) and every rank updates its weights; one BLAS thread per rank.
* ``"synthetic"``: a known serial fraction: rank 0 alone does ``serial`` (default 0.1) of ``size`` units of
  work (128x128 matrix products) while the others wait, then the rest is shared out. The fitted serial
  fraction should come back near ``serial`` while the ranks do not outnumber the cores.

Each run is a separate ``mpiexec`` job; rank 0 prints one JSON line with the step times (the ``"mpi"`` clock:
the slowest rank's), the median seconds per phase, and optionally one step's timeline on every rank.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from ..bench import machine_info

WORKLOADS = {
    "backprop": "one data-parallel SGD step of [784,256,10] (lab 07): shard backprop, MPI_Allreduce, update",
    "synthetic": "a known serial fraction: rank 0 alone does `serial` of the work, then all ranks share the rest",
}
_OPTIONS = {"backprop": set(), "synthetic": {"serial"}}
_DEFAULT_SIZE = {("backprop", "strong"): 4096, ("backprop", "weak"): 1024,
                 ("synthetic", "strong"): 1000, ("synthetic", "weak"): 500}
UNIT = 128  # a unit of synthetic work: one UNIT x UNIT float64 matrix product


def default_size(workload: str, mode: str) -> int:
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; available: {', '.join(WORKLOADS)}")
    return _DEFAULT_SIZE[(workload, mode)]


def _backprop_step(comm, cfg: dict, timeline):
    import numpy as np

    from .. import mlp
    from ..data_parallel import DataParallel

    n = cfg["size"] * cfg["scale"]
    rng = np.random.default_rng(0)  # the same global batch on every rank
    x = rng.random((n, 784), dtype=np.float32)
    y = rng.integers(0, 10, n)
    params = mlp.init_params([784, 256, 10], seed=0, init="he")
    dp = DataParallel(comm, allreduce="mpi")
    dp.timeline = timeline

    def step():
        _, grads = dp(params, x, y, activation="relu", cost="cross_entropy")
        if timeline is not None:
            t0 = time.perf_counter()
        for (W, b), (gW, gb) in zip(params, grads):
            W -= 0.05 * gW
            b -= 0.05 * gb
        if timeline is not None:
            timeline.add("update", "compute", t0, time.perf_counter())

    def phases():
        return {"compute": dp.compute_seconds, "comm": dp.comm_seconds}

    return step, phases


def _synthetic_step(comm, cfg: dict, timeline):
    import numpy as np

    p, rank = comm.Get_size(), comm.Get_rank()
    size, f = cfg["size"], cfg.get("serial", 0.1)
    if not 0 <= f <= 1:
        raise ValueError(f"serial must be in [0, 1], got {f}")
    serial = round(f * size)
    parallel = (size - serial) * cfg["scale"]  # weak scaling grows the parallel part only: Gustafson's model
    per_rank = parallel // p + (1 if rank < parallel % p else 0)
    a = np.random.default_rng(rank).random((UNIT, UNIT))
    b = np.random.default_rng(rank + 1).random((UNIT, UNIT)) / UNIT
    spent = {"compute": 0.0, "comm": 0.0}

    def work(units: int) -> None:
        c = a
        for _ in range(units):
            c = c @ b

    def timed(name, kind, fn, *args):
        t0 = time.perf_counter()
        fn(*args)
        t1 = time.perf_counter()
        spent[kind] += t1 - t0
        if timeline is not None:
            timeline.add(name, kind, t0, t1)

    def step():
        if rank == 0:
            timed("serial part", "compute", work, serial)
        timed("wait", "comm", comm.Barrier)
        timed("parallel part", "compute", work, per_rank)

    return step, lambda: dict(spent)


def worker(cfg: dict) -> None:
    """Runs on every rank of one job; rank 0 prints one JSON line."""
    import numpy  # noqa: F401  (load BLAS first, so that the limit below reaches it)
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    from mpi4py import MPI

    from ..bench import Timeline, measure

    comm = MPI.COMM_WORLD
    make = {"backprop": _backprop_step, "synthetic": _synthetic_step}[cfg["workload"]]
    step, phases = make(comm, cfg, None)
    before = phases()
    timing = measure(step, repeat=cfg["repeat"], warmup=cfg["warmup"], clock="mpi", comm=comm)
    after = phases()
    per_step = {k: (after[k] - before[k]) / (cfg["repeat"] + cfg["warmup"]) for k in after}  # measure ran both
    out = {"p": comm.Get_size(), "times": timing.times,
           "phases": {k: comm.allreduce(v, op=MPI.MAX) for k, v in per_step.items()}}
    if cfg.get("trace"):
        tl = Timeline(comm.Get_rank())
        step, _ = make(comm, cfg, tl)
        step()  # warm the new buffers
        comm.Barrier()
        tl.reset()
        step()
        out["trace"] = tl.gather(comm)
    if comm.Get_rank() == 0:
        print(json.dumps(out), flush=True)


def launch(workload: str, mode: str, p: int, size: int, repeat: int = 5, warmup: int = 1, timeout: float = 120,
           trace: bool = False, scale: int | None = None, **extra) -> dict:
    """Run one workload on ``p`` ranks under ``mpiexec``; the parsed JSON of rank 0. In weak mode the problem is
    ``scale`` (default ``p``) times the one-rank problem: ``scale=p`` on one rank times the scaled problem serially."""
    from .. import cluster

    default_size(workload, mode)  # checks the name
    if mode not in ("strong", "weak"):
        raise ValueError(f"mode must be 'strong' or 'weak', got {mode!r}")
    if size < 1 or repeat < 1:
        raise ValueError(f"size and repeat must be positive, got size={size}, repeat={repeat}")
    unknown = set(extra) - _OPTIONS[workload]
    if unknown:
        raise ValueError(f"the {workload!r} workload takes no option {', '.join(sorted(unknown))}; its options: "
                         f"{', '.join(sorted(_OPTIONS[workload])) or 'none'}")
    scale = 1 if mode == "strong" else p if scale is None else int(scale)
    if scale < 1:
        raise ValueError(f"scale must be >= 1, got {scale}")
    cfg = {"workload": workload, "mode": mode, "size": size, "scale": scale, "repeat": repeat, "warmup": warmup,
           "trace": trace, **extra}
    try:
        res = cluster.run_mpi(["-m", "labkit.benchmarks.scaling", json.dumps(cfg)], n=p, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"the {p}-rank {mode}-scaling run of {workload!r} did not finish in {timeout:g} s and was "
                           f"stopped; use a smaller size or fewer repeats, or a larger timeout\n"
                           f"{(e.stderr or '')[-2000:]}") from None
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        raise RuntimeError(f"the {p}-rank {mode}-scaling run of {workload!r} failed (exit {res.returncode}):\n"
                           f"{res.stderr[-3000:]}")
    return json.loads(lines[-1])


def run(quick: bool = False, progress: bool | None = None) -> dict:
    """Strong and weak scaling of the data-parallel step, and the synthetic workload's fitted serial fraction."""
    from ..bench import strong_scaling, weak_scaling

    ranks = (1, 2) if quick else (1, 2, 3, 4)
    repeat = 5 if quick else 9
    strong = strong_scaling("backprop", ranks, repeat=repeat, progress=progress)
    weak = weak_scaling("backprop", ranks, repeat=repeat, progress=progress)
    synth = strong_scaling("synthetic", (1, 2), repeat=repeat, progress=progress)
    i2 = strong.ranks.index(2)
    return {
        "benchmark": "scaling", "quick": quick,
        "backprop_strong": strong.to_dict(), "backprop_weak": weak.to_dict(), "synthetic_strong": synth.to_dict(),
        "backprop_strong_speedup_p2": float(strong.speedup[i2]),
        "backprop_weak_scaled_speedup_p2": float(weak.speedup[weak.ranks.index(2)]),
        "backprop_weak_efficiency_p2": float(weak.weak_efficiency[weak.ranks.index(2)]),
        "backprop_serial_fraction_amdahl": strong.serial_fraction,
        "backprop_serial_fraction_gustafson": weak.serial_fraction,
        "synthetic_serial_fraction_set": 0.1, "synthetic_serial_fraction_fitted": synth.serial_fraction,
        "machine": machine_info(), "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def report(result: dict) -> str:
    """A summary for people."""
    from ..bench import Scaling

    cores = result.get("machine", {}).get("cpus", "?")
    parts = [f"scaling benchmark ({'quick' if result['quick'] else 'full'}), {cores} cores, 1 BLAS thread per rank"]
    for key in ("backprop_strong", "backprop_weak", "synthetic_strong"):
        parts.append(Scaling.from_dict(result[key]).table())
    parts.append(f"synthetic workload: serial fraction set {result['synthetic_serial_fraction_set']}, "
                 f"fitted {result['synthetic_serial_fraction_fitted']:.3f}")
    return "\n\n".join(parts)


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
