"""labkit collect: the bulk downloads of Canvas, Moodle and Gradescope, made as those systems make them, sorted into
one folder per student with each notebook's lab found by its content and the latest resubmission kept."""

import csv
import json
import zipfile
from datetime import datetime

import nbformat
import pytest

from labkit import cli, labs
from labkit.grading import assign, collect

LAB01 = labs.NOTEBOOKS / "01_serial_backprop.ipynb"
LAB07 = labs.NOTEBOOKS / "07_ring_allreduce.ipynb"


def _student(path, note=""):
    """A lab as a student hands it in: the handed-out version, with a mark to tell copies apart."""
    nb, _ = assign.handed_out(path)
    nb.cells[0].source += note
    return nbformat.writes(nb).encode()


def _zip(path, entries):
    """A zip whose entries carry the times given ((name, bytes, (y, m, d, H, M, S)) each), as an LMS writes them."""
    with zipfile.ZipFile(path, "w") as z:
        for name, data, when in entries:
            z.writestr(zipfile.ZipInfo(name, date_time=when), data)
    return path


@pytest.fixture
def release(tmp_path):
    assign.write_student_versions([LAB01, LAB07], tmp_path / "student", release_dir=tmp_path / "release")
    return tmp_path / "release"


def _rows(folder):
    return list(csv.DictReader((folder / "submissions.csv").open()))


def test_a_canvas_download_is_sorted_by_lab_found_in_each_notebook(tmp_path, release):
    # Canvas names each file <name>[_LATE]_<user id>_<submission id>_<file>; a file handed in again gets -1
    download = _zip(tmp_path / "submissions.zip", [
        ("alvarezana_4411_90001_01_serial_backprop.ipynb", _student(LAB01, "first"), (2026, 10, 1, 20, 0, 0)),
        ("alvarezana_4411_90001_01_serial_backprop-1.ipynb", _student(LAB01, "second"), (2026, 10, 1, 22, 0, 0)),
        ("brownbo_LATE_4412_90002_Lab 1 - Bob (1).ipynb", _student(LAB01, "bob"), (2026, 10, 3, 9, 30, 0)),
        ("brownbo_4412_90003_ring.ipynb", _student(LAB07, "bob's ring"), (2026, 10, 2, 9, 0, 0)),
        ("chency_4413_90004_notes.pdf", b"%PDF-1.4", (2026, 10, 1, 8, 0, 0)),
    ])
    result = collect.collect(download, release, tmp_path / "subs")
    assert result.unplaced == [] and [p for p, _ in result.aside] == [
        "chency_4413_90004_notes.pdf", "alvarezana_4411_90001_01_serial_backprop.ipynb"]
    rows = _rows(tmp_path / "subs")
    assert list(rows[0]) == ["student", "lab", "file", "submitted_at", "lms", "lms_user_id", "lms_submission_id"]
    assert [(r["student"], r["lab"], r["file"], r["lms"], r["lms_user_id"], r["lms_submission_id"]) for r in rows] == [
        ("alvarezana", "01", "alvarezana_4411_90001_01_serial_backprop-1.ipynb", "canvas", "4411", "90001"),
        ("brownbo", "01", "brownbo_LATE_4412_90002_Lab 1 - Bob (1).ipynb", "canvas", "4412", "90002"),
        ("brownbo", "07", "brownbo_4412_90003_ring.ipynb", "canvas", "4412", "90003")]
    assert datetime.fromisoformat(rows[0]["submitted_at"]) == datetime(2026, 10, 1, 22, 0, 0).astimezone()
    assert datetime.fromisoformat(rows[0]["submitted_at"]).tzinfo is not None
    kept = nbformat.read(tmp_path / "subs" / "alvarezana" / "01_serial_backprop.ipynb", as_version=4)
    assert kept.cells[0].source.endswith("second")  # the resubmission, not the first file
    assert sorted(p.name for p in (tmp_path / "subs" / "brownbo").iterdir()) == [
        "01_serial_backprop.ipynb", "07_ring_allreduce.ipynb"]  # the renamed file is lab 01 by its content


