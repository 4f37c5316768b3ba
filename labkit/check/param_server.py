"""The checks of lab 09's exercises: the staleness of workers taking turns, gradient descent with a delay (both plain
functions), and the asynchronous worker of a sharded parameter server, run among labkit's masters on every MPI rank
(:func:`.common.collective_check`)."""

from __future__ import annotations

import numpy as np

from .. import mlp, param_server
from ..shards import shard_bounds
from . import capture
from .common import ExerciseError, call, collective_check, compare_series, each_case, not_written, passed, recorded
from .exercises import Exercise

_PS_SIZES, _PS_LR, _PS_BATCH, _PS_EPOCHS = [6, 5, 3], 0.1, 5, 2

# the hint for a failed run, by a phrase of the parameter server's error message (the first that matches)
_PS_HINTS = {
    "values with tag": "each message to master m is g[lo:hi] followed by one number, the version: "
                       "np.append(g[lo:hi], versions[m]), length hi - lo + 1; the reply has the same layout",
    "never sent DONE": "after the last batch tell every master you are done: "
                       "comm.Send(np.empty(0, flat.dtype), dest=m, tag=param_server.DONE)",
    "is it receiving": "post comm.Irecv(reply, source=m, tag=param_server.WEIGHTS) for every master at every step, "
                       "and wait for all requests before the next batch",
    "was computed on version": "send back the version that came with the weights: the reply's last entry",
    "a mismatch of dtype": "np.append of a float32 slice and a float64 version gives float64: send the message "
                           "as flat's dtype (.astype(flat.dtype)), the dtype the masters receive",
    "unexpected message": "masters are ranks 0 .. len(bounds) - 1; gradients go there with tag param_server.GRAD",
    "waited": "every Isend and Irecv must be matched: one gradient to and one reply from each master per batch",
}


@recorded
def async_worker(fn, comm=None, timeout: float = 10.0) -> None:
    """Exercise (lab 09): ``fn(comm, grad, flat, bounds, batches, timeout)``, the asynchronous worker loop.

    Run as the workers of :func:`labkit.param_server.train` (labkit's masters) on 2..p ranks with 1..p-1
    masters, at float32 (the dtype the lab trains at) and at float64. With one worker nothing can be stale, so the
    weights must equal serial SGD over the same batches and every update must have staleness 0; with several, every
    gradient must reach every master.
    """
    from mpi4py import MPI

    comm = comm or MPI.COMM_WORLD
    ex = "asynchronous worker"
    fn = capture.watched(fn)  # it runs live among labkit's masters: the training run as a whole is recorded
    rng = np.random.default_rng(capture.seed(8))
    x, y = rng.random((23, 6)), rng.integers(0, 3, 23)

    def run(sub, k):
        for dtype in (np.float32, np.float64):
            for masters in range(1, k):
                yield lambda masters=masters, dtype=dtype: async_worker_case(fn, sub, k, masters, (x, y), timeout, ex,
                                                                             dtype)

    if comm.Get_size() < 2:
        raise ExerciseError(f"{ex}: needs at least 2 ranks (a master and a worker); start more engines")
    collective_check(comm, ex, run)


