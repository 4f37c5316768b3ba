"""Grades in the shapes gradebooks take (Gradescope's results.json, Canvas's import CSV) and regrades that say what
changed: checked against the formats' documented fields, and once end to end through `labkit grade`."""

import csv
import json

import nbformat
import pytest

from labkit import cli
from labkit.grading import exports

SHA = "a" * 64


def _grades(release=SHA, **students):
    """A grades.json as labkit grade writes it: students -> notebook -> rows of (exercise, passed, message)."""
    data = {"profile": "quick", "timeout_s": 60, "labkit_version": "0.test", "isolated": True,
            "release_sha256": release, "students": {}}
    for student, notebooks in students.items():
        for nb, rows in notebooks.items():
            results = [{"student": student, "notebook": nb, "exercise": ex, "passed": ok, "message": msg}
                       for ex, ok, msg in rows]
            data["students"].setdefault(student, {})[nb] = {
                "passed": sum(ok for _, ok, _ in rows), "exercises": len(rows), "seconds": 12.5, "results": results}
    return data


CLASS = _grades(
    ana={"05_cuda_kernels.ipynb": [("naive_matmul", True, "passed"), ("tiled_matmul", False, "the tile is not __shared__")],
         "07_ring_allreduce.ipynb": [("ring_chunks", True, "passed")]},
    ben={"05_cuda_kernels.ipynb": [("naive_matmul", False, "not written yet"), ("tiled_matmul", False, "not written yet")]},
)


def test_gradescope_results_follow_the_documented_format(tmp_path):
    files = exports.gradescope(CLASS, tmp_path)
    assert sorted(p.name for p in files) == ["ana.json", "ben.json"] and not (tmp_path / "results.json").exists()
    ana = json.loads((tmp_path / "gradescope" / "ana.json").read_text())
    assert set(ana) <= exports.GRADESCOPE_FIELDS and isinstance(ana["tests"], list)
    for test in ana["tests"]:
        assert set(test) <= exports.GRADESCOPE_TEST_FIELDS
        assert isinstance(test["score"], float) and isinstance(test["max_score"], float) and isinstance(test["name"], str)
        assert test["visibility"] in {"hidden", "after_due_date", "after_published", "visible"}
        assert test["status"] in {"passed", "failed"} and (test["status"] == "passed") == (test["score"] == 1.0)
    assert [(t["name"], t["score"], t["output"]) for t in ana["tests"]] == [
        ("Lab 05 cuda kernels: naive_matmul", 1.0, "passed"),
        ("Lab 05 cuda kernels: tiled_matmul", 0.0, "the tile is not __shared__"),
        ("Lab 07 ring allreduce: ring_chunks", 1.0, "passed")]
    assert ana["score"] == 2.0 and ana["execution_time"] == 25 and ana["visibility"] in {"visible", "hidden"}
    one = _grades(ana={"07_ring_allreduce.ipynb": [("ring_chunks", True, "passed")]})
    exports.gradescope(one, tmp_path / "autograder")  # one submission, as inside Gradescope's autograder image
    assert json.loads((tmp_path / "autograder" / "results.json").read_text())["score"] == 1.0


def test_gradescope_takes_a_late_penalty_off_each_tests_score():
    late = _grades(ana={"05_cuda_kernels.ipynb": [("naive_matmul", True, "passed"), ("tiled_matmul", False, "no")],
                        "07_ring_allreduce.ipynb": [("ring_chunks", True, "passed")]})
    entry = late["students"]["ana"]["05_cuda_kernels.ipynb"]
    entry["results"][0]["points"] = 4
    entry["late"] = {"deadline": "2026-10-02T23:59:00+02:00", "days_late": 2, "percent": 20.0, "note": "2 days late: -20 %"}
    result = exports.gradescope_result(late["students"]["ana"], late)
    assert [(t["score"], t["max_score"]) for t in result["tests"]] == [(3.2, 4.0), (0.0, 1.0), (1.0, 1.0)]
    assert result["score"] == 4.2 == sum(t["score"] for t in result["tests"])  # the tests add up to the score
    assert "less 20 % for late work" in result["tests"][0]["output"] and "2 days late: -20 %" in result["output"]


