"""What a grading run hands on: grades in the shapes gradebooks take, and what changed since an earlier run.

    labkit grade submissions/ --out grades/ --export gradescope --export canvas --regrade grades-before/

* **Gradescope** (:func:`gradescope`): ``results.json`` in the format of Gradescope's autograder specification
  (https://gradescope-autograders.readthedocs.io/en/latest/specs/), one per student under ``gradescope/``, and at
  the top of the output folder too when the run graded one student. So an autograder image's ``run_autograder`` can
  call ``labkit grade /autograder/submission --out /autograder/results --export gradescope``. Each exercise is a
  test of one point whose output is the check's message; the questions' written answers are left to Gradescope's
  own manual grading.
* **Canvas** (:func:`canvas`): ``canvas.csv`` for the gradebook's CSV import: the columns Student, ID, SIS User ID,
  SIS Login ID and Section that identify a student, a Points Possible row, and one column per lab holding the
  exercises passed (a point each) plus the answer points scored so far in answers.csv. Canvas finds a student by
  those identifiers, which labkit does not know: ``roster`` (a gradebook exported from Canvas) supplies them.
* **Regrades** (:func:`changes`): ``changes.csv``, one row per exercise whose verdict differs from an earlier run's
  grades.json: who, which notebook and exercise, before, after, and why (the new message).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

EXPORTS = ("gradescope", "canvas")
CANVAS_CSV, CHANGES_CSV, GRADESCOPE_DIR = "canvas.csv", "changes.csv", "gradescope"
# the columns by which Canvas's gradebook import finds a student, as its own gradebook export writes them
CANVAS_IDENTITY = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
# the fields Gradescope's specification documents, at the top of results.json and in each test
GRADESCOPE_FIELDS = {"score", "execution_time", "output", "output_format", "visibility", "stdout_visibility",
                     "extra_data", "tests", "leaderboard"}
GRADESCOPE_TEST_FIELDS = {"score", "max_score", "status", "name", "name_format", "number", "output", "output_format",
                          "tags", "visibility", "extra_data"}


def load(grades: Path | str) -> dict:
    """A grades.json written by ``labkit grade`` (the file or its folder), with a clear error for anything else."""
    path = Path(grades)
    path = path / "grades.json" if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(f"no grades.json at {path}: give the --out folder of an earlier labkit grade run")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        data["students"].items()
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path} is not a grades.json written by labkit grade ({e})") from None
    return data


def lab_name(notebook: str) -> str:
    """'05_cuda_kernels.ipynb' -> 'Lab 05 cuda kernels': a gradebook column a person can read."""
    stem = notebook.removesuffix(".ipynb")
    number, _, rest = stem.partition("_")
    return f"Lab {number} {rest.replace('_', ' ')}".strip() if number.isdigit() else stem.replace("_", " ")


def gradescope(data: dict, out: Path | str, hidden: set[str] | None = None) -> list[Path]:
    """Write Gradescope's results.json for every student of ``data`` (a grades.json) into ``out``/gradescope/, and
    into ``out`` itself when there is one student. A ``hidden`` exercise's test is shown only once the grades are
    published, and says no more than whether it passed. Returns the files written."""
    out = Path(out)
    written = []
    students = data["students"]
    for student, notebooks in sorted(students.items()):
        result = gradescope_result(notebooks, data, hidden or set())
        path = out / GRADESCOPE_DIR / f"{_safe(student)}.json"
        _write_json(path, result)
        written.append(path)
        if len(students) == 1:
            _write_json(out / "results.json", result)
            written.append(out / "results.json")
    return written


def gradescope_result(notebooks: dict, data: dict, hidden: set[str] = frozenset()) -> dict:
    """One student's results.json: a one-point test per exercise, in the order of the notebooks and their cells."""
    from .notebook import is_secret, shown_name

    tests, seconds, unscored = [], 0.0, 0
    for name, entry in sorted(notebooks.items()):
        seconds += float(entry.get("seconds") or 0)
        lab = lab_name(name)
        for k, r in enumerate(entry.get("results", []), 1):
            secret = is_secret(r["exercise"], hidden)
            output = r["message"] or ("passed" if r["passed"] else "failed")
            tests.append({"name": f"{lab}: {shown_name(r['exercise'])}", "number": f"{name[:2]}.{k}",
                          "score": 1.0 if r["passed"] else 0.0, "max_score": 1.0,
                          "status": "passed" if r["passed"] else "failed",
                          "output": ("passed" if r["passed"] else "a hidden check failed") if secret else output,
                          "visibility": "after_published" if secret else "visible", "tags": [name]})
        unscored += len(entry.get("answers", []))
    lines = [f"labkit {data.get('labkit_version', '')}, profile {data.get('profile', 'quick')}, "
             f"{data.get('timeout_s', '?')} s per cell" + ("" if data.get("isolated") else ", not isolated")]
    if unscored:
        lines.append(f"{unscored} written answer(s) to the labs' questions are graded by hand, not here.")
    return {"score": sum(t["score"] for t in tests), "execution_time": round(seconds),
            "output": "\n".join(lines), "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}


def read_roster(path: Path | str) -> list[dict]:
    """The students of a gradebook exported from Canvas (CSV): rows with its identity columns. A second row whose
    Student is 'Points Possible' (as Canvas writes it) is skipped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no roster at {path}: export the gradebook from Canvas (Grades > Export) and give "
                                "that CSV")
    with open(path, newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    if not rows or not {"Student", "SIS Login ID"} <= set(rows[0]):
        raise ValueError(f"{path} is not a Canvas gradebook export: it needs the columns Student and SIS Login ID "
                         "(and ID, SIS User ID, Section)")
    return [r for r in rows if r.get("Student", "").strip().lower() != "points possible"
            and "student, test" not in r.get("Student", "").lower()]


def canvas(data: dict, out: Path | str, roster: Path | str | None = None) -> tuple[Path, list[str]]:
    """Write ``out``/canvas.csv; return its path and the students it could not place (not in the roster), who are
    left out of it. Without a roster a student's folder name goes in Student and SIS Login ID."""
    notebooks = sorted({nb for per in data["students"].values() for nb in per})
    possible = {nb: _points_possible(data, nb) for nb in notebooks}
    people = read_roster(roster) if roster else None
    rows, unplaced = [], []
    for student, per in sorted(data["students"].items()):
        who = _find(people, student) if people is not None else {"Student": student, "SIS Login ID": student}
        if who is None:
            unplaced.append(student)
            continue
        row = {k: who.get(k, "") for k in CANVAS_IDENTITY}
        for nb in notebooks:
            entry = per.get(nb)
            row[lab_name(nb)] = _fmt(_points(entry)) if entry is not None else ""
        rows.append(row)
    path = Path(out) / CANVAS_CSV
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=[*CANVAS_IDENTITY, *(lab_name(nb) for nb in notebooks)])
        w.writeheader()
        w.writerow({"Student": "Points Possible", **{lab_name(nb): _fmt(possible[nb]) for nb in notebooks}})
        w.writerows(rows)
    return path, unplaced


