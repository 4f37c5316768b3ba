"""Every graded exercise, declared once: its name, lab, check, labkit's own solution and how the grader launches it.

A notebook calls the check as ``check.<name>(...)`` in a cell of its own. The capture (:mod:`.capture`) fails an
exercise whose function uses one of its ``references``; the grader replays an ``mpi`` exercise's check on every rank
under ``mpiexec``; ``labkit assign`` and the nbgrader export accept check cells only for exercises declared here.
Adding an exercise: write its check in the module of its family, import it in ``check/__init__.py``, declare it
below, and call it in its lab's notebook.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Exercise:
    name: str                            # check.<name> in the notebook, and the row in the grades
    lab: str                             # the notebook's number: "01" ... "12"
    module: str                          # the check's module, under labkit.check
    references: tuple[str, ...] = ()     # labkit's solution, "module:qualname" (a class: all its methods)
    sources: tuple[tuple[str, str | None], ...] = ()  # C or CUDA C: (file under labkit/, function or None: the file)
    mpi: bool = False                    # the check runs on every rank of an MPI job

    def check(self):
        """The check function itself."""
        return getattr(importlib.import_module(f"labkit.check.{self.module}"), self.name)


_PER_SAMPLE = ("per_sample_sum", "_sample_forward", "_sample_output_error", "_sample_backward", "_times_act_prime")
_MLP = ("backprop", "loss_and_grads", "loss_and_grads_unchecked", "backprop_per_sample", "loss_and_grads_per_sample",
        "backprop_one", *_PER_SAMPLE)
_COLLECTIVES = ("ring_allreduce", "naive_allreduce", "reduce_broadcast_allreduce", "recursive_doubling_allreduce",
                "mpi_allreduce")

EXERCISES: dict[str, Exercise] = {e.name: e for e in (
    Exercise("backprop", "01", "serial", references=tuple(f"labkit.mlp:{f}" for f in _MLP)),
    Exercise("accumulate", "02", "serial", references=(*(f"labkit.mlp:{f}" for f in _PER_SAMPLE),
                                                      "labkit.cpu_parallel:shard_sums", "labkit.cpu_parallel:ThreadedBackprop")),
    Exercise("loop_interchange", "03", "openmp"),
    Exercise("omp_reduction", "03", "openmp", sources=(("c/backprop.c", "bp_omp_reduction"),)),
    Exercise("block_reduction", "05", "kernels", sources=(("kernels/reduce.cu", None),)),
    Exercise("tiled_matmul", "05", "kernels", sources=(("kernels/matmul.cu", "matmul_tiled"),)),
    Exercise("ring_allreduce", "07", "mpi", references=tuple(f"labkit.collectives:{f}" for f in _COLLECTIVES), mpi=True),
    Exercise("data_parallel_step", "08", "mpi", mpi=True,
             references=("labkit.data_parallel:DataParallel", "labkit.data_parallel:ShardedSGD")),
    Exercise("async_worker", "09", "mpi", mpi=True,
             references=("labkit.param_server:worker_loop", "labkit.param_server:_worker")),
    Exercise("topk_feedback", "10", "compression", references=(
        "labkit.compression:top_k", "labkit.compression:ErrorFeedback", "labkit.compression:_SparsifyWithResidual")),
    Exercise("karp_flatt", "12", "speedup", references=("labkit.bench:karp_flatt",)),
    Exercise("scaled_speedup", "12", "speedup", references=("labkit.bench:speedup",)),
)}


def exercise(name: str) -> Exercise | None:
    """The exercise of a check cell's name (``ring_allreduce``, or ``ring_allreduce#2`` for its second call)."""
    return EXERCISES.get(name.split("#", 1)[0])
