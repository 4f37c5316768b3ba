"""Allreduce back ends that data parallelism uses where messages are not the fastest way: ranks that share a
machine's memory (:class:`SharedMemoryAllreduce`) and GPUs talking to each other through NCCL (:class:`NcclAllreduce`).

The algorithms the labs teach, built from messages, are in :mod:`labkit.collectives`; these two are the
infrastructure :class:`labkit.data_parallel.DataParallel` runs on with ``allreduce="shm"`` and ``"nccl"``.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from .collectives import check_same, default_timeout, wait_all
from .device import gpu_status
from .shards import shard_bounds


class SharedMemoryAllreduce:
    """Allreduce (sum) for ranks on one machine through an MPI-3 shared-memory window: no messages, no copies.

    The window holds one slot per rank plus a result row. Each rank writes its contribution straight into its
    slot (:attr:`mine`), then :meth:`reduce` sums column block ``rank`` of all slots into the result row, and
    after a barrier every rank reads the whole sum from :attr:`result` (a view: it stays valid until the next
    :meth:`reduce`). Two barriers per call; the adds are shared among the ranks like a ring's reduce-scatter,
    and the allgather is free because everyone reads the same memory. Collective: construct, reduce and
    :meth:`free` on every rank of ``comm``.
    """

    def __init__(self, comm, n: int, dtype=np.float32, timeout: float | None = None):
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        same_node = node.Get_size() == comm.Get_size()
        if not all(comm.allgather(same_node)):
            node.Free()
            raise ValueError("the shared-memory allreduce needs every rank on one machine; "
                             "use allreduce='ring' or 'mpi' across machines")
        self.comm, self.timeout = node, timeout
        self.p, self.rank = node.Get_size(), node.Get_rank()
        self.dtype, self.n = np.dtype(dtype), int(n)
        nbytes = (self.p + 1) * self.n * self.dtype.itemsize
        self.win = MPI.Win.Allocate_shared(nbytes if self.rank == 0 else 0, self.dtype.itemsize, comm=node)
        buf, _ = self.win.Shared_query(0)
        table = np.ndarray(buffer=buf, dtype=self.dtype, shape=(self.p + 1, self.n))
        self.slots, self.result = table[:self.p], table[self.p]
        self.mine = self.slots[self.rank]
        self.block = shard_bounds(self.n, self.p)[self.rank]
        self.win.Lock_all()  # one passive-target epoch for the window's life; Sync() orders the loads and stores

    def barrier(self, what: str) -> None:
        """Every rank's stores before it are seen by every rank's loads after it; ``what`` names the wait in a timeout."""
        self.win.Sync()
        if self.timeout is None:
            self.comm.Barrier()
        else:
            wait_all([self.comm.Ibarrier()], self.timeout, what, self.comm)
        self.win.Sync()

    def reduce(self) -> np.ndarray:
        """Sum every rank's :attr:`mine` into :attr:`result` (returned)."""
        self.barrier("shared-memory allreduce, waiting for every rank's contribution")
        lo, hi = self.block
        out = self.result[lo:hi]
        if self.p == 1:
            out[:] = self.slots[0, lo:hi]
        else:
            np.add(self.slots[0, lo:hi], self.slots[1, lo:hi], out=out)
            for r in range(2, self.p):
                out += self.slots[r, lo:hi]
        self.barrier("shared-memory allreduce, waiting for every rank's part of the sum")
        return self.result

    def free(self) -> None:
        """Release the window (collective)."""
        if self.win is not None:
            self.win.Unlock_all()
            self.win.Free()
            self.comm.Free()
            self.win = None


