"""Points, late work, hand scores and regrades: what each row and answer is worth, the penalty from the submission
time, --rescore without running a notebook, --merge keeping the later grade, and which lab a file is."""

import csv
import json
import os
from datetime import datetime, timedelta, timezone

import nbformat
import pytest

from labkit import cli, labs
from labkit.grading import assign, grade, late, scores
from labkit.grading.notebook import ExerciseResult

LAB01 = labs.NOTEBOOKS / "01_serial_backprop.ipynb"
LAB07 = labs.NOTEBOOKS / "07_ring_allreduce.ipynb"
NB = "01_serial_backprop.ipynb"
UTC = timezone.utc


def test_points_come_from_the_release_and_a_hidden_part_is_a_share_of_them():
    record = {"notebooks": {NB: {"hidden_share": 0.25, "exercises": [{"name": "backprop", "points": 3},
                                                                      {"name": "layer_backward"}]}}}
    rows = [ExerciseResult("ana", NB, name, True, "passed") for name in ("backprop", "backprop~hidden", "layer_backward")]
    scores.set_points(rows, record, {"backprop"})
    assert [r.points for r in rows] == [2.25, 0.75, 1.0]  # 3 points in all, with or without the hidden part
    plain = [ExerciseResult("ana", NB, "backprop", True, "passed")]
    scores.set_points(plain, record, set())
    assert plain[0].points == 3.0
    scores.set_points(plain, None, set())
    assert plain[0].points == 1.0  # without a release: a point each, as before


def test_partial_credit_is_the_share_of_the_checks_cases_passed_where_the_release_asks_for_it():
    rows = [ExerciseResult("ana", NB, "backprop", False, "wrong", cases=(3, 8)),
            ExerciseResult("ana", NB, "layer_backward", False, "wrong", cases=(2, 4)),
            ExerciseResult("ana", NB, "output_error", False, "not written yet", cases=None),
            ExerciseResult("ana", NB, "numerical_gradient", True, "passed", cases=(4, 4))]
    scores.set_points(rows, {"notebooks": {NB: {"exercises": [{"name": "backprop", "points": 2}]}}}, set())
    assert [r.score for r in rows] == [0.0, 0.0, 0.0, 1.0]  # by default, all or nothing
    record = {"notebooks": {NB: {"partial_credit": True, "exercises": [
        {"name": "backprop", "points": 2}, {"name": "layer_backward", "partial_credit": False}]}}}
    scores.set_points(rows, record, set())
    assert [r.score for r in rows] == [0.75, 0.0, 0.0, 1.0]  # 3 of 8 cases of 2 points; the exercise opted out; none
    assert scores.row_score(False, 1.0, (5, 5)) == 0.8  # a failed check never scores its whole points
    entry = {"results": [{"exercise": r.exercise, "passed": r.passed, "points": r.points, "score": r.score}
                         for r in rows] + [{"exercise": "old", "passed": True, "points": 1}]}  # a row without a score
    scores.total(entry)
    assert (entry["exercise_score"], entry["exercise_points"]) == (2.75, 6.0)


def test_the_console_says_what_grades_csv_and_grades_json_hold():
    """1.5 of 4 points with partial credit, as grades.csv's scores add up, not "1 of 4"; and the lab's total."""
    rows = [ExerciseResult("ana", NB, "backprop", False, "wrong", points=2, cases=(1, 4)),
            ExerciseResult("ana", NB, "output_error", True, "passed"),
            ExerciseResult("ana", NB, "layer_backward", False, "not written yet")]
    scores.set_points(rows, {"notebooks": {NB: {"partial_credit": True, "exercises": [{"name": "backprop",
                                                                                         "points": 2}]}}}, set())
    entry = {"results": [{"points": r.points, "score": r.score, "passed": r.passed} for r in rows],
             "answers": [{"score": 1.0, "points": 2}, {"score": None, "points": 1}], "answer_points": 3,
             "answer_score": 1.0, "late": {"percent": 10}}
    scores.total(entry)
    line = grade.summary(rows, {"students": {"ana": {NB: entry}}}).splitlines()[0]
    assert f"{NB}: 1/3 exercises passed, 1.5 of 4 points" in line
    assert line.endswith("written answers 1 of 3 (1 to score by hand), 10 % off for late work: total 2.25 of 7")
    assert grade.summary(rows).splitlines()[0].endswith("1.5 of 4 points")


