"""Collective operations built from point-to-point messages, to compare with the MPI library's own.

Every function takes the communicator first and works on NumPy arrays through mpi4py's buffer
interface (``Send``/``Recv``/``Sendrecv``/``Isend``/``Irecv``): ``ring_allreduce(comm, x, op=MPI.SUM)``
returns a new array and leaves ``x`` untouched. Lengths may be anything (0, 1, not divisible by the
rank count, shorter than it); dtypes are the integer, unsigned, float32/64 and complex64/128 ones;
ops are ``MPI.SUM``, ``MPI.PROD``, ``MPI.MAX`` and ``MPI.MIN``.

Before the algorithm runs, ``check=True`` (the default) compares every rank's length and dtype with
one small library allgather, so a mismatch is an error on every rank instead of a hang or garbage.
``timeout`` (seconds, default ``$LABKIT_MPI_TIMEOUT`` or none) turns a wait for a rank that died or
never called the collective into a ``TimeoutError``; ``python -m mpi4py`` already aborts the whole job
when one rank raises.

Cost in a ring of p ranks for N elements: ``naive_allreduce`` sends (p-1) N per rank in one step;
``ring_allreduce`` sends 2 (p-1)/p N per rank in 2 (p-1) steps, to its right-hand neighbour only.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from . import settings
from .shards import shard_bounds

TAG = 7700  # collectives use their own tag so they never match a user's messages
SUPPORTED_DTYPES = tuple(np.dtype(t) for t in (
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float32", "float64", "complex64", "complex128"))
_OPS = [(MPI.SUM, np.add, "SUM"), (MPI.PROD, np.multiply, "PROD"), (MPI.MAX, np.maximum, "MAX"),
        (MPI.MIN, np.minimum, "MIN")]  # MPI.Op is not hashable: look ops up by equality


def op_name(op) -> str:
    """"SUM", "PROD", "MAX" or "MIN"."""
    return next((name for o, _, name in _OPS if o == op), repr(op))


class CollectiveError(ValueError):
    """Ranks called a collective with inconsistent buffers (lengths, dtypes or shapes)."""


# -- argument checks ------------------------------------------------------------------------------


def _default_timeout(timeout):
    if timeout is not None:
        return timeout
    return settings.mpi_timeout()


def _check_array(x, name: str = "x") -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        hint = " (use float32)" if x.dtype == np.float16 else ""
        raise TypeError(f"{name} has dtype {x.dtype}, which these collectives do not support{hint}; "
                        f"supported: {', '.join(str(d) for d in SUPPORTED_DTYPES)}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name} is not C-contiguous (a slice or transpose?): pass np.ascontiguousarray({name})")
    return x


def _check_op(op, dtype) -> np.ufunc:
    ufunc = next((u for o, u, _ in _OPS if o == op), None)
    if ufunc is None:
        raise ValueError(f"op must be one of MPI.SUM, MPI.PROD, MPI.MAX, MPI.MIN; got {op!r}")
    if dtype.kind == "c" and (op == MPI.MAX or op == MPI.MIN):
        raise TypeError(f"MPI.{op_name(op)} is not defined for complex numbers ({dtype})")
    return ufunc


def _check_same(comm, x: np.ndarray, what: str) -> None:
    """Every rank must pass the same shape and dtype; say which rank differs, on every rank."""
    mine = (x.shape, x.dtype.str)
    everyone = comm.allgather(mine)
    bad = [r for r, v in enumerate(everyone) if v != everyone[0]]
    if bad:
        desc = ", ".join(f"rank {r}: shape {s} {np.dtype(d)}" for r, (s, d) in enumerate(everyone))
        raise CollectiveError(f"{what}: every rank must pass the same shape and dtype, but {desc}")


def _prepare(comm, x, op, check: bool, what: str):
    x = _check_array(x)
    ufunc = _check_op(op, x.dtype) if op is not None else None
    if check and comm.Get_size() > 1:
        _check_same(comm, x, what)
    return x, ufunc


# -- waiting with a timeout ----------------------------------------------------------------------


def wait_all(reqs: list, timeout: float | None, what: str, comm) -> None:
    """Wait for requests (one communication round); with a timeout, poll and raise TimeoutError instead of hanging.

    ``what`` names the operation in the error; ``comm`` gives the rank (and counts rounds on a TrafficComm).
    """
    if isinstance(comm, TrafficComm):
        comm.next_round()
    if timeout is None:
        MPI.Request.Waitall(reqs)
        return
    deadline = time.monotonic() + timeout
    while not MPI.Request.Testall(reqs):
        if time.monotonic() > deadline:
            for r in reqs:
                if r != MPI.REQUEST_NULL:
                    try:
                        r.Cancel()
                    except MPI.Exception:
                        pass
            raise TimeoutError(
                f"rank {comm.Get_rank()}: {what} waited {timeout:g} s for a message. Another rank probably "
                "failed or did not call the same collective; restart the MPI job (or the engines).")
        time.sleep(1e-5)


def first_cause(errors) -> str | None:
    """Of the error messages several ranks report (None where a rank is fine), the one to show: a rank that timed
    out usually waited for one that failed, so a failure comes before a timeout."""
    real = [e for e in errors if e]
    causes = [e for e in real if "TimeoutError" not in e]
    return (causes or real or [None])[0]


def _sendrecv(comm, send: np.ndarray, dest: int, recv: np.ndarray, source: int, timeout, what: str) -> None:
    reqs = [comm.Irecv(recv, source=source, tag=TAG), comm.Isend(send, dest=dest, tag=TAG)]
    wait_all(reqs, timeout, what, comm)


def _send(comm, buf, dest, timeout, what):
    wait_all([comm.Isend(buf, dest=dest, tag=TAG)], timeout, what, comm)


def _recv(comm, buf, source, timeout, what):
    wait_all([comm.Irecv(buf, source=source, tag=TAG)], timeout, what, comm)


# -- broadcast, scatter, gather, reduce ----------------------------------------------------------


def broadcast(comm, x, root: int = 0, algorithm: str = "tree", check: bool = True,
              timeout: float | None = None) -> np.ndarray:
    """Root's array on every rank. ``x`` must have root's shape and dtype everywhere (its values matter at root only).

    ``algorithm="linear"``: root sends to each rank in turn (p - 1 steps);
    ``"tree"``: a binomial tree, ceil(log2 p) steps.
    """
    p, r = comm.Get_size(), comm.Get_rank()
    if not 0 <= root < p:
        raise ValueError(f"root {root} is not a rank of this communicator (size {p})")
    x, _ = _prepare(comm, x, None, check, "broadcast")
    timeout = _default_timeout(timeout)
    out = x.copy()
    if p == 1:
        return out
    what = f"broadcast ({algorithm})"
    if algorithm == "linear":
        if r == root:
            for dest in range(p):
                if dest != root:
                    _send(comm, out, dest, timeout, what)
        else:
            _recv(comm, out, root, timeout, what)
        return out
    if algorithm != "tree":
        raise ValueError(f"algorithm must be 'linear' or 'tree', got {algorithm!r}")
    vr = (r - root) % p  # rank relative to the root
    mask = 1
    while mask < p:  # receive from the parent: the rank that differs in the highest set bit
        if vr & mask:
            _recv(comm, out, (vr - mask + root) % p, timeout, what)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:  # then send to the children below that bit
        if vr + mask < p:
            _send(comm, out, (vr + mask + root) % p, timeout, what)
        mask >>= 1
    return out


def scatter(comm, x, root: int = 0, timeout: float | None = None) -> np.ndarray:
    """Split root's array along axis 0 into p pieces (floor + remainder rows) and give rank k piece k.

    Only root's ``x`` matters; other ranks pass ``None``. Shape and dtype travel in a small header.
    """
    timeout = _default_timeout(timeout)
    p, r = comm.Get_size(), comm.Get_rank()
    what = "scatter"
    if r == root:
        x = _check_array(x)
        if x.ndim == 0:
            raise ValueError("scatter needs an array with at least one dimension")
        bounds = shard_bounds(x.shape[0], p)
        for dest, (lo, hi) in enumerate(bounds):
            if dest != root:
                piece = x[lo:hi]
                _send(comm, _header(piece), dest, timeout, what)
                _send(comm, np.ascontiguousarray(piece), dest, timeout, what)
        lo, hi = bounds[root]
        return x[lo:hi].copy()
    header = np.empty(_HEADER_LEN, dtype=np.int64)
    _recv(comm, header, root, timeout, what)
    out = np.empty(*_from_header(header))
    _recv(comm, out, root, timeout, what)
    return out


_HEADER_LEN = 10


def _header(a: np.ndarray) -> np.ndarray:
    """(dtype code, ndim, shape...) as int64, to tell a receiver what to allocate."""
    if a.ndim > _HEADER_LEN - 2:
        raise ValueError(f"arrays of more than {_HEADER_LEN - 2} dimensions are not supported")
    h = np.zeros(_HEADER_LEN, dtype=np.int64)
    h[0] = SUPPORTED_DTYPES.index(a.dtype)
    h[1] = a.ndim
    h[2:2 + a.ndim] = a.shape
    return h


def _from_header(h: np.ndarray):
    dtype = SUPPORTED_DTYPES[int(h[0])]
    shape = tuple(int(s) for s in h[2:2 + int(h[1])])
    return shape, dtype


def gather(comm, x, root: int = 0, timeout: float | None = None) -> np.ndarray | None:
    """Every rank's array, concatenated along axis 0 in rank order, on root (``None`` elsewhere).

    Pieces may have different lengths; their trailing shape and dtype must match root's.
    """
    x = _check_array(x)
    timeout = _default_timeout(timeout)
    p, r = comm.Get_size(), comm.Get_rank()
    what = "gather"
    if r != root:
        _send(comm, _header(x), root, timeout, what)
        _send(comm, x, root, timeout, what)
        return None
    pieces = []
    for src in range(p):
        if src == root:
            pieces.append(x)
            continue
        header = np.empty(_HEADER_LEN, dtype=np.int64)
        _recv(comm, header, src, timeout, what)
        shape, dtype = _from_header(header)
        buf = np.empty(shape, dtype)
        _recv(comm, buf, src, timeout, what)
        if dtype != x.dtype or shape[1:] != x.shape[1:]:
            raise CollectiveError(f"gather: rank {src} sent shape {shape} {dtype}, root has {x.shape} {x.dtype}: "
                                  "pieces must agree in dtype and in every dimension but the first")
        pieces.append(buf)
    return np.concatenate(pieces) if x.ndim else np.array(pieces)


def reduce(comm, x, op=MPI.SUM, root: int = 0, check: bool = True, timeout: float | None = None) -> np.ndarray | None:
    """Combine every rank's array elementwise with ``op`` up a binomial tree; the result on root, ``None`` elsewhere."""
    x, ufunc = _prepare(comm, x, op, check, "reduce")
    timeout = _default_timeout(timeout)
    p, r = comm.Get_size(), comm.Get_rank()
    acc = x.copy()
    vr = (r - root) % p
    tmp = np.empty_like(x)
    mask = 1
    while mask < p:
        if vr & mask:  # pass what I have to my parent and stop
            _send(comm, acc, (vr - mask + root) % p, timeout, "reduce")
            return None
        if vr + mask < p:  # take my child's partial result: it covers higher ranks, so it goes on the right
            _recv(comm, tmp, (vr + mask + root) % p, timeout, "reduce")
            ufunc(acc, tmp, out=acc)
        mask <<= 1
    return acc


