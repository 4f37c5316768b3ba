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

import json
import time

import numpy as np
from mpi4py import MPI

from . import settings
from .errors import LabkitError
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


def combiner(op):
    """The NumPy ufunc that combines two arrays as ``op`` does (np.add for MPI.SUM...)."""
    found = next((ufunc for o, ufunc, _ in _OPS if o == op), None)
    if found is None:
        raise ValueError(f"no combiner for {op!r}: the collectives take MPI.SUM, MPI.PROD, MPI.MAX or MPI.MIN")
    return found


class CollectiveError(LabkitError, ValueError):
    """Ranks called a collective with inconsistent buffers (lengths, dtypes or shapes)."""


# -- argument checks ------------------------------------------------------------------------------


def default_timeout(timeout: float | None) -> float | None:
    """``timeout`` when given, else the LABKIT_MPI_TIMEOUT setting (None: wait without a limit)."""
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


_ERRORS = {"TypeError": TypeError, "ValueError": ValueError}


def _raise_first(said: list, what: str) -> None:
    """``said`` holds, per rank, None or (error class name, message): raise the first rank's error on this rank."""
    bad = [(r, v) for r, v in enumerate(said) if v is not None]
    if bad:
        r, (kind, msg) = bad[0]
        more = f" (ranks {', '.join(str(k) for k, _ in bad)} refused)" if len(bad) > 1 else ""
        raise _ERRORS.get(kind, CollectiveError)(f"{what}: rank {r}: {msg}{more}")


def _problem(e: Exception | None):
    return None if e is None else (type(e).__name__, str(e))


def check_same(comm, x, what: str, problem: Exception | None = None, timeout: float | None = None) -> None:
    """Every rank must pass the same shape and dtype, and none may have refused its own argument (``problem``): one
    allgather, then every rank raises the same error naming the rank, so no rank waits on one that gave up. With
    ``timeout``, a rank that never arrives (its host cut off) is a TimeoutError, as in the collective itself."""
    mine = (_problem(problem), None if problem else (x.shape, x.dtype.str))
    everyone = comm.allgather(mine) if timeout is None else _allgather_within(comm, mine, timeout, what)
    _raise_first([said for said, _ in everyone], what)
    arrays = [a for _, a in everyone]
    if any(a != arrays[0] for a in arrays):
        desc = ", ".join(f"rank {r}: shape {s} {np.dtype(d)}" for r, (s, d) in enumerate(arrays))
        raise CollectiveError(f"{what}: every rank must pass the same shape and dtype, but {desc}")


_SAID = 4096  # bytes of each rank's word in a timed agreement (a refusal's message is cut to fit)


def _allgather_within(comm, mine, timeout: float, what: str) -> list:
    """``comm.allgather(mine)`` of a small JSON-able value, as a non-blocking Iallgather waited for at most
    ``timeout`` seconds (a blocking allgather would wait for ever on a rank that is gone)."""
    problem, spec = mine
    if problem is not None:
        problem = (problem[0], problem[1][:500])  # at most 6 bytes a character in JSON: it fits
    text = json.dumps([problem, spec]).encode()[:_SAID]
    send = np.zeros(_SAID, np.uint8)
    send[:len(text)] = np.frombuffer(text, np.uint8)
    recv = np.empty((comm.Get_size(), _SAID), np.uint8)
    _wait_within([comm.Iallgather(send, recv)], timeout, f"{what} (agreeing on shape and dtype)", comm.Get_rank(),
                 keep=(send, recv))
    said = [json.loads(bytes(row).rstrip(b"\0")) for row in recv]
    return [(tuple(p) if p else None, (tuple(sp[0]), sp[1]) if sp else None) for p, sp in said]  # as allgather gives


def _prepare(comm, x, op, check: bool, what: str, timeout: float | None = None):
    """Check this rank's array and op; with ``check``, agree with every rank first (see :func:`check_same`)."""
    problem, ufunc = None, None
    try:
        x = _check_array(x)
        ufunc = _check_op(op, x.dtype) if op is not None else None
    except (TypeError, ValueError) as e:
        problem = e
    if check and comm.Get_size() > 1:
        check_same(comm, x, what, problem, timeout)
    elif problem is not None:
        raise problem
    return x, ufunc


# -- waiting with a timeout ----------------------------------------------------------------------


def wait_all(reqs: list, timeout: float | None, what: str, comm) -> None:
    """Wait for requests (one communication round); with a timeout, poll and raise TimeoutError instead of hanging.

    ``what`` names the operation in the error; ``comm`` gives the rank (and counts rounds on a
    :class:`labkit.traffic.TrafficComm`).
    """
    next_round = getattr(comm, "next_round", None)  # a TrafficComm counts the rounds
    if next_round is not None:
        next_round()
    if timeout is None:
        MPI.Request.Waitall(reqs)
        return
    _wait_within(reqs, timeout, what, comm.Get_rank())


