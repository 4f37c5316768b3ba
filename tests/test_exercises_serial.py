"""The exercises of labs 01-02 (labkit.check.serial): their answers for the contract every exercise keeps
(``CONTRACT``, tests/test_contract.py: right, blank, hints, replay, labkit's own), and the typical wrong ones, each
named by the check's message."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import Answers, Reference, blank, record_check

from labkit import check, cpu_parallel, mlp
from labkit.check import ExerciseError
from labkit.check.exercises import exercise
from labkit.grading import replay
from labkit.shards import shard_bounds

# ---- right answers, as a student would write them ---------------------------------------------------------------

def right_output_error(A, Y):
    return (A - Y) * A * (1 - A)


def right_layer_backward(delta, A_in, W):
    return delta.T @ A_in, delta.sum(axis=0), delta @ W


def right_backprop(params, x, Y):  # built from the two functions above, as lab 01 suggests
    acts = [x]
    for W, b in params:
        acts.append(mlp.sigmoid(acts[-1] @ W.T + b))
    delta = right_output_error(acts[-1], Y) / x.shape[0]
    grads = [None] * len(params)
    for i in range(len(params) - 1, -1, -1):
        dW, db, dA = right_layer_backward(delta, acts[i], params[i][0])
        grads[i] = (dW, db)
        delta = dA * acts[i] * (1 - acts[i])
    return grads


def right_numerical_grad(f, W, eps):
    G = np.zeros(W.shape)
    for idx in np.ndindex(W.shape):
        W[idx] += eps
        up = f()
        W[idx] -= 2 * eps
        down = f()
        W[idx] += eps  # back where it was, up to rounding
        G[idx] = (up - down) / (2 * eps)
    return G


def right_split(n, k):
    base, extra = divmod(n, k)
    out, start = [], 0
    for i in range(k):
        stop = start + base + (i < extra)
        out.append((start, stop))
        start = stop
    return out


def right_accumulate(params, x, Y, acc):
    total = 0.0
    for k in range(len(x)):
        loss, g = mlp.loss_and_grads_per_sample(params, x[k:k + 1], Y[k:k + 1])
        total += loss
        for (aW, ab), (gW, gb) in zip(acc, g):
            aW += gW
            ab += gb
    return total


def right_combine(grads, counts):
    n = sum(counts)
    out = [(np.zeros_like(W), np.zeros_like(b)) for W, b in grads[0]]
    for g, c in zip(grads, counts):
        if c:
            for (oW, ob), (gW, gb) in zip(out, g):
                oW += gW * c / n
                ob += gb * c / n
    return out


def _threaded(params, x, Y, p, divide="n", loss_divide="n", shared=False, join=True, in_caller=False,
              join_each=False, accumulate=right_accumulate, split=right_split, dtype=None):
    """Lab 02's fourth exercise as the notebook's solution writes it (threading.Thread, your my_split and accumulate),
    or with one of the typical mistakes; ``dtype`` makes the accumulators from their shapes in that dtype."""
    n = x.shape[0]
    shards = split(n, p)

    def zeros(a):
        return np.zeros_like(a) if dtype is None else np.zeros(a.shape, dtype=dtype)

    one = [(zeros(W), zeros(b)) for W, b in params]
    accs = [one] * p if shared else [[(zeros(W), zeros(b)) for W, b in params] for _ in shards]
    losses = [0.0] * len(shards)

    def work(i, lo, hi):
        losses[i] = accumulate(params, x[lo:hi], Y[lo:hi], accs[i])
        if divide == "shard":  # each thread's mean over its shard (an empty one: 0 / 0)
            losses[i] /= hi - lo
            for aW, ab in accs[i]:
                aW /= hi - lo
                ab /= hi - lo

    if in_caller:
        for i, (lo, hi) in enumerate(shards):
            work(i, lo, hi)
    else:
        threads = [threading.Thread(target=work, args=(i, lo, hi)) for i, (lo, hi) in enumerate(shards)]
        for t in threads:
            t.start()
            if join_each:
                t.join()
        for t in threads if join else ():
            t.join()
    added = accs[:1] if shared else accs
    by = {"n": n, "p": p, "none": 1, "shard": len([s for s in shards if s[1] > s[0]])}
    d, ld = by[divide], by["shard" if divide == "shard" else loss_divide]
    return sum(losses) / ld, [(sum(a[i][0] for a in added) / d, sum(a[i][1] for a in added) / d)
                              for i in range(len(params))]


def right_threaded(params, x, Y, p):
    return _threaded(params, x, Y, p)


def right_threaded_pool(params, x, Y, p):
    """The same with a ThreadPoolExecutor: each future gives back its shard's summed loss."""
    n = x.shape[0]
    accs = [mlp.zeros_like(params) for _ in range(p)]
    with ThreadPoolExecutor(max_workers=p) as pool:
        futures = [pool.submit(right_accumulate, params, x[lo:hi], Y[lo:hi], acc)
                   for (lo, hi), acc in zip(right_split(n, p), accs)]
        loss = sum(f.result() for f in futures) / n
    return loss, [(sum(a[i][0] for a in accs) / n, sum(a[i][1] for a in accs) / n) for i in range(len(params))]


