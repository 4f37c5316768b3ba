"""Compressed allreduces against the sum of every rank's decompressed gradient; training with them.

Run: mpiexec -n 3 python -m mpi4py tests/mpi/cases_compression.py [-k NAME]   (prints "OK <p>" on rank 0)
"""

import numpy as np
from _cases import case, refused, run_cases
from mpi4py import MPI

from labkit import compression as C
from labkit import mlp
from labkit.data_parallel import DataParallel

comm = MPI.COMM_WORLD
r, p = comm.Get_rank(), comm.Get_size()
g = np.random.default_rng(r).standard_normal(1001).astype(np.float32)


@case("sparse allreduce adds indices shared by ranks")
def _():
    idx = np.array([r, 5, 1000 - r], dtype=np.int32)  # index 5 on every rank: must add up, not overwrite
    dense = C.sparse_allreduce(comm, idx, np.ones(3, np.float32), 1001)
    assert dense[5] == p and dense.sum() == 3 * p


@case("every method sums the decompressed gradients")
def _():
    for method in C.CompressedAllreduce.METHODS:
        f = C.CompressedAllreduce(method, ratio=0.05, tau=1.5, error_feedback=False, seed=r)
        mine = {"float16": C.to_float16, "int8": lambda v: C.to_int8(v, np.random.default_rng(r)),
                "topk": lambda v: C.top_k(v, 0.05), "threshold": lambda v: C.threshold(v, 1.5)}[method](g).decompress()
        want = np.empty_like(mine)
        comm.Allreduce(mine, want)
        got = f(comm, g)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=method)
        assert f.bytes_sent < f.bytes_dense or method == "threshold"


@case("training with top-k keeps the ranks equal")
def _():
    rng = np.random.default_rng(0)
    x, y = rng.random((200, 20)), rng.integers(0, 4, 200)
    params = mlp.init_params([20, 16, 4], dtype=np.float64)
    f = C.CompressedAllreduce("topk", ratio=0.1)
    h = mlp.train(params, (x, y), epochs=3, batch_size=20, lr=0.5, cost="cross_entropy",
                  method=DataParallel(comm, allreduce=f), progress=False)
    assert h.train_loss[-1] < h.train_loss[0] and 0.1 < f.compression_ratio < 0.25, (h.train_loss, f.compression_ratio)
    everyone = comm.allgather(params[0][0].tobytes())
    assert all(e == everyone[0] for e in everyone), "ranks disagree"
    refused(lambda: DataParallel(comm, allreduce=f, fused=False), ValueError, "fused=True")


def my_topk(v, residual, ratio):  # the lab 10 exercise's answer, plugged in through sparsify=
    c = v + residual
    k = max(1, int(np.ceil(ratio * v.size)))
    i = np.argpartition(np.abs(c), v.size - k)[v.size - k:]
    left = c.copy()
    left[i] = 0
    return i, c[i], left


@case("a student's sparsify= equals labkit's top-k")
def _():
    lib, mine = C.CompressedAllreduce("topk", ratio=0.05), C.CompressedAllreduce(sparsify=my_topk, ratio=0.05)
    for step in range(3):  # the same results, step after step (the residual is carried)
        v = np.random.default_rng(10 * step + r).standard_normal(1001).astype(np.float32)
        np.testing.assert_allclose(mine(comm, v), lib(comm, v), rtol=1e-6)
    assert mine.bytes_sent == lib.bytes_sent
    refused(lambda: C.CompressedAllreduce(sparsify=lambda v, res, ratio: (np.arange(3), np.ones(2), res),
                                          ratio=0.1)(comm, g), ValueError, "one length")


run_cases(comm)
