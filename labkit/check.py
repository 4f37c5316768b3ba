"""Checks for the notebooks' exercises: run a student's function against the reference and say what is wrong.

Each check prints one line when everything passes and otherwise raises :class:`ExerciseError`
with what was tested, what was expected against what came back, and a hint.
"""

from __future__ import annotations

import numpy as np

from . import cpu_parallel, mlp


class ExerciseError(AssertionError):
    """A student's function gave a wrong answer; the message says what and suggests why."""


def _fail(exercise: str, what: str, hint: str = "") -> None:
    raise ExerciseError(f"{exercise}: {what}" + (f"\nHint: {hint}" if hint else ""))


def _passed(exercise: str, n: int) -> None:
    print(f"✔ {exercise}: all {n} checks passed")


def _not_written(exercise: str) -> str:
    """The message for a function that still raises NotImplementedError."""
    return (f"{exercise}: not written yet (the function raises NotImplementedError)\nHint: replace the "
            "`raise NotImplementedError` line with your code, run the cell, then run this check again")


def _call(exercise: str, fn, *args):
    try:
        return fn(*args)
    except NotImplementedError:
        raise ExerciseError(_not_written(exercise)) from None
    except ExerciseError:
        raise
    except Exception as e:
        _fail(exercise, f"your function raised {type(e).__name__}: {e}",
              "run it on a small batch by hand and print the shapes of every array")


def _problems(seed: int = 0):
    rng = np.random.default_rng(seed)
    for sizes, batch in (([5, 4, 3], 1), ([5, 4, 3], 8), ([7, 6, 5, 3], 13)):
        params = mlp.init_params(sizes, seed=int(rng.integers(1000)), dtype=np.float64)
        x = rng.random((batch, sizes[0]))
        Y = mlp.targets(rng.integers(0, sizes[-1], batch), sizes[-1], np.float64)
        yield params, x, Y


def _compare_grads(exercise: str, got, want, batch: int, where: str) -> None:
    if not isinstance(got, (list, tuple)) or len(got) != len(want):
        _fail(exercise, f"{where}: expected a list of {len(want)} (dW, db) pairs, got {type(got).__name__}"
              + (f" of length {len(got)}" if isinstance(got, (list, tuple)) else ""),
              "return one (dW, db) pair per layer, in the same order as params")
    last = len(want) - 1
    for i in range(last, -1, -1):  # from the output back, as the error flows: the first bad layer is the one to fix
        g, w = got[i], want[i]
        if not isinstance(g, (list, tuple)) or len(g) != 2:
            _fail(exercise, f"{where}, layer {i}: expected a (dW, db) pair, got {type(g).__name__}")
        for name, a, b in (("dW", g[0], w[0]), ("db", g[1], w[1])):
            a = np.asarray(a)
            if a.shape != b.shape:
                hint = "you have it transposed: dW = delta^T a has shape (n_out, n_in)" if a.shape == b.shape[::-1] else \
                    "db sums delta over the batch: shape (n_out,)" if name == "db" else ""
                _fail(exercise, f"{where}, layer {i}: {name} has shape {a.shape}, expected {b.shape}", hint)
            if np.allclose(a, b, rtol=1e-6, atol=1e-9):
                continue
            if batch > 1 and np.allclose(a, b * batch, rtol=1e-6, atol=1e-9):
                _fail(exercise, f"{where}, layer {i}: {name} is {batch} (the batch size) times too large",
                      "the gradient of the mean loss divides the sum over samples by the batch size")
            hint = ("the output layer's delta is (a - y) * sigma'(z), with sigma'(z) = a (1 - a)" if i == last else
                    "the output layer is right; the error goes back as delta = (delta_next @ W_next) * a (1 - a)")
            err = np.abs(a - b).max()
            _fail(exercise, f"{where}, layer {i}: {name} differs from the reference by up to {err:.3g}\n"
                  f"  yours, first values:    {np.array2string(a.ravel()[:4], precision=5)}\n"
                  f"  expected, first values: {np.array2string(b.ravel()[:4], precision=5)}", hint)


def backprop(fn) -> None:
    """Exercise (lab 01): ``fn(params, x, Y) -> grads``, vectorised backprop, sigmoid and quadratic cost."""
    ex = "vectorised backprop"
    n = 0
    for k, (params, x, Y) in enumerate(_problems()):
        before = [(W.copy(), b.copy()) for W, b in params]
        got = _call(ex, fn, params, x, Y)
        if any(not np.array_equal(W, W0) or not np.array_equal(b, b0) for (W, b), (W0, b0) in zip(params, before)):
            _fail(ex, f"problem {k + 1}: your function changed params", "compute gradients into new arrays; leave W and b alone")
        want = mlp.backprop(params, x, Y, "sigmoid", "quadratic")
        _compare_grads(ex, got, want, x.shape[0], f"problem {k + 1} (sizes {mlp.sizes_of(params)}, batch {x.shape[0]})")
        n += 1
    _passed(ex, n)


