"""Hints follow work: a check's next hint comes only after a failed run of a changed answer. The same answer run
again gets the same step; an edited function, an edited helper it calls, or an edited kernel source gets the next."""

import textwrap

import pytest
from conftest import edited

from labkit import check
from labkit.check import common
from labkit.check.exercises import exercise


def steps(name: str, answers) -> list[str]:
    """The hint step each run of ``check.<name>`` showed, one per answer (in order, in one session)."""
    seen = []
    for answer in answers:
        with pytest.raises(check.ExerciseError) as e:
            getattr(check, name)(answer)
        seen.append(str(e.value).split("\nStep ")[1].split(":")[0].split(" (")[0])
    return seen


def from_cell(source: str, name: str, scope: dict | None = None):
    """A function as a notebook cell defines it: compiled from its own text, so that its source can be read."""
    import linecache

    filename = f"<cell-{abs(hash(source))}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scope = {} if scope is None else scope
    exec(compile(source, filename, "exec"), scope)
    return scope[name]


WRONG = "def staleness(W, n):\n    return [W - 1] * n\n"


def test_the_same_answer_run_again_gets_the_same_step():
    wrong = from_cell(WRONG, "staleness")
    assert steps("round_robin_staleness", [wrong, wrong, wrong]) == ["1 of 3"] * 3


def test_the_same_cell_run_again_is_the_same_answer():
    """Running a cell again makes a new function object from the same text: that is not a change of answer."""
    answers = [from_cell(WRONG, "staleness") for _ in range(3)]
    assert steps("round_robin_staleness", answers) == ["1 of 3"] * 3


def test_an_edited_function_gets_the_next_step_and_the_last_repeats():
    tries = [WRONG.replace("W - 1", f"W - 1 + {k} * 0") for k in range(5)]
    answers = [from_cell(t, "staleness") for t in tries]
    assert steps("round_robin_staleness", answers) == ["1 of 3", "2 of 3", "3 of 3", "3 of 3", "3 of 3"]


def test_an_edit_of_a_helper_the_answer_calls_is_a_changed_answer():
    helper = "def lag(W):\n    return W - 1\n"
    scope: dict = {}
    from_cell(helper, "lag", scope)
    answer = from_cell("def staleness(W, n):\n    return [lag(W)] * n\n", "staleness", scope)
    first = steps("round_robin_staleness", [answer, answer])
    from_cell(helper.replace("W - 1", "W - 1 + 0"), "lag", scope)  # the student edits the helper's cell only
    assert first + steps("round_robin_staleness", [answer]) == ["1 of 3", "1 of 3", "2 of 3"]


def test_a_blank_answer_spends_no_step_and_leaves_the_count_alone():
    wrong = from_cell(WRONG, "staleness")
    blank = from_cell("def staleness(W, n):\n    raise NotImplementedError\n", "staleness")
    assert steps("round_robin_staleness", [wrong]) == ["1 of 3"]
    with pytest.raises(check.ExerciseError) as e:
        check.round_robin_staleness(blank)
    assert "Step" not in str(e.value)
    assert steps("round_robin_staleness", [wrong]) == ["1 of 3"]


def test_a_source_is_its_own_fingerprint():
    source = textwrap.dedent("""
        extern "C" __global__ void k(float *x) { x[threadIdx.x] = 0; }
    """)
    assert common.fingerprint(source) == common.fingerprint(str(source))
    assert common.fingerprint(source) != common.fingerprint(edited(source, 1))
    assert common.fingerprint(edited(len, 1)) != common.fingerprint(edited(len, 2))


def test_next_hint_counts_per_exercise():
    n = len(exercise("round_robin_staleness").hints)
    assert common.next_hint("round_robin_staleness", "wrong", "a").startswith(f"Step 1 of {n}")
    assert common.next_hint("delayed_descent", "wrong", "a").startswith("Step 1 of")
    assert common.next_hint("round_robin_staleness", "wrong", "b").startswith(f"Step 2 of {n}")
    assert common.next_hint("round_robin_staleness", "wrong", "b").startswith(f"Step 2 of {n}")