def test_another_labs_notebook_is_left_out_without_being_called_a_stranger(tmp_path, capsys):
    assign.write_student_versions([LAB01, LAB07], tmp_path / "student", release_dir=tmp_path / "release")
    record, _ = grade.load_release(tmp_path / "release")
    found = [("ana", tmp_path / "student" / NB), ("ana", tmp_path / "student" / "07_ring_allreduce.ipynb")]
    handed = grade.place(found, record, {"07"})
    assert [h.name for h in handed] == ["07_ring_allreduce.ipynb"]
    assert "none of the release's labs" not in capsys.readouterr().err
    stranger = tmp_path / "x.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), stranger)
    grade.place([("ana", stranger)], record, {"07"})
    assert "x.ipynb: not graded, it is none of the release's labs" in capsys.readouterr().err


def test_assign_writes_partial_credit_into_the_release(tmp_path, capsys):
    assert cli.main(["assign", "--only", "01_", "--out", str(tmp_path / "out"), "--release", str(tmp_path / "rel"),
                     "--partial-credit"]) == 0
    record = json.loads((tmp_path / "rel" / assign.RELEASE_FILE).read_text())
    assert record["notebooks"][NB]["partial_credit"] is True
    assert cli.main(["assign", "--only", "01_", "--out", str(tmp_path / "out2"), "--release", str(tmp_path / "rel2")]) == 0
    assert json.loads((tmp_path / "rel2" / assign.RELEASE_FILE).read_text())["notebooks"][NB]["partial_credit"] is False


def test_the_feedback_says_which_share_of_the_cases_earned_the_partial_credit():
    from labkit.grading import feedback

    cell = feedback.verdict_cell("backprop", False, "backprop: batch of 8: wrong dW", False, 2.0, 0.75, [3, 8])
    assert "0.75 of 2 points" in cell.source and "3 of the check's 8 cases passed before it failed" in cell.source
    plain = feedback.verdict_cell("backprop", False, "wrong", False, 2.0, 0.0, None)
    assert "0 of 2 points" in plain.source and "partial" not in plain.source


def test_a_blank_answer_is_zero_and_says_so_and_totals_take_the_penalty():
    entry = {"results": [{"exercise": "backprop", "passed": True, "points": 2}, {"exercise": "x", "passed": False}],
             "late": {"percent": 20.0}}
    scores.answers_into(entry, [{"question": "01-a", "points": 2, "blank": True, "score": None},
                                {"question": "01-b", "points": 2, "blank": False, "score": None},
                                {"question": "01-c", "points": 1, "blank": False, "score": 1.0}])
    assert entry["answers"][0]["score"] == 0.0 and entry["answers"][0]["note"] == scores.BLANK_NOTE
    assert (entry["answer_points"], entry["answer_score"], entry["answers_unscored"]) == (5, 1.0, 1)
    scores.total(entry)
    assert (entry["points_possible"], entry["score_before_penalty"], entry["total"]) == (8, 3.0, 2.4)
    assert scores.unscored({"students": {"ana": {NB: entry}}}) == [f"ana, {NB}: 01-b"]


def test_the_late_penalty_counts_each_started_day_up_to_the_days_accepted():
    deadline = datetime(2026, 10, 2, 23, 59, tzinfo=UTC)
    policy = {"percent_per_day": 10, "max_days": 5}
    assert late.penalty(deadline - timedelta(hours=1), deadline, policy)["percent"] == 0
    one = late.penalty(deadline + timedelta(minutes=5), deadline, policy)
    assert (one["days_late"], one["percent"], one["note"]) == (1, 10.0, "1 day late: -10 %")
    assert late.penalty(deadline + timedelta(days=3, hours=12), deadline, policy)["percent"] == 40.0
    past = late.penalty(deadline + timedelta(days=6), deadline, policy)
    assert past["percent"] == 100.0 and "past the 5 days accepted" in past["note"]
    assert late.penalty(None, deadline, policy)["note"] == "no submission time known: no penalty applied"
    with pytest.raises(ValueError, match="names no timezone"):
        late.parse_time("2026-10-02T23:59:00", "deadline")


