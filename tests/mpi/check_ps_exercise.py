"""The lab 08 exercise check: passes labkit's worker loop, names typical mistakes, never hangs.

Run: mpiexec -n 3 python -m mpi4py tests/mpi/check_ps_exercise.py   (prints "OK <p>" on rank 0)
"""

import numpy as np
from mpi4py import MPI

from labkit import check, param_server
from labkit.collectives import wait_all

comm = MPI.COMM_WORLD
size, rank = comm.Get_size(), comm.Get_rank()


def student(version="reply", done=True, in_place=True, with_version=True, receive=True):
    """A worker loop with one of the usual mistakes switched on."""
    def loop(comm, grad, flat, bounds, batches, timeout):
        versions = np.zeros(len(bounds))
        for x, Y in batches:
            g = grad(x, Y)
            reqs, replies = [], []
            for m, (lo, hi) in enumerate(bounds):
                msg = np.append(g[lo:hi], versions[m]) if with_version else g[lo:hi].copy()
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


def expect_failure(fn, *needles):
    try:
        check.async_worker(fn, timeout=3)
    except check.ExerciseError as e:
        if rank == 0:
            for needle in needles:
                assert needle in str(e), (needle, str(e))
        return
    raise AssertionError(f"the check passed a wrong worker; expected {needles}")


check.async_worker(param_server.worker_loop, timeout=10)
check.async_worker(student(), timeout=10)


def unwritten(*args):
    raise NotImplementedError


expect_failure(unwritten, "not written yet")
expect_failure(student(version="zero"), "staleness", "the reply's last entry")
expect_failure(student(in_place=False), "differ from serial SGD", "in place")
expect_failure(student(with_version=False), "expected tag GRAD", "followed by one number")
expect_failure(student(done=False), "never sent DONE", "tell every master you are done")
expect_failure(student(receive=False), "is it receiving", "Irecv")
comm.Barrier()
if rank == 0:
    print(f"OK {size}", flush=True)
