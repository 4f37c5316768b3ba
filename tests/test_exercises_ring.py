"""The exercises of labs 07 and 08 (labkit.check.ring, labkit.check.data_parallel): the ring's chunks, its
reduce-scatter and the whole ring allreduce; the rows of one rank, the mean gradient over every rank's rows and the
whole data-parallel step.

Their answers for the contract every exercise keeps (``CONTRACT``, tests/test_contract.py: right, blank, hints, replay,
labkit's own), and the typical wrong ones, each named by the check's message. The MPI checks run here on one rank (a
plain Python, singleton MPI); their mistakes that show only on several ranks are the cases of
tests/mpi/cases_steps_exercise.py (and cases_ring_exercise.py, cases_dp_exercise.py), run under a real mpiexec.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import Answers, Reference
from mpicases import mpi_cases

from labkit import check, collectives, mlp
from labkit.check import ExerciseError
from labkit.check.exercises import in_lab
from labkit.data_parallel import mean_of_shards, ring_reduce_scatter
from labkit.shards import ring_chunks, shard_bounds, shard_of

CABLES = ("cable_seconds", "overlap_model")  # their tests: tests/test_exercises_cables.py


@pytest.fixture(scope="module")
def self_comm():
    from mpi4py import MPI

    return MPI.COMM_SELF


# ---- right answers, as a student would write them ---------------------------------------------------------------

def right_chunks(r, s, p):
    send = (r - s) % p
    return send, (send - 1) % p


def right_rows(batch, p, rank):
    size, extra = batch // p, batch % p
    lo = rank * size + min(rank, extra)
    return lo, lo + size + (rank < extra)


def _ring(comm, x, op, allgather):
    combine = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum}[collectives.op_name(op)]
    p, r = comm.Get_size(), comm.Get_rank()
    out, chunks = x.copy(), shard_bounds(x.size, p)
    for s in range(p - 1):
        (a, b), (c, d) = chunks[(r - s) % p], chunks[(r - s - 1) % p]
        incoming = np.empty(d - c, x.dtype)
        comm.Sendrecv(out[a:b], dest=(r + 1) % p, recvbuf=incoming, source=(r - 1) % p)
        combine(out[c:d], incoming, out=out[c:d])
    if not allgather:
        lo, hi = chunks[(r + 1) % p]
        return out[lo:hi].copy()
    for s in range(p - 1):
        (a, b), (c, d) = chunks[(r - s + 1) % p], chunks[(r - s) % p]
        comm.Sendrecv(out[a:b].copy(), dest=(r + 1) % p, recvbuf=out[c:d], source=(r - 1) % p)
    return out


def right_reduce_scatter(comm, x, op):
    return _ring(comm, x, op, allgather=False)


def right_ring(comm, x, op):
    return _ring(comm, x, op, allgather=True)


def right_mean(comm, grads, n):
    batch = comm.allreduce(n)
    out = []
    for gW, gb in grads:
        sums = [np.empty_like(gW), np.empty_like(gb)]
        comm.Allreduce(gW * n if n else np.zeros_like(gW), sums[0])
        comm.Allreduce(gb * n if n else np.zeros_like(gb), sums[1])
        out.append((sums[0] / batch, sums[1] / batch))
    return out


def right_step(comm, params, x, Y):
    lo, hi = right_rows(len(x), comm.Get_size(), comm.Get_rank())
    grads = mlp.backprop(params, x[lo:hi], Y[lo:hi]) if hi > lo else mlp.zeros_like(params)
    return right_mean(comm, grads, hi - lo)


def right_overlapped(comm, params, x, Y):
    from mpi4py import MPI

    lo, hi = right_rows(len(x), comm.Get_size(), comm.Get_rank())
    grads, requests = mlp.zeros_like(params), []

    def on_layer(i):
        requests.extend(comm.Iallreduce(MPI.IN_PLACE, a) for a in grads[i])

    if hi > lo:
        mlp.backprop(params, x[lo:hi], Y[lo:hi], scale=1 / len(x), out=grads, on_layer=on_layer)
    else:
        for i in reversed(range(len(params))):
            on_layer(i)
    return grads, requests


def overlapped_after_backprop(comm, params, x, Y):
    """Right values, but every allreduce starts after backprop has returned: nothing overlaps."""
    from mpi4py import MPI

    lo, hi = right_rows(len(x), comm.Get_size(), comm.Get_rank())
    grads = mlp.zeros_like(params)
    if hi > lo:
        mlp.backprop(params, x[lo:hi], Y[lo:hi], scale=1 / len(x), out=grads)
    return grads, [comm.Iallreduce(MPI.IN_PLACE, a) for i in reversed(range(len(params))) for a in grads[i]]


PURE = {"ring_chunks": right_chunks, "rank_rows": right_rows}
MPI_RIGHT = {"ring_reduce_scatter": right_reduce_scatter, "ring_allreduce": right_ring,
             "mean_gradient": right_mean, "data_parallel_step": right_step, "overlapped_step": right_overlapped}
# a mistake each MPI check sees on one rank already
MPI_WRONG = {"ring_reduce_scatter": lambda c, x, op: x[:0].copy(),
             "ring_allreduce": lambda c, x, op: x * 2,
             "mean_gradient": lambda c, g, n: [(a * n, b * n) for a, b in g],
             "data_parallel_step": lambda c, params, x, Y: mlp.zeros_like(params),
             "overlapped_step": overlapped_after_backprop}


def run(name, fn, comm=None):
    """The check ``name`` on ``fn``: on one rank (``comm``) for the MPI ones."""
    return getattr(check, name)(fn) if name in PURE else getattr(check, name)(fn, comm=comm)


# ---- what the labs declare ----------------------------------------------------------------------------------------

def test_labs_07_and_08_declare_their_exercises_with_hints_and_references():
    assert [e.name for e in in_lab("07")] == ["cable_seconds", "ring_allreduce", "ring_chunks", "ring_reduce_scatter"]
    assert [e.name for e in in_lab("08")] == ["data_parallel_step", "mean_gradient", "overlap_model", "overlapped_step",
                                              "rank_rows"]
    for e in in_lab("07") + in_lab("08"):
        if e.name in CABLES:  # tests/test_exercises_cables.py
            continue
        assert e.module == {"07": "ring", "08": "data_parallel"}[e.lab] and len(e.hints) >= 3 and e.references, e.name
        assert e.mpi == (e.name in MPI_RIGHT), e.name  # the plain functions need no MPI
        for ref in e.references:  # each names a function or class of labkit that exists
            module, attr = ref.split(":")
            assert callable(getattr(__import__(module, fromlist=[attr]), attr)), ref


ANSWERS = {"ring_chunks": ["r - s", "s - 1", "r + 1"], "rank_rows": ["min(rank", "min(r,", "r * (", "rank * "],
           "ring_reduce_scatter": ["r + 1", "r - s", "(r + 1) mod p"],
           "ring_allreduce": ["r - s", "r + 1", "(r - s + 1)"],
           "mean_gradient": ["/ batch", "* n /", "/ comm.allreduce"], "data_parallel_step": ["shard_bounds("],
           "overlapped_step": ["1 / len(x)", "reversed(range", "on_layer=on_layer", "requests.append("]}


def test_the_hints_lead_to_the_answer_but_never_hold_it():
    for e in in_lab("07") + in_lab("08"):
        if e.name in CABLES:
            continue
        text = " ".join(e.hints)
        assert not [bit for bit in ANSWERS[e.name] if bit in text], e.name


# ---- the plain functions: wrong -----------------------------------------------------------------------------------

@pytest.mark.parametrize("wrong, match", [
    (lambda r, s, p: ((r + s) % p, (r + s - 1) % p), r"step s sends chunk \(r \+ s\) mod p: the ring turns the wrong way"),
    (lambda r, s, p: ((r + s) % p, (r + s + 1) % p), "the ring turns the wrong way"),
    (lambda r, s, p: ((r - s) % p, (r - s) % p), "receives chunk 0, the chunk it sends itself"),
    (lambda r, s, p: ((r - s) % p, (r - s + 1) % p), "that is what its right-hand neighbour, rank 1, sends"),
    (lambda r, s, p: ((r - s - 1) % p, (r - s) % p), r"you return \(recv, send\)"),
    (lambda r, s, p: ((r - s + 1) % p, (r - s) % p), "at step 0 rank 0 sends chunk 1(?s:.*)sends its own chunk"),
    (lambda r, s, p: (r - s, r - s - 1), r"recv is chunk -1, but the chunks are numbered 0 to p - 1 = 2(?s:.*)mod p"),
    (lambda r, s, p: (r, (r - 1) % p), "receives and combines chunk 2 at step 0, but sends chunk 0 at step 1"),
    (lambda r, s, p: ((r - s) / p, 0), r"send is 0.0 \(float\), expected a whole number"),
    (lambda r, s, p: [(r - s) % p], r"expected a pair \(send, recv\)"),
])
def test_ring_chunks_names_the_mistake(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.ring_chunks(wrong)


def test_ring_chunks_checks_the_first_ring_where_every_rule_shows():
    with pytest.raises(ExerciseError, match="^ring chunks: p = 3:"):
        check.ring_chunks(lambda r, s, p: ((r + s) % p, (r + s - 1) % p))


def _by_sizes(sizes_of):
    """rank_rows from a list of shard sizes: (lo, hi) of contiguous shards."""
    def fn(batch, p, rank):
        sizes = sizes_of(batch, p)
        return sum(sizes[:rank]), sum(sizes[:rank + 1])
    return fn


@pytest.mark.parametrize("wrong, match", [
    (_by_sizes(lambda b, p: [b // p + (k >= p - b % p) for k in range(p)]),
     "the remainder goes to the last ranks instead of the first(?s:.*)ranks 0 to 1 take one row more"),
    (lambda b, p, r: (r * (b // p), (r + 1) * (b // p)), "2 of the 10 rows belong to no rank"),
    (lambda b, p, r: (r * -(-b // p), (r + 1) * -(-b // p)), "rank 3's rows 9:12 run past the end of the batch"),
    (lambda b, p, r: (min(r * -(-b // p), b), min((r + 1) * -(-b // p), b)), "sizes differ by more than one"),
    (lambda b, p, r: (right_rows(b, p, r)[0], right_rows(b, p, r)[1] - 1), "every hi is one short"),
    (lambda b, p, r: (right_rows(b, p, r)[0] + (r > 0), right_rows(b, p, r)[1]), "rank 1 starts at row 4, but rank 0"),
    (lambda b, p, r: shard_bounds(b, p), r"expected a pair \(lo, hi\), got list of length 4"),
    (lambda b, p, r: (b / p * r, b / p * (r + 1)), "expected two whole numbers"),
])
def test_rank_rows_names_the_mistake(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.rank_rows(wrong)


def test_rank_rows_shows_both_bounds_of_a_large_batch_in_short():
    wrong = _by_sizes(lambda b, p: [b // p + (k >= p - b % p) for k in range(p)])
    right_small = {(10, 4), (7, 3), *((b, p) for p in (1, 2, 3, 4, 5, 8) for b in (0, 1, 2, 3, 5, 7, 10, 12, 13, 100))}

    def only_large(b, p, r):  # right on the fixed cases, wrong on the drawn large batches
        return right_rows(b, p, r) if (b, p) in right_small else wrong(b, p, r)

    with pytest.raises(ExerciseError, match=r"yours:    \[\(0, \d+\), .*, \.\.\., \(\d+, \d+\), \(\d+, \d+\)\]") as e:
        check.rank_rows(only_large)
    assert "the remainder goes to the last ranks" in str(e.value)


# ---- the MPI checks on one rank: wrong ----------------------------------------------------------------------------

@pytest.mark.parametrize("name, wrong, match", [
    ("ring_reduce_scatter", lambda c, x, op: x[:0].copy(), r"returned shape \(0,\), expected \(5,\), the one chunk"),
    ("ring_reduce_scatter", lambda c, x, op: x.astype(np.float32), "returned float32, expected float64"),
    ("ring_reduce_scatter", lambda c, x, op: (x, x.__setitem__(slice(None), 0))[0].copy(), "x was modified"),
    ("ring_reduce_scatter", lambda c, x, op: list(x), "returned list, expected a NumPy array"),
    ("ring_reduce_scatter", lambda c, x, op: collectives.ring_allreduce(c, x, op) * 0 + 1 if x.size else x.copy(),
     "wrong values"),
    ("mean_gradient", lambda c, g, n: [(a * n, b * n) for a, b in g], "that is the sum over the whole batch"),
    ("mean_gradient", lambda c, g, n: [a for pair in g for a in pair], r"expected a list of 2 \(dW, db\) pairs"),
    ("mean_gradient", lambda c, g, n: [(a * 0, b) for a, b in g], "differs from the mean over the whole batch"),
    ("mean_gradient", lambda c, g, n: 1 / 0, "your function raised ZeroDivisionError"),
    ("overlapped_step", overlapped_after_backprop, "sent after mlp.backprop had returned"),
    ("overlapped_step", lambda c, params, x, Y: right_overlapped(c, params, x, Y)[0], r"return \(grads, requests\)"),
    ("overlapped_step", lambda c, params, x, Y: (mlp.zeros_like(params), [1]), "requests must hold what"),
])
def test_the_mpi_checks_name_what_one_rank_shows(name, wrong, match, self_comm):
    with pytest.raises(ExerciseError, match=match):
        run(name, wrong, self_comm)


# ---- the contract's answers (tests/test_contract.py) -------------------------------------------------------------

def step_with_labkits_mean(c, params, x, Y):
    lo, hi = shard_bounds(len(x), c.Get_size())[c.Get_rank()]
    grads = mlp.backprop(params, x[lo:hi], Y[lo:hi]) if hi > lo else mlp.zeros_like(params)
    return mean_of_shards(c, grads, hi - lo)


def overlapped_with_labkits_mean(c, params, x, Y):
    """labkit's blocking mean in place of the overlapped sums: no request left to wait for (a wrong answer too)."""
    return step_with_labkits_mean(c, params, x, Y), []