def async_worker_case(fn, sub, k, masters, data, timeout, ex, dtype=np.float64) -> str | None:
    """One training run on sub with ``masters`` of labkit's masters and the student's workers; returns what went
    wrong (or None, also on every rank but 0, which judges the run), never raises."""
    workers = k - masters
    dtype = np.dtype(dtype)
    where = f"{masters} master{'s' if masters > 1 else ''}, {workers} worker{'s' if workers > 1 else ''}, {dtype}"
    try:
        res = capture.step("train", lambda: param_server.train(
            sub, _PS_SIZES, data, masters=masters, mode="async", epochs=_PS_EPOCHS, batch_size=_PS_BATCH, lr=_PS_LR,
            seed=capture.seed(k), timeout=timeout, dtype=dtype, worker=fn), key=f"{k},{masters},{dtype}")
    except param_server.ParameterServerError as e:
        return _failed_run_error(str(e), where, ex)
    if sub.Get_rank() != 0:
        return None
    steps_each = [_PS_EPOCHS * -(-(hi - lo) // _PS_BATCH) for lo, hi in shard_bounds(len(data[0]), workers)]
    error = _update_counts_error(res, steps_each, where, ex)
    if error is None and workers == 1:
        error = _not_serial_error(res, data, capture.seed(k), steps_each[0], where, ex, dtype)
    return error


def _failed_run_error(msg, where, ex) -> str:
    """The message for a training run that failed, with the hint its error calls for."""
    if "NotImplementedError" in msg:
        return not_written(ex)
    hint = next((h for key, h in _PS_HINTS.items() if key in msg), "")
    return f"{ex} ({where}): {msg}" + (f"\nHint: {hint}" if hint else "")


def _update_counts_error(res, steps_each, where, ex) -> str | None:
    """Whether each worker backpropped every batch and each master applied every gradient; None when they did."""
    if res.worker_steps.tolist() != steps_each:
        return (f"{ex} ({where}): the workers backpropped {res.worker_steps.tolist()} batches, expected "
                f"{steps_each}\nHint: call grad(x, Y) once for every batch the iterator yields")
    if not (res.master_updates == sum(steps_each)).all():
        return (f"{ex} ({where}): the masters applied {res.master_updates.tolist()} updates, expected "
                f"{sum(steps_each)} each\nHint: send every master its slice after every batch")
    return None


def _not_serial_error(res, data, seed, steps, where, ex, dtype=np.float64) -> str | None:
    """With one worker: what differs from serial SGD over the same batches (staleness, then the weights), or None."""
    want = _serial_sgd(data, seed, dtype)
    tol = dict(rtol=1e-9, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-4, atol=1e-6)
    if (res.staleness != 0).any():
        return (f"{ex} ({where}): with one worker every gradient is computed on the newest weights, but "
                f"the masters saw staleness up to {res.staleness.max()}\nHint: {_PS_HINTS['was computed on version']}")
    for i, ((a, b), (c, d)) in enumerate(zip(res.params, want)):
        if not (np.allclose(a, c, **tol) and np.allclose(b, d, **tol)):
            return (f"{ex} ({where}): after {steps} steps the weights of layer {i} differ from serial "
                    f"SGD over the same batches by up to {np.abs(a - c).max():.3g}\nHint: copy each reply "
                    "into flat in place (flat[lo:hi] = reply[:-1]) before the next grad(x, Y): the gradient "
                    "must be computed on the weights the masters sent")
    return None


def _serial_sgd(data, seed, dtype=np.float64):
    """The weights of serial SGD over the batches a single worker sees: what one asynchronous worker must reach."""
    x, y = data
    params = mlp.init_params(_PS_SIZES, seed=seed, dtype=dtype, init="he")
    x, Y = np.asarray(x, dtype=dtype), mlp.targets(y, 3, dtype)
    for xb, Yb in param_server.worker_batches(x, Y, _PS_EPOCHS, _PS_BATCH, param_server.worker_seed(seed, 0)):
        _, g = mlp.loss_and_grads_unchecked(params, xb, Yb, "relu", "cross_entropy", 0.0)
        mlp.SGD(_PS_LR).step(params, g)
    return params


@recorded
def round_robin_staleness(fn) -> None:
    """Lab 09: ``fn(workers, updates)``, the staleness of each update when workers take turns at one asynchronous
    master, each computing on the weights it last received. Checked on 1 to 6 workers, 0 to 3 W + 2 updates, and
    one count of each drawn afresh."""
    ex = "staleness of workers taking turns"
    fn = capture.student(fn, "fn", ex)
    rng = np.random.default_rng(capture.seed(130))
    drawn = int(rng.integers(2, 10))
    cases = [(w, u) for w in range(1, 7) for u in sorted({0, 1, w, 3 * w + 2})]
    cases.append((drawn, int(rng.integers(4 * drawn + 4))))
    n = 0
    for workers, updates in each_case(cases):
        want = param_server.round_robin_staleness(workers, updates).astype(float)
        got = call(ex, fn, workers, updates)
        k = np.arange(updates)
        compare_series(ex, f"{workers} workers, {updates} updates", got, want, [
            (np.full(updates, workers - 1.0), "the first round is different: the k-th of the first W updates was "
                                              "computed on version 0, so its staleness is k"),
            (np.minimum(k, workers).astype(float), "one too many: a worker receives the weights *after* its own "
                                                   "update, so its own update is not stale"),
            (np.where(k < workers, 0.0, k - workers + 1.0), "that is the version the gradient was computed on; "
                                                             "the staleness is the master's version minus it"),
        ])
        n += 1
    passed(ex, n)


@recorded
def delayed_descent(fn) -> None:
    """Lab 09: ``fn(step, delay, iterations)``, w_{t+1} = w_t - step * w_{t-delay} from w = 1 for every t <= 0,
    returning w_0 .. w_iterations. Checked for delays 0 to 4 and steps on both sides of the stable limit, and one case
    drawn afresh, to 1e-9."""
    ex = "delayed gradient descent"
    fn = capture.student(fn, "fn", ex)
    rng = np.random.default_rng(capture.seed(131))
    cases = [(d, step, it) for d in range(5) for step, it in ((0.3, 12), (1.5, 6), (0.05, 0), (0.9, 25))]
    cases.append((int(rng.integers(7)), round(float(rng.uniform(0.05, 1.6)), 3), int(rng.integers(1, 31))))
    n = 0
    for delay, step, iterations in each_case(cases):
        want = param_server.delayed_descent(step, delay, iterations)
        got = call(ex, fn, step, delay, iterations)
        hints = [(_wrapped(step, delay, iterations), "for t < delay you read w[t - delay] with a negative index: "
                                                      "Python wraps around to the end of the array; before t = 0, "
                                                      "w is 1"),
                 (param_server.delayed_descent(step, 0, iterations), "no delay at all: the gradient uses w_t, "
                                                                      "not w_(t - delay)")]
        if delay < 4:
            hints.append((param_server.delayed_descent(step, delay + 1, iterations),
                          "one step too old: w_(t+1) uses w_(t - delay), which for delay 0 is w_t itself"))
        compare_series(ex, f"step {step}, delay {delay}, {iterations} iterations", got, want, hints)
        n += 1
    passed(ex, n)


def _wrapped(step, delay, iterations):
    """Delayed descent with the usual slip: w[t - delay] read before t = delay wraps to the array's end (zeros); None
    where a delay longer than the array makes that read fall before its start (the slip raises IndexError there,
    which the check names as it is)."""
    if iterations > 0 and delay > iterations + 1:
        return None
    w = np.zeros(iterations + 1)
    w[0] = 1.0
    for t in range(iterations):
        w[t + 1] = w[t] - step * w[t - delay]
    return w


EXERCISES = (
    Exercise("round_robin_staleness", "09", "param_server",
             references=("labkit.param_server:round_robin_staleness",), hints=(
                 "Keep, for every worker, the version of the weights it holds: all start at version 0.",
                 "Before the k-th update the master has applied k updates: its version is k. The k-th update comes "
                 "from worker k mod W.",
                 "The update's staleness is the master's version minus the version its worker held. Then that worker "
                 "receives the weights after the update: version k + 1.",
             )),
    Exercise("delayed_descent", "09", "param_server",
             references=("labkit.param_server:delayed_descent",), hints=(
                 "Keep every w_t in an array of iterations + 1 values, w_0 = 1 first.",
                 "Step t computes w_(t+1) from w_t and from the w that the delayed gradient saw, delay steps back.",
                 "Before t = 0 the weights were 1: for t < delay the old w is 1, not an entry of your array.",
             )),
    Exercise("async_worker", "09", "param_server", mpi=True,
             references=("labkit.param_server:worker_loop", "labkit.param_server:_worker"), hints=(
                 "Per batch: compute g = grad(x, Y) on the current flat, then talk to every master m in bounds.",
                 "To master m: its slice g[lo:hi] with the version of that slice you computed on appended, as one "
                 "message of flat's dtype (Isend, tag GRAD). From it: the same layout back (Irecv, tag WEIGHTS).",
                 "Wait for all requests with wait_all, then copy each reply's slice into flat in place and keep its "
                 "last entry as that slice's version. After the last batch, an empty message with tag DONE to each.",
             )),
)