# -- allreduce variants --------------------------------------------------------------------------


def naive_allreduce(comm, x, op=MPI.SUM, check: bool = True, timeout: float | None = None) -> np.ndarray:
    """Everyone sends its whole array to everyone else and combines all p of them in rank order."""
    x, ufunc = _prepare(comm, x, op, check, "naive_allreduce")
    timeout = _default_timeout(timeout)
    p, r = comm.Get_size(), comm.Get_rank()
    if p == 1:
        return x.copy()
    bufs = [x if k == r else np.empty_like(x) for k in range(p)]
    reqs = [comm.Irecv(bufs[k], source=k, tag=TAG) for k in range(p) if k != r]
    reqs += [comm.Isend(x, dest=k, tag=TAG) for k in range(p) if k != r]
    wait_all(reqs, timeout, "naive_allreduce", comm)
    out = bufs[0].copy()
    for k in range(1, p):  # the same order on every rank: the same rounding everywhere
        ufunc(out, bufs[k], out=out)
    return out


def reduce_broadcast_allreduce(comm, x, op=MPI.SUM, check: bool = True, timeout: float | None = None) -> np.ndarray:
    """Allreduce as a tree reduce to rank 0 followed by a tree broadcast from it (2 log2 p steps)."""
    x, _ = _prepare(comm, x, op, check, "reduce_broadcast_allreduce")
    out = reduce(comm, x, op, root=0, check=False, timeout=timeout)
    return broadcast(comm, out if out is not None else np.empty_like(x), root=0, check=False, timeout=timeout)


