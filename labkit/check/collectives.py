"""Checks of lab 06, run on every MPI rank (``%%px``): collectives the student builds from ``Send``, ``Recv`` and
``Sendrecv`` alone. A linear reduce to a root, a binomial-tree broadcast from any root, and a recursive-doubling
allreduce.

Each check runs the student's function on sub-communicators of 1..p ranks (:func:`.common.collective_check`), compares
it with the MPI library's own collective, then judges its traffic. A recording communicator (:class:`P2PComm`) logs
every message sent and received. The rounds are counted on a one-port machine (:func:`schedule`): each rank sends at
most one message and receives at most one per round, and a ``Sendrecv`` does both in one round.

A ``Send`` here waits until its receive is posted, as MPI's does for large arrays (a synchronous send). So an order
of calls that can deadlock does so at every size, and ends in a timeout that names the ranks waiting on each other.
A rank whose function raised tells the others at once, so they stop waiting instead of timing out.
"""

from __future__ import annotations

import functools
import re
import sys
import time
from collections import deque
from itertools import combinations
from pathlib import Path

import numpy as np

from ..errors import LabkitError
from . import capture
from .common import ExerciseError, collective_check, not_written, on_given_comm, recorded
from .exercises import Exercise

# the codes of P2PComm's log rows (source, dest, bytes, code): what happened, in the rank's program order
SEND, RECV, SR_SEND, SR_RECV, STUCK_SEND, STUCK_RECV = 0, 1, 2, 3, 8, 9
ALARM_TAG = 77
_ABANDONED: list = []  # requests given up on (cancelled, or alarms never received), with their buffers
_COLLECTIVES_FILE = str(Path(__file__).resolve().parent.parent / "collectives.py")
_ALLOWED = {"Get_rank", "Get_size", "rank", "size", "log", "timeout", "rounds"}
_NONBLOCKING = {"Isend", "Irecv", "Issend", "Ibsend", "Irsend", "Bsend", "Ssend", "Rsend", "Sendrecv_replace",
                "Send_init", "Recv_init", "Probe", "Iprobe", "Mprobe", "Improbe"}
_ONLY = "comm.Send, comm.Recv and comm.Sendrecv"


class MessageMistake(LabkitError):
    """A student's function did something the exercise's messages never do (the message says what); raised at once
    on the rank that did it."""


class PeerFailed(LabkitError):
    """Another rank's function raised: this rank stops waiting for it."""


def _mistake_name(e: BaseException) -> str | None:
    """MessageMistake or PeerFailed (by name: a replayed record raises a look-alike class of the same name)."""
    name = type(e).__name__
    return name if name in ("MessageMistake", "PeerFailed") else None


def _nbytes(buf) -> int:
    return int(np.asarray(buf[0] if isinstance(buf, (list, tuple)) else buf).nbytes)


def _labkit_caller() -> str | None:
    """The function of labkit.collectives that the student's function called, if it is on the stack."""
    f, found = sys._getframe(2), None
    while f is not None:
        name = f.f_code.co_filename
        if name.endswith("collectives.py") and str(Path(name).resolve()) == _COLLECTIVES_FILE:
            found = f.f_code.co_name  # the outermost: the one the student called
        elif found:
            break
        f = f.f_back
    return found


def _p2p_comm(comm, alarm, timeout: float):
    """A TrafficComm for these exercises (see :class:`P2PComm`)."""
    return _p2p_class()(comm, alarm, timeout)