def test_gradescope_leaderboard_holds_each_passed_open_exercises_score_and_no_hidden_one():
    data = _grades(ana={"05_cuda_kernels.ipynb": [("fast_matmul", True, "passed"), ("tiled_matmul", True, "passed")]},
                   ben={"05_cuda_kernels.ipynb": [("fast_matmul", False, "slower than labkit's tiled kernel")]})
    perf = {"label": "modelled 1024^3 on the H100 SXM", "value": 98.3, "unit": "µs", "lower_is_better": True}
    data["students"]["ana"]["05_cuda_kernels.ipynb"]["results"][0]["performance"] = perf
    data["students"]["ben"]["05_cuda_kernels.ipynb"]["results"][0]["performance"] = {**perf, "value": 50.0}
    ana = exports.gradescope_result(data["students"]["ana"], data)
    assert set(ana) <= exports.GRADESCOPE_FIELDS
    assert ana["leaderboard"] == [{"name": "Lab 05 cuda kernels: fast_matmul (µs)", "value": 98.3, "order": "asc"}]
    assert "leaderboard" not in exports.gradescope_result(data["students"]["ben"], data)  # a failed answer: no entry
    assert "leaderboard" not in exports.gradescope_result(data["students"]["ana"], data, hidden={"fast_matmul"})


# a gradebook as Canvas's Grades > Export writes it: the identity columns, each assignment as "Title (id)", the
# assignment group and total columns, a Manual Posting row and a Points Possible row before the students, and the
# test student at the end
GRADEBOOK = (
    'Student,ID,SIS User ID,SIS Login ID,Section,Lab 05: CUDA kernels (5555),Lab 7 Ring allreduce (5557),'
    'Quiz 1 (6001),Assignments Current Score,Assignments Unposted Current Score,Current Score,Unposted Current Score\n'
    ',,,,,Manual Posting,,,,,,\n'
    '    Points Possible,,,,,4.00,1.00,10.00,(read only),(read only),(read only),(read only)\n'
    '"Alvarez, Ana",4411,S1001,ana.alvarez,CS 491 Fall 2026,,,8.00,80,80,80,80\n'
    '"Brown, Ben",4412,ben,bbrown,CS 491 Fall 2026,,,7.00,70,70,70,70\n'
    '"Student, Test",4499,,,CS 491 Fall 2026,,,,,,,\n')


def test_canvas_csv_goes_into_the_gradebooks_assignment_columns_by_id(tmp_path):
    (tmp_path / "gradebook.csv").write_text(GRADEBOOK, encoding="utf-8")
    data = json.loads(json.dumps(CLASS))
    data["students"]["ana"]["05_cuda_kernels.ipynb"]["submission"] = {"lms": "canvas", "lms_user_id": "4411"}
    done = exports.canvas(data, tmp_path / "out", tmp_path / "gradebook.csv")
    rows = list(csv.reader(done.path.open()))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Lab 05: CUDA kernels (5555)",
                       "Lab 7 Ring allreduce (5557)"]
    assert rows[1][0] == "Points Possible" and rows[1][5:] == ["4.00", "1.00"]
    # ana by the Canvas user id collect recorded, ben by his SIS User ID; lab 05 is worth 2 here, 4 in Canvas: scaled
    assert rows[2] == ["Alvarez, Ana", "4411", "S1001", "ana.alvarez", "CS 491 Fall 2026", "2", "1"]
    assert rows[3] == ["Brown, Ben", "4412", "ben", "bbrown", "CS 491 Fall 2026", "0", ""] and len(rows) == 4
    assert done.unmatched == [] and done.notes == [
        "Lab 05: CUDA kernels (5555): 2 points here, 4 in Canvas: scaled",
        "no submission: Brown, Ben (4412): Lab 7 Ring allreduce (5557): left blank, which Canvas keeps as it was "
        "(--canvas-missing-zero gives 0)"]
    named = exports.canvas(data, tmp_path / "named", tmp_path / "gradebook.csv", {"07": "6001"})
    assert "Quiz 1 (6001)" in next(csv.reader(named.path.open()))


