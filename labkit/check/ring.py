"""Checks of lab 07: the ring allreduce, a ladder of exercises, and its traffic priced on cables that cost.

The chunks a rank sends and receives at each step of the ring (a plain function), the reduce-scatter phase alone,
the whole ring allreduce, then the time lab 06's alpha-beta model gives an allreduce's traffic log when each rank has
a cable of its own. The MPI checks run on every rank (``%%px``): each runs the student's function on
sub-communicators of 1..p ranks (:func:`.common.collective_check`); the ranks agree after every case, so all raise
together and none waits on a peer that gave up. Every check names the mistake it recognises.
"""

from __future__ import annotations

import numpy as np

from ..costmodel import cable_seconds as reference
from ..errors import LabkitError
from ..shards import ring_chunks as _ring_chunks
from ..shards import shard_bounds
from . import capture
from .common import (
    ExerciseError,
    as_seconds,
    call,
    collective_check,
    each_case,
    fail,
    not_written,
    on_given_comm,
    passed,
    recorded,
)
from .exercises import Exercise

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
    for p in each_case([3, 2, *range(4, 10), int(rng.integers(10, 24))]):  # 3 first: the smallest ring where every rule shows
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
    ex = "an allreduce on cables"
    fn = capture.student(fn, ex=ex)
    cases = _cable_cases(np.random.default_rng(capture.seed(127)))
    for k, (what, log, p, alpha, beta) in enumerate(each_case(cases)):
        where = f"{what} (alpha = {alpha:g} s, beta = {beta:g} s/byte)"
        got = as_seconds(ex, where, call(ex, fn, log.copy(), p, alpha, beta))
        want = reference(log, p, alpha, beta)
        if np.isclose(got, want, rtol=1e-9, atol=1e-15):
            continue
        fail(ex, f"{where}: yours gives {got:.6g} s, expected {want:.6g} s", _cable_mistake(fn, cases, k, got))
    passed(ex, len(cases))


_COLLECTIVES = ("ring_allreduce", "naive_allreduce", "reduce_broadcast_allreduce", "recursive_doubling_allreduce",
                "mpi_allreduce")
_ALLREDUCES = tuple(f"labkit.collectives:{f}" for f in _COLLECTIVES)


EXERCISES = (
    Exercise("ring_chunks", "07", references=("labkit.shards:ring_chunks",), hints=(
        "Whatever rank r receives at step s is what its left-hand neighbour, rank (r - 1) mod p, sends at that "
        "same step.",
        "A rank combines what it receives into its own copy of that chunk, and at the next step passes that chunk "
        "on: what it sends at step s + 1 is what it received at step s.",
        "So rank r's send starts at its own chunk r and, step by step, takes the number of the chunk that came from "
        "the left. Write send as r minus something, recv from the left neighbour's send, and wrap both into 0 .. p - 1 "
        "with % p.",
    )),
    Exercise("ring_reduce_scatter", "07", mpi=True,
             references=("labkit.data_parallel:ring_reduce_scatter", *_ALLREDUCES), hints=(
        "Work on a copy of x, cut into p chunks with shard_bounds(len(x), p). Each step is one "
        "comm.Sendrecv: the chunk your my_ring_chunks says to send goes to the right-hand neighbour, the one it says to "
        "receive comes from the left-hand one, into a new buffer of that chunk's size.",
        "The chunk that arrives is a partial result, and so is your copy of it: combine them in place with op's "
        "NumPy function (np.add for MPI.SUM, np.multiply, np.maximum, np.minimum), C.op_name(op) names it.",
        "After p - 1 steps one chunk has been combined with every rank's copy: the one this rank received at the "
        "last step, s = p - 2. Return a copy of that chunk, and nothing else.",
    )),
    Exercise("ring_allreduce", "07", references=("labkit.data_parallel:ring_reduce_scatter", *_ALLREDUCES),
             mpi=True, hints=(
        "Start as your reduce-scatter does, on a copy of x, but keep the whole copy: afterwards every rank holds "
        "one chunk of it finished. The allgather passes the finished chunks around the same ring, in p - 1 more "
        "steps, to the right again.",
        "What arrives in the allgather is already the total: store it into out (Sendrecv can receive straight into "
        "the slice of out); combining it again would count it twice.",
        "At step 0 of the allgather a rank sends the chunk it finished; at step s + 1 it sends on the chunk it "
        "received at step s, and it receives what its left-hand neighbour sends. Write these indices as you did "
        "in my_ring_chunks, with the starting chunk one further on.",
    )),
    Exercise("cable_seconds", "07", references=("labkit.costmodel:cable_seconds",), hints=(
        "Messages of one round travel at the same time, and the next round begins when this one has arrived: the "
        "whole time is the sum over the rounds (the log's 4th column) of each round's time.",
        "In one round, each rank's cable carries what its rank sends (the rows where it is the source) and, at the "
        "same time and the same rate, what it receives (the rows where it is the dest). Each message costs that "
        "cable alpha plus its bytes times beta.",
        "So a round lasts as long as its busiest cable in its busier way: add up the cost of every message per "
        "source and per dest (np.bincount with weights and minlength=p does it), and take the largest of all.",
    )),
)