@functools.cache
def _p2p_class():
    """The class of :func:`_p2p_comm`, made on first use (mpi4py is imported late)."""
    from mpi4py import MPI

    from ..traffic import TrafficComm

    class P2PComm(TrafficComm):
        """Logs every message sent and received, with the ones a rank was stuck in; allows only Send, Recv and
        Sendrecv (with a timeout each), and names any other call as the mistake it is."""

        def __init__(self, comm, alarm, timeout):
            super().__init__(comm, timeout=timeout)
            self._alarm = alarm
            self._r, self._p = comm.Get_rank(), comm.Get_size()

        # -- the three calls of the exercises --------------------------------------------------------------------

        def Send(self, buf, dest, tag=0):  # noqa: N802 - the MPI names
            if self._peer(dest, "sent to"):
                return
            n = _nbytes(buf)
            self._wait([self._comm.Issend(buf, dest, tag)], [(self._r, dest, n, SEND)], f"Send to rank {dest}")

        def Recv(self, buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=None):  # noqa: N802
            if self._peer(source, "received from", any_ok=True):
                return self._comm.Recv(buf, source, tag, status)
            st = status if status is not None else MPI.Status()
            self._wait([self._comm.Irecv(buf, source, tag)], [(source, self._r, 0, RECV)],
                       f"Recv from {'any rank' if source == MPI.ANY_SOURCE else f'rank {source}'}", [st])

        def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=MPI.ANY_SOURCE,  # noqa: N802
                     recvtag=MPI.ANY_TAG, status=None):
            no_send = self._peer(dest, "sent to")
            no_recv = self._peer(source, "received from", any_ok=True)
            if no_send or no_recv:  # a half with MPI.PROC_NULL: the other half alone
                if not no_send:
                    return self.Send(sendbuf, dest, sendtag)
                if not no_recv:
                    return self.Recv(recvbuf, source, recvtag, status)
                return None
            st = status if status is not None else MPI.Status()
            reqs = [self._comm.Irecv(recvbuf, source, recvtag), self._comm.Issend(sendbuf, dest, sendtag)]
            rows = [(source, self._r, 0, SR_RECV), (self._r, dest, _nbytes(sendbuf), SR_SEND)]
            self._wait(reqs, rows, f"Sendrecv (to rank {dest}, from rank {source})", [st, MPI.Status()])

        # -- everything else is a mistake ------------------------------------------------------------------------

        def Isend(self, *args, **kwargs):  # noqa: N802
            raise self._forbidden("Isend")

        def Allreduce(self, *args, **kwargs):  # noqa: N802
            raise self._forbidden("Allreduce")

        def Allgather(self, *args, **kwargs):  # noqa: N802
            raise self._forbidden("Allgather")

        def Bcast(self, *args, **kwargs):  # noqa: N802
            raise self._forbidden("Bcast")

        def Reduce(self, *args, **kwargs):  # noqa: N802
            raise self._forbidden("Reduce")

        def Barrier(self, *args, **kwargs):  # noqa: N802
            raise self._forbidden("Barrier")

        def gather_log(self, *args, **kwargs):
            raise self._forbidden("gather_log")

        def __getattr__(self, name):
            if name.startswith("_") or name in _ALLOWED:
                raise AttributeError(name)
            if hasattr(self._comm, name):
                raise self._forbidden(name)
            raise AttributeError(f"a communicator has no attribute {name!r}")

        # -- the machinery -----------------------------------------------------------------------------------------

        def _peer(self, other, verb: str, any_ok: bool = False) -> bool:
            """Refuse a rank that is none of this communicator's (or this rank itself); True for MPI.PROC_NULL."""
            if other == MPI.PROC_NULL:
                return True
            if any_ok and other == MPI.ANY_SOURCE:
                return False
            if not isinstance(other, (int, np.integer)) or isinstance(other, bool) or not 0 <= other < self._p:
                raise MessageMistake(f"rank {self._r} {verb} rank {other}, but this communicator has {self._p} "
                                     f"rank{'s' if self._p > 1 else ''}, 0 to {self._p - 1}")
            if other == self._r:
                raise MessageMistake(f"rank {self._r} {verb} itself: a rank already holds its own data, and a "
                                     "message to itself only waits")
            return False

        def _wait(self, reqs, rows, what, statuses=None):
            """Wait for the requests, then log ``rows`` (a receive with where it came from and its size). On a
            timeout, or when another rank failed, cancel them and log what this rank was stuck in."""
            statuses = statuses or [MPI.Status() for _ in reqs]
            deadline = time.monotonic() + self.timeout
            probe = MPI.Status()
            while not MPI.Request.Testall(reqs, statuses):
                failed = self._alarm.Iprobe(MPI.ANY_SOURCE, ALARM_TAG, probe)
                if failed or time.monotonic() > deadline:
                    stuck = [(s, d, n, STUCK_SEND if c in (SEND, SR_SEND) else STUCK_RECV)
                             for req, (s, d, n, c) in zip(reqs, rows) if not req.Test()]
                    for req in reqs:
                        try:
                            req.Cancel()
                        except MPI.Exception:
                            pass
                    _ABANDONED.append(reqs)
                    self.log.extend(stuck)
                    if failed:
                        raise PeerFailed(f"rank {self._r} stopped waiting: rank {probe.Get_source()} failed")
                    raise TimeoutError(f"rank {self._r} waited {self.timeout:g} s in {what}")
                time.sleep(1e-5)
            for (s, d, n, c), st in zip(rows, statuses):
                if c in (RECV, SR_RECV):
                    s, n = st.Get_source(), st.Get_count(MPI.BYTE)
                self.log.append((int(s), int(d), int(n), c))
            self.rounds += 1

        def _forbidden(self, name: str) -> MessageMistake:
            own = _labkit_caller()
            if own:
                return MessageMistake(f"your function called labkit's own collectives.{own}: the exercise is to write "
                                      f"it yourself, from {_ONLY}")
            if name.islower() and name.capitalize() in ("Send", "Recv", "Sendrecv", "Isend", "Irecv"):
                return MessageMistake(f"your function called comm.{name}, the lowercase method: it pickles Python "
                                      f"objects, and the check cannot see its messages. Use the buffer methods "
                                      f"{_ONLY} on NumPy arrays")
            if name in _NONBLOCKING:
                return MessageMistake(f"your function called comm.{name}: these exercises use only the blocking "
                                      f"{_ONLY} (the check counts rounds from them)")
            if name[:1].isupper() or name in ("bcast", "reduce", "allreduce", "gather", "scatter", "allgather",
                                              "alltoall", "barrier", "scan", "exscan"):
                return MessageMistake(f"your function called comm.{name}, which the exercise does not allow: build "
                                      f"the collective from {_ONLY} alone (point-to-point messages)")
            return MessageMistake(f"your function used comm.{name}; this exercise needs only comm.Get_rank(), "
                                  f"comm.Get_size() and {_ONLY}")

        def alarm_others(self) -> None:
            """Tell every other rank that this one failed (they stop waiting for it)."""
            buf = np.zeros(1, np.int8)
            reqs = [self._alarm.Isend(buf, k, ALARM_TAG) for k in range(self._p) if k != self._r]
            _ABANDONED.append((reqs, buf))

    return P2PComm


# -- calling the student's function ----------------------------------------------------------------------------------

