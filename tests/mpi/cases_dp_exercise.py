"""The data-parallel-step exercise check passes a right answer and names typical mistakes, on every rank.

Run: mpiexec -n 3 python -m mpi4py tests/mpi/cases_dp_exercise.py [-k NAME]   (prints "OK <p>" on rank 0)
"""

import _cases
import numpy as np
from _cases import case, run_cases
from mpi4py import MPI

from labkit import check, mlp
from labkit.shards import shard_bounds

comm = MPI.COMM_WORLD


def solution(comm, params, x, Y, allreduce=True, empty_ok=True, whole=False):
    p, r = comm.Get_size(), comm.Get_rank()
    lo, hi = (0, len(x)) if whole else shard_bounds(len(x), p)[r]
    if hi > lo or not empty_ok:
        share = (hi - lo) / len(x)
        local = [(gW * share, gb * share) for gW, gb in mlp.backprop(params, x[lo:hi], Y[lo:hi])]
    else:
        local = mlp.zeros_like(params)
    if whole:
        return [(gW / share, gb / share) for gW, gb in local]
    if not allreduce:
        return local
    out = []
    for gW, gb in local:
        sW, sb = np.empty_like(gW), np.empty_like(gb)
        comm.Allreduce(gW, sW)
        comm.Allreduce(gb, sb)
        out.append((sW, sb))
    return out


def mistake(name, fn, *needles):
    _cases.mistake(name, lambda f: check.data_parallel_step(f, timeout=3), fn, *needles)


def not_written(*a):
    raise NotImplementedError


case("a right step passes", prints=_cases.PASSED)(lambda: check.data_parallel_step(solution))
mistake("no allreduce", lambda *a: solution(*a, allreduce=False), "sum the shards with comm.Allreduce")
mistake("an empty shard backpropped", lambda *a: solution(*a, empty_ok=False), "contribute zero gradients")
mistake("every rank backprops the whole batch", lambda *a: solution(*a, whole=True), "used rows outside its shard")
mistake("not written", not_written, "not written yet")
run_cases(comm)
