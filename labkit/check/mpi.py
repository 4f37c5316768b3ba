"""Checks of labs 07-09, run on every MPI rank (``%%px``): the ring allreduce, the data-parallel step and the
asynchronous parameter-server worker. Each runs the student's function on sub-communicators of 1..p ranks; the
ranks agree after every case, so all raise together and none waits on a peer that gave up."""

from __future__ import annotations

import numpy as np

from .. import mlp
from ..errors import LabkitError
from ..shards import shard_bounds
from . import capture
from .common import ExerciseError, compare_grads, not_written, passed, recorded
from .exercises import Exercise


@recorded
def ring_allreduce(fn, comm=None, timeout: float = 20.0) -> None:
    """Exercise (lab 07): ``fn(comm, x, op)`` must be a ring allreduce. Call on every MPI rank (``%%px``).

    Runs ``fn`` on sub-communicators of 1, 2, ..., p ranks, with lengths 0, 1, shorter than, equal to and
    not divisible by the rank count, several dtypes and ops; compares with ``MPI_Allreduce``, checks that
    ``x`` is untouched, and records the traffic: 2 (k - 1) messages per rank, all to the right-hand
    neighbour, about 2 (k - 1)/k of the array in total. Every rank raises the same ExerciseError on failure.
    """
    from mpi4py import MPI

    comm = comm or MPI.COMM_WORLD
    ex = "ring allreduce"
    fn = capture.student(fn, ex=ex)
    cases = [(np.float64, MPI.SUM), (np.int64, MPI.MAX), (np.int32, MPI.PROD), (np.float32, MPI.MIN)]

    def run(sub, k):
        for n in sorted({0, 1, max(k - 1, 1), k + 1, 2 * k + 3, 1000}):
            for dtype, op in cases:
                yield lambda n=n, dtype=dtype, op=op: ring_case(fn, sub, k, n, dtype, op, timeout, ex)

    collective_check(comm, ex, run)


def collective_check(comm, ex: str, cases) -> None:
    """Run ``cases(sub, k)`` (a generator of case functions returning an error string or None) on
    sub-communicators of the first k = 1..p ranks. Ranks agree after every case, so nobody starts a case
    the others skipped; on failure every rank raises (rank 0 with the message)."""
    from ..cluster import first_ranks
    from ..collectives import first_cause

    p, rank = comm.Get_size(), comm.Get_rank()
    n_checks, error = 0, None
    for k in range(1, p + 1):
        with first_ranks(comm, k) as sub:
            if sub:
                for case in cases(sub, k):
                    if error is None:
                        error = case()
                    n_checks += 1
                    error = first_cause(sub.allgather(error))
                    if error:
                        break
        error = first_cause(comm.allgather(error))
        if error:
            if rank == 0:  # one message for the student: the other ranks return quietly, rank 0's error fails the cell
                raise ExerciseError(error)
            return
    if rank == 0:
        passed(f"{ex} on 1 to {p} ranks", n_checks)


class RingMistake(LabkitError):
    """A student's ring did something no ring does (the message says what); raised at once, not after a timeout."""


def _ring_comm(comm, timeout):
    """A TrafficComm for the ring check that stops a student's function at once, naming the mistake, when it sends to
    or receives from a rank other than its ring neighbours, or calls one of the library's own collectives."""
    from mpi4py import MPI

    from ..traffic import TrafficComm

    r, k = comm.Get_rank(), comm.Get_size()
    right, left = (r + 1) % k, (r - 1) % k
    neighbours = (f"a ring sends only to the right-hand neighbour (r + 1) mod p = {right} and receives only from "
                  f"the left-hand one (r - 1) mod p = {left}")

    def peer(verb: str, other, want: int) -> None:
        if other != want and other != MPI.ANY_SOURCE:
            raise RingMistake(f"rank {r} {verb} rank {other}, but {neighbours}")

    def library(name: str):
        return RingMistake(f"your function called comm.{name}, the library's own collective. The exercise builds the "
                           "allreduce from point-to-point messages: 2 (p - 1) steps of comm.Sendrecv, each sending one "
                           "chunk to the right-hand neighbour and receiving one from the left-hand one")

    class RingComm(TrafficComm):
        def Send(self, buf, dest, tag=0):  # noqa: N802
            peer("sent to", dest, right)
            return super().Send(buf, dest, tag)

        def Isend(self, buf, dest, tag=0):  # noqa: N802
            peer("sent to", dest, right)
            return super().Isend(buf, dest, tag)

        def Recv(self, buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=None):  # noqa: N802
            peer("received from", source, left)
            return super().Recv(buf, source, tag, status)

        def Irecv(self, buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG):  # noqa: N802
            peer("received from", source, left)
            return comm.Irecv(buf, source, tag)

        def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=MPI.ANY_SOURCE,  # noqa: N802
                     recvtag=MPI.ANY_TAG, status=None):
            peer("sent to", dest, right)
            peer("received from", source, left)
            return super().Sendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag, status)

        # the library's reductions: TrafficComm's own timed ones, and through __getattr__ the others
        def Allreduce(self, *args, **kwargs):  # noqa: N802
            raise library("Allreduce")

        def Reduce(self, *args, **kwargs):  # noqa: N802
            raise library("Reduce")

        def __getattr__(self, name):
            if name.lower().removeprefix("i") in _LIBRARY_COLLECTIVES:
                raise library(name)
            return super().__getattr__(name)

    return RingComm(comm, timeout=timeout)


