"""The contract every graded exercise keeps, written once for the whole registry (labkit.check.exercises):

1. the right answer passes, printing its ✔ line;
2. a blank answer (a function raising NotImplementedError, or the family's blank form: a C or CUDA C stub) fails as
   "not written yet", with no hint, and spends none;
3. a mistake the check names carries its own hint, which speaks of that mistake, and spends no step of the
   derivation (the contract's wrong answer where it is named, and every entry of the family's ``MISTAKES`` table);
   a failure nothing names shows one more step after each failed run of a changed answer (the last one repeating),
   the same answer run again, or only re-spaced, re-commented or renamed, the same step, and only the step reached;
4. the grader's replay of a recorded run agrees with the check's verdict and message (without the hint), and counts
   the check's cases (all of them passed by the right answer, fewer by the wrong one: partial credit); a replay on
   inputs of another draw says "was not recorded" (where the check draws its inputs: ``Answers.drawn``);
5. labkit's own answer handed in passes in the notebook and is caught by the grader, who names it.

Each family's test file (tests/test_exercises_<family>.py) gives its exercises' answers in its ``CONTRACT`` table
(``conftest.Answers``) and keeps the tests of its own mistakes. The exercises whose checks run only under a real
mpiexec are listed by their family's file in ``MPIEXEC`` with the MPI program of named cases (tests/mpi/) that checks
them; every exercise of the registry is in one of the two.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest
from conftest import Answers, Mistake, Reference, edited, record_check

from labkit import check
from labkit.check import ExerciseError
from labkit.check.common import DIAGNOSED
from labkit.check.exercises import EXERCISES, exercise
from labkit.grading import replay

HERE = Path(__file__).resolve().parent
SEED = 4343
FAMILIES = sorted(p.stem for p in HERE.glob("test_exercises_*.py"))


def _tables(attribute: str) -> tuple[dict, dict]:
    """Every family file's table ``attribute``, merged: (exercise -> entry, exercise -> the file that gives it)."""
    found, where = {}, {}
    for family in FAMILIES:
        for name, entry in getattr(importlib.import_module(family), attribute, {}).items():
            assert name not in where, f"{name} is in the {attribute} of both {where[name]} and {family}"
            found[name], where[name] = entry, family
    return found, where


CONTRACT, GIVEN_BY = _tables("CONTRACT")
MPIEXEC, LISTED_BY = _tables("MPIEXEC")
MISTAKES, MISTAKES_BY = _tables("MISTAKES")


def _params(names, marks_of=lambda a: a.marks) -> list:
    """One test per exercise, by its name (tests/bylab.py marks it with the exercise's lab), with its marks."""
    return [pytest.param(name, id=name, marks=tuple(marks_of(CONTRACT[name]))) for name in names]


def _on(a: Answers) -> dict:
    """What the check and the replay are given besides the answer: one rank's communicator for an MPI check."""
    if not a.one_rank:
        return {}
    from mpi4py import MPI

    return {"comm": MPI.COMM_SELF}


def _run(name: str, answer, a: Answers) -> None:
    getattr(check, name)(answer, **_on(a))


def _fails(name: str, answer, a: Answers) -> str:
    with pytest.raises(ExerciseError) as e:
        _run(name, answer, a)
    return str(e.value)


def _says(pattern: str, message: str) -> None:
    assert not pattern or re.search(pattern, message, re.S), f"{pattern!r} not in:\n{message}"


# ---- the contract ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", _params(sorted(CONTRACT)))
def test_the_right_answer_passes(name, capsys):
    a = CONTRACT[name]
    _run(name, a.right, a)
    out = capsys.readouterr().out
    assert "✔" in out and a.passes in out, out


@pytest.mark.parametrize("name", _params(sorted(CONTRACT), lambda a: ()))
def test_a_blank_answer_is_not_written_yet_and_gets_no_hint(name):
    a = CONTRACT[name]
    for _ in range(2):  # run again: still no step
        message = _fails(name, a.blank, a)
        assert "not written yet" in message and "Step" not in message, message


def _named(message: str) -> bool:
    """Whether the failure named its mistake: a hint of its own, before any step of the derivation."""
    return DIAGNOSED in message.split("\nStep ")[0]


@pytest.mark.parametrize("name", _params(sorted(CONTRACT), lambda a: a.wrong_one().marks))
def test_a_named_mistake_has_its_own_hint_and_anything_else_one_more_step(name):
    a, wrong = CONTRACT[name], CONTRACT[name].wrong_one()
    hints = exercise(name).hints
    n = len(hints)
    assert n >= 3, "the derivation, a step at a time"
    assert "Step" not in _fails(name, a.blank, a)  # blank before the first failure: no step spent
    first = _fails(name, wrong.answer, a)
    _says(wrong.says, first)
    if _named(first):  # the diagnosis's hint, however often it is changed: the steps are for what nothing names
        for k in range(1, 3):
            message = _fails(name, edited(wrong.answer, k), a)
            assert _named(message) and "\nStep " not in message, message
        return
    for k in range(1, n + 2):
        answer = edited(wrong.answer, k)  # a changed answer: the hint advances
        message = _fails(name, answer, a)
        shown = min(k + 1, n)  # the last one repeats
        assert f"Step {shown} of {n}" in message and hints[shown - 1] in message, message
        assert ("run the check again" in message) == (shown < n), message
        assert [h for i, h in enumerate(hints) if i != shown - 1 and h in message] == [], "only the step reached"
        _says(wrong.says, message)
        if k == 1:
            assert f"Step 2 of {n}" in _fails(name, answer, a), "the same answer run again: the same step"
            blank = _fails(name, a.blank, a)
            assert "not written yet" in blank and "Step" not in blank, "a blank run in between: no step, none spent"
    assert "Step" not in _fails(name, a.blank, a)  # past the last step too