def recursive_doubling_allreduce(comm, x, op=MPI.SUM, check: bool = True, timeout: float | None = None) -> np.ndarray:
    """Pairs exchange whole arrays at distance 1, 2, 4, ...: log2 p steps of N elements each.

    With p not a power of two, the first 2 (p - p2) ranks pair up first (even sends to odd), the
    p2 remaining ranks double, and the odd ranks hand the result back to their even partners.
    """
    x, ufunc = _prepare(comm, x, op, check, "recursive_doubling_allreduce")
    timeout = _default_timeout(timeout)
    p, r = comm.Get_size(), comm.Get_rank()
    what = "recursive_doubling_allreduce"
    acc = x.copy()
    if p == 1:
        return acc
    tmp = np.empty_like(x)
    p2 = 1 << (p.bit_length() - 1)
    rem = p - p2
    if r < 2 * rem:  # fold the extra ranks in
        if r % 2 == 0:
            _send(comm, acc, r + 1, timeout, what)
            _recv(comm, acc, r + 1, timeout, what)
            return acc
        _recv(comm, tmp, r - 1, timeout, what)
        ufunc(tmp, acc, out=acc)  # lower rank's data on the left
        vr = r // 2
    else:
        vr = r - rem
    mask = 1
    while mask < p2:
        vpartner = vr ^ mask
        partner = vpartner * 2 + 1 if vpartner < rem else vpartner + rem
        _sendrecv(comm, acc, partner, tmp, partner, timeout, what)
        if partner < r:
            ufunc(tmp, acc, out=acc)
        else:
            ufunc(acc, tmp, out=acc)
        mask <<= 1
    if r < 2 * rem:
        _send(comm, acc, r - 1, timeout, what)
    return acc


