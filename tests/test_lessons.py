"""The labs as a student reads them: exercises that ask for work, questions to predict and explain, short cells,
no report machinery in sight. Measured on the notebooks as committed (the instructor's versions) and as handed out.

A lab still being written is a draft (``draft=True`` in labkit/labs.py, as ``labkit labs new`` declares it): held to
the form of every rule here, not yet to the counts (three exercises, three questions of both kinds), and left out of
the course's share. Deleting the flag holds it to all of them.
"""

import re

import nbformat
import pytest

from labkit import labs, runner
from labkit.check.exercises import in_lab
from labkit.grading import answers, assign

NOTEBOOKS = runner.find_notebooks()
IDS = [p.name[:2] for p in NOTEBOOKS]
DRAFTS = {lab.number for lab in labs.LABS if lab.draft}  # the labs being written: their form, not yet their counts
LEAST = 3  # exercises, and questions, of a lab that is not a draft
MAX_WORDS, MAX_SENTENCE, MAX_CODE_LINES = 160, 45, 12
PLUMBING = re.compile(r"\b(claim|record)\(|^SETTINGS\s*=", re.M)


def lab(path):
    nb = nbformat.read(path, as_version=4)
    return nb, path.name[:2]


def per_lab(test):
    return pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)(test)


def hidden(cell) -> bool:
    return bool(cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"))


def prose(cell) -> str:
    """A markdown cell's text without math, code spans and link targets: what a student reads as sentences."""
    text = re.sub(r"\$\$.*?\$\$|\$[^$]*\$", " X ", cell.source, flags=re.S)
    text = re.sub(r"`[^`]*`", " X ", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def sentences(text: str) -> list[str]:
    text = re.sub(r"\b(e\.g|i\.e|etc|vs|cf)\.", r"\1", text)
    parts = re.split(r"(?<=[.!?:;])\s+|\n\s*(?:[*-]|\d+\.)\s+|\n#+\s|\n\n", text)
    return [p for p in parts if p.strip()]


@per_lab
def test_at_least_three_exercises_in_the_lab(path):
    nb, n = lab(path)
    called = {name.split("#")[0] for _, name in assign.exercises_in(nb)}
    declared = {e.name for e in in_lab(n)}
    assert called == declared, f"lab {n}: check cells {sorted(called)} but declared {sorted(declared)}"
    least = 1 if n in DRAFTS else LEAST
    assert len(declared) >= least, f"lab {n} has {len(declared)} graded exercises; at least {least}"


@per_lab
def test_every_exercise_says_what_its_check_tests_and_has_hints(path):
    nb, n = lab(path)
    assert in_lab(n), f"lab {n} has no exercise"
    for i, name in assign.exercises_in(nb):
        above = [c for c in nb.cells[:i] if c.cell_type == "markdown"][-1:]
        assert above and "**The check" in above[0].source, \
            f"lab {n}, check.{name}: the markdown above the exercise says what the check tests (**The check**: ...)"
    for e in in_lab(n):
        assert e.hints, f"{e.name}: give the derivation as hints, shown one at a time after a failed run"


@per_lab
def test_questions_to_predict_and_explain(path):
    nb, n = lab(path)
    cells = answers.answer_cells(nb)
    kinds = [m["kind"] for _, m in cells]
    assert n in DRAFTS or (len(cells) >= LEAST and "predict" in kinds and "explain" in kinds), \
        f"lab {n}: {len(cells)} questions ({kinds}); at least {LEAST}, some to predict and some to explain"
    for i, m in cells:
        if m["kind"] != "predict":
            continue
        names = [t.id for s in answers._assignments(nb.cells[i].source) for t in s.targets]
        later = "\n".join(c.source for c in nb.cells[i + 1:] if c.cell_type == "code")
        for name in names:
            assert re.search(rf"compare\(\s*{name}\b", later), \
                f"lab {n}, {m['answer']}: a cell after the experiment compares {name} with the measurement"


@per_lab
def test_prose_a_student_reads_once(path):
    nb, n = lab(path)
    first = nb.cells[0].source
    assert "goal" in first.lower() or "you will" in first.lower(), f"lab {n} opens with its goals"
    assert any("take away" in c.source.lower() or "takeaway" in c.source.lower()
               for c in nb.cells[-3:] if c.cell_type == "markdown"), f"lab {n} closes with its takeaways"
    for i, c in enumerate(nb.cells):
        if c.cell_type != "markdown" or answers.meta(c):
            continue
        text = prose(c)
        assert "the course" not in text.lower(), f"lab {n}, cell {i}: 'the course' is nothing a student has seen"
        words = len(text.split())
        assert words <= MAX_WORDS, f"lab {n}, cell {i}: {words} words; at most about 150 per cell"
        for s in sentences(text):
            assert len(s.split()) <= MAX_SENTENCE, f"lab {n}, cell {i}: a sentence of {len(s.split())} words: {s[:80]}..."


@per_lab
def test_cells_a_student_reads_show_the_idea(path):
    nb, n = lab(path)
    student = assign.student_notebook(nb)
    for i, c in enumerate(student.cells):
        if c.cell_type != "code" or hidden(c):
            continue
        assert not PLUMBING.search(c.source), \
            f"lab {n}, cell {i}: report machinery (claim, record, SETTINGS) belongs in a hidden cell or a helper"
        lines = [ln for ln in c.source.splitlines() if ln.strip()]
        kernel = '"""' in c.source and ("__global__" in c.source or "#include" in c.source)
        if not kernel and "NotImplementedError" not in c.source:
            assert len(lines) <= MAX_CODE_LINES, f"lab {n}, cell {i}: {len(lines)} lines; at most about 10"


def student_lines(nb) -> tuple[int, int]:
    """(non-blank code lines inside solution regions, all non-blank code lines) of an instructor's notebook."""
    mine = total = 0
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        inside = False
        for line in c.source.splitlines():
            if "### BEGIN SOLUTION" in line or "### END SOLUTION" in line:
                inside = "BEGIN" in line
                continue
            if line.strip():
                total += 1
                mine += inside
    return mine, total


LAB_SHARE, COURSE_SHARE = 0.15, 0.20  # the student's share of a lab's code lines, and of the course's


@per_lab
def test_the_students_share_of_each_labs_code(path):
    mine, total = student_lines(nbformat.read(path, as_version=4))
    assert mine / total >= LAB_SHARE, f"lab {path.name[:2]}: {mine} of {total} non-blank code lines are the student's " \
                                      f"({mine / total:.1%}); at least {LAB_SHARE:.0%}: give the student more to write"


def test_the_students_share_of_the_course_is_at_least_a_fifth():
    counts = {p.name[:2]: student_lines(nbformat.read(p, as_version=4)) for p in NOTEBOOKS if p.name[:2] not in DRAFTS}
    mine, total = map(sum, zip(*counts.values()))
    lowest = sorted(counts, key=lambda n: counts[n][0] / counts[n][1])[:3]
    assert mine / total >= COURSE_SHARE, f"{mine} of {total} non-blank code lines are the student's " \
        f"({mine / total:.1%}); at least {COURSE_SHARE:.0%}. The labs of least share: " \
        + ", ".join(f"{n} ({counts[n][0] / counts[n][1]:.1%})" for n in lowest)


def test_answer_cells_are_handed_out_blank_and_collected():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("**Question (predict).** How many kB?"),
        nbformat.v4.new_code_cell("predicted_kB = 240  # kB\nratio = (3 +\n   4)",
                                  metadata={"labkit": {"answer": "q1", "kind": "predict", "points": 1}}),
        nbformat.v4.new_markdown_cell("**Question (explain).** Why?"),
        nbformat.v4.new_markdown_cell("Because the ring sends each chunk twice.",
                                      metadata={"labkit": {"answer": "q2", "kind": "explain", "points": 2}}),
    ])
    assert [m["answer"] for _, m in answers.answer_cells(nb)] == ["q1", "q2"]
    student = assign.student_notebook(nb)
    assert student.cells[1].source == "predicted_kB = ...  # kB\nratio = ..."
    assert student.cells[3].source == answers.PLACEHOLDER
    got = answers.collect(student, "ann", "x.ipynb")
    assert [(a.question, a.blank, a.answer) for a in got] == [("q1", True, ""), ("q2", True, "")]
    got = answers.collect(nb, "bob", "x.ipynb")
    assert [a.blank for a in got] == [False, False] and got[1].answer.startswith("Because")


@pytest.mark.parametrize("source, why", [
    ("print(3)", "only assignments"), ("x = (", "not valid Python"), ("a.b = 3", "only assignments")])
def test_a_malformed_predict_cell_is_named(source, why):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("**Question (predict).** ?"),
        nbformat.v4.new_code_cell(source, metadata={"labkit": {"answer": "q", "kind": "predict"}})])
    with pytest.raises(ValueError, match=why):
        answers.answer_cells(nb)


def test_an_answer_cell_needs_its_question_above():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_markdown_cell("A", metadata={"labkit": {"answer": "q", "kind": "explain"}})])
    with pytest.raises(ValueError, match=r"\*\*Question"):
        answers.answer_cells(nb)
