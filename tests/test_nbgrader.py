"""labkit assign --format nbgrader, through the real nbgrader: generate_assignment, then autograde a right, a wrong and
a blank submission of lab 01 (Python) and lab 05 (CUDA C inside a Python string), and read the scores nbgrader gives."""

from __future__ import annotations

import copy
import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from labkit import cli
from labkit.grading import assign

nbgrader = pytest.importorskip("nbgrader", reason="nbgrader is in the test extra: pip install -e '.[test]'")
from test_grading_attacks import CUDA_KEEP, SERIAL_KEEP, _lab, _solution  # noqa: E402

pytestmark = [pytest.mark.notebooks, pytest.mark.slow]


def _nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    bin_dir = str(Path(sys.executable).parent)  # nbgrader runs alembic, which sits beside it
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    done = subprocess.run([str(Path(bin_dir) / "nbgrader"), *args], cwd=course, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def test_nbgrader_generates_and_autogrades_labkit_labs(tmp_path):
    _lab("01_", SERIAL_KEEP, tmp_path / "instructor")
    _lab("05_", CUDA_KEEP, tmp_path / "instructor")
    course = tmp_path / "course"
    assert cli.main(["assign", "--format", "nbgrader", "--notebooks", str(tmp_path / "instructor"),
                     "--out", str(course / "source" / "labs")]) == 0
    (course / "nbgrader_config.py").write_text('c = get_config()\nc.CourseDirectory.course_id = "labkit"\n'
                                               "c.ExecutePreprocessor.timeout = 120\n")
    source = {p.name: nbformat.read(p, as_version=4) for p in sorted((course / "source" / "labs").glob("*.ipynb"))}
    for nb in source.values():  # solution cells hold every marker; check cells are locked graded tests
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader")
            if "### BEGIN SOLUTION" in cell.source:
                assert meta["solution"] and not meta["grade"]
            if cell.source.startswith("check."):
                assert meta["grade"] and meta["locked"] and meta["points"] == 1 and meta["grade_id"].startswith("check-")
    _nbgrader(course, "generate_assignment", "labs", "--force")
    released = {name: nbformat.read(course / "release" / "labs" / name, as_version=4) for name in source}
    kernel_cell = next(c for c in released["05_cuda_kernels.ipynb"].cells if "TILED_MATMUL = " in c.source)
    assert "YOUR CODE HERE" in kernel_cell.source and "__syncthreads" not in kernel_cell.source

    def hand_in(student: str, change) -> None:
        folder = course / "submitted" / student / "labs"
        folder.mkdir(parents=True)
        for name, nb in released.items():
            nb = copy.deepcopy(nb)
            for cell, src in zip(nb.cells, source[name].cells):
                if cell.metadata.get("nbgrader", {}).get("solution"):
                    cell.source = change(_solution(src.source))
            nbformat.write(nb, folder / name)

    hand_in("right", lambda s: s)
    hand_in("wrong", lambda s: s.replace("delta.sum(axis=0))", "2 * delta.sum(axis=0))")
            .replace("acc += As[ty][k] * Bs[k][tx];", "acc += As[ty][k] * Bs[k][tx] + 0.5f;"))
    shutil.copytree(course / "release" / "labs", course / "submitted" / "blank" / "labs")
    _nbgrader(course, "autograde", "labs", "--create", "--force")
    _nbgrader(course, "export")
    scores = {row["student_id"]: (float(row["score"]), float(row["max_score"]))
              for row in csv.DictReader(open(course / "grades.csv"))}
    assert scores == {"right": (2.0, 2.0), "wrong": (0.0, 2.0), "blank": (0.0, 2.0)}
    graded = nbformat.read(course / "autograded" / "blank" / "labs" / "05_cuda_kernels.ipynb", as_version=4)
    check = next(c for c in graded.cells if c.source.startswith("check.tiled_matmul"))
    assert "not written yet" in "".join(o.get("evalue", "") + o.get("text", "") for o in check.outputs)


def test_nbgrader_sources_refuse_unpaired_markers_and_markdown_regions():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1\n### BEGIN SOLUTION\ny = 2")])
    with pytest.raises(ValueError, match="unpaired"):
        assign.nbgrader_source(nb)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("### BEGIN SOLUTION\n### END SOLUTION")])
    with pytest.raises(ValueError, match="code cells only"):
        assign.nbgrader_source(nb)


def test_nbgrader_makes_the_questions_manually_graded_answers(tmp_path):
    """The answer cells become nbgrader's manually graded answers with their points; in the released version a
    prediction's name exists (as ...) before the student answers, so the cell comparing it still runs."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    lab = new_notebook(cells=[
        new_markdown_cell("# Lab 96"),
        new_code_cell('PROFILE = "quick"', metadata={"tags": ["parameters"]}),
        new_markdown_cell("**Question (predict).** How many kB?"),
        new_code_cell("predicted_kB = 240  # kB", metadata={"labkit": {"answer": "96-kB", "kind": "predict"}}),
        new_code_cell("from labkit.questions import compare\ncompare(predicted_kB, 240.0, 'kB')"),
        new_markdown_cell("**Question (explain).** Why?"),
        new_markdown_cell("Each chunk goes around twice.", metadata={"labkit": {"answer": "96-why", "kind": "explain",
                                                                               "points": 2}}),
    ])
    (tmp_path / "instructor").mkdir()
    nbformat.write(lab, tmp_path / "instructor" / "96_asked.ipynb")
    course = tmp_path / "course"
    assert cli.main(["assign", "--format", "nbgrader", "--notebooks", str(tmp_path / "instructor"),
                     "--out", str(course / "source" / "labs")]) == 0
    (course / "nbgrader_config.py").write_text('c = get_config()\nc.CourseDirectory.course_id = "labkit"\n')
    source = nbformat.read(course / "source" / "labs" / "96_asked.ipynb", as_version=4)
    meta = [c.metadata["nbgrader"] for c in (source.cells[3], source.cells[6])]
    assert [(m["grade"], m["solution"], m["points"], m["grade_id"]) for m in meta] == [
        (True, True, 1, "answer-96-kB"), (True, True, 2, "answer-96-why")]
    _nbgrader(course, "generate_assignment", "labs", "--force")
    released = nbformat.read(course / "release" / "labs" / "96_asked.ipynb", as_version=4)
    assert released.cells[3].source.startswith("predicted_kB = ...  # kB\n") and "240" not in released.cells[3].source
    assert "YOUR ANSWER HERE" in released.cells[6].source and "twice" not in released.cells[6].source
    shutil.copytree(course / "release" / "labs", course / "submitted" / "blank" / "labs")
    _nbgrader(course, "autograde", "labs", "--create", "--force")
    graded = nbformat.read(course / "autograded" / "blank" / "labs" / "96_asked.ipynb", as_version=4)
    compared = "".join(o.get("text", "") for o in graded.cells[4].outputs)
    assert "no prediction" in compared  # the comparison ran on the blank prediction
    _nbgrader(course, "export")
    row = next(csv.DictReader(open(course / "grades.csv")))
    assert float(row["max_score"]) == 3.0 and row["student_id"] == "blank"
