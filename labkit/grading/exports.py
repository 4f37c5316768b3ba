"""What a grading run hands on: grades in the shapes gradebooks take, and what changed since an earlier run.

    labkit grade submissions/ --out grades/ --export gradescope --export canvas --regrade grades-before/

* **Gradescope** (:func:`gradescope`): ``results.json`` in the format of Gradescope's autograder specification
  (https://gradescope-autograders.readthedocs.io/en/latest/specs/), one per student under ``gradescope/``, and at
  the top of the output folder too when the run graded one student. So an autograder image's ``run_autograder`` can
  call ``labkit grade /autograder/submission --out /autograder/results --export gradescope``. Each exercise is a
  test worth its points, whose output is the check's message; a late penalty comes off each test's score; the questions'
  written answers are left to Gradescope's own manual grading.
* **Canvas** (:func:`canvas`): ``canvas.csv`` for the gradebook's CSV import, made from the gradebook the instructor
  exported from Canvas (:func:`read_gradebook`): its identity columns, its Points Possible row, and each lab's
  total (exercises, scored answers, late penalty) in the column ``Title (id)`` of the lab's assignment there
  (:func:`canvas_columns`), each student found by ID, SIS User ID or login. A student it lacks fails the export. A
  student of the gradebook with no submission of a lab is given 0 with ``zero_missing``; else their cell is left
  blank (Canvas keeps what it has) and they are named, "no submission", in the export's notes.
* **Regrades** (:func:`changes`): ``changes.csv``, one row per exercise whose verdict differs from an earlier run's
  grades.json: who, which notebook and exercise, before, after, and why (the new message).
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

# the grader's modules (nbformat, the exercises: seconds to load) are imported where used: the command line reads
# EXPORT_HELP to build its options, for every labkit command

# each export --export may name, and what it writes, as its help says it
EXPORT_HELP = {"gradescope": "results.json per student", "canvas": "canvas.csv for the gradebook import"}
EXPORTS = tuple(EXPORT_HELP)
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
    """One student's results.json: a test per exercise worth its points, in the order of the notebooks and their
    cells; a late penalty is taken off each test's score (so that they add up to the score) and said in the output."""
    from .notebook import is_secret, shown_name
    from .scores import scored

    tests, seconds, unscored, lines = [], 0.0, 0, []
    for name, entry in sorted(notebooks.items()):
        seconds += float(entry.get("seconds") or 0)
        lab = lab_name(name)
        percent = float((entry.get("late") or {}).get("percent", 0))
        for k, r in enumerate(entry.get("results", []), 1):
            secret = is_secret(r["exercise"], hidden)
            points = float(r.get("points", 1))
            output = r["message"] or ("passed" if r["passed"] else "failed")
            if percent and r["passed"]:
                output += f"\n{_fmt(points)} point(s), less {percent:g} % for late work"
            # Gradescope shows each test's score: a late penalty comes off each, so that they add up to the score
            tests.append({"name": f"{lab}: {shown_name(r['exercise'])}", "number": f"{name[:2]}.{k}",
                          "score": round(scored(r) * (1 - percent / 100), 4), "max_score": points,
                          "status": "passed" if r["passed"] else "failed",
                          "output": ("passed" if r["passed"] else "a hidden check failed") if secret else output,
                          "visibility": "after_published" if secret else "visible", "tags": [name]})
        if percent:
            lines.append(f"{lab}: {entry['late'].get('note', '')} (deadline {entry['late'].get('deadline')})")
        unscored += len(entry.get("answers", []))
    lines.insert(0, f"labkit {data.get('labkit_version', '')}, profile {data.get('profile', 'quick')}, "
                    f"{data.get('timeout_s', '?')} s per cell, " + isolation(data))
    if unscored:
        lines.append(f"{unscored} written answer(s) to the labs' questions are graded by hand, not here.")
    result = {"score": round(sum(t["score"] for t in tests), 4), "execution_time": round(seconds),
              "output": "\n".join(lines), "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}
    board = _leaderboard(notebooks, hidden)
    return {**result, "leaderboard": board} if board else result


def _leaderboard(notebooks: dict, hidden: set[str]) -> list[dict]:
    """Gradescope's leaderboard entries of one student: each passed open exercise's score (a hidden one's never), with
    the order that ranks it ("asc": lower is better)."""
    from .notebook import is_secret, shown_name
    from .scores import performance

    board = []
    for name, entry in sorted(notebooks.items()):
        for r in entry.get("results", []):
            perf = performance(r)
            if perf is not None and not is_secret(r["exercise"], hidden):
                board.append({"name": f"{lab_name(name)}: {shown_name(r['exercise'])} ({perf.get('unit', '')})",
                              "value": float(perf["value"]), "order": "asc" if perf.get("lower_is_better", True)
                              else "desc"})
    return board


def isolation(data: dict) -> str:
    """How a run's notebooks were isolated, in words, from its grades.json."""
    how = data.get("isolation") or ("bubblewrap" if data.get("isolated") else "none")
    if how == "none" or not data.get("isolated"):
        return "NOT isolated: graded with --no-sandbox"
    return "isolated by " + " and ".join({"bubblewrap": "bubblewrap", "user": "an unprivileged user of its own"}.get(k, k)
                                          for k in how.split("+"))


# the columns of a Canvas gradebook export that say who a student is (those it has, in its order)
CANVAS_PEOPLE = ("Student", "ID", "SIS User ID", "SIS Login ID", "Integration ID", "Root Account", "Section")
_ASSIGNMENT = re.compile(r"^(.*\S)\s*\((\d+)\)$")
_LAB_IN_TITLE = re.compile(r"\blab\s*#?\s*0*(\d{1,2})\b", re.I)


@dataclass
class Gradebook:
    """A gradebook exported from Canvas: its columns, its Points Possible row and its students."""
    path: Path
    columns: list[str]
    possible: dict[str, str]
    people: list[dict]

    def assignments(self) -> dict[str, str]:
        """Each assignment column's Canvas id: {"Lab 01: Serial backprop (5551)": "5551"}."""
        return {c: m.group(2) for c in self.columns if c not in CANVAS_PEOPLE and (m := _ASSIGNMENT.match(c))}


def read_gradebook(path: Path | str) -> Gradebook:
    """The gradebook CSV Canvas exports (Grades > Export): its header, the rows Canvas puts before the students (Points
    Possible, and Manual Posting in newer exports) and the students; the test student is left out."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no gradebook at {path}: export it from Canvas (Grades > Export > CSV) and give that "
                                "file")
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        columns, rows = list(reader.fieldnames or []), list(reader)
    if not {"Student", "ID"} <= set(columns) or not {"SIS User ID", "SIS Login ID"} & set(columns):
        raise ValueError(f"{path} is not a Canvas gradebook export: it needs the columns Student, ID, SIS User ID and "
                         "SIS Login ID (as Grades > Export writes them)")
    possible = next((r for r in rows if r.get("Student", "").strip().lower() == "points possible"), {})
    people = [r for r in rows if r.get("ID", "").strip() and r.get("Student", "").strip().lower() != "points possible"
              and "student, test" not in r.get("Student", "").lower()]
    return Gradebook(path, columns, possible, people)


def canvas_columns(book: Gradebook, labs: list[str], given: dict[str, str] | None = None) -> dict[str, str]:
    """For each lab ("01"), the gradebook's assignment column: the one ``given`` names by its Canvas id, else the one
    whose title holds the lab's number ("Lab 01: ...", "Lab 1 ..."). A lab with none or several is refused, naming
    them and how to choose."""
    found, problems = {}, []
    ids = book.assignments()
    for lab in labs:
        if given and lab in given:
            hits = [c for c, i in ids.items() if i == str(given[lab])]
            if not hits:
                problems.append(f"lab {lab}: no assignment with id {given[lab]} in {book.path.name}")
                continue
        else:
            hits = [c for c in ids if any(int(m) == int(lab) for m in _LAB_IN_TITLE.findall(_ASSIGNMENT.match(c)[1]))]
        if len(hits) == 1:
            found[lab] = hits[0]
        else:
            problems.append(f"lab {lab}: " + (f"{len(hits)} assignments could be it ({'; '.join(hits)})" if hits else
                                              "no assignment whose title holds its number"))
    if problems:
        raise ValueError(f"{book.path}: " + ". ".join(problems) + ". Name each lab's assignment with "
                         "--canvas-assignment NN=ID (the number in brackets after its title)")
    return found


def _match(people: list[dict], student: str, ids: set[str]) -> dict | None:
    """The gradebook row of a labkit student: by the Canvas user id collect recorded, else their name as an ID, SIS
    User ID or SIS Login ID."""
    for key, column in [*((i, "ID") for i in sorted(ids)), *((student, c) for c in ("ID", "SIS User ID", "SIS Login ID"))]:
        hits = [p for p in people if str(p.get(column, "")).strip().lower() == key.strip().lower()]
        if len(hits) == 1:
            return hits[0]
    return None


@dataclass
class CanvasExport:
    """canvas.csv, the students the gradebook lacks, what to tell the instructor, and who has no submission of what."""
    path: Path
    unmatched: list[str]
    notes: list[str]
    missing: list[str] = field(default_factory=list)


def canvas(data: dict, out: Path | str, gradebook: Path | str | None = None, assignments: dict[str, str] | None = None,
           allow_unmatched: bool = False, zero_missing: bool = False) -> CanvasExport:
    """Write ``out``/canvas.csv for Canvas's gradebook import. With ``gradebook`` (exported from Canvas) each lab goes
    into its assignment's column, ``Title (id)``, and each student is found by ID, SIS User ID or login; a student
    not found fails the export, naming them all, unless ``allow_unmatched`` (then they are left out, and returned).
    A lab's points are scaled to the assignment's points possible where the two differ. Without a gradebook the
    students' folder names stand in Student and SIS Login ID, under columns Canvas would take for new assignments.
    A student with no submission of a lab (the gradebook's students too) gets 0 there with ``zero_missing``, else a
    blank that Canvas's import leaves as it was; either way they are named in the notes."""
    notebooks = sorted({nb for per in data["students"].values() for nb in per})
    ours = {nb: _points_possible(data, nb) for nb in notebooks}
    if gradebook is None:
        return _canvas_bare(data, out, notebooks, ours, zero_missing)
    book = read_gradebook(gradebook)
    labs = {nb: lab_number_of(nb) for nb in notebooks}
    columns = canvas_columns(book, sorted(set(labs.values())), assignments)
    scale, notes = {}, []
    for nb in notebooks:
        theirs = _number(book.possible.get(columns[labs[nb]], ""))
        scale[nb] = theirs / ours[nb] if theirs and ours[nb] and abs(theirs - ours[nb]) > 1e-9 else 1.0
        if scale[nb] != 1.0:
            notes.append(f"{columns[labs[nb]]}: {_fmt(ours[nb])} points here, {_fmt(theirs)} in Canvas: scaled")
    people = [c for c in CANVAS_PEOPLE if c in book.columns]
    rows, unmatched, found = [], [], set()
    for student, per in sorted(data["students"].items()):
        ids = {str((e.get("submission") or {}).get("lms_user_id") or "") for e in per.values()
               if (e.get("submission") or {}).get("lms") == "canvas"} - {""}
        who = _match(book.people, student, ids)
        if who is None:
            unmatched.append(student)
            continue
        found.add(id(who))
        row = {c: who.get(c, "") for c in people}
        for nb, entry in per.items():
            row[columns[labs[nb]]] = _fmt(round(_points(entry) * scale[nb], 2))
        rows.append(row)
    if unmatched and not allow_unmatched:
        raise ValueError(f"not in the Canvas gradebook {book.path.name} (by ID, SIS User ID or SIS Login ID): "
                         f"{', '.join(unmatched)}. Correct the folder names, or pass --allow-unmatched to leave them "
                         "out of canvas.csv")
    fields = [*people, *dict.fromkeys(columns[labs[nb]] for nb in notebooks)]
    possible = {"Student": "Points Possible", **{columns[labs[nb]]: book.possible.get(columns[labs[nb]], "")
                                                 or _fmt(ours[nb]) for nb in notebooks}}
    # the gradebook's students graded in no lab: a row each, for a 0 or to be named
    absent = [{c: p.get(c, "") for c in people} for p in book.people if id(p) not in found]
    missing = _no_submission([*rows, *absent], fields[len(people):], zero_missing)
    rows += absent if zero_missing else []
    return CanvasExport(_write_csv(Path(out) / CANVAS_CSV, fields, [possible, *rows]), unmatched,
                        notes + _missing_notes(missing, zero_missing), missing)


def _canvas_bare(data: dict, out: Path | str, notebooks: list[str], ours: dict, zero_missing: bool) -> CanvasExport:
    """canvas.csv without a gradebook: folder names as the students, a column per lab by its name."""
    rows = []
    for student, per in sorted(data["students"].items()):
        row = {"Student": student, "SIS Login ID": student}
        row.update({lab_name(nb): _fmt(_points(per[nb])) if nb in per else "" for nb in notebooks})
        rows.append(row)
    missing = _no_submission(rows, [lab_name(nb) for nb in notebooks], zero_missing)
    fields = [*CANVAS_IDENTITY, *(lab_name(nb) for nb in notebooks)]
    possible = {"Student": "Points Possible", **{lab_name(nb): _fmt(ours[nb]) for nb in notebooks}}
    return CanvasExport(_write_csv(Path(out) / CANVAS_CSV, fields, [possible, *rows]), [],
                        _missing_notes(missing, zero_missing), missing)


def _no_submission(rows: list[dict], labs: list[str], zero: bool) -> list[str]:
    """Each student with a blank lab cell ("Brown, Ben (4412): Lab 07 (5557)"); with ``zero`` the blanks become 0,
    since Canvas's import leaves a blank cell as it was, and a student who handed nothing in is not 'not graded'."""
    missing = []
    for row in rows:
        blank = [c for c in labs if not row.get(c)]
        if blank:
            missing.append(f"{row['Student']}" + (f" ({row['ID']})" if row.get("ID") else "") + f": {', '.join(blank)}")
            row.update(dict.fromkeys(blank, "0") if zero else {})
    return missing


def _missing_notes(missing: list[str], zero: bool) -> list[str]:
    """The notes naming them: given 0, or left blank and how to give them 0."""
    then = "given 0" if zero else "left blank, which Canvas keeps as it was (--canvas-missing-zero gives 0)"
    return [f"no submission: {who}: {then}" for who in missing]


def _write_csv(path: Path, fields: list[str], rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields, restval="")
        w.writeheader()
        w.writerows(rows)
    return path


def lab_number_of(notebook: str) -> str:
    from .assign import lab_number

    return lab_number(notebook) or notebook


def _number(text: str) -> float | None:
    try:
        return float(str(text).strip())
    except ValueError:
        return None


def _points(entry: dict) -> float:
    """A lab's points as it goes into a gradebook: its total after any late penalty."""
    if "total" in entry:
        return float(entry["total"])
    return float(entry.get("passed", 0)) + float(entry.get("answer_score") or 0)


def _points_possible(data: dict, notebook: str) -> float:
    """The points a notebook is worth: its exercises' and its questions' (the most any student's entry says)."""
    best = 0.0
    for per in data["students"].values():
        if notebook in per:
            e = per[notebook]
            possible = e.get("points_possible")
            if possible is None:
                possible = float(e.get("exercises", 0)) + float(e.get("answer_points") or 0)
            best = max(best, float(possible))
    return best


def changes(before: dict, after: dict, allow_other_release: bool = False) -> list[dict]:
    """Every exercise whose verdict differs between two grades.json, and those graded in only one of them.

    Refuses two runs of different releases (their exercises are not the same) unless ``allow_other_release``."""
    from .grade import release_differs, release_words

    if (differ := release_differs(before, after)) and not allow_other_release:
        raise ValueError(f"the earlier grades come from another release ({release_words(differ)} differs): their "
                         "exercises may differ. Regrade against grades of the same release, or pass "
                         "--regrade-other-release to compare anyway")
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