def ring_allreduce(comm, x, op=MPI.SUM, check: bool = True, timeout: float | None = None,
                   out: np.ndarray | None = None) -> np.ndarray:
    """Reduce-scatter then allgather around a ring: 2 (p-1) steps, each sending one chunk (about N/p) to the right.

    Chunks are floor(N/p) elements, the first N % p one longer (some are empty when N < p).
    After the reduce-scatter, rank r holds the finished chunk (r + 1) mod p. The result goes to a new
    array, or into ``out`` (which may be ``x`` itself, to work in place).
    """
    x, ufunc = _prepare(comm, x, op, check, "ring_allreduce")
    timeout = _default_timeout(timeout)
    p, r = comm.Get_size(), comm.Get_rank()
    if out is None:
        out = x.copy()
    elif out is not x:
        if out.shape != x.shape or out.dtype != x.dtype or not out.flags.c_contiguous:
            raise ValueError(f"out must be a C-contiguous {x.dtype} array of shape {x.shape}")
        out[...] = x
    if p == 1 or x.size == 0:
        return out
    flat = out.reshape(-1)
    chunks = shard_bounds(flat.size, p)
    right, left = (r + 1) % p, (r - 1) % p
    tmp = np.empty(max(hi - lo for lo, hi in chunks), dtype=x.dtype)
    for step in range(p - 1):  # reduce-scatter
        s_lo, s_hi = chunks[(r - step) % p]
        r_lo, r_hi = chunks[(r - step - 1) % p]
        recv = tmp[: r_hi - r_lo]
        _sendrecv(comm, flat[s_lo:s_hi], right, recv, left, timeout, "ring_allreduce (reduce-scatter)")
        ufunc(flat[r_lo:r_hi], recv, out=flat[r_lo:r_hi])
    for step in range(p - 1):  # allgather: pass the finished chunks around
        s_lo, s_hi = chunks[(r - step + 1) % p]
        r_lo, r_hi = chunks[(r - step) % p]
        _sendrecv(comm, flat[s_lo:s_hi], right, flat[r_lo:r_hi], left, timeout, "ring_allreduce (allgather)")
    return out


