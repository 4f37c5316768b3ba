"""The checks of lab 09's exercises: the staleness of workers taking turns, gradient descent with a delay (both plain
functions), and the asynchronous worker of a sharded parameter server, run among labkit's masters on every MPI rank
(:func:`.common.collective_check`)."""

from __future__ import annotations

import re

import numpy as np

from .. import mlp, param_server
from ..shards import shard_bounds
from . import capture
from .common import (
    DIAGNOSED,
    ExerciseError,
    call,
    collective_check,
    compare_series,
    each_case,
    fail,
    not_written,
    passed,
    recorded,
)
from .exercises import Exercise

_PS_SIZES, _PS_LR, _PS_BATCH, _PS_EPOCHS = [6, 5, 3], 0.1, 5, 2

# the hint for a failed run, by a phrase of the parameter server's error message (the first that matches); a
# master's timeout is told apart first (:func:`_silent_workers_hint`)
_PS_HINTS = {
    "values with tag": "each message to master m is its slice of the gradient followed by one number, the version of "
                       "that slice you computed on: hi - lo + 1 values in all; its reply has the same layout",
    "is it receiving": "a master answers every gradient with its new slice and waits until that reply is received: at "
                       "every batch, receive (tag WEIGHTS) from every master before the next grad(x, Y)",
    "was computed on version": "the version you send with a slice is the one that came with the weights you computed "
                               "on: the reply's last entry, not a count of your own",
    "a mismatch of dtype": "NumPy gives a float32 slice with a float64 number appended the wider dtype, float64: make "
                           "each message of flat's dtype, the dtype the masters receive",
    "unexpected message": "masters are ranks 0 .. len(bounds) - 1; gradients go there with tag param_server.GRAD",
    "waited": "every Isend and Irecv must be matched: one gradient to and one reply from each master per batch",
}
_DEADLOCK = ("a master sends weights only in answer to a gradient. Your worker waited for weights before it had sent "
             "its gradient, while the master waited for that gradient: a deadlock. What must each master have from "
             "you before it can answer?")
_NO_DONE = ("every gradient arrived, and then the masters waited: a master stops only once every worker has sent it an "
            "empty message with tag DONE, after its last batch")
