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
OUT_OF_RANGE = "\nHint: find the line that computed that rank: every rank your function names lies in 0 to p - 1"


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
                                     f"rank{'s' if self._p > 1 else ''}, 0 to {self._p - 1}{OUT_OF_RANGE}")
            if other == self._r:
                raise MessageMistake(f"rank {self._r} {verb} itself: a rank already holds its own data, and a "
                                     "message to itself only waits\nHint: leave the rank itself out of the ranks "
                                     f"it {'sends to' if verb == 'sent to' else 'receives from'}")
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
                return MessageMistake(f"your function called labkit's own collectives.{own}\nHint: the exercise is "
                                      f"to write it yourself, from {_ONLY}")
            if name.islower() and name.capitalize() in ("Send", "Recv", "Sendrecv", "Isend", "Irecv"):
                return MessageMistake(f"your function called comm.{name}, the lowercase method: it pickles Python "
                                      f"objects, and the check cannot see its messages\nHint: use the buffer "
                                      f"methods {_ONLY} on NumPy arrays")
            if name in _NONBLOCKING:
                return MessageMistake(f"your function called comm.{name}\nHint: these exercises use only the "
                                      f"blocking {_ONLY} (the check counts rounds from them)")
            if name[:1].isupper() or name in ("bcast", "reduce", "allreduce", "gather", "scatter", "allgather",
                                              "alltoall", "barrier", "scan", "exscan"):
                return MessageMistake(f"your function called comm.{name}, which the exercise does not allow\nHint: "
                                      f"build the collective from {_ONLY} alone (point-to-point messages)")
            return MessageMistake(f"your function used comm.{name}\nHint: this exercise needs only comm.Get_rank(), "
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


OUTSIDE = {  # per exercise, what a rank outside 0 .. p - 1 most likely comes from
    "linear reduce": "the root is the rank given as root, and the others are 0 to p - 1 but the root: find the line "
                     "that computed that rank",
    "tree broadcast": "that rank does not exist. Either a rank counted from the root was not turned back into a real "
                      "rank (counting on past p - 1 wraps around to 0), or that holder has nobody left to send to in "
                      "that round: in the last round of a tree, which holders have no rank left to reach?",
    "recursive doubling": "that rank does not exist: a partner computed for a power of two larger than p. When p is "
                          "not a power of two, some ranks have no partner in the rounds: how can they still take part, "
                          "and with which ranks?",
    "recursive doubling, p a power of two": "that rank does not exist: when p is a power of two, every rank's "
                                            "partner in every round lies in 0 to p - 1. Write out your partners for "
                                            "4 ranks: which one falls outside?",
}


def _raised(e: Exception, where: str, ex: str, MPI) -> str:
    if isinstance(e, NotImplementedError):
        return not_written(ex)
    if isinstance(e, TimeoutError):
        return TIMED_OUT + str(e)
    if _mistake_name(e) == "PeerFailed":
        return STOPPED + str(e)
    if type(e).__name__ == "WorldUsed" and "\nHint: " not in str(e):  # its advice, as the hint of the mistake
        head, _, fix = str(e).partition(". Use the communicator")
        head = f"{ex} ({where}): {head[len(ex) + 2:]}" if head.startswith(f"{ex}: ") else f"{head} ({where})"
        return head + (f"\nHint: use the communicator{fix}" if fix else "")
    if _mistake_name(e) == "MessageMistake":
        said = str(e)
        if said.endswith(OUT_OF_RANGE):  # the exercise knows more of where that rank came from
            p = int(where.split()[0])
            key = f"{ex}, p a power of two" if p & (p - 1) == 0 and f"{ex}, p a power of two" in OUTSIDE else ex
            said = said[:-len(OUT_OF_RANGE)] + f"\nHint: {OUTSIDE.get(key, OUT_OF_RANGE.split(': ', 1)[1])}"
        return f"{ex} ({where}): {said}"
    if isinstance(e, (ExerciseError, capture.NotRecorded)):
        return f"{e} ({where})"
    if isinstance(e, MPI.Exception):
        return (f"{ex} ({where}): MPI reported an error: {e.Get_error_string()}\nHint: most often a message is larger "
                "than the buffer receiving it: receive into an array of the same size and dtype as the one sent")
    return f"{ex} ({where}): your function raised {type(e).__name__}: {e}"


def _noting_alias(fn):
    """The student's ``fn(comm, x, ...)``, returning (its result, 1 if that is x itself, 2 if a view of x, else 0): the
    record of a graded run keeps what the result was made of, where the grader's replay could not see it."""

    @functools.wraps(fn)
    def noted(comm, x, *rest):
        got = fn(comm, x, *rest)
        shared = isinstance(got, np.ndarray) and isinstance(x, np.ndarray) and np.shares_memory(got, x)
        return got, (1 if got is x else 2) if shared else 0

    return noted


def _run(fn, sub, args, where: str, ex: str, timeout: float):
    """Run the student's function (:func:`_noting_alias`) on a fresh duplicate of ``sub``: (what this rank's returned,
    whether that is its x (1) or a view of it (2), every rank's error, every rank's log)."""
    work = sub.Dup()  # the student's messages stay apart from the check's own, even if some are abandoned
    alarm = sub.Dup()
    tc = _p2p_comm(work, alarm, timeout)
    out, error = _call(fn, tc, args, where, ex)
    got, aliased = out if isinstance(out, tuple) and len(out) == 2 else (None, 0)
    everyone = sub.allgather((error, [tuple(int(v) for v in row) for row in tc.log]))
    errors, logs = [e for e, _ in everyone], [log for _, log in everyone]
    if not any(errors):  # else not freed: a rank may have abandoned an operation on them
        work.Free()
        alarm.Free()
    return got, aliased, errors, logs


def _aliased(aliased: int, r: int, ex: str, where: str, hint: str) -> str | None:
    """The failure of a right result that is the caller's x itself (or a view of it), if it is."""
    if not aliased:
        return None
    return (f"{ex} ({where}): rank {r} returned {'its x itself' if aliased == 1 else 'a view of its x'}, not a new "
            "array. The values are right, but the result is x's memory: when the caller later changes x, the result "
            f"changes too\nHint: {hint}")


def _error_verdict(errors, logs, where: str, ex: str, timeout: float, root: int | None = None) -> str | None:
    """The one message for a case where some rank raised: the first real cause in rank order; else, when every
    failure is a timeout, which ranks waited for what (from everyone's logs), with the hint of the mistake that
    leaves ranks waiting so (:func:`stuck_hint`), if the logs show one."""
    causes = [e for e in errors if e and not e.startswith((TIMED_OUT, STOPPED))]
    if causes:
        return causes[0]
    if not any(errors):
        return None
    said = next((e[len(TIMED_OUT):] for e in errors if e and e.startswith(TIMED_OUT)), "a rank stopped waiting")
    waited = re.search(r"waited ([0-9.]+) s", said)  # the student's run's timeout (the grader's replay has its own)
    waited = float(waited.group(1)) if waited else timeout
    what, hint = stuck_hint(logs, ex, waited, root)
    return f"{ex} ({where}): {what or deadlock(logs, waited) or said}" + (f"\nHint: {hint}" if hint else "")


def _waiting(logs) -> dict[int, list[tuple[int, int]]]:
    """Per rank that was stuck, what in: [(STUCK_SEND, dest) or (STUCK_RECV, source)]."""
    stuck = {r: [(c, d if c == STUCK_SEND else s) for s, d, _, c in log if c in (STUCK_SEND, STUCK_RECV)]
             for r, log in enumerate(logs)}
    return {r: w for r, w in stuck.items() if w}


def _exchanging(waits) -> int | None:
    """The rank a rank is stuck exchanging with (sending to and receiving from it at once), if it is."""
    sends = {peer for c, peer in waits if c == STUCK_SEND}
    recvs = {peer for c, peer in waits if c == STUCK_RECV}
    both = sends & recvs
    return min(both) if len(both) == 1 and len(sends) == len(recvs) == 1 else None


_FLOW = {"linear reduce": "In a reduce the data flows one way, to the root: the root only receives, and no other rank "
                          "receives at all",
         "tree broadcast": "In a broadcast the data flows one way, away from the root: a rank receives once, from a "
                           "rank that already holds the data, and only then sends"}


def stuck_hint(logs, ex: str, timeout: float, root: int | None = None) -> tuple[str | None, str]:
    """(what happened, when the deadlock's own words would not say it; the hint of the mistake) for ranks that waited
    for each other for ever, from their logs (``root``: a broadcast's); ``(None, "")`` when no known mistake leaves
    them waiting so."""
    waiting = _waiting(logs)
    doubling = ex == "recursive doubling"
    for a, b in combinations(sorted(waiting), 2):
        if (STUCK_SEND, b) in waiting[a] and (STUCK_SEND, a) in waiting[b]:
            return None, ("both ranks call Send first, and here a Send waits until its receive is posted: an exchange "
                          "must send and receive at once, which comm.Sendrecv does" if doubling else
                          f"no two ranks send to each other here. {_FLOW.get(ex, '')}")
        if (STUCK_RECV, b) in waiting[a] and (STUCK_RECV, a) in waiting[b]:
            return None, ("both ranks wait to receive before they send: an exchange must send and receive at once, "
                          "which comm.Sendrecv does" if doubling else
                          f"both ranks wait for a message the other never sends. {_FLOW.get(ex, '')}")
    if doubling:
        partners = {a: _exchanging(w) for a, w in waiting.items()}
        one_sided = {a: b for a, b in partners.items() if b is not None and partners.get(b) != a}
        if one_sided:
            pairs = ", ".join(f"{a} with {b}" for a, b in sorted(partners.items()) if b is not None)
            a = min(one_sided)
            b = one_sided[a]
            theirs = f"waits to exchange with rank {partners[b]}" if partners.get(b) is not None else \
                "does not exchange with it"
            return (f"your partners are not mutual: rank {a} waits to exchange with rank {b}, but rank {b} {theirs}, "
                    f"so neither exchange completes (waiting to exchange: {pairs}; they waited {timeout:g} s)",
                    "in a round the ranks pair off: if rank a's partner is b, then b's partner is a, in the same round. "
                    "Write out the partner your rule gives each of 4 ranks in the first round, then check each pair "
                    "both ways: which operation on the rank's bits gives a pairing that undoes itself?")
        for a, w in sorted(waiting.items()):
            b = w[0][1]
            handed = any(c in (SEND, SR_SEND) and d == b for _, d, _, c in logs[a])
            if w == [(STUCK_RECV, b)] and b not in waiting and handed and 0 <= b < len(logs):
                return None, (f"rank {b} took in rank {a}'s x and returned without sending rank {a} the result: "
                              f"rank {a} waits for it for ever. What does rank {b} hold once its rounds are done, "
                              f"and who still needs it?")
    for a, w in sorted(waiting.items()):
        kind, b = w[0]
        if kind != STUCK_SEND or b < 0 or b >= len(logs):
            continue
        if b == root and b not in waiting:
            return None, (f"rank {b} is the root: it holds the data from the start and receives nothing. Which rank "
                          f"did rank {a} mean to reach in that round, and does that rank exist?")
        theirs = [peer for c, peer in waiting.get(b, []) if c == STUCK_RECV]
        if theirs and a not in theirs and theirs[0] >= 0:
            return None, (f"rank {a} sends to rank {b}, but rank {b} waits for rank {theirs[0]}: a rank must receive "
                          f"from the rank that sends to it, in the same round. Which rank sends to rank {b} in yours?")
    return None, ""


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
        return (f"{ex} ({where}): rank {r}'s x was modified\nHint: leave x as it is: build the result in an array "
                "of your own, receive into arrays of your own, and return the result")
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
    fn = on_given_comm(capture.student(_noting_alias(fn), ex=ex), ex)

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
    got, aliased, errors, logs = _run(fn, sub, (x, op, root), where, ex, timeout)
    verdict = _error_verdict(errors, logs, where, ex, timeout)
    if verdict:
        return verdict
    error = _reduce_result_error(got, x, xs[r], want, xs, op, r, root, where, ex)
    if error is None and r == root:
        error = _aliased(aliased, r, ex, where, "the root returns an array of its own, also where it has nothing to "
                         "combine (on 1 rank): its x's values in new memory, never x")
    verdict = _first_local(sub, error, prefer=root)
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
            return (f"{ex} ({where}): rank {j} sent to {_ranks(dests) if dests else 'nobody'}, not to the root, rank "
                    f"{root}\nHint: in this reduce each rank but the root sends its x to the root, and to no one else")
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
    fn = on_given_comm(capture.student(_noting_alias(fn), ex=ex), ex)

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
    got, aliased, errors, logs = _run(fn, sub, (x, root), where, ex, timeout)
    verdict = _error_verdict(errors, logs, where, ex, timeout, root)
    if verdict:
        return verdict
    _, received = _sent(logs)
    error = _broadcast_result_error(got, x, xs, want, received[r], k, r, root, where, ex) or _aliased(
        aliased, r, ex, where, "every rank returns an array of its own, the root too: the root already holds the "
        "values, but it must return them in new memory, not the x it was given")
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
            hint = (f"the rounds stop before they reach rank {r}: on {k} ranks, how many rounds does doubling the "
                    "holders take, and does your count of rounds round down?" if odd else
                    f"which rank should send to rank {r}, and in which round? Check that it does")
            return f"{ex} ({where}): rank {r} never received the data: it still holds its own x{odd}\nHint: {hint}"
        return (f"{ex} ({where}): rank {r} received the data but returned its own x\nHint: receive into the array you "
                "return")
    source = next((j for j in range(k) if j not in (r, root) and np.array_equal(got, xs[j])), None)
    if source is not None:
        return (f"{ex} ({where}): rank {r} holds rank {source}'s own x, not the root's\nHint: rank {source} passed "
                "its data on before it had received the root's: a rank sends only in the rounds after the one it "
                "receives in")
    return head


def _broadcast_traffic_error(logs, nbytes, k, root, where, ex) -> str | None:
    sent, received = _sent(logs)
    arrived, rounds = schedule(logs)
    want_rounds = ceil_log2(k)
    shown = f"\n  your messages: {_show_schedule(arrived)}"
    if received[root]:
        return (f"{ex} ({where}): the root, rank {root}, received a message from rank {received[root][0]}{shown}"
                f"\nHint: the root holds the data from the start, so nobody has anything to send it. Which rank did "
                f"rank {received[root][0]} mean to reach, and does it exist?")
    twice = next((j for j in range(k) if len(received[j]) > 1), None)
    if twice is not None:
        return (f"{ex} ({where}): rank {twice} received {len(received[twice])} messages (from "
                f"{_ranks(received[twice])}){shown}\nHint: each rank needs the data once, so a broadcast sends "
                f"p - 1 = {k - 1} messages in all: in each round, send only to a rank that does not hold it yet")
    wrong_size = next(((j, d, b) for j in range(k) for d, b in sent[j] if b != nbytes), None)
    if wrong_size:
        j, d, b = wrong_size
        return (f"{ex} ({where}): rank {j} sent {b} bytes to rank {d}; the array is {nbytes} bytes\nHint: every message "
                "of this broadcast carries the whole array")
    if rounds > want_rounds:
        from_root = all(s == root for _, s, _ in arrived)
        if from_root:
            return (f"{ex} ({where}): every message comes from the root: that is the linear broadcast, p - 1 = {k - 1} "
                    f"rounds. A binomial tree takes ceil(log2 p) = {want_rounds}{shown}\nHint: a rank that already "
                    "has the data can pass it on too, in the same rounds as the root")
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
    log2 p2 + 2 rounds otherwise; never more messages than recursive doubling needs. Every rank raises the same
    ExerciseError on failure.
    """
    from mpi4py import MPI

    comm = comm or MPI.COMM_WORLD
    ex = "recursive doubling"
    fn = on_given_comm(capture.student(_noting_alias(fn), ex=ex), ex)

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
    got, aliased, errors, logs = _run(fn, sub, (x, op), where, ex, timeout)
    verdict = _error_verdict(errors, logs, where, ex, timeout)
    if verdict:
        return verdict
    mine = _untouched(x, xs[r], r, ex, where) or _shape_error(got, want, ex, where)
    wrong = mine is None and not np.array_equal(got, want)
    bad = [j for j, w in enumerate(sub.allgather(wrong)) if w]
    if mine is None and wrong:
        hint = _combination_hint(got, xs, op, r, tuple(range(k)))
        if k & (k - 1) and not _sent(logs)[1][r] and np.array_equal(got, xs[r]):
            hint = (f"rank {r} received nothing, so it returned its own x. Every rank needs the result, also one "
                    f"that has no partner in the rounds: which rank could hand it to rank {r}, and when does that "
                    "rank have it?")
        odd = (f"on {k} ranks, which is not a power of two (it passed on {_and(range(1, k))} ranks), "
               + (f"{_ranks(bad)} have wrong values; " if len(bad) > 1 else "")) if k & (k - 1) else ""
        mine = f"{ex} ({where}): {odd}rank {r} has {_first_difference(got, want)}" + (f"\nHint: {hint}" if hint else "")
    if mine is None:
        mine = _aliased(aliased, r, ex, where, "return an array of your own, also where there is nothing to combine "
                        "(on 1 rank): the values of x in new memory, never x")
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
                f"allreduce, {messages} messages in {rounds} rounds{shown}\nHint: in recursive doubling a rank "
                "exchanges with one partner a round, and what it sends holds everything it has combined so far")
    if messages == 2 * (k - 1) != want_messages and rounds > want_rounds:
        return (f"{ex} ({where}): {rounds} rounds and {messages} messages: a reduce to one rank followed by a broadcast. "
                f"In recursive doubling every rank exchanges with a partner in every round, and all finish together "
                f"in {want_rounds}{shown}")
    if rounds > want_rounds:
        sendrecv = any(c == SR_SEND for log in logs for _, _, _, c in log)
        hint = ("\nHint: a Send and then a Recv (or a reduce followed by a broadcast) take two rounds; comm.Sendrecv "
                "sends and receives in one" if not sendrecv else "")
        return (f"{ex} ({where}): your allreduce took {rounds} rounds on {k} ranks; recursive doubling takes "
                + (f"log2 p = {want_rounds}" if k == p2 else f"at most {want_rounds} ({k} is not a power of two: the "
                   f"log2 {p2} = {steps} rounds of {p2} ranks, and two more)") + f"{shown}{hint}")
    if messages > want_messages:
        most = max(range(k), key=lambda j: len(sent[j]))
        return (f"{ex} ({where}): {messages} messages in all, more than recursive doubling needs on {k} ranks "
                f"({want_messages}); rank {most} sent the most, {len(sent[most])}{shown}")
    return None


# -- the exercises of lab 06 -----------------------------------------------------------------------------------------

_ALLREDUCES = ("ring_allreduce", "naive_allreduce", "reduce_broadcast_allreduce", "recursive_doubling_allreduce",
               "mpi_allreduce", "reduce", "broadcast")

EXERCISES = (
    Exercise("linear_reduce", "06", mpi=True, references=("labkit.collectives:reduce",), hints=(
        "Which ranks send, and which receive? In a reduce the data flows one way, to the root, and nothing travels on "
        "from there. Decide what each rank other than the root sends, how many times, and what it returns.",
        "The root needs arrays of its own: one to build the result in, and one for each message to land in. Why not "
        "receive straight into the result? And how does the root's own x get into the result, without a message?",
        "Work it by hand: 3 ranks, root 2, op MPI.MAX, x = [1, 9] on rank 0, [5, 2] on rank 1 and [3, 3] on rank 2. "
        "Which messages reach rank 2, and what does its result hold after each one? Would the other order of "
        "arrival change it?",
    )),
    Exercise("tree_broadcast", "06", mpi=True, references=("labkit.collectives:broadcast",), hints=(
        "Solve it for root 0 first. Before round 0 one rank holds the data. If in every round each holder sends to "
        "one rank that lacks it, how many hold it before round 1? Before round t?",
        "Say the holders before round t are the ranks 0 to 2**t - 1. To which rank should each one send, so that "
        "the holders before round t + 1 are 0 to 2**(t+1) - 1? What if that rank would be p or more?",
        "Any root: number the ranks counting from the root, so that the root is number 0 and the count wraps around "
        "past the last rank. Draw 6 ranks with root 4: what is each rank's number? Round by round, who sends to "
        "whom? In which round does rank 3 receive, and from which rank?",
    )),
    Exercise("recursive_doubling", "06", mpi=True,
             references=tuple(f"labkit.collectives:{f}" for f in _ALLREDUCES), hints=(
        "Start with p a power of two. In every round each rank pairs with one other: both send their partial result "
        "and combine what they receive. On 2 ranks one round does it. On 4, which pairs in the first round, and "
        "which in the second, leave every rank with all 4 arrays combined?",
        "Partners exchange at once (comm.Sendrecv): two ranks that both Send first wait for each other for ever. "
        "Write the ranks 0 to 7 in binary, with your pairs for 8 ranks round by round. In how many bits do two "
        "partners differ, and which bit is it in round t? A pairing must be mutual (a's partner is b, b's is a): "
        "which operation on bits does that?",
        "When p is not a power of two, some ranks have no partner. Draw 6 ranks: four can double among themselves. "
        "Which two are left over, and into which of the four can each fold its x before the rounds? After the "
        "rounds, who still lacks the result, and who holds it?",
    )),
)
