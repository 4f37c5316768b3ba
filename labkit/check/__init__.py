"""Checks for the notebooks' exercises: run a student's function against the reference and say what is wrong.

Each check prints one line when everything passes and otherwise raises :class:`ExerciseError`
with what was tested, what was expected against what came back, and a hint.

One module per family, each named for what it checks: :mod:`.serial` (labs 01-02), :mod:`.openmp` (lab 03),
:mod:`.kernels` (labs 04-05), :mod:`.mpi` (labs 07-09, on every MPI rank), :mod:`.compression` (lab 10),
:mod:`.speedup` (lab 12); the notebooks call them as ``check.<name>``.
"""

from __future__ import annotations

from .common import ExerciseError
from .compression import topk_feedback
from .kernels import KERNEL_TODO, block_reduction, tiled_matmul
from .mpi import async_worker, data_parallel_step, ring_allreduce
from .openmp import loop_interchange, omp_reduction
from .serial import accumulate, backprop
from .speedup import karp_flatt, scaled_speedup

__all__ = ["ExerciseError", "KERNEL_TODO", "accumulate", "async_worker", "backprop", "block_reduction",
           "data_parallel_step", "karp_flatt", "loop_interchange", "omp_reduction", "ring_allreduce", "scaled_speedup",
           "tiled_matmul", "topk_feedback"]
