"""Lab 09's plain-function exercises: the staleness of workers taking turns, and gradient descent with a delay: their
answers for the contract every exercise keeps (``CONTRACT``, tests/test_contract.py) and their typical mistakes.
(The asynchronous worker's check runs under mpiexec: tests/mpi/cases_ps_exercise.py, listed in ``MPIEXEC``.)"""

import numpy as np
import pytest
from conftest import Answers, Mistake, Reference

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
        right_descent, lambda s, d, n: right_descent(s, 0, n), passes="✔ delayed gradient descent: all 22 checks passed",
        references=(Reference(param_server.delayed_descent, "labkit.param_server.delayed_descent"),)),
}
MPIEXEC = {"async_worker": "cases_ps_exercise.py"}  # its check runs on every rank: right, blank, mistakes, replay


def test_labkits_model_is_what_the_text_says():
    assert param_server.round_robin_staleness(4, 7).tolist() == [0, 1, 2, 3, 3, 3, 3]  # W - 1 once all have sent
    for delay in range(4):  # the bisection finds the formula's limit
        assert param_server.largest_stable_step(delay) == pytest.approx(param_server.stable_step_formula(delay), rel=0.03)


def zero_before(step, delay, iterations):  # the weights before t = 0 taken as 0, not w_0
    w = [1.0]
    for t in range(iterations):
        w.append(w[t] - step * (w[t - delay] if t >= delay else 0.0))
    return w


def wraps(step, delay, iterations, fill=np.ones):  # w[t - delay] read with a negative index
    w = fill(iterations + 1)
    w[0] = 1
    for t in range(iterations):
        w[t + 1] = w[t] - step * w[t - delay]
    return w


def wraps_in_a_list(step, delay, iterations):
    w = [1.0]
    for t in range(iterations):
        w.append(w[t] - step * w[t - delay])
    return w


def too_short(step, delay, iterations):  # room for w_0 .. w_(iterations - 1) only
    w = np.ones(iterations)
    for t in range(iterations):
        w[t + 1] = w[t] - step * (w[t - delay] if t >= delay else 1.0)
    return w


MISTAKES = {  # each named by its own diagnosis, with a hint about it and no step (tests/test_contract.py)
    "round_robin_staleness": (
        Mistake(lambda W, n: [W - 1] * n, says="yours:", hint="the first round is different"),
        Mistake(lambda W, n: [min(k, W) for k in range(n)], says="yours:", hint="one too many"),
        Mistake(lambda W, n: [0 if k < W else k - W + 1 for k in range(n)], says="2 workers",
                hint="that is the version the gradient was computed on"),
        Mistake(lambda W, n: list(range(n)), says="2 workers", hint="the master's version alone"),
    ),
    "delayed_descent": (
        Mistake(zero_before, says="delay 4, 2 iterations", hint="you took the weights there as 0.*they were 1"),
        Mistake(wraps, says="raised IndexError: index -4", hint="negative index"),
        Mistake(lambda s, d, n: wraps(s, d, n, np.zeros), says="raised IndexError", hint="negative index"),
        Mistake(wraps_in_a_list, says="raised IndexError: list index", hint="negative index"),
        Mistake(too_short, says="raised IndexError: index 12", hint="iterations \\+ 1 values"),
        Mistake(lambda s, d, n: right_descent(s, 0, n), says="delay 4, 2 iterations", hint="no delay at all"),
        Mistake(lambda s, d, n: right_descent(s, d + 1, n), says="yours:", hint="one step too old"),
        Mistake(lambda s, d, n: right_descent(s, d, n)[1:], says="without w_0", hint="the series starts with w_0"),
        Mistake(lambda s, d, n: right_descent(s, d, n - 1) if n else [], says="one step short",
                hint="one more w"),
    ),
}


def test_the_wrap_around_slip_passes_every_case_but_a_delay_longer_than_the_run():
    """Read from an array of ones, w[t - delay] wraps to entries not computed yet, which hold 1, the right value:
    only a delay longer than the run (an index before the array's start) shows the slip."""
    from labkit.check import param_server as ps_check

    for delay in range(5):
        for step, iterations in ((0.3, 12), (1.5, 6), (0.9, 25)):
            assert np.allclose(wraps(step, delay, iterations), param_server.delayed_descent(step, delay, iterations))
    assert ps_check._zero_before(0.5, 4, 2).tolist() == [1, 1, 1]  # and the case that tells the other slip apart


@pytest.mark.parametrize("wrong, named", [
    (lambda W, n: [W] * n, "expected"),  # no mistake of its own: named by its values
    (lambda W, n: 3, "expected an array of shape"),
])
def test_a_staleness_nothing_names_gets_the_next_step(wrong, named):
    with pytest.raises(check.ExerciseError, match=named) as e:
        check.round_robin_staleness(wrong)
    assert "\nHint: " not in str(e.value) and "\nStep " in str(e.value), str(e.value)


def test_a_drawn_delay_longer_than_the_iterations_is_checked_too(monkeypatch):
    """The grader's draw 5 gives delay 6 over 4 iterations: the check passes the right answer on it. (It once stopped
    with IndexError computing a wrong answer's series there, and lab 09's reference run in CI failed on such a draw.)"""
    from labkit.check import capture

    monkeypatch.setenv(capture.SEED_ENV, "5")
    check.delayed_descent(right_descent)


@pytest.mark.parametrize("sent, says", [
    ("[8]", "every gradient arrived"),  # all 8 batches sent, no DONE
    ("[0]", "a deadlock"),  # waited for weights before the first gradient
    ("[3]", "worker 1 sent 3 of its 8 gradients"),
])
def test_a_masters_timeout_is_told_apart_by_what_the_workers_sent(sent, says):
    from labkit.check import param_server as ps_check

    msg = (f"rank 0: TimeoutError: master 0: no message from workers [1] for 3 s (they sent {sent} gradients; a "
           "worker died, stalled, or never sent DONE)")
    assert says in ps_check._failed_run_error(msg, "1 master, 1 worker", "asynchronous worker", 1, [8])