TIMED_OUT, STOPPED = "\x00timeout ", "\x00stopped "  # marks of the errors a cause elsewhere explains


def _call(fn, tc, args, where: str, ex: str):
    """The student's ``fn(tc, *args)``: (what it returned, None), or (None, what went wrong) when it raised. A rank
    that raised warns the others, so they stop waiting for it."""
    from mpi4py import MPI

    try:
        return fn(tc, *args), None
    except Exception as e:
        error = _raised(e, where, ex, MPI)
        if not error.startswith((TIMED_OUT, STOPPED)):
            tc.alarm_others()
        return None, error


def _raised(e: Exception, where: str, ex: str, MPI) -> str:
    if isinstance(e, NotImplementedError):
        return not_written(ex)
    if isinstance(e, TimeoutError):
        return TIMED_OUT + str(e)
    if _mistake_name(e) == "PeerFailed":
        return STOPPED + str(e)
    if _mistake_name(e) == "MessageMistake":
        return f"{ex} ({where}): {e}"
    if isinstance(e, (ExerciseError, capture.NotRecorded)):
        return f"{e} ({where})"
    if isinstance(e, MPI.Exception):
        return (f"{ex} ({where}): MPI reported an error: {e.Get_error_string()}\nHint: most often a message is larger "
                "than the buffer receiving it: receive into an array of the same size and dtype as the one sent")
    return f"{ex} ({where}): your function raised {type(e).__name__}: {e}"


def _run(fn, sub, args, where: str, ex: str, timeout: float):
    """Run the student's function on a fresh duplicate of ``sub``; every rank gets every rank's (error, log)."""
    work = sub.Dup()  # the student's messages stay apart from the check's own, even if some are abandoned
    alarm = sub.Dup()
    tc = _p2p_comm(work, alarm, timeout)
    got, error = _call(fn, tc, args, where, ex)
    everyone = sub.allgather((error, [tuple(int(v) for v in row) for row in tc.log]))
    errors, logs = [e for e, _ in everyone], [log for _, log in everyone]
    if not any(errors):  # else not freed: a rank may have abandoned an operation on them
        work.Free()
        alarm.Free()
    return got, errors, logs


def _error_verdict(errors, logs, where: str, ex: str, timeout: float, hint: str) -> str | None:
    """The one message for a case where some rank raised: the first real cause in rank order; else, when every
    failure is a timeout, which ranks waited for what (from everyone's logs)."""
    causes = [e for e in errors if e and not e.startswith((TIMED_OUT, STOPPED))]
    if causes:
        return causes[0]
    if not any(errors):
        return None
    said = next((e[len(TIMED_OUT):] for e in errors if e and e.startswith(TIMED_OUT)), "a rank stopped waiting")
    waited = re.search(r"waited ([0-9.]+) s", said)  # the student's run's timeout (the grader's replay has its own)
    waited = float(waited.group(1)) if waited else timeout
    return f"{ex} ({where}): {deadlock(logs, waited) or said}" + (f"\nHint: {hint}" if hint else "")


def deadlock(logs, timeout: float) -> str | None:
    """What the ranks that timed out were waiting for, and why it never came, from every rank's log (None when no
    log says)."""
    from mpi4py import MPI

    stuck = {r: [(c, d if c == STUCK_SEND else s) for s, d, _, c in log if c in (STUCK_SEND, STUCK_RECV)]
             for r, log in enumerate(logs)}
    waiting = {r: w for r, w in stuck.items() if w}
    for a, b in combinations(sorted(waiting), 2):
        if (STUCK_SEND, b) in waiting[a] and (STUCK_SEND, a) in waiting[b]:
            return (f"deadlock: ranks {a} and {b} both wait in Send to each other, and neither receives (here a Send "
                    f"waits until its receive is posted, as MPI's does for large arrays); they waited {timeout:g} s")
        if (STUCK_RECV, b) in waiting[a] and (STUCK_RECV, a) in waiting[b]:
            return (f"deadlock: ranks {a} and {b} both wait to receive from each other, and neither sends; they "
                    f"waited {timeout:g} s")
    if not waiting:
        return None
    a = min(waiting)
    kind, peer = waiting[a][0]
    if peer == MPI.ANY_SOURCE:
        return f"rank {a} waited {timeout:g} s to receive from any rank, but no message came"
    doing = (f"was itself stuck {'sending to' if waiting[peer][0][0] == STUCK_SEND else 'receiving from'} rank "
             f"{waiting[peer][0][1]}" if peer in waiting else f"returned without a matching "
             f"{'Recv from' if kind == STUCK_SEND else 'Send to'} rank {a}")
    if kind == STUCK_SEND:
        return f"rank {a} waited {timeout:g} s in a Send to rank {peer} that was never received: rank {peer} {doing}"
    return f"rank {a} waited {timeout:g} s for a message from rank {peer}, which never came: rank {peer} {doing}"


# -- the traffic, from everyone's logs -------------------------------------------------------------------------------

def _events(log):
    """A rank's log rows as events in program order: ("send", dest), ("recv", source) or ("both", dest, source)."""
    events, i = [], 0
    while i < len(log):
        s, d, _, c = log[i]
        if c == SR_RECV and i + 1 < len(log) and log[i + 1][3] == SR_SEND:
            events.append(("both", log[i + 1][1], s))
            i += 2
            continue
        if c in (SEND, SR_SEND):
            events.append(("send", d))
        elif c in (RECV, SR_RECV):
            events.append(("recv", s))
        i += 1
    return events