def _points(entry: dict) -> float:
    return float(entry.get("passed", 0)) + float(entry.get("answer_score") or 0)


def _points_possible(data: dict, notebook: str) -> float:
    """The most points any student could get on a notebook: its exercises and its questions' points."""
    best = 0.0
    for per in data["students"].values():
        if notebook in per:
            e = per[notebook]
            best = max(best, float(e.get("exercises", 0)) + float(e.get("answer_points") or 0))
    return best


def _find(people: list[dict], student: str) -> dict | None:
    """The roster row of a labkit student (a folder name): by SIS Login ID, SIS User ID, ID, then the name."""
    key = student.strip().lower()
    for column in ("SIS Login ID", "SIS User ID", "ID", "Student"):
        hits = [p for p in people if str(p.get(column, "")).strip().lower() == key]
        if len(hits) == 1:
            return hits[0]
    return None


def changes(before: dict, after: dict, allow_other_release: bool = False) -> list[dict]:
    """Every exercise whose verdict differs between two grades.json, and those graded in only one of them.

    Refuses two runs of different releases (their exercises are not the same) unless ``allow_other_release``."""
    a, b = before.get("release_sha256"), after.get("release_sha256")
    if a != b and not allow_other_release:
        raise ValueError(f"the earlier grades come from another release (release.json sha256 {str(a)[:12]}..., now "
                         f"{str(b)[:12]}...): their exercises may differ. Regrade against grades of the same release, "
                         "or pass --regrade-other-release to compare anyway")
    old, new = _verdicts(before), _verdicts(after)
    rows = []
    for key in sorted(old.keys() | new.keys()):
        was, now = old.get(key), new.get(key)
        if was is not None and now is not None and was[0] == now[0]:
            continue
        rows.append({"student": key[0], "notebook": key[1], "exercise": key[2],
                     "before": _word(was), "after": _word(now),
                     "why": now[1] if now is not None else "not graded in this run"})
    return rows


def write_changes(rows: list[dict], out: Path | str) -> Path:
    path = Path(out) / CHANGES_CSV
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=["student", "notebook", "exercise", "before", "after", "why"])
        w.writeheader()
        w.writerows(rows)
    return path


def describe_changes(rows: list[dict]) -> str:
    if not rows:
        return "regrade: no verdict changed"
    ups = sum(r["before"] != "passed" and r["after"] == "passed" for r in rows)
    downs = sum(r["before"] == "passed" and r["after"] != "passed" for r in rows)
    students = len({r["student"] for r in rows})
    return (f"regrade: {len(rows)} verdict(s) changed for {students} student(s): {ups} now pass, {downs} no longer "
            "pass" + "".join(f"\n  {r['student']} {r['notebook']} {r['exercise']}: {r['before']} -> {r['after']}"
                             for r in rows[:20]) + ("\n  ..." if len(rows) > 20 else ""))


def _verdicts(data: dict) -> dict[tuple[str, str, str], tuple[bool, str]]:
    return {(student, nb, r["exercise"]): (bool(r["passed"]), r.get("message", ""))
            for student, per in data["students"].items() for nb, entry in per.items()
            for r in entry.get("results", [])}


def _word(verdict: tuple[bool, str] | None) -> str:
    return "not graded" if verdict is None else ("passed" if verdict[0] else "failed")


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.@" else "_" for c in name) or "_"


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".part")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