def test_canvas_gives_0_to_the_gradebooks_students_with_no_submission_or_names_them(tmp_path):
    # Cy is in the gradebook and handed in nothing; Ben handed in no lab 07
    roster = GRADEBOOK.replace('"Student, Test"', '"Chen, Cy",4413,S1003,cchen,CS 491 Fall 2026,,,,,,,\n"Student, Test"')
    (tmp_path / "gradebook.csv").write_text(roster, encoding="utf-8")
    data = json.loads(json.dumps(CLASS))
    data["students"]["ana"]["05_cuda_kernels.ipynb"]["submission"] = {"lms": "canvas", "lms_user_id": "4411"}
    blank = exports.canvas(data, tmp_path / "blank", tmp_path / "gradebook.csv")
    assert [r[0] for r in csv.reader(blank.path.open())] == ["Student", "Points Possible", "Alvarez, Ana", "Brown, Ben"]
    assert blank.missing == ["Brown, Ben (4412): Lab 7 Ring allreduce (5557)",
                             "Chen, Cy (4413): Lab 05: CUDA kernels (5555), Lab 7 Ring allreduce (5557)"]
    assert "no submission: Chen, Cy (4413): Lab 05: CUDA kernels (5555), Lab 7 Ring allreduce (5557): left blank, " \
           "which Canvas keeps as it was (--canvas-missing-zero gives 0)" in blank.notes
    zero = exports.canvas(data, tmp_path / "zero", tmp_path / "gradebook.csv", zero_missing=True)
    rows = list(csv.reader(zero.path.open()))
    assert rows[3:] == [["Brown, Ben", "4412", "ben", "bbrown", "CS 491 Fall 2026", "0", "0"],
                        ["Chen, Cy", "4413", "S1003", "cchen", "CS 491 Fall 2026", "0", "0"]]
    assert zero.missing == blank.missing and "no submission: Brown, Ben (4412): Lab 7 Ring allreduce (5557): given 0" \
        in zero.notes
    bare = exports.canvas(CLASS, tmp_path / "bare", zero_missing=True)  # no gradebook: the graded students' labs
    assert [r["Lab 07 ring allreduce"] for r in csv.DictReader(bare.path.open())][1:] == ["1", "0"]
    assert bare.missing == ["ben: Lab 07 ring allreduce"]


def test_canvas_export_refuses_unmatched_students_and_unclear_assignments(tmp_path):
    (tmp_path / "gradebook.csv").write_text(GRADEBOOK, encoding="utf-8")
    data = json.loads(json.dumps(CLASS))
    data["students"]["cy"] = data["students"].pop("ana")  # nobody in the gradebook is cy
    with pytest.raises(ValueError, match=r"not in the Canvas gradebook gradebook.csv .*: cy\. .*--allow-unmatched"):
        exports.canvas(data, tmp_path / "out", tmp_path / "gradebook.csv")
    assert not (tmp_path / "out" / "canvas.csv").exists()
    done = exports.canvas(data, tmp_path / "out", tmp_path / "gradebook.csv", allow_unmatched=True)
    assert done.unmatched == ["cy"] and [r[0] for r in csv.reader(done.path.open())] == ["Student", "Points Possible",
                                                                                          "Brown, Ben"]
    (tmp_path / "two.csv").write_text(GRADEBOOK.replace("Quiz 1 (6001)", "Lab 05 retake (6001)"), encoding="utf-8")
    with pytest.raises(ValueError, match=r"lab 05: 2 assignments could be it .*--canvas-assignment NN=ID"):
        exports.canvas(data, tmp_path / "x", tmp_path / "two.csv")
    with pytest.raises(ValueError, match="lab 07: no assignment with id 999"):
        exports.canvas(data, tmp_path / "x", tmp_path / "gradebook.csv", {"07": "999"})
    (tmp_path / "bad.csv").write_text("name,score\nana,3\n")
    with pytest.raises(ValueError, match="not a Canvas gradebook export"):
        exports.canvas(CLASS, tmp_path / "x", tmp_path / "bad.csv")