def _mistakes() -> list:
    return [pytest.param(name, i, id=f"{name}-{i}", marks=m.marks) for name in sorted(MISTAKES)
            for i, m in enumerate(MISTAKES[name])]


@pytest.mark.parametrize("name, i", _mistakes())
def test_each_named_mistake_gets_the_hint_of_that_mistake_and_no_step(name, i):
    m, a = MISTAKES[name][i], CONTRACT[name]
    assert isinstance(m, Mistake) and m.says and m.hint, f"{MISTAKES_BY[name]}: {m}"
    for k in range(2):  # and changed again: still its own hint, no step spent
        message = _fails(name, m.answer if k == 0 else edited(m.answer, k), a)
        said, _, hint = message.partition(DIAGNOSED)
        assert hint, f"not named: no hint of its own in\n{message}"
        assert "\nStep " not in message, message
        _says(m.says, said)
        _says(m.hint, hint)


def test_every_mistake_table_is_of_exercises_with_contract_answers():
    assert not set(MISTAKES) - set(CONTRACT), "a mistake of an exercise checked under mpiexec: give it in its case file"


@pytest.mark.parametrize("name", _params(sorted(CONTRACT), lambda a: (*a.marks, *a.wrong_one(replayed=True).marks)))
def test_the_replay_gives_the_checks_verdict_and_message(name, tmp_path, monkeypatch):
    a, wrong = CONTRACT[name], CONTRACT[name].wrong_one(replayed=True)
    on = _on(a)
    assert record_check(monkeypatch, tmp_path / "right", name, a.right, SEED, **on) == (True, "")
    passed, _, cases = replay.counted(name, tmp_path / "right", SEED, **on)
    assert passed is True and cases and cases[0] == cases[1] >= 1, cases  # every case counted, and passed
    passed, saw = record_check(monkeypatch, tmp_path / "wrong", name, wrong.answer, SEED, **on)
    assert not passed and (_named(saw) != ("\nStep 1 of " in saw)), saw  # the student saw the mistake and its
    _says(wrong.says, saw)  # hint, or the first step...
    *verdict, counted = replay.counted(name, tmp_path / "wrong", SEED, **on)
    assert tuple(verdict) == (False, saw.split("\nStep 1 of ")[0])  # ...the grader the mistake alone
    # the cases passed before the failure (none counted where it failed before its first case: 0 points)
    assert counted is None or 0 <= counted[0] < counted[1] == cases[1], (counted, cases)
    passed, message = replay.replay(name, tmp_path / "right", SEED + 1, **on)  # the grader's own draw of the inputs
    if a.drawn:
        assert not passed and "was not recorded" in message, message
    else:  # a check on fixed inputs: every draw asks what was recorded
        assert passed and a.passes in message, message


@pytest.mark.parametrize("name", _params(sorted(n for n, a in CONTRACT.items() if a.references)))
def test_labkits_own_answer_handed_in_is_caught_by_the_grader(name, tmp_path, monkeypatch, capsys):
    a = CONTRACT[name]
    for i, ref in enumerate(a.references):
        passed, saw = record_check(monkeypatch, tmp_path / str(i), name, ref.answer, SEED, **_on(a))
        assert passed is ref.passes, saw  # as the notebook ran it...
        if ref.passes:
            assert (ref.prints or a.passes) in capsys.readouterr().out
        assert replay.replay(name, tmp_path / str(i), SEED, **_on(a)) == (  # ...and as the grader judges it
            False, f"{name}: uses labkit's reference ({ref.named}): the exercise is to write it yourself")


# ---- every exercise keeps it, here or under mpiexec ----------------------------------------------------------------

def test_every_exercise_has_its_contract_answers_here_or_is_checked_under_mpiexec():
    registry = set(EXERCISES)
    missing = sorted(registry - set(CONTRACT) - set(MPIEXEC))
    assert not missing, (f"exercises with neither contract answers (a CONTRACT entry in tests/test_exercises_<family>"
                         f".py) nor an MPI case file (MPIEXEC): {missing}")
    assert not set(CONTRACT) & set(MPIEXEC), "an exercise checked here needs no listing under mpiexec"
    assert sorted((set(CONTRACT) | set(MPIEXEC)) - registry) == [], "answers for exercises the registry lacks"
    assert all(isinstance(a, Answers) for a in CONTRACT.values())


def test_the_exercises_left_to_mpiexec_are_its_and_a_test_runs_their_cases():
    for name, cases in MPIEXEC.items():
        assert exercise(name).mpi, f"{name} runs in a plain Python: give it contract answers"
        program = HERE / "mpi" / cases
        assert program.is_file(), f"{LISTED_BY[name]}: {name}'s case file {cases} is not in tests/mpi"
        assert re.search(rf"\b{name}\b", program.read_text()), f"{cases} does not check {name}"
        runners = [p.name for p in HERE.glob("test_*.py") if f'"{cases}"' in p.read_text()]
        assert runners, f"no test runs {cases} under mpiexec"


def test_labkits_own_answer_is_handed_in_for_every_exercise_that_declares_one():
    for name, a in CONTRACT.items():
        e = exercise(name)
        assert bool(a.references) == bool(e.references or e.sources), name
        assert all(isinstance(r, Reference) for r in a.references), name


def test_one_rank_answers_are_the_mpi_checks_and_the_blank_is_the_familys():
    for name, a in CONTRACT.items():
        assert not a.one_rank or exercise(name).mpi, name
        source = list(inspect.signature(exercise(name).check()).parameters)[0] == "source"
        assert isinstance(a.blank, str) == source, f"{name}: a C or CUDA C exercise's blank is its source stub"
