"""The exercises of lab 10 (labkit.check.compression): their answers for the contract every exercise keeps
(``CONTRACT``, tests/test_contract.py: right, blank, hints, replay, labkit's own), and the typical wrong ones, each
named by the check's message.

The compressed allreduce runs on MPI ranks: here on one (a plain Python, singleton MPI); its mistakes that show only
on several ranks are the cases of tests/mpi/cases_compression_exercise.py, run under a real mpiexec on 1 to 4 ranks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import Answers, Reference, blank, ranks
from mpicases import mpi_cases

from labkit import check, compression, questions
from labkit.check import ExerciseError
from labkit.check.exercises import exercise, in_lab

# ---- right answers, as a student would write them ---------------------------------------------------------------

def right_int8(g):
    peak = np.abs(g).max()
    scale = peak / 127 if peak > 0 else 1.0
    return np.rint(g / scale).astype(np.int8), scale


def right_topk(g, k):
    order = np.argsort(np.abs(g))
    chosen = order[len(g) - min(k, len(g)):]
    return chosen, g[chosen]


def feedback_choosing_with(topk, g, residual, ratio):
    corrected = g + residual
    k = min(corrected.size, max(1, math.ceil(ratio * corrected.size)))
    indices, values = topk(corrected, k)
    left = corrected.copy()
    left[indices] = 0
    return indices, values, left


def right_feedback(g, residual, ratio):  # built on the student's own top-k, as lab 10 suggests
    return feedback_choosing_with(right_topk, g, residual, ratio)


def right_sum(pieces, n):
    out = np.zeros(n, dtype=pieces[0][1].dtype)
    for indices, values in pieces:
        np.add.at(out, indices, values)
    return out


def right_allreduce(comm, g, residual, ratio, index_dtype=np.int64, feedback=right_feedback):
    indices, values, new_residual = feedback(g, residual, ratio)
    p = comm.Get_size()
    all_indices = np.empty(p * len(indices), dtype=index_dtype)
    all_values = np.empty(p * len(values), dtype=g.dtype)
    comm.Allgather(np.asarray(indices, dtype=np.int64), all_indices)
    comm.Allgather(np.asarray(values, dtype=g.dtype), all_values)
    total = np.zeros(g.size, dtype=g.dtype)
    np.add.at(total, all_indices.astype(np.int64, copy=False), all_values)  # float indices: as a student rounds them
    return total / p, new_residual


def right_bytes(n, k, p):
    dense = 2 * (p - 1) * (n / p) * 4  # a reduce-scatter and an allgather: 2(p - 1) blocks of n / p float32 entries
    topk = (p - 1) * k * (4 + 4)  # every other rank's k int32 indices and k float32 values
    return dense, topk


RIGHT = {"int8_quantise": right_int8, "topk_select": right_topk, "sparse_sum": right_sum,
         "topk_feedback": right_feedback, "compressed_allreduce": right_allreduce, "bytes_per_step": right_bytes}


# ---- wrong answers, as students write them ------------------------------------------------------------------------

def int8_with(scale_of=lambda g: np.abs(g).max() / 127, rounding=np.rint):
    def fn(g):
        scale = scale_of(g)
        with np.errstate(divide="ignore", invalid="ignore"):
            return rounding(g / scale).astype(np.int8), scale
    return fn


def topk_with(order=lambda g: np.argsort(np.abs(g)), slice_=lambda order, k: order[-k:], values=lambda g, i: g[i]):
    def fn(g, k):
        chosen = slice_(order(g), k)
        return chosen, values(g, chosen)
    return fn


WRONG = {
    "int8_quantise": int8_with(scale_of=lambda g: np.abs(g).mean() / 127),
    "topk_select": topk_with(order=lambda g: np.argsort(g)),
    "sparse_sum": lambda pieces, n: overwriting(pieces, n),
    "topk_feedback": lambda g, r, ratio: right_feedback(g, np.zeros_like(r), ratio),
    "compressed_allreduce": lambda c, g, r, ratio: (right_allreduce(c, g, r, ratio)[0], r),  # the residual not updated
    "bytes_per_step": lambda n, k, p: (right_bytes(n, k, p)[0], p * 8 * k),  # its own piece counted as received
}


def test_lab_10_checks_one_exercise_on_every_engine():
    assert [e.name for e in in_lab("10") if e.mpi] == ["compressed_allreduce"]  # on every engine, checked there
    for ref in exercise("compressed_allreduce").references:  # each names a function or class of labkit that exists
        module, attr = ref.split(":")
        assert callable(getattr(__import__(module, fromlist=[attr]), attr)), ref


# ---- int8 quantisation --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("wrong, match", [
    (int8_with(scale_of=lambda g: np.abs(g).mean() / 127), "uses the mean magnitude, not the largest"),
    (int8_with(rounding=lambda x: x), r"astype\(np.int8\) cuts toward zero"),
    (int8_with(rounding=np.floor), "np.floor rounds down"),
    (int8_with(scale_of=lambda g: g.max() / 127), "largest value, not the largest magnitude"),
    (int8_with(scale_of=lambda g: np.abs(g).max() / 128), "lands on 128, which int8 cannot hold"),
    (int8_with(scale_of=lambda g: np.abs(g).max() / 255), "int8 is signed"),
    (int8_with(scale_of=lambda g: 127 / np.abs(g).max()), "upside down"),
    (int8_with(scale_of=lambda g: np.abs(g).max() / 100), "coarser than they need"),
    (int8_with(scale_of=lambda g: np.abs(g).max() / 127 if np.abs(g).max() > 0 else 0.0), "all-zero gradient"),
    (lambda g: (np.rint(g / (np.abs(g).max() / 127)), np.abs(g).max() / 127), "what travels must be int8"),
    (lambda g: right_int8(g)[0], r"expected a tuple \(q, scale\)"),
    (lambda g: (right_int8(g)[0], np.full(g.shape, right_int8(g)[1])), "one number for the whole tensor"),
])
def test_int8_mistakes_are_named(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.int8_quantise(wrong)


def test_int8_that_changes_its_input_is_named():
    def in_place(g):
        q, scale = right_int8(g)
        g /= scale
        return q, scale
    with pytest.raises(ExerciseError, match="g was modified"):
        check.int8_quantise(in_place)


# ---- top-k selection ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("wrong, match", [
    (topk_with(slice_=lambda order, k: order[:k]), "you return the k smallest magnitudes"),
    (topk_with(order=lambda g: np.argsort(g)), "you choose by value"),
    (topk_with(order=lambda g: np.argsort(-g)), "you return the most negative entries"),
    (topk_with(), r"x\[-0:\] is all of x"),
    (lambda g, k: right_topk(g, k) if k <= len(g) else np.argpartition(g, len(g) - k - 10), "k can be larger than n"),
    (lambda g, k: (np.argpartition(np.abs(g), len(g) - k)[len(g) - k:],) * 2 if 0 < k <= len(g) else right_topk(g, k),
     "not g at the indices"),
    (topk_with(slice_=lambda order, k: order[len(order) - min(k, len(order)):], values=lambda g, i: np.abs(g[i])),
     "the sign is lost"),
    (lambda g, k: right_topk(g, k + 1 if 0 < k < len(g) else k), "off by one"),
    (lambda g, k: (np.isin(np.arange(len(g)), right_topk(g, k)[0]), right_topk(g, k)[1]), "a mask"),
    (lambda g, k: list(right_topk(g, k)), r"expected a tuple \(indices, values\)"),
])
def test_topk_mistakes_are_named(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.topk_select(wrong)


def test_topk_of_k_zero_that_raises_is_named():
    def argpartition_only(g, k):
        n = len(g)
        chosen = np.argpartition(np.abs(g), n - min(k, n))[n - min(k, n):]
        return chosen, g[chosen]
    with pytest.raises(ExerciseError, match=r"k=0.*raised ValueError.*\n.*k = 0 asks for nothing"):
        check.topk_select(argpartition_only)


# ---- summing every rank's sparse pieces ----------------------------------------------------------------------------

def overwriting(pieces, n):
    out = np.zeros(n, dtype=pieces[0][1].dtype)
    for indices, values in pieces:
        out[indices] = values
    return out


def buffered(pieces, n):  # one fancy-indexed += over every piece at once: a repeated index adds once
    out = np.zeros(n, dtype=pieces[0][1].dtype)
    out[np.concatenate([i for i, _ in pieces])] += np.concatenate([v for _, v in pieces])
    return out


def in_float64(pieces, n):
    out = np.zeros(n)
    for indices, values in pieces:
        np.add.at(out, indices, values)
    return out


def only_as_long_as_sent(pieces, n):
    out = np.zeros(max(int(i.max()) for i, _ in pieces if i.size) + 1, dtype=pieces[0][1].dtype)
    for indices, values in pieces:
        np.add.at(out, indices, values)
    return out


def averaging(pieces, n):
    return right_sum(pieces, n) / len(pieces)


def sorting_in_place(pieces, n):
    for indices, values in pieces:
        order = np.argsort(indices)
        indices[:], values[:] = indices[order], values[order]
    return right_sum(pieces, n)


@pytest.mark.parametrize("wrong, match", [
    (overwriting, r"only one value arrived: out\[idx\] = v overwrites"),
    (buffered, "only one value arrived"),
    (in_float64, "the sum is float64, the values sent are float32"),
    (only_as_long_as_sent, "expected a dense array of 5 entries"),
    (averaging, "you average over the 3 pieces"),
    (sorting_in_place, "a piece was modified"),
    (lambda pieces, n: right_sum(pieces[:1], n), "every value of every piece"),
])
def test_sparse_sum_mistakes_are_named(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.sparse_sum(wrong)


def test_sparse_sum_that_fails_on_an_empty_piece_is_named():
    def no_empty(pieces, n):
        out = np.zeros(n, dtype=pieces[0][1].dtype)
        for indices, values in pieces:
            out[indices] += values if len(values) else 1 / 0
        return out
    with pytest.raises(ExerciseError, match=r"one empty: your function raised ZeroDivisionError(.|\n)*length 0"):
        check.sparse_sum(no_empty)


# ---- top-k with error feedback (more of its mistakes: tests/test_check.py) ------------------------------------------

def test_feedback_that_drops_the_residual_is_named():
    def forgets(g, residual, ratio):
        indices, values, _ = right_feedback(g, residual, ratio)
        return indices, values, np.zeros_like(g)
    with pytest.raises(ExerciseError, match="the residual is not carried to the next step"):
        check.topk_feedback(forgets)


def test_feedback_that_ignores_the_residual_is_named():
    with pytest.raises(ExerciseError, match=r"g \+ residual, not (from |of )g"):
        check.topk_feedback(WRONG["topk_feedback"])


# ---- the compressed allreduce: what one rank shows (the rest under mpiexec, below) ---------------------------------

def compressed_with(give=lambda new, old, g: new, mean=lambda m: m, **kw):
    def fn(c, g, residual, ratio):
        m, new = right_allreduce(c, g, residual, ratio, **kw)
        return mean(m), give(new, residual, g)
    return fn


def float_indices_added(c, g, residual, ratio):  # the indices received into a buffer of g's dtype, added at as they are
    indices, values, new_residual = right_feedback(g, residual, ratio)
    all_indices, all_values = np.empty(len(indices), dtype=g.dtype), np.empty(len(values), dtype=g.dtype)
    c.Allgather(indices, all_indices)
    c.Allgather(values, all_values)
    total = np.zeros(g.size, dtype=g.dtype)
    np.add.at(total, all_indices, all_values)
    return total, new_residual


def modifies_g(c, g, residual, ratio):
    g += residual
    return right_allreduce(c, g, np.zeros_like(residual), ratio)


@pytest.mark.parametrize("wrong, match", [
    (compressed_with(give=lambda new, old, g: old), "the residual came back as it was passed in: it was not updated"),
    (compressed_with(give=lambda new, old, g: np.zeros_like(g)), "the new residual is all zeros"),
    (compressed_with(give=lambda new, old, g: g + old), "the new residual still holds the entries sent"),
    (compressed_with(give=lambda new, old, g: None), "expected the new residual as an array of 50 entries"),
    (compressed_with(feedback=lambda g, r, ratio: right_feedback(g, np.zeros_like(r), ratio)), "chosen from g alone"),
    (compressed_with(index_dtype=np.float64), "the right values arrived, but at the wrong entries(?s:.*)int64 buffer"),
    (float_indices_added, r"raised IndexError(?s:.*)receive int64 indices into an int64 buffer"),
    (compressed_with(mean=lambda m: m.astype(np.float64)), r"n=10, ratio=0.3, float32, rank 0\): the mean is float64"),
    (compressed_with(mean=lambda m: m[m != 0]), "expected the mean as a dense array of 50 entries"),
    (compressed_with(mean=lambda m: m * np.nan), "the mean holds NaN or inf(?s:.*)buffer of their own dtype"),
    (modifies_g, "g was modified"),
    (lambda c, g, r, ratio: list(right_allreduce(c, g, r, ratio)), r"expected a tuple \(mean, new_residual\)"),
    (lambda c, g, r, ratio: my_topk_feedback(g, r, ratio),  # noqa: F821 - not yet on the engines
     r"raised NameError(?s:.*)my_topk_feedback"),
])
def test_compressed_allreduce_mistakes_one_rank_shows_are_named(wrong, match):
    with pytest.raises(ExerciseError, match=r"^compressed allreduce \(1 rank, (?s:.*)" + match):
        check.compressed_allreduce(wrong)


# the right answer passes on 1 to n ranks; blank is "not written yet"; each mistake is named where it shows (the sum for
# the mean, no exchange, an overwritten shared index: 2 ranks or more); the grader's replay gives the verdict
test_the_compressed_allreduce_check_under_mpiexec = mpi_cases("cases_compression_exercise.py", ranks(1, 2, 3, 4))


# ---- the bytes on each cable --------------------------------------------------------------------------------------

def bytes_with(dense=None, topk=None):
    def fn(n, k, p):
        d, t = right_bytes(n, k, p)
        return (d if dense is None else dense(n, k, p)), (t if topk is None else topk(n, k, p))
    return fn


def test_the_bytes_check_runs_its_six_cases_on_the_pair_it_is_given(capsys):
    seen = []
    check.bytes_per_step(lambda n, k, p: seen.append((n, k, p)) or right_bytes(n, k, p))
    assert capsys.readouterr().out.strip() == "✔ bytes per step: all 6 checks passed"
    assert seen[:3] == [(79_510, 796, 2), (79_510, 796, 4), (79_510, 796, 1)] and len(seen) == 6
    assert any(n % p for n, _, p in seen) and any(k == n for n, k, _ in seen)
    assert compression.bytes_per_step(79_510, 796, 1) == (0.0, 0.0)
    dense, topk = compression.bytes_per_step(500, 500, 4)
    assert topk > dense  # top-k of everything sends an index with every value: more than dense
    check.bytes_per_step(lambda n, k, p: (2 * (p - 1) * 4 * n // p, (p - 1) * 8 * k))  # whole bytes, rounded down


@pytest.mark.parametrize("wrong, match", [
    (bytes_with(dense=lambda n, k, p: 2 * (p - 1) * 4 * n), "carries the whole gradient"),
    (bytes_with(dense=lambda n, k, p: (p - 1) / p * 4 * n), "half the ring"),
    (bytes_with(dense=lambda n, k, p: 2 * (p - 1) / p * 8 * n), "a float32 entry is 4 bytes"),
    (bytes_with(dense=lambda n, k, p: 2 * (p - 1) * (n // p) * 4), r"n // p rounds the block down"),
    (bytes_with(topk=lambda n, k, p: (p - 1) * 4 * k), "you counted only the values"),
    (bytes_with(topk=lambda n, k, p: p * 8 * k), "counted this rank's own piece"),
    (bytes_with(topk=lambda n, k, p: 8 * k), "as if sent once to one neighbour"),
    (bytes_with(topk=lambda n, k, p: 8 * k if p == 1 else (p - 1) * 8 * k), "both are 0 at p = 1"),
    (bytes_with(dense=lambda n, k, p: 1.0), "your dense is 1.0 bytes, expected 318,040.0"),
    (lambda n, k, p: right_bytes(n, k, p)[::-1], r"your pair is \(topk, dense\)"),
    (lambda n, k, p: list(right_bytes(n, k, p)), r"expected a tuple \(dense, topk\), got list"),
    (lambda n, k, p: right_bytes(n, k, p)[0], r"expected a tuple \(dense, topk\), got float"),
    (bytes_with(topk=lambda n, k, p: np.full(2, 8.0 * k)), r"topk should be one number of bytes, got ndarray of shape \(2,\)"),
])
def test_bytes_per_step_mistakes_are_named(wrong, match):
    with pytest.raises(ExerciseError, match=r"^bytes per step: (?s:.*)" + match):
        check.bytes_per_step(wrong)


# ---- the contract's answers (tests/test_contract.py) -------------------------------------------------------------

def allreduce_with_labkits(c, g, residual, ratio):
    indices, values, new_residual = right_feedback(g, residual, ratio)
    return compression.sparse_allreduce(c, indices, values, g.size) / c.Get_size(), new_residual


LABKITS = {
    "int8_quantise": (Reference(compression.int8_nearest, "labkit.compression.int8_nearest"),),
    "topk_select": (Reference(compression.top_k_indices, "labkit.compression.top_k_indices"),),
    "sparse_sum": (Reference(compression.sparse_sum, "labkit.compression.sparse_sum"),),
    "topk_feedback": (Reference(compression.top_k_with_feedback, "labkit.compression.top_k_with_feedback"),
                      Reference(lambda g, r, ratio: feedback_choosing_with(compression.top_k_indices, g, r, ratio),
                                "labkit.compression.top_k_indices")),
    "compressed_allreduce": (Reference(allreduce_with_labkits, "labkit.compression.sparse_allreduce"),),
    "bytes_per_step": (Reference(compression.bytes_per_step, "labkit.compression.bytes_per_step"),
                       Reference(lambda n, k, p: tuple(compression.bytes_per_step(n, k, p)),
                                 "labkit.compression.bytes_per_step")),
}
PASSES = {"int8_quantise": "✔ int8 quantisation: all 7 checks passed", "topk_select": "✔ top-k selection: all 8 checks passed",
          "sparse_sum": "✔ summing sparse pieces: all 6 checks passed",
          "topk_feedback": "✔ top-k with error feedback: all 7 checks passed",
          "compressed_allreduce": "✔ compressed allreduce on 1 to 1 ranks: all 7 checks passed",
          "bytes_per_step": "✔ bytes per step: all 6 checks passed"}
CONTRACT = {name: Answers(RIGHT[name], WRONG[name], passes=PASSES[name], references=LABKITS[name]) for name in RIGHT}


def test_the_lab_falls_back_to_labkits_own_function_while_the_students_is_blank(capsys):
    assert questions.yours_or_labkits(blank, right_int8, np.ones(3), what="my_int8") is right_int8
    assert "my_int8 is not written yet: labkit's own runs in its place" in capsys.readouterr().out
    assert questions.yours_or_labkits(right_int8, None, np.ones(3)) is right_int8
    assert questions.yours_or_labkits(blank, None, what="my_topk_feedback") is None
    assert "waits until it runs" in capsys.readouterr().out