def schedule(logs) -> tuple[list[tuple[int, int, int]], int]:
    """Play everyone's messages on a one-port machine, each rank in its own program order: a rank sends at most one
    message and receives at most one per round (a Sendrecv does both in one round), and a message sent in round t
    arrives in round t or, when its receiver is busy, later. Returns ((round, source, dest) of every message that
    arrived, in order of rounds; the number of rounds)."""
    k = len(logs)
    events = [_events(log) for log in logs]
    pos, clock, posted = [0] * k, [0] * k, [None] * k
    in_flight: dict = {}
    arrived = []
    progress = True
    while progress:
        progress = False
        for a in range(k):
            while pos[a] < len(events[a]):
                ev = events[a][pos[a]]
                if ev[0] == "send":
                    clock[a] += 1
                    in_flight.setdefault((a, ev[1]), deque()).append(clock[a])
                else:
                    source = ev[1] if ev[0] == "recv" else ev[2]
                    if ev[0] == "both" and posted[a] is None:
                        posted[a] = clock[a] + 1
                        in_flight.setdefault((a, ev[1]), deque()).append(posted[a])
                    q = in_flight.get((source, a))
                    if not q:
                        break
                    sent = q.popleft()
                    clock[a] = max(clock[a] + 1, sent) if ev[0] == "recv" else max(posted[a], sent)
                    posted[a] = None
                    arrived.append((clock[a], source, a))
                pos[a] += 1
                progress = True
    return sorted(arrived), max(clock, default=0)


def _show_schedule(arrived, limit: int = 12) -> str:
    """"round 1: 0->2; round 2: 0->1, 2->3" (the first ``limit`` messages)."""
    by_round: dict = {}
    for rnd, s, d in arrived[:limit]:
        by_round.setdefault(rnd, []).append(f"{s}->{d}")
    text = "; ".join(f"round {rnd}: {', '.join(m)}" for rnd, m in sorted(by_round.items()))
    return text + ("; ..." if len(arrived) > limit else "")


def _sent(logs):
    """Per rank, its messages sent as (dest, bytes), and per rank the sources of its messages received."""
    sent = [[(d, n) for _, d, n, c in log if c in (SEND, SR_SEND)] for log in logs]
    got = [[s for s, _, _, c in log if c in (RECV, SR_RECV)] for log in logs]
    return sent, got


def ceil_log2(k: int) -> int:
    return (k - 1).bit_length()


# -- inputs and results ----------------------------------------------------------------------------------------------

_UFUNCS = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum}


def _inputs(k: int, n: int, dtype, op_or_none, case: int) -> list[np.ndarray]:
    """Every rank's x for one case (each rank draws them all, the same everywhere): whole numbers, so any order of
    combining gives exactly the same result; 1 to 3 for a product, so it stays small."""
    from ..collectives import op_name

    xs = []
    for j in range(k):
        rng = np.random.default_rng([abs(capture.seed(k)), j, n, case])
        low, high = (1, 4) if op_or_none is not None and op_name(op_or_none) == "PROD" else (-50, 50)
        xs.append(rng.integers(low, high, n).astype(dtype))
    return xs


def _combine(xs, op):
    from ..collectives import op_name

    f = _UFUNCS[op_name(op)]
    out = xs[0].copy()
    for x in xs[1:]:
        f(out, x, out=out)
    return out


def _shape_error(got, want, ex, where) -> str | None:
    if not isinstance(got, np.ndarray):
        return f"{ex} ({where}): returned {type(got).__name__}, expected a NumPy array"
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{ex} ({where}): returned shape {got.shape} {got.dtype}, expected {want.shape} {want.dtype}"
    return None


def _untouched(x, before, r, ex, where) -> str | None:
    if not np.array_equal(x, before):
        return (f"{ex} ({where}): rank {r}'s x was modified\nHint: leave x as it is: work on a copy (out = x.copy()), "
                "receive into new arrays (np.empty_like(x)), and return the result")
    return None


def _first_difference(got, want) -> str:
    bad = np.flatnonzero(got != want)
    return (f"wrong values at {len(bad)} of {got.size} positions, first at index {bad[0]}: got {got[bad[0]]}, "
            f"expected {want[bad[0]]}")


def _and(items) -> str:
    """"1", "1 and 2", "1, 2 and 3"."""
    items = [str(i) for i in items]
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def _ranks(rs) -> str:
    rs = sorted(rs)
    return f"rank{'s' if len(rs) > 1 else ''} {_and(rs)}"


def _which_ranks(got, xs, op) -> tuple[int, ...] | None:
    """The largest set of ranks whose x combined give ``got`` (the data that reached it), if any does."""
    k = len(xs)
    if k > 6:
        return None
    for size in range(k, 0, -1):
        for subset in combinations(range(k), size):
            if np.array_equal(got, _combine([xs[j] for j in subset], op)):
                return subset
    return None


