"""The lab 09 exercise check: passes labkit's worker loop, names typical mistakes, never hangs.

Run: mpiexec -n 3 python -m mpi4py tests/mpi/cases_ps_exercise.py [-k NAME]   (prints "OK <p>" on rank 0)
"""

import _cases
import numpy as np
from _cases import case, run_cases
from mpi4py import MPI

from labkit import check, param_server
from labkit.collectives import wait_all

comm = MPI.COMM_WORLD
size, rank = comm.Get_size(), comm.Get_rank()


def student(version="reply", done=True, in_place=True, with_version=True, receive=True, cast=True):
    """A worker loop with one of the usual mistakes switched on."""
    def loop(comm, grad, flat, bounds, batches, timeout):
        versions = np.zeros(len(bounds))
        for x, Y in batches:
            g = grad(x, Y)
            reqs, replies = [], []
            for m, (lo, hi) in enumerate(bounds):
                msg = np.append(g[lo:hi], versions[m]) if with_version else g[lo:hi].copy()
                msg = msg.astype(flat.dtype) if cast else msg  # versions are float64: np.append gives float64
                reqs.append(comm.Isend(msg, dest=m, tag=param_server.GRAD))
                replies.append(np.empty(hi - lo + 1, dtype=flat.dtype))
                if receive:
                    reqs.append(comm.Irecv(replies[m], source=m, tag=param_server.WEIGHTS))
            wait_all(reqs, timeout, "my worker", comm)
            if not receive:
                continue
            new = flat.copy()
            for m, (lo, hi) in enumerate(bounds):
                new[lo:hi] = replies[m][:-1]
                versions[m] = replies[m][-1] if version == "reply" else 0
            if in_place:
                flat[:] = new
            else:
                flat = new  # rebinding: the network's arrays still see the old weights
        if done:
            for m in range(len(bounds)):
                comm.Send(np.empty(0, dtype=flat.dtype), dest=m, tag=param_server.DONE)
    return loop


def mistake(name, fn, *needles):
    _cases.mistake(name, lambda f: check.async_worker(f, timeout=3), fn, *needles)


@case("labkit's worker loop passes")
def _():
    check.async_worker(param_server.worker_loop, timeout=10)


@case("a right student loop passes")
def _():
    check.async_worker(student(), timeout=10)


def unwritten(*args):
    raise NotImplementedError


mistake("not written", unwritten, "not written yet")
mistake("version not taken from the reply", student(version="zero"), "staleness", "the reply's last entry")
mistake("weights rebound instead of copied", student(in_place=False), "differ from serial SGD", "in place")
mistake("no version in the message", student(with_version=False), "expected tag GRAD", "followed by one number")
mistake("no DONE", student(done=False), "never sent DONE", "tell every master you are done")
mistake("never receives", student(receive=False), "is it receiving", "Irecv")
mistake("float64 messages to float32 masters", student(cast=False), "float32", "a mismatch of dtype", ".astype(flat.dtype)")
run_cases(comm)
