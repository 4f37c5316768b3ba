"""Checks of labs 01-02: the vectorised backward pass and the per-thread accumulator."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .. import mlp
from ..shards import shard_bounds
from . import capture
from .common import ExerciseError, call, compare_grads, fail, passed, problems, recorded
from .exercises import Exercise


@recorded
def backprop(fn) -> None:
    """Exercise (lab 01): ``fn(params, x, Y) -> grads``, vectorised backprop, sigmoid and quadratic cost."""
    ex = "vectorised backprop"
    fn = capture.student(fn, ex=ex)
    n = 0
    for k, (params, x, Y) in enumerate(problems(capture.seed(0))):
        before = [(W.copy(), b.copy()) for W, b in params]
        got = call(ex, fn, params, x, Y)
        if any(not np.array_equal(W, W0) or not np.array_equal(b, b0) for (W, b), (W0, b0) in zip(params, before)):
            fail(ex, f"problem {k + 1}: your function changed params", "compute gradients into new arrays; leave W and b alone")
        want = mlp.backprop(params, x, Y, "sigmoid", "quadratic")
        compare_grads(ex, got, want, x.shape[0], f"problem {k + 1} (sizes {mlp.sizes_of(params)}, batch {x.shape[0]})")
        n += 1
    passed(ex, n)


@recorded
def accumulate(fn) -> None:
    """Exercise (lab 02): ``fn(params, x, Y, acc) -> loss_sum`` adds per-sample gradients of rows x into ``acc``.

    The check runs it in several threads, each with its own accumulator, and reduces them at the end.
    """
    ex = "per-thread accumulator"
    fn = capture.student(fn, ex=ex)
    n = 0
    for k, (params, x, Y) in enumerate(problems(seed=capture.seed(1))):
        want_loss, want = mlp.loss_and_grads_per_sample(params, x, Y)
        batch = x.shape[0]
        want_sum = [(gW * batch, gb * batch) for gW, gb in want]
        # a single accumulator first: the plainest failure messages
        acc = mlp.zeros_like(params)
        loss_sum = call(ex, fn, params, x, Y, acc)
        where = f"problem {k + 1} (batch {batch}, one thread)"
        if all(not a.any() for pair in acc for a in pair):
            fail(ex, f"{where}: acc is still all zeros after your function returned",
                  "add into the arrays of acc in place, e.g. `acc_W += dW`; `acc_W = acc_W + dW` makes a new array")
        if batch > 1:
            _, last = mlp.loss_and_grads_per_sample(params, x[-1:], Y[-1:])
            if all(np.allclose(a, b) for (a, _), (b, _) in zip(acc, last)):
                fail(ex, f"{where}: acc holds only the last sample's gradient",
                      "add (+=) each sample's gradient; do not assign (=)")
        try:
            compare_grads(ex, acc, want_sum, 1, where)
        except ExerciseError as e:
            if all(np.allclose(a, b / batch) for (a, _), (b, _) in zip(acc, want_sum)):
                fail(ex, f"{where}: acc holds the mean, not the sum", "accumulate sums; the caller divides once at the end")
            raise e
        if not np.isclose(float(loss_sum), want_loss * batch, rtol=1e-6):
            fail(ex, f"{where}: returned loss {float(loss_sum):.6g}, expected the summed loss {want_loss * batch:.6g}")
        # then several threads, one accumulator each, reduced at the end
        shards = [(lo, hi) for lo, hi in shard_bounds(batch, 3) if hi > lo]
        accs = [mlp.zeros_like(params) for _ in shards]
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(fn, params, x[lo:hi], Y[lo:hi], a) for (lo, hi), a in zip(shards, accs)]
            losses = [f.result() for f in futures]
        total = [(sum(a[i][0] for a in accs), sum(a[i][1] for a in accs)) for i in range(len(params))]
        compare_grads(ex, total, want_sum, 1, f"problem {k + 1} (batch {batch}, 3 threads reduced)")
        if not np.isclose(sum(float(v) for v in losses), want_loss * batch, rtol=1e-6):
            fail(ex, f"problem {k + 1}: the threads' losses do not add up to the batch's summed loss")
        n += 2
    passed(ex, n)


_PER_SAMPLE = ("per_sample_sum", "_sample_forward", "_sample_output_error", "_sample_backward", "_times_act_prime")
_MLP = ("backprop", "loss_and_grads", "loss_and_grads_unchecked", "backprop_per_sample", "loss_and_grads_per_sample",
        "backprop_one", *_PER_SAMPLE)

EXERCISES = (
    Exercise("backprop", "01", "serial", references=tuple(f"labkit.mlp:{f}" for f in _MLP)),
    Exercise("accumulate", "02", "serial", references=(*(f"labkit.mlp:{f}" for f in _PER_SAMPLE),
                                                      "labkit.cpu_parallel:shard_sums", "labkit.cpu_parallel:ThreadedBackprop")),
)
