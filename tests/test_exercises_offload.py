"""Lab 04's exercises (labkit/check/offload.py): their answers for the contract every exercise keeps (``CONTRACT``,
tests/test_contract.py: right, blank, hints, replay, labkit's own), and each typical mistake, named by the check's
message. Also the lesson helpers of labkit.kernels.offload and labkit.kernels.streams that lab 04 calls."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import Answers, Reference, needs_cxx, record_check

from labkit import check, mlp
from labkit.check import ExerciseError
from labkit.check.exercises import in_lab
from labkit.kernels import offload, streams

# ---- the right answers, as a student would write them ----------------------------------------------------------------


def right_backward(xp, Ws, acts, delta):
    nabla = [None] * len(Ws)
    for i in range(len(Ws) - 1, -1, -1):
        nabla[i] = xp.dot(delta, acts[i].T)
        if i:
            delta = xp.dot(Ws[i].T, delta) * acts[i] * (1 - acts[i])
    return nabla


def right_time(n_out, n_in, costs, resident=False):
    floats = [n_out, n_in] if resident else [n_out * n_in, n_out, n_in]
    copies = sum(costs["copy"] + 4 * n / costs["bandwidth"] for n in floats)
    return copies + costs["launch"] + 2 * n_out * n_in / costs["throughput"]


def right_crossover(widths, host, copy, kernel):
    return first_of_last_run(widths, np.median(copy + kernel, axis=0) < np.median(host, axis=0))


def first_of_last_run(widths, wins):
    if not wins[-1]:
        return None
    first = len(widths) - 1
    while first > 0 and wins[first - 1]:
        first -= 1
    return widths[first]


def right_stream_time(copy, kernel, streams):
    n = len(copy)
    copy_end, kernel_end = np.zeros(n), np.zeros(n)
    for i in range(n):
        previous = kernel_end[i - 1] if i >= 1 else 0.0
        buffer_free = previous if streams == 1 else (kernel_end[i - 2] if i >= 2 else 0.0)
        copy_end[i] = max(copy_end[i - 1] if i else 0.0, buffer_free) + copy[i]
        kernel_end[i] = max(copy_end[i], previous) + kernel[i]
    return float(kernel_end[-1])


def right_batch_step(xp, params, x, Y, lr):
    acts = [x]
    for W, b in params:
        acts.append(1 / (1 + xp.exp(-(acts[-1] @ W.T + b))))
    a = acts[-1]
    delta = (a - Y) * a * (1 - a) / len(x)
    grads = []
    for i in range(len(params) - 1, -1, -1):
        grads.insert(0, (delta.T @ acts[i], delta.sum(axis=0)))
        if i:
            delta = delta @ params[i][0] * acts[i] * (1 - acts[i])
    for (W, b), (gW, gb) in zip(params, grads):
        W -= lr * gW
        b -= lr * gb
    return float(((a - Y) ** 2).sum()) / 2 / len(x)


def test_the_five_exercises_are_lab_04s_with_hints():
    for e in in_lab("04"):
        assert len(e.hints) >= 4 and e.module == "offload" and e.references


# ---- exercise 1: the backward pass on xp -----------------------------------------------------------------------------


def backward_with(outer="right", back="right", prime="right"):
    def fn(xp, Ws, acts, delta):
        nabla = [None] * len(Ws)
        for i in range(len(Ws) - 1, -1, -1):
            a = acts[i + 1] if outer == "output" else acts[i]
            nabla[i] = xp.dot(a, delta.T) if outer == "transposed" else xp.dot(delta, a.T)
            if i:
                sent = xp.dot(Ws[i], delta) if back == "W" else delta if back == "none" else xp.dot(Ws[i].T, delta)
                p = acts[i + 1] if prime == "next" else mlp.sigmoid(acts[i]) if prime == "sigma_of_a" else acts[i]
                delta = sent if prime == "none" else sent * p * (1 - p)
        return nabla
    return fn


def changes_delta(xp, Ws, acts, delta):
    nabla = right_backward(xp, Ws, acts, delta)
    delta *= 2
    return nabla


@pytest.mark.parametrize("wrong, match", [
    (backward_with(outer="transposed"), r"layer 2 \(the output layer\): nabla_W is transposed"),
    (backward_with(outer="output"), r"layer 2 \(the output layer\): nabla_W pairs delta with the activation that came OUT"),
    (backward_with(back="W"), r"layer 1 \(counting from 0 at the input\): delta went back through W, not W\^T"),
    (backward_with(back="none"), r"layer 1 .*: delta was not sent back"),
    (backward_with(prime="next"), r"layer 1 .*: you multiplied by sigma'\(z\) of the wrong layer"),
    (backward_with(prime="none"), r"layer 1 .*: the error sent back lost sigma'\(z\)"),
    (backward_with(prime="sigma_of_a"), r"a is sigma\(z\) already"),
    (changes_delta, "changed its inputs"),
    (lambda xp, Ws, acts, delta: right_backward(xp, Ws, acts, delta)[1:], "expected a list of 3 arrays"),
    (lambda xp, Ws, acts, delta: [g + 1e-3 for g in right_backward(xp, Ws, acts, delta)],
     r"layer 2 \(the output layer\): nabla_W differs from the reference by up to"),
    (lambda xp, Ws, acts, delta: 1 / 0, "your function raised ZeroDivisionError"),
])
def test_backward_mistakes_are_named(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.device_backward(wrong)


def backward_made_by(product, new=None):
    """The right backward pass with nabla_W = product(xp, delta, a_in), stored into new(W) when new is given."""
    def fn(xp, Ws, acts, delta):
        nabla = [None] * len(Ws)
        for i in range(len(Ws) - 1, -1, -1):
            nabla[i] = product(xp, delta, acts[i])
            if new is not None:
                made = new(xp, Ws[i])
                made[:] = nabla[i]
                nabla[i] = made
            if i:
                delta = xp.dot(Ws[i].T, delta) * acts[i] * (1 - acts[i])
        return nabla
    return fn


NUMPY_DIRECTLY = "your function calls NumPy directly where it should call xp"


@pytest.mark.parametrize("wrong, match", [
    (backward_made_by(lambda xp, d, a: np.dot(d, a.T)), f"np.dot was called on xp's arrays: {NUMPY_DIRECTLY}"),
    (backward_made_by(lambda xp, d, a: np.outer(d, a)), f"np.outer was called on xp's arrays: {NUMPY_DIRECTLY}"),
    (backward_made_by(lambda xp, d, a: np.matmul(d, a.T)), f"np.matmul was called on xp's arrays: {NUMPY_DIRECTLY}"),
    (backward_made_by(lambda xp, d, a: np.multiply(d, a.T)), "np.multiply was called on xp's arrays"),
    (backward_made_by(lambda xp, d, a: np.multiply(np.float64(1), d @ a.T)), "np.multiply was called on xp's arrays"),
    (backward_made_by(lambda xp, d, a: np.einsum("ik,jk->ij", d, a)), "np.einsum was called on xp's arrays"),
    (backward_made_by(lambda xp, d, a: d @ a.T, new=lambda xp, W: np.zeros_like(W)), "np.zeros_like was called"),
    (backward_made_by(lambda xp, d, a: d @ a.T, new=lambda xp, W: np.zeros(W.shape)),
     f"NumPy tried to turn an array of xp into one of its own .*: {NUMPY_DIRECTLY}"),
    (backward_made_by(lambda xp, d, a: xp.asarray(np.asarray(d) @ np.asarray(a).T)), "NumPy tried to turn an array"),
    (backward_made_by(lambda xp, d, a: np.zeros((len(d), len(a))) + d @ a.T), "a NumPy array met an array of xp"),
    (backward_made_by(lambda xp, d, a: d @ a.T + np.zeros((len(d), len(a)))), "a NumPy array was given to xp's add"),
    (lambda xp, Ws, acts, delta: [np.array(g.tolist()) for g in right_backward(xp, Ws, acts, delta)],
     "nabla_W of layer 0 came back as a NumPy array, not one of xp's"),
])
def test_backward_that_calls_numpy_where_xp_is_given_is_named(wrong, match):
    """Right on xp = numpy, where np and xp are one module; the check runs it once more with xp a module that is not
    NumPy, whose arrays NumPy refuses as CuPy's are refused, and names the call."""
    with pytest.raises(ExerciseError, match=r"sizes \[4, 4, 4, 4\] \(float64\), with xp an array module that is not "
                                            "NumPy(?s:.*)" + match):
        check.device_backward(wrong)