def accumulate(fn) -> None:
    """Exercise (lab 02): ``fn(params, x, Y, acc) -> loss_sum`` adds per-sample gradients of rows x into ``acc``.

    The check runs it in several threads, each with its own accumulator, and reduces them at the end.
    """
    ex = "per-thread accumulator"
    n = 0
    for k, (params, x, Y) in enumerate(_problems(seed=1)):
        want_loss, want = mlp.loss_and_grads_per_sample(params, x, Y)
        batch = x.shape[0]
        want_sum = [(gW * batch, gb * batch) for gW, gb in want]
        # a single accumulator first: the plainest failure messages
        acc = mlp.zeros_like(params)
        loss_sum = _call(ex, fn, params, x, Y, acc)
        where = f"problem {k + 1} (batch {batch}, one thread)"
        if all(not a.any() for pair in acc for a in pair):
            _fail(ex, f"{where}: acc is still all zeros after your function returned",
                  "add into the arrays of acc in place, e.g. `acc_W += dW`; `acc_W = acc_W + dW` makes a new array")
        if batch > 1:
            _, last = mlp.loss_and_grads_per_sample(params, x[-1:], Y[-1:])
            if all(np.allclose(a, b) for (a, _), (b, _) in zip(acc, last)):
                _fail(ex, f"{where}: acc holds only the last sample's gradient",
                      "add (+=) each sample's gradient; do not assign (=)")
        try:
            _compare_grads(ex, acc, want_sum, 1, where)
        except ExerciseError as e:
            if all(np.allclose(a, b / batch) for (a, _), (b, _) in zip(acc, want_sum)):
                _fail(ex, f"{where}: acc holds the mean, not the sum", "accumulate sums; the caller divides once at the end")
            raise e
        if not np.isclose(float(loss_sum), want_loss * batch, rtol=1e-6):
            _fail(ex, f"{where}: returned loss {float(loss_sum):.6g}, expected the summed loss {want_loss * batch:.6g}")
        # then several threads, one accumulator each, reduced at the end
        from concurrent.futures import ThreadPoolExecutor

        shards = [(lo, hi) for lo, hi in shard_bounds(batch, 3) if hi > lo]
        accs = [mlp.zeros_like(params) for _ in shards]
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(fn, params, x[lo:hi], Y[lo:hi], a) for (lo, hi), a in zip(shards, accs)]
            losses = [f.result() for f in futures]
        total = [(sum(a[i][0] for a in accs), sum(a[i][1] for a in accs)) for i in range(len(params))]
        _compare_grads(ex, total, want_sum, 1, f"problem {k + 1} (batch {batch}, 3 threads reduced)")
        if not np.isclose(sum(float(v) for v in losses), want_loss * batch, rtol=1e-6):
            _fail(ex, f"problem {k + 1}: the threads' losses do not add up to the batch's summed loss")
        n += 2
    _passed(ex, n)


def ring_allreduce(fn, comm=None, timeout: float = 20.0) -> None:
    """Exercise (lab 06): ``fn(comm, x, op)`` must be a ring allreduce. Call on every MPI rank (``%%px``).

    Runs ``fn`` on sub-communicators of 1, 2, ..., p ranks, with lengths 0, 1, shorter than, equal to and
    not divisible by the rank count, several dtypes and ops; compares with ``MPI_Allreduce``, checks that
    ``x`` is untouched, and records the traffic: 2 (k - 1) messages per rank, all to the right-hand
    neighbour, about 2 (k - 1)/k of the array in total. Every rank raises the same ExerciseError on failure.
    """
    from mpi4py import MPI

    comm = comm or MPI.COMM_WORLD
    ex = "ring allreduce"
    cases = [(np.float64, MPI.SUM), (np.int64, MPI.MAX), (np.int32, MPI.PROD), (np.float32, MPI.MIN)]

    def run(sub, k):
        for n in sorted({0, 1, max(k - 1, 1), k + 1, 2 * k + 3, 1000}):
            for dtype, op in cases:
                yield lambda n=n, dtype=dtype, op=op: _ring_case(fn, sub, k, n, dtype, op, timeout, ex)

    _collective_check(comm, ex, run)


