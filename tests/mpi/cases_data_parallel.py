"""Data-parallel training equals the serial run over the same global batches, on every rank.

Run: mpiexec -n 3 python -m mpi4py tests/mpi/cases_data_parallel.py [-k NAME]   (prints "OK <p>" on rank 0)
"""

import numpy as np
from _cases import case, refused, run_cases
from mpi4py import MPI

from labkit import mlp
from labkit.comm_backends import SharedMemoryAllreduce
from labkit.data_parallel import DataParallel
from labkit.device import gpu_status
from labkit.shards import flatten, unflatten

comm = MPI.COMM_WORLD
rng = np.random.default_rng(0)
x = rng.random((61, 20))
y = rng.integers(0, 5, 61)
p, r = comm.Get_size(), comm.Get_rank()


def _equal_to_serial_case(allreduce, fused):
    @case(f"equal to serial: {allreduce}, fused={fused}")
    def _():
        for batch in (20, 7, 3):  # 3 < 4 ranks: some ranks get no samples
            serial = mlp.init_params([20, 12, 5], seed=1, dtype=np.float64)
            h1 = mlp.train(serial, (x, y), epochs=2, batch_size=batch, lr=0.5, momentum=0.9, l2=1e-3,
                           activation="relu", cost="cross_entropy", progress=False)
            dist = mlp.init_params([20, 12, 5], seed=1, dtype=np.float64)
            dp = DataParallel(comm, allreduce=allreduce, fused=fused, timeout=60)
            h2 = mlp.train(dist, (x, y), epochs=2, batch_size=batch, lr=0.5, momentum=0.9, l2=1e-3,
                           activation="relu", cost="cross_entropy", method=dp, progress=False)
            what = f"batch {batch}, {allreduce}, fused={fused}"
            for (a, b), (c, d) in zip(dist, serial):
                np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-10, err_msg=what)
                np.testing.assert_allclose(b, d, rtol=1e-5, atol=1e-10, err_msg=what)
            np.testing.assert_allclose(h2.train_loss, h1.train_loss, rtol=1e-6, err_msg=what)
            assert dp.steps == 2 * -(-61 // batch) and dp.comm_seconds > 0 or comm.Get_size() == 1
            everyone = comm.allgather(flatten(dist).tobytes())
            assert all(e == everyone[0] for e in everyone), f"{what}: ranks disagree"
            dp.close()


for _allreduce in ("ring", "mpi", "recursive_doubling", "shm"):
    for _fused in (True, False) if _allreduce != "shm" else (True,):
        _equal_to_serial_case(_allreduce, _fused)


@case("overlapped buckets equal the blocking step")
def _():  # DDP-style overlap: the same weights as the fused blocking step, for bucket sizes from one layer to all
    for bucket_bytes, progress, allreduce in ((1, "layers", "mpi"), (300, "thread", "mpi"), (1 << 20, "none", "mpi"),
                                              (1, "layers", "ring"), (300, "none", "ring")):
        for batch in (20, 7, 3):  # 3 < 4 ranks: some ranks get no samples and send every bucket at once
            runs = {}
            for overlap in (False, True):
                params = mlp.init_params([20, 16, 12, 5], seed=1, dtype=np.float64)
                dp = DataParallel(comm, allreduce=allreduce, timeout=60, overlap=overlap, bucket_bytes=bucket_bytes,
                                  progress=progress)
                hist = mlp.train(params, (x, y), epochs=2, batch_size=batch, lr=0.5, momentum=0.9, l2=1e-3,
                                 activation="relu", cost="cross_entropy", method=dp, progress=False)
                runs[overlap] = (flatten(params), hist.train_loss)
            what = f"{allreduce}, bucket_bytes {bucket_bytes}, progress {progress}, batch {batch}"
            np.testing.assert_allclose(runs[True][0], runs[False][0], rtol=1e-12, atol=1e-14, err_msg=what)
            np.testing.assert_allclose(runs[True][1], runs[False][1], rtol=1e-12, err_msg=what)
            everyone = comm.allgather(runs[True][0].tobytes())
            assert all(e == everyone[0] for e in everyone), f"ranks disagree: {what}"
    params = mlp.init_params([20, 16, 12, 5], seed=1, dtype=np.float64)
    assert list(DataParallel(comm, allreduce="mpi", overlap=True, bucket_bytes=1).buckets(params)) == [2, 1, 0]
    assert list(DataParallel(comm, allreduce="mpi", overlap=True, bucket_bytes=1 << 20).buckets(params)) == [0]
    refused(lambda: DataParallel(comm, allreduce="naive", overlap=True), ValueError, "use allreduce='mpi' or 'ring'")
    refused(lambda: DataParallel(comm, allreduce="mpi", overlap=True, progress="often"), ValueError, "'thread'")
    refused(lambda: DataParallel(comm, allreduce="mpi", overlap=True, bucket_bytes=0), ValueError, "bucket_bytes")


@case("the shared-memory allreduce on its own")
def _():  # sizes smaller than, equal to and larger than the rank count, two dtypes
    for n in (1, p, 2 * p + 1, 10_007):
        for dtype in (np.float32, np.float64):
            shm = SharedMemoryAllreduce(comm, n, dtype, timeout=30)
            for step in range(3):  # reused: every call sees the new contributions
                mine = np.random.default_rng(100 * step + r).standard_normal(n).astype(dtype)
                shm.mine[:] = mine
                want = np.empty_like(mine)
                comm.Allreduce(mine, want)
                np.testing.assert_allclose(shm.reduce(), want, rtol=1e-5, atol=1e-5, err_msg=f"shm n={n} {dtype}")
            shm.free()
    refused(lambda: DataParallel(comm, allreduce="shm", fused=False), ValueError, "fused=True")


@case("sharded update equals serial SGD and restores the caller's arrays")
def _():  # shard_update=True, with and without momentum: the caller's own arrays are back in params, holding the result
    for batch in (20, 7, 3):
        for momentum in (0.9, 0.0):
            serial = mlp.init_params([20, 12, 5], seed=1, dtype=np.float64)
            h1 = mlp.train(serial, (x, y), epochs=2, batch_size=batch, lr=0.5, momentum=momentum, activation="relu",
                           cost="cross_entropy", progress=False)
            dist = mlp.init_params([20, 12, 5], seed=1, dtype=np.float64)
            arrays = [a for pair in dist for a in pair]
            dp = DataParallel(comm, allreduce="shm", shard_update=True, timeout=60)
            h2 = mlp.train(dist, (x, y), epochs=2, batch_size=batch, lr=0.5, momentum=momentum, activation="relu",
                           cost="cross_entropy", method=dp, progress=False)
            what = f"sharded update, batch {batch}, momentum {momentum}"
            assert all(a is b for a, b in zip(arrays, [a for pair in dist for a in pair])), f"{what}: params not restored"
            for (a, b), (c, d) in zip(dist, serial):
                np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-10, err_msg=what)
                np.testing.assert_allclose(b, d, rtol=1e-5, atol=1e-10, err_msg=what)
            np.testing.assert_allclose(h2.train_loss, h1.train_loss, rtol=1e-6, err_msg=what)
            # outside mlp.train it has no optimizer to apply its step
            refused(lambda: dp(dist, x[:8], y[:8]), RuntimeError, "mlp.train")  # noqa: B023 - called at once
            dp.close()