@pytest.mark.parametrize("right", [
    backward_made_by(lambda xp, d, a: d @ a.T),
    backward_made_by(lambda xp, d, a: xp.outer(d, a)),
    backward_made_by(lambda xp, d, a: xp.matmul(xp.asarray(d), xp.asarray(a).T)),
    backward_made_by(lambda xp, d, a: d.dot(a.T), new=lambda xp, W: xp.zeros_like(W)),
    backward_made_by(lambda xp, d, a: xp.outer(d.ravel(), a.reshape(-1)), new=lambda xp, W: xp.empty(W.shape, W.dtype)),
    backward_made_by(lambda xp, d, a: d * a.T * np.float64(1)),  # a NumPy scalar is no array of NumPy's
    backward_made_by(lambda xp, d, a: np.float64(1) * (d @ a.T)),  # nor on the left of an operator
    offload.backward,
])
def test_backward_on_xp_alone_passes_on_the_module_that_is_not_numpy(right, capsys):
    check.device_backward(right)
    assert "✔ backward on xp: all 6 checks passed" in capsys.readouterr().out


def test_the_module_that_is_not_numpy_refuses_numpy_and_gives_its_own_arrays():
    from labkit.check.offload import FOREIGN_XP, NumPyOnXP, XPArray

    a = FOREIGN_XP.asarray(np.arange(6.0).reshape(2, 3))
    assert isinstance(a.T @ a, XPArray) and isinstance(1 - a, XPArray) and a.shape == (2, 3) and len(a) == 2
    for numpy_call in (lambda: np.asarray(a), lambda: np.sum(a), lambda: np.exp(a), lambda: a + np.ones(3),
                       lambda: np.ones(3) * a, lambda: FOREIGN_XP.dot(np.ones((3, 2)), a)):
        with pytest.raises(NumPyOnXP):
            numpy_call()