def test_a_moodle_download_in_folders_and_a_gradescope_export(tmp_path, release):
    download = _zip(tmp_path / "moodle.zip", [
        ("Ana Alvarez_301_assignsubmission_file_/lab1.ipynb", _student(LAB01), (2026, 10, 1, 21, 0, 0)),
        ("Bo Brown_302_assignsubmission_file_/Untitled.ipynb", _student(LAB07), (2026, 10, 2, 21, 0, 0)),
        ("Bo Brown_302_assignsubmission_onlinetext_/onlinetext.html", b"<p>see my notebook</p>", (2026, 10, 2, 21, 0, 0)),
    ])
    result = collect.collect(download, release, tmp_path / "m")
    assert [(r["student"], r["lab"], r["lms"], r["lms_user_id"]) for r in _rows(tmp_path / "m")] == [
        ("ana_alvarez", "01", "moodle", "301"), ("bo_brown", "07", "moodle", "302")]
    assert (tmp_path / "m" / "bo_brown" / "07_ring_allreduce.ipynb").is_file() and not result.unplaced
    # Gradescope: a folder per submission, and the metadata Gradescope writes beside them (times in it)
    gs = tmp_path / "assignment_777_export"
    (gs / "submission_5001").mkdir(parents=True)
    (gs / "submission_5002").mkdir()
    (gs / "submission_5001" / "lab.ipynb").write_bytes(_student(LAB01))
    (gs / "submission_5002" / "mine.ipynb").write_bytes(_student(LAB01, "pair"))
    (gs / "submission_metadata.yml").write_text(
        "submission_5001:\n  :submitters:\n  - :name: Ana Alvarez\n    :sid: '1001'\n    :email: ana@example.edu\n"
        "  :created_at: 2026-10-03 01:12:44.123456000 +02:00\n  :score: \n  :history: []\n"
        "submission_5002:\n  :submitters:\n  - :name: Bo Brown\n    :sid: '1002'\n    :email: bo@example.edu\n"
        "  - :name: Cy Chen\n    :sid: ''\n    :email: cy@example.edu\n"
        "  :created_at: 2026-10-01 23:59:59.000000000 -07:00\n  :score: \n  :history: []\n")
    collect.collect(gs, release, tmp_path / "g", lms="auto")
    rows = _rows(tmp_path / "g")
    assert [(r["student"], r["lab"], r["submitted_at"], r["lms_user_id"], r["lms_submission_id"]) for r in rows] == [
        ("1001", "01", "2026-10-03T01:12:44+02:00", "1001", "5001"),
        ("1002", "01", "2026-10-01T23:59:59-07:00", "1002", "5002"),
        ("cy", "01", "2026-10-01T23:59:59-07:00", "cy@example.edu", "5002")]  # a group's work goes to each member


def test_what_cannot_be_placed_is_listed_and_collect_fails(tmp_path, release, capsys):
    empty = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("my notes")])
    download = _zip(tmp_path / "c.zip", [
        ("alvarezana_4411_90001_lab.ipynb", _student(LAB01), (2026, 10, 1, 20, 0, 0)),
        ("brownbo_4412_90002_scratch.ipynb", nbformat.writes(empty).encode(), (2026, 10, 1, 20, 0, 0)),
        ("chency_4413_90003_lab.ipynb", b"", (2026, 10, 1, 20, 0, 0)),
        ("readme.txt", b"hello", (2026, 10, 1, 20, 0, 0)),
    ])
    code = cli.main(["collect", str(download), "--release", str(release), "--out", str(tmp_path / "s")])
    out = capsys.readouterr().out
    assert code == 1 and "collected 1 notebook(s) of 1 student(s)" in out and "NOT placed, 3 file(s)" in out
    assert "brownbo_4412_90002_scratch.ipynb: brownbo: no check or answer cell of any lab in it" in out
    assert "chency_4413_90003_lab.ipynb: chency: not a notebook that can be read" in out
    assert "readme.txt: not named as Canvas names a submission" in out
    only07 = collect.collect(download, release, tmp_path / "t", labs={"07"})
    assert only07.kept == [] and ("alvarezana_4411_90001_lab.ipynb", "lab 01, not one collected (--lab)") in only07.aside
    with pytest.raises(ValueError, match="could not tell which LMS"):
        collect.collect(_zip(tmp_path / "x.zip", [("lab.ipynb", _student(LAB01), (2026, 1, 1, 0, 0, 0))]), release,
                        tmp_path / "u")
    with pytest.raises(FileNotFoundError, match="no download at"):
        collect.collect(tmp_path / "missing.zip", release, tmp_path / "v")