def test_extensions_move_one_students_deadline(tmp_path):
    (tmp_path / "ext.csv").write_text("student,lab,days,deadline\nana,01,2,\nbo,,,2026-10-09T12:00:00+00:00\n")
    ext = late.read_extensions(tmp_path / "ext.csv")
    entry = {"deadline": "2026-10-02T23:59:00+00:00"}
    assert late.deadline_for(entry, "ana", "01", ext) == datetime(2026, 10, 4, 23, 59, tzinfo=UTC)
    assert late.deadline_for(entry, "ana", "07", ext) == datetime(2026, 10, 2, 23, 59, tzinfo=UTC)
    assert late.deadline_for(entry, "bo", "07", ext) == datetime(2026, 10, 9, 12, 0, tzinfo=UTC)  # every lab
    (tmp_path / "bad.csv").write_text("who,when\nana,1\n")
    with pytest.raises(ValueError, match="student,lab,deadline"):
        late.read_extensions(tmp_path / "bad.csv")


def test_grades_carry_the_submission_time_and_the_penalty(tmp_path, capsys):
    (tmp_path / "submissions.csv").write_text(
        "student,lab,file,submitted_at,lms,lms_user_id,lms_submission_id\n"
        "ana,01,ana_1_2_lab.ipynb,2026-10-04T10:00:00+00:00,canvas,4411,90001\n")
    times = grade._times(tmp_path, None, None)  # the submissions folder's own submissions.csv
    record = {"notebooks": {NB: {"deadline": "2026-10-02T23:59:00+00:00", "late": {"percent_per_day": 10,
                                                                                   "max_days": 5}}}}
    students = {name: {NB: {"lab": "01", "results": [{"exercise": "backprop", "passed": True, "points": 4,
                                                      "message": "passed"}]}} for name in ("ana", "bo")}
    grade._add_late(students, record, times)
    ana, bo = students["ana"][NB], students["bo"][NB]
    assert ana["late"]["days_late"] == 2 and ana["total"] == 3.2 and ana["submission"]["lms_user_id"] == "4411"
    assert bo["late"]["percent"] == 0 and "no submission time" in capsys.readouterr().err
    grade._write(tmp_path / "out", {"students": students})
    row = next(csv.DictReader((tmp_path / "out" / "grades.csv").open()))
    assert (row["points"], row["score"], row["submitted_at"], row["days_late"], row["penalty_percent"]) == (
        "4", "4", "2026-10-04T10:00:00+00:00", "2", "20")
    (tmp_path / "bad.csv").write_text("student,lab,file\nana,01,x\n")
    with pytest.raises(ValueError, match="lacks the column.*submitted_at"):
        late.read_submissions(tmp_path / "bad.csv")


