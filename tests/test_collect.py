"""labkit collect: the bulk downloads of Canvas, Moodle and Gradescope, made as those systems make them, sorted into
one folder per student with each notebook's lab found by its content and the latest resubmission kept."""

import argparse
import csv
import json
import os
import re
import struct
import subprocess
import sys
import time
import zipfile
from datetime import datetime, timedelta, timezone

import nbformat
import pytest

from labkit import cli, labs
from labkit.grading import assign, collect, exports, late

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


def _options(command):
    """A labkit command's options, by their flag, as the command line has them."""
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {flag: a for a in sub.choices[command]._actions for flag in a.option_strings}


def test_each_lms_and_export_of_the_tables_is_a_choice_of_the_command_line():
    # an LMS is one entry of collect's table, an export one of exports': the command line offers exactly those
    assert collect.LMS == tuple(lms.name for lms in collect.LMSES) == ("canvas", "moodle", "gradescope")
    assert _options("collect")["--from"].choices == [*collect.LMS, "auto"]
    assert _options("grade")["--export"].choices == list(exports.EXPORTS) == list(exports.EXPORT_HELP)
    helped = " ".join(_options("collect")["--submitted-at"].help.split())
    assert all((lms.title in helped) != lms.times for lms in collect.LMSES)  # those whose download gives no times
    assert all(f"{name} ({what})" in _options("grade")["--export"].help for name, what in exports.EXPORT_HELP.items())
    # auto-detection asks the surest sign first: Gradescope's metadata file, then Moodle's folders, then Canvas's names
    canvas, moodle = "alvarezana_4411_90001_lab.ipynb", "Ana Alvarez_301_assignsubmission_file_/x_1_2_lab.ipynb"
    for names, lms in [([canvas], "canvas"), ([canvas, moodle], "moodle"),
                       ([moodle, "export/submission_metadata.yml"], "gradescope")]:
        assert collect.which_lms([collect.File(n, b"", datetime.now()) for n in names]) == lms
    with pytest.raises(ValueError) as none:
        collect.which_lms([collect.File("lab.ipynb", b"", datetime.now())])
    assert str(none.value) == ("could not tell which LMS made this download (no Canvas file names, no Moodle folders, "
                               "no Gradescope submission_metadata.yml): give --from canvas, moodle or gradescope")
    # the command line reads the tables for every labkit command: they must not load the grader (seconds) to be read
    loaded = subprocess.run([sys.executable, "-c", "import sys; from labkit import cli; cli.build_parser(); "
                             "print(sorted({'nbformat', 'labkit.check', 'labkit.grading.assign'} & set(sys.modules)))"],
                            capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


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


@pytest.fixture
def machine_zone(monkeypatch):
    """Set this process's TZ, as another machine's might be; restored after the test."""
    def set_zone(tz):
        monkeypatch.setenv("TZ", tz)
        time.tzset()
    yield set_zone
    monkeypatch.undo()
    time.tzset()


def _with_utc(name, when, data):
    """A zip entry as Info-ZIP writes it: its DOS time (no zone) and the extended timestamp field (UTC)."""
    info = zipfile.ZipInfo(name, date_time=when.astimezone().timetuple()[:6])
    info.extra = struct.pack("<HHBi", 0x5455, 5, 1, int(when.timestamp()))
    return info, data


def test_a_second_collect_adds_its_rows_and_says_what_it_replaced(tmp_path, release, capsys):
    week = _zip(tmp_path / "lab01.zip", [
        ("alvarezana_4411_90001_lab.ipynb", _student(LAB01), (2026, 10, 1, 20, 0, 0)),
        ("brownbo_4412_90002_lab.ipynb", _student(LAB01), (2026, 10, 2, 9, 0, 0))])
    out = tmp_path / "subs"
    collect.collect(week, release, out)
    before = _rows(out)
    collect.collect(_zip(tmp_path / "lab07.zip", [
        ("alvarezana_4411_90011_ring.ipynb", _student(LAB07), (2026, 10, 9, 20, 0, 0))]), release, out)
    rows = _rows(out)
    assert rows[:2] == before and [(r["student"], r["lab"]) for r in rows] == [
        ("alvarezana", "01"), ("brownbo", "01"), ("alvarezana", "07")]  # lab 01's times are still there
    # the lab 01 download again, ana's file handed in later: her row is replaced, and it is said
    again = _zip(tmp_path / "again.zip", [
        ("alvarezana_4411_90001_lab.ipynb", _student(LAB01, "later"), (2026, 10, 2, 23, 0, 0))])
    assert cli.main(["collect", str(again), "--release", str(release), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "replaced the row of alvarezana, lab 01, alvarezana_4411_90001_lab.ipynb (handed in 2026-10-01T20:00:00" in said
    assert [(r["student"], r["lab"]) for r in _rows(out)] == [("brownbo", "01"), ("alvarezana", "07"),
                                                              ("alvarezana", "01")]
    assert late.read_submissions(out / "submissions.csv")[("alvarezana", "01")]["submitted_at"].startswith("2026-10-02T23")
    # a resubmission under another file name replaces the notebook; both rows stay, the new one last, which grade reads
    third = collect.collect(_zip(tmp_path / "third.zip", [
        ("alvarezana_4411_90021_lab-1.ipynb", _student(LAB01, "last"), (2026, 10, 3, 8, 0, 0))]), release, out)
    assert third.replaced == ["alvarezana's lab 01: the notebook from alvarezana_4411_90001_lab.ipynb replaced by this "
                              "download's alvarezana_4411_90021_lab-1.ipynb; the earlier row stays in submissions.csv, "
                              "before the new one"]
    assert late.read_submissions(out / "submissions.csv")[("alvarezana", "01")]["lms_submission_id"] == "90021"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "submissions.csv").write_text("name,score\nana,3\n")
    with pytest.raises(ValueError, match="lacks the column.* of a submissions.csv .* move it away, or collect into"):
        collect.collect(week, release, tmp_path / "other")
    assert not (tmp_path / "other" / "alvarezana").exists()  # refused before writing anything


def test_zip_times_are_read_in_the_lms_zone_whatever_the_machines(tmp_path, release, machine_zone):
    download = _zip(tmp_path / "c.zip", [
        ("alvarezana_4411_90001_lab.ipynb", _student(LAB01), (2026, 10, 2, 20, 0, 0))])
    times, notes = {}, {}
    for tz in ("UTC0", "ICT-7"):  # UTC, then 7 hours east of it
        machine_zone(tz)
        named = collect.collect(download, release, tmp_path / tz / "named", lms_timezone="America/Chicago")
        assumed = collect.collect(download, release, tmp_path / tz / "assumed")
        times[tz] = (named.kept[0].submitted_at, assumed.kept[0].submitted_at)
        notes[tz] = (named.notes, assumed.notes)
    chicago = datetime(2026, 10, 3, 1, 0, tzinfo=timezone.utc)  # 20:00 CDT, UTC-5
    assert times["UTC0"][0] == times["ICT-7"][0] == chicago and notes["UTC0"][0] == notes["ICT-7"][0] == []
    assert times["UTC0"][1] - times["ICT-7"][1] == timedelta(hours=7)  # the shift the issue saw: hence the note
    assert "NOTE: the zip's times name no timezone: 1 submission time(s) were read in this machine's, ICT-7 (UTC+0700)" \
        in notes["ICT-7"][1][0] and "--lms-timezone America/Chicago (or +02:00)" in notes["ICT-7"][1][0]
    # a zip whose entries carry UTC (Info-ZIP's extended timestamp) needs no zone: the same instant anywhere
    with zipfile.ZipFile(tmp_path / "utc.zip", "w") as z:
        z.writestr(*_with_utc("alvarezana_4411_90001_lab.ipynb", chicago, _student(LAB01)))
    ntfs = zipfile.ZipInfo("brownbo_4412_90002_lab.ipynb", date_time=(1980, 1, 1, 0, 0, 0))  # Windows's: UTC ticks
    ticks = int((chicago.timestamp() + 11644473600) * 10**7)  # 100 ns since 1601
    ntfs.extra = struct.pack("<HHIHHQQQ", 0x000A, 32, 0, 1, 24, ticks, ticks, ticks)
    with zipfile.ZipFile(tmp_path / "utc.zip", "a") as z:
        z.writestr(ntfs, _student(LAB01))
    for tz in ("UTC0", "ICT-7"):
        machine_zone(tz)
        done = collect.collect(tmp_path / "utc.zip", release, tmp_path / tz / "utc")
        assert [s.submitted_at for s in done.kept] == [chicago, chicago] and done.notes == []
    assert collect.parse_zone("+02:00").utcoffset(None) == timedelta(hours=2)
    assert collect.parse_zone("UTC-0530").utcoffset(None) == -timedelta(hours=5, minutes=30)
    for wrong in ("Mars/Olympus", "+25:00"):
        with pytest.raises(ValueError, match=f"--lms-timezone '{re.escape(wrong)}' is no timezone: give the LMS's as"):
            collect.collect(download, release, tmp_path / "x", lms_timezone=wrong)


def _moodle_folder(root, students):
    """A Moodle download unpacked: a folder per student holding their notebook."""
    for k, name in enumerate(students):
        folder = root / f"{name}_{301 + k}_assignsubmission_file_"
        folder.mkdir(parents=True)
        (folder / "lab1.ipynb").write_bytes(_student(LAB01, name))
    return root


def test_a_copied_folders_times_are_warned_about_and_can_be_given(tmp_path, release):
    handed_in = datetime(2026, 10, 1, 12, 0, tzinfo=timezone.utc)
    students = ["Ana Alvarez", "Bo Brown", "Cy Chen", "Di Diaz"]
    kept = _moodle_folder(tmp_path / "kept", students)
    for k, path in enumerate(sorted(kept.rglob("*.ipynb"))):  # as unzipped: each the time it was handed in
        os.utime(path, ((handed_in + timedelta(hours=5 * k)).timestamp(),) * 2)
    assert collect.collect(kept, release, tmp_path / "a").notes == []
    copied = _moodle_folder(tmp_path / "copied", students)  # a plain cp -r: every file the time of the copy
    copy_time = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
    for k, path in enumerate(sorted(copied.rglob("*.ipynb"))):
        os.utime(path, ((copy_time + timedelta(seconds=k)).timestamp(),) * 2)
    warned = collect.collect(copied, release, tmp_path / "b")
    assert len(warned.notes) == 1 and warned.notes[0].startswith(
        "WARNING: the file times of all 4 students lie within 3 s of ")
    assert "cp -r without -p" in warned.notes[0] and "--submitted-at CSV of student,lab,submitted_at" in warned.notes[0]
    assert "WARNING: the file times of all 4 students" in collect.describe(warned, tmp_path / "b")
    # the way out: the times, by name or LMS id (Moodle's participant id), and one time for the rest
    (tmp_path / "times.csv").write_text("student,lab,submitted_at\nana_alvarez,01,2026-10-01T12:00:00+00:00\n"
                                        "302,,2026-10-03T09:00:00+00:00\n")
    given = collect.collect(copied, release, tmp_path / "c", submitted_at=str(tmp_path / "times.csv"))
    assert given.notes == [] and {s.student: s.submitted_at.isoformat() for s in given.kept if s.time_from == "given"} \
        == {"ana_alvarez": "2026-10-01T12:00:00+00:00", "bo_brown": "2026-10-03T09:00:00+00:00"}
    one = collect.collect(copied, release, tmp_path / "d", submitted_at="2026-10-02T23:00:00+02:00")
    assert {r["submitted_at"] for r in _rows(tmp_path / "d")} == {"2026-10-02T23:00:00+02:00"} and one.notes == []
    with pytest.raises(ValueError, match="--submitted-at: 'yesterday' is not an ISO 8601 time .*or the path of a CSV"):
        collect.collect(copied, release, tmp_path / "e", submitted_at="yesterday")


def test_canvas_late_mark_with_an_on_time_file_is_warned_and_its_given_time_taken(tmp_path, release):
    record = json.loads((release / "release.json").read_text())
    record["notebooks"]["01_serial_backprop.ipynb"]["deadline"] = "2026-10-02T23:59:00+02:00"
    (release / "release.json").write_text(json.dumps(record))
    download = _zip(tmp_path / "c.zip", [  # Canvas says Bo was late; the zip's clock says on time
        ("alvarezana_4411_90001_lab.ipynb", _student(LAB01), (2026, 10, 2, 20, 0, 0)),
        ("brownbo_LATE_4412_90002_lab.ipynb", _student(LAB01), (2026, 10, 2, 21, 0, 0))])
    warned = collect.collect(download, release, tmp_path / "a", lms_timezone="+02:00")
    assert warned.notes == [
        "WARNING: Canvas marks brownbo's lab 01 late (_LATE_ in brownbo_LATE_4412_90002_lab.ipynb), but its file's time, "
        "2026-10-02T21:00:00+02:00, is before the deadline 2026-10-02T23:59:00+02:00: it would be graded on time. Give "
        "the time Canvas shows for it (SpeedGrader, or the submissions API's submitted_at): --submitted-at CSV of "
        "student,lab,submitted_at"]
    (tmp_path / "canvas.csv").write_text("student,lab,submitted_at\n4412,01,2026-10-03T10:15:00+02:00\n")
    given = collect.collect(download, release, tmp_path / "b", lms_timezone="+02:00",
                            submitted_at=tmp_path / "canvas.csv")
    bo = late.read_submissions(tmp_path / "b" / "submissions.csv")[("brownbo", "01")]
    assert given.notes == [] and bo["submitted_at"] == "2026-10-03T10:15:00+02:00"
    deadline = late.parse_time(record["notebooks"]["01_serial_backprop.ipynb"]["deadline"], "deadline")
    assert late.penalty(late.parse_time(bo["submitted_at"], "bo"), deadline, {"percent_per_day": 10})["days_late"] == 1
