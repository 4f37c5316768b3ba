"""Checks of labs 07 and 08: the ring allreduce and the data-parallel step, each a ladder of exercises.

Lab 07: the chunks a rank sends and receives at each step of the ring (a plain function), the reduce-scatter phase
alone, then the whole ring allreduce. Lab 08: the rows of the batch one rank takes (a plain function), the mean
gradient from every rank's mean over its own rows, then the whole data-parallel step.

The MPI checks run on every rank (``%%px``): each runs the student's function on sub-communicators of 1..p ranks
(:func:`collective_check`); the ranks agree after every case, so all raise together and none waits on a peer that
gave up. Every check names the mistake it recognises.
"""

from __future__ import annotations

import numpy as np

from .. import mlp
from ..errors import LabkitError
from ..shards import ring_chunks as _ring_chunks
from ..shards import shard_bounds
from . import capture
from .common import ExerciseError, call, compare_grads, fail, not_written, on_given_comm, passed, recorded
from .exercises import Exercise


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


# ==== lab 07, exercise 1: the chunks of each step (a plain function) ===============================================

@recorded
def ring_chunks(fn) -> None:
    """Exercise (lab 07): ``fn(r, s, p) -> (send, recv)``, the chunks rank r sends to its right-hand neighbour and
    receives from its left-hand one at step s = 0 .. p - 2 of the ring's reduce-scatter on p ranks, where at step 0
    every rank sends its own chunk. Checked for every r and s on 2 to 9 ranks, and on one larger ring drawn afresh
    whenever a notebook is graded."""
    ex = "ring chunks"
    fn = capture.student(fn, ex=ex)
    rng = np.random.default_rng(capture.seed(70))
    n = 0
    for p in [3, 2, *range(4, 10), int(rng.integers(10, 24))]:  # 3 first: the smallest ring where every rule shows
        table = {}
        for r in range(p):
            for s in range(p - 1):
                table[r, s] = _chunk_pair(ex, call(ex, fn, r, s, p), r, s, p)
                n += 1
        mistake = _ring_chunks_mistake(table, p)
        if mistake:
            fail(ex, f"p = {p}: {mistake[0]}", mistake[1])
    passed(ex, n)


def _chunk_pair(ex: str, got, r: int, s: int, p: int) -> tuple[int, int]:
    where = f"p = {p}, rank {r}, step {s}"
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(ex, f"{where}: expected a pair (send, recv) of chunk numbers, got {type(got).__name__}"
             + (f" of length {len(got)}" if isinstance(got, (tuple, list)) else ""), "end with `return send, recv`")
    pair = []
    for name, v in zip(("send", "recv"), got):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            fail(ex, f"{where}: {name} is {v!r} ({type(v).__name__}), expected a whole number",
                 "a chunk's number is an int: use // and %, not /")
        if not 0 <= v < p:
            fail(ex, f"{where}: {name} is chunk {int(v)}, but the chunks are numbered 0 to p - 1 = {p - 1}",
                 "the ring wraps around: the chunk before chunk 0 is chunk p - 1. Take the number mod p (Python's % "
                 "gives 0 .. p - 1 even for a negative number)")
        pair.append(int(v))
    return pair[0], pair[1]


def _ring_chunks_mistake(t: dict, p: int) -> tuple[str, str] | None:
    """What is wrong with the table {(r, s): (send, recv)} of one ring, from the first rule it breaks (None: right)."""
    steps = range(p - 1)
    want = {(r, s): _ring_chunks(r, s, p) for r in range(p) for s in steps}
    if t == want:
        return None
    if p > 2 and all(t[k] == want[k][::-1] for k in t):
        return ("you return (recv, send)", "the pair is (send, recv): the chunk sent first")
    for r in range(p):
        if t[r, 0][0] != r:
            return (f"at step 0 rank {r} sends chunk {t[r, 0][0]}",
                    f"at step 0 every rank sends its own chunk: rank {r} sends chunk {r}")
    if p > 2 and all(t[r, s][0] == (r + s) % p for r in range(p) for s in steps):
        return ("step s sends chunk (r + s) mod p: the ring turns the wrong way",
                "chunks travel to the right, so what a rank sends next is what came in from its left: a chunk "
                "numbered lower, not higher")
    for r in range(p):
        left, right = (r - 1) % p, (r + 1) % p
        for s in steps:
            send, recv = t[r, s]
            if recv == send:
                return (f"at step {s} rank {r} receives chunk {recv}, the chunk it sends itself",
                        f"rank {r} receives what its left-hand neighbour, rank {left}, sends at the same step")
            if p > 2 and recv == t[right, s][0] and recv != t[left, s][0]:
                return (f"at step {s} rank {r} receives chunk {recv}: that is what its right-hand neighbour, rank "
                        f"{right}, sends", f"messages go to the right, so rank {r} receives from its left-hand "
                        f"neighbour, rank {left}: chunk {t[left, s][0]} at step {s}")
            if recv != t[left, s][0]:
                return (f"at step {s} rank {r} receives chunk {recv}, but its left-hand neighbour, rank {left}, "
                        f"sends chunk {t[left, s][0]} then", "what a rank receives is what its left-hand neighbour "
                        "sends at the same step")
    for r in range(p):
        for s in range(p - 2):
            if t[r, s + 1][0] != t[r, s][1]:
                return (f"rank {r} receives and combines chunk {t[r, s][1]} at step {s}, but sends chunk "
                        f"{t[r, s + 1][0]} at step {s + 1}", "a rank passes on the chunk it has just combined: "
                        "each step adds one more rank's copy to it")
    wrong = next(k for k in t if t[k] != want[k])
    return f"rank {wrong[0]}, step {wrong[1]}: yours {t[wrong]}, expected {want[wrong]}", ""