def test_backward_on_single_neurons_and_one_layer():
    """The cases where a shape cannot give a mistake away: [1, 1, 1] (everything 1 x 1) and [3, 2] (one layer)."""
    rng = np.random.default_rng(0)
    from labkit.check.offload import _forward

    for sizes in ([1, 1, 1], [3, 2]):
        Ws, acts, delta = _forward(rng, sizes, np.float64)
        got, want = right_backward(np, Ws, acts, delta), offload.backward(np, Ws, acts, delta)
        assert len(got) == len(sizes) - 1 and all(np.allclose(g, w) for g, w in zip(got, want))


# ---- exercise 2: the time of one offloaded product -------------------------------------------------------------------


def time_with(bytes_per=4, w_floats="n_out*n_in", resident_ok=True, copies=None, flops=2, combine="sum",
              result="n_in", launches=1):
    def fn(n_out, n_in, costs, resident=False):
        back = n_in if result == "n_in" else n_out
        arrays = [n_out, back] if resident and resident_ok else [n_out * n_in if w_floats == "n_out*n_in" else n_out + n_in,
                                                                 n_out, back]
        moving = sum(bytes_per * n / costs["bandwidth"] for n in arrays)
        fixed = costs["copy"] * (len(arrays) if copies is None else copies) + launches * costs["launch"]
        kernel = flops * n_out * n_in / costs["throughput"]
        return fixed + (moving + kernel if combine == "sum" else max(moving, kernel))
    return fn


