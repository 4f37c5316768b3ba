"""Lab 06's exercise checks (linear reduce, tree broadcast, recursive doubling) pass right answers and name typical
mistakes, on every rank: each named mistake (``diagnosed``) with a hint about that mistake and no step of the
exercise's derivation; a wrong answer nothing names gets the next step.

Run: mpiexec -n 4 python -m mpi4py tests/mpi/cases_collectives_exercise.py [-k NAME]   (prints "OK <p>" on rank 0)

Some mistakes show only on enough ranks: a linear broadcast or a chain takes ceil(log2 p) rounds up to 3 ranks, and
a mistake about sizes that are not powers of two needs 3; those cases are registered where they can be seen.
"""

import math
import re

import _cases
import numpy as np
from _cases import case, on_ranks, run_cases
from mpi4py import MPI

from labkit import check, collectives
from labkit.collectives import op_name

comm = MPI.COMM_WORLD
size = comm.Get_size()
COMBINE = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum}


def mistake(check_name, name, fn, *needles):
    """A wrong ``fn`` whose failure holds every one of ``needles`` (a step of the derivation, or a diagnosis)."""
    _cases.mistake(f"{check_name}: {name}", lambda f: getattr(check, check_name)(f, timeout=3), fn, *needles)


def diagnosed(check_name, name, fn, says, hint):
    """A named mistake: the failure (rank 0's, the others quiet) matches the regex ``says`` before its hint, carries a
    Hint matching ``hint``, that of this mistake, and gives no step of the derivation."""
    from labkit.check import ExerciseError

    @case(f"{check_name}: {name}")
    def _():
        rank = comm.Get_rank()
        try:
            getattr(check, check_name)(fn, timeout=3)
        except ExerciseError as e:
            message = str(e)
            assert rank == 0, f"rank {rank} raised too ({message}): the student should see one message, rank 0's"
            what, has_hint, given = message.partition("\nHint: ")
            assert re.search(says, what, re.S), (says, message)
            assert has_hint and re.search(hint, given, re.S), (hint, message)
            assert "\nStep " not in message, message
            return
        assert rank != 0, f"the check passed a wrong function; expected {says!r}"


def passes(check_name, name, fn):
    case(f"{check_name}: {name}", prints=_cases.PASSED)(lambda: getattr(check, check_name)(fn))


def not_written(*args):
    raise NotImplementedError


# ---- the linear reduce ------------------------------------------------------------------------------------------------

def linear_reduce(c, x, op=MPI.SUM, root=0, own=True, fresh=True, combine=None, receive_from_root=False,
                  wait_for_go=False, in_place=False):
    """A linear reduce with a switchable mistake (``in_place``: it combines into x, and returns a copy)."""
    p, r = c.Get_size(), c.Get_rank()
    f = combine or COMBINE[op_name(op)]
    if r != root:
        if wait_for_go:  # waits for a go-ahead that the root never sends
            c.Recv(np.empty(1), source=root)
        c.Send(x, dest=root)
        return None
    out = (x if in_place else x.copy()) if own else np.zeros_like(x)
    incoming = np.empty_like(x)
    for src in range(p):
        if src != root or receive_from_root:
            if fresh:
                c.Recv(incoming, source=src)
                f(out, incoming, out=out)
            else:
                c.Recv(out, source=src)
    return out.copy() if in_place else out  # in place: x changed, a new array returned


def reduce_to_rank_0(c, x, op=MPI.SUM, root=0):
    return linear_reduce(c, x, op, root=0)


def reduce_returns_x_everywhere(c, x, op=MPI.SUM, root=0):
    out = linear_reduce(c, x, op, root)
    return x.copy() if out is None else out


def labkit_reduce(c, x, op=MPI.SUM, root=0):
    return collectives.reduce(c, x, op, root=root)


def library_reduce(c, x, op=MPI.SUM, root=0):
    out = np.empty_like(x)
    c.Reduce(x, out, op=op, root=root)
    return out if c.Get_rank() == root else None


def reduce_returning_x_alone(c, x, op=MPI.SUM, root=0):
    """Right values, but on one rank the root returns the x it was given (it combines into new arrays only)."""
    p, r = c.Get_size(), c.Get_rank()
    if r != root:
        c.Send(x, dest=root)
        return None
    out, incoming = x, np.empty_like(x)
    for src in range(p):
        if src != root:
            c.Recv(incoming, source=src)
            out = COMBINE[op_name(op)](out, incoming)
    return out


