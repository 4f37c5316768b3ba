"""Checks of lab 08: synchronous data-parallel SGD, a ladder of exercises.

The rows of the batch one rank takes (a plain function), the mean gradient from every rank's mean over its own rows,
the whole data-parallel step, the step whose allreduces overlap backprop, and when those allreduces end. The MPI
checks run on every rank (``%%px``) on sub-communicators of 1..p ranks (:func:`.common.collective_check`). Every
check names the mistake it recognises.
"""

from __future__ import annotations

import sys

import numpy as np

from .. import mlp
from ..data_parallel import overlapped_end, step_model
from ..shards import shard_bounds
from . import capture
from .common import (
    ExerciseError,
    as_seconds,
    call,
    collective_check,
    compare_grads,
    each_case,
    fail,
    not_written,
    on_given_comm,
    passed,
    recorded,
)
from .exercises import Exercise

# ==== lab 08, exercise 1: the rows of one rank (a plain function) ==================================================

@recorded
def rank_rows(fn) -> None:
    """Exercise (lab 08): ``fn(batch, p, rank) -> (lo, hi)``, the rows x[lo:hi] of a batch that one of p ranks
    backprops: floor(batch/p) each, the first batch % p ranks one more, in rank order. Checked for every rank of
    batches of 0 to 13 rows and 100 on 1 to 8 ranks, and on large ones drawn afresh whenever a notebook is graded."""
    ex = "rows of a rank"
    fn = capture.student(fn, ex=ex)
    rng = np.random.default_rng(capture.seed(80))
    cases = [(10, 4), (7, 3)] + [(b, p) for p in (1, 2, 3, 4, 5, 8) for b in (0, 1, 2, 3, 5, 7, 10, 12, 13, 100)]
    cases += [(int(rng.integers(1000, 1_000_000)), int(rng.integers(9, 65))) for _ in range(2)]
    n = 0
    for batch, p in each_case(cases):
        got = [_row_pair(ex, call(ex, fn, batch, p, r), batch, p, r) for r in range(p)]
        n += p
        want = shard_bounds(batch, p)
        if got != want:
            what, hint = _rows_mistake(got, want, batch, p)
            fail(ex, f"batch = {batch} rows, p = {p} ranks: {what}\n  yours:    {_short(got)}\n  expected: "
                 f"{_short(want)}", hint)
    passed(ex, n)


def _short(pairs) -> str:
    return str(pairs) if len(pairs) <= 8 else f"{str(pairs[:4])[:-1]}, ..., {str(pairs[-2:])[1:]}"


def _row_pair(ex: str, got, batch: int, p: int, r: int) -> tuple[int, int]:
    where = f"batch = {batch} rows, p = {p} ranks, rank {r}"
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(ex, f"{where}: expected a pair (lo, hi), got {type(got).__name__}"
             + (f" of length {len(got)}" if isinstance(got, (tuple, list)) else ""),
             "return this rank's two bounds only, `return lo, hi`, not every rank's")
    for v in got:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            fail(ex, f"{where}: returned {got!r}, expected two whole numbers", "row numbers are ints: use // and %, not /")
    return int(got[0]), int(got[1])