@pytest.mark.parametrize("wrong, match", [
    (time_with(bytes_per=1), "you count .* floats as bytes: the bandwidth is in bytes per second"),
    (time_with(w_floats="n_out+n_in"), r"the copy time must grow with the bytes copied: .* \(n\^2 for a square layer\)"),
    (time_with(resident_ok=False), "resident means W is already on the device"),
    (time_with(result="n_out"), "the result copied back is W\\^T delta, one value per input"),
    (time_with(flops=1), "each entry of W is multiplied AND added, two flops"),
    (time_with(launches=0), "the launch alone .* your time has no launch in it"),
    (time_with(launches=2), "one product is one kernel launch"),
    (time_with(copies=1), r"your copies pay costs\['copy'\] 1 times; expected 3"),
    (time_with(combine="max"), "each term alone was right(.|\n)*their times add"),
    (lambda n_out, n_in, costs, resident=False: "soon", "expected a number of seconds, got str"),
    (lambda n_out, n_in, costs, resident=False: costs["latency"], "your function raised KeyError"),
])
def test_offload_time_mistakes_are_named(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.offload_time(wrong)


def test_offload_time_resident_with_its_own_copy_count_is_named():
    """Resident mode with copy mode's three copies: W's copy dropped from the bytes but not from the count."""
    def three_copies(n_out, n_in, costs, resident=False):
        return right_time(n_out, n_in, costs, resident) + (costs["copy"] if resident else 0)

    with pytest.raises(ExerciseError, match="resident: W is already on the device, so only delta goes in"):
        check.offload_time(three_copies)


# ---- exercise 3: the crossover width ---------------------------------------------------------------------------------


def crossover_with(reduce="median", copies=True, rule="last run", index=False, none="None", start=0):
    typical = {"median": lambda t: np.median(t, axis=0), "mean": lambda t: t.mean(0), "min": lambda t: t.min(0)}[reduce]

    def fn(widths, host, copy, kernel):
        wins = typical(copy + kernel if copies else kernel) < typical(host)
        if rule == "first win":
            found = [i for i in range(start, len(wins)) if wins[i]]
            i = found[0] if found else None
        elif not wins[-1]:
            i = None
        else:
            i = len(wins) - 1
            while i > start and wins[i - 1]:
                i -= 1
        if i is None:
            return {"None": None, "last": widths[-1], "nan": math.nan, "zero": 0}[none]
        return i if index else widths[i]
    return fn


@pytest.mark.parametrize("wrong, match", [
    (crossover_with(none="last"), "case 2, no crossover .*: no crossover should give None, not the last width"),
    (crossover_with(none="nan"), "case 2, no crossover .*: offloading does not win at the widest width, .* return None"),
    (crossover_with(copies=False), "case 1, .*offloading costs the copies too"),
    (crossover_with(rule="first win"), "case 5, a win by noise .*a win that does not last is noise"),
    (crossover_with(reduce="mean"), "case 6, one slow repetition .*moved your average"),
    (crossover_with(reduce="min"), "case 7, one fast repetition .*the fastest repetition can be a fluke"),
    (crossover_with(index=True), r"case 1, .*you returned 3, an index; return the width itself"),
    (crossover_with(start=1), r"case 3, offloading wins at every width .*does your search start at index 1\?"),
    (lambda widths, host, copy, kernel: None if right_crossover(widths, host, copy, kernel) == widths[-1]
     else right_crossover(widths, host, copy, kernel), "case 4, .*it wins at the widest width, and that is a crossover"),
    (lambda widths, host, copy, kernel: np.array(widths), "expected one width \\(a number\\) or None, got ndarray"),
])
def test_crossover_mistakes_are_named(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.offload_crossover(wrong)


def test_crossover_accepts_the_median_of_each_phase_added():
    """Median of (copy + kernel) or median(copy) + median(kernel): the check's tables give both the same answer."""
    def sum_of_medians(widths, host, copy, kernel):
        return first_of_last_run(widths, np.median(copy, axis=0) + np.median(kernel, axis=0) < np.median(host, axis=0))

    check.offload_crossover(sum_of_medians)


# ---- exercise 4: copies beside kernels, modelled ---------------------------------------------------------------------


def stream_time_with(two="right", one="right", returns="last"):
    """A model with one mistake (or none): ``two`` and ``one`` say how it treats two streams and one."""
    def fn(copy, kernel, streams):
        n, c, k = len(copy), np.mean(copy), np.mean(kernel)
        if streams == 2 and two == "uniform":
            return c + k + (n - 1) * max(c, k)
        if streams == 2 and two == "sum" or streams == 1 and one == "sum":
            return float(np.sum(copy) + np.sum(kernel))
        if streams == 2 and two == "max":
            return float(max(np.sum(copy), np.sum(kernel)))
        copy_end, kernel_end = 0.0, [0.0, 0.0]
        for ci, ki in zip(copy, kernel):
            if streams == 1 and one == "right":
                buffer_free = kernel_end[-1]
            elif streams == 2 and two == "right" or streams == 1 and one == "two streams":
                buffer_free = kernel_end[-2]
            else:  # no buffer rule: the copies run ahead freely
                buffer_free = 0.0
            copy_end = max(copy_end, buffer_free) + ci
            kernel_end.append(max(copy_end, kernel_end[-1]) + ki)
        return np.array(kernel_end[2:]) if returns == "array" else kernel_end[-1]
    return fn


def test_stream_time_with_no_mistake_passes(capsys):
    check.stream_time(stream_time_with())
    assert "all 14 checks passed" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, match", [
    (stream_time_with(two="uniform"), r"case 6, times that differ per batch, 2 streams .*: your time is "
                                      r"c \+ k \+ \(n - 1\) max\(c, k\) with the mean .* holds only when every batch"),
    (stream_time_with(two="free"), r"case 6, times that differ per batch, 2 streams .*: your copies run ahead of the "
                                   r"kernels freely, but there are only two buffers"),
    (stream_time_with(one="two streams"), r"case 1, equal batches, c = k, 1 stream .*: your copies run beside the "
                                          r"kernels, but one stream runs its work in order"),
    (stream_time_with(one="free"), r"case 1, .*, 1 stream .*one stream runs its work in order"),
    (stream_time_with(two="sum"), r"case 1, equal batches, c = k, 2 streams .*: your time is the sum of every copy and "
                                  r"every kernel, as if nothing overlapped"),
    (stream_time_with(two="max"), r"case 1, .*, 2 streams .*: your time is max\(sum of the copies, sum of the kernels\)"
                                  r", a perfect overlap.*fills and drains"),
    (stream_time_with(returns="array"), r"case 1, .*: expected one number, the seconds to the last kernel's end; got "
                                        r"ndarray of 8 values"),
    (lambda copy, kernel, streams: "soon", "case 1, .*: expected a number of seconds, got str"),
    (lambda copy, kernel, streams: right_stream_time(copy, kernel, streams) * (1 + 1e-6),
     r"case 1, .*, 1 stream .*: your time is [\d.]+ ms, expected [\d.]+ ms"),
    (lambda copy, kernel, streams: copy[8], r"case 1, .*: your function raised IndexError"),
])
def test_stream_time_mistakes_are_named(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.stream_time(wrong)


def test_the_stream_mistakes_are_told_apart_from_the_right_time():
    """Each mistake's model differs from the right one on the case where the check names it: uniform times leave the
    buffer rule and the per-batch means no part, so those two need the times that differ per batch."""
    from labkit.check.offload import _STREAM_CASES, _free_copies

    equal = np.ones(8)
    assert streams.stream_time(equal, equal, 1) == 16 and streams.stream_time(equal, equal, 2) == 9
    for what, c, k in _STREAM_CASES[:5]:  # equal batches: the uniform formula and free copies are right
        c, k = np.array(c), np.array(k)
        assert streams.stream_time(c, k, 2) == pytest.approx(_free_copies(c, k)), what
        if len(set(c)) == 1 and len(set(k)) == 1:
            assert streams.stream_time(c, k, 2) == pytest.approx(c[0] + k[0] + (len(c) - 1) * max(c[0], k[0])), what
    _, c, k = _STREAM_CASES[5]
    c, k = np.array(c), np.array(k)
    assert streams.stream_time(c, k, 2) > _free_copies(c, k), "the buffer rule holds a copy back"


# ---- exercise 4: one step on a whole batch, on xp --------------------------------------------------------------------


def step_with(outer="right", mean="right", bias="right", back="right", prime="right", early=False, update="in place",
              loop=False, sigmoid=None):
    """A batched SGD step with one mistake (or none)."""
    def fn(xp, params, x, Y, lr):
        sig = sigmoid or (lambda z: 1 / (1 + xp.exp(-z)))
        acts = [x]
        for W, b in params:
            acts.append(sig(acts[-1] @ W.T + b))
        n, a = len(x), acts[-1]
        delta = (a - Y) * a * (1 - a) / {"right": n, "sum": 1, "twice": n * n}[mean]
        grads = [None] * len(params)
        for i in range(len(params) - 1, -1, -1):
            if loop:
                gW = xp.zeros_like(params[i][0])
                for k in range(n):
                    gW += xp.outer(delta[k], acts[i][k])
            else:
                gW = acts[i].T @ delta if outer == "transposed" else delta.T @ acts[i]
            gb = delta.sum(axis=1 if bias == "neurons" else 0)
            grads[i] = (gW, gb)
            if early:
                params[i][0][...] -= lr * gW
            if i:
                sent = delta @ params[i][0].T if back == "WT" else delta @ params[i][0]
                p = acts[i + 1] if prime == "next" else acts[i]
                delta = sent if prime == "none" else sent * p * (1 - p)
        for j, ((W, b), (gW, gb)) in enumerate(zip(params, grads)):
            if update == "new":
                W, b = W - lr * gW, b - lr * gb
                continue
            if update == "replace":
                params[j] = (W - lr * gW, b - lr * gb)
                continue
            elif not early:
                W -= lr * gW
            if bias != "none":
                b -= lr * gb
        return float(((a - Y) ** 2).sum()) / 2 / n
    return fn


@pytest.mark.parametrize("wrong, match", [
    (step_with(outer="transposed"), r"a batch of 4 .*layer 1 \(the output layer\), dW: dW is transposed"),
    (step_with(mean="sum"), r"layer 1 \(the output layer\), dW: your gradients are B times too large"),
    (step_with(mean="twice"), r"your gradients are B times too small: you divided by B twice"),
    (step_with(bias="neurons"), r"a batch of 4 .*db: db summed delta over the neurons \(axis 1\)"),
    (step_with(bias="none"), r"db: b was not updated"),
    (step_with(back="WT"), r"layer 0 .*dW: delta went back as delta W\^T"),
    (step_with(prime="none"), r"layer 0 .*the error sent back lost sigma'\(z\)"),
    (step_with(prime="next"), r"layer 0 .*sigma'\(z\) of the wrong layer: the error sent back to acts\[1\]"),
    (step_with(early=True), r"layer 0 .*you updated layer 1's weights before sending delta back through them"),
    (step_with(update="new"), r"the weights did not change: W = W - lr \* dW makes a new array"),
    (step_with(update="replace"), r"you replaced the entries of params with new arrays"),
    (step_with(loop=True), r"made \d+ array operations for a batch of 2 and \d+ for a batch of 8: a loop over the samples"),
    (step_with(sigmoid=mlp.sigmoid), r"np.tanh was called on xp's arrays: your function calls NumPy directly where it "
                                     r"should call xp \(labkit's mlp.sigmoid"),
    (lambda xp, params, x, Y, lr: right_batch_step(xp, params, x, Y, lr) * 2, r"your loss is .*: twice it"),
    (lambda xp, params, x, Y, lr: right_batch_step(xp, params, x, Y, lr) * len(x), r"a batch of 4 .*4 times it; the "
                                                                                 "cost is the mean"),
    (lambda xp, params, x, Y, lr: (right_batch_step(xp, params, x, Y, lr), None), r"a number; got tuple"),
    (lambda xp, params, x, Y, lr: right_batch_step(xp, params, x * 1, Y.__imul__(1), lr) and x.__imul__(2),
     "changed x or Y"),
])
def test_batch_step_mistakes_are_named(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.batch_step(wrong)


def test_batch_step_accepts_a_loss_left_as_a_0d_array(capsys):
    """CuPy's sums are 0-d arrays: a loss returned as one is a number too."""
    def variant(xp, params, x, Y, lr):
        loss = right_batch_step(xp, params, x, Y, lr)
        return xp.asarray(loss)

    check.batch_step(variant)
    assert "✔ batch step on xp: all 7 checks passed" in capsys.readouterr().out


# ---- the contract's answers (tests/test_contract.py) -------------------------------------------------------------

CONTRACT = {
    "device_backward": Answers(
        right_backward, backward_with(prime="next"), replayed=backward_with(outer="transposed"),
        passes="✔ backward on xp: all 6 checks passed",
        references=(Reference(lambda *a: offload.backward(*a), "labkit.kernels.offload.backward"),)),
    "offload_time": Answers(
        right_time, time_with(flops=1), replayed=time_with(bytes_per=1), passes="✔ offload time: all 9 checks passed",
        references=(Reference(lambda *a: offload.offload_time(*a), "labkit.kernels.offload.offload_time"),)),
    "offload_crossover": Answers(
        right_crossover, crossover_with(reduce="mean"), replayed=crossover_with(none="last"),
        passes="✔ offload crossover: all 9 checks passed",
        references=(Reference(lambda *a: offload.offload_crossover(*a), "labkit.kernels.offload.offload_crossover"),)),
    "stream_time": Answers(
        right_stream_time, stream_time_with(two="sum"), replayed=stream_time_with(two="free"),
        passes="✔ stream time: all 14 checks passed",
        references=(Reference(lambda *a: streams.stream_time(*a), "labkit.kernels.streams.stream_time"),)),
    "batch_step": Answers(
        right_batch_step, step_with(mean="sum"), replayed=step_with(outer="transposed"),
        passes="✔ batch step on xp: all 7 checks passed",
        references=(Reference(lambda *a: offload.batch_step(*a), "labkit.kernels.offload.batch_step"),)),
}
SEED = 4343


def _record(monkeypatch, folder, name, fn):
    return record_check(monkeypatch, folder, name, fn, SEED)


def test_the_replay_names_numpy_called_where_xp_is_given(tmp_path, monkeypatch):
    """The run on the module that is not NumPy is recorded as one step, and the grader judges it from the record."""
    from labkit.grading import replay

    wrong = backward_made_by(lambda xp, d, a: np.outer(d, a))
    plain = _record(monkeypatch, tmp_path, "device_backward", wrong)
    assert plain[0] is False and "np.outer was called on xp's arrays" in plain[1]
    assert replay.replay("device_backward", tmp_path, SEED) == (False, plain[1].split("\nStep ")[0])


# ---- labkit.kernels.offload's and labkit.kernels.streams' helpers for lab 04 ---------------------------------------------


def test_sample_forward_and_backward_give_backprop_ones_gradients():
    params = mlp.init_params([12, 7, 4], seed=3, dtype=np.float64)
    x = np.random.default_rng(1).random(12)
    Ws, acts, delta = offload.sample_forward(params, x, 2)
    _, want = mlp.backprop_one(params, x[:, None], np.eye(4)[2][:, None], "sigmoid", "quadratic")
    for g, (w, _) in zip(offload.backward(np, Ws, acts, delta), want):
        np.testing.assert_allclose(g, w, rtol=1e-12)


def test_offload_time_counts_what_crosses_the_link():
    costs = {"launch": 1.0, "copy": 10.0, "bandwidth": 4.0, "throughput": 2.0}
    assert offload.offload_time(3, 5, costs) == 1 + 3 * 10 + (15 + 3 + 5) + 15
    assert offload.offload_time(3, 5, costs, resident=True) == 1 + 2 * 10 + (3 + 5) + 15


def test_fit_offload_costs_recovers_the_costs_of_a_model_table():
    widths, n_in = [10, 100, 1000, 10_000], 784
    costs = {"launch": 7e-6, "copy": 3e-6, "bandwidth": 12e9, "throughput": 9e11}
    tables = {}
    for mode in offload.OFFLOAD_MODES:
        resident = mode == "resident"
        floats = [w + n_in + (0 if resident else w * n_in) for w in widths]
        copy = np.array([(2 if resident else 3) * costs["copy"] + 4 * f / costs["bandwidth"] for f in floats])
        kernel = np.array([costs["launch"] + 2 * w * n_in / costs["throughput"] for w in widths])
        host = np.array([2e-6 + 2 * w * n_in / 2e10 for w in widths])
        tables[mode] = {k: np.tile(v, (3, 1)) for k, v in (("host", host), ("copy", copy), ("kernel", kernel))}
    fitted, host = offload.fit_offload_costs(widths, n_in, tables)
    for k, v in costs.items():
        assert fitted[k] == pytest.approx(v, rel=1e-6), k
    assert host["throughput"] == pytest.approx(2e10, rel=1e-6)
    assert offload.host_time(100, n_in, host) == pytest.approx(2e-6 + 2 * 100 * n_in / 2e10, rel=1e-6)


@needs_cxx
def test_offload_tables_time_both_modes_every_repetition():
    widths = [3, 20]
    tables = offload.offload_tables(widths, 16, repeat=2, backend="emulator")
    assert set(tables) == set(offload.OFFLOAD_MODES)
    for t in tables.values():
        assert set(t) == {"host", "copy", "kernel"}
        assert all(v.shape == (2, 2) and (v > 0).all() for v in t.values())
    costs, host = offload.fit_offload_costs(widths, 16, tables)
    assert set(costs) == {"launch", "copy", "bandwidth", "throughput"} and all(v >= 0 for v in costs.values())
    with pytest.raises(ValueError, match="repeat >= 1"):
        offload.offload_tables(widths, 16, repeat=0, backend="emulator")


@needs_cxx
def test_the_sweep_and_the_batch_step_time_every_way():
    rng = np.random.default_rng(0)
    x, y = rng.random((6, 12)).astype(np.float32), rng.integers(0, 4, 6)
    sweep = offload.offload_sweep([3, 5], x, y, repeat=1, n_out=4)
    assert set(sweep) == {"host", "offloaded, copy", "offloaded, resident"}
    assert all(len(t) == 2 and min(t) > 0 for t in sweep.values())
    times = offload.batch_step_times(5, x, y, repeat=1, n_out=4)
    assert len(times) == 4 and "host, vectorised" in times and all(t > 0 for t in times.values())


def test_stream_time_models_equal_batches_and_names_bad_arguments():
    for c, k, n in ((1.0, 1.0, 8), (1.0, 3.0, 6), (3.0, 1.0, 6), (2.0, 5.0, 1)):
        copy, kernel = np.full(n, c), np.full(n, k)
        assert streams.stream_time(copy, kernel, 1) == pytest.approx(n * (c + k))
        assert streams.stream_time(copy, kernel, 2) == pytest.approx(c + k + (n - 1) * max(c, k))
    # a long copy after a short kernel: batch 2's copy waits for batch 0's kernel, its buffer's last reader
    assert streams.stream_time([1, 1, 6], [4, 1, 1], 2) == 12 and streams.stream_time([1, 1, 6], [4, 1, 1], 1) == 14
    with pytest.raises(ValueError, match="streams must be 1 or 2, not 3"):
        streams.stream_time([1.0], [1.0], 3)
    with pytest.raises(ValueError, match="same length"):
        streams.stream_time([1.0, 2.0], [1.0], 2)