R = "linear_reduce"
passes(R, "a right linear reduce passes", linear_reduce)
diagnosed(R, "not written", not_written, "not written yet", "replace the `raise NotImplementedError`")
diagnosed(R, "the world's rank", lambda c, x, op=MPI.SUM, root=0: linear_reduce(c, x, op, MPI.COMM_WORLD.Get_rank()),
          "used MPI.COMM_WORLD.Get_rank", "the communicator your function is given")
diagnosed(R, "the root leaves out its own x",
          lambda c, x, op=MPI.SUM, root=0: linear_reduce(c, x, op, root, own=False), "the root has wrong values",
          "left out its own x")
diagnosed(R, "receiving into the result", lambda c, x, op=MPI.SUM, root=0: linear_reduce(c, x, op, root, fresh=False),
          "the root has wrong values", "received into its result and overwrote it")
diagnosed(R, "always adding", lambda c, x, op=MPI.SUM, root=0: linear_reduce(c, x, op, root, combine=np.add),
          "MPI.MAX", "added the arrays up, but this case's op is MPI.MAX")
diagnosed(R, "root 0 only", reduce_to_rank_0, "the root, rank 1, returned None", "not always rank 0")
diagnosed(R, "a result on every rank", reduce_returns_x_everywhere, "not the root, returned", "every other rank returns None")
diagnosed(R, "x modified", lambda c, x, op=MPI.SUM, root=0: linear_reduce(c, x, op, root, in_place=True),
          "x was modified", "leave x as it is")
diagnosed(R, "the root returns its x itself", reduce_returning_x_alone,
          r"^linear reduce \(1 rank, .*rank 0 returned its x itself, not a new array", "array of its own")
diagnosed(R, "receiving from itself",
          lambda c, x, op=MPI.SUM, root=0: linear_reduce(c, x, op, root, receive_from_root=True), "received from itself",
          "leave the rank itself out of the ranks it receives from")
diagnosed(R, "waiting for a go-ahead never sent",
          lambda c, x, op=MPI.SUM, root=0: linear_reduce(c, x, op, root, wait_for_go=True),
          "deadlock: ranks 0 and 1 both wait to receive from each other.*waited 3 s", "the root only receives")
diagnosed(R, "labkit's own reduce", labkit_reduce, "labkit's own collectives.reduce", "write it yourself")
diagnosed(R, "lowercase send", lambda c, x, op=MPI.SUM, root=0: c.send(x, dest=root) if c.Get_rank() != root else x.copy(),
          "comm.send, the lowercase method", "buffer methods")
diagnosed(R, "the library's Reduce", library_reduce, "called comm.Reduce", "point-to-point")


# ---- the tree broadcast ---------------------------------------------------------------------------------------------

def tree_broadcast(c, x, root=0, relative=True, rounds=None, bounded=True):
    """A binomial-tree broadcast with a switchable mistake: no relabelling (root 0 only), a fixed number of rounds,
    or no check that the receiver exists (it wraps around to the root)."""
    p, r = c.Get_size(), c.Get_rank()
    v = (r - root) % p if relative else r
    real = (lambda w: (w + root) % p) if relative else (lambda w: w % p)
    out = x.copy()
    for t in range(math.ceil(math.log2(p)) if rounds is None else rounds(p)):
        d = 1 << t
        if v < d and (v + d < p or not bounded):
            c.Send(out, dest=real(v + d))
        elif d <= v < 2 * d:
            c.Recv(out, source=real(v - d))
    return out


def forwards_before_receiving(c, x, root=0):
    """The tree of distance 1, 2, 4 from multiples of 2d: right only with d falling; here d rises, so rank 2 forwards
    its own x before the root's arrives."""
    p, r = c.Get_size(), c.Get_rank()
    v = (r - root) % p
    out = x.copy()
    d = 1
    while d < p:
        if v % (2 * d) == 0 and v + d < p:
            c.Send(out, dest=(v + d + root) % p)
        elif v % (2 * d) == d:
            c.Recv(out, source=(v - d + root) % p)
        d *= 2
    return out


