"""Lab 10's compressed allreduce (check.compressed_allreduce) passes right answers and names typical mistakes, on every
rank, also when recorded and replayed by the grader.

Run: mpiexec -n 3 python -m mpi4py tests/mpi/cases_compression_exercise.py [-k NAME]   (prints "OK <p>" on rank 0)

The mistakes of the exchange (the sum for the mean, no exchange, a value overwritten) show only on 2 ranks or more:
those cases are registered where they can be seen.
"""

import math

import _cases
import numpy as np
from _cases import case, on_ranks, run_cases
from mpi4py import MPI

from labkit import check
from labkit import compression as C

comm = MPI.COMM_WORLD
CA = "compressed_allreduce"


def mistake(name, fn, *needles):
    _cases.mistake(f"{CA}: {name}", lambda f: check.compressed_allreduce(f, timeout=3), fn, *needles)


def passes(name, fn):
    case(f"{CA}: {name}", prints=_cases.PASSED)(lambda: check.compressed_allreduce(fn))


def not_written(*args):
    raise NotImplementedError


def my_topk_feedback(g, residual, ratio):  # the student's answer to exercise 5, as lab 10 has it on the engines
    corrected = g + residual
    k = min(corrected.size, max(1, math.ceil(ratio * corrected.size)))
    indices = np.argsort(np.abs(corrected))[corrected.size - k:]
    new_residual = corrected.copy()
    new_residual[indices] = 0
    return indices, corrected[indices], new_residual


def compressed(c, g, residual, ratio, divide=True, exchange=True, index_dtype=np.int64, adding="add.at",
               give="new", feedback=True):
    """A student's compressed allreduce with a switchable mistake: the sum for the mean, no exchange, the indices
    received into another dtype's buffer, a value overwritten where ranks share an index, the residual not updated or
    dropped, the pieces chosen without the residual."""
    indices, values, new_residual = my_topk_feedback(g, residual if feedback else np.zeros_like(residual), ratio)
    p = c.Get_size() if exchange else 1
    all_indices = np.empty(p * len(indices), dtype=index_dtype)
    all_values = np.empty(p * len(values), dtype=g.dtype)
    if exchange:
        c.Allgather(np.asarray(indices, dtype=np.int64), all_indices)
        c.Allgather(values, all_values)
    else:
        all_indices[:], all_values[:] = indices, values
    all_indices = all_indices.astype(np.int64)  # what a student does once np.add.at refuses float indices
    total = np.zeros(g.size, dtype=g.dtype)
    if adding == "add.at":
        np.add.at(total, all_indices, all_values)
    else:
        total[all_indices] += all_values
    mean = total / c.Get_size() if divide else total
    return mean, {"new": new_residual, "old": residual, "zeros": np.zeros_like(g)}[give]


def with_lowercase_allgather(c, g, residual, ratio):  # the pickled exchange: as right, if slower
    indices, values, new_residual = my_topk_feedback(g, residual, ratio)
    total = np.zeros(g.size, dtype=g.dtype)
    for i, v in c.allgather((indices, values)):
        np.add.at(total, i, v)
    return total / c.Get_size(), new_residual


def float_indices_added(c, g, residual, ratio):  # the indices received into a float buffer, added at as they are
    indices, values, new_residual = my_topk_feedback(g, residual, ratio)
    p = c.Get_size()
    all_indices, all_values = np.empty(p * len(indices), dtype=g.dtype), np.empty(p * len(values), dtype=g.dtype)
    c.Allgather(indices, all_indices)
    c.Allgather(values, all_values)
    total = np.zeros(g.size, dtype=g.dtype)
    np.add.at(total, all_indices, all_values)
    return total / p, new_residual


def with_labkits_allreduce(c, g, residual, ratio):
    indices, values, new_residual = my_topk_feedback(g, residual, ratio)
    return C.sparse_allreduce(c, indices, values, g.size) / c.Get_size(), new_residual