@case("sharded update refusals leave the weights as they were")
def _():
    dp = DataParallel(comm, allreduce="shm", shard_update=True, timeout=60)
    dist = mlp.init_params([20, 12, 5], seed=1, dtype=np.float64)
    before = flatten(dist).copy()
    refused(lambda: mlp.train(dist, (x, y), epochs=1, batch_size=8, lr=0.5, l2=1e-3, method=dp, progress=False),
            ValueError, "l2")
    assert np.array_equal(flatten(dist), before), "a failed run leaves the caller's weights as they were"
    dp.close()
    refused(lambda: DataParallel(comm, allreduce="ring", shard_update=True), ValueError, "allreduce='shm'")


@case("nccl without GPUs fails on every rank at once")
def _():
    if not gpu_status()[0]:  # without GPUs, allreduce="nccl" fails on every rank at once, naming each rank's problem
        refused(lambda: DataParallel(comm, allreduce="nccl", timeout=30), RuntimeError,
                *(f"rank {k}: no usable GPU" for k in range(comm.Get_size())))


@case("flatten and unflatten")
def _():
    g = mlp.init_params([4, 3, 2], dtype=np.float32)
    assert all(np.array_equal(a, b) for (a, c), (b, d) in zip(unflatten(flatten(g), g), g))


run_cases(comm)
