"""Hints follow work and the mistake found. A mistake the check names carries its own hint and spends no step of the
derivation. Any other failure gets the next step, but only after a failed run of a changed answer: the same answer
run again, re-spaced, re-commented or with its variables renamed gets the same step; an edited function, an edited
helper it calls, or an edited kernel source gets the next."""

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


EX = "output_error"  # lab 01: fn(A, Y) -> delta
WRONG = "def delta(A, Y):\n    return (A - Y) * A * (1 - A) * 2.5\n"  # wrong in a way no diagnosis names
N = len(exercise(EX).hints)


def step(k: int) -> str:
    return f"{k} of {N}"


def test_the_same_answer_run_again_gets_the_same_step():
    wrong = from_cell(WRONG, "delta")
    assert steps(EX, [wrong, wrong, wrong]) == [step(1)] * 3


def test_the_same_cell_run_again_is_the_same_answer():
    """Running a cell again makes a new function object from the same text: that is not a change of answer."""
    answers = [from_cell(WRONG, "delta") for _ in range(3)]
    assert steps(EX, answers) == [step(1)] * 3


def test_an_edited_function_gets_the_next_step_and_the_last_repeats():
    tries = [WRONG.replace("2.5", f"2.{5 + k}") for k in range(N + 2)]
    answers = [from_cell(t, "delta") for t in tries]
    assert steps(EX, answers) == [step(k) for k in range(1, N + 1)] + [step(N)] * 2


def test_spaces_comments_docstrings_and_renames_are_the_same_answer():
    same = [WRONG,
            "def delta(A, Y):\n    # the output error\n    return (A - Y)  *  A * (1 - A) * 2.5  # times sigma'\n",
            'def delta(A, Y):\n    """dC/dz."""\n    return (A - Y) * A * (1 - A) * 2.5\n',
            "def output_delta(act, onehot):\n    return (act - onehot) * act * (1 - act) * 2.5\n"]
    answers = [from_cell(t, "output_delta" if "output_delta" in t else "delta") for t in same]
    assert steps(EX, answers) == [step(1)] * 4
    changed = from_cell("def delta(A, Y):\n    return (A - Y) * A * (1.0 - A) * 2.5\n", "delta")
    assert steps(EX, [changed]) == [step(2)], "a literal changed: another answer"
    swapped = from_cell("def delta(A, Y):\n    return (Y - A) * A * (1 - A) * 2.5\n", "delta")
    assert steps(EX, [swapped]) == [step(3)], "two names swapped: another answer"


def test_a_named_mistake_gives_its_own_hint_and_spends_no_step():
    named = from_cell("def delta(A, Y):\n    return A - Y\n", "delta")  # sigma'(z) left out: named
    with pytest.raises(check.ExerciseError) as e:
        check.output_error(named)
    assert "\nHint: " in str(e.value) and "sigma'(z)" in str(e.value).split("\nHint: ")[1], str(e.value)
    assert "Step" not in str(e.value)
    assert steps(EX, [from_cell(WRONG, "delta")]) == [step(1)], "the named mistake spent none"


def test_an_edit_of_a_helper_the_answer_calls_is_a_changed_answer():
    helper = "def scale(A):\n    return A * (1 - A) * 2.5\n"
    scope: dict = {}
    from_cell(helper, "scale", scope)
    answer = from_cell("def delta(A, Y):\n    return (A - Y) * scale(A)\n", "delta", scope)
    first = steps(EX, [answer, answer])
    from_cell(helper.replace("2.5", "2.6"), "scale", scope)  # the student edits the helper's cell only
    assert first + steps(EX, [answer]) == [step(1), step(1), step(2)]


def test_a_blank_answer_spends_no_step_and_leaves_the_count_alone():
    wrong = from_cell(WRONG, "delta")
    blank = from_cell("def delta(A, Y):\n    raise NotImplementedError\n", "delta")
    assert steps(EX, [wrong]) == [step(1)]
    with pytest.raises(check.ExerciseError) as e:
        check.output_error(blank)
    assert "Step" not in str(e.value)
    assert steps(EX, [wrong]) == [step(1)]


def test_a_source_is_its_own_fingerprint_comments_spaces_and_renames_aside():
    source = textwrap.dedent("""
        extern "C" __global__ void k(float *x) { x[threadIdx.x] = 0; }
    """)
    assert common.fingerprint(source) == common.fingerprint(str(source))
    assert common.fingerprint(source) != common.fingerprint(edited(source, 1))
    assert common.fingerprint(edited(len, 1)) != common.fingerprint(edited(len, 2))
    same = ('extern "C" __global__ void k(float* out) { // zero it\n  out[threadIdx.x] = 0; /* all */ }')
    assert common.fingerprint(source) == common.fingerprint(same)
    for other in (source.replace("= 0", "= 1"), source.replace("threadIdx.x", "threadIdx.y"),
                  source.replace("x[threadIdx.x]", "x[blockIdx.x]")):
        assert common.fingerprint(source) != common.fingerprint(other), other


def test_next_hint_counts_per_exercise():
    n = len(exercise("round_robin_staleness").hints)
    assert common.next_hint("round_robin_staleness", "wrong", "a").startswith(f"Step 1 of {n}")
    assert common.next_hint("delayed_descent", "wrong", "a").startswith("Step 1 of")
    assert common.next_hint("round_robin_staleness", "wrong", "b").startswith(f"Step 2 of {n}")
    assert common.next_hint("round_robin_staleness", "wrong", "b").startswith(f"Step 2 of {n}")


SHORT = 12  # a solution line shorter than this, spaces left out (`}`, `return out`), is no answer


def _solution_lines(lab: str) -> dict[str, str]:
    """{a solution line of the lab's notebook, its spaces left out: the line as written}, for every line of a solution
    region that is at least SHORT characters long that way."""
    import json

    from solutions import REGION

    from labkit import runner

    [path] = [p for p in runner.find_notebooks() if p.name.startswith(f"{lab}_")]
    found = {}
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for m in REGION.finditer(text):
            for line in m.group(1).splitlines():
                bare = "".join(line.split()).rstrip(";")
                if len(bare) >= SHORT and not bare.startswith(("#", "//")) and not bare.endswith("()"):  # a bare
                    # call with nothing to work out (__syncthreads()) is a name, not an answer
                    found[bare] = line.strip()
    return found


@pytest.mark.parametrize("name", sorted(e.name for e in __import__("labkit.check.exercises", fromlist=["x"])
                                         .EXERCISES.values()))
def test_no_step_of_the_derivation_hands_out_a_line_of_the_solution(name):
    """The last step is a question or a smaller worked case: no hint holds a line of its lab's worked solutions."""
    ex = exercise(name)
    lines = _solution_lines(ex.lab)
    found = [(k, line) for k, hint in enumerate(ex.hints, 1) for bare, line in lines.items()
             if bare in "".join(hint.split())]
    assert not found, f"{name}: hint steps hold solution lines: {found}"