def _rows_mistake(got, want, batch: int, p: int) -> tuple[str, str]:
    """The first thing wrong with every rank's (lo, hi), named."""
    base, extra = divmod(batch, p)
    sizes = [hi - lo for lo, hi in got]
    if all(hi == w - 1 for (_, hi), (_, w) in zip(got, want)) and all(lo == w for (lo, _), (w, _) in zip(got, want)):
        return "every hi is one short", "hi is exclusive: x[lo:hi] holds rows lo .. hi - 1, so hi = lo + count"
    if sizes == [hi - lo for lo, hi in want][::-1] and extra:
        return ("the remainder goes to the last ranks instead of the first",
                f"batch % p = {extra} rows are left over: they go one each to the first {extra} rank"
                + ("s" if extra > 1 else "") + f", so rank{'s 0 to' if extra > 1 else ''} {extra - 1} take"
                + ("" if extra > 1 else "s") + " one row more than the others")
    if any(hi > batch or lo > batch for lo, hi in got):
        r = next(r for r, (lo, hi) in enumerate(got) if hi > batch or lo > batch)
        return (f"rank {r}'s rows {got[r][0]}:{got[r][1]} run past the end of the batch (row {batch - 1} is the last)",
                "ceil(batch / p) rows each is more than there are: every rank gets batch // p, and only batch % p "
                "ranks one more")
    if got[0][0] != 0:
        return f"rank 0 starts at row {got[0][0]}", "rank 0 takes the first rows: lo = 0"
    for r in range(1, p):
        if got[r][0] != got[r - 1][1]:
            return (f"rank {r} starts at row {got[r][0]}, but rank {r - 1} stops at row {got[r - 1][1]}",
                    "the shards follow each other with no gap and no overlap: rank r starts where rank r - 1 stops")
    if sum(sizes) < batch:
        return (f"{batch - sum(sizes)} of the {batch} rows belong to no rank",
                f"batch // p = {base} rows each leaves batch % p = {extra} over: the first {extra} ranks take one more")
    if max(sizes) - min(sizes) > 1:
        return (f"the shards hold {sorted(set(sizes))} rows: sizes differ by more than one",
                "balance the ranks: batch // p each, and one more for the first batch % p ranks")
    return "these are not the floor + remainder shards", ""


# ==== lab 08, exercise 2: the mean gradient over every rank's rows (MPI) ===========================================

_MG_SIZES = [4, 3, 2]  # the network whose gradients the check averages


def _mg_counts(k: int, rng) -> list[list[int]]:
    """Rows per rank for the cases on k ranks: uneven (first: it tells the most mistakes apart), equal, some ranks with
    none, all on the last rank, drawn."""
    patterns = [[5, 2, 7, 1, 3, 6, 2, 4][:k] if k <= 8 else [1 + j % 5 for j in range(k)], [4] * k,
                [0 if j % 2 == 0 else 3 + j for j in range(k)], [0] * (k - 1) + [6]]
    drawn = [int(v) for v in rng.integers(0, 9, k)]
    patterns.append(drawn if sum(drawn) else [1] * k)
    out = []
    for c in patterns:
        if sum(c) and c not in out:
            out.append(c)
    return out


def _mg_sums(k: int, case: int, j: int, n: int) -> list:
    """Rank j's sum of per-sample gradients over its n rows (each rank can draw every rank's)."""
    rng = np.random.default_rng(capture.seed(1000 * k + 10 * case + j))
    sums = []
    for a, b in zip(_MG_SIZES[:-1], _MG_SIZES[1:]):
        sums.append((rng.normal(size=(b, a)) * max(n, 1) if n else np.zeros((b, a)),
                     rng.normal(size=b) * max(n, 1) if n else np.zeros(b)))
    return sums


def _mg_mean(sums, n: int) -> list:
    """The mean over n rows: NaN where there are none (the mean of nothing)."""
    with np.errstate(invalid="ignore"):
        return [(gW / n if n else np.full_like(gW, np.nan), gb / n if n else np.full_like(gb, np.nan))
                for gW, gb in sums]


@recorded
def mean_gradient(fn, comm=None, timeout: float = 20.0) -> None:
    """Exercise (lab 08): ``fn(comm, grads, n) -> grads`` on every rank (``%%px``): ``grads`` is this rank's mean
    gradient over its own ``n`` rows (NaN where n is 0); the result must be the mean over every rank's rows, the
    same on every rank. Checked on 1..p ranks with equal, uneven and empty shares."""
    from mpi4py import MPI

    comm = comm or MPI.COMM_WORLD
    ex = "mean gradient"
    fn = on_given_comm(capture.student(fn, ex=ex), ex)

    def run(sub, k):
        for case, counts in enumerate(_mg_counts(k, np.random.default_rng(capture.seed(90 + k)))):
            yield lambda case=case, counts=counts: mean_gradient_case(fn, sub, k, case, counts, timeout, ex)

    collective_check(comm, ex, run)


