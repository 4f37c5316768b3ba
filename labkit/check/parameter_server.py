"""The check of lab 09's exercise: the asynchronous worker of a sharded parameter server, run among labkit's masters
on every MPI rank (:func:`.mpi.collective_check`)."""

from __future__ import annotations

import numpy as np

from .. import mlp
from ..shards import shard_bounds
from . import capture
from .common import ExerciseError, not_written, recorded
from .exercises import Exercise
from .mpi import collective_check

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
    from .. import param_server

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
    from .. import param_server

    x, y = data
    params = mlp.init_params(_PS_SIZES, seed=seed, dtype=dtype, init="he")
    x, Y = np.asarray(x, dtype=dtype), mlp.targets(y, 3, dtype)
    for xb, Yb in param_server.worker_batches(x, Y, _PS_EPOCHS, _PS_BATCH, param_server.worker_seed(seed, 0)):
        _, g = mlp.loss_and_grads_unchecked(params, xb, Yb, "relu", "cross_entropy", 0.0)
        mlp.SGD(_PS_LR).step(params, g)
    return params


EXERCISES = (
    Exercise("async_worker", "09", "parameter_server", mpi=True,
             references=("labkit.param_server:worker_loop", "labkit.param_server:_worker")),
)