def falling_tree(c, x, root=0):
    """The tree of distance ..., 4, 2, 1 from the multiples of 2d (MPICH's), receiving with MPI.ANY_SOURCE: right."""
    p, r = c.Get_size(), c.Get_rank()
    v = (r - root) % p
    out = x.copy()
    d = 1 << max(p - 1, 0).bit_length() >> 1
    while d >= 1:
        if v % (2 * d) == 0 and v + d < p:
            c.Send(out, dest=(v + d + root) % p)
        elif v % (2 * d) == d:
            c.Recv(out, source=MPI.ANY_SOURCE)
        d //= 2
    return out


def linear_broadcast(c, x, root=0):
    p, r = c.Get_size(), c.Get_rank()
    out = x.copy()
    if r == root:
        for dest in range(p):
            if dest != root:
                c.Send(out, dest=dest)
    else:
        c.Recv(out, source=root)
    return out


def chain_broadcast(c, x, root=0):
    p, r = c.Get_size(), c.Get_rank()
    v = (r - root) % p
    out = x.copy()
    if v > 0:
        c.Recv(out, source=(r - 1) % p)
    if v < p - 1:
        c.Send(out, dest=(r + 1) % p)
    return out


def receives_from_the_root_only(c, x, root=0):
    """The tree's sends, but every rank waits for the root, as in the linear broadcast."""
    p, r = c.Get_size(), c.Get_rank()
    v = (r - root) % p
    out = x.copy()
    d = 1
    while d < p:
        if v < d and v + d < p:
            c.Send(out, dest=(v + d + root) % p)
        elif d <= v < 2 * d:
            c.Recv(out, source=root)
        d *= 2
    return out


def receives_into_x(c, x, root=0):
    p, r = c.Get_size(), c.Get_rank()
    v = (r - root) % p
    d = 1
    while d < p:
        if v < d and v + d < p:
            c.Send(x, dest=(v + d + root) % p)
        elif d <= v < 2 * d:
            c.Recv(x, source=(v - d + root) % p)
        d *= 2
    return x.copy()


def library_bcast(c, x, root=0):
    out = x.copy()
    c.Bcast(out, root=root)
    return out


def root_returns_x(c, x, root=0):
    """A right tree, but the root returns the x it was given."""
    out = tree_broadcast(c, x, root)
    return x if c.Get_rank() == root else out


B = "tree_broadcast"
passes(B, "a right tree broadcast passes", tree_broadcast)
passes(B, "the other binomial tree, receiving from any rank, passes", falling_tree)
diagnosed(B, "not written", not_written, "not written yet", "replace the `raise NotImplementedError`")
diagnosed(B, "root 0 only", lambda c, x, root=0: tree_broadcast(c, x, root, relative=False),
          "with rank 0's x, not the root's", "relative to the root")
diagnosed(B, "x modified", receives_into_x, "x was modified", "leave x as it is")
diagnosed(B, "the root returns its x itself", root_returns_x,
          r"^tree broadcast \(1 rank, root 0, .*rank 0 returned its x itself, not a new array",
          "the root too: .* new memory")
diagnosed(B, "the library's Bcast", library_bcast, "called comm.Bcast", "point-to-point")
diagnosed(B, "labkit's own broadcast", lambda c, x, root=0: collectives.broadcast(c, x, root),
          "labkit's own collectives.broadcast", "write it yourself")
diagnosed(B, "lowercase bcast", lambda c, x, root=0: c.bcast(x, root=root), "called comm.bcast", "Send, comm.Recv")
with on_ranks(3):
    diagnosed(B, "floor(log2 p) rounds",
              lambda c, x, root=0: tree_broadcast(c, x, root, rounds=lambda p: int(math.log2(p))),
              "rank 2 never received the data.*not a power of two", "how many rounds .* round down")
    diagnosed(B, "a send past the last rank", lambda c, x, root=0: tree_broadcast(c, x, root, bounded=False),
              "rank 1 waited 3 s in a Send to rank 0 that was never received", "rank 0 is the root: .* receives nothing")
