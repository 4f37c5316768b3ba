"""Benchmarks behind `labkit bench NAME`: each module has ``run(quick, progress) -> dict`` and ``report(result) -> str``."""

from __future__ import annotations

import importlib

BENCHMARKS = {
    "backprop": "per-sample vs vectorised backprop epochs, and the same FLOPs as bare matmuls",
    "allreduce": "naive, recursive-doubling and ring allreduce against MPI_Allreduce on 2 and 4 ranks",
    "kernels": "labkit's CUDA kernels against cuBLAS/CuPy and the copy bandwidth on a GPU; the emulator's matmul",
    "training": "data-parallel speedup on 2 ranks and the accuracy cost of top-k 1 % compression",
    "scaling": "strong and weak scaling of the data-parallel step on 1..4 ranks, with fitted serial fractions",
    "grading": "labkit grade on lab 01 copies: notebooks per minute with 1 job and with one job per core",
    "openmp": "network.py's backprop in C against NumPy per-sample, its single-thread versions, OpenMP on 1-2 threads",
    "classroom": "a class of 40 students x 3 labs graded with a job per core, feedback pages and exports (target 15 min)",
}


def get(name: str):
    """The benchmark module called ``name``."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; available: {', '.join(BENCHMARKS)}")
    return importlib.import_module(f"{__name__}.{name}")
