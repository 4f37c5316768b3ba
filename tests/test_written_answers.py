"""Written answers: a rubric per question in the release, the answers page with the model answer and the measured
value beside each student's, a blank answer 0 and said, and check-submission naming the blank ones."""

import csv
import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from labkit.grading import answers, prose, selfcheck
from labkit.grading.notebook import ExerciseResult

LAB = "96_asked.ipynb"


def _instructor():
    """A lab with a prediction (its model answer 240), the experiment printing it beside the measurement, and an
    explain question."""
    return new_notebook(cells=[
        new_markdown_cell("# Lab 96"),
        new_markdown_cell("**Question (predict).** How many kB does rank 0 send?"),
        new_code_cell("predicted_kB = 240  # kB", metadata={"labkit": {"answer": "96-kB", "kind": "predict", "points": 1}}),
        new_code_cell("sent = ring(1000)"),
        new_code_cell("compare(predicted_kB, sent, 'kB')"),
        new_markdown_cell("**Question (explain).** Why?"),
        new_markdown_cell("Each chunk goes around twice.", metadata={"labkit": {"answer": "96-why", "kind": "explain",
                                                                               "points": 2}})])


def _release(tmp_path):
    from labkit.grading import assign

    (tmp_path / "course").mkdir()
    nbformat.write(_instructor(), tmp_path / "course" / LAB)
    assign.write_student_versions([tmp_path / "course" / LAB], tmp_path / "handout", release_dir=tmp_path / "release")
    return json.loads((tmp_path / "release" / "release.json").read_text())


def test_a_default_rubric_is_written_into_the_release_with_the_model_answers_and_read_back_as_edited(tmp_path):
    record = _release(tmp_path)
    rubrics = answers.load_rubrics(tmp_path / "release", record, instructor=tmp_path / "course")
    path = tmp_path / "release" / answers.RUBRICS_FILE
    assert json.loads(path.read_text()) == rubrics
    why = rubrics[LAB]["96-why"]
    assert why["model_answer"] == "Each chunk goes around twice." and why["points"] == 2
    assert why["items"] == [{"id": "a", "points": 2, "criterion": "as the model answer", "comment": ""}]
    assert rubrics[LAB]["96-kB"]["model_answer"] == "predicted_kB = 240  # kB"
    why["items"] = [{"id": "twice", "points": 1.5, "criterion": "each chunk twice", "comment": "Right: twice."},
                    {"id": "N", "points": 0.5, "criterion": "counts N", "comment": "and N elements."}]
    path.write_text(json.dumps(rubrics))
    assert answers.load_rubrics(tmp_path / "release" / "release.json")[LAB]["96-why"]["items"][0]["id"] == "twice"


