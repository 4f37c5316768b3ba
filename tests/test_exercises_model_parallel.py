"""Lab 11's exercises (labkit.check.model_parallel): their answers for the contract every exercise keeps (``CONTRACT``,
tests/test_contract.py: right, blank, hints, replay, labkit's own), other right answers that pass, and each typical
wrong one, named by the check's message."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
from conftest import Answers, Mistake, Reference, record_check

from labkit import check, model_parallel
from labkit.check import ExerciseError
from labkit.check.exercises import exercise, in_lab
from labkit.grading import replay
from labkit.shards import shard_bounds

# ---- exercise 1: one rank's neurons --------------------------------------------------------------------------------

def relu(z):
    return np.maximum(z, 0)


def part(bounds, out=lambda W, b, x, lo, hi: relu(x @ W[lo:hi].T + b[lo:hi])):
    """A neuron_part answer from a way of choosing (lo, hi) and a way of computing h."""
    def fn(W, b, x, rank, p):
        lo, hi = bounds(W.shape[0], p, rank)
        return lo, hi, out(W, b, x, lo, hi)
    return fn


def extras_first(n, p, r):
    base, extra = divmod(n, p)
    lo = r * base + min(r, extra)
    return lo, lo + base + (r < extra)


def floor_only(n, p, r):
    return r * (n // p), (r + 1) * (n // p)


def last_takes_rest(n, p, r):
    return r * (n // p), n if r == p - 1 else (r + 1) * (n // p)


def ceil_blocks(n, p, r):
    c = -(-n // p)
    return r * c, min(n, (r + 1) * c)


def overlapping(n, p, r):
    lo, hi = extras_first(n, p, r)
    return lo, min(n, hi + 1)


RIGHT_PART = part(extras_first)
WRONG_PART = {
    "floor only": (part(floor_only), r"neurons 6\.\.6 belong to no rank.*n % p = 1 over"),
    "last takes the rest": (part(last_takes_rest), r"sizes \[2, 2, 2, 4\].*the last rank takes all n % p = 2"),
    "ceil": (part(ceil_blocks), r"sizes \[3, 3, 1\] differ by more than one"),
    "overlap": (part(overlapping), r"the blocks overlap: ranks 0 and 1 both hold neurons 3\.\.3"),
    "float bounds": (part(lambda n, p, r: (r * n / p, (r + 1) * n / p)), r"slice indices must be integers.*// and %"),
    "float bounds returned": (part(lambda n, p, r: (r * n / p, (r + 1) * n / p),
                                   lambda W, b, x, lo, hi: relu(x @ W[int(lo):int(hi)].T + b[int(lo):int(hi)])),
                              r"lo must be a whole number \(an int\), got float"),
    "no relu": (part(extras_first, lambda W, b, x, lo, hi: x @ W[lo:hi].T + b[lo:hi]), r"apply the activation"),
    "no bias": (part(extras_first, lambda W, b, x, lo, hi: relu(x @ W[lo:hi].T)), r"add your neurons' biases"),
    "whole layer": (part(extras_first, lambda W, b, x, lo, hi: relu(x @ W.T + b)),
                    r"h has shape \(3, 6\), expected \(3, 3\).*this rank's neurons only"),
    "transposed": (part(extras_first, lambda W, b, x, lo, hi: relu(x @ W[lo:hi].T + b[lo:hi]).T),
                   r"rank 0 \(neurons 0\.\.2\): wrong outputs\nHint: one row per sample.*transposed"),
    "columns of W": (part(extras_first, lambda W, b, x, lo, hi: relu(x @ W[:, lo:hi] + b[lo:hi])),
                     r"raised ValueError.*one row per neuron"),
}


def test_neuron_part_passes_any_balanced_split(capsys):
    check.neuron_part(part(lambda n, p, r: (r * n // p, (r + 1) * n // p)))  # the extras spread, not first: fine too
    assert "✔ one rank's neurons: all 8 checks passed" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(WRONG_PART))
def test_neuron_part_names_the_mistake(name):
    fn, match = WRONG_PART[name]
    with pytest.raises(ExerciseError, match=f"(?s){match}"):
        check.neuron_part(fn)


def test_a_transposed_part_is_named_where_the_shape_tells():
    with pytest.raises(ExerciseError, match=r"h has shape \(3, 2\), expected \(2, 3\)\nHint: one row per sample.*"
                                            r"transposed"):
        check.neuron_part(part(extras_first, lambda W, b, x, lo, hi: relu(x @ W[lo:hi].T + b[lo:hi]).T if
                               W.shape[0] == 7 else relu(x @ W[lo:hi].T + b[lo:hi])))


# ---- exercise 2: one rank's backward ------------------------------------------------------------------------------

def grads(error=lambda d, W2, lo, hi, h: (d @ W2[:, lo:hi]) * (h > 0), finish=lambda e, x: (e.T @ x, e.sum(axis=0))):
    def fn(x, h, delta, W2, lo, hi):
        return finish(error(delta, W2, lo, hi, h), x)
    return fn


RIGHT_GRADS = grads()
WRONG_GRADS = {
    "no slope": (grads(lambda d, W2, lo, hi, h: d @ W2[:, lo:hi]), r"multiply by ReLU's slope"),
    "sigmoid slope": (grads(lambda d, W2, lo, hi, h: (d @ W2[:, lo:hi]) * h * (1 - h)), r"the sigmoid's slope"),
    "divided again": (grads(finish=lambda e, x: ((e / len(x)).T @ x, e.sum(axis=0) / len(x))),
                      r"do not divide by the batch \(4\) again"),
    "transposed": (grads(finish=lambda e, x: (x.T @ e, e.sum(axis=0))), r"dW1 has shape \(5, 3\).*transposed"),
    "db not summed": (grads(finish=lambda e, x: (e.T @ x, e)), r"db1 has shape \(4, 3\).*sums the error over the batch"),
    "db mean": (grads(finish=lambda e, x: (e.T @ x, e.mean(axis=0))), r"dW1 is right.*sum of the error.*not its mean"),
    "rows of W2": (grads(lambda d, W2, lo, hi, h: (d @ W2[lo:hi]) * (h > 0)), r"raised ValueError.*which part of W2"),
    "all of W2": (grads(lambda d, W2, lo, hi, h: (d @ W2) * (h > 0)), r"raised ValueError.*which part of W2"),
}


@pytest.mark.parametrize("name", sorted(WRONG_GRADS))
def test_neuron_grads_names_the_mistake(name):
    fn, match = WRONG_GRADS[name]
    with pytest.raises(ExerciseError, match=f"(?s){match}"):
        check.neuron_grads(fn)


# ---- exercise 3: the GPipe schedule ---------------------------------------------------------------------------------

def right_schedule(S, M):
    s, m = np.arange(S)[:, None], np.arange(M)[None, :]
    return s + m, (M + S - 1) + (S - 1 - s) + (M - 1 - m)


def ascending_backwards(S, M):
    s, m = np.arange(S)[:, None], np.arange(M)[None, :]
    return s + m, (M + S - 1) + (S - 1 - s) + m


def shifted(dforward=0, dbackward=0, backward=None):
    def fn(S, M):
        f, b = right_schedule(S, M)
        return f + dforward, (b if backward is None else backward(S, M)) + dbackward
    return fn


def together(S, M):
    f, b = right_schedule(S, M)
    return np.zeros((S, 1), int) + np.arange(M), b


def both_at_once(S, M):  # the next forward and a backward in the same step, as if a stage could do two things
    s, m = np.arange(S)[:, None], np.arange(M)[None, :]
    return s + m, s + m + 1 + 2 * (S - 1 - s)


def interleaved(S, M):  # one forward, one backward (1F1B), on one stage: a backward before the last forward
    if S == 1:
        return 2 * np.arange(M)[None, :], 2 * np.arange(M)[None, :] + 1
    return right_schedule(S, M)


def list_shape(S, M):
    f, b = right_schedule(S, M)
    return f.T, b.T


def simulated_gpipe(steps=None, fill=-1, dtype=int):
    """GPipe as a student simulates it, step by step; ``steps``: a number of steps instead of until done (a number, or
    a function of S and M)."""
    def fn(S, M):
        f, b = np.full((S, M), fill, dtype), np.full((S, M), fill, dtype)
        nf, nb = [0] * S, [0] * S
        for t in range(steps(S, M) if callable(steps) else steps or 2 * (M + S)):
            for s in range(S):
                m = nf[s]
                if m < M and (s == 0 or (nf[s - 1] > m and f[s - 1, m] < t)):
                    f[s, m], nf[s] = t, m + 1
                elif nf[s] == M and nb[s] < M:
                    m = M - 1 - nb[s]  # the last micro-batch first, as the errors arrive
                    if f[s, m] < t if s == S - 1 else (nb[s + 1] > nb[s] and b[s + 1, m] < t):
                        b[s, m], nb[s] = t, nb[s] + 1
        return f, b
    return fn


def gpipe_until(done):
    """GPipe simulated until ``done(stage 0's backwards run, M)``: an end test that never holds loops for ever."""
    def fn(S, M):
        f, b = np.full((S, M), -1), np.full((S, M), -1)
        nf, nb, t = [0] * S, [0] * S, 0
        while not done(nb[0], M):
            for s in range(S):
                if nf[s] < M and (s == 0 or 0 <= f[s - 1, nf[s]] < t):
                    f[s, nf[s]], nf[s] = t, nf[s] + 1
                elif nf[s] == M and nb[s] < M and 0 <= (b[s + 1, nb[s]] if s < S - 1 else f[s, M - 1]) < t:
                    b[s, nb[s]], nb[s] = t, nb[s] + 1
            t += 1
        return f, b
    return fn


def closed_form_over(micro_batches):
    """The right steps written task by task, for the micro-batches ``micro_batches(M)`` only."""
    def fn(S, M):
        f, b = np.full((S, M), -1), np.full((S, M), -1)
        right_f, right_b = right_schedule(S, M)
        for m in micro_batches(M):
            f[:, m], b[:, m] = right_f[:, m], right_b[:, m]
        return f, b
    return fn


def small_int_schedule(S, M):
    s, m = np.arange(S, dtype=np.int8)[:, None], np.arange(M, dtype=np.int8)[None, :]
    return s + m, (M + S - 1) + (S - 1 - s) + (M - 1 - m)


WRONG_SCHEDULE = {
    "stages start together": (together, r"S = 3 stages.*the stages start together: stage 1 runs the forward of "
                                         r"micro-batch 0 at step 0.*before the stage before it has finished it"),
    "steps from 1": (shifted(1, 1), r"the first task runs at step 1.*steps count from 0"),
    "backward down": (shifted(backward=lambda S, M: (M + S - 1) + np.arange(S)[:, None] + (M - 1 - np.arange(M))),
                      r"S = 3 stages, M = 1.*the backwards run from stage 0 down to stage 2.*the other way"),
    "no stage offset": (shifted(backward=lambda S, M: (M + S - 1) + np.zeros((S, 1), int) + (M - 1 - np.arange(M))),
                        r"stage 0 runs the backward of micro-batch 0 at step 3, stage 1 at step 3.*the error flows"),
    "backward a step late": (shifted(0, 1), r"S = 1 stage, M = 1.*stage 0 waits: it runs the backward of "
                                            r"micro-batch 0 at step 2, but was free and had its input at step 1\nHint: "
                                            r"one step late.*An off-by-one"),
    "two at once": (both_at_once, r"stage 0 runs forward 1 and backward 0 at the same step 1.*one task a step"),
    "1F1B": (interleaved, r"M = 4.*backward of micro-batch 0 at step 1, before its last forward \(step 6\).*GPipe "
                          r"runs all forwards"),
    "forward late": (lambda S, M: (right_schedule(S, M)[0] + (np.arange(M) > 0), right_schedule(S, M)[1] + (M > 1)),
                     r"S = 1 stage, M = 4.*stage 0 waits: it runs the forward of micro-batch 1 at step 2"),
    "transposed": (list_shape, r"S = 1 stage, M = 4.*forward has shape \(4, 1\), expected \(1, 4\).*one row per stage"),
    "floats": (lambda S, M: tuple(a + 0.5 for a in right_schedule(S, M)), r"whole step numbers"),
    # right on every size the check used to try (up to 6 stages and 10 micro-batches, 30 steps), wrong past them
    "a fixed number of steps": (simulated_gpipe(steps=30), r"S = 16 stages.*tasks never ran: they still hold -1.*the "
                                r"others stop at step 29.*a loop stops at a fixed step"),
    "a fixed number of steps, zeros": (simulated_gpipe(steps=32, fill=0), r"tasks never ran: they still hold 0.*"
                                       r"stage 0's backward.*a loop stops at a fixed step"),
    "one step short": (simulated_gpipe(steps=lambda S, M: 2 * (M + S - 1) - 1),
                       r"S = 1 stage, M = 1 micro-batch: 1 of the 2 tasks never ran.*stage 0's backward of micro-batch "
                       r"0, the last task, and the others stop at step 0, the step before it\nHint: an off-by-one"),
    "one step short, zeros": (simulated_gpipe(steps=lambda S, M: 2 * (M + S - 1) - 1, fill=0),
                              r"S = 1 stage, M = 1 micro-batch: stage 0 runs the forward and the backward of "
                              r"micro-batch 0 both at step 0\nHint: .*a step early \(an off-by-one.*never run it"),
    "backward a step early": (shifted(0, -1), r"S = 1 stage, M = 1 micro-batch: stage 0 runs the forward and the "
                              r"backward of micro-batch 0 both at step 0"),
    "backward a step early, past 1 x 1": (lambda S, M: shifted(0, -1)(S, M) if S * M > 1 else right_schedule(S, M),
                                          r"S = 1 stage, M = 4 micro-batches: stage 0 runs forward 3 and backward 3 at "
                                          r"the same step 3\nHint: a step early.*An off-by-one"),
    "ends one backward early": (gpipe_until(lambda done, M: done >= M - 1), r"S = 1 stage, M = 1.*none of the 2 tasks"),
    "last micro-batch left out": (closed_form_over(lambda M: range(M - 1)), r"S = 1 stage, M = 1.*none of the 2 tasks "
                                  r"ran.*a range one short"),
    "never ends": (gpipe_until(lambda done, M: done > M), r"S = 1 stage, M = 1 micro-batch: your schedule did not end: "
                   r"your function was stopped after 104,000 lines of Python.*\nHint: a loop whose end never comes"),
    "int8 steps": (small_int_schedule, r"S = 16 stages, M = 64 micro-batches: forward is an array of int8, which holds "
                   r"steps up to 127 only.*wrap around"),
}


def test_gpipe_schedule_passes_backwards_in_either_order(capsys):
    check.gpipe_schedule(ascending_backwards)
    check.gpipe_schedule(lambda S, M: tuple(a.tolist() for a in right_schedule(S, M)))  # lists will do
    check.gpipe_schedule(simulated_gpipe())  # a simulation run until every task has run
    assert capsys.readouterr().out.count("✔ GPipe schedule: all 9 checks passed") == 3


@pytest.mark.parametrize("name", sorted(WRONG_SCHEDULE))
def test_gpipe_schedule_names_the_mistake(name):
    fn, match = WRONG_SCHEDULE[name]
    with pytest.raises(ExerciseError, match=f"(?s){match}"):
        check.gpipe_schedule(fn)


def test_a_range_one_short_is_named_by_what_it_left_out():
    for skip, which in ((lambda M: range(M - 1), r"micro-batch 3, the last of the 4"),
                        (lambda M: range(1, M), r"micro-batch 0, the first of the 4")):
        with pytest.raises(ExerciseError, match=rf"(?s)S = 1 stage, M = 4.*every task of {which}, and no other\nHint: "
                                                r"a range one short\? range\(a, b\) runs a to b - 1"):
            check.gpipe_schedule(lambda S, M, skip=skip: closed_form_over(skip)(S, M) if M > 1 else right_schedule(S, M))


def test_a_loop_that_never_ends_is_stopped_in_proportion_to_the_case():
    """Stopped by lines of Python run, a fixed number per task: at once on the first case, and the right simulations
    of the largest case stay far below it."""
    import time

    started = time.perf_counter()
    with pytest.raises(ExerciseError, match=r"S = 1 stage, M = 1 micro-batch: your schedule did not end"):
        check.gpipe_schedule(gpipe_until(lambda done, M: False))
    assert time.perf_counter() - started < 5
    late = gpipe_until(lambda done, M: done >= M if M < 64 else False)  # right, but for ever on 16 x 64
    with pytest.raises(ExerciseError, match=r"S = 16 stages, M = 64 micro-batches: your schedule did not end: your "
                                            r"function was stopped after 4,196,000 lines"):
        check.gpipe_schedule(late)
    check.gpipe_schedule(gpipe_until(lambda done, M: done >= M))
    check.one_f_one_b(one_f_one_b(steps=10 ** 9))
    assert sys.gettrace() is None or "coverage" in type(sys.gettrace()).__module__, "the check's tracer was removed"


def test_the_bubble_falls_out_of_the_schedule():
    for S, M in ((1, 5), (2, 1), (4, 8), (6, 3)):
        f, b = model_parallel.gpipe_schedule(S, M)
        steps = 1 + max(f.max(), b.max())
        assert 1 - (f.size + b.size) / (S * steps) == pytest.approx(model_parallel.gpipe_bubble(S, M))
        assert model_parallel.pipeline_step_time(np.ones(S), np.ones(S), M) == steps


# ---- exercise 4: the step time with each stage's own times -----------------------------------------------------------

def closed_form(f, b, M):
    return f.sum() + (M - 1) * f.max() + b.sum() + (M - 1) * b.max()


WRONG_STEP = {
    "equal-stage formula": (lambda f, b, M: (M + len(f) - 1) * (f.mean() + b.mean()), r"holds for equal stages only"),
    "all as the slowest": (lambda f, b, M: (M + len(f) - 1) * (f + b).max(), r"paces every stage as the slowest"),
    "no overlap": (lambda f, b, M: M * (f + b).sum(), r"runs the stages one after another"),
    "one slowest stage": (lambda f, b, M: (f + b).sum() + (M - 1) * (f + b).max(),
                          r"a stage slow in the forward may be quick in the backward"),
    "forwards only": (lambda f, b, M: f.sum() + (M - 1) * f.max(), r"only the forwards"),
    "M instead of M - 1": (lambda f, b, M: f.sum() + M * f.max() + b.sum() + M * b.max(), r"one micro-batch too many"),
    "a list": (lambda f, b, M: [closed_form(f, b, M)] * 2, r"expected one number \(seconds\), got list of shape \(2,\)"),
    "lockstep": (lambda f, b, M: lockstep(f, b, M), r"moves the stages in lockstep"),
    "arrays for 12 micro-batches": (lambda f, b, M: simulated_step(f, b, M, room=12), r"raised IndexError.*It ran on the "
                                    r"smaller cases\? This one has \d+ stages and \d+ micro-batches.*sized for those"),
}


def lockstep(f, b, M):
    """Each step of the unit-time GPipe schedule as long as its slowest task: right on every fixed case of the check."""
    forward, backward = right_schedule(len(f), M)
    return sum(max([f[s] for s, m in zip(*np.nonzero(forward == t))] + [b[s] for s, m in zip(*np.nonzero(backward == t))])
               for t in range(1 + backward.max()))


def simulated_step(f, b, M, room=None):
    """The notebook's simulation; ``room``: its arrays sized for that many micro-batches instead of M."""
    free, ready = np.zeros(len(f)), np.zeros(room or M)
    for s in range(len(f)):
        for m in range(M):
            ready[m] = free[s] = max(free[s], ready[m]) + f[s]
    ready[:] = 0
    for s in reversed(range(len(b))):
        for m in range(M):
            ready[m] = free[s] = max(free[s], ready[m]) + b[s]
    return free.max()


def test_pipeline_step_time_passes_a_simulation(capsys):
    check.pipeline_step_time(lambda f, b, M: model_parallel.pipeline_step_time(f, b, M) + 0.0)
    check.pipeline_step_time(simulated_step)
    assert capsys.readouterr().out.count("✔ pipeline step time: all 8 checks passed") == 2


@pytest.mark.parametrize("name", sorted(WRONG_STEP))
def test_pipeline_step_time_names_the_mistake(name):
    fn, match = WRONG_STEP[name]
    with pytest.raises(ExerciseError, match=f"(?s){match}"):
        check.pipeline_step_time(fn)


# ---- exercise 5: the activations a schedule holds --------------------------------------------------------------------

def right_peaks(forward, backward):
    S, M = forward.shape
    peaks = np.zeros(S, dtype=int)
    for s in range(S):
        for t in range(int(max(forward.max(), backward.max())) + 1):
            held = sum(1 for m in range(M) if forward[s, m] <= t <= backward[s, m])
            peaks[s] = max(peaks[s], held)
    return peaks


def peaks_to_step(last):
    """right_peaks counted over the steps up to ``last(S, M)`` only."""
    def fn(f, b):
        steps = np.arange(last(*f.shape) + 1)
        return ((f[:, :, None] <= steps) & (steps <= b[:, :, None])).sum(axis=1).max(axis=1)
    return fn


def peaks_fixed_array(f, b):
    held = np.zeros((f.shape[0], 32), int)  # room for the steps of the check's schedules up to 6 x 10
    for s, m in np.ndindex(f.shape):
        held[s, f[s, m]:b[s, m] + 1] += 1
    return held.max(axis=1)


def peaks_by_arrivals(f, b):
    """The most micro-batches that arrive while one is held: right when they leave in the order they came."""
    return np.array([max(((f[s] >= f[s, m]) & (f[s] <= b[s, m])).sum() for m in range(f.shape[1]))
                     for s in range(f.shape[0])])


def peaks_in_order(f, b):
    """Held when micro-batch m leaves: those arrived before, less the m freed before it (1F1B's order)."""
    return np.array([max((f[s] < b[s, m]).sum() - m for m in range(f.shape[1])) for s in range(f.shape[0])])


def peaks_by_kind(f, b):
    """GPipe holds M, 1F1B S - s: the peaks guessed from the schedule's kind."""
    S, M = f.shape
    gpipe = (f.max(axis=1) < b.min(axis=1)).all()
    return np.full(S, M) if gpipe else np.minimum(S - np.arange(S), M)


WRONG_PEAKS = {
    "every micro-batch": (lambda f, b: np.full(f.shape[0], f.shape[1]), r"1F1B, S = 4, M = 8 \(steps 0 to 21\): peaks "
                          r"\[8, 8, 8, 8\], expected \[4, 3, 2, 1\].*frees a micro-batch's activations once its backward "
                          r"has run"),
    "forwards before the first backward": (
        lambda f, b: np.array([(f[s] < b[s].min()).sum() for s in range(f.shape[0])]),
        r"one stage, two forwards then one backward, S = 1, M = 7 \(steps 0 to 13\): peaks \[2\], expected \[3\].*the "
        r"peak can come later"),
    "the pipeline's peak": (lambda f, b: np.full(f.shape[0], right_peaks(f, b).max()),
                            r"1F1B, S = 4, M = 8 \(steps 0 to 21\): peaks \[4, 4, 4, 4\].*each stage has its own peak"),
    # right on every GPipe and 1F1B schedule, wrong on schedules of neither kind or longer than the check's were
    "GPipe's step count": (peaks_to_step(lambda S, M: 2 * (M + S - 1) - 1), r"then the rest as GPipe, S = 3, M = 8 "
                           r"\(steps 0 to 31\): peaks \[2, 1, 1\], expected \[5, 5, 5\].*the peaks of steps 0 to 19 "
                           r"only: 2\(M \+ S - 1\) steps are GPipe's and 1F1B's.*count to its own last step"),
    "an array of 32 steps": (peaks_fixed_array, r"GPipe, S = 12, M = 40 \(steps 0 to 101\).*the peaks of steps 0 to 31 "
                             r"only.*a loop or an array of fixed length"),
    "arrivals": (peaks_by_arrivals, r"backwards out of micro-batch order, S = 1, M = 4 \(steps 0 to 7\): peaks \[3\], "
                 r"expected \[2\].*arrive while it is held"),
    "freed in order": (peaks_in_order, r"backwards out of micro-batch order.*peaks \[3\], expected \[2\].*micro-batch "
                       r"order"),
    "by the kind of schedule": (peaks_by_kind, r"two forwards then one backward, S = 1, M = 7 \(steps 0 to 13\): peaks "
                                r"\[1\], expected \[3\].*peaks of 1F1B's schedule, guessed from its kind"),
    "per step": (lambda f, b: np.zeros((f.shape[0], 3), int), r"expected an array of shape \(4,\), got shape \(4, 3\).*"
                 r"not the count at every step"),
    "one number": (lambda f, b: right_peaks(f, b).max(), r"got shape \(\).*one number per stage"),
    "backward excluded": (lambda f, b: right_peaks(f, b - 1) if f.shape[1] > 1 else right_peaks(f, b) + 1,
                          r"peaks .*, expected .*\nStep 1 of 4"),  # nothing names it: the derivation's steps
}


def test_activations_in_flight_passes_a_list(capsys):
    check.activations_in_flight(lambda f, b: right_peaks(f, b).tolist())  # a list will do
    assert "✔ activations in flight: all 12 checks passed" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(WRONG_PEAKS))
