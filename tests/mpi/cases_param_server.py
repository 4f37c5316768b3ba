"""Parameter servers: exact where no staleness can occur, bounded where promised, complete when uneven.

Run: mpiexec -n 4 python -m mpi4py tests/mpi/cases_param_server.py [-k NAME]   (prints "OK <p>" on rank 0)
"""

import numpy as np
from _cases import case, refused, run_cases
from mpi4py import MPI

from labkit import mlp, param_server
from labkit.shards import shard_bounds

comm = MPI.COMM_WORLD
size, rank = comm.Get_size(), comm.Get_rank()
rng = np.random.default_rng(0)
x = rng.random((103, 12)).astype(np.float32)
y = rng.integers(0, 4, 103)
sizes = [12, 10, 4]


def serial_sgd(epochs, batch, lr, seed):
    """What one worker does alone: the same order of batches, plain SGD."""
    params = mlp.init_params(sizes, seed=seed, dtype=np.float32, init="he")
    Y = mlp.targets(y, 4, np.float32)
    order_rng = np.random.default_rng(seed + 1000)
    for _ in range(epochs):
        order = order_rng.permutation(len(x))
        for j in range(0, len(x), batch):
            idx = order[j:j + batch]
            _, g = mlp.loss_and_grads_unchecked(params, x[idx], Y[idx], "relu", "cross_entropy", 0.0)
            mlp.SGD(lr).step(params, g)
    return params


@case("one worker: every mode equals serial SGD")
def _():  # no staleness is possible
    sub = comm.Split(0 if rank < 2 else MPI.UNDEFINED, rank)
    if sub != MPI.COMM_NULL:
        want = serial_sgd(2, 10, 0.1, seed=3)
        for mode in param_server.MODES:
            res = param_server.train(sub, sizes, (x, y), masters=1, mode=mode, epochs=2, batch_size=10, lr=0.1, seed=3,
                                     timeout=30)
            if sub.Get_rank() == 0:
                for (a, b), (c, d) in zip(res.params, want):
                    np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6, err_msg=mode)
                    np.testing.assert_allclose(b, d, rtol=1e-5, atol=1e-6, err_msg=mode)
                assert (res.staleness == 0).all(), (mode, res.staleness)
        sub.Free()


@case("all ranks: uneven shards accounted for, staleness as promised")
def _():
    if size >= 3:
        for masters in range(1, size - 1):
            workers = size - masters
            expected_steps = [2 * -(-(hi - lo) // 7) for lo, hi in shard_bounds(len(x), workers)]
            for mode, bound in (("async", None), ("sync", None), ("ssp", 0), ("ssp", 2)):
                res = param_server.train(comm, sizes, (x, y), masters=masters, mode=mode, epochs=2, batch_size=7, lr=0.05,
                                         staleness_bound=bound or 0, timeout=30)
                if rank == 0:
                    what = f"{mode} bound={bound} masters={masters}"
                    assert res.worker_steps.tolist() == expected_steps, (what, res.worker_steps, expected_steps)
                    assert len(res.master_updates) == masters, what
                    if mode == "sync":
                        assert (res.staleness == 0).all() and (res.master_updates == max(expected_steps)).all(), what
                    else:
                        assert (res.master_updates == sum(expected_steps)).all(), (what, res.master_updates)
                        assert len(res.staleness) == masters * sum(expected_steps) and (res.staleness >= 0).all(), what
                    if mode == "ssp":
                        # between a worker's reply and its next gradient, every other worker can go from `bound` steps
                        # behind it to `bound` + 1 ahead (applied, then held): at most 2 bound + 1 updates each
                        assert res.staleness.max() <= (2 * bound + 1) * (workers - 1), (what, res.staleness.max())
                    assert all(np.isfinite(W).all() for W, _ in res.params), what


@case("a failing worker: every rank raises its error, promptly")
def _():
    if size >= 2:
        def failing(comm, grad, flat, bounds, batches, timeout):
            for step, batch in enumerate(batches):
                if step == 3 and comm.Get_rank() == size - 1:
                    raise ValueError("boom in the last worker")
                g = grad(*batch)
                reqs = []
                for m, (lo, hi) in enumerate(bounds):
                    reqs.append(comm.Isend(np.append(g[lo:hi], 0).astype(flat.dtype), dest=m, tag=param_server.GRAD))
                    reply = np.empty(hi - lo + 1, dtype=flat.dtype)
                    reqs.append(comm.Irecv(reply, source=m, tag=param_server.WEIGHTS))
                MPI.Request.Waitall(reqs)
            for m in range(len(bounds)):
                comm.Send(np.empty(0, dtype=flat.dtype), dest=m, tag=param_server.DONE)

        t0 = MPI.Wtime()
        try:
            param_server.train(comm, sizes, (x, y), masters=1, epochs=2, batch_size=5, worker=failing, timeout=20)
            raise AssertionError("no error from a failing worker")
        except param_server.ParameterServerError as e:
            assert "boom in the last worker" in str(e) and f"rank {size - 1}" in str(e), str(e)
        assert MPI.Wtime() - t0 < 10, MPI.Wtime() - t0


@case("bad arguments are refused on every rank, before any message")
def _():
    for kwargs, match in (({"masters": 0}, "at least one master"), ({"masters": size}, "at least one master"),
                          ({"mode": "gossip"}, "mode must be")):
        refused(lambda: param_server.train(comm, sizes, (x, y), **kwargs), ValueError, match)  # noqa: B023


run_cases(comm)
