"""The MPI rungs between the plain functions and the whole algorithms of labs 07 and 08: the ring's reduce-scatter
(check.ring_reduce_scatter), the mean gradient over every rank's rows (check.mean_gradient) and the overlapped step
(check.overlapped_step) pass right answers and name typical mistakes, on every rank.

Run: mpiexec -n 3 python -m mpi4py tests/mpi/cases_steps_exercise.py [-k NAME]   (prints "OK <p>" on rank 0)
"""

import _cases
import numpy as np
from _cases import case, run_cases
from mpi4py import MPI

from labkit import check, collectives, mlp
from labkit.collectives import op_name
from labkit.data_parallel import mean_of_shards, ring_reduce_scatter
from labkit.shards import shard_bounds

comm = MPI.COMM_WORLD
COMBINE = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum}


def mistake(check_name, name, fn, *needles):
    _cases.mistake(f"{check_name}: {name}", lambda f: getattr(check, check_name)(f, timeout=3), fn, *needles)


def passes(check_name, name, fn):
    case(f"{check_name}: {name}", prints=_cases.PASSED)(lambda: getattr(check, check_name)(fn))


def not_written(*args):
    raise NotImplementedError


# ---- the reduce-scatter ---------------------------------------------------------------------------------------------

def reduce_scatter(c, x, op=MPI.SUM, combine=True, start=0, give="finished", steps=None, to=+1):
    """A student's reduce-scatter with a switchable mistake: storing instead of combining, a ring that starts from
    another chunk, returning another chunk or the whole array, too many steps, sending the wrong way."""
    p, r = c.Get_size(), c.Get_rank()
    f = COMBINE[op_name(op)]
    out = x.copy()
    chunks = shard_bounds(out.size, p)
    for s in range(p - 1 if steps is None else steps):
        s_lo, s_hi = chunks[(r - s + start) % p]
        r_lo, r_hi = chunks[(r - s - 1 + start) % p]
        incoming = np.empty(r_hi - r_lo, x.dtype)
        c.Sendrecv(out[s_lo:s_hi], dest=(r + to) % p, recvbuf=incoming, source=(r - to) % p)
        if combine:
            f(out[r_lo:r_hi], incoming, out=out[r_lo:r_hi])
        else:
            out[r_lo:r_hi] = incoming
    if give == "whole":
        return out
    lo, hi = chunks[(r + 1 + start) % p if give == "finished" else r]
    return out[lo:hi].copy()


def whole_ring_then_chunk(c, x, op=MPI.SUM):
    p, r = c.Get_size(), c.Get_rank()
    lo, hi = shard_bounds(x.size, p)[(r + 1) % p]
    out = reduce_scatter(c, x, op, give="whole")
    chunks = shard_bounds(x.size, p)
    for s in range(p - 1):  # the allgather as well: twice the messages
        s_lo, s_hi = chunks[(r - s + 1) % p]
        r_lo, r_hi = chunks[(r - s) % p]
        c.Sendrecv(out[s_lo:s_hi].copy(), dest=(r + 1) % p, recvbuf=out[r_lo:r_hi], source=(r - 1) % p)
    return out[lo:hi].copy()


def library_then_chunk(c, x, op=MPI.SUM):
    out = np.empty_like(x)
    c.Allreduce(x, out, op=op)
    lo, hi = shard_bounds(x.size, c.Get_size())[(c.Get_rank() + 1) % c.Get_size()]
    return out[lo:hi].copy()


RS = "ring_reduce_scatter"
passes(RS, "labkit's reduce-scatter passes", ring_reduce_scatter)
passes(RS, "a right student reduce-scatter passes", reduce_scatter)
mistake(RS, "not written", not_written, "not written yet")
mistake(RS, "the whole array returned", lambda c, x, op: reduce_scatter(c, x, op, give="whole"),
        "returned the whole array", "return a copy of just that chunk")
mistake(RS, "stored, not combined", lambda c, x, op: reduce_scatter(c, x, op, combine=False),
        "values alone", "do not overwrite it")
mistake(RS, "its own chunk returned", lambda c, x, op: reduce_scatter(c, x, op, give="own"),
        "own values for chunk", "never combined")
mistake(RS, "a ring that starts from the next chunk", lambda c, x, op: reduce_scatter(c, x, op, start=1),
        "you returned the total of chunk", "your ring starts elsewhere")
mistake(RS, "one step too many", lambda c, x, op: reduce_scatter(c, x, op, steps=c.Get_size()),
        "the reduce-scatter takes p - 1")
mistake(RS, "both phases", whole_ring_then_chunk, "that is the whole allreduce")
mistake(RS, "the ring turned the wrong way", lambda c, x, op: reduce_scatter(c, x, op, to=-1),
        "sent to rank", "right-hand neighbour")