def test_activations_in_flight_names_the_mistake(name):
    fn, match = WRONG_PEAKS[name]
    with pytest.raises(ExerciseError, match=f"(?s){match}"):
        check.activations_in_flight(fn)


# ---- exercise 6: 1F1B -------------------------------------------------------------------------------------------------

def one_f_one_b(room=lambda S, s: S - s, late=0, seen=lambda step, t: 0 <= step < t, steps=None, dtype=int):
    """A 1F1B answer as a student simulates it, with one of its rules changed (``steps``: a number of steps, or a
    function of S and M, to stop at; 10 ** 9: no bound)."""
    def fn(S, M):
        f, b = -np.ones((S, M), dtype), -np.ones((S, M), dtype)
        nf, nb, t = [0] * S, [0] * S, 0
        while nb[0] < M and t < (steps(S, M) if callable(steps) else steps or 10 * (M + S)):
            for s in range(S):
                can_b = nb[s] < nf[s] and seen((b[s + 1, nb[s]] if s < S - 1 else f[s, nb[s]]) + late, t)
                can_f = nf[s] < M and nf[s] - nb[s] < room(S, s) and (s == 0 or seen(f[s - 1, nf[s]], t))
                if can_b:
                    b[s, nb[s]], nb[s] = t, nb[s] + 1
                elif can_f:
                    f[s, nf[s]], nf[s] = t, nf[s] + 1
            t += 1
        return f, b
    return fn