class NcclAllreduce:
    """Allreduce of CuPy arrays on GPUs with NVIDIA's NCCL (through ``cupy.cuda.nccl``), one GPU per MPI rank.

    MPI only sets it up: the ranks first agree that every one of them can use NCCL (or all raise the same
    error naming each rank's problem), rank r of a machine takes that machine's GPU r, rank 0 makes the NCCL
    id and broadcasts it, and every rank joins one NCCL communicator. Then ``nccl(x)`` sums ``x`` over the ranks
    in place, GPU to GPU, on the current CUDA stream (``op`` may be MPI.SUM, PROD, MAX or MIN). NCCL refuses two
    ranks on one GPU, so a machine needs at least as many GPUs as it has ranks. With ``timeout`` a call waits for
    its result at most that long, then aborts the NCCL communicator and raises ``TimeoutError`` instead of hanging
    on a rank that died. Collective: construct, call and :meth:`close` on every rank of ``comm``.
    """

    def __init__(self, comm, timeout: float | None = None):
        self.timeout = default_timeout(timeout)
        self.mpi_comm = comm
        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        local, local_size = node.Get_rank(), node.Get_size()
        node.Free()
        problem = None
        try:
            problem = self._problem(local_size)
        except Exception as e:  # noqa: BLE001 - reported on every rank below
            problem = f"{type(e).__name__}: {e}"
        problems = comm.allgather(problem)  # every rank raises together: none is left waiting in NCCL's setup
        if any(problems):
            raise RuntimeError("allreduce='nccl' cannot start: " + "; ".join(
                f"rank {r}: {why}" for r, why in enumerate(problems) if why))
        import cupy
        from cupy.cuda import nccl

        self.device = cupy.cuda.Device(local)
        self.device.use()
        uid = nccl.get_unique_id() if comm.Get_rank() == 0 else None
        uid = comm.bcast(uid, root=0)
        self.nccl = nccl.NcclCommunicator(comm.Get_size(), uid, comm.Get_rank())
        self._types = {np.dtype(k): getattr(nccl, v) for k, v in (
            ("int8", "NCCL_INT8"), ("uint8", "NCCL_UINT8"), ("int32", "NCCL_INT32"), ("uint32", "NCCL_UINT32"),
            ("int64", "NCCL_INT64"), ("uint64", "NCCL_UINT64"), ("float16", "NCCL_FLOAT16"),
            ("float32", "NCCL_FLOAT32"), ("float64", "NCCL_FLOAT64"))}
        self._ops = [(MPI.SUM, nccl.NCCL_SUM), (MPI.PROD, nccl.NCCL_PROD), (MPI.MAX, nccl.NCCL_MAX),
                     (MPI.MIN, nccl.NCCL_MIN)]

    @staticmethod
    def _problem(local_size: int) -> str | None:
        """Why this rank cannot use NCCL (None when it can)."""
        ok, why = gpu_status()
        if not ok:
            return f"no usable GPU ({why})"
        from cupy.cuda import nccl

        if not getattr(nccl, "available", False):
            return ("CuPy cannot load NCCL (cupy.cuda.nccl.available is False): install it for CuPy, e.g. "
                    "pip install nvidia-nccl-cu12 beside cupy-cuda12x (CuPy's installation guide, Additional CUDA Libraries)")
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
        if local_size > n:
            return (f"{local_size} ranks share this machine but it has {n} GPU(s); NCCL needs one GPU per rank "
                    "(it refuses two ranks on one GPU): start at most as many ranks per machine as it has GPUs")
        return None

    def __call__(self, x, op=MPI.SUM, check: bool = True):
        """Replace CuPy array ``x`` (C-contiguous, on this rank's GPU) by its reduction over the ranks; return it."""
        import cupy

        if self.nccl is None:
            raise RuntimeError("this NcclAllreduce was closed")
        if not isinstance(x, cupy.ndarray):
            raise TypeError(f"the NCCL allreduce sums CuPy arrays on the GPU, got {type(x).__name__}")
        if not x.flags.c_contiguous:
            raise ValueError("x is not C-contiguous (a slice or transpose?): pass cupy.ascontiguousarray(x)")
        if x.device.id != self.device.id:
            raise ValueError(f"x lives on GPU {x.device.id} but this rank's NCCL communicator uses GPU {self.device.id}")
        dtype = self._types.get(x.dtype)
        if dtype is None:
            raise TypeError(f"NCCL does not reduce {x.dtype}; supported: {', '.join(str(d) for d in self._types)}")
        nop = next((n for o, n in self._ops if o == op), None)
        if nop is None:
            raise ValueError(f"op must be one of MPI.SUM, MPI.PROD, MPI.MAX, MPI.MIN; got {op!r}")
        if check and self.mpi_comm.Get_size() > 1:
            check_same(self.mpi_comm, x, "NCCL allreduce")
        stream = cupy.cuda.get_current_stream()
        self.nccl.allReduce(x.data.ptr, x.data.ptr, x.size, dtype, nop, stream.ptr)
        if self.timeout is not None:  # wait here, so that a rank that never comes is an error, not a hang
            done = cupy.cuda.Event(disable_timing=True)
            done.record(stream)
            deadline = time.monotonic() + self.timeout
            while not done.done:
                self.nccl.check_async_error()
                if time.monotonic() > deadline:
                    self.nccl.abort()
                    self.nccl = None
                    raise TimeoutError(
                        f"rank {self.mpi_comm.Get_rank()}: the NCCL allreduce waited {self.timeout:g} s; another rank "
                        "probably failed or did not call it. The NCCL communicator was aborted: restart the MPI job.")
                time.sleep(1e-5)
        return x

    def close(self) -> None:
        """Destroy the NCCL communicator (collective)."""
        if self.nccl is not None:
            self.nccl.destroy()
            self.nccl = None