@pytest.mark.parametrize("items, complaint", [
    ([{"id": "a", "points": 1}, {"id": "a", "points": 1}], "an item id repeats"),
    ([{"id": "a", "points": 2}, {"id": "b", "points": 1}], "add up to 3 points, more than the question's 2"),
    ([{"id": "a", "points": -1}], "must be a number >= 0"),
    ([{"points": 1}], "items must be a list of"),
])
def test_a_rubric_that_cannot_be_right_is_refused_naming_the_question(tmp_path, items, complaint):
    (tmp_path / answers.RUBRICS_FILE).write_text(json.dumps({LAB: {"96-why": {"points": 2, "items": items}}}))
    with pytest.raises(ValueError, match=f"{LAB} / 96-why: .*{complaint}"):
        answers.load_rubrics(tmp_path)
    (tmp_path / answers.RUBRICS_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON .* delete it to get the default back"):
        answers.load_rubrics(tmp_path)


RUBRIC = {"points": 2, "items": [{"id": "twice", "points": 1.5, "comment": "Right: twice."},
                                 {"id": "N", "points": 0.5, "comment": "And N elements."}]}


@pytest.mark.parametrize("row, expected", [
    ({"items": "twice, N"}, (2.0, "Right: twice. And N elements.", "")),
    ({"items": "twice", "comment": "Say why."}, (1.5, "Right: twice. Say why.", "")),
    ({"score": "1", "items": "N"}, (1.0, "And N elements.", "")),  # the score column wins
    ({"comment": "Read again."}, (None, "Read again.", "")),
    ({"items": "thrice"}, (None, "", "rubric item thrice is not in the rubric (its items: twice, N")),
    ({"score": "3"}, (None, "", "score 3 is outside 0..2")),
    ({"score": "lots"}, (None, "", "score 'lots' is not a number")),
])
def test_a_hand_score_comes_from_the_score_or_the_rubric_items_earned(row, expected):
    score, comment, warning = answers.hand_score(row, RUBRIC, 2)
    assert (score, comment) == expected[:2] and warning.startswith(expected[2])


def _executed(student_kB, measured_line):
    nb = _instructor()
    nb.cells[2].source = f"predicted_kB = {student_kB}"
    nb.cells[4].outputs = [new_output("stream", name="stdout", text=measured_line)]
    nb.cells[6].source = "Twice around, I think."
    return nb


def test_the_page_shows_the_model_answer_the_rubric_and_each_prediction_beside_its_run(tmp_path):
    record = _release(tmp_path)
    rubrics = answers.load_rubrics(tmp_path / "release", record, instructor=tmp_path / "course")
    (tmp_path / "out" / "executed" / "ann").mkdir(parents=True)
    nbformat.write(_executed(300, "you predicted 300 kB; measured 237 kB: the measurement is 1.3x smaller"),
                   tmp_path / "out" / "executed" / "ann" / "Lab 96 - ann (1).ipynb")  # a renamed upload
    ann = answers.collect(_executed(300, ""), "ann", LAB)
    bob = answers.collect_against(new_notebook(cells=[]), _instructor(), "bob", LAB)
    answers.merge_scores(ann + bob, tmp_path / "none.csv")
    csv_path, page = answers.write(tmp_path / "out", ann + bob, rubrics=rubrics)
    text = page.read_text()
    assert "Model answer</b><pre>Each chunk goes around twice.</pre>" in text
    assert "<th>measured in their run</th>" in text and "measured 237 kB: the measurement is 1.3x smaller" in text
    assert "<td>a</td><td>2</td><td>as the model answer</td>" in text
    assert text.count("blank: 0 points") >= 2 and "still to be read" not in text
    rows = {(r["student"], r["question"]): r for r in csv.DictReader(open(csv_path))}
    assert rows[("bob", "96-why")]["score"] == "0" and rows[("ann", "96-why")]["score"] == ""
    assert {"items", "comment"} <= set(rows[("ann", "96-why")])


def test_scores_from_rubric_items_with_their_comments_reach_the_answers(tmp_path):
    mine = answers.collect(_executed(300, ""), "ann", LAB)
    answers.write(tmp_path, mine)
    rows = list(csv.DictReader(open(tmp_path / answers.ANSWERS_CSV)))
    for r in rows:
        r.update(items="twice", comment="Say where N comes in.") if r["question"] == "96-why" else r.update(score="1")
    with open(tmp_path / answers.ANSWERS_CSV, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=rows[0].keys())
        w.writeheader()
        w.writerows(rows)
    again = answers.collect(_executed(300, ""), "ann", LAB)
    assert answers.merge_scores(again, tmp_path / answers.ANSWERS_CSV, {LAB: {"96-why": RUBRIC}}) == []
    why = next(a for a in again if a.question == "96-why")
    assert (why.score, why.items, why.comment) == (1.5, "twice", "Right: twice. Say where N comes in.")


def test_grading_with_a_release_scores_by_its_rubrics_and_grades_carry_each_comment(tmp_path, monkeypatch):
    from labkit.grading import grade

    _release(tmp_path)
    monkeypatch.setattr(grade, "grade_notebook", lambda path, student, *a, name=None, **k: [
        ExerciseResult(student, name, "ring_allreduce", True, "")])  # the answers are read, no notebook runs
    (tmp_path / "subs" / "ann").mkdir(parents=True)
    nbformat.write(_executed(300, ""), tmp_path / "subs" / "ann" / LAB)
    run = dict(progress=False, release=tmp_path / "release", isolate=False)
    grade.grade(tmp_path / "subs", tmp_path / "out", **run)
    rubrics = json.loads((tmp_path / "release" / answers.RUBRICS_FILE).read_text())  # the default, written to edit
    rubrics[LAB]["96-why"]["items"] = RUBRIC["items"]
    (tmp_path / "release" / answers.RUBRICS_FILE).write_text(json.dumps(rubrics))
    rows = list(csv.DictReader(open(tmp_path / "out" / answers.ANSWERS_CSV)))
    for r in rows:
        r.update(items="twice,N", comment="Say where N comes in.") if r["question"] == "96-why" else r.update(score="1")
    with open(tmp_path / "out" / answers.ANSWERS_CSV, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=rows[0].keys())
        w.writeheader()
        w.writerows(rows)
    _, _, json_path = grade.grade(tmp_path / "subs", tmp_path / "out", **run)  # a regrade keeps the items' scores
    entry = json.loads(json_path.read_text())["students"]["ann"][LAB]
    why = next(a for a in entry["answers"] if a["question"] == "96-why")
    assert (why["score"], why["items"]) == (2.0, "twice,N") and entry["answer_score"] == 3.0
    assert why["comment"] == "Right: twice. And N elements. Say where N comes in."
    assert "Right: twice." in (tmp_path / "out" / answers.ANSWERS_HTML).read_text()  # the release's rubric shown


def test_the_measured_value_is_the_compare_line_that_names_the_prediction():
    nb = _executed(300, "you predicted 300 kB; measured 240 kB\n")
    nb.cells.insert(4, new_code_cell("compare(other, 1)", outputs=[new_output("stream", name="stdout", text="OTHER")]))
    assert answers.measured_beside(nb, "96-kB") == "you predicted 300 kB; measured 240 kB"
    assert answers.measured_beside(nb, "96-why") == "" and answers.measured_beside(nb, "missing") == ""


def test_the_measured_value_is_the_comparison_a_notebook_shows_as_display_data():
    from labkit.questions import PREDICTION_MIME

    line = "you predicted 300 kB; measured 240 kB: the measurement is 1.2x smaller than your prediction."
    nb = _executed(300, "rank 0 sent 240 kB\n")
    nb.cells[4].outputs += [new_output("display_data", data={"text/plain": "<Figure size 640x480>", "image/png": "iVBO"}),
                            new_output("display_data", data={"text/plain": line, PREDICTION_MIME: {"published": "..."}})]
    assert answers.measured_beside(nb, "96-kB") == f"rank 0 sent 240 kB\n{line}"  # the figure's text is not a measurement


def _graded(monkeypatch, tmp_path, nb):
    from labkit.grading import notebook, sandbox

    path = tmp_path / LAB
    monkeypatch.setattr(sandbox, "available", lambda: (False, "not probed here"))
    nbformat.write(nb, path)
    monkeypatch.setattr(notebook, "grade_notebook", lambda p, student, *a, **k: [
        ExerciseResult(student, p.name, "ring_allreduce", True, "")])
    return selfcheck.check_submission(path, quiet=True, isolate=False)


def test_check_submission_names_the_blank_written_answers(tmp_path, monkeypatch):
    from labkit.grading import assign

    handout = assign.student_notebook(_instructor())
    result = _graded(monkeypatch, tmp_path, handout)
    assert [(a.question, a.points) for a in result.blank] == [("96-kB", 1), ("96-why", 2)]
    assert ("written answers left blank, 0 points each as they stand: 96-kB (1 point), 96-why (2 points)"
            in result.report())
    handout.cells[2].source, handout.cells[6].source = "predicted_kB = 200", "Twice."
    result = _graded(monkeypatch, tmp_path, handout)
    assert result.blank == [] and "written answers: all 2 written" in result.report()
    del handout.cells[6]  # a deleted answer cell is blank too, where the release lists the question
    assert [a.question for a in answers.blank_answers(handout, {"answers": [{"id": "96-why", "kind": "explain",
                                                                              "points": 2}]})] == ["96-why"]


WHY = ("Each rank sends its chunk to the next rank and receives one from the previous, so after p - 1 steps every rank "
       "holds one fully reduced chunk; the allgather then passes those chunks around the ring once more.")
CLASS = {  # student -> (their prediction, their explanation)
    "ann": ("240", "each RANK sends its chunk to the next rank, and receives one from the previous: so after p-1 steps "
                   "every rank holds ONE fully reduced chunk.\n\nThe allgather then passes those chunks around the ring "
                   "once more!"),  # word for word
    "bob": ("240", WHY.replace("receives", "gets")),  # one word changed
    "cyd": ("240", "Rank 0 sends 2(p-1) messages of N/p elements: about 2N in all, whatever p is, against (p-1)N "
                   "for the naive one."),  # her own words; the model's prediction, as many will predict
    "dan": (None, None),  # blank
}


def _copying_class(tmp_path):
    """The lab's explain question with a model answer of the labs' length, released with its rubrics; a class that
    answered it."""
    from labkit.grading import assign

    lab = _instructor()
    lab.cells[6].source = WHY
    (tmp_path / "course").mkdir()
    nbformat.write(lab, tmp_path / "course" / LAB)
    assign.write_student_versions([tmp_path / "course" / LAB], tmp_path / "handout", release_dir=tmp_path / "release")
    answers.load_rubrics(tmp_path / "release", instructor=tmp_path / "course")  # rubrics.json, the model answers in it
    for student, (kB, why) in CLASS.items():
        nb = nbformat.read(tmp_path / "handout" / LAB, as_version=4)
        if kB:
            nb.cells[2].source, nb.cells[6].source = f"predicted_kB = {kB}  # kB", why
        (tmp_path / "subs" / student).mkdir(parents=True)
        nbformat.write(nb, tmp_path / "subs" / student / LAB)


def test_an_explanation_copied_from_the_model_answer_is_flagged_for_the_instructor_alone(tmp_path, monkeypatch):
    from labkit.grading import grade

    _copying_class(tmp_path)
    monkeypatch.setattr(grade, "grade_notebook", lambda path, student, *a, name=None, **k: [
        ExerciseResult(student, name, "ring_allreduce", True, "")])  # the answers are read, no notebook runs
    _, _, json_path = grade.grade(tmp_path / "subs", tmp_path / "out", progress=False, release=tmp_path / "release",
                                  isolate=False)
    rows = {(r["student"], r["question"]): r["copied"]
            for r in csv.DictReader(open(tmp_path / "out" / answers.ANSWERS_CSV))}
    n = len(prose.words(WHY))
    assert rows == {("ann", "96-why"): "copied from the model answer, word for word",
                    ("bob", "96-why"): f"copied from the model answer ({int((n - 1) / n * 100)} % of its words, in order)",
                    ("cyd", "96-why"): "", ("dan", "96-why"): "",
                    **{(s, "96-kB"): "" for s in CLASS}}  # the model's 240 predicted by three: no flag
    page = (tmp_path / "out" / answers.ANSWERS_HTML).read_text()
    assert "96-kB (predict, 1 point; 1 of 4 blank)</h2>" in page
    assert "96-why (explain, 2 points; 1 of 4 blank; 2 copied from the model answer)</h2>" in page
    assert page.count("<p class='copied'>") == 2 and "97 % of its words, in order" in page
    assert "from the model answer" not in json_path.read_text()  # grades.json, whence feedback: not the student's
    rows = list(csv.DictReader(open(tmp_path / "out" / answers.ANSWERS_CSV)))
    for r in rows:  # the instructor scores in the file; the flag stays through a regrade
        r["score"] = "0" if r["copied"] else ""
    with open(tmp_path / "out" / answers.ANSWERS_CSV, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=rows[0].keys())
        w.writeheader()
        w.writerows(rows)
    grade.grade(tmp_path / "subs", tmp_path / "out", progress=False, release=tmp_path / "release", isolate=False)
    again = {(r["student"], r["question"]): (r["score"], r["copied"])
             for r in csv.DictReader(open(tmp_path / "out" / answers.ANSWERS_CSV))}
    assert again[("bob", "96-why")][0] == "0" and again[("bob", "96-why")][1].startswith("copied from the model answer")