WRONG_1F1B = {
    "GPipe": (model_parallel.gpipe_schedule, r"S = 1 stage, M = 4.*holds 4 micro-batches at once.*GPipe's memory"),
    "one more in flight": (one_f_one_b(room=lambda S, s: S - s + 1), r"S = 2 stages, M = 3.*stage 0 holds 3 "
                           r"micro-batches at once, where 1F1B's stage 0 holds at most 2\nHint: a room larger than "
                           r"needed: your schedule takes 8 steps"),
    "one fewer in flight": (one_f_one_b(room=lambda S, s: max(1, S - s - 1)), r"S = 2 stages, M = 3.*stage 0 runs the "
                            r"forward of micro-batch 1 at step 4; 1F1B's rule runs it at step 1: at step 1 it waits, free, "
                            r"with its input there and 1 micro-batch in flight: a room of 1 on stage 0\nHint: a room too "
                            r"small: your schedule takes 12 steps, GPipe's 8"),
    "one fewer in flight, none on the last stage": (one_f_one_b(room=lambda S, s: S - s - 1), r"S = 1 stage, M = 1.*"
                                                    r"stage 0, the last, never ran a forward, though micro-batch 0's "
                                                    r"input was there from step 0.*\nHint: it never had room\?"),
    "none on the last stage, 2 stages": (lambda S, M: one_f_one_b(room=lambda S, s: S - s - 1)(S, M) if S > 1 else
                                         model_parallel.one_f_one_b_schedule(S, M),
                                         r"S = 3 stages, M = 1.*stage 2, the last, never ran a forward, though "
                                         r"micro-batch 0's input was there from step 2"),
    "one fewer in flight, a loop without a bound": (one_f_one_b(room=lambda S, s: S - s - 1, steps=10 ** 9),
                                                    r"S = 1 stage, M = 1 micro-batch: your schedule did not end.*"
                                                    r"\nHint: a loop whose end never comes"),
    "one step short": (one_f_one_b(steps=lambda S, M: 2 * (M + S - 1) - 1), r"S = 1 stage, M = 1.*1 of the 2 tasks "
                       r"never ran.*the last task.*\nHint: an off-by-one"),
    "a step late": (one_f_one_b(late=1), r"S = 1 stage, M = 1.*runs the backward of micro-batch 0 at step 2; 1F1B's "
                    r"rule runs it at step 1.*at step 1 stage 0 was free, its input had arrived"),
    "input seen at once": (one_f_one_b(seen=lambda step, t: 0 <= step <= t), r"S = 3 stages, M = 1.*the stages start "
                           r"together"),
    "a fixed number of steps": (one_f_one_b(steps=30), r"tasks never ran: they still hold -1.*the others stop at "
                                r"step 29.*a loop stops at a fixed step"),
    "int8 steps": (one_f_one_b(dtype=np.int8), r"raised OverflowError.*This one runs to step \d+: look for an array, a "
                   r"loop or an integer type sized for those"),
}