def mean_gradient_case(fn, sub, k, case, counts, timeout, ex) -> str | None:
    """One set of shares on one sub-communicator; returns what went wrong (or None), never raises."""
    r = sub.Get_rank()
    where = f"{k} rank{'s' if k > 1 else ''}, rows per rank {counts}, rank {r}"
    sums = [_mg_sums(k, case, j, counts[j]) for j in range(k)]
    total = sum(counts)
    want = [(sum(s[i][0] for s in sums) / total, sum(s[i][1] for s in sums) / total) for i in range(len(sums[0]))]
    mine = _mg_mean(sums[r], counts[r])
    work = sub.Dup()
    try:
        got, error = fn(_timed_comm(work, timeout), mine, counts[r]), None
    except NotImplementedError:
        got, error = None, not_written(ex)
    except (ExerciseError, capture.NotRecorded) as e:
        got, error = None, f"{e} ({where})"
    except Exception as e:
        got, error = None, f"{ex} ({where}): your function raised {type(e).__name__}: {e}"
    if error is None:
        error = _mean_gradient_error(got, want, sums, counts, r, where, ex)
    if error:
        return error  # work is not freed: a rank may have abandoned an operation on it
    work.Free()
    return None


def _mean_gradient_error(got, want, sums, counts, r, where, ex) -> str | None:
    if not _dp_shaped(got, want):
        return (f"{ex} ({where}): expected a list of {len(want)} (dW, db) pairs shaped like grads, got "
                f"{type(got).__name__}\nHint: return one (dW, db) pair per layer, in the order of grads")
    flat = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for g in got for a in g])

    def of(pairs):
        return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for g in pairs for a in g])

    if np.allclose(flat, of(want), rtol=1e-9, atol=1e-12):
        return None
    k, total = len(counts), sum(counts)
    if np.isnan(flat).any():
        if 0 in counts:
            return (f"{ex} ({where}): the result holds NaN\nHint: a rank with n = 0 rows holds NaN, the mean of "
                    "nothing, and 0 x NaN is NaN: such a rank contributes zeros (np.zeros_like), not n x its mean")
        return f"{ex} ({where}): the result holds NaN"
    zero = [[(np.zeros_like(a), np.zeros_like(b)) for a, b in s] for s in sums]
    means = [_mg_mean(sums[j], counts[j]) if counts[j] else zero[j] for j in range(k)]

    def summed(parts, scale=1.0):
        return np.sum([of(p) for p in parts], axis=0) * scale

    named = [
        (summed(means, 1 / k), "you averaged the ranks' means (divided by p): a rank with more rows must weigh "
                               "more\nHint: the mean divides by the batch, not by p: add up every rank's sum (its "
                               "mean times its n) and divide by the total number of rows"),
        (summed(means, 1 / max(1, sum(c > 0 for c in counts))),
         "you averaged the means of the ranks that have rows: a rank with more rows must weigh more\nHint: the mean "
         "divides by the batch, not by the number of ranks"),
        (summed(means), "you added up the ranks' means\nHint: each mean stands for n rows: weigh it by its n, then "
                        "divide by the batch size"),
        (summed(sums), "that is the sum over the whole batch\nHint: divide by the batch size, every rank's n added up"),
        (summed(sums, 1 / k), "the mean divides by the batch, not by p\nHint: the batch size is every rank's n added "
                              "up (comm.allreduce(n))"),
        (of(means[r]), "each rank returned its own mean: the other ranks' rows are missing\nHint: add up over the "
                       "ranks with comm.Allreduce, so every rank holds the total"),
        (of(sums[r]) / total, "each rank returned only its own share; added up over the ranks it would be right\n"
                              "Hint: sum the shares with comm.Allreduce, so every rank holds the total"),
    ]
    if counts[r]:
        named.append((summed(sums) / counts[r], "you divided by this rank's n: the batch is every rank's rows\n"
                                                "Hint: no rank knows the batch size: add up the n's too "
                                                "(comm.allreduce(n))"))
    for wrong, why in named:
        if np.allclose(flat, wrong, rtol=1e-9, atol=1e-12):
            return f"{ex} ({where}): {why}"
    err = np.abs(flat - of(want)).max()
    return (f"{ex} ({where}): differs from the mean over the whole batch by up to {err:.3g}\n"
            f"  yours, first values:    {np.array2string(flat[:4], precision=5)}\n"
            f"  expected, first values: {np.array2string(of(want)[:4], precision=5)}")