# ==== lab 07, exercises 2 and 3: the reduce-scatter, then the whole ring (MPI) =====================================

@recorded
def ring_reduce_scatter(fn, comm=None, timeout: float = 20.0) -> None:
    """Exercise (lab 07): ``fn(comm, x, op)`` must be the ring's reduce-scatter phase, returning (a new array) the one
    chunk this rank holds finished after p - 1 steps. Call on every MPI rank (``%%px``).

    Runs ``fn`` on sub-communicators of 1, 2, ..., p ranks, with lengths 0, 1, shorter than, equal to and not
    divisible by the rank count, three dtypes and ops; compares the chunk with ``MPI_Allreduce``'s, checks that ``x``
    is untouched, and records the traffic: p - 1 messages per rank, all to the right-hand neighbour, one chunk each.
    """
    from mpi4py import MPI

    comm = comm or MPI.COMM_WORLD
    ex = "ring reduce-scatter"
    fn = on_given_comm(capture.student(fn, ex=ex), ex)
    cases = [(np.float64, MPI.SUM), (np.int32, MPI.PROD), (np.float32, MPI.MAX)]

    def run(sub, k):
        for n in [2 * k + 3, 100, *sorted({0, 1, max(k - 1, 1), k + 1} - {2 * k + 3})]:  # the edge cases last
            for dtype, op in cases:
                yield lambda n=n, dtype=dtype, op=op: ring_case(fn, sub, k, n, dtype, op, timeout, ex, phase="rs")

    collective_check(comm, ex, run)


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
    fn = on_given_comm(capture.student(fn, ex=ex), ex)
    cases = [(np.float64, MPI.SUM), (np.int64, MPI.MAX), (np.int32, MPI.PROD), (np.float32, MPI.MIN)]

    def run(sub, k):
        for n in sorted({0, 1, max(k - 1, 1), k + 1, 2 * k + 3, 1000}):
            for dtype, op in cases:
                yield lambda n=n, dtype=dtype, op=op: ring_case(fn, sub, k, n, dtype, op, timeout, ex)

    collective_check(comm, ex, run)


class RingMistake(LabkitError):
    """A student's ring did something no ring does (the message says what); raised at once, not after a timeout."""


