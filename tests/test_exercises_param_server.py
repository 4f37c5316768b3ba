"""Lab 09's plain-function exercises: the staleness of workers taking turns, and gradient descent with a delay: their
answers for the contract every exercise keeps (``CONTRACT``, tests/test_contract.py) and their typical mistakes.
(The asynchronous worker's check runs under mpiexec: tests/mpi/cases_ps_exercise.py, listed in ``MPIEXEC``.)"""

import numpy as np
import pytest
from conftest import Answers, Reference

from labkit import check, param_server


def right_staleness(workers, updates):
    have, out = [0] * workers, []
    for k in range(updates):
        out.append(k - have[k % workers])
        have[k % workers] = k + 1
    return out


def right_descent(step, delay, iterations):
    w = [1.0]
    for t in range(iterations):
        w.append(w[t] - step * (w[t - delay] if t >= delay else 1.0))
    return w


CONTRACT = {  # each check ends on a case drawn afresh: the grader's draw differs from the notebook's
    "round_robin_staleness": Answers(
        right_staleness, lambda W, n: [W - 1] * n, passes="✔ staleness of workers taking turns: all 24 checks passed",
        references=(Reference(param_server.round_robin_staleness, "labkit.param_server.round_robin_staleness"),)),
    "delayed_descent": Answers(
        right_descent, lambda s, d, n: right_descent(s, 0, n), passes="✔ delayed gradient descent: all 21 checks passed",
        references=(Reference(param_server.delayed_descent, "labkit.param_server.delayed_descent"),)),
}
MPIEXEC = {"async_worker": "cases_ps_exercise.py"}  # its check runs on every rank: right, blank, mistakes, replay


def test_labkits_model_is_what_the_text_says():
    assert param_server.round_robin_staleness(4, 7).tolist() == [0, 1, 2, 3, 3, 3, 3]  # W - 1 once all have sent
    for delay in range(4):  # the bisection finds the formula's limit
        assert param_server.largest_stable_step(delay) == pytest.approx(param_server.stable_step_formula(delay), rel=0.03)


@pytest.mark.parametrize("wrong, named", [
    (lambda W, n: [W - 1] * n, "the first round is different"),
    (lambda W, n: [min(k, W) for k in range(n)], "one too many"),
    (lambda W, n: [0 if k < W else k - W + 1 for k in range(n)], "that is the version the gradient was computed on"),
    (lambda W, n: list(range(n)), "expected"),  # no turns at all: named by its values
    (lambda W, n: 3, "expected an array of shape"),
])
def test_the_staleness_check_names_the_mistake(wrong, named):
    with pytest.raises(check.ExerciseError, match=named):
        check.round_robin_staleness(wrong)


def wraps(step, delay, iterations):
    w = np.zeros(iterations + 1)
    w[0] = 1
    for t in range(iterations):
        w[t + 1] = w[t] - step * w[t - delay]
    return w


@pytest.mark.parametrize("wrong, named", [
    (wraps, "negative index: Python wraps around"),
    (lambda s, d, n: right_descent(s, 0, n), "no delay at all"),
    (lambda s, d, n: right_descent(s, d + 1, n), "one step too old"),
    (lambda s, d, n: right_descent(s, d, n)[1:], "expected an array of shape"),
])
def test_the_delayed_descent_check_names_the_mistake(wrong, named):
    with pytest.raises(check.ExerciseError, match=named):
        check.delayed_descent(wrong)


def test_a_drawn_delay_longer_than_the_iterations_is_checked_too(monkeypatch):
    """The grader's draw 5 gives delay 6 over 4 iterations, where the wrap-around slip's hint cannot be computed (that
    slip raises IndexError there): the check passes the right answer on it. It stopped with IndexError, and lab 09's
    reference run in CI failed on such a draw."""
    from labkit.check import capture

    monkeypatch.setenv(capture.SEED_ENV, "5")
    check.delayed_descent(right_descent)