with on_ranks(4):
    diagnosed(B, "forwarding before receiving", forwards_before_receiving, "rank 3 holds rank 2's own x",
              "passed its data on before it had received")
    diagnosed(B, "the linear broadcast", linear_broadcast,
              "every message comes from the root.*linear broadcast.*round 1: 0->1; round 2: 0->2; round 3: 0->3",
              "can pass it on too")
    diagnosed(B, "a chain", chain_broadcast, r"took 3 rounds on 4 ranks; a binomial tree takes ceil\(log2 p\) = 2",
              "the number of ranks holding it doubles")
    diagnosed(B, "receiving from the root only", receives_from_the_root_only,
              "rank 1 waited 3 s in a Send to rank 3 that was never received: rank 3 was itself stuck receiving from "
              "rank 0", "rank 1 sends to rank 3, but rank 3 waits for rank 0: a rank must receive from the rank that "
                        "sends to it")


# ---- the recursive-doubling allreduce --------------------------------------------------------------------------------

def doubling(c, x, op=MPI.SUM, fold=True, give_back=True, exchange="sendrecv", combine=None, in_place=False,
             partner=None, send_back=True, fresh=True):
    """A recursive-doubling allreduce with a switchable mistake. ``exchange``: "sendrecv" (right), "ordered" (the lower
    rank sends first, the higher receives first: right but two rounds an exchange) or "send-first" (both send first:
    a deadlock). ``partner(r, d, p2)``: the rank to exchange with at distance d; ``send_back=False``: the extra ranks
    wait for the result, which never comes; ``fresh=False``: the result starts as x itself, and each combination makes
    a new array (so on one rank it returns x)."""
    p, r = c.Get_size(), c.Get_rank()
    f = combine or COMBINE[op_name(op)]
    out = x if in_place or not fresh else x.copy()
    incoming = np.empty_like(x)
    p2 = 1 << (p.bit_length() - 1) if fold else 1 << (p - 1).bit_length()
    if fold and r >= p2:
        c.Send(out, dest=r - p2)
        if give_back:
            c.Recv(out, source=r - p2)
        return out.copy() if in_place else out
    combined = (lambda a, b: f(a, b, out=a)) if fresh else f
    if fold and r + p2 < p:
        c.Recv(incoming, source=r + p2)
        out = combined(out, incoming)
    d = 1
    while d < p2:
        other = (partner or (lambda r, d, p2: r ^ d))(r, d, p2)
        if exchange == "sendrecv":
            c.Sendrecv(out, dest=other, recvbuf=incoming, source=other)
        elif exchange == "send-first" or r < other:
            c.Send(out, dest=other)
            c.Recv(incoming, source=other)
        else:
            c.Recv(incoming, source=other)
            c.Send(out, dest=other)
        out = combined(out, incoming)
        d *= 2
    if fold and give_back and send_back and r + p2 < p:
        c.Send(out, dest=r + p2)
    return out.copy() if in_place else out


def naive(c, x, op=MPI.SUM):
    p, r = c.Get_size(), c.Get_rank()
    out, incoming = x.copy(), np.empty_like(x)
    for k in range(p):
        if k != r:
            c.Sendrecv(x, dest=k, recvbuf=incoming, source=k)
            COMBINE[op_name(op)](out, incoming, out=out)
    return out


def reduce_then_broadcast(c, x, op=MPI.SUM):
    out = linear_reduce(c, x, op, root=0)
    return tree_broadcast(c, out if out is not None else np.empty_like(x), root=0)


def library_allreduce(c, x, op=MPI.SUM):
    out = np.empty_like(x)
    c.Allreduce(x, out, op=op)
    return out


D = "recursive_doubling"
passes(D, "a right recursive doubling passes", doubling)
diagnosed(D, "not written", not_written, "not written yet", "replace the `raise NotImplementedError`")
diagnosed(D, "both send first", lambda c, x, op=MPI.SUM: doubling(c, x, op, exchange="send-first"),
          "deadlock: ranks 0 and 1 both wait in Send to each other", "both ranks call Send first.*Sendrecv")
diagnosed(D, "send then receive: two rounds an exchange", lambda c, x, op=MPI.SUM: doubling(c, x, op, exchange="ordered"),
          r"took 2 rounds on 2 ranks; recursive doubling takes log2 p = 1", "Sendrecv sends and receives in one")
diagnosed(D, "always adding", lambda c, x, op=MPI.SUM: doubling(c, x, op, combine=np.add), "wrong values",
          "added the arrays up")
diagnosed(D, "x modified", lambda c, x, op=MPI.SUM: doubling(c, x, op, in_place=True), "x was modified",
          "leave x as it is")
