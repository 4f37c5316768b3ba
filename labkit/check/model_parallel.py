"""Checks of lab 11: a hidden layer's neurons split over ranks (one rank's forward and backward), and the GPipe
pipeline (its schedule with unit-time tasks, then its step time with each stage's own times), the activations a
schedule holds, and 1F1B's schedule.

Each check runs the student's function on many sizes, against labkit's own (:mod:`labkit.model_parallel`), and
on failure names the mistake it recognises: blocks that overlap or leave neurons out, stages that start together,
errors that flow the wrong way, a step paced as if every stage were the slowest, tasks that never ran (by why: a
range or a loop one short, a fixed number of steps, a stage without room), a room larger or smaller than 1F1B's. A
schedule's function that does not end is stopped after far more lines of Python than any schedule needs, and named.
"""

from __future__ import annotations

import numbers
import sys

import numpy as np

from ..model_parallel import one_f_one_b_schedule, peak_activations
from ..model_parallel import pipeline_step_time as reference
from ..shards import shard_bounds
from . import capture
from .common import call, each_case, fail, one_number, passed, recorded
from .exercises import Exercise


def _relu(z):
    return np.maximum(z, 0.0)


def _integer(ex: str, where: str, name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        fail(ex, f"{where}: {name} must be a whole number (an int), got {type(v).__name__} {v!r}",
             "count neurons with integer arithmetic: // and % instead of /")
    return int(v)


# ---- exercise 1: one rank's block of a layer, forward ------------------------------------------------------------

# (neurons n, ranks p, inputs n_in, batch): divisible, not divisible, one rank, more ranks than neurons, one each
_PART_CASES = ((6, 2, 4, 3), (7, 3, 5, 2), (10, 4, 3, 1), (3, 5, 4, 2), (5, 1, 3, 4), (9, 9, 2, 3), (11, 4, 6, 5))


@recorded
def neuron_part(fn) -> None:
    """Exercise (lab 11): ``fn(W1, b1, x, rank, p) -> (lo, hi, h)``, rank ``rank`` of ``p``'s contiguous block of
    the layer's neurons and their ReLU outputs, shape (batch, hi - lo).

    Called for every rank of each case (n neurons over p ranks, n divisible by p or not, p = 1, p > n): the blocks
    must follow each other in rank order, cover all n neurons and differ in size by at most one; each ``h`` must be
    the layer's output for the rank's own neurons, and the parts side by side the whole layer.
    """
    ex = "one rank's neurons"
    fn = capture.student(fn, ex=ex)
    rng = np.random.default_rng(capture.seed(111))
    cases = list(_PART_CASES)
    n = int(rng.integers(12, 41))
    cases.append((n, int(rng.integers(2, 8)), int(rng.integers(2, 9)), int(rng.integers(1, 7))))
    for n, p, n_in, batch in each_case(cases):
        W, b, x = rng.standard_normal((n, n_in)), rng.standard_normal(n), rng.standard_normal((batch, n_in))
        where = f"n = {n} neurons, p = {p} ranks"
        parts = [_part(ex, fn, W, b, x, r, p, where) for r in range(p)]
        _check_blocks(ex, where, n, p, [(lo, hi) for lo, hi, _ in parts])
        for r, (lo, hi, h) in enumerate(parts):
            _check_part(ex, f"{where}, rank {r} (neurons {lo}..{hi - 1})", W, b, x, lo, hi, h)
        whole = np.concatenate([h for _, _, h in parts], axis=1)
        if not np.allclose(whole, _relu(x @ W.T + b), rtol=1e-6, atol=1e-9):
            fail(ex, f"{where}: the parts side by side in rank order are not the whole layer")
    passed(ex, len(cases))


def _part(ex, fn, W, b, x, r, p, where):
    got = call(ex, fn, W.copy(), b.copy(), x.copy(), r, p,
               hint="W1 has one row per neuron, shape (n, n_in); b1 one entry per neuron; x one row per sample")
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        fail(ex, f"{where}, rank {r}: expected a tuple (lo, hi, h), got {type(got).__name__}")
    lo, hi, h = got
    return _integer(ex, f"{where}, rank {r}", "lo", lo), _integer(ex, f"{where}, rank {r}", "hi", hi), h


def _check_blocks(ex, where, n, p, blocks) -> None:
    """Contiguous blocks in rank order from 0 to n, sizes within one of each other; the message names the gap,
    the overlap or the imbalance."""
    shown = ", ".join(f"rank {r}: {lo}..{hi - 1}" if hi > lo else f"rank {r}: none" for r, (lo, hi) in enumerate(blocks))
    for r, (lo, hi) in enumerate(blocks):
        if hi < lo:
            fail(ex, f"{where}: rank {r}'s block starts at {lo} and ends at {hi}, before it starts ({shown})",
                 "hi is one past the block's last neuron: hi >= lo, and hi = lo when a rank holds none")
        if lo < 0 or hi > n:
            fail(ex, f"{where}: rank {r}'s block {lo}..{hi - 1} runs outside the layer's neurons 0..{n - 1} ({shown})",
                 "with more ranks than neurons some ranks hold none (lo = hi)" if p > n else "")
    if blocks[0][0] != 0:
        fail(ex, f"{where}: neurons 0..{blocks[0][0] - 1} belong to no rank ({shown})", "rank 0's block starts at 0")
    for r in range(p - 1):
        (_, hi), (lo, _) = blocks[r], blocks[r + 1]
        if lo < hi:
            fail(ex, f"{where}: the blocks overlap: ranks {r} and {r + 1} both hold neurons {lo}..{hi - 1} ({shown})",
                 "each rank's block starts where the previous rank's ends")
        if lo > hi:
            fail(ex, f"{where}: neurons {hi}..{lo - 1} between ranks {r} and {r + 1} belong to no rank ({shown})",
                 "each rank's block starts where the previous rank's ends")
    if blocks[-1][1] != n:
        fail(ex, f"{where}: neurons {blocks[-1][1]}..{n - 1} belong to no rank ({shown})",
             f"when n is not divisible by p, n // p neurons each leave n % p = {n % p} over: they must go to ranks too")
    sizes = [hi - lo for lo, hi in blocks]
    if max(sizes) - min(sizes) > 1:
        base = n // p
        ceil = -(-n // p)
        if p > 1 and all(s == base for s in sizes[:-1]):
            hint = (f"the last rank takes all n % p = {n % p} left-over neurons: spread them one each over "
                    "different ranks")
        elif sizes == [min(n, (r + 1) * ceil) - min(n, r * ceil) for r in range(p)]:
            hint = (f"rounding n / p up gives the first ranks {ceil} each and leaves the last ranks what is left: "
                    f"which {p} sizes, none more than one apart, add up to {n}?")
        else:
            hint = (f"which {p} sizes, none more than one apart, add up to {n}? Then which ranks take the larger "
                    "size?")
        fail(ex, f"{where}: blocks of sizes {sizes} differ by more than one: one rank would wait for another ({shown})",
             hint)


def _check_part(ex, where, W, b, x, lo, hi, h) -> None:
    """``h`` is ReLU(x W[lo:hi]^T + b[lo:hi]); the message names a missing activation, bias, or a whole layer."""
    k, batch = hi - lo, x.shape[0]
    try:
        a = np.asarray(h, dtype=float)
    except (TypeError, ValueError):
        a = None
    if a is None or a.shape != (batch, k):
        shape = None if a is None else a.shape
        hint = ("one row per sample, one column per neuron: you have it transposed" if shape == (k, batch) and k != batch
                else "h holds this rank's neurons only, not the whole layer" if shape == (batch, W.shape[0])
                else "x @ (your rows of W1).T has one row per sample and one column per neuron")
        fail(ex, f"{where}: h has shape {shape}, expected ({batch}, {k})", hint)
    want = _relu(x @ W[lo:hi].T + b[lo:hi])
    if np.allclose(a, want, rtol=1e-6, atol=1e-9):
        return
    z = x @ W[lo:hi].T + b[lo:hi]
    for wrong, hint in ((want.T, "one row per sample, one column per neuron: you have it transposed"),
                        (z, "apply the activation: this layer is ReLU, max(z, 0)"),
                        (_relu(x @ W[lo:hi].T), "add your neurons' biases"),
                        (0.5 * (np.tanh(0.5 * z) + 1), "that is the sigmoid: this layer is ReLU, max(z, 0)")):
        if np.allclose(a, wrong, rtol=1e-6, atol=1e-9):
            fail(ex, f"{where}: wrong outputs", hint)
    fail(ex, f"{where}: h differs from the outputs of neurons {lo}..{hi - 1} by up to {np.abs(a - want).max():.3g}")


# ---- exercise 2: one rank's block, backward -------------------------------------------------------------------------

# (inputs n_in, hidden, outputs n_out, ranks p, batch): uneven, n_out above the block, empty blocks, one rank
_GRAD_CASES = ((5, 6, 3, 2, 4), (4, 7, 10, 3, 1), (3, 3, 2, 5, 2), (6, 9, 4, 1, 3), (7, 8, 5, 3, 6))


@recorded
def neuron_grads(fn) -> None:
    """Exercise (lab 11): ``fn(x, h, delta, W2, lo, hi) -> (dW1, db1)``, the gradients of a rank's rows lo..hi-1 of
    W1 and entries of b1 in ``[n_in, hidden, n_out]`` with ReLU, from its outputs ``h`` and the output layer's error
    ``delta`` (of the mean loss), against labkit's; every rank of 1 to 5 ranks, some blocks empty."""
    ex = "one rank's backward"
    fn = capture.student(fn, ex=ex)
    rng = np.random.default_rng(capture.seed(112))
    cases = list(_GRAD_CASES)
    cases.append((int(rng.integers(2, 9)), int(rng.integers(5, 16)), int(rng.integers(2, 11)), int(rng.integers(2, 5)),
                  int(rng.integers(2, 8))))
    for n_in, hidden, n_out, p, batch in each_case(cases):
        x = rng.standard_normal((batch, n_in))
        W1, b1 = rng.standard_normal((hidden, n_in)), rng.standard_normal(hidden)
        W2 = rng.standard_normal((n_out, hidden))
        h = _relu(x @ W1.T + b1)
        delta = rng.standard_normal((batch, n_out)) / batch
        for r, (lo, hi) in enumerate(shard_bounds(hidden, p)):
            where = f"[{n_in}, {hidden}, {n_out}], batch {batch}, rank {r} of {p} (neurons {lo}..{hi - 1})"
            got = call(ex, fn, x.copy(), h[:, lo:hi].copy(), delta.copy(), W2.copy(), lo, hi,
                       hint="delta is (batch, n_out) and W2 is (n_out, hidden): which part of W2 belongs to your neurons?")
            _check_grads(ex, where, got, x, h[:, lo:hi], delta, W2[:, lo:hi])
    passed(ex, len(cases))


def _check_grads(ex, where, got, x, h, delta, W2_mine) -> None:
    batch, k, n_in = x.shape[0], h.shape[1], x.shape[1]
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(ex, f"{where}: expected a pair (dW1, db1), got {type(got).__name__}")
    dW, db = (np.asarray(a, dtype=float) for a in got)
    if dW.shape != (k, n_in):
        hint = ("you have it transposed: one row per neuron, one column per input" if dW.shape == (n_in, k)
                else "dW1 has one row per neuron of yours and one column per input")
        fail(ex, f"{where}: dW1 has shape {dW.shape}, expected {(k, n_in)}", hint)
    if db.shape != (k,):
        hint = "db1 sums the error over the batch: one number per neuron" if db.shape == (batch, k) else ""
        fail(ex, f"{where}: db1 has shape {db.shape}, expected {(k,)}", hint)
    d = (delta @ W2_mine) * (h > 0)
    if np.allclose(dW, d.T @ x, rtol=1e-6, atol=1e-9) and np.allclose(db, d.sum(axis=0), rtol=1e-6, atol=1e-9):
        return
    plain = delta @ W2_mine
    wrong = [(plain, "multiply by ReLU's slope at your neurons: 1 where h > 0, 0 elsewhere"),
             (plain * h * (1 - h), "that is the sigmoid's slope, h (1 - h); this layer is ReLU: 1 where h > 0, else 0"),
             (plain * h, "ReLU's slope is 1 where h > 0 and 0 elsewhere, not h itself"),
             (d / batch, f"delta is already the error of the mean loss: do not divide by the batch ({batch}) again"),
             (d * batch, "keep delta as it is: it is already the error of the mean loss, do not scale it by the batch")]
    for e, hint in wrong:
        if np.allclose(dW, e.T @ x, rtol=1e-6, atol=1e-9):
            fail(ex, f"{where}: wrong dW1", hint)
    if np.allclose(dW, d.T @ x, rtol=1e-6, atol=1e-9):
        hint = ("db1 is the sum of the error over the batch, not its mean" if np.allclose(db, d.mean(axis=0))
                else "db1 is the error summed over the batch")
        fail(ex, f"{where}: dW1 is right but db1 is wrong", hint)
    fail(ex, f"{where}: dW1 differs from labkit's by up to {np.abs(dW - d.T @ x).max():.3g}")


# ---- exercise 3: the GPipe schedule with unit-time tasks ------------------------------------------------------------

# (stages S, micro-batches M): one stage, one micro-batch, more stages than micro-batches, the lab's 4 x 8; after them
# one drawn at random and one whose steps (to 157) pass any loop bound or table fitted to the others, and int8
_SCHEDULE_CASES = ((1, 1), (1, 4), (3, 1), (2, 3), (4, 8), (5, 2), (3, 6))
_LARGE_SCHEDULE = (16, 64)


def _schedule_sizes(rng) -> list[tuple[int, int]]:
    """The (S, M) of the schedule exercises: the fixed small ones, one drawn from 2-16 stages and 1-64 micro-batches,
    then the largest."""
    return [*_SCHEDULE_CASES, (int(rng.integers(2, 17)), int(rng.integers(1, 65))), _LARGE_SCHEDULE]


@recorded
def gpipe_schedule(fn) -> None:
    """Exercise (lab 11): ``fn(S, M) -> (forward, backward)``, the step at which each of S stages runs the forward
    and the backward of each of M micro-batches, every task one step long: integer arrays of shape (S, M).

    The rules, each checked on every task: steps count from 0; a stage runs one task a step; a forward follows the
    stage before's forward of the same micro-batch, a backward the stage after's backward; each stage runs all its
    forwards before its first backward (GPipe); and no task waits once its stage is free and its input has arrived.
    The backwards may take the micro-batches in any order. On 1 to 6 stages and 1 to 10 micro-batches, one drawn of up
    to 16 and 64, and 16 and 64 (steps to 157): tasks that never ran and a type too small for the steps are named.
    """
    ex = "GPipe schedule"
    fn = capture.student(fn, ex=ex)
    cases = _schedule_sizes(np.random.default_rng(capture.seed(113)))
    earlier = 0  # the most steps a case before this one needed
    for S, M in each_case(cases):
        where = f"S = {S} stage{'s' * (S != 1)}, M = {M} micro-batch{'es' * (M != 1)}"
        forward, backward = _schedule_arrays(ex, where, _run_schedule(ex, fn, S, M, where), S, M)
        _check_schedule(ex, where, forward, backward, earlier)
        earlier = max(earlier, 2 * (M + S - 1))
    passed(ex, len(cases))


# a schedule's function is stopped after this many lines of Python per task, and this many more: a simulation needs
# a few dozen lines a step, and a schedule of S stages and M micro-batches about S M of them per stage
_LINES_PER_TASK, _LINES_MORE = 2_000, 100_000
_STOPPED = "labkit stopped your function: it ran past the check's limit of lines"


def _run_schedule(ex, fn, S: int, M: int, where: str):
    """``fn(S, M)`` as :func:`call` runs it, but stopped, and the stop named, once it has run far more lines of Python
    than any schedule of these sizes needs: a loop that never ends fails instead of hanging the cell. The stop is a
    TimeoutError raised inside the student's code, so that a graded run records it and the replay says the same."""
    limit = _LINES_PER_TASK * 2 * S * M + _LINES_MORE

    def bounded(*args):
        count = [0]

        def line(frame, event, arg):
            if event == "line":
                count[0] += 1
                if count[0] > limit:
                    raise TimeoutError(_STOPPED)
            return line

        before = sys.gettrace()
        sys.settrace(lambda frame, event, arg: line)
        try:
            return fn(*args)
        except TimeoutError as e:
            if str(e) == _STOPPED:
                fail(ex, f"{where}: your schedule did not end: your function was stopped after {limit:,} lines of "
                         f"Python, far more than any schedule of its {2 * S * M} tasks needs",
                     "a loop whose end never comes: which condition ends it, and which task must run for it to hold? "
                     "Bound the loop (a few times the steps a schedule could need) and look at the arrays it returns: "
                     "which task never runs, and what does it wait for?")
            raise
        finally:
            sys.settrace(before)

    return call(ex, bounded, S, M, hint=_schedule_hint(S, M))


def _schedule_hint(S: int, M: int) -> str:
    """What to look at when the student's schedule raises on (S, M): past the small cases, a size or a type too small."""
    hint = "return two integer arrays of shape (S, M): forward[s, m] and backward[s, m]"
    if (S, M) not in _SCHEDULE_CASES:
        hint += (f". It ran on the smaller cases? This one runs to step {2 * (M + S - 1) - 1}: look for an array, a "
                 "loop or an integer type sized for those")
    return hint


def _schedule_arrays(ex, where, got, S, M):
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(ex, f"{where}: expected a pair (forward, backward), got {type(got).__name__}")
    out = []
    for name, a in zip(("forward", "backward"), got):
        try:
            arr = np.asarray(a)
            ok = arr.dtype.kind in "iu" or (arr.dtype.kind == "f" and np.all(np.isfinite(arr))
                                             and np.array_equal(arr, np.round(arr)))
        except (TypeError, ValueError):
            arr, ok = None, False
        if arr is None or arr.shape != (S, M):
            shape = None if arr is None else arr.shape
            hint = "one row per stage, one column per micro-batch" if shape == (M, S) else \
                f"{name}[s, m] is the step at which stage s runs micro-batch m"
            fail(ex, f"{where}: {name} has shape {shape}, expected ({S}, {M})", hint)
        if not ok:
            fail(ex, f"{where}: {name} must hold whole step numbers, got {arr.dtype}", "steps are integers 0, 1, 2, ...")
        last = 2 * (M + S - 1) - 1  # the last step of the shortest schedule
        if arr.dtype.kind in "iu" and np.iinfo(arr.dtype).max < last:
            fail(ex, f"{where}: {name} is an array of {arr.dtype}, which holds steps up to {np.iinfo(arr.dtype).max} "
                     f"only, and this schedule runs to step {last}",
                 "larger steps wrap around in so small a type: keep NumPy's default integers")
        out.append(arr.astype(np.int64))
    return out


def _check_schedule(ex, where, forward, backward, earlier: int = 0) -> None:
    """Every rule of the schedule, naming the first task that breaks one (``earlier``: the most steps any case before
    this one needed)."""
    S, M = forward.shape
    _check_basics(ex, where, forward, backward, earlier)
    for s in range(S):  # GPipe: fill, then drain
        last_forward, m_first = int(forward[s].max()), int(np.argmin(backward[s]))
        if backward[s, m_first] <= last_forward:
            early = (f"before its own forward of micro-batch {m_first} (step {forward[s, m_first]})"
                     if backward[s, m_first] < forward[s, m_first] else f"before its last forward (step {last_forward})")
            fail(ex, f"{where}: stage {s} runs the backward of micro-batch {m_first} at step {backward[s, m_first]}, "
                     f"{early}", "GPipe runs all forwards of a step first (the pipeline fills), then the backwards")
    _check_backwards_climb(ex, where, forward, backward)
    _check_no_waiting(ex, where, forward, backward)
    steps, fewest = int(max(forward.max(), backward.max())) + 1, 2 * (M + S - 1)
    if steps > fewest:
        fail(ex, f"{where}: the step takes {steps} steps where {fewest} suffice",
             "let each stage take the micro-batches in the order they arrive from the stage before")


def _never_ran(forward, backward) -> tuple[np.ndarray, np.ndarray] | None:
    """Where tasks never ran, the (forward, backward) masks of them: the tasks still at the value the arrays began
    with, a step below 0 held by more than stage 0's first forward (steps counted from -1 are another mistake), or 0
    held by a backward too (only stage 0's first forward can run at step 0, and it is taken to have run); None where
    every task ran."""
    first = int(min(forward.min(), backward.min()))
    f, b = forward == first, backward == first
    alone = int(f.sum() + b.sum()) == 1 and f[0, 0]
    if not ((first < 0 and not alone) or (first == 0 and b.any() and not alone)):
        return None
    if first == 0:
        f[0, 0] = False
    return f, b


def _check_all_ran(ex, where, forward, backward, earlier: int) -> None:
    """Tasks that never ran, named by why: no task ran, the tasks of one micro-batch or one stage left out (a range
    one short), the steps one short of the schedule's end (an off-by-one), a number of steps that fitted the earlier
    cases (``earlier``: the most steps one of them needed), or else a loop that ended before every task had run."""
    masks = _never_ran(forward, backward)
    if masks is None:
        return
    S, M = forward.shape
    f, b = masks
    first, n = int(min(forward.min(), backward.min())), int(f.sum() + b.sum())
    last = int(np.concatenate([forward[~f], backward[~b]]).max(initial=-1))  # the last step a task ran at
    left = (f"{n} of the {2 * S * M} tasks never ran: {'it still holds' if n == 1 else 'they still hold'} {first}, the "
            "value your arrays began with")
    if S * M == 1 and first == 0:  # [[0]], [[0]]: a backward run with its forward, or never run
        fail(ex, f"{where}: stage 0 runs the forward and the backward of micro-batch 0 both at step 0",
             "the backward has the error only the step after the forward: is yours a step early (an off-by-one in its "
             "step), or did your loop never run it, leaving the value your arrays began with?")
    if n == 1 and b[0].any() and last == 2 * (M + S - 1) - 2:  # one step short of GPipe's (and 1F1B's) end
        fail(ex, f"{where}: {left}: {_name_task(f, b)}, the last task, and the others stop at step {last}, the step "
                 "before it",
             "an off-by-one: counting from step 0, a schedule whose last task runs at step T takes how many steps? "
             "Does your loop (or the test that ends it) still run the step of the last task?")
    if n >= 2 * S * M - (first == 0):
        fail(ex, f"{where}: none of the {2 * S * M} tasks ran: your arrays still hold {first}, the value they began "
                 "with", "your loop ran no task: is its test false from the start, or a range one short (one that "
                         "stops before M or S runs none when M or S is 1)? On this case, which task runs first, and at "
                         "which step?")
    for name, count, whole in (("micro-batch", M, [k for k in range(M) if n == 2 * S and f[:, k].all() and b[:, k].all()]),
                               ("stage", S, [k for k in range(S) if n == 2 * M and f[k].all() and b[k].all()])):
        if count > 1 and whole and whole[0] in (0, count - 1):
            k = whole[0]
            fail(ex, f"{where}: {left}: every task of {name} {k}, {'the first' if k == 0 else 'the last'} of the "
                     f"{count}, and no other",
                 f"a range one short? range(a, b) runs a to b - 1: which {name}s, of 0 to {count - 1}, does yours run?")
    some = _name_task(f, b)
    if earlier and last + 1 >= earlier:
        fail(ex, f"{where}: {left}, {some} among them; the others stop at step {last}",
             f"right on the smaller cases, which ended by step {earlier - 1}? Then a loop stops at a fixed step, or an "
             "array is sized for those cases: run the steps until every task has run")
    fail(ex, f"{where}: {left}, {some} among them; the others stop at step {last}",
         "your loop ends before every task has run: which test ends it, and is every task done when it holds?")


def _name_task(f, b) -> str:
    """One task of the masks, the first backward where there is one, as the messages name it."""
    for task, mask in (("backward", b), ("forward", f)):
        if mask.any():
            s, m = (int(i[0]) for i in np.nonzero(mask))
            return f"stage {s}'s {task} of micro-batch {m}"
    return "no task"


def _check_basics(ex, where, forward, backward, earlier: int = 0) -> None:
    """Every task ran, steps from 0, one task a step, the forwards down the stages: the rules every schedule keeps."""
    S, M = forward.shape
    _check_all_ran(ex, where, forward, backward, earlier)
    first = int(min(forward.min(), backward.min()))
    if first != 0:
        fail(ex, f"{where}: the first task runs at step {first}",
             "steps count from 0: stage 0 runs the forward of micro-batch 0 at step 0")
    for s in range(S):  # one task at a time
        steps = np.concatenate([forward[s], backward[s]])
        values, counts = np.unique(steps, return_counts=True)
        if (counts > 1).any():
            t = int(values[counts > 1][0])
            tasks = [f"forward {m}" for m in range(M) if forward[s, m] == t] + \
                    [f"backward {m}" for m in range(M) if backward[s, m] == t]
            clash = s == S - 1 and len(tasks) == 2 and tasks[0] == f"forward {tasks[1].split()[1]}"
            fail(ex, f"{where}: stage {s} runs {' and '.join(tasks)} at the same step {t}",
                 "a step early: the last stage has a micro-batch's error only once its forward has run, the step "
                 "after it. An off-by-one in the step of the backward?" if clash else "a stage does one task a step")
    for s in range(1, S):  # forwards go down
        for m in range(M):
            t, before = forward[s, m], forward[s - 1, m]
            if t <= before:
                what = ("the stages start together" if t == before else f"stage {s} runs it first")
                fail(ex, f"{where}: {what}: stage {s} runs the forward of micro-batch {m} at step {t}, stage {s - 1} "
                         f"at step {before}",
                     f"a stage cannot begin micro-batch {m} before the stage before it has finished it: its input is "
                     "that stage's output")


def _check_backwards_climb(ex, where, forward, backward) -> None:
    """The errors start at the last stage and climb, each backward after the next stage's."""
    S, M = forward.shape
    if S > 1 and (backward[:-1] < backward[1:]).all():
        fail(ex, f"{where}: the backwards run from stage 0 down to stage {S - 1} (micro-batch 0: steps "
                 f"{backward[:, 0].tolist()})",
             "the backward goes the other way: the error starts at the last stage, where the loss is, and climbs up")
    for s in range(S - 1):  # backwards go up
        for m in range(M):
            t, after = backward[s, m], backward[s + 1, m]
            if t <= after:
                fail(ex, f"{where}: stage {s} runs the backward of micro-batch {m} at step {t}, stage {s + 1} at step "
                         f"{after}",
                     "the error flows from the last stage up to the first: a backward needs the error of the stage "
                     "after it")


def _check_no_waiting(ex, where, forward, backward) -> None:
    """No task starts later than its stage being free and its input having arrived allow (in the stage's own order
    of tasks, as the student scheduled them)."""
    S, M = forward.shape
    late = []
    for s in range(S):
        order = sorted([(int(forward[s, m]), 0, m) for m in range(M)] + [(int(backward[s, m]), 1, m) for m in range(M)])
        free = 0
        for t, kind, m in order:
            if kind == 0:
                ready = forward[s - 1, m] + 1 if s else 0
            else:
                ready = backward[s + 1, m] + 1 if s < S - 1 else 0
            could = max(free, int(ready))
            if t > could:
                late.append((t, s, kind, m, could))
            free = t + 1
    if late:
        t, s, kind, m, could = min(late)
        task = "forward" if kind == 0 else "backward"
        first_back = kind == 1 and s == S - 1 and t == could + 1 and t == int(backward[s].min())
        fail(ex, f"{where}: stage {s} waits: it runs the {task} of micro-batch {m} at step {t}, but was free and had its "
                 f"input at step {could}",
             "one step late: the last stage starts the backwards the step right after its last forward. An off-by-one "
             "in the step of the first backward?" if first_back else
             "start each task as soon as the stage is free and its input has arrived")


# ---- exercise 4: the step time with each stage's own times -----------------------------------------------------------

_STEP_CASES = (([1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 2.0, 2.0], 8),  # equal stages
               ([3.0], [5.0], 4),  # one stage
               ([1.0, 2.0, 3.0], [2.0, 1.0, 4.0], 1),  # one micro-batch
               ([1.0, 4.0, 1.0], [2.0, 2.0, 2.0], 5),  # one slow stage
               ([4.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 3.0], 6),  # slow in the forward here, in the backward there
               ([1.0, 1.5, 1.0, 1.0, 1.0], [2.0, 2.0, 2.5, 2.0, 2.0], 2))  # more stages than micro-batches
_LARGE_STEP = (12, 48)  # past any array, loop or formula fitted to the cases above


@recorded
def pipeline_step_time(fn) -> None:
    """Exercise (lab 11): ``fn(fwd, bwd, M) -> seconds``, one GPipe step of M micro-batches when stage s takes
    ``fwd[s]`` and ``bwd[s]`` seconds per micro-batch (messages free), against labkit's; equal stages, one stage,
    one micro-batch, a slow stage, different slowest stages forward and backward, one drawn at random (2 to 12
    stages, 1 to 64 micro-batches) and one of 12 stages and 48 micro-batches."""
    ex = "pipeline step time"
    fn = capture.student(fn, ex=ex)
    rng = np.random.default_rng(capture.seed(114))
    cases = [(np.array(f), np.array(b), M) for f, b, M in _STEP_CASES]
    S = int(rng.integers(2, 13))
    cases.append((np.round(rng.uniform(0.5, 3.0, S), 3), np.round(rng.uniform(0.5, 3.0, S), 3), int(rng.integers(1, 65))))
    large = np.random.default_rng(1114)  # the same large case in every run
    S, M = _LARGE_STEP
    cases.append((np.round(large.uniform(0.5, 3.0, S), 3), np.round(large.uniform(0.5, 3.0, S), 3), M))
    for k, (f, b, M) in enumerate(each_case(cases)):
        where = f"fwd = {f.tolist()}, bwd = {b.tolist()}, M = {M}"
        hint = "fwd and bwd are NumPy arrays of one time per stage"
        if k >= len(_STEP_CASES):
            hint += (f". It ran on the smaller cases? This one has {len(f)} stages and {M} micro-batches: look for an "
                     "array or a loop sized for those")
        got = call(ex, fn, f.copy(), b.copy(), M, hint=hint)
        _check_step(ex, where, got, f, b, M, reference(f, b, M))
    passed(ex, len(cases))


def _lockstep(f, b, M: int) -> float:
    """The step if every stage waited, at each step of GPipe's unit-time schedule, for that step's slowest task."""
    from ..model_parallel import gpipe_schedule

    forward, backward = gpipe_schedule(len(f), M)
    slowest = np.zeros(1 + int(max(forward.max(), backward.max())) if forward.size else 0)
    for steps, took in ((forward, f), (backward, b)):
        np.maximum.at(slowest, steps.ravel(), np.repeat(took, M))
    return float(slowest.sum())


def _check_step(ex, where, got, f, b, M, want) -> None:
    value = one_number(ex, where, got, "expected one number (seconds)", "return the time the whole step takes")
    if np.isclose(value, want, rtol=1e-9, atol=1e-12):
        return
    S = len(f)
    wrong = [
        ((M + S - 1) * (f.mean() + b.mean()), "that is (M + S - 1)(f + b) with the stages' mean times: it holds for "
         "equal stages only; a slower stage makes the stages after it wait"),
        ((M + S - 1) * (f + b).max(), "that paces every stage as the slowest one: the pipeline fills and drains "
         "through each stage at that stage's own speed"),
        ((M + S - 1) * (f.max() + b.max()), "that paces every stage as the slowest one: the pipeline fills and drains "
         "through each stage at that stage's own speed"),
        (M * (f + b).sum(), "that runs the stages one after another: while stage 1 works on micro-batch 0, stage 0 "
         "already runs micro-batch 1"),
        ((f + b).sum() + (M - 1) * (f + b).max(), "the forwards and the backwards each wait for their own slowest "
         "stage: a stage slow in the forward may be quick in the backward"),
        (f.sum() + (M - 1) * f.max(), "that is only the forwards: the step ends when stage 0 finishes its last "
         "backward"),
        (f.sum() + M * f.max() + b.sum() + M * b.max(), "one micro-batch too many: the first micro-batch's trip "
         "through all the stages is already one of the M"),
        ((M + S - 1) * (f.sum() + b.sum()), "each time step of the schedule lasts as long as that stage's task, not "
         "as long as all stages together"),
        (_lockstep(f, b, M), "that moves the stages in lockstep, each step of the unit-time schedule as long as its "
         "slowest task; a stage does not wait for the others' tasks, only for its own input"),
    ]
    for w, hint in wrong:
        if not np.isclose(w, want, rtol=1e-9) and np.isclose(value, w, rtol=1e-9, atol=1e-12):
            fail(ex, f"{where}: {value:.6g} s, expected {want:.6g} s", hint)
    fail(ex, f"{where}: {value:.6g} s, expected {want:.6g} s")


# ---- exercise 5: the activations a schedule holds -------------------------------------------------------------------

def _interleaved_one_stage(M: int) -> tuple[np.ndarray, np.ndarray]:
    """One stage running F0 F1 B0 F2 F3 B1 F4 ... then the rest of the backwards: its peak comes after its first
    backward, so counting the forwards before that backward falls short."""
    f, b, t, nf, nb = np.zeros((1, M), int), np.zeros((1, M), int), 0, 0, 0
    while nb < M:
        if nf < M and (nf - nb < 2 or nf % 2):
            f[0, nf], nf = t, nf + 1
        else:
            b[0, nb], nb = t, nb + 1
        t += 1
    return f, b


# One stage running F0 B0 F1 F2 B2 F3 B1 B3: two held at most, though three arrive while micro-batch 1 is held
_OUT_OF_ORDER = (np.array([[0, 2, 3, 5]]), np.array([[1, 6, 4, 7]]))


def _one_at_a_time_then_fill(S: int, M: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The first k micro-batches one at a time (each down and back up the stages before the next enters), then the
    rest as GPipe runs them: a valid schedule longer than GPipe's, whose peak comes after step 2(M + S - 1)."""
    from ..model_parallel import gpipe_schedule

    f, b = np.zeros((S, M), int), np.zeros((S, M), int)
    for m in range(k):
        f[:, m], b[:, m] = 2 * S * m + np.arange(S), 2 * S * m + 2 * S - 1 - np.arange(S)
    rest_f, rest_b = gpipe_schedule(S, M - k)
    f[:, k:], b[:, k:] = rest_f + 2 * S * k, rest_b + 2 * S * k
    return f, b


def _random_schedule(rng, S: int, M: int, idle: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    """A valid schedule drawn at random: each step, each stage runs one of the tasks whose input has arrived (any
    micro-batch, forwards and backwards mixed, so the backwards come in any order) or, now and then, idles."""
    f, b = np.full((S, M), -1), np.full((S, M), -1)
    t = 0
    while (b < 0).any():
        for s in range(S):  # a task run at step t is seen by the others from step t + 1
            ready = [(f, m) for m in range(M) if f[s, m] < 0 and (s == 0 or 0 <= f[s - 1, m] < t)]
            ready += [(b, m) for m in range(M) if b[s, m] < 0 and 0 <= (b[s + 1, m] if s < S - 1 else f[s, m]) < t]
            if ready and rng.random() >= idle:
                steps, m = ready[int(rng.integers(len(ready)))]
                steps[s, m] = t
        t += 1
    return f, b


@recorded
def activations_in_flight(fn) -> None:
    """Exercise (lab 11): ``fn(forward, backward) -> peak``, an integer array of one entry per stage: the most
    micro-batches whose activations the stage keeps at once in the schedule ``(forward, backward)`` (integer
    arrays of shape (S, M), :func:`gpipe_schedule`'s form), stored by its forward and freed once its backward's step is
    over; on GPipe's and 1F1B's schedules (one drawn of up to 12 stages and 40 micro-batches, and GPipe's
    of 12 and 40) and on schedules of neither kind: a peak after a backward, backwards out of micro-batch order, idle
    steps that make it longer than GPipe's, and a valid schedule drawn at random."""
    from ..model_parallel import gpipe_schedule, one_f_one_b_schedule, peak_activations

    ex = "activations in flight"
    fn = capture.student(fn, ex=ex)
    rng = np.random.default_rng(capture.seed(115))
    S, M = int(rng.integers(2, 13)), int(rng.integers(2, 41))
    cases = [("GPipe", *gpipe_schedule(4, 8)), ("1F1B", *one_f_one_b_schedule(4, 8)),
             ("GPipe", *gpipe_schedule(1, 1)), ("GPipe", *gpipe_schedule(3, 1)),
             ("1F1B", *one_f_one_b_schedule(2, 3)), ("1F1B", *one_f_one_b_schedule(5, 2)),
             ("one stage, two forwards then one backward", *_interleaved_one_stage(7)),
             ("1F1B", *one_f_one_b_schedule(S, M)),
             ("one stage, backwards out of micro-batch order", *_OUT_OF_ORDER),
             ("three micro-batches one at a time, then the rest as GPipe", *_one_at_a_time_then_fill(3, 8, 3)),
             ("a valid schedule drawn at random", *_random_schedule(rng, int(rng.integers(2, 6)), int(rng.integers(4, 11)))),
             ("GPipe", *gpipe_schedule(12, 40))]
    for name, forward, backward in each_case(cases):
        S, M = forward.shape
        where = f"{name}, S = {S}, M = {M} (steps 0 to {int(max(forward.max(), backward.max()))})"
        got = call(ex, fn, forward.copy(), backward.copy(), where=where,
                   hint="forward and backward are integer arrays of shape (S, M): the step of each stage's task; it ran "
                        "on the cases before this one? Then look for an array or a loop sized for those")
        _check_peak(ex, where, got, forward, backward, peak_activations(forward, backward))
    passed(ex, len(cases))


def _check_peak(ex, where, got, forward, backward, want) -> None:
    S, M = forward.shape
    try:
        a = np.asarray(got)
        ok = a.dtype.kind in "iub" or (a.dtype.kind == "f" and np.all(np.isfinite(a)) and np.array_equal(a, np.round(a)))
    except (TypeError, ValueError):
        a, ok = None, False
    if a is None or a.shape != (S,):
        shape = None if a is None else a.shape
        hint = ("one number per stage: the most it holds at any step, not the count at every step"
                if shape is not None and len(shape) == 2 else
                "one number per stage, not one for the whole pipeline" if shape == () else
                "return an array of S whole numbers, one per stage")
        fail(ex, f"{where}: expected an array of shape ({S},), got shape {shape}", hint)
    if not ok:
        fail(ex, f"{where}: the peaks must be whole numbers of micro-batches, got {a.dtype}")
    a = a.astype(np.int64)
    if np.array_equal(a, want):
        return
    shown = f"{where}: peaks {a.tolist()}, expected {want.tolist()}"
    for w, hint in _wrong_peaks(forward, backward, want):
        if not np.array_equal(w, want) and np.array_equal(a, w):
            fail(ex, shown, hint)
    _check_cut_short(ex, shown, a, forward, backward, want)
    fail(ex, shown)


def _wrong_peaks(forward, backward, want) -> list[tuple[np.ndarray, str]]:
    """The peaks of the typical mistakes, each with its hint: counts that hold on GPipe and 1F1B only."""
    S, M = forward.shape
    first_backward = np.array([int((forward[s] < backward[s].min()).sum()) for s in range(S)])
    arrivals = np.array([max(int(((forward[s] >= forward[s, m]) & (forward[s] <= backward[s, m])).sum()) for m in range(M))
                         for s in range(S)])
    return [(np.full(S, M), "that counts every micro-batch: a stage frees a micro-batch's activations once its "
             "backward has run"),
            (first_backward, "that counts the forwards run before the stage's first backward: the peak can come "
             "later, when forwards and backwards alternate"),
            (np.full(S, want.max()), "each stage has its own peak: the most that stage holds, not the pipeline's"),
            (np.minimum(S - np.arange(S), M), "those are the peaks of 1F1B's schedule, guessed from its kind; this "
             "schedule is not 1F1B's: count what it holds, step by step"),
            (arrivals, "that counts, for each micro-batch, those that arrive while it is held (or frees them in "
             "micro-batch order); some of them are freed before the later ones arrive: count the micro-batches held at "
             "one step at a time")]


def _check_cut_short(ex, shown, a, forward, backward, want) -> None:
    """Fail, naming it, where ``a`` holds the peaks of the schedule's first steps only (a loop or an array of fixed
    length, or GPipe's step count taken for every schedule's)."""
    S, M = forward.shape
    steps = np.arange(1 + int(max(forward.max(), backward.max())))
    held = ((forward[:, :, None] <= steps) & (steps <= backward[:, :, None])).sum(axis=1)
    so_far = np.maximum.accumulate(held, axis=1)  # column t: the peaks of steps 0..t
    cuts = [t for t in range(len(steps)) if np.array_equal(so_far[:, t], a) and not np.array_equal(so_far[:, t], want)]
    if not cuts:
        return
    gpipe_last = 2 * (M + S - 1) - 1
    if gpipe_last in cuts:
        fail(ex, shown, f"those are the peaks of steps 0 to {gpipe_last} only: 2(M + S - 1) steps are GPipe's and "
             f"1F1B's, and this schedule runs to step {steps[-1]}: count to its own last step")
    fail(ex, shown, f"those are the peaks of steps 0 to {cuts[-1]} only, and this schedule runs to step {steps[-1]}: "
         "count to its own last step (a loop or an array of fixed length?)")


# ---- exercise 6: 1F1B, the same steps with less memory --------------------------------------------------------------

@recorded
def one_f_one_b(fn) -> None:
    """Exercise (lab 11): ``fn(S, M) -> (forward, backward)``, 1F1B's schedule with unit-time tasks in
    :func:`gpipe_schedule`'s form. The rules, each checked and named: the basic ones of GPipe's exercise, the
    backwards of a stage oldest micro-batch first, each stage's room (the micro-batches it may hold in flight) the
    fewest that keep the schedule as short as GPipe's, and each step the oldest backward if its error has arrived,
    else the next forward if its input has arrived and there is room; then the whole schedule against labkit's. The
    same cases as GPipe's schedule, up to 16 stages and 64 micro-batches; a function still running after far more
    lines of Python than a schedule needs is stopped, and the stop named."""
    ex = "1F1B schedule"
    fn = capture.student(fn, ex=ex)
    cases = _schedule_sizes(np.random.default_rng(capture.seed(116)))
    earlier = 0  # the most steps a case before this one needed
    for S, M in each_case(cases):
        where = f"S = {S} stage{'s' * (S != 1)}, M = {M} micro-batch{'es' * (M != 1)}"
        forward, backward = _schedule_arrays(ex, where, _run_schedule(ex, fn, S, M, where), S, M)
        _check_last_stage_started(ex, where, forward, backward)
        _check_basics(ex, where, forward, backward, earlier)
        _check_backwards_climb(ex, where, forward, backward)
        for m in range(M):
            if backward[S - 1, m] <= forward[S - 1, m]:
                fail(ex, f"{where}: the last stage runs the backward of micro-batch {m} at step {backward[S - 1, m]}, "
                         f"before its forward (step {forward[S - 1, m]})",
                     "a micro-batch's error starts at the last stage, once its forward there has run")
        room = np.minimum(S - np.arange(S), M)
        held = peak_activations(forward, backward)
        if (held > room).any():
            s = int(np.argmax(held > room))
            steps = 1 + int(max(forward.max(), backward.max()))
            gpipe = (forward.max(axis=1) < backward.min(axis=1)).all()  # every stage: all forwards first
            fail(ex, f"{where}: stage {s} holds {held[s]} micro-batches at once, where 1F1B's stage {s} holds at most "
                     f"{room[s]}",
                 "that is GPipe's memory: all forwards first. In 1F1B a stage runs a backward as soon as its error "
                 "has arrived, and a forward only while it has room" if gpipe else
                 f"a room larger than needed: your schedule takes {steps} steps; is that the fewest room on stage "
                 f"{s} that keeps it so short? Try one less there and count the steps")
        for s in range(S):
            if (np.diff(backward[s]) < 0).any():
                fail(ex, f"{where}: stage {s} runs the backwards in the order {np.argsort(backward[s]).tolist()}",
                     "1F1B frees the oldest micro-batch first: the backwards of a stage run in micro-batch order")
        _check_against(ex, where, forward, backward, *one_f_one_b_schedule(S, M))
        earlier = max(earlier, 2 * (M + S - 1))
    passed(ex, len(cases))


def _check_last_stage_started(ex, where, forward, backward) -> None:
    """The last stage never ran a forward though micro-batch 0's input had arrived, and so no backward ran anywhere:
    its room was 0 (a room one short of 1F1B's on every stage leaves the last none)."""
    masks = _never_ran(forward, backward)
    S, M = forward.shape
    if masks is None or not masks[0][S - 1].all() or not masks[1].all() or (S > 1 and masks[0][S - 2, 0]):
        return
    came = 0 if S == 1 else int(forward[S - 2, 0]) + 1
    fail(ex, f"{where}: stage {S - 1}, the last, never ran a forward, though micro-batch 0's input was there from "
             f"step {came}; so no error came back, and no backward ran",
         "it never had room? The last stage holds a micro-batch from its forward through its backward: what does "
         f"your room give for stage {S - 1}, and how many must it hold at least?")


def _check_against(ex, where, forward, backward, want_f, want_b) -> None:
    """The first task, in step order, that runs at another step than 1F1B's rule runs it; a forward that waited with
    its input there and fewer micro-batches in flight than 1F1B's room is named a room too small."""
    differ = [(int(min(forward[s, m], want_f[s, m])), "forward", s, m, forward[s, m], want_f[s, m])
              for s, m in zip(*np.nonzero(forward != want_f))]
    differ += [(int(min(backward[s, m], want_b[s, m])), "backward", s, m, backward[s, m], want_b[s, m])
               for s, m in zip(*np.nonzero(backward != want_b))]
    if not differ:
        return
    _, task, s, m, got, want = min(differ)
    S, M = forward.shape
    said = f"{where}: stage {s} runs the {task} of micro-batch {m} at step {got}; 1F1B's rule runs it at step {want}"
    if task == "forward" and got > want:
        t = int(want)
        busy = (forward[s] == t).any() or (backward[s] == t).any()
        arrived = s == 0 or forward[s - 1, m] < t
        in_flight = int((forward[s] < t).sum() - (backward[s] < t).sum())
        if not busy and arrived and in_flight < S - s:
            steps, gpipe = 1 + int(max(forward.max(), backward.max())), 2 * (M + S - 1)
            longer = (f"your schedule takes {steps} steps, GPipe's {gpipe}" if steps > gpipe else
                      "on more micro-batches your schedule would take more steps than GPipe's")
            fail(ex, f"{said}: at step {t} it waits, free, with its input there and {in_flight} micro-batch"
                     f"{'es' * (in_flight != 1)} in flight: a room of {in_flight} on stage {s}",
                 f"a room too small: {longer}. What is the fewest room on stage {s} that keeps the step as short? "
                 "Count the steps between its forward of a micro-batch and that micro-batch's backward")
    if got > want:
        hint = (f"at step {want} stage {s} was free, its input had arrived" + (" and it had room" if task == "forward"
                else "") + ": a task waits only when the rule says so")
    else:
        hint = ("each step, a backward whose error has arrived goes first; a forward runs only when there is none"
                if task == "forward" else "a backward's error arrives the step after the next stage ran it")
    fail(ex, said, hint)


EXERCISES = (
    Exercise("neuron_part", "11", references=(
        "labkit.model_parallel:neuron_part", "labkit.model_parallel:NeuronParallel", "labkit.shards:shard_bounds"),
        hints=(
            "Neuron j of the layer has row j of W1 as its weights and b1[j] as its bias; a rank holding neurons "
            "lo..hi-1 needs only those rows and entries.",
            "Split n neurons over p ranks: n // p each leaves n % p over. Give those to different ranks, one each, "
            "so no two blocks differ by more than one.",
            "Rank r's block starts where rank r-1's ends: lo is the sum of the sizes of ranks 0..r-1. If the first "
            "n % p ranks hold one more, how many of the ranks before r do?",
            "By hand, n = 7 neurons on p = 3 ranks: which neurons does each rank hold? For rank 1, which rows of W1 "
            "and entries of b1 does it use, and what shape is its h for a batch of 2 samples?",
        )),
    Exercise("neuron_grads", "11", references=(
        "labkit.model_parallel:neuron_part_grads", "labkit.model_parallel:NeuronParallel"),
        hints=(
            "As in lab 01: what is a hidden neuron's error made of (the error it passes on, and the activation), and "
            "how do a layer's dW and db follow from its error and its input?",
            "Hidden neuron j reaches every output through column j of W2 (W2 is (n_out, hidden)): the error "
            "reaching your neurons comes from delta and your columns of W2 only.",
            "What is ReLU's slope at a neuron whose output h is 0, and at one whose output is positive? Everything "
            "you need is on your rank: how many messages does the backward need?",
        )),
    Exercise("gpipe_schedule", "11", references=("labkit.model_parallel:gpipe_schedule",),
             hints=(
                 "Draw a grid for S = 2, M = 3: one row per stage, one column per step. Micro-batch 0 enters stage "
                 "0 at step 0; where can micro-batch 0 be at step 1, and micro-batch 1?",
                 "A forward can run one step after the stage before ran it (its input arrives) and one step after "
                 "the same stage's previous task. With unit times, how far apart are stage s and stage s-1?",
                 "The last stage starts the backwards right after its last forward. The errors then climb one "
                 "stage a step, as the activations came down: draw the second half as a mirror of the first.",
                 "Count your grid: how many steps does the last stage wait before its first forward, and how many "
                 "after its last backward does stage 0 finish?",
             )),
    Exercise("pipeline_step_time", "11", references=("labkit.model_parallel:pipeline_step_time",),
             hints=(
                 "Simulate it with two kinds of clock: for each stage, the time it can take its next task; for "
                 "each micro-batch, the time its input reaches the stage you are at. When can a task start?",
                 "Forwards: stage by stage from the first, micro-batch by micro-batch. Backwards: stage by stage "
                 "from the last. At what time can the last stage start its first backward?",
                 "Test it on equal stages with f = b = 1 second first: it must give the step count of your GPipe "
                 "schedule. Then make one stage slower by hand: which micro-batches wait for it?",
             )),
    Exercise("activations_in_flight", "11", references=("labkit.model_parallel:peak_activations",),
             hints=(
                 "Take one stage and one step t. Which micro-batches has it stored by then, and not yet freed? Which "
                 "two comparisons of t with forward[s, m] and backward[s, m] say so?",
                 "The stage's peak is the largest of those counts. Which steps must you look at: from which one to "
                 "which one?",
                 "Check by hand on GPipe with S = 2, M = 3: each stage runs all 3 forwards before any backward. What "
                 "must the peaks be?",
                 "By hand, one stage that runs F0 F1 B0 F2 F3 B1 B2 B3 at steps 0 to 7 (F: a forward, B: a backward, "
                 "of that micro-batch): which micro-batches does it hold at each step? What is its peak, and at which "
                 "step does it come?",
             )),
    Exercise("one_f_one_b", "11", references=("labkit.model_parallel:one_f_one_b_schedule",),
             hints=(
                 "Simulate step by step. Keep, per stage, how many forwards and how many backwards it has run: a stage "
                 "that has run n forwards runs micro-batch n's forward next, and the same for backwards. Start the "
                 "arrays at a value no step can take: a task has run before step t when its entry is set and below t.",
                 "The room, first on the last stage: it runs a micro-batch's backward the step after its forward. How "
                 "many micro-batches must it be able to hold, and does it ever need more?",
                 "Then find the rooms by experiment: give your simulation one room per stage, and count the steps "
                 "for S = 4, M = 8 against GPipe's. Lower one stage's room at a time: where does the step grow?",
                 "Which rule in S and s gives the rooms you found for S = 4? Does it give the same for S = 3, and the "
                 "last stage's room?",
             )),
)