def _combination_hint(got, xs, op, r: int, whole: tuple[int, ...]) -> str:
    """What a wrong combination most likely is: some ranks' data missing, one counted twice, or the wrong op."""
    from mpi4py import MPI

    from ..collectives import op_name

    if op_name(op) != "SUM" and np.array_equal(got, _combine(xs, MPI.SUM)):
        return f"rank {r} added the arrays up, but this case's op is MPI.{op_name(op)}: combine with the op given"
    subset = _which_ranks(got, xs, op)
    if subset == (r,):
        return f"rank {r} holds only its own x: it combined nothing it received"
    if subset is not None and len(subset) == 1:
        return (f"rank {r} holds rank {subset[0]}'s x alone: it received into its result and overwrote it, instead of "
                "receiving into a new array and combining")
    if subset is not None:
        missing = sorted(set(whole) - set(subset))
        return f"rank {r}'s result combines the x of {_ranks(subset)} but leaves out {_ranks(missing)}"
    if op_name(op) == "SUM":
        twice = [j for j in range(len(xs)) if np.array_equal(got, _combine(xs, op) + xs[j])]
        if twice:
            return f"rank {r}'s result counts rank {twice[0]}'s x twice"
    return ""


def _where(k, n, dtype, op=None, root=None, r=None) -> str:
    from ..collectives import op_name

    return ", ".join([f"{k} rank{'s' if k > 1 else ''}"] + ([f"root {root}"] if root is not None else []) +
                     [f"n={n}", str(np.dtype(dtype))] + ([f"MPI.{op_name(op)}"] if op is not None else []) +
                     ([f"rank {r}"] if r is not None else []))


def _first_local(sub, error: str | None, prefer: int = 0) -> str | None:
    """Every rank's own verdict shared; the one to show: rank ``prefer``'s if it has one, else the first in rank
    order."""
    said = sub.allgather(error)
    return said[prefer] if said[prefer] else next((e for e in said if e), None)


# -- exercise 1: a linear reduce to a root ---------------------------------------------------------------------------

_REDUCE_CASES = ((7, np.float64, "SUM"), (1, np.int64, "MAX"), (1000, np.int32, "PROD"), (0, np.float32, "MIN"),
                 (33, np.float32, "MIN"))


@recorded
def linear_reduce(fn, comm=None, timeout: float = 10.0) -> None:
    """Exercise (lab 06): ``fn(comm, x, op, root)`` must be a linear reduce. Call on every MPI rank (``%%px``).

    Runs ``fn`` on sub-communicators of 1, 2, ..., p ranks, with every rank as the root in turn, lengths 0,
    1 and more, several dtypes and ops; compares the root's result with ``MPI_Reduce`` (the other ranks must return
    None), checks that ``x`` is untouched, and records the traffic: every other rank sends its whole x straight to the
    root, once, and the root sends nothing. Every rank raises the same ExerciseError on failure.
    """
    from mpi4py import MPI

    comm = comm or MPI.COMM_WORLD
    ex = "linear reduce"
    fn = on_given_comm(capture.student(fn, ex=ex), ex)

    def run(sub, k):
        for root in range(k):
            for i, (n, dtype, op) in enumerate(_REDUCE_CASES):
                yield lambda root=root, i=i, n=n, dtype=dtype, op=op: reduce_case(
                    fn, sub, k, n, dtype, getattr(MPI, op), root, i, timeout, ex)

    collective_check(comm, ex, run)


def reduce_case(fn, sub, k, n, dtype, op, root, case, timeout, ex) -> str | None:
    """One reduce on one sub-communicator; returns what went wrong (the same on every rank), or None."""
    r = sub.Get_rank()
    where = _where(k, n, dtype, op, root)
    xs = _inputs(k, n, dtype, op, case)
    x = xs[r].copy()
    want = np.empty_like(x) if r == root else None
    sub.Reduce(x, want, op=op, root=root)
    got, errors, logs = _run(fn, sub, (x, op, root), where, ex, timeout)
    verdict = _error_verdict(errors, logs, where, ex, timeout,
                             "every rank other than the root sends once; the root receives from each of them")
    if verdict:
        return verdict
    verdict = _first_local(sub, _reduce_result_error(got, x, xs[r], want, xs, op, r, root, where, ex), prefer=root)
    if verdict is None and k > 1 and n > 0:
        verdict = _reduce_traffic_error(logs, x.nbytes, k, root, where, ex)
    return verdict


def _reduce_result_error(got, x, before, want, xs, op, r, root, where, ex) -> str | None:
    error = _untouched(x, before, r, ex, where)
    if error:
        return error
    if r != root:
        if got is not None:
            wrong = "the whole result" if isinstance(got, np.ndarray) and np.array_equal(got, _combine(xs, op)) else \
                type(got).__name__
            return (f"{ex} ({where}): rank {r}, not the root, returned {wrong}\nHint: a reduce leaves the result on the "
                    "root only: every other rank returns None")
        return None
    if got is None:
        return (f"{ex} ({where}): the root, rank {root}, returned None\nHint: the root returns the combined array"
                + (f"; the root is the rank given as root (here {root}), not always rank 0" if root else ""))
    error = _shape_error(got, want, ex, where)
    others = [xs[j] for j in range(len(xs)) if j != root]
    if error is None and not np.array_equal(got, want) and (
            not got.any() or (others and np.array_equal(got, _combine(others, op)))):
        alone = (f"the root's result is rank {1 - root}'s x alone: the root left out its own x, or received into its "
                 "result and overwrote it" if len(others) == 1 else "the root left out its own x")
        return (f"{ex} ({where}): the root has {_first_difference(got, want)}\nHint: {alone}. Start the result from a "
                "copy of the root's x, receive into a new array, and combine")
    if error is None and not np.array_equal(got, want):
        hint = _combination_hint(got, xs, op, r, tuple(range(len(xs))))
        if f"rank {r} holds only its own x" in hint:
            hint = "the root returned its own x: it must combine every array it receives into its result"
        elif "leaves out" in hint and f"leaves out rank {r}" in hint:
            hint = "the root left out its own x: start the result from a copy of it"
        error = f"{ex} ({where}): the root has {_first_difference(got, want)}" + (f"\nHint: {hint}" if hint else "")
    return error