CONTRACT = {
    "ring_chunks": Answers(
        right_chunks, lambda r, s, p: ((r + s) % p, (r + s - 1) % p), passes="✔ ring chunks: all",
        references=(Reference(ring_chunks, "labkit.shards.ring_chunks"),)),
    "rank_rows": Answers(
        right_rows, lambda b, p, r: (r * (b // p), (r + 1) * (b // p)), passes="✔ rows of a rank: all",
        references=(Reference(lambda b, p, r: shard_bounds(b, p)[r], "labkit.shards.shard_bounds"),
                    Reference(shard_of, "labkit.shards.shard_of"))),
    "ring_reduce_scatter": Answers(
        right_reduce_scatter, MPI_WRONG["ring_reduce_scatter"], one_rank=True,
        passes="✔ ring reduce-scatter on 1 to 1 ranks: all 15 checks passed",
        references=(Reference(ring_reduce_scatter, "labkit.data_parallel.ring_reduce_scatter"),)),
    "ring_allreduce": Answers(
        right_ring, MPI_WRONG["ring_allreduce"], one_rank=True,
        passes="✔ ring allreduce on 1 to 1 ranks: all 20 checks passed",
        references=(Reference(lambda c, x, op: collectives.ring_allreduce(c, x, op), "labkit.collectives.ring_allreduce"),
                    Reference(collectives.ring_allreduce, "labkit.collectives.ring_allreduce"))),
    "mean_gradient": Answers(
        right_mean, MPI_WRONG["mean_gradient"], one_rank=True,
        passes="✔ mean gradient on 1 to 1 ranks: all 3 checks passed",
        references=(Reference(mean_of_shards, "labkit.data_parallel.mean_of_shards",
                              prints="✔ mean gradient on 1 to 1 ranks: all 4 checks passed"),)),
    "data_parallel_step": Answers(
        right_step, MPI_WRONG["data_parallel_step"], one_rank=True,
        passes="✔ data-parallel step on 1 to 1 ranks: all 3 checks passed",
        references=(Reference(lambda c, params, x, Y: step_with_labkits_mean(c, params, x, Y),
                              "labkit.data_parallel.mean_of_shards"),)),
    "overlapped_step": Answers(
        right_overlapped, MPI_WRONG["overlapped_step"], one_rank=True,
        passes="✔ overlapped step on 1 to 1 ranks: all 3 checks passed",
        references=(Reference(overlapped_with_labkits_mean, "labkit.data_parallel.mean_of_shards", passes=False),)),
}


# ---- several ranks, under a real mpiexec ----------------------------------------------------------------------------

test_the_reduce_scatter_and_mean_checks_under_mpiexec = mpi_cases("cases_steps_exercise.py", [3],
                                                                  marks=[pytest.mark.slow])


# ---- labkit's helpers ---------------------------------------------------------------------------------------------

def test_shard_of_is_one_shard_of_shard_bounds():
    for n in range(40):
        for parts in range(1, 9):
            assert [shard_of(n, parts, k) for k in range(parts)] == shard_bounds(n, parts)
    with pytest.raises(ValueError, match="between 0 and parts - 1"):
        shard_of(10, 3, 3)


def test_ring_chunks_pass_on_what_they_received_and_finish_one_chunk_each():
    for p in range(2, 9):
        for r in range(p):
            assert ring_chunks(r, 0, p)[0] == r  # a rank starts with its own chunk
            for s in range(p - 2):
                assert ring_chunks(r, s + 1, p)[0] == ring_chunks(r, s, p)[1]  # passes on what it combined
                assert ring_chunks(r, s, p)[1] == ring_chunks((r - 1) % p, s, p)[0]  # from the left
            assert ring_chunks(r, p - 2, p)[1] == (r + 1) % p  # the chunk it finishes


def test_mean_of_shards_weighs_by_rows_and_ignores_an_empty_shard(self_comm):
    g = [(np.full((2, 3), 4.0), np.full(2, 2.0))]
    got = mean_of_shards(self_comm, g, 5)
    assert np.allclose(got[0][0], 4.0) and got[0][0] is not g[0][0]
    nan = [(np.full((2, 3), np.nan), np.full(2, np.nan))]
    with pytest.raises(ValueError, match="no rank has any rows"):  # no mean of nothing
        mean_of_shards(self_comm, nan, 0)