def test_one_f_one_b_passes_labkits_schedule_as_lists(capsys):
    check.one_f_one_b(lambda S, M: tuple(a.tolist() for a in model_parallel.one_f_one_b_schedule(S, M)))
    assert "✔ 1F1B schedule: all 9 checks passed" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(WRONG_1F1B))
def test_one_f_one_b_names_the_mistake(name):
    fn, match = WRONG_1F1B[name]
    with pytest.raises(ExerciseError, match=f"(?s){match}"):
        check.one_f_one_b(fn)


def test_1f1b_takes_gpipes_steps_and_holds_less():
    for S in range(1, 7):
        for M in range(1, 11):
            f, b = model_parallel.one_f_one_b_schedule(S, M)
            assert 1 + max(f.max(), b.max()) == 2 * (M + S - 1)  # the same bubble as GPipe
            assert model_parallel.peak_activations(f, b).tolist() == [min(S - s, M) for s in range(S)]
            assert model_parallel.peak_activations(*model_parallel.gpipe_schedule(S, M)).tolist() == [M] * S


# ---- the contract's answers (tests/test_contract.py) --------------------------------------------------------------

def part_on_labkits_shards(W, b, x, rank, p):
    lo, hi = shard_bounds(W.shape[0], p)[rank]
    return lo, hi, relu(x @ W[lo:hi].T + b[lo:hi])