def _timed_comm(comm, timeout):
    """A TrafficComm whose lowercase ``allreduce`` of a number waits at most ``timeout`` too: a rank whose function
    raised before the allreduce of the counts must not leave the others waiting for ever."""
    from mpi4py import MPI

    from ..collectives import wait_all
    from ..traffic import TrafficComm

    class TimedComm(TrafficComm):
        def allreduce(self, obj, op=MPI.SUM):
            if isinstance(obj, bool) or not isinstance(obj, (int, float, np.integer, np.floating)):
                return self._comm.allreduce(obj, op=op)
            a = np.array([obj])
            out = np.empty_like(a)
            wait_all([self._comm.Iallreduce(a, out, op)], self.timeout, "allreduce", self)
            return type(obj)(out[0]) if type(obj) in (int, float) else out[0]

    return TimedComm(comm, timeout=timeout)


# ==== lab 08, exercise 3: the whole data-parallel step (MPI) =======================================================

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
    fn = on_given_comm(capture.student(fn, ex=ex), ex)

    def run(sub, k):
        for batch in _dp_batches(k):
            yield lambda batch=batch: data_parallel_case(fn, sub, k, batch, timeout, ex)

    collective_check(comm, ex, run)


def _dp_batches(k: int) -> list[int]:
    """The batches a data-parallel step is checked on with k ranks: smaller than, equal to, not divisible by k."""
    return sorted({1, max(k - 1, 1), k, 2 * k + 1, 12})


def _dp_run(fn, sub, k, batch, timeout, ex):
    """The student's step on one batch, each rank given only its own rows (the others NaN), on a duplicate of sub:
    (rank, where, its rows lo and hi, the reference gradients, the duplicate, what fn returned, what went wrong)."""
    r = sub.Get_rank()
    where = f"{k} rank{'s' if k > 1 else ''}, batch {batch}, rank {r}"
    params, x, Y, want = _dp_problem(batch)
    lo, hi = shard_bounds(batch, k)[r]
    mine_x, mine_Y = _own_rows_only(x, Y, lo, hi)
    work = sub.Dup()  # the student's messages stay apart from the check's own, even if some are abandoned
    got, error = _call_dp(fn, work, timeout, params, mine_x, mine_Y, where, ex)
    return r, where, lo, hi, want, work, got, error


def _dp_verdict(error, work, ex, got, want, batch, where) -> str | None:
    """What went wrong, or the comparison with the reference once nothing did (the duplicate freed then only: a
    rank that failed may have abandoned an operation on it)."""
    if error:
        return error
    work.Free()
    try:
        compare_grads(ex, got, want, batch, where)
    except ExerciseError as e:
        return str(e)
    return None


def data_parallel_case(fn, sub, k, batch, timeout, ex) -> str | None:
    """One batch on one sub-communicator; returns what went wrong (or None), never raises."""
    r, where, lo, hi, want, work, got, error = _dp_run(fn, sub, k, batch, timeout, ex)
    shaped = error is None and _dp_shaped(got, want)
    # every rank of sub takes part in the allgather (a rank that failed says False), so nobody waits alone
    if k > 1 and all(sub.allgather(shaped)):
        error = _shares_not_summed(sub, got, want, where, ex)
    if error is None and shaped and any(np.isnan(np.asarray(a, dtype=np.float64)).any() for g in got for a in g):
        error = (f"{ex} ({where}): rank {r}'s gradients hold NaN: it used rows outside its shard {lo}:{hi} (the check "
                 "puts NaN in the other ranks' rows)\nHint: each rank backprops only its own rows, your my_rows"
                 "(len(x), p, rank), and the allreduce brings in the rest")
    return _dp_verdict(error, work, ex, got, want, batch, where)


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
    try:
        return fn(_timed_comm(work, timeout), params, x, Y), None
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


