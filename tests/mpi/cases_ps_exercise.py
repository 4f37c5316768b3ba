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


def student(version="reply", done=True, in_place=True, with_version=True, receive=True, cast=True,
            receive_first=False):
    """A worker loop with one of the usual mistakes switched on."""
    def loop(comm, grad, flat, bounds, batches, timeout):
        versions = np.zeros(len(bounds))
        for x, Y in batches:
            g = grad(x, Y)
            reqs, replies = [], []
            if receive_first:  # waits for weights the masters send only in answer to a gradient: a deadlock
                replies = [np.empty(hi - lo + 1, dtype=flat.dtype) for lo, hi in bounds]
                wait_all([comm.Irecv(r, source=m, tag=param_server.WEIGHTS) for m, r in enumerate(replies)],
                         timeout, "my worker", comm)
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


def mistake(name, fn, says, hint):
    """The case ``name``: the check fails ``fn`` on rank 0 (alone) with a diagnosis whose message holds every one of
    ``says`` and whose own hint holds every one of ``hint``, with no step of the derivation (the hint is about that
    mistake: tests/test_contract.py asks the same of the exercises checked without mpiexec)."""
    def run(f):
        try:
            check.async_worker(f, timeout=3)
        except check.ExerciseError as e:
            said, _, own = str(e).partition("\nHint: ")
            assert own, f"not named: no hint of its own in\n{e}"
            assert "\nStep " not in str(e), str(e)
            for needle in says:
                assert needle in said, (needle, said)
            for needle in hint:
                assert needle in own, (needle, own)
            raise
    _cases.mistake(name, run, fn)


@case("labkit's worker loop passes")
def _():
    check.async_worker(param_server.worker_loop, timeout=10)


@case("a right student loop passes")
def _():
    check.async_worker(student(), timeout=10)


def unwritten(*args):
    raise NotImplementedError


_cases.mistake("not written", lambda f: check.async_worker(f, timeout=3), unwritten, "not written yet")
mistake("version not taken from the reply", student(version="zero"), ["staleness"], ["the reply's last entry"])
mistake("weights rebound instead of copied", student(in_place=False), ["differ from serial SGD"], ["in place"])
mistake("no version in the message", student(with_version=False), ["expected tag GRAD"], ["followed by one number"])
mistake("no DONE", student(done=False), ["never sent DONE"], ["every gradient arrived", "tag DONE"])
mistake("never receives", student(receive=False), ["is it receiving"], ["receive (tag WEIGHTS) from every master"])
mistake("float64 messages to float32 masters", student(cast=False), ["float32", "a mismatch of dtype"],
        ["flat's dtype"])
mistake("waits for weights before sending: a deadlock", student(receive_first=True), ["they sent [0] gradients"],
        ["a deadlock", "only in answer to a gradient"])
run_cases(comm)