CONTRACT = {
    "neuron_part": Answers(
        RIGHT_PART, WRONG_PART["floor only"][0], passes="✔ one rank's neurons: all 8 checks passed",
        references=(Reference(lambda W, b, x, r, p: model_parallel.neuron_part(W, b, x, r, p),
                              "labkit.model_parallel.neuron_part"),
                    Reference(part_on_labkits_shards, "labkit.shards.shard_bounds"))),
    "neuron_grads": Answers(
        RIGHT_GRADS, WRONG_GRADS["no slope"][0], passes="✔ one rank's backward: all 6 checks passed",
        references=(Reference(model_parallel.neuron_part_grads, "labkit.model_parallel.neuron_part_grads"),
                    Reference(lambda x, h, d, W2, lo, hi: model_parallel.neuron_part_grads(x, h, d, W2, lo, hi),
                              "labkit.model_parallel.neuron_part_grads"))),
    "gpipe_schedule": Answers(
        right_schedule, together, passes="✔ GPipe schedule: all 9 checks passed",
        references=(Reference(model_parallel.gpipe_schedule, "labkit.model_parallel.gpipe_schedule"),)),
    "pipeline_step_time": Answers(
        closed_form, WRONG_STEP["no overlap"][0], passes="✔ pipeline step time: all 8 checks passed",
        references=(Reference(lambda f, b, M: model_parallel.pipeline_step_time(f, b, M),
                              "labkit.model_parallel.pipeline_step_time"),)),
    "activations_in_flight": Answers(
        right_peaks, WRONG_PEAKS["every micro-batch"][0], passes="✔ activations in flight: all 12 checks passed",
        references=(Reference(model_parallel.peak_activations, "labkit.model_parallel.peak_activations"),)),
    "one_f_one_b": Answers(
        one_f_one_b(), WRONG_1F1B["GPipe"][0], passes="✔ 1F1B schedule: all 9 checks passed",
        references=(Reference(model_parallel.one_f_one_b_schedule, "labkit.model_parallel.one_f_one_b_schedule"),)),
}