@recorded
def overlapped_step(fn, comm=None, timeout: float = 20.0) -> None:
    """Exercise (lab 08): ``fn(comm, params, x, Y) -> (grads, requests)`` on every rank (``%%px``).

    Once every request in ``requests`` has completed (the check waits for them), ``grads`` must be the gradient of
    the mean quadratic cost over the whole batch on every rank, from this rank's own rows only, as in
    :func:`data_parallel_step`. And the communication must overlap the backward pass: the check notes where each
    ``comm.Iallreduce`` starts. On a rank with rows, layer i's two arrays must be handed to a non-blocking allreduce
    while ``mlp.backprop`` is at layer i (in its ``on_layer(i)`` call), before the layers below are computed. A
    blocking ``Allreduce``, or an allreduce started after backprop returned, overlaps nothing and fails.
    """
    from mpi4py import MPI

    comm = comm or MPI.COMM_WORLD
    ex = "overlapped step"
    # what is recorded and replayed is the step's outcome: the gradients once every request has completed, and
    # where each array's allreduce started (live requests and call stacks do not keep)
    step = on_given_comm(capture.student(_waited(capture.watched(fn), timeout, ex), ex=ex), ex)

    def run(sub, k):
        for batch in _dp_batches(k):
            yield lambda batch=batch: _overlapped_case(step, sub, k, batch, timeout, ex)

    collective_check(comm, ex, run)


AFTER_BACKPROP, NEVER = -1, -2  # where an array's allreduce started, besides a layer of backprop