def test_canvas_without_a_gradebook_and_answer_points(tmp_path):
    path = exports.canvas(CLASS, tmp_path / "bare").path  # the folder names stand for the students
    rows = list(csv.DictReader(path.open()))
    assert [(r["Student"], r["SIS Login ID"], r["Lab 07 ring allreduce"]) for r in rows[1:]] == [
        ("ana", "ana", "1"), ("ben", "ben", "")]  # ben handed in no lab 07: a blank, not a zero Canvas would keep
    data = _grades(ana={"01_serial_backprop.ipynb": [("backprop", True, "passed")]})
    data["students"]["ana"]["01_serial_backprop.ipynb"].update(answers=[{}, {}], answer_points=3, answer_score=2)
    rows = list(csv.reader(exports.canvas(data, tmp_path).path.open()))
    assert rows[1][-1] == "4" and rows[2][-1] == "3"  # 1 exercise + 3 answer points possible; 1 + 2 scored
    result = exports.gradescope_result(data["students"]["ana"], data)
    assert result["score"] == 1.0 and "2 written answer(s)" in result["output"]


def test_changes_name_each_verdict_that_moved_and_refuse_another_release():
    after = _grades(
        ana={"05_cuda_kernels.ipynb": [("naive_matmul", True, "passed"), ("tiled_matmul", True, "passed")],
             "07_ring_allreduce.ipynb": [("ring_chunks", False, "chunk 2 is sent twice")]},
        ben={"05_cuda_kernels.ipynb": [("naive_matmul", False, "not written yet"), ("tiled_matmul", False, "x")]},
        cy={"05_cuda_kernels.ipynb": [("naive_matmul", True, "passed")]})
    rows = exports.changes(CLASS, after)
    assert [(r["student"], r["exercise"], r["before"], r["after"], r["why"]) for r in rows] == [
        ("ana", "tiled_matmul", "failed", "passed", "passed"),
        ("ana", "ring_chunks", "passed", "failed", "chunk 2 is sent twice"),
        ("cy", "naive_matmul", "not graded", "passed", "passed")]  # ben's message changed, his verdict did not
    assert "3 verdict(s) changed for 2 student(s): 2 now pass, 1 no longer pass" in exports.describe_changes(rows)
    other = dict(after, release_sha256="b" * 64)
    with pytest.raises(ValueError, match="another release"):
        exports.changes(CLASS, other)
    assert len(exports.changes(CLASS, other, allow_other_release=True)) == 3


def test_a_missing_or_foreign_grades_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no grades.json at"):
        exports.load(tmp_path)
    (tmp_path / "grades.json").write_text('{"rows": []}')
    with pytest.raises(ValueError, match="not a grades.json written by labkit grade"):
        exports.load(tmp_path)


