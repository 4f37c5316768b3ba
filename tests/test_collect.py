"""labkit collect: the bulk downloads of Canvas, Moodle and Gradescope, made as those systems make them, sorted into
one folder per student with each notebook's lab found by its content and the latest resubmission kept."""

import csv
import zipfile
from datetime import datetime

import nbformat
import pytest

from labkit import cli, report
from labkit.grading import assign, collect

LAB01 = report.NOTEBOOKS / "01_serial_backprop.ipynb"
LAB07 = report.NOTEBOOKS / "07_ring_allreduce.ipynb"


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