_ABANDONED: list = []  # collectives given up on, with their buffers: MPI may still write into them


def _wait_within(reqs: list, timeout: float, what: str, rank: int, keep=None) -> None:
    """Poll the requests until done; after ``timeout`` seconds raise TimeoutError, cancelling point-to-point requests.
    A collective cannot be cancelled: with ``keep`` (its buffers) it is abandoned, its buffers kept alive."""
    deadline = time.monotonic() + timeout
    while not MPI.Request.Testall(reqs):
        if time.monotonic() > deadline:
            if keep is not None:
                _ABANDONED.append((reqs, keep))
            else:
                for r in reqs:
                    if r != MPI.REQUEST_NULL:
                        try:
                            r.Cancel()
                        except MPI.Exception:
                            pass
            raise TimeoutError(
                f"rank {rank}: {what} waited {timeout:g} s for a message. Another rank probably "
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
    timeout = default_timeout(timeout)
    x, _ = _prepare(comm, x, None, check, "broadcast", timeout)
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


def scatter(comm, x, root: int = 0, timeout: float | None = None, check: bool = True) -> np.ndarray:
    """Split root's array along axis 0 into p pieces (floor + remainder rows) and give rank k piece k.

    Only root's ``x`` matters; other ranks pass ``None``. Shape and dtype travel in a small header. With ``check``
    root's verdict on its array is broadcast first, so a refused array is the same error on every rank.
    """
    timeout = default_timeout(timeout)
    p, r = comm.Get_size(), comm.Get_rank()
    what = "scatter"
    problem = None
    if r == root:
        try:
            x = _check_array(x)
            if x.ndim == 0:
                raise ValueError("scatter needs an array with at least one dimension")
        except (TypeError, ValueError) as e:
            problem = e
    if check and p > 1:
        _raise_first([None] * root + [comm.bcast(_problem(problem), root=root)], what)
    elif problem is not None:
        raise problem
    if r == root:
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


def gather(comm, x, root: int = 0, timeout: float | None = None, check: bool = True) -> np.ndarray | None:
    """Every rank's array, concatenated along axis 0 in rank order, on root (``None`` elsewhere).

    Pieces may have different lengths; their trailing shape and dtype must match root's. With ``check`` the ranks
    agree on that first (one allgather), so a refused piece is the same error on every rank.
    """
    timeout = default_timeout(timeout)
    p, r = comm.Get_size(), comm.Get_rank()
    what = "gather"
    problem = None
    try:
        x = _check_array(x)
    except (TypeError, ValueError) as e:
        problem = e
    if check and p > 1:
        everyone = comm.allgather((_problem(problem), None if problem else (x.shape[1:], x.dtype.str, x.ndim)))
        _raise_first([said for said, _ in everyone], what)
        kinds = [k for _, k in everyone]
        odd = [k for k, v in enumerate(kinds) if v != kinds[root]]
        if odd:
            raise CollectiveError(f"{what}: rank {odd[0]} passes trailing shape {kinds[odd[0]][0]} {np.dtype(kinds[odd[0]][1])}, "
                                  f"root has {kinds[root][0]} {np.dtype(kinds[root][1])}: pieces must agree in dtype "
                                  "and in every dimension but the first")
    elif problem is not None:
        raise problem
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
    timeout = default_timeout(timeout)
    x, ufunc = _prepare(comm, x, op, check, "reduce", timeout)
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
    timeout = default_timeout(timeout)
    x, ufunc = _prepare(comm, x, op, check, "naive_allreduce", timeout)
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
    x, _ = _prepare(comm, x, op, check, "reduce_broadcast_allreduce", default_timeout(timeout))
    out = reduce(comm, x, op, root=0, check=False, timeout=timeout)
    return broadcast(comm, out if out is not None else np.empty_like(x), root=0, check=False, timeout=timeout)


def recursive_doubling_allreduce(comm, x, op=MPI.SUM, check: bool = True, timeout: float | None = None) -> np.ndarray:
    """Pairs exchange whole arrays at distance 1, 2, 4, ...: log2 p steps of N elements each.

    With p not a power of two, the first 2 (p - p2) ranks pair up first (even sends to odd), the
    p2 remaining ranks double, and the odd ranks hand the result back to their even partners.
    """
    timeout = default_timeout(timeout)
    x, ufunc = _prepare(comm, x, op, check, "recursive_doubling_allreduce", timeout)
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
    timeout = default_timeout(timeout)
    x, ufunc = _prepare(comm, x, op, check, "ring_allreduce", timeout)
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


class RingRequest:
    """labkit's ring allreduce in non-blocking form, made by :func:`ring_iallreduce`: the sum goes into ``x`` in place.

    Nothing moves between calls: each :meth:`Test` finishes the steps whose messages have arrived, starts the next
    step's ``Isend``/``Irecv`` and says whether all 2 (p - 1) steps are done, as an MPI library's progress engine does
    inside its own calls. :meth:`Wait` tests until done (a ``TimeoutError`` after ``timeout`` seconds). Several may be
    in flight on one communicator: each gets its own tag, in the order the ranks start them, which must be the same
    on every rank (as for MPI's non-blocking collectives).
    """

    _started: dict = {}  # per communicator handle: how many rings were started on it (their tags)

    def __init__(self, comm, x: np.ndarray, op=MPI.SUM, timeout: float | None = None):
        x = _check_array(x)
        if not x.flags.c_contiguous:
            raise ValueError("ring_iallreduce works in place on a C-contiguous array")
        self.ufunc = _check_op(op, x.dtype)
        self.comm, self.timeout = comm, default_timeout(timeout)
        self.p, self.r = comm.Get_size(), comm.Get_rank()
        key = MPI._handleof(comm) if hasattr(MPI, "_handleof") else id(comm)
        n = RingRequest._started[key] = RingRequest._started.get(key, 0) + 1
        self.tag = TAG + 100 + n % 20000
        self.flat = x.reshape(-1)
        self.chunks = shard_bounds(self.flat.size, self.p)
        self.tmp = np.empty(max(hi - lo for lo, hi in self.chunks), dtype=x.dtype)
        self.step, self.steps = 0, 2 * (self.p - 1) if self.flat.size else 0
        self.reqs: list = []
        self._post()

    @property
    def done(self) -> bool:
        return self.step >= self.steps

    def _chunk(self, k: int) -> tuple[int, int]:
        return self.chunks[k % self.p]

    def _post(self) -> None:
        """Start the current step's two messages (none when all steps are done)."""
        if self.done:
            return
        s, r, p = self.step, self.r, self.p
        reduce = s < p - 1  # the reduce-scatter, then the allgather of the finished chunks
        k = s if reduce else s - (p - 1)
        s_lo, s_hi = self._chunk(r - k + (0 if reduce else 1))
        r_lo, r_hi = self._chunk(r - k - (1 if reduce else 0))
        into = self.tmp[: r_hi - r_lo] if reduce else self.flat[r_lo:r_hi]
        self._into = (reduce, r_lo, r_hi, into)
        self.reqs = [self.comm.Irecv(into, source=(r - 1) % p, tag=self.tag),
                     self.comm.Isend(self.flat[s_lo:s_hi], dest=(r + 1) % p, tag=self.tag)]

    def Test(self) -> bool:  # noqa: N802 - MPI's name, so that a list may hold these and MPI requests alike
        """Move on as far as the messages that arrived allow; True once the sum is complete in ``x``."""
        while not self.done and MPI.Request.Testall(self.reqs):
            reduce, r_lo, r_hi, into = self._into
            if reduce:
                self.ufunc(self.flat[r_lo:r_hi], into, out=self.flat[r_lo:r_hi])
            self.step += 1
            self._post()
        return self.done

    def Wait(self) -> None:  # noqa: N802
        """Test until done; a ``TimeoutError`` after ``timeout`` seconds. The ring stays in flight (a message already
        sent cannot be called back): ``Wait`` again once the late rank has started it, or end the job."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while not self.Test():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"rank {self.r}: ring_iallreduce waited {self.timeout:g} s at step {self.step + 1} "
                                   f"of {self.steps}. Another rank probably failed or did not start the same ring; "
                                   "restart the MPI job (or the engines).")
            time.sleep(1e-5)


def ring_iallreduce(comm, x: np.ndarray, op=MPI.SUM, timeout: float | None = None) -> RingRequest:
    """Start labkit's ring allreduce of ``x`` in place and return at once: a :class:`RingRequest`, whose ``Test()``
    moves it on and whose ``Wait()`` finishes it. Every rank must start it with an array of the same length and dtype
    (not checked: checking would be a blocking collective)."""
    return RingRequest(comm, x, op, timeout)


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
    timeout = default_timeout(timeout)
    x, _ = _prepare(comm, x, None, check, "alltoall", timeout)
    if x.ndim == 0:
        raise ValueError("alltoall needs an array with at least one dimension")
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