def _ring_comm(comm, timeout):
    """A TrafficComm for the ring checks that stops a student's function at once, naming the mistake, when it sends to
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
                           "ring from point-to-point messages: steps of comm.Sendrecv, each sending one "
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
                "reduce-scatter each rank holds one chunk finished; p - 1 more steps pass the finished chunks around")
    chunks = shard_bounds(n, k)
    right = [bool(np.allclose(got[lo:hi], want[lo:hi], rtol=1e-5)) for lo, hi in chunks]
    finished = chunks[(r + 1) % k]
    if k > 1 and finished[1] > finished[0] and right[(r + 1) % k] and not all(right):
        return ("the chunk this rank finishes in the reduce-scatter is right, so the reduce-scatter works; the "
                "allgather phase is wrong: it starts from the finished chunk, passes on what it received, and stores "
                "(does not combine) what arrives")
    return ("check which chunk you send and receive at each step (your my_ring_chunks), that the reduce-scatter combines "
            "what arrives with op, and that the allgather stores it")


def _ring_x(k, j, n, dtype, op):
    """Rank j's x on a ring of k ranks (every rank can draw every rank's: the checks name a mistake from them)."""
    from mpi4py import MPI

    rng = np.random.default_rng(capture.seed(100 * k + j))
    return (rng.integers(1, 4, n) if op == MPI.PROD else rng.integers(-50, 50, n)).astype(dtype)


def ring_case(fn, sub, k, n, dtype, op, timeout, ex, phase: str = "allreduce") -> str | None:
    """One check on one sub-communicator (``phase`` "allreduce", or "rs": the reduce-scatter alone); returns what went
    wrong (or None), never raises."""
    from ..collectives import op_name

    r = sub.Get_rank()
    where = f"{k} rank{'s' if k > 1 else ''}, n={n}, {np.dtype(dtype)}, MPI.{op_name(op)}, rank {r}"
    x = _ring_x(k, r, n, dtype, op)
    before = x.copy()
    want = np.empty_like(x)
    sub.Allreduce(x, want, op=op)
    work = sub.Dup()  # the student's messages stay apart from the check's own, even if some are abandoned
    tc = _ring_comm(work, timeout)
    got, error = _call_ring(fn, tc, x, op, where, ex)
    if error is None and phase == "rs":
        error = _scatter_result_error(got, x, before, want, n, k, r, tc.log, where, ex, dtype, op)
    elif error is None:
        error = _ring_result_error(got, x, before, want, n, k, r, tc.log, where, ex)
    if error is None and k > 1 and n >= k:
        error = _ring_traffic_error(tc.log, x.itemsize, n, k, r, where, ex, steps=k - 1 if phase == "rs" else 2 * (k - 1))
    if error:
        return error  # work is not freed: a rank may have abandoned an operation on it
    work.Free()
    return None


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
        hint = ("\nHint: that is one chunk: the reduce-scatter alone. The allgather phase is missing: it passes the "
                "finished chunks around until every rank holds the whole result"
                if got.ndim == 1 and got.size < n and got.dtype == want.dtype else "")
        return f"{ex} ({where}): returned shape {got.shape} {got.dtype}, expected {want.shape} {want.dtype}{hint}"
    if not np.array_equal(x, before):
        return f"{ex} ({where}): x was modified\nHint: work on a copy (out = x.copy()) and return it"
    if not np.allclose(got, want, rtol=1e-5):
        bad = np.flatnonzero(~np.isclose(got, want, rtol=1e-5))
        hint = _wrong_values_hint(got, want, n, k, r, sum(row[0] == r for row in log))
        return (f"{ex} ({where}): wrong values at {len(bad)} of {n} positions, first at index {bad[0]}: "
                f"got {got[bad[0]]}, expected {want[bad[0]]}\nHint: {hint}")
    return None


def _scatter_result_error(got, x, before, want, n, k, r, log, where, ex, dtype, op) -> str | None:
    """What is wrong with the chunk a reduce-scatter returned (type, size, which chunk, values) or with x, or None."""
    chunks = shard_bounds(n, k)
    f = (r + 1) % k  # the chunk rank r finishes when step 0 sends its own chunk
    lo, hi = chunks[f]
    if not isinstance(got, np.ndarray):
        return f"{ex} ({where}): returned {type(got).__name__}, expected a NumPy array (the finished chunk)"
    if not np.array_equal(x, before):
        return f"{ex} ({where}): x was modified\nHint: work on a copy (out = x.copy()) and cut the chunks from it"
    if got.dtype != x.dtype:
        return f"{ex} ({where}): returned {got.dtype}, expected {x.dtype}, the dtype of x"
    if got.shape != (hi - lo,):
        if got.size == n and n > max(b - a for a, b in chunks):
            return (f"{ex} ({where}): returned the whole array ({n} elements)\nHint: after the reduce-scatter only "
                    f"one chunk is finished on each rank, here {hi - lo} elements: return a copy of just that chunk")
        found = _which_values(got, x, want, chunks, n, k, r, f, dtype, op)
        if found:
            return f"{ex} ({where}): {found}"
        return (f"{ex} ({where}): returned shape {got.shape}, expected ({hi - lo},), the one chunk rank {r} finishes"
                "\nHint: which chunk has rank r combined with every other rank's copy after the last step?")
    if np.allclose(got, want[lo:hi], rtol=1e-5):
        return None
    sent = sum(row[0] == r for row in log)
    found = _which_values(got, x, want, chunks, n, k, r, f, dtype, op)
    if found:
        return f"{ex} ({where}): {found}"
    bad = np.flatnonzero(~np.isclose(got, want[lo:hi], rtol=1e-5))
    hint = (f"you sent {sent} message{'s' if sent != 1 else ''}: the reduce-scatter takes p - 1 = {k - 1} "
            f"step{'s' if k != 2 else ''}" if sent != k - 1
            else "check which chunk you send and receive at each step (your my_ring_chunks), and that you combine what "
                 "arrives with op into your copy of that chunk")
    return (f"{ex} ({where}): wrong values at {len(bad)} of {hi - lo} positions of the chunk, first at index "
            f"{lo + bad[0]}: got {got[bad[0]]}, expected {want[lo + bad[0]]}\nHint: {hint}")


def _which_values(got, x, want, chunks, n, k, r, f, dtype, op) -> str | None:
    """Name what a wrong chunk holds instead: another chunk's total, this rank's own input, or one rank's input alone."""
    def same(a):
        return a.shape == got.shape and got.size > 0 and np.allclose(got, a, rtol=1e-5)

    for j, (lo, hi) in enumerate(chunks):
        if j != f and same(want[lo:hi]):
            return (f"you returned the total of chunk {j}, but with every rank sending its own chunk at step 0, "
                    f"rank {r} finishes chunk {f}\nHint: at step 0 rank r sends chunk r: your ring starts elsewhere")
    lo, hi = chunks[f]
    for j, (a, b) in enumerate(chunks):
        if same(x[a:b]):
            return (f"these are rank {r}'s own values for chunk {j}, never combined with the others'\nHint: return "
                    "the chunk this rank received and combined at the last step")
    for q in range(k):
        if q != r and same(_ring_x(k, q, n, dtype, op)[lo:hi]):
            return (f"the chunk holds rank {q}'s values alone: what arrives was stored over this rank's copy\n"
                    "Hint: combine the received chunk with your copy (np.add for MPI.SUM, np.multiply for MPI.PROD, "
                    "np.maximum, np.minimum), do not overwrite it")
    return None