_SILENT = re.compile(r"no message from workers \[([\d, ]*)\].*?they sent \[([\d, ]*)\] gradients")


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
    steps_each = [_PS_EPOCHS * -(-(hi - lo) // _PS_BATCH) for lo, hi in shard_bounds(len(data[0]), workers)]
    try:
        res = capture.step("train", lambda: param_server.train(
            sub, _PS_SIZES, data, masters=masters, mode="async", epochs=_PS_EPOCHS, batch_size=_PS_BATCH, lr=_PS_LR,
            seed=capture.seed(k), timeout=timeout, dtype=dtype, worker=fn), key=f"{k},{masters},{dtype}")
    except param_server.ParameterServerError as e:
        return _failed_run_error(str(e), where, ex, masters, steps_each)
    if sub.Get_rank() != 0:
        return None
    error = _update_counts_error(res, steps_each, where, ex)
    if error is None and workers == 1:
        error = _not_serial_error(res, data, capture.seed(k), steps_each[0], where, ex, dtype)
    return error


def _failed_run_error(msg, where, ex, masters=1, steps_each=()) -> str:
    """The message for a training run that failed, with the hint its error calls for."""
    if "NotImplementedError" in msg:
        return not_written(ex)
    hint = _silent_workers_hint(msg, masters, steps_each) or next((h for key, h in _PS_HINTS.items() if key in msg), "")
    return f"{ex} ({where}): {msg}" + (f"\nHint: {hint}" if hint else "")


def _silent_workers_hint(msg, masters, steps_each) -> str:
    """A master that heard nothing for its timeout: the workers sent every gradient but no DONE, or they stopped
    short of their batches (none sent at all: waiting for weights before sending, a deadlock); "" for anything else."""
    m = _SILENT.search(msg)
    if m is None:
        return ""
    ranks, sent = ([int(v) for v in g.split(",") if v.strip()] for g in m.groups())
    if not ranks or len(ranks) != len(sent) or any(not 0 <= r - masters < len(steps_each) for r in ranks):
        return ""
    if all(n >= steps_each[r - masters] for r, n in zip(ranks, sent)):
        return _NO_DONE
    if any(n == 0 for n in sent):
        return _DEADLOCK
    r, n = next((r, n) for r, n in zip(ranks, sent) if n < steps_each[r - masters])
    return (f"worker {r} sent {n} of its {steps_each[r - masters]} gradients and then went silent: it waits for "
            "something no master sends (a master sends only in answer to a gradient), or its loop ended early "
            "without DONE")


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
                    f"SGD over the same batches by up to {np.abs(a - c).max():.3g}\nHint: the network's arrays "
                    "are views into flat, so grad(x, Y) sees only what is written into that very array: put each "
                    "reply's slice into flat in place before the next grad(x, Y) (a new array bound to the name "
                    "flat leaves the network on its old weights)")
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
    # one worker last: there the master's version and the version a gradient was computed on are equal, so a slip
    # that returns either one could not be told from the other
    cases = [(w, u) for w in (*range(2, 7), 1) for u in sorted({0, 1, w, 3 * w + 2})]
    cases.append((drawn, int(rng.integers(4 * drawn + 4))))
    n = 0
    for workers, updates in each_case(cases):
        want = param_server.round_robin_staleness(workers, updates).astype(float)
        got = call(ex, fn, workers, updates, hint="")  # what it raised, then the derivation's next step
        k = np.arange(updates)
        compare_series(ex, f"{workers} workers, {updates} updates", got, want, [
            (np.full(updates, workers - 1.0), "the first round is different: the k-th of the first W updates was "
                                              "computed on version 0, so its staleness is k"),
            (np.minimum(k, workers).astype(float), "one too many: a worker receives the weights *after* its own "
                                                   "update, so its own update is not stale"),
            (k.astype(float), "that is the master's version alone: the staleness is it minus the version the "
                              "gradient was computed on"),
            (np.where(k < workers, 0.0, k - workers + 1.0), "that is the version the gradient was computed on; "
                                                             "the staleness is the master's version minus it"),
        ])
        n += 1
    passed(ex, n)


@recorded
def delayed_descent(fn) -> None:
    """Lab 09: ``fn(step, delay, iterations)``, the weights w_0 .. w_iterations of gradient descent on f(w) = h w^2 / 2
    (``step`` = eta h) whose every gradient is ``delay`` updates old, from w_0 = 1 (the weights before t = 0 were 1
    too). Checked for delays 0 to 4 and steps on both sides of the stable limit, a delay longer than the whole run, and
    one case drawn afresh, to 1e-9."""
    ex = "delayed gradient descent"
    fn = capture.student(fn, "fn", ex)
    rng = np.random.default_rng(capture.seed(131))
    runs = ((0.3, 12), (1.5, 6), (0.05, 0), (0.9, 25))
    cases = [(0, step, it) for step, it in runs]
    cases.append((4, 0.5, 2))  # a delay longer than the run: every gradient it applies was computed before t = 0
    cases += [(d, step, it) for d in range(1, 5) for step, it in runs]
    cases.append((int(rng.integers(7)), round(float(rng.uniform(0.05, 1.6)), 3), int(rng.integers(1, 31))))
    n = 0
    for delay, step, iterations in each_case(cases):
        where = f"step {step}, delay {delay}, {iterations} iterations"
        want = param_server.delayed_descent(step, delay, iterations)
        got = _descent_of(ex, fn, where, step, delay, iterations)
        _one_value_short(ex, where, got, want)
        hints = [(_zero_before(step, delay, iterations),
                  "your first steps, whose gradients were computed before t = 0, did not move w: you took the weights "
                  "there as 0. Before the start they were 1 (nothing had moved them yet), so each of those steps "
                  "subtracts step times 1"),
                 (param_server.delayed_descent(step, 0, iterations), "no delay at all: each of your steps used the "
                                                                      "gradient of the newest w, not one delay updates old")]
        if delay < 4:
            hints.append((param_server.delayed_descent(step, delay + 1, iterations),
                          "one step too old: with delay 0 a step uses the gradient of the newest w, with delay 1 the "
                          "one before it; count the delay from there"))
        compare_series(ex, where, got, want, hints)
        n += 1
    passed(ex, n)


_NEGATIVE_INDEX = ("for t < delay, t - delay is negative, and a negative index counts from the end of a sequence "
                   "(before its start it raises IndexError): the weights before t = 0 are in no entry of your array. "
                   "They were 1")
_PAST_THE_END = "the series w_0 .. w_iterations holds iterations + 1 values: is your array that long?"


def _descent_of(ex, fn, where, step, delay, iterations):
    """The student's series; an IndexError named by the index it reports: a negative one (t - delay read before
    t = delay), or one past the end of a series too short."""
    try:
        return call(ex, fn, step, delay, iterations, where=where, hint="")
    except ExerciseError as e:
        said = str(e)
        m = re.search(r"raised IndexError: (.*)", said)
        if m is None or DIAGNOSED in said:
            raise
        index = re.search(r"index (-?\d+) is out of bounds", m.group(1))
        hint = _NEGATIVE_INDEX if index is None or int(index.group(1)) < 0 else _PAST_THE_END
        raise ExerciseError(f"{said}\nHint: {hint}") from None


def _one_value_short(ex, where, got, want) -> None:
    """A series one value short that is the right one without w_0, or without its last value: named as such."""
    try:
        a = np.asarray(got, dtype=float)
    except (TypeError, ValueError):
        return
    if a.ndim != 1 or a.size != want.size - 1 or a.size == 0:
        return
    same = lambda b: np.allclose(a, b, rtol=1e-9, atol=1e-12, equal_nan=True)  # noqa: E731
    if same(want[1:]):
        fail(ex, f"{where}: yours is w_1 .. w_{want.size - 1}, without w_0",
             "the series starts with w_0 = 1, before any step: iterations + 1 values in all")
    if same(want[:-1]):
        fail(ex, f"{where}: yours stops at w_{want.size - 2}, one step short of w_{want.size - 1}",
             "each of the iterations steps gives one more w: the last one is w_iterations")


def _zero_before(step, delay, iterations):
    """Delayed descent with the weights before t = 0 taken as 0 rather than 1: the first ``delay`` steps leave w alone.
    (Reading w[t - delay] from an array of zeros computed so far gives the same values, where its index wraps around
    to entries not yet computed; where it falls before the array's start it raises IndexError, which is named as
    such: the case with a delay longer than the run, checked before the others with a delay, tells the two apart.)"""
    w = np.ones(iterations + 1)
    for t in range(iterations):
        w[t + 1] = w[t] - step * (w[t - delay] if t >= delay else 0.0)
    return w


EXERCISES = (
    Exercise("round_robin_staleness", "09",
             references=("labkit.param_server:round_robin_staleness",), hints=(
                 "Keep, for every worker, the version of the weights it holds (all start at version 0), and the "
                 "master's version: the number of updates it has applied so far.",
                 "The k-th update, counting from 0, comes from worker k mod W. Its staleness compares two versions at "
                 "that moment: which two? And which version does that worker hold once the master has answered it?",
                 "A small case by hand, W = 2. Update 0 comes from worker 0, which holds version 0 while the master is "
                 "at 0: staleness 0; the answer gives worker 0 version 1. Update 1 comes from worker 1, which holds 0 "
                 "while the master is at 1: staleness 1. Work out updates 2, 3 and 4 the same way: does your function "
                 "give the same five numbers?",
             )),
    Exercise("delayed_descent", "09",
             references=("labkit.param_server:delayed_descent",), hints=(
                 "Keep every w_t in an array of iterations + 1 values, w_0 = 1 first, and fill it one step at a time: "
                 "step t (t = 0, 1, ...) computes w_(t+1) from w_t.",
                 "The gradient of f at w is h w. Step t applies a gradient computed delay updates before it: on which "
                 "w_s, and what is w_(t+1) then, with step = eta h? For delay 0 it must be plain gradient descent.",
                 "A small case by hand: step 0.5, delay 2. Step 0's gradient was computed at s = -2, before the start, "
                 "where w was 1: w_1 = 1 - 0.5 * 1 = 0.5. Step 1 (s = -1) gives w_2 = 0.5 - 0.5 * 1 = 0. What do "
                 "steps 2 and 3 give, and does your function agree for 4 iterations?",
             )),
    Exercise("async_worker", "09", mpi=True,
             references=("labkit.param_server:worker_loop", "labkit.param_server:_worker"), hints=(
                 "Take one batch and one master first. The master speaks only when spoken to: it answers a gradient "
                 "with its new slice. What must your worker send first, and what must it have back before the next "
                 "grad(x, Y)?",
                 "With several masters, each gets its own slice of the gradient and answers on its own. Start every "
                 "send and every receive of a batch without waiting in between, then wait once for them all. Which "
                 "version goes with the slice for master m, and where does it come from after the first batch?",
                 "A small case by hand: one master that owns all of flat, bounds = [(0, n)], and two batches. Batch "
                 "1 sends the gradient with 0 appended, and the reply is n new weights with 1 appended. Before batch "
                 "2's grad(x, Y), where must those n weights be for the network to use them, and what number goes "
                 "with batch 2's gradient? After batch 2, the master is still listening: for what?",
             )),
)