mistake(RS, "the library's Allreduce", library_then_chunk, "called comm.Allreduce")
mistake(RS, "labkit's ring allreduce", lambda c, x, op: collectives.ring_allreduce(c, x, op), "returned the whole array")


# ---- the mean gradient ----------------------------------------------------------------------------------------------

def mean_gradient(c, grads, n, weigh=True, divide="batch", zeros=True, allreduce=True):
    """A student's mean gradient with a switchable mistake: means not weighed by n, dividing by p or by this rank's n,
    NaN from a rank without rows, no allreduce."""
    total = c.allreduce(n) if allreduce else n
    out = []
    for gW, gb in grads:
        pair = []
        for a in (gW, gb):
            mine = (a * n if weigh else a) if (n or not zeros) else np.zeros_like(a)
            summed = np.empty_like(mine)
            if allreduce:
                c.Allreduce(mine, summed)
            else:
                summed[...] = mine
            pair.append(summed / {"batch": total, "p": c.Get_size(), "own": max(n, 1), "none": 1}[divide])
        out.append(tuple(pair))
    return out


MG = "mean_gradient"
passes(MG, "labkit's mean passes", mean_of_shards)
passes(MG, "a right student mean passes", mean_gradient)
mistake(MG, "not written", not_written, "not written yet")
mistake(MG, "the world's rank count", lambda c, g, n: mean_gradient(c, g, n) if MPI.COMM_WORLD.Get_size() else None,
        "used MPI.COMM_WORLD.Get_size", "its comm argument")
mistake(MG, "the means averaged over p", lambda c, g, n: mean_gradient(c, g, n, weigh=False, divide="p"),
        "you averaged the ranks' means (divided by p)", "divides by the batch, not by p")
mistake(MG, "the means added up", lambda c, g, n: mean_gradient(c, g, n, weigh=False, divide="none"),
        "you added up the ranks' means")
mistake(MG, "the sum not divided", lambda c, g, n: mean_gradient(c, g, n, divide="none"), "sum over the whole batch")
mistake(MG, "the sum divided by p", lambda c, g, n: mean_gradient(c, g, n, divide="p"),
        "that is the sum over the whole batch")  # on one rank, where p is 1
mistake(MG, "the sum divided by p on several ranks",  # the mistake shown on 2 ranks
        lambda c, g, n: mean_gradient(c, g, n, divide="p" if c.Get_size() > 1 else "batch"),
        "the mean divides by the batch, not by p")
mistake(MG, "divided by this rank's n", lambda c, g, n: mean_gradient(c, g, n, divide="own"),
        "you divided by this rank's n")
mistake(MG, "NaN from a rank without rows", lambda c, g, n: mean_gradient(c, g, n, zeros=False),
        "holds NaN", "0 x NaN is NaN")
mistake(MG, "no allreduce", lambda c, g, n: mean_gradient(c, g, n, allreduce=False),
        "each rank returned its own mean")
mistake(MG, "a rank that raises stops the others in time", lambda c, g, n: 1 / n if n == 0 else mean_of_shards(c, g, n),
        "your function raised ZeroDivisionError")


# ---- the overlapped step (lab 08, exercise 4) -------------------------------------------------------------------------

def overlapped(c, params, x, Y, when="layer", scale="batch", order=-1, empty_waits=False):
    """A student's overlapped step with a switchable mistake: the allreduces started after backprop, the mean over
    the rank's own rows, a rank without rows starting its allreduces in the other order."""
    lo, hi = shard_bounds(len(x), c.Get_size())[c.Get_rank()]
    grads, requests = mlp.zeros_like(params), []

    def on_layer(i):
        requests.extend(c.Iallreduce(MPI.IN_PLACE, a) for a in grads[i])

    if hi > lo:
        mlp.backprop(params, x[lo:hi], Y[lo:hi], scale=1 / len(x) if scale == "batch" else None, out=grads,
                     on_layer=on_layer if when == "layer" else None)
        if when == "after":
            for i in reversed(range(len(params))):
                on_layer(i)
    else:
        for i in list(range(len(params)))[::order]:
            on_layer(i)
    return grads, requests


OV = "overlapped_step"
passes(OV, "a right overlapped step passes", overlapped)
mistake(OV, "not written", not_written, "not written yet")
mistake(OV, "started after backprop", lambda c, *a: overlapped(c, *a, when="after"), "after mlp.backprop had returned")
mistake(OV, "the mean over the rank's own rows", lambda c, *a: overlapped(c, *a, scale="own"), "too large")
mistake(OV, "a rank without rows starts the layers in another order",
        lambda c, *a: overlapped(c, *a, order=1), "this rank has no rows", "in the same order as the others")
run_cases(comm)