@pytest.mark.sandbox
@pytest.mark.notebooks
def test_a_canvas_download_collected_graded_for_one_lab_late_work_and_imported(tmp_path, release, capsys):
    """The instructor's week on lab 01: collect Canvas's zip, grade lab 01 only with the deadline, score the answers,
    export into the gradebook's assignment."""
    record = json.loads((release / "release.json").read_text())
    deadline = datetime(2026, 10, 2, 23, 59).astimezone()
    record["notebooks"]["01_serial_backprop.ipynb"]["deadline"] = deadline.isoformat()
    (release / "release.json").write_text(json.dumps(record))
    solved = LAB01.read_bytes()  # the instructor's notebook: every exercise right, every answer written
    download = _zip(tmp_path / "submissions.zip", [
        ("alvarezana_4411_90001_01_serial_backprop.ipynb", solved, (2026, 10, 1, 12, 0, 0)),
        ("brownbo_LATE_4412_90002_Lab 1 - Bob (1).ipynb", solved, (2026, 10, 4, 11, 59, 0))])  # 1.5 days late
    assert cli.main(["collect", str(download), "--release", str(release), "--out", str(tmp_path / "subs")]) == 0
    (tmp_path / "gradebook.csv").write_text(
        "Student,ID,SIS User ID,SIS Login ID,Section,Lab 01: Serial backprop (5551),Lab 07: Ring allreduce (5557)\n"
        "    Points Possible,,,,,10.00,10.00\n"
        '"Alvarez, Ana",4411,S1,ana,A,,\n"Brown, Bo",4412,S2,bo,A,,\n', encoding="utf-8")
    grade = ["grade", str(tmp_path / "subs"), "--release", str(release), "--lab", "01", "--out", str(tmp_path / "out"),
             "--export", "canvas", "--canvas-gradebook", str(tmp_path / "gradebook.csv")]
    assert cli.main(grade) == 1  # graded, but the written answers are not scored: no canvas.csv yet
    assert "written answer(s) are not scored yet" in capsys.readouterr().err
    data = json.loads((tmp_path / "out" / "grades.json").read_text())
    assert {s: list(per) for s, per in data["students"].items()} == {
        "alvarezana": ["01_serial_backprop.ipynb"], "brownbo": ["01_serial_backprop.ipynb"]}
    bo = data["students"]["brownbo"]["01_serial_backprop.ipynb"]
    assert bo["passed"] == 4 and bo["late"]["days_late"] == 2 and bo["late"]["percent"] == 20.0
    rows = list(csv.DictReader((tmp_path / "out" / "answers.csv").open()))
    with open(tmp_path / "out" / "answers.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows({**r, "score": r["points"]} for r in rows)  # full marks for every answer
    assert cli.main(["grade", "--rescore", str(tmp_path / "out"), "--export", "canvas", "--canvas-gradebook",
                     str(tmp_path / "gradebook.csv")]) == 0
    canvas = list(csv.reader((tmp_path / "out" / "canvas.csv").open()))
    assert canvas[0][5:] == ["Lab 01: Serial backprop (5551)"]  # lab 01 only, into its assignment by id
    assert [r[5] for r in canvas[2:]] == ["10", "8"]  # 4 exercises + 6 answer points; bo's 2 days late cost 20 %
