"""The exercises of labs 07 and 08 that price communication on a network that costs (labkit.check.ring and
labkit.check.data_parallel): lab 07's time of an allreduce's traffic log on one cable per rank, lab 08's blocking
and overlapped step.

Their answers for the contract every exercise keeps (``CONTRACT``, tests/test_contract.py: right, blank, hints, replay,
labkit's own), and the typical wrong ones, each named by the check's message."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import Answers, Reference, record_check

from labkit import check, costmodel, data_parallel
from labkit.check import ExerciseError
from labkit.check import ring as checks
from labkit.check.exercises import exercise
from labkit.grading import replay

SEED = 4444


# ---- right answers, as a student would write them ---------------------------------------------------------------

def right_cable_seconds(log, p, alpha, beta):
    total = 0.0
    for r in np.unique(log[:, 3]):
        msgs = log[log[:, 3] == r]
        out, into = np.zeros(p), np.zeros(p)
        for src, dst, nbytes, _ in msgs:
            out[src] += alpha + nbytes * beta
            into[dst] += alpha + nbytes * beta
        total += max(out.max(), into.max())
    return total


def right_overlap_model(backprop, ready, seconds):
    free = 0.0
    for r, s in zip(ready, seconds):
        free = max(free, r) + s
    return backprop + sum(seconds), max(backprop, free)



def test_the_models_give_lab_06s_formulas_for_lab_07s_allreduces():
    m, p, a, b = 80_000, 4, 1e-4, 8e-8
    assert costmodel.cable_seconds(checks._naive_log(p, m), p, a, b) == pytest.approx((p - 1) * (a + m * b))
    assert costmodel.cable_seconds(checks._ring_log(p, m // 8), p, a, b) == pytest.approx(2 * (p - 1) * (a + m / p * b))
    assert costmodel.cable_seconds(np.zeros((0, 4), dtype=np.int64), 1, a, b) == 0.0
    assert data_parallel.overlapped_end([0.0, 0.01], [0.05, 0.05]) == pytest.approx(0.1)
    assert data_parallel.step_model(0.2, [0.0, 0.01], [0.05, 0.05]) == pytest.approx((0.3, 0.2))
    with pytest.raises(ValueError):
        data_parallel.overlapped_end([0.0], [0.1, 0.2])


# ---- the typical mistakes, each named ---------------------------------------------------------------------------

def cables(cost_of_round, alpha_once=False):
    """A cable_seconds answer that sums cost_of_round(out, into) over the rounds."""
    def fn(log, p, alpha, beta):
        total = 0.0
        for r in np.unique(log[:, 3]):
            msgs = log[log[:, 3] == r]
            a = 0.0 if alpha_once else alpha
            out = np.bincount(msgs[:, 0], weights=a + msgs[:, 2] * beta, minlength=p)
            into = np.bincount(msgs[:, 1], weights=a + msgs[:, 2] * beta, minlength=p)
            total += cost_of_round(out, into) + (alpha if alpha_once else 0.0)
        return total
    return fn


def whole_log_at_once(log, p, alpha, beta):
    cost = alpha + log[:, 2] * beta
    return max(np.bincount(log[:, 0], weights=cost, minlength=p).max(),
               np.bincount(log[:, 1], weights=cost, minlength=p).max())


@pytest.mark.parametrize("wrong, match", [
    (lambda log, p, a, b: len(log) * a + log[:, 2].sum() * b, "messages on different cables travel at the same time"),
    (whole_log_at_once, "the rounds follow one another"),
    (cables(lambda out, into: out.max()), "a cable carries in as well as out(?s:.*)gather's root"),
    (cables(lambda out, into: (out + into).max()), "take the busier way, not the sum"),
    (cables(lambda out, into: max(out.max(), into.max()), alpha_once=True), "every message pays alpha"),
    (cables(lambda out, into: out.mean()), "the maximum, not the mean"),
    (lambda log, p, a, b: np.array([1.0, 2.0]), r"expected one number of seconds, got ndarray of shape \(2,\)"),
    (lambda log, p, a, b: "1.0", "expected one number of seconds, got str"),
])
def test_cable_seconds_names_the_mistake(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.cable_seconds(wrong)


def picked(weights_of, both=False):
    """A cable_seconds answer that times each round by one cable: the one with the most weights_of(msgs) (messages
    or bytes), each way and the slower of the two, or over both ways at once."""
    def round_time(msgs, p, alpha, beta):
        cost = alpha + msgs[:, 2] * beta
        ways = [(np.bincount(msgs[:, k], weights=cost, minlength=p),
                 np.bincount(msgs[:, k], weights=weights_of(msgs), minlength=p)) for k in (0, 1)]
        if both:
            out, into = ways
            busiest = out if out[1].max() >= into[1].max() else into
            return busiest[0][np.argmax(busiest[1])]
        return max(c[np.argmax(w)] for c, w in ways)
    return lambda log, p, a, b: sum(round_time(log[log[:, 3] == r], p, a, b) for r in np.unique(log[:, 3]))


def split_terms(alpha_count, beta_bytes):
    """A cable_seconds answer that prices each round as alpha times alpha_count(msgs, p) plus beta times
    beta_bytes(msgs, p): its latency and its bytes taken from different places."""
    def fn(log, p, alpha, beta):
        rounds = [log[log[:, 3] == r] for r in np.unique(log[:, 3])]
        return sum(alpha * alpha_count(m, p) + beta * beta_bytes(m, p) for m in rounds)
    return fn


def _most(m, p, w):
    return max(np.bincount(m[:, 0], weights=w, minlength=p).max(), np.bincount(m[:, 1], weights=w, minlength=p).max())


def busiest_count(m, p):
    return _most(m, p, np.ones(len(m)))


def busiest_bytes(m, p):
    return _most(m, p, m[:, 2])


@pytest.mark.parametrize("wrong, match", [
    (picked(lambda m: np.ones(len(m))), "you took the cable with the most messages"),
    (picked(lambda m: np.ones(len(m)), both=True), "you took the cable with the most messages"),
    (picked(lambda m: m[:, 2]), "you took the cable with the most bytes, which is not the slowest"),
    (picked(lambda m: m[:, 2], both=True), "you took the cable with the most bytes"),
    (split_terms(busiest_count, busiest_bytes), "alpha terms of the cable with the most messages to the beta terms of "
                                                "the cable with the most bytes"),
    (split_terms(lambda m, p: len(m), lambda m, p: m[:, 2].max()), "alpha terms of every message of the round to "
                                                                   "the beta terms of the round's longest message"),
    (split_terms(lambda m, p: len(m), busiest_bytes), "every message of the round to the beta terms of the cable"),
    (split_terms(busiest_count, lambda m, p: m[:, 2].max()), "most messages to the beta terms of the round's longest"),
])
def test_cable_seconds_names_a_round_timed_by_the_wrong_cable(wrong, match):
    """Two logs where the cable with the most messages is not the one with the most bytes: picking a round's cable by
    either count, or pricing its latency and its bytes on different cables, fails and is named."""
    with pytest.raises(ExerciseError, match=match):
        check.cable_seconds(wrong)


def test_a_mistake_is_named_by_all_the_logs_not_one_coincidence():
    """On the ring of 10 on 3 ranks, picking the first cable with the most messages gives the whole log's time as
    one round; the check names the mistake that explains every log."""
    with pytest.raises(ExerciseError, match=r"3 ranks \(chunks.*\n.*most messages") as e:
        check.cable_seconds(picked(lambda m: np.ones(len(m)), both=True))
    assert "the rounds follow one another" not in str(e.value)


def test_the_replay_names_a_round_timed_by_the_wrong_cable(tmp_path, monkeypatch):
    """The logs run after the first wrong one, to name the mistake, are recorded and replayed like the others."""
    wrong = picked(lambda m: np.ones(len(m)), both=True)
    plain = record_check(monkeypatch, tmp_path, "cable_seconds", wrong, SEED)
    assert plain[0] is False and "you took the cable with the most messages" in plain[1]
    assert replay.replay("cable_seconds", tmp_path, SEED) == (False, plain[1].split("\nStep ")[0])


def _end(rule, blocking=lambda b, s: b + s.sum()):
    """An overlap_model answer whose overlapped time is rule(backprop, ready, seconds)."""
    def fn(backprop, ready, seconds):
        r, s = np.array(ready, dtype=float), np.array(seconds, dtype=float)
        return blocking(backprop, s), float(rule(backprop, r, s)) if r.size else backprop
    return fn


def _queue(backprop, r, s):
    free = 0.0
    for a, b in zip(r, s):
        free = max(free, a) + b
    return free


@pytest.mark.parametrize("wrong, match", [
    (_end(lambda b, r, s: max(b, r.max() + s.sum())), "your overlapped step is the blocking one"),
    (_end(lambda b, r, s: max(b, (r + s).max())), "there is one network"),
    (_end(lambda b, r, s: max(b, s.sum())), "cannot start before backprop has made its bucket"),
    (_end(lambda b, r, s: max(b, r[0] + s.sum())), "the network can fall idle"),
    (_end(lambda b, r, s: max(b, r[-1] + s[-1])), "may still be busy with the ones before it"),
    (_end(_queue), "the step ends when backprop is done too"),
    (_end(lambda b, r, s: b + _queue(b, r, s)), "ready times count from the start of backprop"),
    (_end(lambda b, r, s: max(b, _queue(b, r, s)), blocking=lambda b, s: s.sum()), "backprops first, and only then"),
    (lambda b, ready, seconds: None, r"expected a pair \(blocking, overlapped\), got NoneType"),
    (lambda b, ready, seconds: (b, "x"), "overlapped: expected one number of seconds, got str"),
])
def test_overlap_model_names_the_mistake(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.overlap_model(wrong)


# ---- the contract's answers (tests/test_contract.py) -------------------------------------------------------------

CONTRACT = {
    "cable_seconds": Answers(
        right_cable_seconds, whole_log_at_once, passes="✔ an allreduce on cables: all 11 checks passed",
        references=(Reference(costmodel.cable_seconds, "labkit.costmodel.cable_seconds"),)),
    "overlap_model": Answers(
        right_overlap_model, _end(lambda b, r, s: max(b, r.max() + s.sum())),
        passes="✔ the step with and without overlap: all 8 checks passed",
        references=(Reference(data_parallel.step_model, "labkit.data_parallel.step_model"),)),
}
ANSWERS = {"cable_seconds": ["max(out", "out.max()", "total +="], "overlap_model": ["max(end", "max(free", "end ="]}


def test_the_hints_lead_to_the_answer_but_never_hold_it():
    for name in CONTRACT:
        e = exercise(name)
        assert len(e.hints) >= 3 and e.module == {"07": "ring", "08": "data_parallel"}[e.lab] and not e.mpi
        assert not [bit for bit in ANSWERS[name] if bit in " ".join(e.hints)], name