# ---- each named mistake, its own hint and no step (tests/test_contract.py walks these) --------------------------------

def _mistake(table, name, says, hint):
    return Mistake(table[name][0], says=says, hint=hint)


MISTAKES = {
    "neuron_part": (
        _mistake(WRONG_PART, "floor only", r"neurons 6\.\.6 belong to no rank", r"n % p = 1 over: they must go to ranks"),
        _mistake(WRONG_PART, "last takes the rest", r"sizes \[2, 2, 2, 4\]", r"the last rank takes all n % p = 2"),
        _mistake(WRONG_PART, "ceil", r"sizes \[3, 3, 1\] differ by more than one",
                 r"rounding n / p up.*which 3 sizes, none more than one apart, add up to 7\?"),
        _mistake(WRONG_PART, "overlap", r"the blocks overlap", r"starts where the previous rank's ends"),
        _mistake(WRONG_PART, "no bias", r"wrong outputs", r"add your neurons' biases"),
    ),
    "neuron_grads": (
        _mistake(WRONG_GRADS, "no slope", r"wrong dW1", r"ReLU's slope"),
        _mistake(WRONG_GRADS, "divided again", r"wrong dW1", r"do not divide by the batch \(4\) again"),
        _mistake(WRONG_GRADS, "db mean", r"dW1 is right but db1 is wrong", r"not its mean"),
    ),
    "gpipe_schedule": (
        _mistake(WRONG_SCHEDULE, "one step short", r"S = 1 stage, M = 1 micro-batch: 1 of the 2 tasks never ran.*"
                 r"the last task.*the step before it", r"^an off-by-one: counting from step 0.*takes how many steps\?"),
        _mistake(WRONG_SCHEDULE, "one step short, zeros", r"both at step 0", r"a step early \(an off-by-one"),
        _mistake(WRONG_SCHEDULE, "backward a step early", r"both at step 0", r"a step early \(an off-by-one"),
        _mistake(WRONG_SCHEDULE, "backward a step early, past 1 x 1", r"runs forward 3 and backward 3 at the same step",
                 r"^a step early.*An off-by-one"),
        _mistake(WRONG_SCHEDULE, "a fixed number of steps", r"S = 16 stages.*tasks never ran.*stop at step 29",
                 r"ended by step \d+\? Then a loop stops at a fixed step"),
        _mistake(WRONG_SCHEDULE, "last micro-batch left out", r"none of the 2 tasks ran", r"a range one short"),
        _mistake(WRONG_SCHEDULE, "never ends", r"your schedule did not end", r"^a loop whose end never comes"),
        _mistake(WRONG_SCHEDULE, "stages start together", r"the stages start together",
                 r"before the stage before it has finished it"),
        _mistake(WRONG_SCHEDULE, "1F1B", r"before its last forward", r"GPipe runs all forwards of a step first"),
        _mistake(WRONG_SCHEDULE, "backward a step late", r"stage 0 waits", r"^one step late.*An off-by-one"),
    ),
    "pipeline_step_time": (
        _mistake(WRONG_STEP, "equal-stage formula", r"expected [\d.]+ s", r"holds for equal stages only"),
        _mistake(WRONG_STEP, "lockstep", r"expected [\d.]+ s", r"moves the stages in lockstep"),
        _mistake(WRONG_STEP, "M instead of M - 1", r"expected [\d.]+ s", r"one micro-batch too many"),
    ),
    "activations_in_flight": (
        _mistake(WRONG_PEAKS, "every micro-batch", r"peaks \[8, 8, 8, 8\], expected \[4, 3, 2, 1\]",
                 r"frees a micro-batch's activations once its backward has run"),
        _mistake(WRONG_PEAKS, "by the kind of schedule", r"two forwards then one backward.*peaks \[1\], expected \[3\]",
                 r"guessed from its kind"),
        _mistake(WRONG_PEAKS, "an array of 32 steps", r"GPipe, S = 12, M = 40 \(steps 0 to 101\)",
                 r"the peaks of steps 0 to 31 only.*\(a loop or an array of fixed length"),
        _mistake(WRONG_PEAKS, "arrivals", r"out of micro-batch order.*peaks \[3\], expected \[2\]",
                 r"arrive while it is held"),
    ),
    "one_f_one_b": (
        _mistake(WRONG_1F1B, "one fewer in flight, none on the last stage", r"stage 0, the last, never ran a forward",
                 r"^it never had room\?.*stage 0"),
        _mistake(WRONG_1F1B, "none on the last stage, 2 stages", r"stage 2, the last, never ran a forward",
                 r"^it never had room\?.*stage 2"),
        _mistake(WRONG_1F1B, "one fewer in flight", r"a room of 1 on stage 0",
                 r"^a room too small: your schedule takes 12 steps, GPipe's 8\. What is the fewest room on stage 0"),
        _mistake(WRONG_1F1B, "one more in flight", r"stage 0 holds 3 micro-batches at once, where 1F1B's stage 0 holds "
                 r"at most 2", r"^a room larger than needed.*Try one less there"),
        _mistake(WRONG_1F1B, "one fewer in flight, a loop without a bound", r"your schedule did not end",
                 r"^a loop whose end never comes"),
        _mistake(WRONG_1F1B, "one step short", r"the last task.*the step before it", r"^an off-by-one"),
        _mistake(WRONG_1F1B, "a fixed number of steps", r"tasks never ran.*stop at step 29",
                 r"a loop stops at a fixed step"),
        _mistake(WRONG_1F1B, "GPipe", r"holds 4 micro-batches at once", r"GPipe's memory"),
    ),
}