# the reductions the ring replaces (agreeing on arguments with allgather, as labkit's own ring does, is allowed)
_LIBRARY_COLLECTIVES = {"allreduce", "reduce", "reduce_scatter", "reduce_scatter_block", "scan", "exscan"}


def _wrong_values_hint(got, want, n, k, r, sent_messages) -> str:
    """What a ring that returns wrong values most likely got wrong, from which chunks are right."""
    if k > 1 and sent_messages == k - 1:
        return ("you sent p - 1 messages: the reduce-scatter ran, but the allgather phase is missing. After the "
                "reduce-scatter rank r holds the full result only in chunk (r + 1) mod p; p - 1 more steps pass the "
                "finished chunks around (send chunk (r - s + 1) mod p, store the received chunk (r - s) mod p)")
    chunks = shard_bounds(n, k)
    right = [bool(np.allclose(got[lo:hi], want[lo:hi], rtol=1e-5)) for lo, hi in chunks]
    finished = chunks[(r + 1) % k]
    if k > 1 and finished[1] > finished[0] and right[(r + 1) % k] and not all(right):
        return ("chunk (r + 1) mod p is right, so the reduce-scatter works; the allgather phase is wrong: in step s "
                "send chunk (r - s + 1) mod p and store (do not combine) the received chunk (r - s) mod p")
    return ("check which chunk you send and receive at each step: in the reduce-scatter, step s, rank r sends chunk "
            "(r - s) mod p and receives chunk (r - s - 1) mod p, and combines it with its own copy")


def ring_case(fn, sub, k, n, dtype, op, timeout, ex) -> str | None:
    """One check on one sub-communicator; returns what went wrong (or None), never raises."""
    from ..collectives import op_name

    r = sub.Get_rank()
    where = f"{k} rank{'s' if k > 1 else ''}, n={n}, {np.dtype(dtype)}, MPI.{op_name(op)}, rank {r}"
    x, before, want = _ring_inputs(sub, k, r, n, dtype, op)
    work = sub.Dup()  # the student's messages stay apart from the check's own, even if some are abandoned
    tc = _ring_comm(work, timeout)
    got, error = _call_ring(fn, tc, x, op, where, ex)
    if error is None:
        error = _ring_result_error(got, x, before, want, n, k, r, tc.log, where, ex)
    if error is None and k > 1 and n >= k:
        error = _ring_traffic_error(tc.log, x.itemsize, n, k, r, where, ex)
    if error:
        return error  # work is not freed: a rank may have abandoned an operation on it
    work.Free()
    return None


def _ring_inputs(sub, k, r, n, dtype, op):
    """This rank's x (drawn from its own seed), a copy to tell whether it changed, and MPI_Allreduce's answer."""
    from mpi4py import MPI

    rng = np.random.default_rng(capture.seed(100 * k + r))
    x = (rng.integers(1, 4, n) if op == MPI.PROD else rng.integers(-50, 50, n)).astype(dtype)
    before = x.copy()
    want = np.empty_like(x)
    sub.Allreduce(x, want, op=op)
    return x, before, want