passes("a right compressed allreduce passes", compressed)
passes("the pickled allgather passes", with_lowercase_allgather)
mistake("not written", not_written, "not written yet")
mistake("the world's rank count", lambda c, g, r, ratio: compressed(MPI.COMM_WORLD, g, r, ratio),
        "used MPI.COMM_WORLD", "its comm argument")
mistake("the residual not updated", lambda c, g, r, ratio: compressed(c, g, r, ratio, give="old"),
        "the residual came back as it was passed in")
mistake("the residual dropped", lambda c, g, r, ratio: compressed(c, g, r, ratio, give="zeros"),
        "the new residual is all zeros")
mistake("the residual ignored", lambda c, g, r, ratio: compressed(c, g, r, ratio, feedback=False),
        "chosen from g alone")
mistake("the indices received as floats, then rounded", lambda c, g, r, ratio: compressed(c, g, r, ratio,
                                                                                          index_dtype=np.float64),
        "the right values arrived, but at the wrong entries", "int64 buffer")
mistake("the indices received as floats", float_indices_added, "raised IndexError", "int64 buffer")
mistake("a float64 mean for float32 g", lambda c, g, r, ratio: (compressed(c, g, r, ratio)[0].astype(np.float64),
                                                                 compressed(c, g, r, ratio)[1]),
        "the mean is float64, g is float32")
mistake("g modified", lambda c, g, r, ratio: compressed(c, g.__iadd__(r), np.zeros_like(r), ratio), "g was modified")
with on_ranks(2, 2):  # rank 0 waits in the Allgather until its timeout, then names rank 1's error, not its own wait
    _cases.mistake(f"{CA}: a rank that raises stops the others in time",
                   lambda f: check.compressed_allreduce(f, timeout=1),
                   lambda c, g, r, ratio: 1 / 0 if c.Get_rank() == 1 else compressed(c, g, r, ratio),
                   "rank 1): your function raised ZeroDivisionError")
with on_ranks(2):
    mistake("the sum for the mean", lambda c, g, r, ratio: compressed(c, g, r, ratio, divide=False),
            "2 ranks", "that is the sum over the ranks, not the mean")
    mistake("no exchange", lambda c, g, r, ratio: compressed(c, g, r, ratio, exchange=False),
            "this rank's own piece alone, divided by p", "comm.Allgather")
    mistake("no exchange and no division", lambda c, g, r, ratio: compressed(c, g, r, ratio, exchange=False,
                                                                             divide=False),
            "this rank's own piece alone: the other ranks'")
    mistake("a shared index overwritten", lambda c, g, r, ratio: compressed(c, g, r, ratio, adding="+="),
            "only one value counted", "np.add.at")


# ---- recorded while graded, replayed by the grader: the same verdict and message -------------------------------------

def replays(name, fn, right, graded_says=None):
    """The grader's verdict on the record is the student's (``graded_says``: a failure the grader words its own way)."""
    @case(f"{CA}: {name}, recorded and replayed")
    def _():
        plain, graded, other_draw = _cases.record_and_replay(CA, fn)
        if comm.Get_rank() != 0:
            return
        if right:
            assert plain == (True, "") and graded[0] is True, (plain, graded)
            assert not other_draw[0] and "was not recorded" in other_draw[1], other_draw
        elif graded_says:  # passes in the notebook, fails in the grade
            assert not graded[0] and graded_says in graded[1], (plain, graded)
        else:
            assert not plain[0] and graded == plain, (plain, graded)


replays("a right compressed allreduce", compressed, right=True)
replays("the residual not updated", lambda c, g, r, ratio: compressed(c, g, r, ratio, give="old"), right=False)
replays("labkit's sparse allreduce", with_labkits_allreduce, right=False,
        graded_says="uses labkit's reference (labkit.compression.sparse_allreduce)")
with on_ranks(2):
    replays("the sum for the mean", lambda c, g, r, ratio: compressed(c, g, r, ratio, divide=False), right=False)

run_cases(comm)