def _collective_check(comm, ex: str, cases) -> None:
    """Run ``cases(sub, k)`` (a generator of case functions returning an error string or None) on
    sub-communicators of the first k = 1..p ranks. Ranks agree after every case, so nobody starts a case
    the others skipped; on failure every rank raises (rank 0 with the message)."""
    from .cluster import first_ranks
    from .collectives import first_cause

    p, rank = comm.Get_size(), comm.Get_rank()
    n_checks, error = 0, None
    for k in range(1, p + 1):
        with first_ranks(comm, k) as sub:
            if sub:
                for case in cases(sub, k):
                    if error is None:
                        error = case()
                    n_checks += 1
                    error = first_cause(sub.allgather(error))
                    if error:
                        break
        error = first_cause(comm.allgather(error))
        if error:
            if rank == 0:
                raise ExerciseError(error)
            raise ExerciseError(f"{ex}: failed (rank 0 shows what went wrong)")
    if rank == 0:
        _passed(f"{ex} on 1 to {p} ranks", n_checks)


def _ring_case(fn, sub, k, n, dtype, op, timeout, ex) -> str | None:
    """One check on one sub-communicator; returns what went wrong (or None), never raises."""
    from mpi4py import MPI

    from .collectives import TrafficComm, op_name

    r = sub.Get_rank()
    where = f"{k} rank{'s' if k > 1 else ''}, n={n}, {np.dtype(dtype)}, MPI.{op_name(op)}, rank {r}"
    rng = np.random.default_rng(100 * k + r)
    x = (rng.integers(1, 4, n) if op == MPI.PROD else rng.integers(-50, 50, n)).astype(dtype)
    before = x.copy()
    want = np.empty_like(x)
    sub.Allreduce(x, want, op=op)
    work = sub.Dup()  # the student's messages stay apart from the check's own, even if some are abandoned
    tc = TrafficComm(work, timeout=timeout)
    try:
        got = fn(tc, x, op)
    except NotImplementedError:
        return _not_written(ex)
    except TimeoutError as e:
        return f"{ex} ({where}): {e}\nHint: every Send needs a matching Recv on the neighbour; use Sendrecv"
    except MPI.Exception as e:
        return (f"{ex} ({where}): MPI reported an error: {e.Get_error_string()}\nHint: most often a message is "
                "larger than the buffer receiving it: in each step the chunk a rank sends must be the chunk its "
                "neighbour receives (same index, same size); chunks differ in size when n is not divisible by p")
    except Exception as e:
        return f"{ex} ({where}): your function raised {type(e).__name__}: {e}"
    if not isinstance(got, np.ndarray):
        return f"{ex} ({where}): returned {type(got).__name__}, expected a NumPy array"
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{ex} ({where}): returned shape {got.shape} {got.dtype}, expected {want.shape} {want.dtype}"
    if not np.array_equal(x, before):
        return f"{ex} ({where}): x was modified\nHint: work on a copy (out = x.copy()) and return it"
    if not np.allclose(got, want, rtol=1e-5):
        bad = np.flatnonzero(~np.isclose(got, want, rtol=1e-5))
        return (f"{ex} ({where}): wrong values at {len(bad)} of {n} positions, first at index {bad[0]}: "
                f"got {got[bad[0]]}, expected {want[bad[0]]}\nHint: check which chunk you send and receive "
                "at each step: in step s rank r sends chunk (r - s) mod p and receives chunk (r - s - 1) mod p")
    if k > 1 and n >= k:
        sent = [row for row in tc.log if row[0] == r]
        if not sent:
            return (f"{ex} ({where}): no messages were recorded\nHint: use the buffer methods of comm "
                    "(comm.Sendrecv / comm.Send / comm.Isend on NumPy arrays), not the lowercase ones")
        right = (r + 1) % k
        if any(dest != right for _, dest, _, _ in sent):
            return (f"{ex} ({where}): rank {r} sent to ranks {sorted({d for _, d, _, _ in sent})}; "
                    f"a ring sends only to its right-hand neighbour {right}")
        if len(sent) != 2 * (k - 1):
            return (f"{ex} ({where}): rank {r} sent {len(sent)} messages; a ring allreduce sends 2 (p - 1) = "
                    f"{2 * (k - 1)}: p - 1 in the reduce-scatter, p - 1 in the allgather")
        nbytes = sum(b for _, _, b, _ in sent)
        lo, hi = 2 * (k - 1) * (n // k) * x.itemsize, 2 * (k - 1) * -(-n // k) * x.itemsize
        if not lo <= nbytes <= hi:
            return (f"{ex} ({where}): rank {r} sent {nbytes} bytes; a ring sends about 2 (p - 1)/p of the array "
                    f"({lo} to {hi} bytes)\nHint: send one chunk of about n/p elements per step, not the whole array")
    work.Free()
    return None


def data_parallel_step(fn, comm=None, timeout: float = 20.0) -> None:
    """Exercise (lab 07): ``fn(comm, params, x, Y) -> grads`` on every rank (``%%px``).

    Every rank passes the same global batch; the result must be the gradient of the mean quadratic cost
    over the *whole* batch (sigmoid network), on every rank, computed from this rank's shard only.
    Checked on 1..p ranks with batches that divide the rank count, do not, and are smaller than it.
    """
    from mpi4py import MPI

    from .collectives import TrafficComm

    comm = comm or MPI.COMM_WORLD
    ex = "data-parallel step"

    def case(sub, k, batch):
        r = sub.Get_rank()
        where = f"{k} rank{'s' if k > 1 else ''}, batch {batch}, rank {r}"
        rng = np.random.default_rng(batch)
        params = mlp.init_params([6, 5, 3], seed=batch, dtype=np.float64)
        x = rng.random((batch, 6))
        Y = mlp.targets(rng.integers(0, 3, batch), 3, np.float64)
        want = mlp.backprop(params, x, Y, "sigmoid", "quadratic")
        calls = []

        def spy(*args, **kw):  # count how many rows the student's code backprops itself
            calls.append(args[1].shape[0] if len(args) > 1 else 0)
            return real(*args, **kw)

        real = mlp.loss_and_grads  # mlp.backprop calls it too
        mlp.loss_and_grads = spy
        error, got = None, None
        work = sub.Dup()  # the student's messages stay apart from the check's own, even if some are abandoned
        try:
            got = fn(TrafficComm(work, timeout=timeout), params, x, Y)
        except NotImplementedError:
            error = _not_written(ex)
        except Exception as e:
            hint = ("\nHint: when the batch is smaller than the number of ranks some ranks get no samples; "
                    "they contribute zero gradients (mlp.zeros_like(params))") if "no samples" in str(e) else ""
            error = f"{ex} ({where}): your function raised {type(e).__name__}: {e}{hint}"
        finally:
            mlp.loss_and_grads = real
        shaped = error is None and isinstance(got, (list, tuple)) and len(got) == len(want) and all(
            isinstance(g, (list, tuple)) and len(g) == 2 and np.shape(g[0]) == w[0].shape and np.shape(g[1]) == w[1].shape
            for g, w in zip(got, want))
        # every rank of sub takes part in the allgather (a rank that failed says False), so nobody waits alone
        if k > 1 and all(sub.allgather(shaped)):
            summed = [sub.allreduce(np.asarray(a, dtype=np.float64)) for g in got for a in g]
            if all(np.allclose(a, b) for a, b in zip(summed, (a for w in want for a in w))) and not all(
                    np.allclose(a, b) for g, w in zip(got, want) for a, b in zip(g, w)):
                error = (f"{ex} ({where}): each rank returned only its own shard's share; added up over the ranks "
                         "they are right\nHint: sum the shards with comm.Allreduce, so every rank holds the total")
        if error:
            return error  # work is not freed: a rank may have abandoned an operation on it
        work.Free()
        try:
            _compare_grads(ex, got, want, batch, where)
        except ExerciseError as e:
            return str(e)
        mine = shard_bounds(batch, k)[r]
        if calls and max(calls) > mine[1] - mine[0]:
            return (f"{ex} ({where}): rank {r} backpropped {max(calls)} samples at once, but its shard has "
                    f"{mine[1] - mine[0]}\nHint: each rank computes only its floor + remainder share of the batch")
        return None

    def run(sub, k):
        for batch in sorted({1, max(k - 1, 1), k, 2 * k + 1, 12}):
            yield lambda batch=batch: case(sub, k, batch)

    _collective_check(comm, ex, run)


def async_worker(fn, comm=None, timeout: float = 10.0) -> None:
    """Exercise (lab 08): ``fn(comm, grad, flat, bounds, batches, timeout)``, the asynchronous worker loop.

    Run as the workers of :func:`labkit.param_server.train` (labkit's masters) on 2..p ranks with 1..p-1
    masters. With one worker nothing can be stale, so the weights must equal serial SGD over the same
    batches and every update must have staleness 0; with several, every gradient must reach every master.
    """
    from mpi4py import MPI

    from . import param_server

    comm = comm or MPI.COMM_WORLD
    ex = "asynchronous worker"
    sizes, lr, batch, epochs = [6, 5, 3], 0.1, 5, 2
    rng = np.random.default_rng(8)
    x, y = rng.random((23, 6)), rng.integers(0, 3, 23)
    hints = {
        "values with tag": "each message to master m is g[lo:hi] followed by one number, the version: "
                           "np.append(g[lo:hi], versions[m]), length hi - lo + 1; the reply has the same layout",
        "never sent DONE": "after the last batch tell every master you are done: "
                           "comm.Send(np.empty(0, flat.dtype), dest=m, tag=param_server.DONE)",
        "is it receiving": "post comm.Irecv(reply, source=m, tag=param_server.WEIGHTS) for every master at every step, "
                           "and wait for all requests before the next batch",
        "was computed on version": "send back the version that came with the weights: the reply's last entry",
        "unexpected message": "masters are ranks 0 .. len(bounds) - 1; gradients go there with tag param_server.GRAD",
        "waited": "every Isend and Irecv must be matched: one gradient to and one reply from each master per batch",
    }

    def reference(seed):
        params = mlp.init_params(sizes, seed=seed, dtype=np.float64, init="he")
        Y = mlp.targets(y, 3, np.float64)
        for xb, Yb in param_server.worker_batches(x, Y, epochs, batch, param_server.worker_seed(seed, 0)):
            _, g = mlp.loss_and_grads_unchecked(params, xb, Yb, "relu", "cross_entropy", 0.0)
            mlp.SGD(lr).step(params, g)
        return params

    def case(sub, k, masters):
        workers = k - masters
        where = f"{masters} master{'s' if masters > 1 else ''}, {workers} worker{'s' if workers > 1 else ''}"
        try:
            res = param_server.train(sub, sizes, (x, y), masters=masters, mode="async", epochs=epochs,
                                     batch_size=batch, lr=lr, seed=k, timeout=timeout, dtype=np.float64, worker=fn)
        except param_server.ParameterServerError as e:
            msg = str(e)
            if "NotImplementedError" in msg:
                return _not_written(ex)
            hint = next((h for key, h in hints.items() if key in msg), "")
            return f"{ex} ({where}): {msg}" + (f"\nHint: {hint}" if hint else "")
        if sub.Get_rank() != 0:
            return None
        steps_each = [epochs * -(-(hi - lo) // batch) for lo, hi in shard_bounds(len(x), workers)]
        if res.worker_steps.tolist() != steps_each:
            return (f"{ex} ({where}): the workers backpropped {res.worker_steps.tolist()} batches, expected "
                    f"{steps_each}\nHint: call grad(x, Y) once for every batch the iterator yields")
        if not (res.master_updates == sum(steps_each)).all():
            return (f"{ex} ({where}): the masters applied {res.master_updates.tolist()} updates, expected "
                    f"{sum(steps_each)} each\nHint: send every master its slice after every batch")
        if workers == 1:
            want = reference(k)
            if (res.staleness != 0).any():
                return (f"{ex} ({where}): with one worker every gradient is computed on the newest weights, but "
                        f"the masters saw staleness up to {res.staleness.max()}\nHint: {hints['was computed on version']}")
            for i, ((a, b), (c, d)) in enumerate(zip(res.params, want)):
                if not (np.allclose(a, c, rtol=1e-9, atol=1e-12) and np.allclose(b, d, rtol=1e-9, atol=1e-12)):
                    return (f"{ex} ({where}): after {steps_each[0]} steps the weights of layer {i} differ from serial "
                            f"SGD over the same batches by up to {np.abs(a - c).max():.3g}\nHint: copy each reply "
                            "into flat in place (flat[lo:hi] = reply[:-1]) before the next grad(x, Y): the gradient "
                            "must be computed on the weights the masters sent")
        return None

    def run(sub, k):
        for masters in range(1, k):
            yield lambda masters=masters: case(sub, k, masters)

    if comm.Get_size() < 2:
        raise ExerciseError(f"{ex}: needs at least 2 ranks (a master and a worker); start more engines")
    _collective_check(comm, ex, run)


def topk_feedback(fn) -> None:
    """Exercise (lab 09): ``fn(g, residual, ratio) -> (indices, values, new_residual)``, top-k with error feedback.

    Sends the k = ceil(ratio * n) (at least 1) entries of largest magnitude of ``g + residual``; the new
    residual is ``g + residual`` with the sent entries zeroed. Checked on several sizes, ratios and
    dtypes, with negative entries, and over many steps: what was sent plus the residual left is exactly
    the sum of all gradients (nothing is lost, only delayed).
    """
    import math

    ex = "top-k with error feedback"
    n_checks = 0
    rng = np.random.default_rng(9)
    for n, ratio, dtype in ((10, 0.3, np.float64), (1, 0.5, np.float64), (7, 0.01, np.float32), (1000, 0.01, np.float32),
                            (333, 0.1, np.float64), (64, 1.0, np.float32)):
        g = (rng.standard_normal(n) * rng.choice([1, 10], n)).astype(dtype)
        residual = (rng.standard_normal(n) * 0.5).astype(dtype)
        g0, r0 = g.copy(), residual.copy()
        where = f"n={n}, ratio={ratio}, {np.dtype(dtype)}"
        got = _call(ex, fn, g, residual, ratio)
        if not isinstance(got, tuple) or len(got) != 3:
            _fail(ex, f"{where}: expected a tuple (indices, values, new_residual), got {type(got).__name__}")
        idx, values, new_res = (np.asarray(a) for a in got)
        if not np.array_equal(g, g0):
            _fail(ex, f"{where}: g was modified", "work on corrected = g + residual, a new array")
        if not np.array_equal(residual, r0):
            _fail(ex, f"{where}: the residual passed in was modified", "return a new residual instead")
        corrected = g0 + r0
        k = min(n, max(1, math.ceil(ratio * n)))
        if idx.shape != (k,) or values.shape != (k,):
            _fail(ex, f"{where}: sent {idx.shape} indices and {values.shape} values, expected {k} of each",
                  "k = max(1, ceil(ratio * n)): at least one entry, never more than n")
        if idx.dtype.kind not in "iu" or len(set(idx.tolist())) != k or idx.min() < 0 or idx.max() >= n:
            _fail(ex, f"{where}: the indices must be {k} different integers in 0..{n - 1}, got {idx[:8]}")
        kth = np.sort(np.abs(corrected))[n - k]
        if np.abs(corrected[idx]).min() < kth * (1 - 1e-6):
            plain = np.sort(np.argpartition(g0, n - k)[n - k:])
            if np.array_equal(np.sort(idx), plain) or np.array_equal(np.sort(idx), np.sort(np.argsort(corrected)[n - k:])):
                hint = "choose by magnitude, np.abs(...): large negative entries matter as much as large positive ones"
            elif np.abs(g0[idx]).min() >= np.sort(np.abs(g0))[n - k] * (1 - 1e-6):
                hint = "choose from g + residual, not from g alone: the residual is what earlier steps did not send"
            else:
                hint = "np.argpartition(np.abs(corrected), n - k)[n - k:] gives the k largest magnitudes"
            _fail(ex, f"{where}: the sent entries are not the {k} largest in magnitude of g + residual", hint)
        if not np.allclose(values, corrected[idx], rtol=1e-6):
            hint = ("send the values of g + residual, not of g" if np.allclose(values, g0[idx]) else
                    "values[i] must be corrected[indices[i]]")
            _fail(ex, f"{where}: the values sent are not those of g + residual at the indices", hint)
        want_res = corrected.copy()
        want_res[idx] = 0
        if np.shape(new_res) != (n,) or not np.allclose(new_res, want_res, rtol=1e-6, atol=1e-7):
            hint = ("the residual keeps what was NOT sent: g + residual with the sent entries set to 0"
                    if np.shape(new_res) == (n,) else f"the residual has the shape of g, ({n},)")
            _fail(ex, f"{where}: wrong new residual", hint)
        n_checks += 1
    # many steps: sent + left over = everything (error feedback loses nothing)
    n, residual, sent, total = 200, np.zeros(200), np.zeros(200), np.zeros(200)
    for _ in range(30):
        g = rng.standard_normal(n)
        idx, values, residual = (np.asarray(a) for a in _call(ex, fn, g, residual, 0.05))
        np.add.at(sent, idx, values)
        total += g
    if not np.allclose(sent + residual, total):
        _fail(ex, "after 30 steps, what was sent plus the residual is not the sum of the gradients",
              "return the new residual and pass it back in at the next step")
    _passed(ex, n_checks + 1)


# -- speedup analysis (lab 11) ------------------------------------------------------------------------


def _compare_series(ex: str, where: str, got, want, hints: list[tuple[np.ndarray, str]], hint: str) -> None:
    """``got`` must equal ``want`` (1-D, same length); if it equals one of the ``hints``' arrays, say that hint."""
    try:
        a = np.asarray(got, dtype=float)
    except (TypeError, ValueError):
        a = None
    if a is None or a.shape != want.shape:
        _fail(ex, f"{where}: expected an array of shape {want.shape}, got "
              f"{type(got).__name__}{'' if a is None else f' of shape {a.shape}'}", "compute with NumPy on the whole arrays")
    if np.allclose(a, want, rtol=1e-9, atol=1e-12, equal_nan=True):
        return
    for wrong, why in hints:
        if np.allclose(a, wrong, rtol=1e-9, atol=1e-12, equal_nan=True):
            hint = why
            break
    _fail(ex, f"{where}:\n  yours:    {np.array2string(a, precision=4)}\n  expected: {np.array2string(want, precision=4)}", hint)


def karp_flatt(fn) -> None:
    """Exercise (lab 11): ``fn(p, s) -> e``, the Karp-Flatt metric e = (1/S - 1/p) / (1 - 1/p) for arrays of worker
    counts p > 1 and measured speedups S, the serial fraction that would explain each measurement by Amdahl's law."""
    ex = "Karp-Flatt metric"
    cases = [(np.array([2.0, 4.0, 8.0]), np.array([1.8, 3.1, 4.4])),
             (np.array([2.0, 3.0]), np.array([2.0, 3.0])),  # ideal: no serial work
             (np.array([2.0, 4.0, 16.0]), np.array([1.0, 1.0, 1.0])),  # no speedup at all: all serial
             (np.array([2.0, 4.0]), np.array([0.8, 0.5]))]  # slower than serial: overhead, e > 1
    for p, s in cases:
        where = f"p = {p.tolist()}, S = {s.tolist()}"
        got = _call(ex, fn, p.copy(), s.copy())
        want = (1 / s - 1 / p) / (1 - 1 / p)
        _compare_series(ex, where, got, want, [
            (1 / s - 1 / p, "divide by (1 - 1/p): without it the metric is not a fraction of the work"),
            ((1 / p - 1 / s) / (1 - 1 / p), "1/S comes first: e = (1/S - 1/p) / (1 - 1/p)"),
            ((s - p) / (1 - p), "use the reciprocals 1/S and 1/p, not S and p"),
        ], "start from Amdahl's 1/S = e + (1 - e)/p and solve for e")
    _passed(ex, len(cases))


def scaled_speedup(fn) -> None:
    """Exercise (lab 11): ``fn(t_one_rank, t_p_ranks) -> S``, Gustafson's scaled speedup from weak scaling: for each
    rank count, the time one rank needs for the scaled problem divided by the time p ranks need for it."""
    ex = "scaled speedup"
    cases = [(np.array([1.0, 1.9, 3.7]), np.array([1.0, 1.0, 1.0])),
             (np.array([2.0, 3.8, 7.4, 14.2]), np.array([2.0, 2.1, 2.2, 2.6])),
             (np.array([0.5]), np.array([0.5]))]
    for t1, tp in cases:
        where = f"t_one_rank = {t1.tolist()}, t_p_ranks = {tp.tolist()}"
        got = _call(ex, fn, t1.copy(), tp.copy())
        want = t1 / tp
        p = np.arange(1, len(t1) + 1, dtype=float)
        _compare_series(ex, where, got, want, [
            (tp / t1, "speedup is the slow time over the fast one: one rank's time / p ranks' time"),
            (t1[0] / tp, "that is the strong-scaling speedup T1/Tp of the smallest problem: in weak scaling each p "
                         "runs a p-times larger problem, so compare with one rank on that same problem"),
            (want / p, "that is the efficiency; the scaled speedup is not divided by p"),
        ], "S_p = t_one_rank[i] / t_p_ranks[i], element by element")
    _passed(ex, len(cases))


# -- CUDA kernel exercises (labs 03 and 04): the student's .cu runs on the emulator in checked mode --

KERNEL_TODO = "YOUR CODE HERE"


def _load_student_kernel(ex: str, source: str, name: str, must_have: dict[str, str]):
    from . import kernels
    from .kernels.source import strip_comments

    if not isinstance(source, str):
        _fail(ex, f"expected the kernel's CUDA C source as a string, got {type(source).__name__}")
    if KERNEL_TODO in source:
        raise ExerciseError(f"{ex}: not written yet (the kernel still says {KERNEL_TODO})\nHint: write the kernel's body in "
                            "place of the comment, run the cell, then run this check again")
    try:
        mod = kernels.load(source, backend="emulator", checked=True)
    except kernels.KernelCompileError as e:
        _fail(ex, f"your kernel does not compile:\n{e}", "the first error is usually the one to fix; the line numbers are "
              "lines of your source")
    if name not in mod.kernel_names:
        _fail(ex, f"no kernel called {name!r} in your source (found {mod.kernel_names or 'none'})",
              f'declare it as extern "C" __global__ void {name}(...)')
    code = strip_comments(source)
    for needle, hint in must_have.items():
        if needle not in code:
            _fail(ex, f"your kernel does not use {needle}", hint)
    return mod.get_function(name)


def _run_student_kernel(ex: str, kernel, grid, block, args, hint: str) -> None:
    from . import kernels

    try:
        kernel(grid, block, args)
    except kernels.KernelError as e:
        _fail(ex, f"the emulator stopped your kernel: {e}", hint)
    except (TypeError, ValueError) as e:
        _fail(ex, f"your kernel's parameters do not fit the launch: {e}",
              "keep the signature given in the exercise: the check launches it with exactly those arguments")


def tiled_matmul(source: str, name: str = "matmul_tiled", tile: int = 16) -> None:
    """Lab 04: C = A B with tile x tile blocks staged in shared memory.

    Signature (const float* A, const float* B, float* C, int M, int N, int K); launched with block
    (tile, tile) and grid (ceil(N/tile), ceil(M/tile)).
    """
    ex = "tiled matmul"
    k = _load_student_kernel(ex, source, name, {
        "__shared__": "stage a tile of A and a tile of B in __shared__ arrays; without them this is the naive kernel",
        "__syncthreads": "wait with __syncthreads() after loading a tile (before using it) and after using it (before the "
                         "next load overwrites it)"})
    rng = np.random.default_rng(0)
    checks = 0
    for M, N, K in [(tile, tile, tile), (2 * tile, 3 * tile, 4 * tile), (1, 1, 1), (tile + 1, 2 * tile + 1, tile + 3),
                    (37, 5, 70)]:
        a = rng.standard_normal((M, K)).astype(np.float32)
        b = rng.standard_normal((K, N)).astype(np.float32)
        c = np.full((M, N), np.nan, np.float32)
        multiple = M % tile == 0 and N % tile == 0 and K % tile == 0
        hint = ("" if multiple else "this size is not a multiple of the tile: load 0.0 for elements outside A or B, keep every "
                "thread going through every __syncthreads(), and write C only where row < M and col < N")
        _run_student_kernel(ex, k, (-(-N // tile), -(-M // tile)), (tile, tile),
                            (a, b, c, np.int32(M), np.int32(N), np.int32(K)), hint)
        want = a @ b
        bad = ~np.isclose(c, want, rtol=1e-4, atol=1e-4)
        if bad.any():
            i, j = map(int, np.argwhere(bad)[0])
            unwritten = np.isnan(c).sum()
            _fail(ex, f"M={M}, N={N}, K={K}: C[{i}, {j}] is {float(c[i, j]):.6g} (yours) but should be {want[i, j]:.6g} (spec); "
                  f"{int(bad.sum())} of {c.size} entries wrong" + (f", {unwritten} never written" if unwritten else ""),
                  hint or "check the indices: row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x, "
                  "and the tile loads A[row][t + threadIdx.x], B[t + threadIdx.y][col]")
        checks += 1
    _passed(ex, checks)


def block_reduction(source: str, name: str = "block_sum", threads: int = 256) -> None:
    """Lab 04: *out += sum(x) with a shared-memory tree in each block and one atomicAdd per block;
    signature (const float* x, float* out, int n), launched with `threads` per block over a grid-stride loop."""
    ex = "block reduction"
    k = _load_student_kernel(ex, source, name, {
        "__shared__": "each block sums its values in a __shared__ array, halving the active threads each step",
        "atomicAdd": "finish with atomicAdd(out, block_total) from one thread of each block: blocks cannot see each other's "
                     "shared memory"})
    rng = np.random.default_rng(1)
    checks = 0
    for n, blocks in [(1, 1), (threads, 1), (threads + 1, 2), (10_000, 8), (100_003, 16)]:
        x = rng.random(n).astype(np.float32)
        out = np.zeros(1, np.float32)
        _run_student_kernel(ex, k, (blocks,), (threads,), (x, out, np.int32(n)),
                            "every thread must reach each __syncthreads() of the tree; guard the additions, not the barrier")
        want = float(x.sum(dtype=np.float64))
        if not np.isclose(out[0], want, rtol=1e-4):
            hint = "add the values of a grid-stride loop first: for (i = blockIdx.x * blockDim.x + threadIdx.x; i < n; " \
                   "i += gridDim.x * blockDim.x)"
            if n <= threads and blocks == 1 and out[0] == 0:
                hint = "nothing reached *out: thread 0 of each block must atomicAdd the block's total"
            elif np.isclose(out[0], want * threads, rtol=1e-3):
                hint = "every thread added the block's total: only thread 0 should call atomicAdd"
            _fail(ex, f"n={n} over {blocks} blocks of {threads}: the sum is {float(out[0]):.6g} (yours) "
                  f"but should be {want:.6g} (spec)", hint)
        checks += 1
    _passed(ex, checks)