diagnosed(D, "x itself returned on one rank", lambda c, x, op=MPI.SUM: doubling(c, x, op, fresh=False),
          r"^recursive doubling \(1 rank, .*rank 0 returned its x itself, not a new array", "array of your own")
diagnosed(D, "a reduce, then a broadcast", reduce_then_broadcast, "took 2 rounds on 2 ranks",
          "a reduce followed by a broadcast")
diagnosed(D, "the library's Allreduce", library_allreduce, "called comm.Allreduce", "point-to-point")
diagnosed(D, "labkit's own", lambda c, x, op=MPI.SUM: collectives.recursive_doubling_allreduce(c, x, op),
          "labkit's own collectives.recursive_doubling_allreduce", "write it yourself")
with on_ranks(3):
    diagnosed(D, "powers of two only", lambda c, x, op=MPI.SUM: doubling(c, x, op, fold=False),
              "sent to rank 3, but this communicator has 3 ranks, 0 to 2", "some ranks have no partner")
    diagnosed(D, "the extra rank never gets the result", lambda c, x, op=MPI.SUM: doubling(c, x, op, give_back=False),
              r"on 3 ranks, which is not a power of two \(it passed on 1 and 2 ranks\), rank 2 has wrong values",
              "rank 2 received nothing.*which rank could hand it to rank 2")
    diagnosed(D, "the result never sent back", lambda c, x, op=MPI.SUM: doubling(c, x, op, send_back=False),
              "rank 2 waited 3 s for a message from rank 0, which never came: rank 0 returned without a matching Send",
              "rank 0 took in rank 2's x and returned without sending rank 2 the result")
    diagnosed(D, "the naive allreduce", naive, "that is the naive allreduce", "one partner a round")
with on_ranks(4):
    diagnosed(D, "a partner that is not mutual",
              lambda c, x, op=MPI.SUM: doubling(c, x, op, partner=lambda r, d, p2: (r + d) % p2),
              r"^recursive doubling \(4 ranks.*your partners are not mutual: rank 0 waits to exchange with rank 1.*"
              r"0 with 1, 1 with 2, 2 with 3, 3 with 0", "if rank a's partner is b, then b's partner is a")
    mistake(D, "the same partner every round: no mistake named, a step of the derivation",
            lambda c, x, op=MPI.SUM: doubling(c, x, op, partner=lambda r, d, p2: p2 - 1 - r), "wrong values",
            "\nStep ")


# ---- recorded while graded, replayed by the grader: the same verdict and message -------------------------------------

def replays(check_name, name, fn, right, graded_says=None):
    """The grader's verdict on the record is the student's (``graded_says``: a failure the grader words its own way)."""
    @case(f"{check_name}: {name}, recorded and replayed")
    def _():
        plain, graded, other_draw = _cases.record_and_replay(check_name, fn)
        if comm.Get_rank() != 0:
            return
        if right:
            assert plain == (True, "") and graded[0] is True, (plain, graded)
            assert not other_draw[0] and "was not recorded" in other_draw[1], other_draw
        elif graded_says:
            assert not plain[0] and not graded[0] and graded_says in graded[1], (plain, graded)
        else:
            assert not plain[0] and graded == plain, (plain, graded)


replays(R, "a right reduce", linear_reduce, right=True)
replays(R, "the root leaving out its own x", lambda c, x, op=MPI.SUM, root=0: linear_reduce(c, x, op, root, own=False),
        right=False)
replays(R, "the root returning its x itself", reduce_returning_x_alone, right=False)
replays(B, "a right tree", tree_broadcast, right=True)
replays(B, "the root returning its x itself", root_returns_x, right=False)
replays(B, "labkit's own broadcast", lambda c, x, root=0: collectives.broadcast(c, x, root), right=False,
        graded_says="uses labkit's reference (labkit.collectives.broadcast)")
replays(B, "the linear broadcast", linear_broadcast, right=size < 4)
replays(D, "a right recursive doubling", doubling, right=True)
replays(D, "a deadlock", lambda c, x, op=MPI.SUM: doubling(c, x, op, exchange="send-first"), right=False)
replays(D, "x modified", lambda c, x, op=MPI.SUM: doubling(c, x, op, in_place=True), right=False)
replays(D, "partners not mutual", lambda c, x, op=MPI.SUM: doubling(c, x, op, partner=lambda r, d, p2: (r + d) % p2),
        right=size < 4)

run_cases(comm)