def test_no_mistake_of_the_schedules_is_blamed_on_a_fixed_step_but_the_fixed_step():
    fixed = {("gpipe_schedule", "a fixed number of steps"), ("gpipe_schedule", "a fixed number of steps, zeros"),
             ("one_f_one_b", "a fixed number of steps")}
    for ex, table in (("gpipe_schedule", WRONG_SCHEDULE), ("one_f_one_b", WRONG_1F1B)):
        for name, (fn, _) in table.items():
            with pytest.raises(ExerciseError) as e:
                getattr(check, ex)(fn)
            assert ("a loop stops at a fixed step" in str(e.value)) == ((ex, name) in fixed), (name, str(e.value))


def test_lab_11_declares_its_exercises_in_the_pipeline_family():
    assert sorted(CONTRACT) == [e.name for e in in_lab("11")]
    for name in CONTRACT:
        assert exercise(name).lab == "11" and exercise(name).module == "model_parallel"


@pytest.mark.parametrize("name, wrong", [
    ("gpipe_schedule", WRONG_SCHEDULE["int8 steps"][0]), ("gpipe_schedule", WRONG_SCHEDULE["a fixed number of steps"][0]),
    ("one_f_one_b", WRONG_1F1B["int8 steps"][0]), ("pipeline_step_time", WRONG_STEP["lockstep"][0]),
    ("gpipe_schedule", WRONG_SCHEDULE["never ends"][0]),  # stopped while recorded: the replay names the stop too
    ("one_f_one_b", WRONG_1F1B["one fewer in flight, a loop without a bound"][0]),
    ("activations_in_flight", peaks_fixed_array), ("activations_in_flight", peaks_by_arrivals)])