def _reduce_traffic_error(logs, nbytes, k, root, where, ex) -> str | None:
    sent, got = _sent(logs)
    if sent[root]:
        return (f"{ex} ({where}): the root, rank {root}, sent a message to rank {sent[root][0][0]}\nHint: in a reduce "
                "the data flows to the root only: the root receives and combines, and sends nothing")
    for j in range(k):
        if j == root:
            continue
        if got[j]:
            return (f"{ex} ({where}): rank {j}, not the root, received from rank {got[j][0]}: that is a tree reduce, "
                    "where ranks combine on the way\nHint: in this linear reduce every other rank sends its x "
                    "straight to the root, and only the root receives")
        dests = sorted({d for d, _ in sent[j]})
        if dests != [root]:
            if root != 0 and 0 in dests:
                return (f"{ex} ({where}): rank {j} sent to rank 0, but the root is rank {root}: your reduce works for "
                        "root 0 only\nHint: send to the rank given as root")
            return (f"{ex} ({where}): rank {j} sent to {_ranks(dests) if dests else 'nobody'}; it must send to the root, "
                    f"rank {root}")
        if len(sent[j]) != 1:
            return (f"{ex} ({where}): rank {j} sent {len(sent[j])} messages to the root\nHint: each rank sends its x "
                    "once")
        if sent[j][0][1] != nbytes:
            return (f"{ex} ({where}): rank {j} sent {sent[j][0][1]} bytes; its x is {nbytes} bytes\nHint: send the "
                    "whole array x")
    return None


# -- exercise 2: a binomial-tree broadcast from any root -------------------------------------------------------------

_BCAST_CASES = ((1000, np.float64), (1, np.int32), (0, np.float32), (33, np.int64))


@recorded
def tree_broadcast(fn, comm=None, timeout: float = 10.0) -> None:
    """Exercise (lab 06): ``fn(comm, x, root)`` must be a binomial-tree broadcast. Call on every MPI rank (``%%px``).

    Runs ``fn`` on sub-communicators of 1, 2, ..., p ranks, with every rank as the root in turn, lengths 0,
    1 and more, several dtypes; every rank must return root's x (compared with ``MPI_Bcast``) and leave its own x
    untouched. The traffic: p - 1 messages of the whole array, each rank but the root receiving once, in
    ceil(log2 p) rounds (a rank sends at most one message a round). Every rank raises the same ExerciseError on failure.
    """
    from mpi4py import MPI

    comm = comm or MPI.COMM_WORLD
    ex = "tree broadcast"
    fn = on_given_comm(capture.student(fn, ex=ex), ex)

    def run(sub, k):
        for root in range(k):
            for i, (n, dtype) in enumerate(_BCAST_CASES):
                yield lambda root=root, i=i, n=n, dtype=dtype: broadcast_case(fn, sub, k, n, dtype, root, i, timeout, ex)

    collective_check(comm, ex, run)


def broadcast_case(fn, sub, k, n, dtype, root, case, timeout, ex) -> str | None:
    """One broadcast on one sub-communicator; returns what went wrong (the same on every rank), or None."""
    r = sub.Get_rank()
    where = _where(k, n, dtype, root=root)
    xs = _inputs(k, n, dtype, None, case)
    for j in range(k):  # the other ranks' x: numbers the root's never holds, to tell where a result came from
        if j != root:
            xs[j] = (xs[j] + 1000 * (j + 1)).astype(dtype)
    x = xs[r].copy()
    want = x.copy()
    sub.Bcast(want, root=root)
    got, errors, logs = _run(fn, sub, (x, root), where, ex, timeout)
    verdict = _error_verdict(errors, logs, where, ex, timeout,
                             "each rank but the root receives once, from a rank that already has the data")
    if verdict:
        return verdict
    _, received = _sent(logs)
    error = _broadcast_result_error(got, x, xs, want, received[r], k, r, root, where, ex)
    holds = next((j for j in range(k) if isinstance(got, np.ndarray) and got.shape == xs[j].shape
                  and np.array_equal(got, xs[j])), None)
    said = sub.allgather((error, holds))
    verdict = next((e for e, _ in said if e), None)
    wrong = [j for j, (e, _) in enumerate(said) if e]
    if verdict and root != 0 and n > 0 and all(said[j][1] == 0 for j in wrong):
        verdict = (f"{ex} ({where}): {_ranks(wrong)} end{'s' if len(wrong) == 1 else ''} with rank 0's x, not the "
                   f"root's: your broadcast starts from rank 0, but here the root is rank {root}\nHint: number the "
                   "ranks relative to the root, so that the root is number 0")
    if verdict is None and k > 1 and n > 0:
        verdict = _broadcast_traffic_error(logs, x.nbytes, k, root, where, ex)
    return verdict