def _backprop_layer() -> int:
    """The layer :func:`labkit.mlp.loss_and_grads_unchecked` is at, if it is on the call stack, else AFTER_BACKPROP."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code is mlp.loss_and_grads_unchecked.__code__:
            return int(frame.f_locals.get("i", AFTER_BACKPROP))
        frame = frame.f_back
    return AFTER_BACKPROP


def _waited(fn, timeout, ex):
    """The student's step run to its end: ``(grads, started, blocking)``, the gradients after every request it
    returned has completed, for each array of each layer the layer backprop was at when its Iallreduce started
    (:data:`AFTER_BACKPROP`, :data:`NEVER`), and how many blocking Allreduces it called."""
    from mpi4py import MPI

    from ..collectives import wait_all

    def step(comm, params, x, Y):
        posts: list[tuple[int, list]] = []
        blocking: list[int] = []

        class Noted(type(comm)):
            def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM):  # noqa: N802
                posts.append((_backprop_layer(), [b for b in (sendbuf, recvbuf) if isinstance(b, np.ndarray)]))
                return self._comm.Iallreduce(sendbuf, recvbuf, op)

            def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):  # noqa: N802
                blocking.append(_backprop_layer())
                return super().Allreduce(sendbuf, recvbuf, op)

        comm.__class__ = Noted
        got = fn(comm, params, x, Y)
        if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], (list, tuple))):
            raise ExerciseError(f"{ex}: return (grads, requests): the gradients, and the list of the requests that "
                                "comm.Iallreduce returned, still in flight (the check waits for them)")
        grads, requests = got
        if not all(isinstance(q, MPI.Request) for q in requests):
            raise ExerciseError(f"{ex}: requests must hold what comm.Iallreduce returned, got {requests!r:.200}")
        wait_all(list(requests), timeout, "the overlapped step's allreduces", comm)
        if not _dp_shaped(grads, params):
            raise ExerciseError(f"{ex}: grads must be a list of (dW, db) pairs shaped like params, "
                                f"got {type(grads).__name__}")
        started = [[next((layer for layer, bufs in posts if any(np.shares_memory(a, b) for b in bufs)), NEVER)
                    for a in pair] for pair in grads]
        # the order in which the layers' allreduces started: the layer of each post's buffer
        order = [next((i for i, pair in enumerate(grads) for a in pair if any(np.shares_memory(a, b) for b in bufs)),
                      NEVER) for _, bufs in posts]
        return ([tuple(np.asarray(a) for a in pair) for pair in grads], np.array(started), len(blocking),
                np.array(order, dtype=int))

    return step


def _overlapped_case(step, sub, k, batch, timeout, ex) -> str | None:
    """One batch of the overlapped step on one sub-communicator; returns what went wrong (or None), never raises."""
    _, where, lo, hi, want, work, got, error = _dp_run(step, sub, k, batch, timeout, ex)
    if error is None and hi > lo:
        error = _not_overlapped(got[1], got[2], where, ex)
    misordered = error is None and hi == lo and bool((np.diff(got[3]) > 0).any())
    # every rank takes part (a rank that failed says False): the rank at fault tells why, the others' wrong sums
    # are only its consequence
    if k > 1 and any(sub.allgather(misordered)) and not misordered:
        return None
    if misordered:
        error = (f"{ex} ({where}): this rank has no rows and started its allreduces layer by layer in the order "
                 f"{got[3].tolist()}; the ranks with rows start them last layer first, as backprop makes them. MPI "
                 "pairs the collectives of the ranks in the order each rank starts them, so these sum the wrong arrays"
                 "\nHint: a rank without rows must start the same allreduces in the same order as the others")
    return _dp_verdict(error, work, ex, None if error else got[0], want, batch, where)


def _not_overlapped(started, blocking: int, where, ex) -> str | None:
    """What says that some layer's allreduce did not overlap the backward pass, or None."""
    if blocking:
        return (f"{ex} ({where}): a blocking comm.Allreduce waits where it is called, and backprop waits with it: "
                "nothing overlaps\nHint: comm.Iallreduce(MPI.IN_PLACE, array) returns at once with a request; "
                "keep the requests and return them")
    for i in range(len(started) - 1, -1, -1):
        for name, layer in zip(("dW", "db"), started[i]):
            if layer == NEVER:
                return (f"{ex} ({where}): no comm.Iallreduce was started on layer {i}'s {name}: every array of the "
                        "gradients must be summed over the ranks")
            if layer == AFTER_BACKPROP:
                return (f"{ex} ({where}): layer {i}'s {name} was sent after mlp.backprop had returned: by then "
                        "the whole backward pass is over, and nothing overlapped\nHint: start it in the on_layer "
                        "function you give mlp.backprop, which backprop calls as soon as layer i is done")
            if layer != i:
                return (f"{ex} ({where}): layer {i}'s {name} was handed to Iallreduce while backprop was at layer "
                        f"{layer}, {'before its gradients were final' if layer > i else 'later than it could'}"
                        "\nHint: on_layer(i) is called once layer i's gradients are final: start layer i's there")
    return None


# ---- lab 08, exercise 5: when the overlapped step's allreduces end ------------------------------------------------

def _overlap_cases(rng) -> list[tuple[str, float, list[float], list[float]]]:
    """(what it is, backprop seconds, ready, seconds): the last bucket is ready when backprop ends, or before."""
    n = int(rng.integers(3, 9))
    ready = np.sort(rng.uniform(0, 0.2, n))
    return [("the network keeps up: each bucket ends before the next is ready", 0.08, [0.01, 0.03, 0.05],
             [0.005, 0.01, 0.02]),
            ("the network is the bottleneck: the buckets queue", 0.03, [0.01, 0.02, 0.03], [0.05, 0.07, 0.04]),
            ("the network idles, then the buckets queue", 0.11, [0.01, 0.07, 0.11], [0.03, 0.05, 0.04]),
            ("lab 08's two buckets: the input layer's is ready when backprop ends", 0.035, [0.012, 0.035], [0.13, 0.085]),
            ("one bucket", 0.02, [0.02], [0.1]),
            ("every bucket ready at the end of backprop, as without overlap", 0.04, [0.04, 0.04, 0.04], [0.01, 0.02, 0.03]),
            ("drawn afresh", float(ready[-1]) + float(rng.uniform(0, 0.01)), ready.tolist(),
             rng.uniform(0.001, 0.08, n).tolist()),
            ("no buckets (a network without parameters)", 0.01, [], [])]