def _graded(folder, *students, release="r" * 64, part=None):
    """An output folder of labkit grade: grades.json with lab 01 for each student (two answers), and answers.csv."""
    data = {"release_sha256": release, "labkit_version": "0.test", "profile": "quick", "hidden_parts": [],
            "part": part, "graded_at": "2026-10-05T10:00:00+0000", "students": {}}
    answers = []
    for student, passed in students:
        entry = {"lab": "01", "passed": int(passed), "exercises": 1, "results": [
            {"student": student, "notebook": NB, "exercise": "backprop", "passed": passed, "message": "m", "points": 2}]}
        scores.answers_into(entry, [{"question": "01-a", "kind": "explain", "points": 2, "blank": False, "score": None},
                                    {"question": "01-b", "kind": "predict", "points": 1, "blank": True, "score": None}])
        scores.total(entry)
        data["students"][student] = {NB: entry}
        answers += [[student, NB, "01-a", "explain", 2, 0, "", "s", "because", ""],
                    [student, NB, "01-b", "predict", 1, 1, "0", "s", "", scores.BLANK_NOTE]]
    folder.mkdir(parents=True)
    (folder / "grades.json").write_text(json.dumps(data))
    with open(folder / "answers.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "notebook", "question", "kind", "points", "blank", "score", "answer_sha", "answer", "note"])
        w.writerows(answers)
    return folder


def test_rescore_totals_hand_scores_without_running_a_notebook_and_exports_wait_for_them(tmp_path, capsys):
    out = _graded(tmp_path / "grades", ("ana", True), ("bo", False))
    assert cli.main(["grade", "--rescore", str(out), "--export", "canvas"]) == 1  # nothing is scored yet
    err = capsys.readouterr().err
    assert "Canvas: NOT written: 2 written answer(s) are not scored yet" in err and f"ana, {NB}: 01-a" in err
    assert not (out / "canvas.csv").exists()
    rows = list(csv.reader((out / "answers.csv").open()))
    rows[1][6], rows[3][6] = "1.5", "7"  # ana's answer scored; bo's score is out of range
    rows[0].append("comment")
    rows[1].append("name the cache misses")
    with open(out / "answers.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    assert cli.main(["grade", "--rescore", str(out), "--export", "canvas", "--allow-unscored"]) == 0
    captured = capsys.readouterr()
    assert "bo / 01-a: score 7 is outside 0..2; left unscored" in captured.err and "no notebook was run" in captured.out
    ana = json.loads((out / "grades.json").read_text())["students"]["ana"][NB]
    assert (ana["answer_score"], ana["total"], ana["answers"][0]["comment"]) == (1.5, 3.5, "name the cache misses")
    assert ana["answers"][1]["score"] == 0 and ana["answers"][1]["note"] == scores.BLANK_NOTE
    assert [r[-1] for r in csv.reader((out / "canvas.csv").open())][1:] == ["5", "3.5", "0"]
    with pytest.raises(FileNotFoundError, match="no grades.json"):
        grade.rescore(tmp_path / "nowhere")


def test_rescore_counts_the_rubric_items_earned_with_their_comments(tmp_path, capsys):
    out = _graded(tmp_path / "grades", ("ana", True), ("bo", False))
    (tmp_path / "release").mkdir()
    (tmp_path / "release" / "rubrics.json").write_text(json.dumps({NB: {"01-a": {"points": 2, "items": [
        {"id": "a", "points": 1.5, "comment": "Misses named."}, {"id": "c", "points": 0.5, "comment": "Sizes too."}]}}}))
    data = json.loads((out / "grades.json").read_text())
    data["release"] = str(tmp_path / "release")  # the run's release folder, as grade records it
    (out / "grades.json").write_text(json.dumps(data))
    rows = list(csv.reader((out / "answers.csv").open()))
    rows[0] += ["items", "comment"]
    rows[1] += ["a,c", "Well put."]  # ana: both items
    rows[3] += ["b", ""]  # bo: an item the rubric lacks
    with open(out / "answers.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    grade.rescore(out)
    assert "bo / 01-a: rubric item b is not in the rubric (its items: a, c" in "".join(grade.rescore(out)[3])
    students = json.loads((out / "grades.json").read_text())["students"]
    ana, bo = students["ana"][NB], students["bo"][NB]
    assert (ana["answers"][0]["score"], ana["answers"][0]["items"]) == (2.0, "a,c")
    assert ana["answers"][0]["comment"] == "Misses named. Sizes too. Well put." and ana["total"] == 4.0
    assert bo["answers"][0]["score"] is None and bo["answers_unscored"] == 1
    rows[1][-2] = "a"  # the instructor takes item c back: the score follows
    with open(out / "answers.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    grade.rescore(out, release=tmp_path / "release")
    ana = json.loads((out / "grades.json").read_text())["students"]["ana"][NB]
    assert (ana["answers"][0]["score"], ana["answers"][0]["comment"], ana["total"]) == (1.5, "Misses named. Well put.", 3.5)


def test_merge_keeps_the_later_grade_of_a_regraded_student(tmp_path, capsys):
    first = _graded(tmp_path / "class", ("ana", True), ("bo", False))
    later = _graded(tmp_path / "later", ("bo", True))
    results, _, json_path = grade.merge([first, later], tmp_path / "all")
    merged = json.loads(json_path.read_text())["students"]
    assert [(r.student, r.passed) for r in results] == [("ana", True), ("bo", True)]
    assert merged["bo"][NB]["passed"] == 1 and "bo, 01_serial_backprop.ipynb: the later grade" in capsys.readouterr().err
    assert [r["student"] for r in csv.DictReader((tmp_path / "all" / "answers.csv").open())] == ["ana", "ana", "bo", "bo"]
    _graded(tmp_path / "p0", ("ana", True), part=[0, 2])
    _graded(tmp_path / "p1", ("ana", False), part=[1, 2])
    with pytest.raises(ValueError, match="ana was graded in two shares of one split"):
        grade.merge([tmp_path / "p0", tmp_path / "p1"], tmp_path / "bad")
    _graded(tmp_path / "other", ("bo", True), release="o" * 64)
    with pytest.raises(ValueError, match="differ in release_sha256"):
        grade.merge([first, tmp_path / "other"], tmp_path / "bad")


def test_each_file_is_the_lab_its_content_shows_and_a_lab_is_graded_once(tmp_path, capsys):
    assign.write_student_versions([LAB01, LAB07], tmp_path / "student", release_dir=tmp_path / "release")
    record, _ = grade.load_release(tmp_path / "release")
    subs = tmp_path / "subs"
    (subs / "bob").mkdir(parents=True)
    (subs / "bob" / "01_serial_backprop.ipynb").write_bytes((tmp_path / "student" / NB).read_bytes())
    (subs / "bob" / "Lab 1 - Bob (1).ipynb").write_bytes((tmp_path / "student" / NB).read_bytes())
    (subs / "bob" / "01_oops.ipynb").write_bytes((tmp_path / "student" / "07_ring_allreduce.ipynb").read_bytes())
    os.utime(subs / "bob" / "01_serial_backprop.ipynb", (1e9, 1e9))  # the older of bob's two lab 01 files
    handed = grade.place(grade.submissions(subs), record, set())
    assert [(h.student, h.path.name, h.name) for h in handed] == [
        ("bob", "Lab 1 - Bob (1).ipynb", NB), ("bob", "01_oops.ipynb", "07_ring_allreduce.ipynb")]
    assert "bob handed in 01_serial_backprop.ipynb twice" in capsys.readouterr().err
    only = grade.place(grade.submissions(subs), grade.only_labs(record, {"07"}), {"07"})
    assert [h.name for h in only] == ["07_ring_allreduce.ipynb"]
    with pytest.raises(ValueError, match="--lab 05: the release holds no such lab"):
        grade.only_labs(record, {"05"})
    with pytest.raises(ValueError, match="no lab number"):
        grade.grade(subs, tmp_path / "out", release=tmp_path / "release", labs=["x"])
    nb = nbformat.read(subs / "bob" / "01_oops.ipynb", as_version=4)
    assert grade.notebook_name(subs / "bob" / "01_oops.ipynb", None) == "07_ring_allreduce.ipynb" and nb.cells


def test_a_release_folder_left_in_the_working_directory_is_the_command_lines_default_only(tmp_path, monkeypatch):
    assign.write_student_versions([LAB01], tmp_path / "student", release_dir=tmp_path / "release")
    monkeypatch.chdir(tmp_path)
    assert grade.load_release(None) == (None, None)
    assert cli._release(None) == "release" and cli._release("elsewhere") == "elsewhere"
    monkeypatch.chdir(tmp_path / "student")
    assert cli._release(None) is None


# -- an open exercise's score: ranked in the class, never worth points --------------------------------------------------

LAB05 = "05_cuda_kernels.ipynb"


def _timed(student, us, passed=True, lower_is_better=True):
    """A grades.json row of Lab 05's open exercise: ``us`` µs (None: it scored nothing)."""
    perf = None if us is None else {"label": "modelled time on H100", "value": us, "unit": "µs",
                                    "lower_is_better": lower_is_better}
    return {"student": student, "notebook": LAB05, "exercise": "fast_matmul", "passed": passed,
            "message": "passed" if passed else "wrong", "points": 1, "performance": perf}


def _class_timed(**times):
    """grades.json's students of Lab 05: per student, (µs, passed) of the open exercise beside a plain one."""
    return {s: {LAB05: {"lab": "05", "results": [_timed(s, us, ok), {
        "student": s, "notebook": LAB05, "exercise": "naive_matmul", "passed": True, "message": "passed"}]}}
            for s, (us, ok) in times.items()}


def test_grades_csv_has_each_passing_scores_value_and_rank_with_ties_sharing_it_and_failures_blank(tmp_path):
    students = _class_timed(ana=(12.5, True), bo=(9.0, True), cy=(12.5, True), di=(3.0, False), ed=(20.0, True),
                            fay=(None, True))
    grade._write(tmp_path / "out", {"students": students})
    rows = list(csv.DictReader((tmp_path / "out" / "grades.csv").open()))
    assert list(rows[0])[-2:] == ["performance", "performance_rank"]
    got = {r["student"]: (r["performance"], r["performance_rank"]) for r in rows if r["exercise"] == "fast_matmul"}
    # bo is the fastest; ana and cy tie for 2nd, so ed is 4th; di's 3 µs failed and fay's check scored nothing
    assert got == {"bo": ("9", "1"), "ana": ("12.5", "2"), "cy": ("12.5", "2"), "ed": ("20", "4"), "di": ("", ""),
                   "fay": ("", "")}
    assert {(r["performance"], r["performance_rank"]) for r in rows if r["exercise"] == "naive_matmul"} == {("", "")}
    assert {r["student"]: r["score"] for r in rows if r["exercise"] == "fast_matmul"}["di"] == "0"  # no points for it


def test_a_leaderboard_ranks_the_passing_answers_best_first_either_way_round():
    faster = scores.leaderboards({"students": _class_timed(ana=(2.0, True), bo=(1.0, True), cy=(0.5, False))})
    board = faster[(LAB05, "fast_matmul")]
    assert (board.label, board.unit, board.lower_is_better) == ("modelled time on H100", "µs", True)
    assert board.places == [(1, 1.0, "bo"), (2, 2.0, "ana")] and board.rank_of("cy") is None
    higher = {s: {LAB05: {"results": [_timed(s, v, lower_is_better=False)]}} for s, v in [("ana", 2.0), ("bo", 3.0),
                                                                                          ("cy", 3.0), ("di", 1.0)]}
    assert scores.leaderboards({"students": higher})[(LAB05, "fast_matmul")].places == [
        (1, 3.0, "bo"), (1, 3.0, "cy"), (3, 2.0, "ana"), (4, 1.0, "di")]
    assert scores.leaderboards({"students": _class_timed(ana=(None, True), bo=(float("nan"), True))}) == {}


def test_merged_shares_of_a_class_are_ranked_together(tmp_path):
    for k, (student, us) in enumerate([("ana", 5.0), ("bo", 4.0)]):
        data = {"release_sha256": "r" * 64, "labkit_version": "0.test", "profile": "quick", "hidden_parts": [],
                "part": [k, 2], "students": _class_timed(**{student: (us, True)})}
        grade._write(tmp_path / f"p{k}", data)
    assert [r["performance_rank"] for r in csv.DictReader((tmp_path / "p0" / "grades.csv").open())][0] == "1"
    results, csv_path, _ = grade.merge([tmp_path / "p0", tmp_path / "p1"], tmp_path / "all")
    ranks = {r["student"]: r["performance_rank"] for r in csv.DictReader(csv_path.open()) if r["exercise"] == "fast_matmul"}
    assert ranks == {"ana": "2", "bo": "1"}
    assert {r.student: r.performance["value"] for r in results if r.performance} == {"ana": 5.0, "bo": 4.0}
