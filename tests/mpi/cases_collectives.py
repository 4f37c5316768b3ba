"""Every labkit collective against the MPI library's own, on this job's ranks.

Run: mpiexec -n 4 python -m mpi4py tests/mpi/cases_collectives.py [-k NAME]   (prints "OK <p>" on rank 0)
"""

import time

import numpy as np
from _cases import case, refused, run_cases
from mpi4py import MPI

from labkit import collectives as C
from labkit.collectives import CollectiveError
from labkit.shards import shard_bounds
from labkit.traffic import TrafficComm

comm = MPI.COMM_WORLD
p, r = comm.Get_size(), comm.Get_rank()
LENGTHS = sorted({0, 1, 2, max(p - 1, 0), p, p + 1, 2 * p + 3, 1000})
DTYPES = [np.int32, np.int64, np.uint8, np.float32, np.float64, np.complex128]
OPS = [MPI.SUM, MPI.PROD, MPI.MAX, MPI.MIN]


def data(dtype, shape, rank, op=MPI.SUM):
    rng = np.random.default_rng(1000 + rank)
    lo, hi = (1, 3) if op == MPI.PROD else (-50, 50)
    if np.dtype(dtype).kind == "u":
        lo = max(lo, 0)
    x = rng.integers(lo, hi, size=shape)
    if np.dtype(dtype).kind == "f":
        x = x * rng.random(shape) + 0.25
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.integers(lo, hi, size=shape)
    return np.ascontiguousarray(x.astype(dtype))


def same_everywhere(a):
    """Every rank holds exactly the same bits."""
    digests = comm.allgather(a.tobytes())
    assert all(d == digests[0] for d in digests), "ranks disagree"


def close(got, want, dtype, what):
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape, got.dtype)
    if np.dtype(dtype).kind in "fc":
        tol = 1e-4 if np.dtype(dtype) in (np.float32, np.complex64) else 1e-10
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def _allreduce_case(name, fn):
    @case(f"allreduce {name}")
    def _():
        for dtype in DTYPES:
            for op in OPS:
                if np.dtype(dtype).kind == "c" and C.op_name(op) in ("MAX", "MIN"):
                    continue
                for n in LENGTHS:
                    x = data(dtype, n, r, op)
                    before = x.copy()
                    want = np.empty_like(x)
                    comm.Allreduce(x, want, op=op)
                    got = fn(comm, x, op)
                    what = f"{name} {np.dtype(dtype)} {C.op_name(op)} n={n}"
                    close(got, want, dtype, what)
                    assert np.array_equal(x, before), f"{what}: x was modified"
                    assert got is not x
                    same_everywhere(got)
        x = data(np.float64, (3, 5), r)
        want = np.empty_like(x)
        comm.Allreduce(x, want)
        close(fn(comm, x), want, np.float64, f"{name} 2-D")


for _name, _fn in C.ALLREDUCES.items():
    _allreduce_case(_name, _fn)


@case("broadcast")
def _():
    for root in range(p):
        for algorithm in ("linear", "tree"):
            for n in (0, 1, 7, 1000):
                x = data(np.float64, n, r)
                want = x.copy()
                comm.Bcast(want, root=root)
                got = C.broadcast(comm, x, root=root, algorithm=algorithm)
                close(got, want, np.float64, f"broadcast {algorithm} root={root} n={n}")


@case("scatter")
def _():
    for root in range(p):
        for rows in (0, 1, p + 1, 10):
            full = data(np.int64, (rows, 3), 99)
            got = C.scatter(comm, full if r == root else None, root=root)
            lo, hi = shard_bounds(rows, p)[r]
            close(got, full[lo:hi], np.int64, f"scatter root={root} rows={rows}")


@case("gather")
def _():
    for root in range(p):
        piece = data(np.float32, (r + 1, 2), r)  # uneven pieces
        got = C.gather(comm, piece, root=root)
        if r == root:
            close(got, np.concatenate([data(np.float32, (k + 1, 2), k) for k in range(p)]), np.float32, "gather")
        else:
            assert got is None


@case("reduce")
def _():
    for root in range(p):
        for op in OPS:
            x = data(np.int64, 9, r, op)
            want = np.empty_like(x) if r == root else None
            comm.Reduce(x, want, op=op, root=root)
            got = C.reduce(comm, x, op=op, root=root)
            if r == root:
                close(got, want, np.int64, f"reduce root={root} {C.op_name(op)}")
            else:
                assert got is None


@case("alltoall")
def _():
    for rows in (0, p, 2 * p + 1):
        x = data(np.int32, (rows, 2), r)
        got = C.alltoall(comm, x)
        bounds = shard_bounds(rows, p)
        want = np.concatenate([data(np.int32, (rows, 2), src)[bounds[r][0]:bounds[r][1]] for src in range(p)])
        close(got, want, np.int32, f"alltoall rows={rows}")