@recorded
def overlap_model(fn) -> None:
    """Exercise (lab 08): ``fn(backprop, ready, seconds) -> (blocking, overlapped)``, the time of one step (backprop
    and allreduces) without and with overlap: backprop takes ``backprop`` seconds, bucket i is ready at ``ready[i]``
    (since backprop began, in the order the buckets start) and its allreduce takes ``seconds[i]``; one network, one
    allreduce at a time. Against :func:`labkit.data_parallel.step_model`."""
    ex = "the step with and without overlap"
    fn = capture.student(fn, ex=ex)
    cases = _overlap_cases(np.random.default_rng(capture.seed(128)))
    for what, backprop, ready, seconds in each_case(cases):
        where = f"{what}: backprop {backprop:.4g} s, ready {np.round(ready, 4).tolist()}, seconds {np.round(seconds, 4).tolist()}"
        got = call(ex, fn, backprop, list(ready), list(seconds))
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            fail(ex, f"{where}: expected a pair (blocking, overlapped), got {type(got).__name__}"
                 f"{f' of length {len(got)}' if isinstance(got, (tuple, list)) else ''}", "return both times, blocking first")
        blocking, overlapped = (as_seconds(ex, f"{where}, {k}", v) for k, v in zip(("blocking", "overlapped"), got))
        want_blocking, want = step_model(backprop, ready, seconds)
        if not np.isclose(blocking, want_blocking, rtol=1e-9, atol=1e-15):
            r, s = np.array(ready, dtype=float), np.array(seconds, dtype=float)
            wrong = [(s.sum(), "the blocking step backprops first, and only then allreduces: both take time"),
                     (backprop + (s.max() if s.size else 0.0), "without overlap the buckets' allreduces still go one "
                                                               "after another, all after backprop")]
            fail(ex, f"{where}: your blocking step takes {blocking:.6g} s, expected {want_blocking:.6g} s",
                 next((why for w, why in wrong if np.isclose(blocking, w, rtol=1e-9, atol=1e-15)),
                      "the blocking step is backprop, then every bucket's allreduce"))
        if np.isclose(overlapped, want, rtol=1e-9, atol=1e-15):
            continue
        r, s = np.array(ready, dtype=float), np.array(seconds, dtype=float)
        end = overlapped_end(ready, seconds)
        wrong = [(end, "the step ends when backprop is done too: the later of backprop's end and the last allreduce's"),
                 (backprop, "the buckets made last still need their allreduce after backprop: the step cannot end with "
                            "backprop while one of them is waiting for the network")]
        if r.size:
            wrong += [
                (backprop + end, "ready times count from the start of backprop: the allreduces run during it"),
                (max(backprop, r.max() + s.sum()), "your overlapped step is the blocking one: a bucket's allreduce can "
                                                   "start as soon as the bucket is ready, while backprop goes on below"),
                (max(backprop, (r + s).max()), "there is one network: a bucket's allreduce waits until the one before "
                                               "it has ended"),
                (max(backprop, s.sum()), "an allreduce cannot start before backprop has made its bucket"),
                (max(backprop, r[0] + s.sum()), "the network can fall idle, waiting for backprop to make the next "
                                                "bucket: a bucket starts at the later of its ready time and the end of "
                                                "the one before"),
                (max(backprop, r[-1] + s[-1]), "when the last bucket is ready the network may still be busy with the "
                                               "ones before it"),
            ]
        hint = next((why for w, why in wrong if np.isclose(overlapped, w, rtol=1e-9, atol=1e-15)),
                    "go through the buckets in order, keeping the time the network is free again")
        fail(ex, f"{where}: your overlapped step takes {overlapped:.6g} s, expected {want:.6g} s", hint)
    passed(ex, len(cases))