# ---- the typical mistakes, each named -----------------------------------------------------------------------------

def _sig(a):
    return 0.5 * (np.tanh(0.5 * a) + 1)


@pytest.mark.parametrize("wrong, match", [
    (lambda A, Y: A - Y, r"sigma'\(z\) is missing"),
    (lambda A, Y: (Y - A) * A * (1 - A), "sign is flipped"),
    (lambda A, Y: (A - Y) * _sig(A) * (1 - _sig(A)), "applied sigma to a again"),
    (lambda A, Y: (A - Y) * A, "not a alone"),
    (lambda A, Y: (A - Y) * A * (1 - A) / len(A), "divided by the batch size"),
    (lambda A, Y: ((A - Y) * A * (1 - A)).T, "transposed"),
    (lambda A, Y: ((A - Y) * A * (1 - A)).sum(axis=0), r"has shape \(3,\), expected \(1, 3\)|has shape"),
])
def test_output_error_mistakes_are_named(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.output_error(wrong)


def test_output_error_that_changes_its_input_is_named():
    def in_place(A, Y):
        A -= Y
        return A * 0
    with pytest.raises(ExerciseError, match="changed A or Y"):
        check.output_error(in_place)


@pytest.mark.parametrize("wrong, match", [
    (lambda d, A, W: (A.T @ d, d.sum(axis=0), d @ W), "dW is transposed"),
    (lambda d, A, W: (d.T @ A / len(d), d.sum(axis=0), d @ W), "dW is the mean over the batch"),
    (lambda d, A, W: (d.T @ A, d, d @ W), "db is not summed over the batch"),
    (lambda d, A, W: (d.T @ A, d.mean(axis=0), d @ W), "db is the mean over the batch"),
    (lambda d, A, W: (d.T @ A, d.sum(axis=1), d @ W), "summed over the wrong axis"),
    (lambda d, A, W: (d.T @ A, d.sum(axis=0), d @ W.T), "went through W transposed"),
    (lambda d, A, W: (d.T @ A, d.sum(axis=0), d @ W * A * (1 - A)), "multiplied by sigma' of A_in"),
    (lambda d, A, W: (d.T @ A, d.sum(axis=0)), "expected three arrays"),
])
def test_layer_backward_mistakes_are_named(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.layer_backward(wrong)


def _backprop_with(params, x, Y, output_prime=True, hidden_prime=True, back_T=False, dW_T=False, mean=True):
    acts = [x]
    for W, b in params:
        acts.append(mlp.sigmoid(acts[-1] @ W.T + b))
    out = acts[-1]
    delta = (out - Y) * (out * (1 - out) if output_prime else 1) / (x.shape[0] if mean else 1)
    grads = [None] * len(params)
    for i in range(len(params) - 1, -1, -1):
        grads[i] = ((acts[i].T @ delta) if dW_T else (delta.T @ acts[i]), delta.sum(axis=0))
        if i:
            W = params[i][0]
            delta = (delta @ (W.T if back_T else W)) * (acts[i] * (1 - acts[i]) if hidden_prime else 1)
    return grads


@pytest.mark.parametrize("kw, match", [
    ({"output_prime": False}, r"output error lacks sigma'\(z\)"),
    ({"hidden_prime": False}, "lacks that layer's sigma'"),
    ({"back_T": True}, "went back through W transposed|shape"),
    ({"dW_T": True}, "transposed"),
    ({"mean": False}, "batch size"),
])
def test_backprop_mistakes_are_named(kw, match):
    with pytest.raises(ExerciseError, match=match):
        check.backprop(lambda p, x, Y: _backprop_with(p, x, Y, **kw))


def test_backprop_transposed_back_pass_is_named_on_square_layers():
    """On [5, 4, 3] W^T does not fit (the student's function raises); the square problem names the mistake."""
    def back_T_where_it_fits(params, x, Y):
        if any(W.shape[0] != W.shape[1] for W, _ in params[1:]):
            return mlp.backprop(params, x, Y)
        return _backprop_with(params, x, Y, back_T=True)
    with pytest.raises(ExerciseError, match="went back through W transposed"):
        check.backprop(back_T_where_it_fits)


def _numerical_with(f, W, eps, forward=False, step=2, restore=True, on_copy=False):
    G = np.zeros(W.shape)
    for idx in np.ndindex(W.shape):
        V = W.copy() if on_copy else W
        old = V[idx]
        V[idx] = old + eps
        up = f()
        V[idx] = old if forward else old - eps
        down = f()
        if restore:
            V[idx] = old
        G[idx] = (up - down) / (step * eps if not forward else eps)
    return G


@pytest.mark.parametrize("kw, match", [
    ({"forward": True}, "a one-sided difference"),
    ({"step": 1}, "twice too large"),
    ({"restore": False}, "W was left changed"),
    ({"on_copy": True}, "all zeros"),
])
def test_numerical_gradient_mistakes_are_named(kw, match):
    with pytest.raises(ExerciseError, match=match):
        check.numerical_gradient(lambda f, W, eps: _numerical_with(f, W, eps, **kw))


def test_numerical_gradient_of_the_wrong_shape_is_named():
    with pytest.raises(ExerciseError, match="needs W's shape"):
        check.numerical_gradient(lambda f, W, eps: right_numerical_grad(f, W, eps).ravel()[:, None])


def _split_floor_only(n, k):
    return [(i * (n // k), (i + 1) * (n // k)) for i in range(k)]


def _split_last_takes_rest(n, k):
    b = n // k
    return [(i * b, (i + 1) * b if i < k - 1 else n) for i in range(k)]


def _split_ceil(n, k):
    c = -(-n // k)
    return [(min(i * c, n), min((i + 1) * c, n)) for i in range(k)]


def _split_longer_last(n, k):
    sizes = [len(range(n)[i::k]) for i in range(k)][::-1]
    starts = np.cumsum([0] + sizes[:-1])
    return [(int(s), int(s + z)) for s, z in zip(starts, sizes)]


def _split_skips_empty(n, k):
    return [(a, b) for a, b in right_split(n, k) if b > a]


@pytest.mark.parametrize("wrong, match", [
    (_split_floor_only, "the last shard loses the remainder"),
    (_split_last_takes_rest, "the last shard takes the whole remainder"),
    (_split_ceil, "ceil"),
    (_split_longer_last, "the longer shards come last"),
    (_split_skips_empty, "some shards are empty; return all k pairs"),
    (lambda n, k: [(i * n / k, (i + 1) * n / k) for i in range(k)], "whole numbers"),
    (lambda n, k: [(a, b + 1 if b < n else b) for a, b in right_split(n, k)], "no gap and no overlap"),
])
def test_split_batch_mistakes_are_named(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.split_batch(wrong)


def _combine_with(grads, counts, weights):
    out = [(np.zeros_like(W), np.zeros_like(b)) for W, b in grads[0]]
    for g, c in zip(grads, counts):
        if c:
            w = weights(c, counts, len(grads))
            for (oW, ob), (gW, gb) in zip(out, g):
                oW += w * gW
                ob += w * gb
    return out


def _nan_in(grads, counts):
    n = sum(counts)
    out = [(np.zeros_like(W), np.zeros_like(b)) for W, b in grads[0]]
    for g, c in zip(grads, counts):
        for (oW, ob), (gW, gb) in zip(out, g):
            oW += gW * c / n
            ob += gb * c / n
    return out


def _in_place(grads, counts):
    n = sum(counts)
    for g, c in zip(grads, counts):
        for gW, gb in g:
            gW *= c / n
            gb *= c / n
    return right_combine(grads, [1 if c else 0 for c in counts])


@pytest.mark.parametrize("wrong, match", [
    (lambda g, c: _combine_with(g, c, lambda ci, cs, k: 1 / sum(1 for x in cs if x)), "a plain mean"),
    (lambda g, c: _combine_with(g, c, lambda ci, cs, k: ci), "not divided by the batch size"),
    (lambda g, c: _combine_with(g, c, lambda ci, cs, k: ci / k), "divided by the number of workers"),
    (lambda g, c: _combine_with(g, c, lambda ci, cs, k: 1), "the sum of the workers' means is no mean"),
    (_nan_in, "empty shard's gradient"),
    (_in_place, "changed the workers' gradients"),
])
def test_combine_shards_mistakes_are_named(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.combine_shards(wrong)


def _crashes_on_an_empty_shard(params, x, Y, p):
    """Each thread takes its shard's mean from labkit and scales it back to a sum: for an empty shard that raises."""
    n = x.shape[0]
    with ThreadPoolExecutor(max_workers=p) as pool:
        parts = list(pool.map(lambda s: mlp.loss_and_grads_per_sample(params, x[s[0]:s[1]], Y[s[0]:s[1]]),
                              right_split(n, p)))
    sizes = [hi - lo for lo, hi in right_split(n, p)]
    loss = sum(v * k for (v, _), k in zip(parts, sizes)) / n
    return loss, [(sum(g[i][0] * k for (_, g), k in zip(parts, sizes)) / n,
                   sum(g[i][1] * k for (_, g), k in zip(parts, sizes)) / n) for i in range(len(params))]


@pytest.mark.parametrize("kw, match", [
    ({"divide": "none", "loss_divide": "none"}, "the gradients are the batch's sums, not divided by n"),
    ({"divide": "p"}, "divided by p, the number of threads"),
    ({"divide": "shard"}, "a plain mean of the shards' means"),
    ({"loss_divide": "none"}, "the loss is the batch's summed loss"),
    ({"shared": True}, "several threads added their gradients into the same accumulator"),
    ({"join": False}, "started but not joined"),
    ({"in_caller": True}, "every gradient was computed in the calling thread"),
    ({"join_each": True}, "ran one after another, never two at a time"),
])
def test_threaded_step_mistakes_are_named(kw, match):
    with pytest.raises(ExerciseError, match=match):
        check.threaded_step(lambda params, x, Y, p: _threaded(params, x, Y, p, **kw))


def _whole_batch(params, x, Y, p, keep="all"):
    """Every thread sums the whole batch into its own accumulator; all of them divided by n p, or the first one's
    kept: right values from threads that divide no work."""
    n = x.shape[0]
    accs, losses = [mlp.zeros_like(params) for _ in range(p)], [0.0] * p

    def work(i):
        losses[i] = right_accumulate(params, x, Y, accs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    kept, by = (accs, n * p) if keep == "all" else (accs[:1], n)
    return sum(losses[:len(kept)]) / by, [(sum(a[i][0] for a in kept) / by, sum(a[i][1] for a in kept) / by)
                                          for i in range(len(params))]


def _split_last_takes_rest_threads(n, k):
    base = n // k
    return [(i * base, (i + 1) * base if i < k - 1 else n) for i in range(k)]


def _split_overlapping(n, k):
    return [(lo, min(hi + 1, n)) for lo, hi in right_split(n, k)]


def _one_total(params, x, Y, p, store):
    """Every thread adds each sample's gradient into one total shared by all, with new arrays (no in-place +=): a race
    that a quiet machine's GIL almost always hides. ``store`` puts the sum back: into the list, or into the array."""
    n = x.shape[0]
    total, losses = [[np.zeros_like(W), np.zeros_like(b)] for W, b in params], [0.0] * p

    def work(i, lo, hi):
        for k in range(lo, hi):
            loss, g = mlp.loss_and_grads_per_sample(params, x[k:k + 1], Y[k:k + 1])
            losses[i] += loss
            for t, pair in zip(total, g):
                for j in (0, 1):
                    store(t, j, t[j] + pair[j])

    threads = [threading.Thread(target=work, args=(i, lo, hi)) for i, (lo, hi) in enumerate(right_split(n, p))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(losses) / n, [(t[0] / n, t[1] / n) for t in total]


def _rebinds(t, j, value):
    t[j] = value


def _copies_into(t, j, value):
    t[j][...] = value


_GUARD = threading.Lock()


def _under_a_lock(t, j, value):
    """The shared total guarded by a lock: right, but every addition waits for the others."""
    with _GUARD:
        t[j][...] = value


def _one_loss_total(params, x, Y, p, lock=None):
    """Gradients right, each thread into its own accumulators, but the losses added into one shared Python number
    (with a lock, or without one: a race the GIL almost always hides)."""
    n = x.shape[0]
    accs, total = [[(np.zeros_like(W), np.zeros_like(b)) for W, b in params] for _ in range(p)], [0.0]

    def work(i, lo, hi):
        for k in range(lo, hi):
            loss, g = mlp.loss_and_grads_per_sample(params, x[k:k + 1], Y[k:k + 1])
            with lock or contextlib.nullcontext():
                total[0] += loss
            for (aW, ab), (dW, db) in zip(accs[i], g):
                aW += dW
                ab += db

    threads = [threading.Thread(target=work, args=(i, lo, hi)) for i, (lo, hi) in enumerate(right_split(n, p))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return total[0] / n, [(sum(a[i][0] for a in accs) / n, sum(a[i][1] for a in accs) / n) for i in range(len(params))]


def _totals_in_threads(params, x, Y, p, lock=None):
    """Each thread sums into accumulators of its own, then, as it finishes, adds them into one shared total itself
    (without a lock, or with one): the values come out right, since the GIL almost always keeps the sums."""
    n = x.shape[0]
    total, losses = [[np.zeros_like(W), np.zeros_like(b)] for W, b in params], [0.0] * p

    def work(i, lo, hi):
        acc = [[np.zeros_like(W), np.zeros_like(b)] for W, b in params]
        for k in range(lo, hi):
            loss, g = mlp.loss_and_grads_per_sample(params, x[k:k + 1], Y[k:k + 1])
            losses[i] += loss
            for a, (dW, db) in zip(acc, g):
                a[0] += dW
                a[1] += db
        with lock or contextlib.nullcontext():
            for t, a in zip(total, acc):
                t[0] += a[0]
                t[1] += a[1]

    threads = [threading.Thread(target=work, args=(i, lo, hi)) for i, (lo, hi) in enumerate(right_split(n, p))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(losses) / n, [(W / n, b / n) for W, b in total]


@pytest.mark.parametrize("wrong, match", [
    (_one_loss_total, r"several threads added their losses into one shared total \(\d+ additions"),
    (_totals_in_threads, r"p = 2 threads: several threads added their accumulators into one shared total"),
    (lambda params, x, Y, p: _totals_in_threads(params, x, Y, p, threading.Lock()), "with one they take turns"),
    (lambda params, x, Y, p: _one_loss_total(params, x, Y, p, threading.Lock()), "with one the threads wait"),
    (_whole_batch, r"p = 2 threads: each of your 2 threads computed the gradients of all 8 samples: every thread worked "
                   "on the whole batch"),
    (lambda params, x, Y, p: _whole_batch(params, x, Y, p, keep="first"), "every thread worked on the whole batch"),
    (lambda params, x, Y, p: _threaded(params, x, Y, p, split=_split_last_takes_rest_threads),
     r"p = 3 threads: your threads computed \[4, 2, 2\] samples each, where shards whose sizes differ by at most one "
     r"hold \[3, 3, 2\]"),
    (lambda params, x, Y, p: _threaded(params, x, Y, p, split=_split_overlapping),
     r"the gradients of 1 of the 8 samples \(rows 4\) were computed more than once: shards that overlap"),
    (lambda params, x, Y, p: _threaded(params, x, Y, p, split=_split_floor_only),
     r"batch of 13, p = 2 threads: the gradients of 1 of the 13 samples \(rows 12\) were never computed"),
    (lambda params, x, Y, p: _one_total(params, x, Y, p, _rebinds), "several threads added their gradients into the "
                                                                    "same accumulator arrays"),
    (lambda params, x, Y, p: _one_total(params, x, Y, p, _copies_into), "a race, even where the GIL happens to keep"),
    (lambda params, x, Y, p: _one_total(params, x, Y, p, _under_a_lock), "with one the threads wait for each other"),
    (lambda params, x, Y, p: _threaded(params, x, Y, p, dtype=np.float64),
     r"\[6, 5, 4\], batch of 9, p = 2 threads, layer 0: dW is float64, for parameters of float32(?s:.*)np.zeros\(shape\)"),
    (lambda params, x, Y, p: _threaded(params, x, Y, p, dtype=np.float32), "dW is float32, for parameters of float64"),
])
def test_threaded_step_names_what_each_thread_did_and_the_gradients_dtype(wrong, match):
    """Answers whose values can come out right, or nearly, and that passed before: threads that each take the whole
    batch, shards uneven, overlapping or short of the remainder, one total shared without a lock but written with new
    arrays, accumulators of the wrong dtype. The check sees which rows each thread computed and which arrays it read
    beside its gradients, and has a float32 network."""
    with pytest.raises(ExerciseError, match=match):
        check.threaded_step(wrong)


def test_threaded_step_passes_on_a_thread_pool_and_names_an_empty_shard_that_crashes(capsys):
    check.threaded_step(right_threaded_pool)
    assert "✔" in capsys.readouterr().out
    with pytest.raises(ExerciseError, match=r"raised ValueError: x holds no samples\nHint: with p = \d+ threads for "
                                            r"n = \d+ samples? some shards are empty"):
        check.threaded_step(_crashes_on_an_empty_shard)

    def in_threads(params, x, Y, p):  # the same on threading.Thread: the error stays in the thread
        def accumulate(params, x, Y, acc):
            return right_accumulate(params, x, Y, acc) if len(x) else mlp.loss_and_grads_per_sample(params, x, Y)
        return _threaded(params, x, Y, p, accumulate=accumulate)
    with pytest.raises(ExerciseError, match=r"of your threads raised ValueError: x holds no samples\nHint: with p"):
        check.threaded_step(in_threads)


def test_threaded_step_on_an_accumulate_not_written_yet_is_not_written_yet_and_gets_no_hint():
    with pytest.raises(ExerciseError, match="a thread raised NotImplementedError: .* not written yet") as e:
        check.threaded_step(lambda params, x, Y, p: _threaded(params, x, Y, p, accumulate=blank))
    assert "Step" not in str(e.value) and "Hint" not in str(e.value)


def test_threaded_step_has_at_least_four_hints_none_of_them_code():
    hints = exercise("threaded_step").hints
    assert len(hints) >= 4
    assert not any(code in h for h in hints for code in ("Thread(", ".start()", ".join()", " = ", "+=", "def "))


# ---- the contract's answers (tests/test_contract.py) -------------------------------------------------------------

def _labkits_sum(params, x, Y, acc):
    """accumulate on labkit's per-sample sums."""
    total, grads = mlp.per_sample_sum(params, x, Y, "sigmoid", "quadratic")
    for (aW, ab), (gW, gb) in zip(acc, grads):
        aW += gW
        ab += gb
    return total


CONTRACT = {
    "output_error": Answers(
        right_output_error, lambda A, Y: A - Y, passes="✔ output error: all 4 checks passed",
        references=(Reference(mlp.output_error, "labkit.mlp.output_error"),)),
    "layer_backward": Answers(
        right_layer_backward, lambda d, A, W: (A.T @ d, d.sum(axis=0), d @ W),
        passes="✔ one layer's backward pass: all 5 checks passed",
        references=(Reference(mlp.layer_backward, "labkit.mlp.layer_backward"),)),
    "backprop": Answers(
        right_backprop, lambda p, x, Y: _backprop_with(p, x, Y, output_prime=False),
        passes="✔ vectorised backprop: all 5 checks passed", references=(Reference(mlp.backprop, "labkit.mlp.backprop"),)),
    "numerical_gradient": Answers(
        right_numerical_grad, lambda f, W, eps: _numerical_with(f, W, eps, forward=True),
        passes="✔ numerical gradient: all 4 checks passed",
        references=(Reference(mlp.numerical_grad, "labkit.mlp.numerical_grad"),)),
    "split_batch": Answers(
        right_split, _split_floor_only, passes="✔ splitting a batch into shards: all 12 checks passed",
        references=(Reference(shard_bounds, "labkit.shards.shard_bounds"),)),
    "accumulate": Answers(
        right_accumulate, lambda p, x, Y, acc: right_accumulate(p, x, Y, acc) * 2,
        passes="✔ per-thread accumulator: all 6 checks passed",
        references=(Reference(_labkits_sum, "labkit.mlp.per_sample_sum"),)),
    "combine_shards": Answers(
        right_combine, lambda g, c: _combine_with(g, c, lambda ci, cs, k: ci),
        passes="✔ combining the workers' gradients: all 5 checks passed",
        references=(Reference(cpu_parallel.combine_means, "labkit.cpu_parallel.combine_means"),)),
    "threaded_step": Answers(
        right_threaded, lambda params, x, Y, p: _threaded(params, x, Y, p, divide="none", loss_divide="none"),
        passes="✔ a threaded step: all 13 checks passed",
        references=(Reference(cpu_parallel.threaded_grads, "labkit.cpu_parallel.threaded_grads"),)),
}


# ---- the grader's replay of the threads' record ----------------------------------------------------------------

SEED = 777


@pytest.mark.parametrize("kw", [{"in_caller": True}, {"join": False}, {"shared": True}, {"join_each": True},
                                {"split": _split_overlapping}, {"dtype": np.float64}])
def test_the_replay_gives_the_threaded_steps_verdict_on_its_threads_from_the_record(tmp_path, monkeypatch, kw):
    """What the threads did is seen in the student's process, kept in the record, and judged again by the grader."""
    plain = record_check(monkeypatch, tmp_path, "threaded_step", lambda params, x, Y, p: _threaded(params, x, Y, p, **kw),
                         SEED)
    assert plain[0] is False
    assert replay.replay("threaded_step", tmp_path, SEED) == (False, plain[1].split("\nStep ")[0])


# ---- labkit's own answers, the references ------------------------------------------------------------------------

def test_labkits_pieces_compose_into_its_backprop_and_agree_with_finite_differences():
    rng = np.random.default_rng(5)
    params = mlp.init_params([6, 5, 4, 3], seed=2, dtype=np.float64)
    x, Y = rng.random((7, 6)), mlp.targets(rng.integers(0, 3, 7), 3, np.float64)
    acts = mlp.forward(params, x)
    delta = mlp.output_error(acts[-1], Y) / len(x)
    for i in range(len(params) - 1, -1, -1):
        dW, db, dA = mlp.layer_backward(delta, acts[i], params[i][0])
        want = mlp.backprop(params, x, Y)[i]
        np.testing.assert_allclose(dW, want[0], rtol=1e-12)
        np.testing.assert_allclose(db, want[1], rtol=1e-12)
        delta = dA * acts[i] * (1 - acts[i])
    W = params[1][0]
    before = W.copy()
    numeric = mlp.numerical_grad(lambda: mlp.loss(params, x, Y), W, 1e-5)
    assert np.array_equal(W, before)
    np.testing.assert_allclose(numeric, mlp.backprop(params, x, Y)[1][0], atol=1e-9)


@pytest.mark.parametrize("sizes, n, p", [([5, 4, 3], 8, 3), ([7, 6, 5, 3], 3, 5), ([6, 5, 4], 1, 1)])
def test_threaded_grads_gives_the_serial_mean_loss_and_gradients(sizes, n, p):
    rng = np.random.default_rng(7)
    params = mlp.init_params(sizes, seed=3, dtype=np.float64)
    x, y = rng.random((n, sizes[0])), rng.integers(0, sizes[-1], n)
    loss, grads = cpu_parallel.threaded_grads(params, x, mlp.targets(y, sizes[-1], np.float64), p)
    want_loss, want = mlp.loss_and_grads_per_sample(params, x, y)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    for (gW, gb), (wW, wb) in zip(grads, want):
        np.testing.assert_allclose(gW, wW, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(gb, wb, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="at least one sample"):
        cpu_parallel.threaded_grads(params, x[:0], y[:0], 2)


def test_combine_means_leaves_out_empty_shards_and_refuses_an_empty_batch():
    rng = np.random.default_rng(6)
    params = mlp.init_params([4, 3, 2], dtype=np.float64)
    x, y = rng.random((3, 4)), rng.integers(0, 2, 3)
    bounds = shard_bounds(3, 5)
    nan = [(np.full_like(W, np.nan), np.full_like(b, np.nan)) for W, b in params]
    grads = [mlp.backprop(params, x[a:b], y[a:b]) if b > a else nan for a, b in bounds]
    got = cpu_parallel.combine_means(grads, [b - a for a, b in bounds])
    for (gW, gb), (wW, wb) in zip(got, mlp.backprop(params, x, y)):
        np.testing.assert_allclose(gW, wW, rtol=1e-12)
        np.testing.assert_allclose(gb, wb, rtol=1e-12)
    assert np.isnan(grads[-1][0][0]).all(), "the workers' arrays are left as they were"
    with pytest.raises(ValueError, match="no samples"):
        cpu_parallel.combine_means([nan], [0])