@case("traffic: the ring is a ring, the naive one all-to-all")
def _():
    if p == 1:
        return
    N = 1000
    for name, rounds, per_rank in (("ring", 2 * (p - 1), None), ("naive", 1, (p - 1) * N * 8)):
        tc = TrafficComm(comm)
        C.ALLREDUCES[name](tc, np.ones(N), check=False)
        log = tc.gather_log(root=0)
        if r == 0:
            for src in range(p):
                mine = log[log[:, 0] == src]
                assert len(set(mine[:, 3])) == rounds, (name, src, sorted(set(mine[:, 3])))
                sent = mine[:, 2].sum()
                if name == "ring":
                    assert (mine[:, 1] == (src + 1) % p).all(), "ring messages go to the right-hand neighbour only"
                    assert 2 * (p - 1) * (N // p) * 8 <= sent <= 2 * (p - 1) * -(-N // p) * 8, sent
                else:
                    assert sorted(mine[:, 1]) == [d for d in range(p) if d != src] and sent == per_rank


@case("bad input: a clear error on every rank, never a hang")
def _():
    if p > 1:
        refused(lambda: C.ring_allreduce(comm, np.ones(5 if r == 0 else 6)), CollectiveError,
                "every rank must pass the same shape")
        refused(lambda: C.naive_allreduce(comm, np.ones(4, np.float32 if r else np.float64)), CollectiveError, "rank 1")
        # with a timeout the ranks agree through a non-blocking allgather: the same errors
        refused(lambda: C.ring_allreduce(comm, np.ones(5 if r == 0 else 6), timeout=10), CollectiveError,
                "every rank must pass the same shape", "rank 0: shape (5,) float64")
        refused(lambda: C.ring_allreduce(comm, np.ones(3, bool) if r == p - 1 else np.ones(3), timeout=10), TypeError,
                f"rank {p - 1}", "bool")
    refused(lambda: C.ring_allreduce(comm, np.ones((4, 4))[:, 1]), ValueError, "not C-contiguous")
    refused(lambda: C.ring_allreduce(comm, np.ones(3, np.float16)), TypeError, "use float32")
    refused(lambda: C.ring_allreduce(comm, np.array(["a"], dtype=object)), TypeError, "do not support")
    refused(lambda: C.ring_allreduce(comm, [1.0, 2.0]), TypeError, "must be a NumPy array")
    refused(lambda: C.ring_allreduce(comm, np.ones(3, np.complex128), op=MPI.MAX), TypeError, "not defined for complex")
    refused(lambda: C.ring_allreduce(comm, np.ones(3), op=MPI.LAND), ValueError, "op must be one of")


@case("a rank that never arrives is a TimeoutError, even while the ranks agree on shape and dtype")
def _():
    if p == 1:
        return
    sub = comm.Dup()
    if r != p - 1:  # the last rank is late (as on a host whose cable was cut): the others may not wait for ever
        refused(lambda: C.ring_allreduce(sub, np.ones(4), timeout=1), TimeoutError, "agreeing on shape and dtype")
    else:
        time.sleep(1.5)
        C.check_same(sub, np.ones(4), "late", timeout=10)  # joins the abandoned agreement, so it completes everywhere
    comm.Barrier()
    sub.Free()


@case("one rank's refusal is every rank's error, with the same reason")
def _():
    if p == 1:
        return
    last = p - 1
    bad = np.ones(4, bool) if r == last else np.ones(4)  # MPI takes bool; labkit's collectives do not
    for name in ("ring", "naive", "recursive_doubling"):
        refused(lambda: C.ALLREDUCES[name](comm, bad), TypeError, f"rank {last}", "bool")  # noqa: B023
    refused(lambda: C.broadcast(comm, bad), TypeError, f"rank {last}", "bool")
    refused(lambda: C.reduce(comm, bad), TypeError, f"rank {last}", "bool")
    refused(lambda: C.alltoall(comm, bad), TypeError, f"rank {last}", "bool")
    for root in (0, last):  # scatter: only root's array matters, and its refusal reaches everyone
        refused(lambda: C.scatter(comm, np.ones((p, 2), bool) if r == root else None, root=root, timeout=10),  # noqa: B023
                TypeError, f"rank {root}", "bool")
        refused(lambda: C.gather(comm, bad, root=root, timeout=10), TypeError, f"rank {last}", "bool")  # noqa: B023
    mixed = np.ones((2, 3), np.float32 if r == last else np.float64)
    refused(lambda: C.gather(comm, mixed, root=0, timeout=10), CollectiveError, f"rank {last}")
    wide = np.ones((2, 4 if r == last else 3))
    refused(lambda: C.gather(comm, wide, root=0, timeout=10), CollectiveError, f"rank {last}", "trailing shape")


@case("the non-blocking ring equals the library, several in flight, moved on only by Test")
def _():
    for dtype in (np.int64, np.float64, np.complex128):
        for op in OPS if np.dtype(dtype).kind != "c" else [MPI.SUM, MPI.PROD]:
            xs = [data(dtype, (n,), r, op) for n in LENGTHS]
            want = [np.empty_like(x) for x in xs]
            for x, w in zip(xs, want):
                comm.Allreduce(x, w, op=op)
            reqs = [C.ring_iallreduce(comm, x, op, timeout=30) for x in xs]  # all started before any is waited for
            polls = 0
            while not all([q.Test() for q in reqs]):
                polls += 1
                time.sleep(1e-4)
            for x, w in zip(xs, want):
                exact = np.dtype(dtype).kind == "i" or op in (MPI.MAX, MPI.MIN)  # floats: another order of adding
                assert np.array_equal(x, w) if exact else np.allclose(x, w), (dtype, C.op_name(op), x.size)
                same_everywhere(x)
    one = np.ones(10)
    C.ring_iallreduce(comm, one).Wait()
    assert np.array_equal(one, np.full(10, float(p)))
    if p > 1:  # a ring another rank has not started yet ends in a TimeoutError, not a hang, and stays in flight
        late = np.ones(4)
        first = C.ring_iallreduce(comm, late, timeout=0.5) if r == 0 else None
        if r == 0:
            refused(first.Wait, TimeoutError, "did not start the same ring")
        comm.Barrier()
        if r > 0:
            C.ring_iallreduce(comm, late, timeout=30).Wait()
        else:
            first.timeout = 30
            first.Wait()
        assert np.array_equal(late, np.full(4, float(p)))
    refused(lambda: C.ring_iallreduce(comm, np.ones((4, 4))[:, 1]), ValueError, "C-contiguous")


run_cases(comm)