def mpi_allreduce(comm, x, op=MPI.SUM, check: bool = False, timeout: float | None = None,
                  out: np.ndarray | None = None) -> np.ndarray:
    """The MPI library's own ``Allreduce``, with the same signature (the reference); ``out=x`` works in place."""
    x = _check_array(x)
    _check_op(op, x.dtype)
    if out is x:
        comm.Allreduce(MPI.IN_PLACE, x, op=op)
        return x
    if out is None:
        out = np.empty_like(x)
    comm.Allreduce(x, out, op=op)
    return out


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

    def _barrier(self, what: str) -> None:
        self.win.Sync()
        if self.timeout is None:
            self.comm.Barrier()
        else:
            wait_all([self.comm.Ibarrier()], self.timeout, what, self.comm)
        self.win.Sync()

    def reduce(self) -> np.ndarray:
        """Sum every rank's :attr:`mine` into :attr:`result` (returned)."""
        self._barrier("shared-memory allreduce, waiting for every rank's contribution")
        lo, hi = self.block
        out = self.result[lo:hi]
        if self.p == 1:
            out[:] = self.slots[0, lo:hi]
        else:
            np.add(self.slots[0, lo:hi], self.slots[1, lo:hi], out=out)
            for r in range(2, self.p):
                out += self.slots[r, lo:hi]
        self._barrier("shared-memory allreduce, waiting for every rank's part of the sum")
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
        self.timeout = _default_timeout(timeout)
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
        from .device import gpu_status

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
            _check_same(self.mpi_comm, x, "NCCL allreduce")
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


ALLREDUCES = {
    "naive": naive_allreduce,
    "reduce_broadcast": reduce_broadcast_allreduce,
    "recursive_doubling": recursive_doubling_allreduce,
    "ring": ring_allreduce,
    "mpi": mpi_allreduce,
}


def alltoall(comm, x, check: bool = True, timeout: float | None = None) -> np.ndarray:
    """Rank r splits x along axis 0 into p blocks (floor + remainder) and sends block k to rank k;
    returns the blocks received, concatenated in source-rank order (p - 1 pairwise exchanges)."""
    x, _ = _prepare(comm, x, None, check, "alltoall")
    if x.ndim == 0:
        raise ValueError("alltoall needs an array with at least one dimension")
    timeout = _default_timeout(timeout)
    p, r = comm.Get_size(), comm.Get_rank()
    bounds = shard_bounds(x.shape[0], p)
    mine = bounds[r]
    blocks = [None] * p
    blocks[r] = x[mine[0]:mine[1]].copy()
    for step in range(1, p):
        dest, src = (r + step) % p, (r - step) % p
        lo, hi = bounds[dest]
        recv = np.empty((mine[1] - mine[0],) + x.shape[1:], dtype=x.dtype)  # every rank's block r has my size
        _sendrecv(comm, np.ascontiguousarray(x[lo:hi]), dest, recv, src, timeout, "alltoall")
        blocks[src] = recv
    return np.concatenate(blocks)


# -- recording traffic -----------------------------------------------------------------------------


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
