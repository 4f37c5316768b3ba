"""`labkit lab`: the student's copies are the student versions, the solutions come apart on request, and a copy a
student already has is never overwritten. JupyterLab is replaced by a recorder of the command that would start it."""

import os

import nbformat
import pytest

from labkit import cli, labs, runner
from labkit.grading import answers, assign

LABS = [p for p in runner.find_notebooks() if not labs.is_draft(p.name)]  # a lab being written is not handed out
MINE = LABS[0].name


class Started(Exception):
    """Raised where labkit would become JupyterLab."""


@pytest.fixture
def lab(monkeypatch, capsys):
    """Run ``labkit lab ARGS``; return (the folder JupyterLab would open, what labkit printed)."""
    def execv(path, cmd):
        raise Started(next(c.split("=", 1)[1] for c in cmd if c.startswith("--notebook-dir=")))

    monkeypatch.setattr(os, "execv", execv)

    def run(*args):
        with pytest.raises(Started) as started:
            cli.main(["lab", "--no-warm", *args])  # the warm-up's own tests: tests/test_warm.py
        return started.value.args[0], capsys.readouterr().out
    return run


def _answer_texts(nb) -> dict[str, str]:
    return {m["answer"]: nb.cells[i].source for i, m in answers.answer_cells(nb)}


def test_lab_copies_the_student_versions_that_assign_hands_out(lab, tmp_path):
    opened, out = lab("--work", str(tmp_path / "work"))
    assert opened == str(tmp_path / "work") and "labkit lab --solutions" in out
    assign.write_student_versions(LABS, tmp_path / "assign")
    for src in LABS:
        copy = (tmp_path / "work" / src.name).read_text()
        assert copy == (tmp_path / "assign" / src.name).read_text(), f"{src.name}: not what labkit assign hands out"
        assert "BEGIN SOLUTION" not in copy and "END SOLUTION" not in copy, src.name
        course, mine = nbformat.read(src, as_version=4), nbformat.reads(copy, as_version=4)
        models = _answer_texts(course)
        assert models and not any(answers.is_blank(c) for c in course.cells if answers.meta(c)), \
            f"{src.name}: the course's notebook should hold a model answer for every question"
        blank = _answer_texts(mine)
        assert blank.keys() == models.keys(), src.name
        assert all(answers.is_blank(mine.cells[i]) for i, _ in answers.answer_cells(mine)), f"{src.name}: a model answer"
        checks = assign.exercises_in(course)
        assert checks and [(i, mine.cells[i].source) for i, _ in checks] == [(i, course.cells[i].source) for i, _ in checks]


def test_a_students_copy_survives_lab_and_lab_solutions(lab, tmp_path):
    work = tmp_path / "work"
    lab("--work", str(work))
    mine = work / MINE
    nb = nbformat.read(mine, as_version=4)
    i, _ = answers.answer_cells(nb)[-1]
    nb.cells[i].source = "My own words." if nb.cells[i].cell_type == "markdown" else nb.cells[i].source.replace("...", "7")
    nbformat.write(nb, mine)
    before = mine.read_bytes()
    (work / LABS[-1].name).unlink()  # deleted: the next run copies it again
    _, out = lab("--work", str(work))
    assert f"kept your {MINE} (delete or rename it to start again from a fresh copy)" in out
    assert f"copied {LABS[-1].name}" in out and out.count("copied ") == 1 and out.count("kept ") == 1, out
    assert mine.read_bytes() == before
    lab("--work", str(work), "--solutions")
    assert mine.read_bytes() == before and sorted(p.name for p in work.iterdir()) == sorted(p.name for p in LABS)


def test_solutions_go_to_a_folder_of_their_own_and_are_never_overwritten(lab, tmp_path):
    work, solutions = tmp_path / "work", tmp_path / cli.SOLUTIONS
    opened, out = lab("--work", str(work), "--solutions")
    assert opened == str(solutions) and not work.exists(), "--solutions touches no student copy"
    assert sorted(p.name for p in solutions.iterdir()) == sorted(p.name for p in LABS)
    for src in LABS:
        assert (solutions / src.name).read_bytes() == src.read_bytes() and "BEGIN SOLUTION" in src.read_text()
    noted = solutions / MINE
    nb = nbformat.read(noted, as_version=4)
    nb.cells[0].source += "\n\nmy notes"
    nbformat.write(nb, noted)
    _, out = lab("--work", str(work), "--solutions")
    assert out.startswith(f"kept {noted} (it differs from the course's solution") and "my notes" in noted.read_text()
    opened, _ = lab("--work", str(work))
    assert opened == str(work) and not any("BEGIN SOLUTION" in p.read_text() for p in work.iterdir())


def test_an_older_copy_with_the_solutions_is_kept_and_named(lab, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / MINE).write_bytes(LABS[0].read_bytes())  # what labkit lab copied before it handed out student versions
    _, out = lab("--work", str(work))
    assert f"kept your {MINE}, an older copy that holds the worked solutions" in out
    assert (work / MINE).read_bytes() == LABS[0].read_bytes()


def test_notebooks_opens_a_folder_as_it_is(lab, tmp_path, capsys):
    folder = tmp_path / "course"
    folder.mkdir()
    opened, out = lab("--notebooks", str(folder), "--work", str(tmp_path / "work"))
    assert opened == str(folder) and "copied" not in out and not list(folder.iterdir())
    assert not (tmp_path / "work").exists()
    assert cli.main(["lab", "--notebooks", str(folder), "--solutions"]) == 2
    assert "give one" in capsys.readouterr().err
    assert cli.main(["lab", "--work", str(tmp_path / cli.SOLUTIONS), "--solutions"]) == 2
    assert "which is your work folder" in capsys.readouterr().err