def _broadcast_result_error(got, x, xs, want, received, k, r, root, where, ex) -> str | None:
    error = _untouched(x, xs[r], r, ex, where) or _shape_error(got, want, ex, where)
    if error or np.array_equal(got, want):
        return error
    head = f"{ex} ({where}): rank {r} has {_first_difference(got, want)}"
    odd = "" if k & (k - 1) == 0 else f" ({k} is not a power of two: the rounds must reach every rank up to {k - 1})"
    if np.array_equal(got, xs[r]):
        if not received:
            return f"{ex} ({where}): rank {r} never received the data: it still holds its own x{odd}"
        return (f"{ex} ({where}): rank {r} received the data but returned its own x\nHint: receive into the array you "
                "return")
    source = next((j for j in range(k) if j not in (r, root) and np.array_equal(got, xs[j])), None)
    if source is not None:
        return (f"{ex} ({where}): rank {r} holds rank {source}'s own x, not the root's: rank {source} passed its data "
                "on before it had received the root's")
    return head


def _broadcast_traffic_error(logs, nbytes, k, root, where, ex) -> str | None:
    sent, received = _sent(logs)
    arrived, rounds = schedule(logs)
    want_rounds = ceil_log2(k)
    shown = f"\n  your messages: {_show_schedule(arrived)}"
    if received[root]:
        return (f"{ex} ({where}): the root, rank {root}, received a message from rank {received[root][0]}: nobody has "
                f"anything to send it{shown}")
    twice = next((j for j in range(k) if len(received[j]) > 1), None)
    if twice is not None:
        return (f"{ex} ({where}): rank {twice} received {len(received[twice])} messages (from {_ranks(received[twice])}); "
                f"each rank needs the data once, so a broadcast sends p - 1 = {k - 1} messages in all{shown}")
    wrong_size = next(((j, d, b) for j in range(k) for d, b in sent[j] if b != nbytes), None)
    if wrong_size:
        j, d, b = wrong_size
        return (f"{ex} ({where}): rank {j} sent {b} bytes to rank {d}; the array is {nbytes} bytes\nHint: every message "
                "of this broadcast carries the whole array")
    if rounds > want_rounds:
        from_root = all(s == root for _, s, _ in arrived)
        if from_root:
            return (f"{ex} ({where}): every message comes from the root: that is the linear broadcast, p - 1 = {k - 1} "
                    f"rounds. A binomial tree takes ceil(log2 p) = {want_rounds}: a rank that already has the data "
                    f"passes it on too{shown}")
        return (f"{ex} ({where}): your broadcast took {rounds} rounds on {k} ranks; a binomial tree takes ceil(log2 p) "
                f"= {want_rounds} (a rank sends at most one message a round){shown}\nHint: in every round each rank that "
                "already has the data should send it to one that does not, so the number of ranks holding it doubles")
    return None


# -- exercise 3: a recursive-doubling allreduce ----------------------------------------------------------------------

_ALLREDUCE_CASES = ((7, np.float64, "SUM"), (1000, np.int64, "MAX"), (1, np.int32, "PROD"), (33, np.float32, "MIN"),
                    (0, np.float64, "SUM"), (1000, np.float64, "SUM"))


@recorded
def recursive_doubling(fn, comm=None, timeout: float = 10.0) -> None:
    """Exercise (lab 06): ``fn(comm, x, op)`` must be a recursive-doubling allreduce. Call on every MPI rank (``%%px``).

    Runs ``fn`` on sub-communicators of 1, 2, ..., p ranks (powers of two and not), with lengths 0, 1 and more,
    several dtypes and ops; every rank's result must equal ``MPI_Allreduce``'s, and x must be untouched. The traffic:
    whole arrays only, log2 p rounds when p is a power of two, and with p2 the largest power of two below p, at most
    log2 p2 + 2 rounds and p2 log2 p2 + 2 (p - p2) messages otherwise. Every rank raises the same ExerciseError on
    failure.
    """
    from mpi4py import MPI

    comm = comm or MPI.COMM_WORLD
    ex = "recursive doubling"
    fn = on_given_comm(capture.student(fn, ex=ex), ex)

    def run(sub, k):
        for i, (n, dtype, op) in enumerate(_ALLREDUCE_CASES):
            yield lambda i=i, n=n, dtype=dtype, op=op: allreduce_case(fn, sub, k, n, dtype, getattr(MPI, op), i,
                                                                      timeout, ex)

    collective_check(comm, ex, run)


def allreduce_case(fn, sub, k, n, dtype, op, case, timeout, ex) -> str | None:
    """One allreduce on one sub-communicator; returns what went wrong (the same on every rank), or None."""
    r = sub.Get_rank()
    where = _where(k, n, dtype, op)
    xs = _inputs(k, n, dtype, op, case)
    x = xs[r].copy()
    want = np.empty_like(x)
    sub.Allreduce(x, want, op=op)
    got, errors, logs = _run(fn, sub, (x, op), where, ex, timeout)
    verdict = _error_verdict(errors, logs, where, ex, timeout,
                             "partners exchange with comm.Sendrecv, which sends and receives at once")
    if verdict:
        return verdict
    mine = _untouched(x, xs[r], r, ex, where) or _shape_error(got, want, ex, where)
    wrong = mine is None and not np.array_equal(got, want)
    bad = [j for j, w in enumerate(sub.allgather(wrong)) if w]
    if mine is None and wrong:
        hint = _combination_hint(got, xs, op, r, tuple(range(k)))
        odd = (f"on {k} ranks, which is not a power of two (it passed on {_and(range(1, k))} ranks), "
               + (f"{_ranks(bad)} have wrong values; " if len(bad) > 1 else "")) if k & (k - 1) else ""
        mine = f"{ex} ({where}): {odd}rank {r} has {_first_difference(got, want)}" + (f"\nHint: {hint}" if hint else "")
    verdict = _first_local(sub, mine)
    if verdict is None and k > 1 and n > 0:
        verdict = _allreduce_traffic_error(logs, x.nbytes, k, where, ex)
    return verdict