@pytest.mark.sandbox
@pytest.mark.notebooks
def test_grade_exports_and_a_regrade_says_whose_verdict_changed(tmp_path, capsys, monkeypatch):
    from test_grade import QUICK  # here, not at the top: importing test_grade probes the sandbox

    monkeypatch.chdir(tmp_path)
    for student in ("ana", "ben"):
        (tmp_path / "subs" / student).mkdir(parents=True)
        nbformat.write(QUICK, tmp_path / "subs" / student / "97_quick.ipynb")
    grade = ["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "first"), "--export", "gradescope",
             "--export", "canvas", "--feedback", str(tmp_path / "feedback"), "--hidden", "karp_flatt#2"]
    assert cli.main(grade) == 0
    out = capsys.readouterr().out
    assert "Gradescope: 2 results file(s)" in out and "Canvas: " in out and "feedback: 2 page(s)" in out
    # a lab 12 notebook by its checks, whatever its file is called: its rows and pages are lab 12's
    page = (tmp_path / "feedback" / "ben" / "12_speedup_plots.html").read_text()
    assert "✔ passed" in page and "✘ failed" in page and "a hidden check failed" in page
    ben = json.loads((tmp_path / "first" / "gradescope" / "ben.json").read_text())
    assert [t["status"] for t in ben["tests"]] == ["passed", "failed"]
    assert list(csv.reader((tmp_path / "first" / "canvas.csv").open()))[2] == ["ana", "", "", "ana", "", "1"]
    # ben fixes nothing but breaks his first answer; the grader is run again against the first run's grades
    nb = nbformat.read(tmp_path / "subs" / "ben" / "97_quick.ipynb", as_version=4)
    nb.cells[3].source = "check.karp_flatt(lambda p, s: 1 / s)"
    nbformat.write(nb, tmp_path / "subs" / "ben" / "97_quick.ipynb")
    assert cli.main(["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "second"),
                     "--regrade", str(tmp_path / "first")]) == 0
    assert "regrade: 1 verdict(s) changed for 1 student(s): 0 now pass, 1 no longer pass" in capsys.readouterr().out
    rows = list(csv.DictReader((tmp_path / "second" / "changes.csv").open()))
    assert [(r["student"], r["exercise"], r["before"], r["after"]) for r in rows] == [
        ("ben", "karp_flatt", "passed", "failed")] and rows[0]["why"]
    first = json.loads((tmp_path / "first" / "grades.json").read_text())
    first["release_sha256"] = SHA
    (tmp_path / "first" / "grades.json").write_text(json.dumps(first))
    with pytest.raises(SystemExit, match="another release"):
        cli.main(["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "third"), "--regrade", str(tmp_path / "first")])
    assert not (tmp_path / "third").exists()  # refused before grading anything


def _feedback_class(tmp_path):
    """A graded class of one: ana's executed notebook (with hostile markdown and outputs) and its grades."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    nb = new_notebook(cells=[
        new_markdown_cell("# Lab 97\n\nMy notes <script>alert(1)</script> and <img src=x onerror=alert(2)>, "
                          "with <b>plain</b> tags kept."),
        new_code_cell("check.speedup_efficiency(mine)", outputs=[
            new_output("error", ename="ExerciseError", evalue="speedup: rank 2 is wrong", traceback=[])]),
        new_code_cell("check.karp_flatt(mine)", outputs=[
            new_output("stream", name="stdout", text="THE SECRET INPUTS 7 11 13")]),
        new_code_cell("show()", outputs=[new_output("display_data", data={
            "text/html": "<script>alert(3)</script>", "application/javascript": "alert(4)", "text/plain": "a table"})]),
    ])
    (tmp_path / "grades" / "executed" / "ana").mkdir(parents=True)
    nbformat.write(nb, tmp_path / "grades" / "executed" / "ana" / "97_quick.ipynb")
    return _grades(ana={"97_quick.ipynb": [("speedup_efficiency", False, "speedup: rank 2 is ```wrong``` <i>x</i>"),
                                           ("karp_flatt", False, "e at p=7 should be 0.13")]})


def test_feedback_pages_show_each_verdict_and_hide_what_is_hidden_and_run_no_script(tmp_path):
    from labkit.grading import feedback

    data = _feedback_class(tmp_path)
    data["students"]["ana"]["97_quick.ipynb"].update(answers=[{"score": 1}, {"score": None}], answer_points=3)
    (page,) = feedback.write(data, tmp_path / "fb", tmp_path / "grades", hidden={"karp_flatt"})
    assert page == tmp_path / "fb" / "ana" / "97_quick.html"
    text = page.read_text()
    assert "Exercises passed:</strong> 0 of 2" in text and "1 of them hidden" in text
    assert "1 of 3 points scored so far (1 of 2 still to be read)" in text and "each cell was allowed 60 s" in text
    assert "speedup: rank 2 is ```wrong``` &lt;i&gt;x&lt;/i&gt;" in text  # the visible message, as literal text
    assert "a hidden check failed" in text and "0.13" not in text and "THE SECRET INPUTS" not in text
    assert "<script>alert" not in text and "<img src=x" not in text and "alert(3)" not in text and "alert(4)" not in text
    assert "<b>plain</b>" in text and "a table" in text
    # a lab with no executed notebook (not handed in) still gets its page, from the rows
    data["students"]["ana"]["98_other.ipynb"] = {"passed": 0, "exercises": 1, "results": [
        {"student": "ana", "notebook": "98_other.ipynb", "exercise": "backprop", "passed": False,
         "message": "notebook not handed in"}]}
    pages = feedback.write(data, tmp_path / "fb2", tmp_path / "grades")
    assert "notebook not handed in" in (tmp_path / "fb2" / "ana" / "98_other.html").read_text() and len(pages) == 2


def test_hidden_checks_show_in_gradescope_only_once_published():
    result = exports.gradescope_result(CLASS["students"]["ana"], CLASS, hidden={"tiled_matmul"})
    tiled = next(t for t in result["tests"] if t["name"].endswith("tiled_matmul"))
    assert tiled["visibility"] == "after_published" and tiled["output"] == "a hidden check failed"
    assert tiled["score"] == 0.0 and "__shared__" not in json.dumps(result)
