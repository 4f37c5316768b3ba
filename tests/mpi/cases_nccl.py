"""The NCCL allreduce and data parallelism on GPUs through it, against NumPy and the serial run (needs CuPy).

Run: mpiexec -n 2 python -m mpi4py tests/mpi/cases_nccl.py [-k NAME]   (prints "OK <p>" on rank 0)

With fewer GPUs than ranks on the machine, every rank must raise the same clear error instead (NCCL refuses
two ranks on one GPU), which is what a one-GPU machine checks with 2 ranks.
"""

import cupy
import numpy as np
from _cases import case, refused, run_cases
from mpi4py import MPI

from labkit import mlp
from labkit.comm_backends import NcclAllreduce
from labkit.data_parallel import DataParallel

comm = MPI.COMM_WORLD
p, r = comm.Get_size(), comm.Get_rank()

ENOUGH_GPUS = cupy.cuda.runtime.getDeviceCount() >= p


@case("fewer GPUs than ranks: the same clear error on every rank")
def _():
    if not ENOUGH_GPUS:
        refused(lambda: NcclAllreduce(comm, timeout=60), RuntimeError, "one GPU per rank")


@case("the NCCL allreduce against NumPy")
def _():
    if not ENOUGH_GPUS:
        return
    nccl = NcclAllreduce(comm, timeout=60)
    for n in (1, p, 1000, 100_003):
        for dtype, op in ((np.float32, MPI.SUM), (np.float64, MPI.SUM), (np.int32, MPI.MAX), (np.float32, MPI.MIN)):
            everyone = [np.random.default_rng(10 * k + n).standard_normal(n).astype(dtype) * 100 for k in range(p)]
            want = {MPI.SUM: np.sum, MPI.MAX: np.max, MPI.MIN: np.min}[op](np.stack(everyone), axis=0)
            x = cupy.asarray(everyone[r])
            assert nccl(x, op) is x  # in place
            np.testing.assert_allclose(x.get(), want, rtol=1e-5, atol=1e-4, err_msg=f"n={n} {np.dtype(dtype)}")
    for bad, what in ((np.zeros(3, np.float32), "CuPy arrays"), (cupy.zeros((4, 4))[:, 1], "C-contiguous"),
                      (cupy.zeros(3, cupy.complex64), "does not reduce")):
        refused(lambda: nccl(bad), (TypeError, ValueError), what)  # noqa: B023 - called at once
    nccl.close()


@case("DataParallel(nccl) equals the serial CuPy run")
def _():
    if not ENOUGH_GPUS:
        return
    rng = np.random.default_rng(0)
    x, y = rng.random((61, 20)), rng.integers(0, 5, 61)
    for batch, fused in ((20, True), (7, False)):
        serial = mlp.init_params([20, 12, 5], seed=1, dtype=np.float64, xp=cupy)
        h1 = mlp.train(serial, (x, y), epochs=2, batch_size=batch, lr=0.5, momentum=0.9, activation="relu",
                       cost="cross_entropy", progress=False)
        dist = mlp.init_params([20, 12, 5], seed=1, dtype=np.float64, xp=cupy)
        dp = DataParallel(comm, allreduce="nccl", fused=fused, timeout=60)
        h2 = mlp.train(dist, (x, y), epochs=2, batch_size=batch, lr=0.5, momentum=0.9, activation="relu",
                       cost="cross_entropy", method=dp, progress=False)
        for (a, b), (c, d) in zip(dist, serial):
            np.testing.assert_allclose(a.get(), c.get(), rtol=1e-5, atol=1e-10, err_msg=f"batch {batch}")
            np.testing.assert_allclose(b.get(), d.get(), rtol=1e-5, atol=1e-10, err_msg=f"batch {batch}")
        np.testing.assert_allclose(h2.train_loss, h1.train_loss, rtol=1e-6)
        dp.close()
    dp = DataParallel(comm, allreduce="nccl", timeout=60)
    refused(lambda: dp(mlp.init_params([4, 3]), np.zeros((2, 4)), np.zeros(2, int)), TypeError, "CuPy arrays")
    dp.close()


run_cases(comm)