def _allreduce_traffic_error(logs, nbytes, k, where, ex) -> str | None:
    sent, _ = _sent(logs)
    arrived, rounds = schedule(logs)
    p2 = 1 << (k.bit_length() - 1)
    steps = p2.bit_length() - 1
    want_rounds = steps + (2 if k != p2 else 0)
    want_messages = p2 * steps + 2 * (k - p2)
    messages = sum(len(s) for s in sent)
    shown = f"\n  your messages: {_show_schedule(arrived)}"
    wrong_size = next(((j, d, b) for j in range(k) for d, b in sent[j] if b != nbytes), None)
    if wrong_size:
        j, d, b = wrong_size
        return (f"{ex} ({where}): rank {j} sent {b} bytes to rank {d}; the array is {nbytes} bytes\nHint: recursive "
                "doubling exchanges whole partial results (a ring or recursive halving sends pieces)")
    if k > 2 and all(len(s) == k - 1 and len({d for d, _ in s}) == k - 1 for s in sent):
        return (f"{ex} ({where}): every rank sent its x to each of the p - 1 = {k - 1} others: that is the naive "
                f"allreduce, {messages} messages in {rounds} rounds. Recursive doubling sends {want_messages} in "
                f"{want_rounds}{shown}")
    if messages == 2 * (k - 1) != want_messages and rounds > want_rounds:
        return (f"{ex} ({where}): {rounds} rounds and {messages} messages: a reduce to one rank followed by a broadcast. "
                f"In recursive doubling every rank exchanges with a partner in every round, and all finish together "
                f"in {want_rounds}{shown}")
    if rounds > want_rounds:
        sendrecv = any(c == SR_SEND for log in logs for _, _, _, c in log)
        hint = ("\nHint: a Send and then a Recv (or a reduce followed by a broadcast) take two rounds; comm.Sendrecv "
                "sends and receives in one" if not sendrecv else "")
        return (f"{ex} ({where}): your allreduce took {rounds} rounds on {k} ranks; recursive doubling takes "
                + (f"log2 p = {want_rounds}" if k == p2 else f"log2 {p2} + 2 = {want_rounds} ({k} is not a power of "
                   "two: one round to fold the extra ranks in, one to hand them the result)") + f"{shown}{hint}")
    if messages != want_messages:
        return (f"{ex} ({where}): {messages} messages in all; recursive doubling on {k} ranks sends "
                + (f"p log2 p = {want_messages}" if k == p2 else f"{p2} x {steps} among the first {p2} ranks and "
                   f"2 x {k - p2} for the extra ranks = {want_messages}") + shown)
    return None


# -- the exercises of lab 06 -----------------------------------------------------------------------------------------

_ALLREDUCES = ("ring_allreduce", "naive_allreduce", "reduce_broadcast_allreduce", "recursive_doubling_allreduce",
               "mpi_allreduce", "reduce", "broadcast")

EXERCISES = (
    Exercise("linear_reduce", "06", "collectives", mpi=True, references=("labkit.collectives:reduce",), hints=(
        "Every rank other than the root sends its whole x to the root, once (comm.Send), and returns None.",
        "The root starts its result from a copy of its own x, then receives from each other rank in turn into a new "
        "array (np.empty_like(x)) and combines it into the result.",
        "Combine with the op you were given: COMBINE[C.op_name(op)](result, incoming, out=result). The root is the "
        "rank passed as root, which need not be 0: loop over every rank but it.",
    )),
    Exercise("tree_broadcast", "06", "collectives", mpi=True, references=("labkit.collectives:broadcast",), hints=(
        "Number the ranks relative to the root, v = (rank - root) % p, so that the root is v = 0 (and a relative "
        "number w is the real rank (w + root) % p). Solve it for root 0 first.",
        "Rounds t = 0, 1, 2, ...: before round t the ranks v < 2**t hold the data (one rank before round 0, two "
        "before round 1, ...). In round t each of them sends to the rank 2**t further on, if that rank exists.",
        "So rank v > 0 receives once, in the round t where 2**t <= v < 2**(t+1), from v - 2**t; in each later round "
        "t' it sends to v + 2**t' if that is below p. Loop over the rounds while 2**t < p: ceil(log2 p) of them.",
    )),
    Exercise("recursive_doubling", "06", "collectives", mpi=True,
             references=tuple(f"labkit.collectives:{f}" for f in _ALLREDUCES), hints=(
        "Start with p a power of two (2 or 4 ranks). In round t, at distance d = 2**t, each rank pairs with the rank "
        "whose number differs from its own in bit t: partner = rank ^ d. Both send their partial result and combine "
        "what they receive.",
        "Exchange with comm.Sendrecv(result, dest=partner, recvbuf=incoming, source=partner): two ranks that both "
        "Send first wait for each other for ever. After log2 p rounds every rank holds everything.",
        "When p is not a power of two: let p2 be the largest power of two <= p and rem = p - p2. First, rank p2 + i "
        "(i < rem) sends its x to rank i, which combines it. The first p2 ranks then double among themselves. Last, "
        "rank i sends the result to rank p2 + i.",
    )),
)