def test_the_replay_names_the_mistakes_past_the_small_cases(tmp_path, monkeypatch, name, wrong):
    plain = record_check(monkeypatch, tmp_path, name, wrong, 7)  # int8 arrays, a raised OverflowError, drawn schedules
    assert plain[0] is False
    student_saw = re.sub(r"\nStep \d+ of \d+.*", "", plain[1], flags=re.S)
    assert replay.replay(name, tmp_path, 7) == (False, student_saw)


def test_stage_times_and_the_drawn_schedule():
    events = np.array([(0, 0, 0, 0.0, 1.0), (0, 0, 1, 1.0, 2.0), (1, 0, 0, 1.0, 4.0), (1, 1, 0, 4.0, 6.0),
                       (0, 1, 0, 6.0, 6.5), (1, 0, 1, 4.5, 7.5)])
    f, b = model_parallel.stage_times(events)
    assert f.tolist() == [1.0, 3.0] and b.tolist() == [0.5, 2.0]
    f, b = model_parallel.stage_times(np.vstack([events, [(1, 0, 2, 8.0, 10.0)]]))  # the mean: busy time / tasks
    assert f.tolist() == [1.0, 8 / 3]
    assert model_parallel.Timeline(events).span() == 7.5
    fig = model_parallel.draw_schedule(*model_parallel.gpipe_schedule(2, 3), title="t")
    assert fig.axes[0].get_xlabel() == "step" and len(fig.axes[0].patches) == 12