EXERCISES = (
    Exercise("rank_rows", "08", references=("labkit.shards:shard_bounds", "labkit.shards:shard_of"), hints=(
        "Every rank gets at least batch // p rows, and batch % p rows are left over: the first batch % p ranks "
        "take one more each.",
        "Rank r's rows start after those of ranks 0 .. r - 1: r ranks of batch // p rows, plus one for each of "
        "those ranks that took an extra row. Count them without a loop.",
        "Of ranks 0 .. r - 1, all r took an extra row if r <= batch % p, else batch % p of them: min says it. hi is "
        "lo plus this rank's own number of rows (hi is exclusive).",
    )),
    Exercise("mean_gradient", "08", mpi=True, references=("labkit.data_parallel:mean_of_shards",), hints=(
        "The mean over the batch is the sum of every row's gradient divided by the number of rows in the batch. "
        "A rank's mean times its n is the sum over its own rows.",
        "Add up the ranks' sums with comm.Allreduce(send, recv), one call per array (recv = np.empty_like(send)). "
        "No rank knows the batch size: the ranks' n add up the same way (comm.allreduce(n) for a number).",
        "Divide by the batch size, not by p: a rank with more rows weighs more. A rank with n = 0 holds NaN, and "
        "0 x NaN is NaN: it sends zeros (np.zeros_like).",
    )),
    Exercise("data_parallel_step", "08", mpi=True,
             references=("labkit.data_parallel:DataParallel", "labkit.data_parallel:ShardedSGD",
                         "labkit.data_parallel:mean_of_shards"), hints=(
        "Every rank holds the same batch x, Y. Its own rows are your my_rows(len(x), p, rank): backprop only "
        "those; the check fills the other ranks' rows with NaN.",
        "mlp.backprop(params, x[lo:hi], Y[lo:hi]) is the mean gradient over this rank's rows. A rank with no rows "
        "cannot backprop (ValueError): give it any gradient-shaped arrays, mlp.zeros_like(params) say.",
        "Your my_mean_gradient turns every rank's mean over its own rows into the mean over the whole batch, the "
        "same on every rank: the step is those three pieces in a row.",
    )),
    Exercise("overlapped_step", "08", mpi=True,
             references=("labkit.data_parallel:DataParallel", "labkit.data_parallel:ShardedSGD",
                         "labkit.data_parallel:mean_of_shards"), hints=(
        "Allocate zeroed gradients of the parameters' shapes first (mlp has a helper for it) and pass them as out=: "
        "backprop then "
        "writes into arrays you already hold, and a rank with no rows simply keeps its zeros.",
        "Each rank's share of the mean over the whole batch is its rows' sum divided by the whole batch, len(x): "
        "pass that as scale. Then the allreduce's plain sum over the ranks is the mean, with no second step.",
        "In on_layer(i), start one comm.Iallreduce(MPI.IN_PLACE, a) for each array a of grads[i] and keep the "
        "requests in a list. A rank with no rows calls no backprop: it starts the allreduce of every layer itself, "
        "last layer first, as the other ranks do.",
    )),
    Exercise("overlap_model", "08", references=("labkit.data_parallel:step_model",
                                                     "labkit.data_parallel:overlapped_end"), hints=(
        "Keep one number as you go through the buckets in order: the time the network is free again. Before the "
        "first bucket it is free at once.",
        "A bucket's allreduce can start only when two things are true: backprop has made the bucket, and the "
        "network has finished the bucket before. It starts at the later of the two.",
        "It then keeps the network busy for its own seconds: that end is when the network is free for the next "
        "one. With no bucket, the network is never busy.",
        "The overlapped step is over when both are done: backprop, and the last bucket's allreduce. The blocking "
        "step does one, then the other.",
    )),
)