def _call_ring(fn, tc, x, op, where, ex):
    """The student's ``fn(tc, x, op)``: (what it returned, None), or (None, what went wrong) when it raised."""
    from mpi4py import MPI

    try:
        return fn(tc, x, op), None
    except NotImplementedError:
        return None, not_written(ex)
    except RingMistake as e:
        return None, f"{ex} ({where}): {e}"
    except (ExerciseError, capture.NotRecorded) as e:
        return None, f"{e} ({where})"
    except TimeoutError as e:
        return None, f"{ex} ({where}): {e}\nHint: every Send needs a matching Recv on the neighbour; use Sendrecv"
    except MPI.Exception as e:
        return None, (f"{ex} ({where}): MPI reported an error: {e.Get_error_string()}\nHint: most often a message is "
                      "larger than the buffer receiving it: in each step the chunk a rank sends must be the chunk its "
                      "neighbour receives (same index, same size); chunks differ in size when n is not divisible by p")
    except Exception as e:
        return None, f"{ex} ({where}): your function raised {type(e).__name__}: {e}"


def _ring_result_error(got, x, before, want, n, k, r, log, where, ex) -> str | None:
    """What is wrong with the returned array (type, shape, dtype, values) or with x, or None."""
    if not isinstance(got, np.ndarray):
        return f"{ex} ({where}): returned {type(got).__name__}, expected a NumPy array"
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{ex} ({where}): returned shape {got.shape} {got.dtype}, expected {want.shape} {want.dtype}"
    if not np.array_equal(x, before):
        return f"{ex} ({where}): x was modified\nHint: work on a copy (out = x.copy()) and return it"
    if not np.allclose(got, want, rtol=1e-5):
        bad = np.flatnonzero(~np.isclose(got, want, rtol=1e-5))
        hint = _wrong_values_hint(got, want, n, k, r, sum(row[0] == r for row in log))
        return (f"{ex} ({where}): wrong values at {len(bad)} of {n} positions, first at index {bad[0]}: "
                f"got {got[bad[0]]}, expected {want[bad[0]]}\nHint: {hint}")
    return None


