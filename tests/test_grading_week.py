"""A grading week of two labs in one set of folders, run with the documented commands (docs/instructors.md, "One
week, in order"): lab 01 assigned, graded and scored, then lab 07 into the same release and grades, then a student's
lab 07 handed in again, regraded apart and merged. At the end every grade, time and score of both labs is there.

Each lab is its instructor's notebook trimmed to one exercise and one question, graded without the sandbox: the
record keeping is under test here, not the isolation (tests/test_grading_attacks.py), so the week takes seconds.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from labkit import cli, runner

pytestmark = [pytest.mark.notebooks, pytest.mark.slow]

# per lab: its notebook, the instructor's cells kept (by id), the exercise's cell and the answer cell
LABS = {"01": ("01_serial_backprop.ipynb", ["c01", "c10b", "c10c", "c16", "c16a"], "c10b", "c16a"),
        "07": ("07_ring_allreduce.ipynb", ["c01", "x07i", "x07j", "q07d", "a07d"], "x07i", "a07d")}
NB01, NB07 = LABS["01"][0], LABS["07"][0]


def _instructor(folder: Path) -> None:
    """Each lab's instructor's notebook with only the cells kept, after an import cell of its own."""
    folder.mkdir()
    for name, keep, _, _ in LABS.values():
        nb = nbformat.read(runner.find_notebooks(only=name[:3])[0], as_version=4)
        nb.cells = [c for c in nb.cells if c.get("id") in keep]
        nb.cells.insert(1, new_code_cell("import numpy as np\nfrom labkit import check", id="imports"))
        nbformat.write(nb, folder / name)


def _hand_in(student: str, lab: str, right: bool, answer: str, when: str, subs: str = "submissions") -> None:
    """``student``'s lab as handed out, its exercise written (``right``) or left as it was, its question answered;
    and the time it came in, in submissions.csv as labkit collect writes it."""
    name, _, exercise, question = LABS[lab]
    nb = nbformat.read(Path("student") / name, as_version=4)
    cells = {c.id: c for c in nb.cells}
    if right:
        solved = {c.id: c for c in nbformat.read(Path("instructor") / name, as_version=4).cells}[exercise].source
        cells[exercise].source = "\n".join(line for line in solved.splitlines() if "SOLUTION" not in line)
    cells[question].source = answer
    (Path(subs) / student).mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, Path(subs) / student / name)
    listed = Path(subs) / "submissions.csv"
    with open(listed, "a", newline="") as f:
        w = csv.writer(f)
        if f.tell() == 0:
            w.writerow(["student", "lab", "file", "submitted_at", "lms", "lms_user_id", "lms_submission_id"])
        w.writerow([student, lab, f"{student}/{name}", when, "canvas", "", ""])


def _score(out: str, lab: str, given: dict[str, float]) -> None:
    """The instructor scores each student's answer to the lab's question in answers.csv, with a comment."""
    path = Path(out) / "answers.csv"
    rows = list(csv.DictReader(path.open()))
    for r in rows:
        if r["notebook"].startswith(lab) and r["student"] in given:
            r["score"], r["comment"] = f"{given[r['student']]:g}", f"scored {given[r['student']]:g}"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _facts(out: str, lab: str) -> dict:
    """Per (student, notebook) of ``lab`` in ``out``: its rows, its time handed in and the penalty, its seconds, its
    hand scores (grades.json's and answers.csv's) and its total."""
    data = json.loads((Path(out) / "grades.json").read_text())
    hand = {(r["student"], r["notebook"], r["question"]): (r["score"], r["comment"])
            for r in csv.DictReader((Path(out) / "answers.csv").open())}
    return {(s, nb): {"rows": [(r["exercise"], r["passed"], r["score"]) for r in e["results"]],
                      "submitted_at": e["submission"]["submitted_at"], "late": e["late"], "seconds": e["seconds"],
                      "answers": [(a["question"], a["score"], a.get("comment")) for a in e["answers"]],
                      "answers.csv": [hand[(s, nb, a["question"])] for a in e["answers"]], "total": e["total"]}
            for s, per in data["students"].items() for nb, e in per.items() if e["lab"] == lab}


def test_a_week_of_two_labs_in_one_set_of_folders_loses_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the documented commands, with their folders as written

    def labkit(*argv: str) -> None:
        assert cli.main(list(argv)) == 0, capsys.readouterr().err

    _instructor(tmp_path / "instructor")
    assign = ["assign", "--notebooks", "instructor", "--out", "student", "--release", "release", "--late", "10/5"]
    labkit(*assign, "--only", "01_", "--deadline", "01=2026-10-02T23:59:00+02:00")
    _hand_in("ana", "01", True, "Each sample pays the interpreter.", "2026-10-02T20:00:00+02:00")
    _hand_in("bo", "01", False, "Memory.", "2026-10-03T10:00:00+02:00")  # a day late
    labkit("grade", "submissions", "--release", "release", "--lab", "01", "--no-sandbox", "--out", "grades")
    _score("grades", "01", {"ana": 2, "bo": 0.5})
    labkit("grade", "--rescore", "grades")
    lab01 = _facts("grades", "01")
    assert lab01[("ana", NB01)]["rows"] == [("output_error", True, 1.0)] and lab01[("ana", NB01)]["total"] == 3.0
    assert lab01[("bo", NB01)]["late"]["days_late"] == 1 and lab01[("bo", NB01)]["total"] == 0.45

    shutil.copytree("grades", "grades01")  # lab 01's grades as they stood, kept apart too

    # the next lab, into the same release, handouts, submissions and grades
    labkit(*assign, "--only", "07_", "--deadline", "07=2026-10-09T23:59:00+02:00")
    _hand_in("ana", "07", True, "Small arrays: the ring pays 2(p-1) latencies.", "2026-10-09T12:00:00+02:00")
    _hand_in("bo", "07", False, "Small ones.", "2026-10-09T13:00:00+02:00")
    capsys.readouterr()
    labkit("grade", "submissions", "--release", "release", "--lab", "07", "--no-sandbox", "--out", "grades")
    said = capsys.readouterr()
    assert "none of the release's labs" not in said.err, "lab 01's notebooks are the release's, only not graded now"
    assert "ana  07_ring_allreduce.ipynb: 1/1 exercises passed, 1 of 1 points" in said.out, said.out
    assert _facts("grades", "01") == lab01
    _score("grades", "07", {"ana": 2, "bo": 1})
    labkit("grade", "--rescore", "grades")
    assert _facts("grades", "01") == lab01
    lab07 = _facts("grades", "07")
    assert lab07[("ana", NB07)]["rows"] == [("cable_seconds", True, 1.0)] and lab07[("bo", NB07)]["total"] == 1.0

    # bo hands lab 07 in again, the exercise written now and the answer as it was: regraded apart, then merged
    _hand_in("bo", "07", True, "Small ones.", "2026-10-10T09:00:00+02:00", subs="resubmissions")
    labkit("grade", "resubmissions", "--release", "release", "--lab", "07", "--no-sandbox", "--out", "regrades")
    labkit("grade", "--merge", "grades", "regrades", "--out", "final", "--feedback", "feedback")
    assert _facts("final", "01") == lab01
    final = _facts("final", "07")
    assert final[("ana", NB07)] == lab07[("ana", NB07)]
    bo = final[("bo", NB07)]
    assert bo["rows"] == [("cable_seconds", True, 1.0)] and bo["submitted_at"] == "2026-10-10T09:00:00+02:00"
    assert bo["answers"] == lab07[("bo", NB07)]["answers"] and bo["answers.csv"] == [("1", "scored 1")]
    assert (bo["late"]["days_late"], bo["total"]) == (1, 1.8)  # (1 + 1) points, 10 % off for the day
    for student in ("ana", "bo"):  # the runs each grade came from, and the pages that show them
        for name, function in ((NB01, "my_output_error"), (NB07, "my_cable_seconds")):
            assert (tmp_path / "final" / "executed" / student / name).is_file()
            assert function in (tmp_path / "feedback" / student / name.replace(".ipynb", ".html")).read_text()
    labs = [(r["student"], r["lab"], r["submitted_at"]) for r in csv.DictReader(open(tmp_path / "final" / "grades.csv"))]
    assert labs == [("ana", "01", "2026-10-02T20:00:00+02:00"), ("ana", "07", "2026-10-09T12:00:00+02:00"),
                    ("bo", "01", "2026-10-03T10:00:00+02:00"), ("bo", "07", "2026-10-10T09:00:00+02:00")]

    # lab 01 regraded after lab 07 joined the release: against, and merged with, its grades from before then
    _hand_in("ana", "01", True, "Each sample pays the interpreter.", "2026-10-02T21:00:00+02:00", subs="late01")
    labkit("grade", "late01", "--release", "release", "--lab", "01", "--no-sandbox", "--out", "regrade01",
           "--regrade", "grades01")
    labkit("grade", "--merge", "grades01", "regrade01", "--out", "final01")
    assert _facts("final01", "01")[("bo", NB01)] == lab01[("bo", NB01)]
    release = json.loads((tmp_path / "release" / "release.json").read_text())["notebooks"]
    assert {n: e["deadline"] for n, e in release.items()} == {NB01: "2026-10-02T23:59:00+02:00",
                                                              NB07: "2026-10-09T23:59:00+02:00"}
