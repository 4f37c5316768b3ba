"""Student versions of the lab notebooks: every solution region replaced by a stub, outputs cleared.

A solution region is the lines from ``### BEGIN SOLUTION`` to ``### END SOLUTION``. In Python code the
region becomes ``raise NotImplementedError`` at the region's indentation; in CUDA C (a kernel's source
inside a Python string, marked ``// ### BEGIN SOLUTION``) it becomes ``// YOUR CODE HERE``, which the
kernel checks (``labkit.check.tiled_matmul``...) report as "not written yet". The check cells stay.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path

import nbformat

from .. import handout
from ..check.exercises import EXERCISES, exercise
from ..errors import LabkitError
from . import answers

BEGIN, END, SOLUTION, PY_STUB, C_STUB = handout.BEGIN, handout.END, handout.SOLUTION, handout.PY_STUB, handout.C_STUB
student_source = handout.stub_solutions  # one cell's source with each solution region replaced by its stub


def student_notebook(nb):
    """The notebook (nbformat v4) as handed out: solutions stubbed, answers blank, outputs and execution counts
    cleared (:mod:`labkit.handout`)."""
    nb = nbformat.from_dict(nb)  # a copy; the instructor's version stays as it is
    answers.answer_cells(nb)  # well formed (raises otherwise)
    handout.blank_cells(nb.cells)
    return nb


CHECK_CALL = re.compile(r"^\s*check\.(\w+)\(", re.M)


def exercises_in(nb) -> list[tuple[int, str]]:
    """(cell index, exercise name) of every check cell, a call of a check declared in labkit.check.exercises; a name
    that repeats gets #2, #3..."""
    found, seen = [], {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for name in CHECK_CALL.findall(cell.source):
            if name not in EXERCISES:
                continue
            seen[name] = seen.get(name, 0) + 1
            found.append((i, name if seen[name] == 1 else f"{name}#{seen[name]}"))
    return found


def lab_of(nb) -> str | None:
    """The lab a notebook is ("01"), found by its content: the labs of the exercises its check cells call and the
    ids of its answer cells ("01-..."), the most common; None when it holds neither."""

    votes = Counter(e.lab for _, name in exercises_in(nb) if (e := exercise(name)) is not None)
    for cell in nb.cells:
        if (m := answers.meta(cell)) is not None and re.match(r"\d\d-", str(m.get("answer", ""))):
            votes[str(m["answer"])[:2]] += 1
    return max(sorted(votes), key=votes.get) if votes else None


def lab_number(name: str) -> str | None:
    """The two-digit lab number a lab is given by ("1", "01", "01_serial_backprop.ipynb" -> "01"), or None."""
    m = re.match(r"0*(\d{1,2})(?:\D|$)", str(name).strip())
    return f"{int(m.group(1)):02d}" if m else None


def undeclared_checks(nb) -> list[tuple[int, str]]:
    """(cell index, name) of every ``check.<name>(`` call that names no exercise of labkit.check.exercises."""
    return [(i, name) for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
            for name in CHECK_CALL.findall(cell.source) if name not in EXERCISES]


def _only_declared(nb, where) -> None:
    """Raise where the instructor's notebook calls a check that is not a declared exercise (it would not be graded)."""
    if bad := undeclared_checks(nb):
        listed = ", ".join(f"check.{name} (cell {i})" for i, name in bad)
        raise ValueError(f"{where}: {listed} is no exercise labkit knows; declare it in labkit/check/exercises.py "
                         "or correct the name")


def lock_given_cells(nb) -> None:
    """Mark every code cell without a solution region read-only and not deletable (:func:`handout.lock_given_cells`)."""
    handout.lock_given_cells(nb.cells)


def release_entry(student) -> dict:
    """What the grader needs of one handed-out notebook: its hash and, per exercise, the check cell (id, source);
    and the source of every code cell as handed out (``given_code``), which ``labkit similarity`` takes out of the
    students' code before comparing it."""
    text = nbformat.writes(student)
    exercises = []
    for i, name in exercises_in(student):
        cell = student.cells[i]
        exercises.append({"name": name, "check_cell_id": cell.get("id"), "check_source": cell.source,
                          "check_sha256": hashlib.sha256(cell.source.encode()).hexdigest(), "points": 1})
    questions = [{"id": m["answer"], "kind": m["kind"], "points": int(m.get("points", 1)),
                  "question": answers.question_text(student, i)} for i, m in answers.answer_cells(student)]
    given = [cell.source for cell in student.cells if cell.cell_type == "code"]
    # what the instructor may edit in release.json: points, partial credit per check case (here for every exercise
    # of the lab, or an exercise's own "partial_credit"), the hidden parts' share, the deadline and late policy
    return {"sha256": hashlib.sha256(text.encode()).hexdigest(), "lab": lab_of(student), "exercises": exercises,
            "answers": questions, "given_code": given, "partial_credit": False, "hidden_share": HIDDEN_SHARE,
            "deadline": None, "late": dict(LATE_POLICY)}


HIDDEN_SHARE = 0.5  # of an exercise's points, its hidden part's (labkit grade --hidden-part)
LATE_POLICY = {"percent_per_day": 10, "max_days": 5}  # per day late or part of one; later than max_days scores 0


def nbgrader_source(nb, points: int = 1):
    """The instructor's notebook (solutions in it) as an nbgrader source notebook: each cell with a solution region a
    solution cell, each check cell a locked graded test cell worth ``points``, the given code locked, the parameters
    cell and the markdown left as they are. nbgrader's ``generate_assignment`` stubs the solution regions itself:
    in Python with ``raise NotImplementedError()``, and inside a CUDA C or C string its stub's first line,
    ``# YOUR CODE HERE``, is what labkit's C and kernel checks report as not written yet.

    Each answer cell (:mod:`.answers`) becomes a manually graded answer with its points: an explain cell as it is
    (nbgrader puts its text stub in place of the model answer); a predict cell as its handed-out lines followed by
    the model answer in a solution region, so that the prediction's names exist (``...``) in the student's version
    even before they answer."""
    nb = nbformat.from_dict(nb)
    _only_declared(nb, "nbgrader source")
    answers.answer_cells(nb)
    checks = dict(exercises_in(nb))
    seen_ids = set()
    for i, cell in enumerate(nb.cells):
        if (m := answers.meta(cell)) is not None:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
                cell.source = f"{answers.student_source(cell)}\n{BEGIN}\n{cell.source}\n{END}"
            grade_id = f"answer-{m['answer']}"
            if grade_id in seen_ids:
                raise ValueError(f"cell {i}: nbgrader needs unique grade ids, {grade_id!r} repeats")
            seen_ids.add(grade_id)
            cell.metadata["nbgrader"] = {"schema_version": 3, "task": False, "grade": True, "solution": True,
                                         "locked": False, "points": int(m.get("points", 1)), "grade_id": grade_id}
            continue
        if cell.cell_type != "code":
            if BEGIN in cell.source:
                raise ValueError(f"cell {i} is {cell.cell_type}: nbgrader takes solution regions in code cells only")
            continue
        cell.outputs, cell.execution_count = [], None
        student_source(cell.source)  # the markers pair up (raises otherwise)
        base = str(cell.get("id") or f"cell-{i}")
        meta = {"schema_version": 3, "task": False}
        if BEGIN in cell.source:
            meta.update(grade=False, solution=True, locked=False, grade_id=f"{base}-solution")
        elif i in checks:
            meta.update(grade=True, solution=False, locked=True, points=points,
                        grade_id="check-" + checks[i].replace("#", "-"))
        elif "parameters" in cell.get("metadata", {}).get("tags", []):
            continue
        else:
            meta.update(grade=False, solution=False, locked=True, grade_id=f"{base}-given")
        if meta["grade_id"] in seen_ids:
            raise ValueError(f"cell {i}: nbgrader needs unique grade ids, {meta['grade_id']!r} repeats")
        seen_ids.add(meta["grade_id"])
        cell.metadata["nbgrader"] = meta
    return nb


def write_nbgrader_sources(notebooks: list[Path], out_dir: Path | str, force: bool = False) -> list[Path]:
    """nbgrader's ``source/<assignment>/`` folder: each notebook with nbgrader's cell metadata (:func:`nbgrader_source`).
    These hold the solutions: they are the instructor's, never the students'."""
    out_dir = Path(out_dir)
    versions = []
    for path in notebooks:
        try:
            nb = nbgrader_source(nbformat.read(path, as_version=4))
        except ValueError as e:
            raise ValueError(f"{Path(path).name}: {e}") from None
        versions.append((out_dir / Path(path).name, nbformat.writes(nb) + "\n"))
    differ = [t for t, text in versions if t.exists() and t.read_text(encoding="utf-8") != text]
    if differ and not force:
        raise WouldOverwrite(f"{len(differ)} file(s) in {out_dir} differ from what would be written: "
                             f"{', '.join(t.name for t in differ)}. Nothing was written; use --force to replace them.")
    out_dir.mkdir(parents=True, exist_ok=True)
    for target, text in versions:
        target.write_text(text, encoding="utf-8")
    return [t for t, _ in versions]


RELEASE_FILE = "release.json"


def has_exercises(nb) -> bool:
    """Whether a notebook holds work to hand in: a solution region, or a question's answer cell."""
    return any((c.cell_type == "code" and BEGIN in c.source) or answers.meta(c) for c in nb.cells)


class WouldOverwrite(LabkitError, FileExistsError):
    """A student file in the output folder differs from the version labkit would write (it may hold their work)."""


def handed_out(path: Path | str):
    """One instructor's notebook file as a student gets it, from ``labkit assign`` or ``labkit lab``: (the student
    notebook, its file's text)."""
    nb = nbformat.read(path, as_version=4)
    _only_declared(nb, Path(path).name)
    try:
        student = student_notebook(nb)
    except ValueError as e:
        raise ValueError(f"{Path(path).name}: {e}") from None
    lock_given_cells(student)
    return student, nbformat.writes(student) + "\n"


def write_student_versions(notebooks: list[Path], out_dir: Path | str, force: bool = False,
                           release_dir: Path | str | None = None, policy: dict[str, dict] | None = None) -> list[Path]:
    """Write the student version of each notebook into ``out_dir`` (same file names); return the paths.

    A file already there that differs from the version about to be written (a student's edits, or an older release)
    is never replaced silently: nothing is written and :class:`WouldOverwrite` names the files, unless ``force``.
    With ``release_dir`` (the instructor's side, never the students' folder) the release record goes there as
    ``release.json``: every notebook handed out, its hash, and each exercise's check cell, which ``labkit grade``
    runs and compares with what comes back. A record already there is added to (:func:`add_to_release`). ``policy``
    sets, per lab ("01", or "*" for every lab), what to put in its entry over the defaults
    (``{"deadline": "2026-10-02T23:59:00+02:00", "late": {...}}``); one for a lab not handed out here is refused
    (:class:`NotAssigned`).
    """
    out_dir = Path(out_dir)
    versions = []
    for path in notebooks:
        target = out_dir / Path(path).name
        if target.resolve() == Path(path).resolve():
            raise ValueError(f"writing the student version of {path} would overwrite the instructor's notebook: "
                             "choose another output folder")
        versions.append((target, *handed_out(path)))
    entries = {t.name: release_entry(student) for t, student, _ in versions}
    _policy_for_these(policy or {}, entries)
    for entry in entries.values():
        entry.update({**(policy or {}).get("*", {}), **(policy or {}).get(entry["lab"], {})})  # "*": every lab
    differ = [t for t, _, text in versions if t.exists() and t.read_text(encoding="utf-8") != text]
    if differ and not force:
        raise WouldOverwrite(f"{len(differ)} file(s) in {out_dir} differ from the student versions and may hold "
                             f"students' work: {', '.join(t.name for t in differ)}. Nothing was written. Choose another "
                             "folder, or overwrite them on purpose with --force (labkit assign) / force=True.")
    if release_dir is not None:
        release_dir = Path(release_dir)
        if release_dir.resolve() == out_dir.resolve() or out_dir.resolve() in release_dir.resolve().parents:
            raise ValueError(f"the release record belongs with the instructor's files, not in the students' folder "
                             f"{out_dir}: choose another --release folder")
        sources = {Path(path).name: Path(path).parent for path in notebooks}
        write_release = add_to_release(release_dir, entries, sources)  # read and checked before anything is written
    out_dir.mkdir(parents=True, exist_ok=True)
    for target, _, text in versions:
        target.write_text(text, encoding="utf-8")
    if release_dir is not None:
        write_release()
    return [t for t, _, _ in versions]


class NotAssigned(LabkitError, ValueError):
    """A deadline or late policy names a lab that the assign giving it does not hand out."""


def _policy_for_these(policy: dict[str, dict], entries: dict[str, dict]) -> None:
    """Refuse a deadline or late policy for a lab not handed out now: it would be dropped without a word."""
    labs = sorted({lab for name, entry in entries.items() if (lab := entry_lab(name, entry))})
    stray = sorted(lab for lab in policy if lab != "*" and lab not in labs)
    if stray:
        raise NotAssigned(f"a deadline or late policy for lab {', '.join(stray)}, which this assign does not hand out "
                          f"(it hands out lab {', '.join(labs) or 'none'}): add --only {stray[0]}_ to hand it out "
                          f"too, or leave out its --deadline {stray[0]}=...")


def entry_lab(name: str, entry: dict) -> str | None:
    """The lab ("01") a release record's entry is: its own ``lab``, else its notebook's file name."""
    return entry.get("lab") or lab_number(name)


def read_release(path: Path | str) -> tuple[dict, str]:
    """The release record in the file ``path`` and its sha256; ValueError for a file that is not one."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        record = json.loads(text)
        record["notebooks"].items()
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path} is not a release record written by labkit assign ({e})") from None
    return record, hashlib.sha256(text.encode()).hexdigest()


def add_to_release(release_dir: Path | str, entries: dict[str, dict], sources: dict[str, Path] | None = None):
    """Add ``entries`` (notebook name: :func:`release_entry`) to the release record in ``release_dir``: the labs
    released there before stay, and a lab released again has its entry replaced (said on stdout). ``rubrics.json``,
    when there, gets the rubrics of the labs added (the model answers from the instructor's notebooks in
    ``sources``, per name); a rubric of a question asked again for the same points stays as it was edited.

    Reads and checks what is there first, and returns the function that writes the record, so that a record that
    cannot be read stops the assign before any file is written."""
    import time

    from .. import __version__

    folder = Path(release_dir)
    earlier = read_release(folder / RELEASE_FILE)[0]["notebooks"] if (folder / RELEASE_FILE).is_file() else {}
    labs = {lab for name, entry in entries.items() if (lab := entry_lab(name, entry))}
    replaced = sorted(n for n, e in earlier.items() if n in entries or entry_lab(n, e) in labs)
    rubrics = answers.load_rubrics(folder) if (folder / answers.RUBRICS_FILE).is_file() else None
    record = {"labkit_version": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "notebooks": dict(sorted(({n: e for n, e in earlier.items() if n not in replaced} | entries).items()))}

    def write() -> None:
        for name in replaced:
            was, now = earlier[name].get("deadline"), record["notebooks"].get(name, {}).get("deadline")
            print(f"{folder / RELEASE_FILE}: lab {entry_lab(name, earlier[name])} was released there before "
                  f"({name}): its entry is replaced by this assign's (check cells, points, deadline, late policy)"
                  + (f"; its deadline is now {now or 'none'}, was {was or 'none'}" if was != now else ""))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / RELEASE_FILE).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        if rubrics is not None:
            _add_rubrics(folder, rubrics, replaced, entries, sources or {})

    return write


def _add_rubrics(folder: Path, rubrics: dict, replaced: list[str], entries: dict, sources: dict[str, Path]) -> None:
    """rubrics.json with the default rubrics of ``entries`` added; an edited rubric of a question asked again for
    the same points kept."""
    before = {name: rubrics.pop(name) for name in replaced if name in rubrics}
    for name, entry in entries.items():
        fresh = answers.default_rubrics({"notebooks": {name: entry}}, sources.get(name))[name]
        mine = before.get(name, {})
        rubrics[name] = {qid: mine[qid] if mine.get(qid, {}).get("points") == rubric["points"] else rubric
                         for qid, rubric in fresh.items()}
    (folder / answers.RUBRICS_FILE).write_text(json.dumps(rubrics, indent=1, ensure_ascii=False) + "\n",
                                               encoding="utf-8")


__all__ = ["BEGIN", "END", "SOLUTION", "PY_STUB", "C_STUB", "CHECK_CALL", "RELEASE_FILE", "exercises_in", "WouldOverwrite",
           "NotAssigned", "lab_of", "lab_number", "entry_lab", "read_release", "add_to_release", "HIDDEN_SHARE",
           "LATE_POLICY",
           "student_source", "undeclared_checks",
           "student_notebook", "handed_out", "nbgrader_source", "write_nbgrader_sources", "lock_given_cells", "release_entry",
           "has_exercises", "write_student_versions"]