def _ring_traffic_error(log, itemsize, n, k, r, where, ex) -> str | None:
    """What is wrong with the messages this rank sent (to whom, how many, how many bytes), or None."""
    sent = [row for row in log if row[0] == r]
    if not sent:
        return (f"{ex} ({where}): no messages were recorded\nHint: use the buffer methods of comm "
                "(comm.Sendrecv / comm.Send / comm.Isend on NumPy arrays), not the lowercase ones")
    right = (r + 1) % k
    if any(dest != right for _, dest, _, _ in sent):
        return (f"{ex} ({where}): rank {r} sent to ranks {sorted({d for _, d, _, _ in sent})}; "
                f"a ring sends only to its right-hand neighbour {right}")
    if len(sent) != 2 * (k - 1):
        return (f"{ex} ({where}): rank {r} sent {len(sent)} messages; a ring allreduce sends 2 (p - 1) = "
                f"{2 * (k - 1)}: p - 1 in the reduce-scatter, p - 1 in the allgather")
    nbytes = sum(b for _, _, b, _ in sent)
    lo, hi = 2 * (k - 1) * (n // k) * itemsize, 2 * (k - 1) * -(-n // k) * itemsize
    if not lo <= nbytes <= hi:
        return (f"{ex} ({where}): rank {r} sent {nbytes} bytes; a ring sends about 2 (p - 1)/p of the array "
                f"({lo} to {hi} bytes)\nHint: send one chunk of about n/p elements per step, not the whole array")
    return None


@recorded
def data_parallel_step(fn, comm=None, timeout: float = 20.0) -> None:
    """Exercise (lab 08): ``fn(comm, params, x, Y) -> grads`` on every rank (``%%px``).

    Every rank passes the same global batch; the result must be the gradient of the mean quadratic cost
    over the *whole* batch (sigmoid network), on every rank, computed from this rank's shard only: on each rank the
    check fills the rows of the other ranks' shards with NaN, so a rank that backprops more than its own rows gets NaN.
    Checked on 1..p ranks with batches that divide the rank count, do not, and are smaller than it.
    """
    from mpi4py import MPI

    comm = comm or MPI.COMM_WORLD
    ex = "data-parallel step"
    fn = capture.student(fn, ex=ex)

    def run(sub, k):
        for batch in sorted({1, max(k - 1, 1), k, 2 * k + 1, 12}):
            yield lambda batch=batch: data_parallel_case(fn, sub, k, batch, timeout, ex)

    collective_check(comm, ex, run)


def data_parallel_case(fn, sub, k, batch, timeout, ex) -> str | None:
    """One batch on one sub-communicator; returns what went wrong (or None), never raises."""
    r = sub.Get_rank()
    where = f"{k} rank{'s' if k > 1 else ''}, batch {batch}, rank {r}"
    params, x, Y, want = _dp_problem(batch)
    lo, hi = shard_bounds(batch, k)[r]
    mine_x, mine_Y = _own_rows_only(x, Y, lo, hi)
    work = sub.Dup()  # the student's messages stay apart from the check's own, even if some are abandoned
    got, error = _call_dp(fn, work, timeout, params, mine_x, mine_Y, where, ex)
    shaped = error is None and _dp_shaped(got, want)
    # every rank of sub takes part in the allgather (a rank that failed says False), so nobody waits alone
    if k > 1 and all(sub.allgather(shaped)):
        error = _shares_not_summed(sub, got, want, where, ex)
    if error is None and shaped and any(np.isnan(np.asarray(a, dtype=np.float64)).any() for g in got for a in g):
        error = (f"{ex} ({where}): rank {r}'s gradients hold NaN: it used rows outside its shard {lo}:{hi} (the check "
                 "puts NaN in the other ranks' rows)\nHint: each rank backprops only its floor + remainder share, "
                 "lo, hi = shard_bounds(len(x), p)[rank], and the allreduce brings in the rest")
    if error:
        return error  # work is not freed: a rank may have abandoned an operation on it
    work.Free()
    try:
        compare_grads(ex, got, want, batch, where)
    except ExerciseError as e:
        return str(e)
    return None


def _dp_problem(batch):
    """The batch's network, inputs and targets (the same on every rank), and the gradient over the whole batch."""
    rng = np.random.default_rng(capture.seed(batch))
    params = mlp.init_params([6, 5, 3], seed=capture.seed(batch), dtype=np.float64)
    x = rng.random((batch, 6))
    Y = mlp.targets(rng.integers(0, 3, batch), 3, np.float64)
    want = mlp.backprop(params, x, Y, "sigmoid", "quadratic")
    return params, x, Y, want


def _own_rows_only(x, Y, lo, hi):
    """Copies of x and Y in which only this rank's rows lo:hi are real; the other ranks' rows are NaN."""
    mine_x, mine_Y = x.copy(), Y.copy()
    for a in (mine_x, mine_Y):
        a[:lo] = np.nan
        a[hi:] = np.nan
    return mine_x, mine_Y


def _call_dp(fn, work, timeout, params, x, Y, where, ex):
    """The student's ``fn(comm, params, x, Y)``: (what it returned, None), or (None, what went wrong) when it raised."""
    from ..traffic import TrafficComm

    try:
        return fn(TrafficComm(work, timeout=timeout), params, x, Y), None
    except NotImplementedError:
        return None, not_written(ex)
    except (ExerciseError, capture.NotRecorded) as e:
        return None, f"{e} ({where})"
    except Exception as e:
        hint = ("\nHint: when the batch is smaller than the number of ranks some ranks get no samples; "
                "they contribute zero gradients (mlp.zeros_like(params))") if "no samples" in str(e) else ""
        return None, f"{ex} ({where}): your function raised {type(e).__name__}: {e}{hint}"


def _dp_shaped(got, want) -> bool:
    """Whether ``got`` is a list of (dW, db) pairs of the reference's shapes."""
    return isinstance(got, (list, tuple)) and len(got) == len(want) and all(
        isinstance(g, (list, tuple)) and len(g) == 2 and np.shape(g[0]) == w[0].shape and np.shape(g[1]) == w[1].shape
        for g, w in zip(got, want))


def _shares_not_summed(sub, got, want, where, ex) -> str | None:
    """Called on every rank of sub: the mistake of returning only this rank's share, when the shares add up to the
    answer but the rank's own result is not it; else None."""
    summed = [sub.allreduce(np.asarray(a, dtype=np.float64)) for g in got for a in g]
    if all(np.allclose(a, b) for a, b in zip(summed, (a for w in want for a in w))) and not all(
            np.allclose(a, b) for g, w in zip(got, want) for a, b in zip(g, w)):
        return (f"{ex} ({where}): each rank returned only its own shard's share; added up over the ranks "
                "they are right\nHint: sum the shards with comm.Allreduce, so every rank holds the total")
    return None


# the training run of the lab 09 check: layer sizes, learning rate, batch size, epochs
_COLLECTIVES = ("ring_allreduce", "naive_allreduce", "reduce_broadcast_allreduce", "recursive_doubling_allreduce",
                "mpi_allreduce")

EXERCISES = (
    Exercise("ring_allreduce", "07", "mpi", references=tuple(f"labkit.collectives:{f}" for f in _COLLECTIVES), mpi=True),
    Exercise("data_parallel_step", "08", "mpi", mpi=True,
             references=("labkit.data_parallel:DataParallel", "labkit.data_parallel:ShardedSGD")),
)
