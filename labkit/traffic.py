"""Instrumentation: a communicator that records every point-to-point message, to count and draw traffic.

Labs 06 and 07 draw who sent how much to whom and when (:func:`labkit.plots.plot_traffic`); the ring exercise's
check counts a student's messages and bytes with it.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .collectives import gather, wait_all


class TrafficComm:
    """A real communicator that logs every message it sends: (source, dest, bytes, round).

    A round is one wait for a set of messages (one ``Sendrecv``-like exchange, or one batch of
    ``Isend``/``Irecv`` completed together): the ring allreduce has 2 (p - 1) of them. Everything else
    is passed to the real communicator. :meth:`gather_log` collects all ranks' logs on one rank.
    With ``timeout``, the blocking ``Send``/``Recv``/``Sendrecv`` raise ``TimeoutError`` instead of
    waiting forever for a partner that failed (used when checking students' code).
    """

    def __init__(self, comm, timeout: float | None = None):
        self._comm = comm
        self.timeout = timeout
        self.log: list[tuple[int, int, int, int]] = []
        self.rounds = 0

    def __getattr__(self, name):
        return getattr(self._comm, name)

    @property
    def rank(self) -> int:
        return self._comm.Get_rank()

    @property
    def size(self) -> int:
        return self._comm.Get_size()

    def Get_rank(self) -> int:  # noqa: N802 - the MPI name
        return self._comm.Get_rank()

    def Get_size(self) -> int:  # noqa: N802
        return self._comm.Get_size()

    def next_round(self) -> None:
        """Close the current round (the collectives call this each time they wait)."""
        self.rounds += 1

    def _record(self, buf, dest) -> None:
        nbytes = np.asarray(buf[0] if isinstance(buf, (list, tuple)) else buf).nbytes
        self.log.append((self._comm.Get_rank(), int(dest), int(nbytes), self.rounds))

    def _finish(self, reqs, what):
        if self.timeout is None:
            self.rounds += 1
            MPI.Request.Waitall(reqs)
        else:
            wait_all(reqs, self.timeout, what, self)

    def Send(self, buf, dest, tag=0):  # noqa: N802
        self._record(buf, dest)
        self._finish([self._comm.Isend(buf, dest, tag)], f"Send to rank {dest}")

    def Recv(self, buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=None):  # noqa: N802
        if status is not None or self.timeout is None:
            return self._comm.Recv(buf, source, tag, status)
        self._finish([self._comm.Irecv(buf, source, tag)], f"Recv from rank {source}")

    def Isend(self, buf, dest, tag=0):  # noqa: N802
        self._record(buf, dest)
        return self._comm.Isend(buf, dest, tag)

    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=MPI.ANY_SOURCE,  # noqa: N802
                 recvtag=MPI.ANY_TAG, status=None):
        self._record(sendbuf, dest)
        if status is not None:
            self.rounds += 1
            return self._comm.Sendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag, status)
        reqs = [self._comm.Irecv(recvbuf, source, recvtag), self._comm.Isend(sendbuf, dest, sendtag)]
        self._finish(reqs, f"Sendrecv with ranks {dest} and {source}")

    # the library's collectives: with a timeout, their non-blocking forms, so a partner that failed
    # gives a TimeoutError instead of a hang (they are not logged: they are not point-to-point messages)
    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):  # noqa: N802
        if self.timeout is None:
            return self._comm.Allreduce(sendbuf, recvbuf, op)
        wait_all([self._comm.Iallreduce(sendbuf, recvbuf, op)], self.timeout, "Allreduce", self)

    def Allgather(self, sendbuf, recvbuf):  # noqa: N802
        if self.timeout is None:
            return self._comm.Allgather(sendbuf, recvbuf)
        wait_all([self._comm.Iallgather(sendbuf, recvbuf)], self.timeout, "Allgather", self)

    def Bcast(self, buf, root=0):  # noqa: N802
        if self.timeout is None:
            return self._comm.Bcast(buf, root)
        wait_all([self._comm.Ibcast(buf, root)], self.timeout, "Bcast", self)

    def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0):  # noqa: N802
        if self.timeout is None:
            return self._comm.Reduce(sendbuf, recvbuf, op, root)
        wait_all([self._comm.Ireduce(sendbuf, recvbuf, op, root)], self.timeout, "Reduce", self)

    def Barrier(self):  # noqa: N802
        if self.timeout is None:
            return self._comm.Barrier()
        wait_all([self._comm.Ibarrier()], self.timeout, "Barrier", self)

    def clear(self) -> None:
        """Forget what was logged."""
        self.log.clear()
        self.rounds = 0

    def gather_log(self, root: int = 0) -> np.ndarray | None:
        """All ranks' logs as one int64 array of rows (source, dest, bytes, round) on root."""
        mine = np.array(self.log, dtype=np.int64).reshape(-1, 4)
        return gather(self._comm, mine, root=root)