def _ring_traffic_error(log, itemsize, n, k, r, where, ex, steps: int | None = None) -> str | None:
    """What is wrong with the messages this rank sent (to whom, how many, how many bytes), or None."""
    steps = 2 * (k - 1) if steps is None else steps
    sent = [row for row in log if row[0] == r]
    if not sent:
        return (f"{ex} ({where}): no messages were recorded\nHint: use the buffer methods of comm "
                "(comm.Sendrecv / comm.Send / comm.Isend on NumPy arrays), not the lowercase ones")
    right = (r + 1) % k
    if any(dest != right for _, dest, _, _ in sent):
        return (f"{ex} ({where}): rank {r} sent to ranks {sorted({d for _, d, _, _ in sent})}; "
                f"a ring sends only to its right-hand neighbour {right}")
    if len(sent) != steps:
        what = (f"a ring allreduce sends 2 (p - 1) = {steps}: p - 1 in the reduce-scatter, p - 1 in the allgather"
                if steps == 2 * (k - 1) else
                f"a reduce-scatter sends p - 1 = {steps}" + (": that is the whole allreduce, both phases; the "
                                                              "reduce-scatter is the first" if len(sent) == 2 * steps else ""))
        return f"{ex} ({where}): rank {r} sent {len(sent)} messages; {what}"
    nbytes = sum(b for _, _, b, _ in sent)
    lo, hi = steps * (n // k) * itemsize, steps * -(-n // k) * itemsize
    if not lo <= nbytes <= hi:
        return (f"{ex} ({where}): rank {r} sent {nbytes} bytes; {steps} messages of one chunk each make "
                f"{lo} to {hi} bytes\nHint: send one chunk of about n/p elements per step, not the whole array")
    return None


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
    for batch, p in cases:
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
    import sys

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


# ==== the exercises =================================================================================================

# ---- lab 07, exercise 4: an allreduce's traffic log on cables that cost ------------------------------------------

def _naive_log(p: int, m: int) -> np.ndarray:
    return np.array([(s, d, m, 0) for s in range(p) for d in range(p) if d != s], dtype=np.int64).reshape(-1, 4)


def _ring_log(p: int, n: int, itemsize: int = 8) -> np.ndarray:
    """The log of the ring allreduce of n elements on p ranks: 2 (p - 1) rounds of one chunk to the right."""
    sizes = [hi - lo for lo, hi in shard_bounds(n, p)]
    rows = []
    for step in range(2 * (p - 1)):
        for r in range(p):
            chunk = (r - step) % p if step < p - 1 else (r + 1 - (step - p + 1)) % p  # reduce-scatter, allgather
            rows.append((r, (r + 1) % p, sizes[chunk] * itemsize, step))
    return np.array(rows, dtype=np.int64).reshape(-1, 4)


def _fan(into: bool, long_bytes: tuple[int, int]) -> np.ndarray:
    """Two rounds on 7 ranks: rank 0's cable carries four short messages (out, or in when ``into``) while rank 5's
    carries one long one; the long one is shorter than the four in the first round and longer in the second, so the
    busiest cable by messages is not the busiest by bytes, and each is the slowest in one round."""
    rows = []
    for rnd, long in enumerate(long_bytes):
        rows += [(0, r, 100, rnd) for r in range(1, 5)] + [(5, 6, long, rnd)]
    log = np.array(rows, dtype=np.int64)
    return log[:, [1, 0, 2, 3]] if into else log


def _cable_cases(rng) -> list[tuple[str, np.ndarray, int, float, float]]:
    """(what it is, log, p, alpha, beta), each log in the format of TrafficComm.gather_log."""
    gather = np.array([(r, 0, 4000, 0) for r in range(1, 5)], dtype=np.int64)  # the root's cable receives 4 at once
    bcast = np.array([(0, r, 4000, 0) for r in range(1, 4)] + [(2, 3, 8, 1)], dtype=np.int64)
    later = _naive_log(3, 1000)
    later[:, 3] = 7  # rounds numbered as a TrafficComm used before numbers them
    uneven = np.array([(0, 1, 100, 2), (1, 0, 100, 2), (2, 3, 900, 2), (0, 2, 50, 5), (1, 2, 50, 5), (3, 2, 50, 5)],
                      dtype=np.int64)  # round 5: three messages into rank 2's cable
    p = int(rng.integers(3, 9))
    drawn = np.array([(s, (s + int(rng.integers(1, p))) % p, int(rng.integers(1, 10**6)), int(rng.integers(0, 4)))
                      for s in rng.integers(0, p, 12)], dtype=np.int64)
    return [("lab 07's naive allreduce of 80 kB on 4 ranks", _naive_log(4, 80_000), 4, 1e-4, 8e-8),
            ("lab 07's ring allreduce of 10,000 float64 on 4 ranks", _ring_log(4, 10_000), 4, 1e-4, 8e-8),
            ("the ring of 10 float64 on 3 ranks (chunks of 4, 3 and 3)", _ring_log(3, 10), 3, 1e-4, 8e-8),
            ("4 ranks sending to rank 0 at once (a gather)", gather, 5, 1e-5, 1e-9),
            ("rank 0 sending to 3 ranks, then rank 2 to rank 3", bcast, 4, 1e-5, 1e-9),
            ("the naive allreduce on 3 ranks, its round numbered 7", later, 3, 2e-5, 1e-8),
            ("rounds 2 and 5 of an uneven log", uneven, 4, 1e-3, 1e-6),
            ("rank 0 sending 4 short messages while rank 5 sends a long one (20 kB, then 100 kB)",
             _fan(False, (20_000, 100_000)), 7, 1e-4, 1e-8),
            ("rank 0 receiving 4 short messages while rank 5 receives a long one (100 kB, then 20 kB)",
             _fan(True, (100_000, 20_000)), 7, 1e-4, 1e-8),
            ("a log drawn afresh", drawn, p, float(rng.uniform(1e-6, 1e-4)), float(rng.uniform(1e-10, 1e-7))),
            ("no messages at all (one rank)", np.zeros((0, 4), dtype=np.int64), 1, 1e-4, 8e-8)]


def _per_round(log, cost_of_round) -> float:
    return float(sum(cost_of_round(log[log[:, 3] == r]) for r in np.unique(log[:, 3])))


def _ways(msgs, p: int, weights) -> tuple[np.ndarray, np.ndarray]:
    """Per rank, the sum of ``weights`` over the messages its cable carries out, and over those it carries in."""
    w = np.broadcast_to(np.asarray(weights, dtype=float), msgs[:, 2].shape)
    return np.bincount(msgs[:, 0], weights=w, minlength=p), np.bincount(msgs[:, 1], weights=w, minlength=p)


def _picked_by(msgs, p: int, alpha: float, beta: float, weights, both: bool) -> float:
    """The time of a round taken as that of the cable with the most ``weights`` (messages or bytes): each way's, the
    slower of the two; or, when ``both``, the one such cable over both ways (out first where they tie)."""
    cost = _ways(msgs, p, alpha + msgs[:, 2] * beta)
    most = _ways(msgs, p, weights)
    if both:
        return float(np.concatenate(cost)[int(np.argmax(np.concatenate(most)))])
    return max(c[int(np.argmax(m))] for c, m in zip(cost, most))


_PICKED = ("the round ends when its slowest cable is done, and a cable's time is alpha for each of its messages plus "
           "beta for each of its bytes: ")


def _cable_split(log, p, alpha, beta) -> list[tuple[float, str]]:
    """The mistakes that price a round's latency and its bytes on different things: each pair of (alpha times the
    messages of the busiest cable by messages, or of the whole round) and (beta times the bytes of the busiest cable by
    bytes, or of the round's longest message)."""
    def most(msgs, weights):
        return max(m.max() for m in _ways(msgs, p, weights))

    alphas = (("the cable with the most messages", lambda m: most(m, 1.0)), ("every message of the round", len))
    betas = (("the cable with the most bytes", lambda m: most(m, m[:, 2])),
             ("the round's longest message", lambda m: m[:, 2].max()))
    return [(_per_round(log, lambda m, a=a, b=b: alpha * a(m) + beta * b(m)),
             _PICKED + f"you added the alpha terms of {a_what} to the beta terms of {b_what}: one cable's alpha and "
                       "beta terms go together")
            for a_what, a in alphas for b_what, b in betas]


def _cable_wrong(log, p, alpha, beta) -> list[tuple[float, str]]:
    """What the typical mistakes give for this log, each with what to say."""
    def ways(msgs, a=alpha):
        return _ways(msgs, p, a + msgs[:, 2] * beta)

    every = log[:, 2].size * alpha + log[:, 2].sum() * beta
    out, into = ways(log)
    by_count = _PICKED + ("you took the cable with the most messages, which is not the slowest where another carries "
                          "fewer but longer ones")
    by_bytes = _PICKED + ("you took the cable with the most bytes, which is not the slowest where another carries more, "
                          "shorter messages (each pays alpha)")
    return [
        (every, "every rank has a cable of its own: messages on different cables travel at the same time, so a round "
                "lasts as long as its busiest cable, not as long as all its messages one after another"),
        (max(out.max(), into.max()) if log.size else 0.0,
         "the rounds follow one another (a rank sends its next chunk only after the last one arrived): add up the "
         "rounds' times instead of treating the whole log as one round"),
        (_per_round(log, lambda m: ways(m)[0].max()), "a cable carries in as well as out: the busiest way of a round "
                                                      "may be the one into a rank, as into a gather's root"),
        (_per_round(log, lambda m: (ways(m)[0] + ways(m)[1]).max()),
         "a cable carries out and in at the same time, each way at the full rate: take the busier way, not the sum"),
        (_per_round(log, lambda m: alpha + ways(m, 0.0)[0].max()) if log.size else 0.0,
         "every message pays alpha, not every round once: a cable that carries 3 messages pays it 3 times"),
        (_per_round(log, lambda m: ways(m)[0].mean()), "the round ends when its busiest cable is done: the maximum, "
                                                        "not the mean"),
        *((_per_round(log, lambda m, w=w, both=both: _picked_by(m, p, alpha, beta, 1.0 if w else m[:, 2], both)),
           by_count if w else by_bytes) for w in (True, False) for both in (False, True)),
        *_cable_split(log, p, alpha, beta),
    ]


def _cable_mistake(fn, cases, k: int, got: float) -> str:
    """The usual mistake that explains the student's time on case ``k``: the first whose times equal the student's on
    every log (the remaining ones run now), so that a coincidence on one log does not name the wrong mistake; else
    the first that equals it on this log alone."""
    gots = {k: got}
    for i, (_, log, p, alpha, beta) in enumerate(cases):
        if i not in gots:
            try:
                gots[i] = float(fn(log.copy(), p, alpha, beta))
            except capture.NotRecorded:
                raise
            except Exception:  # noqa: BLE001 - the student's code on a log it has not been judged on yet
                pass
    named = [[(i, wrong, why) for wrong, why in _cable_wrong(log, p, alpha, beta)]
             for i, (_, log, p, alpha, beta) in enumerate(cases)]
    here = [why for _, wrong, why in named[k] if np.isclose(got, wrong, rtol=1e-9, atol=1e-15)]
    for j, (_, _, why) in enumerate(named[k]):
        if why in here and all(np.isclose(gots[i], named[i][j][1], rtol=1e-9, atol=1e-15) for i in gots):
            return why
    return here[0] if here else "group the messages by round; in each round, find the time every cable needs each way"


@recorded
def cable_seconds(fn) -> None:
    """Exercise (lab 07): ``fn(log, p, alpha, beta) -> seconds``, the alpha-beta time of the messages of a traffic
    log (rows source, dest, bytes, round) when every rank has a cable of its own; against
    :func:`labkit.costmodel.cable_seconds` to a relative 1e-9 on 11 logs (one drawn afresh when graded, two where the
    cable with the most messages is not the one with the most bytes)."""
    from ..costmodel import cable_seconds as reference

    ex = "an allreduce on cables"
    fn = capture.student(fn, ex=ex)
    cases = _cable_cases(np.random.default_rng(capture.seed(127)))
    for k, (what, log, p, alpha, beta) in enumerate(cases):
        where = f"{what} (alpha = {alpha:g} s, beta = {beta:g} s/byte)"
        got = _seconds(ex, where, call(ex, fn, log.copy(), p, alpha, beta))
        want = reference(log, p, alpha, beta)
        if np.isclose(got, want, rtol=1e-9, atol=1e-15):
            continue
        fail(ex, f"{where}: yours gives {got:.6g} s, expected {want:.6g} s", _cable_mistake(fn, cases, k, got))
    passed(ex, len(cases))


def _seconds(ex: str, where: str, got) -> float:
    """A student's answer that must be one number of seconds."""
    if isinstance(got, (bool, np.bool_, str, bytes)) or np.ndim(got) != 0:
        fail(ex, f"{where}: expected one number of seconds, got {type(got).__name__}"
             f"{'' if np.ndim(got) == 0 else f' of shape {np.shape(got)}'}", "return a single float: the time of it all")
    try:
        return float(got)
    except (TypeError, ValueError):
        fail(ex, f"{where}: expected one number of seconds, got {type(got).__name__}", "return a float")


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
    from ..data_parallel import overlapped_end, step_model

    ex = "the step with and without overlap"
    fn = capture.student(fn, ex=ex)
    cases = _overlap_cases(np.random.default_rng(capture.seed(128)))
    for what, backprop, ready, seconds in cases:
        where = f"{what}: backprop {backprop:.4g} s, ready {np.round(ready, 4).tolist()}, seconds {np.round(seconds, 4).tolist()}"
        got = call(ex, fn, backprop, list(ready), list(seconds))
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            fail(ex, f"{where}: expected a pair (blocking, overlapped), got {type(got).__name__}"
                 f"{f' of length {len(got)}' if isinstance(got, (tuple, list)) else ''}", "return both times, blocking first")
        blocking, overlapped = (_seconds(ex, f"{where}, {k}", v) for k, v in zip(("blocking", "overlapped"), got))
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


_COLLECTIVES = ("ring_allreduce", "naive_allreduce", "reduce_broadcast_allreduce", "recursive_doubling_allreduce",
                "mpi_allreduce")
_ALLREDUCES = tuple(f"labkit.collectives:{f}" for f in _COLLECTIVES)

EXERCISES = (
    Exercise("ring_chunks", "07", "mpi", references=("labkit.shards:ring_chunks",), hints=(
        "Whatever rank r receives at step s is what its left-hand neighbour, rank (r - 1) mod p, sends at that "
        "same step.",
        "A rank combines what it receives into its own copy of that chunk, and at the next step passes that chunk "
        "on: what it sends at step s + 1 is what it received at step s.",
        "So rank r's send starts at its own chunk r and, step by step, takes the number of the chunk that came from "
        "the left. Write send as r minus something, recv from the left neighbour's send, and wrap both into 0 .. p - 1 "
        "with % p.",
    )),
    Exercise("ring_reduce_scatter", "07", "mpi", mpi=True,
             references=("labkit.data_parallel:ring_reduce_scatter", *_ALLREDUCES), hints=(
        "Work on a copy, out = x.copy(), cut into p chunks with shard_bounds(len(x), p). Each step is one "
        "comm.Sendrecv: the chunk your my_ring_chunks says to send goes to the right-hand neighbour, the one it says to "
        "receive comes from the left-hand one, into a new buffer of that chunk's size.",
        "The chunk that arrives is a partial result, and so is your copy of it: combine them in place with op's "
        "NumPy function (np.add for MPI.SUM, np.multiply, np.maximum, np.minimum), C.op_name(op) names it.",
        "After p - 1 steps one chunk has been combined with every rank's copy: the one this rank received at the "
        "last step, s = p - 2. Return a copy of that chunk, and nothing else.",
    )),
    Exercise("ring_allreduce", "07", "mpi", references=("labkit.data_parallel:ring_reduce_scatter", *_ALLREDUCES),
             mpi=True, hints=(
        "Start as your reduce-scatter does, on out = x.copy(), but keep the whole of out: afterwards every rank holds "
        "one chunk of it finished. The allgather passes the finished chunks around the same ring, in p - 1 more "
        "steps, to the right again.",
        "What arrives in the allgather is already the total: store it into out (Sendrecv can receive straight into "
        "the slice of out); combining it again would count it twice.",
        "At step 0 of the allgather a rank sends the chunk it finished; at step s + 1 it sends on the chunk it "
        "received at step s, and it receives what its left-hand neighbour sends. Write these indices as you did "
        "in my_ring_chunks, with the starting chunk one further on.",
    )),
    Exercise("cable_seconds", "07", "mpi", references=("labkit.costmodel:cable_seconds",), hints=(
        "Messages of one round travel at the same time, and the next round begins when this one has arrived: the "
        "whole time is the sum over the rounds (the log's 4th column) of each round's time.",
        "In one round, each rank's cable carries what its rank sends (the rows where it is the source) and, at the "
        "same time and the same rate, what it receives (the rows where it is the dest). Each message costs that "
        "cable alpha plus its bytes times beta.",
        "So a round lasts as long as its busiest cable in its busier way: add up the cost of every message per "
        "source and per dest (np.bincount with weights and minlength=p does it), and take the largest of all.",
    )),
    Exercise("rank_rows", "08", "mpi", references=("labkit.shards:shard_bounds", "labkit.shards:shard_of"), hints=(
        "Every rank gets at least batch // p rows, and batch % p rows are left over: the first batch % p ranks "
        "take one more each.",
        "Rank r's rows start after those of ranks 0 .. r - 1: r ranks of batch // p rows, plus one for each of "
        "those ranks that took an extra row. Count them without a loop.",
        "Of ranks 0 .. r - 1, all r took an extra row if r <= batch % p, else batch % p of them: min says it. hi is "
        "lo plus this rank's own number of rows (hi is exclusive).",
    )),
    Exercise("mean_gradient", "08", "mpi", mpi=True, references=("labkit.data_parallel:mean_of_shards",), hints=(
        "The mean over the batch is the sum of every row's gradient divided by the number of rows in the batch. "
        "A rank's mean times its n is the sum over its own rows.",
        "Add up the ranks' sums with comm.Allreduce(send, recv), one call per array (recv = np.empty_like(send)). "
        "No rank knows the batch size: the ranks' n add up the same way (comm.allreduce(n) for a number).",
        "Divide by the batch size, not by p: a rank with more rows weighs more. A rank with n = 0 holds NaN, and "
        "0 x NaN is NaN: it sends zeros (np.zeros_like).",
    )),
    Exercise("data_parallel_step", "08", "mpi", mpi=True,
             references=("labkit.data_parallel:DataParallel", "labkit.data_parallel:ShardedSGD",
                         "labkit.data_parallel:mean_of_shards"), hints=(
        "Every rank holds the same batch x, Y. Its own rows are your my_rows(len(x), p, rank): backprop only "
        "those; the check fills the other ranks' rows with NaN.",
        "mlp.backprop(params, x[lo:hi], Y[lo:hi]) is the mean gradient over this rank's rows. A rank with no rows "
        "cannot backprop (ValueError): give it any gradient-shaped arrays, mlp.zeros_like(params) say.",
        "Your my_mean_gradient turns every rank's mean over its own rows into the mean over the whole batch, the "
        "same on every rank: the step is those three pieces in a row.",
    )),
    Exercise("overlapped_step", "08", "mpi", mpi=True,
             references=("labkit.data_parallel:DataParallel", "labkit.data_parallel:ShardedSGD",
                         "labkit.data_parallel:mean_of_shards"), hints=(
        "Allocate the gradients first, grads = mlp.zeros_like(params), and pass them as out=grads: backprop then "
        "writes into arrays you already hold, and a rank with no rows simply keeps its zeros.",
        "Each rank's share of the mean over the whole batch is its rows' sum divided by the whole batch, len(x): "
        "pass that as scale. Then the allreduce's plain sum over the ranks is the mean, with no second step.",
        "In on_layer(i), start one comm.Iallreduce(MPI.IN_PLACE, a) for each array a of grads[i] and keep the "
        "requests in a list. A rank with no rows calls no backprop: it starts the allreduce of every layer itself, "
        "last layer first, as the other ranks do.",
    )),
    Exercise("overlap_model", "08", "mpi", references=("labkit.data_parallel:step_model",
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
