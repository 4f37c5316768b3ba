"""Answer cells: the questions a lab asks the student to predict or explain, handed out blank and read by hand.

An answer cell carries ``{"labkit": {"answer": "<id>", "kind": "predict" | "explain", "points": N}}`` in its
metadata, right after the markdown cell that asks the question (it starts with ``**Question``).

- **explain**: a markdown cell. The instructor's notebook holds a model answer; the student's holds
  :data:`PLACEHOLDER`.
- **predict**: a code cell of assignments, ``predicted_speedup = 3.5  # times faster``. The student's version has
  ``...`` for every value; the cell after the experiment prints the prediction beside the measurement
  (:func:`labkit.questions.compare`), and a blank one as blank.

``labkit grade`` collects every student's answers per question (:func:`collect`) into ``answers.html`` to read and
``answers.csv``, whose ``score`` column the instructor fills in; the next ``grade`` run into the same folder keeps
those scores (:func:`merge_scores`) and adds them to ``grades.json``. The machine never scores an answer; a blank
answer is 0 points, and says so.

**Rubrics.** Each question's rubric lives in the release, ``RELEASE/rubrics.json`` beside release.json: per notebook
and question its points, the model answer, and items, each ``{"id", "points", "criterion", "comment"}``. When the
file is missing, :func:`load_rubrics` writes a default one (one item worth the question's points, the model answer
from the instructor's notebook of the same name); the instructor edits it with any text editor: split the points
into items, word their criteria and the comments a student reads. In ``answers.csv`` the instructor then either
writes a ``score`` or lists the ``items`` earned (``a,c``): the score is their points, and their comments join the
``comment`` column's on the student's feedback (:func:`hand_score`). ``answers.html`` shows each question's model
answer and rubric, and per student their answer, and for a prediction what their own run measured beside it.

**Copied answers.** An explanation that is the model answer, word for word or with a few words changed
(:func:`labkit.grading.prose.copied_share`), is flagged for the instructor on the page and in the ``copied``
column of ``answers.csv``; never in what a student reads. Predictions are not: many honest students predict the same
number.
"""

from __future__ import annotations

import ast
import csv
import hashlib
import html
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import handout
from ..labs import NOTEBOOKS
from ..questions import PREDICTION_MIME
from . import prose

KINDS = ("predict", "explain")
PLACEHOLDER = handout.PLACEHOLDER
ANSWERS_CSV, ANSWERS_HTML = "answers.csv", "answers.html"
RUBRICS_FILE = "rubrics.json"
BLANK = "blank: 0 points"


meta = handout.answer_meta  # the answer cell's labkit metadata, or None for any other cell


def answer_cells(nb) -> list[tuple[int, dict]]:
    """(cell index, metadata) of every answer cell, in order. Raises ValueError for a malformed one: an unknown
    kind, a predict cell that is not code of plain assignments, an explain cell that is not markdown, an id that
    repeats, or no question right above it."""
    found, ids = [], set()
    for i, cell in enumerate(nb.cells):
        m = meta(cell)
        if m is None:
            continue
        where = f"answer cell {i} ({m.get('answer')!r})"
        if m.get("kind") not in KINDS:
            raise ValueError(f"{where}: kind must be one of {KINDS}, got {m.get('kind')!r}")
        if m["answer"] in ids:
            raise ValueError(f"{where}: the id repeats; each question needs its own")
        ids.add(m["answer"])
        want = "code" if m["kind"] == "predict" else "markdown"
        if cell.cell_type != want:
            raise ValueError(f"{where}: a {m['kind']} answer is a {want} cell, this one is {cell.cell_type}")
        if not isinstance(m.get("points", 1), int) or m.get("points", 1) < 0:
            raise ValueError(f"{where}: points must be a whole number >= 0")
        if m["kind"] == "predict":
            _assignments(cell.source, where)
        if i == 0 or nb.cells[i - 1].cell_type != "markdown" or not nb.cells[i - 1].source.lstrip().startswith("**Question"):
            raise ValueError(f"{where}: put the question in the markdown cell right above it, starting with **Question")
        found.append((i, m))
    return found


_assignments = handout.assignments
student_source = handout.blank_answer  # the answer cell as handed out: values ``...``, an explanation PLACEHOLDER


def is_blank(cell) -> bool:
    """Whether an answer cell is as handed out (or emptied)."""
    m = meta(cell)
    if m is None:
        return False
    if m["kind"] == "explain":
        text = cell.source.strip()
        return not text or text == PLACEHOLDER or text == "YOUR ANSWER HERE"  # nbgrader's stub
    try:
        values = [s.value for s in _assignments(cell.source)]
    except ValueError:
        return not cell.source.strip() or "raise NotImplementedError" in cell.source
    return all(isinstance(v, ast.Constant) and (v.value is ... or v.value is None) for v in values)


def question_text(nb, index: int) -> str:
    """The question an answer cell answers: the markdown cell above it."""
    return nb.cells[index - 1].source.strip() if index > 0 else ""


@dataclass
class Answer:
    student: str
    notebook: str
    question: str      # the answer cell's id
    kind: str
    points: int
    answer: str        # the cell's text as the student left it ("" when blank)
    blank: bool
    score: float | None = None  # the instructor's, from answers.csv
    note: str = ""
    comment: str = ""  # the instructor's, and the comments of the rubric items earned
    items: str = ""    # the rubric items earned, "a,c"
    measured: str = ""  # a prediction: what the student's own run printed beside it
    copied: str = ""   # an explanation copied from the model answer, said how much: the instructor's to read only


def collect(nb, student: str, notebook: str) -> list[Answer]:
    """Every answer of one submitted notebook, blank ones included. A question whose cell the student deleted is
    reported blank, with a note."""
    by_id = {m["answer"]: (i, m) for i, cell in enumerate(nb.cells) if (m := meta(cell)) is not None}
    out = []
    for qid, (i, m) in by_id.items():
        cell = nb.cells[i]
        blank = is_blank(cell)
        out.append(Answer(student, notebook, qid, m.get("kind", "?"), int(m.get("points", 1)),
                          "" if blank else cell.source.strip(), blank))
    return out


def blank_answers(nb, released: dict | None = None) -> list[Answer]:
    """The written answers of a notebook left blank (as handed out, emptied, or their cell deleted when ``released``,
    the release record's entry, lists the questions), each worth 0 points as it stands."""
    mine = collect(nb, "you", "")
    have = {a.question for a in mine}
    missing = [Answer("you", "", q["id"], q["kind"], int(q["points"]), "", True, note="its answer cell is missing")
               for q in (released or {}).get("answers", []) if q["id"] not in have]
    return [a for a in mine if a.blank] + missing


def expected(released_nb) -> list[tuple[str, dict]]:
    """(id, metadata) of the answer cells of a notebook as handed out."""
    return [(m["answer"], m) for _, m in answer_cells(released_nb)]


def collect_against(nb, released_nb, student: str, notebook: str) -> list[Answer]:
    """:func:`collect`, with a blank row (noted) for every question of the handed-out notebook the submission lacks."""
    have = {a.question: a for a in collect(nb, student, notebook)}
    out = []
    for qid, m in expected(released_nb):
        out.append(have.pop(qid, None) or Answer(student, notebook, qid, m["kind"], int(m.get("points", 1)), "", True,
                                                note="its answer cell is missing from the notebook (deleted?)"))
    return out + list(have.values())


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


FIELDS = ("student", "notebook", "question", "kind", "points", "blank", "score", "items", "comment", "answer_sha", "answer",
          "note", "copied")  # readers take columns by name: a new one goes last


def merge_scores(answers: list[Answer], previous_csv: Path, rubrics: dict | None = None) -> list[str]:
    """Take the scores, items and comments an instructor wrote into an earlier ``answers.csv`` (same student,
    notebook and question) into ``answers`` (:func:`hand_score`); return a warning for each score whose answer has
    changed since (it is dropped: read it again) and for each score out of range. A blank answer scores 0."""
    for a in answers:
        if a.blank and a.score is None:
            a.score, a.note = 0.0, a.note or BLANK
    previous_csv = Path(previous_csv)
    if not previous_csv.is_file():
        return []
    warnings = []
    with open(previous_csv, newline="", encoding="utf-8") as f:
        rows = {(r.get("student"), r.get("notebook"), r.get("question")): r for r in csv.DictReader(f)}
    for a in answers:
        row = rows.get((a.student, a.notebook, a.question))
        if not row:
            continue
        score, comment, warning = hand_score(row, (rubrics or {}).get(a.notebook, {}).get(a.question), a.points)
        if warning:
            warnings.append(f"{a.student} / {a.question}: {warning}")
        if score is None and not comment:
            continue
        if row.get("answer_sha") and row["answer_sha"] != _digest(a.answer):
            warnings.append(f"{a.student} / {a.question}: the answer changed since it was scored; score it again")
            continue
        a.items, a.comment = (row.get("items") or "").strip(), comment
        if score is not None:
            a.score = score
    return warnings


def read(path: Path | str) -> list[Answer]:
    """The answers an ``answers.csv`` holds ([] without the file), as they were collected: their scores, items and
    comments are left for :func:`merge_scores` to take from the file, checked as any other's."""
    if not Path(path).is_file():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return [Answer(r.get("student", ""), r.get("notebook", ""), r.get("question", ""), r.get("kind", ""),
                       int(float(r.get("points") or 0)), r.get("answer") or "", r.get("blank") == "1",
                       note=r.get("note") or "") for r in csv.DictReader(f)]


def hand_score(row: dict, rubric: dict | None, points: float) -> tuple[float | None, str, str]:
    """One row of ``answers.csv`` as the instructor left it: (the score, or None when unscored; the comment a
    student reads; a warning, or ""). The ``score`` column wins; else the ``items`` earned add up their rubric
    points. Their comments come before the instructor's own."""
    text, listed = (row.get("score") or "").strip(), [i.strip() for i in (row.get("items") or "").split(",") if i.strip()]
    own = (row.get("comment") or "").strip()
    items = {str(item["id"]): item for item in (rubric or {}).get("items", [])}
    unknown = [i for i in listed if i not in items]
    if unknown:
        return None, own, (f"rubric item {', '.join(unknown)} is not in the rubric (its items: {', '.join(items) or 'none'}"
                           f"; edit {RUBRICS_FILE} in the release, or correct the items column); left unscored")
    comment = " ".join([*(str(items[i].get("comment", "")).strip() for i in listed), own]).strip()
    if text:
        try:
            score = float(text)
        except ValueError:
            return None, comment, f"score {text!r} is not a number; left unscored"
    elif listed:
        score = sum(float(items[i]["points"]) for i in listed)
    else:
        return None, comment, ""
    if not 0 <= score <= float(points):
        return None, comment, f"score {score:g} is outside 0..{float(points):g}; left unscored"
    return score, comment, ""


def default_rubrics(record: dict, instructor: Path | str | None = None) -> dict:
    """Rubrics for every question of a release record: per notebook and question its kind, points, question and
    model answer (from the instructor's notebook of the same name in ``instructor``, the course's labs by default),
    and one item worth all its points, for the instructor to split."""
    import nbformat

    rubrics = {}
    for name, entry in record.get("notebooks", {}).items():
        path = Path(instructor or NOTEBOOKS) / name
        models = {}
        if path.is_file():
            nb = nbformat.read(path, as_version=4)
            models = {m["answer"]: nb.cells[i].source.strip() for i, m in answer_cells(nb)}
        rubrics[name] = {q["id"]: {"kind": q["kind"], "points": q["points"], "question": q.get("question", ""),
                                   "model_answer": models.get(q["id"], ""),
                                   "items": [{"id": "a", "points": q["points"], "criterion": "as the model answer",
                                              "comment": ""}]}
                         for q in entry.get("answers", [])}
    return rubrics


def load_rubrics(release: Path | str, record: dict | None = None, instructor: Path | str | None = None) -> dict:
    """The rubrics of a release, from ``release``/rubrics.json; written there from :func:`default_rubrics` first
    when missing, for the instructor to edit. Raises ValueError for a file that is not a rubric, naming the fix."""
    folder = Path(release)
    folder = folder.parent if folder.suffix == ".json" else folder
    path = folder / RUBRICS_FILE
    if not path.is_file():
        if record is None:
            record = json.loads((folder / "release.json").read_text(encoding="utf-8"))
        path.write_text(json.dumps(default_rubrics(record, instructor), indent=1, ensure_ascii=False) + "\n",
                        encoding="utf-8")
    try:
        rubrics = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{path} is not valid JSON ({e}): correct it, or delete it to get the default back") from None
    for name, questions in rubrics.items():
        for qid, rubric in questions.items():
            _check_rubric(rubric, f"{path}: {name} / {qid}")
    return rubrics


def _check_rubric(rubric, where: str) -> None:
    items = rubric.get("items") if isinstance(rubric, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, dict) and "id" in i and "points" in i for i in items):
        raise ValueError(f"{where}: items must be a list of {{\"id\", \"points\", \"criterion\", \"comment\"}}")
    ids = [str(i["id"]) for i in items]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{where}: an item id repeats ({', '.join(ids)}); give each its own")
    if any(not isinstance(i["points"], int | float) or i["points"] < 0 for i in items):
        raise ValueError(f"{where}: an item's points must be a number >= 0")
    if sum(i["points"] for i in items) > float(rubric.get("points", float("inf"))) + 1e-9:
        raise ValueError(f"{where}: its items add up to {sum(i['points'] for i in items):g} points, more than the "
                         f"question's {rubric['points']:g}")


def measured_beside(executed_nb, answer_id: str) -> str:
    """What a student's executed notebook showed beside a prediction: the printed text and the comparison's line of each
    later cell that passes the prediction's names to ``compare(`` (:func:`labkit.questions.compare`); "" when there is
    none."""
    at = next((i for i, c in enumerate(executed_nb.cells) if (m := meta(c)) and m["answer"] == answer_id), None)
    if at is None or executed_nb.cells[at].cell_type != "code":
        return ""
    try:
        names = {t.id for s in _assignments(executed_nb.cells[at].source) for t in s.targets}
    except ValueError:
        names = set()
    names |= {n for n in _predicted_names(executed_nb.cells[at].source)}
    found = []
    for cell in executed_nb.cells[at + 1:]:
        if cell.cell_type != "code" or "compare(" not in cell.source:
            continue
        try:
            used = {n.id for n in ast.walk(ast.parse(cell.source)) if isinstance(n, ast.Name)}
        except SyntaxError:
            continue
        if used & names:
            found += [_shown(o) for o in cell.get("outputs", [])]
    return "".join(found).strip()


def _shown(out) -> str:
    """An output's text as the student saw it: a stream's, or the line :func:`labkit.questions.compare` shows as
    display data (a figure's or a claim's text is not what was measured beside the prediction)."""
    if out.get("output_type") == "stream":
        return out.get("text", "")
    data = out.get("data", {})
    if PREDICTION_MIME not in data:
        return ""
    text = data.get("text/plain", "")
    return ("".join(text) if isinstance(text, list) else str(text)).rstrip("\n") + "\n"


def _predicted_names(source: str) -> list[str]:
    """The names a predict cell assigns, read line by line (a cell a student broke still names its predictions)."""
    return re.findall(r"^\s*([A-Za-z_]\w*)\s*=", source, re.M)


def _measured(out: Path, a: Answer) -> str:
    """:func:`measured_beside` in the executed notebook of ``a``'s student and lab, under ``out``/executed."""
    import nbformat

    folder = Path(out) / "executed" / a.student
    for path in sorted(folder.glob("*.ipynb"), key=lambda p: p.name != a.notebook):
        try:
            nb = nbformat.read(path, as_version=4)
        except Exception:  # noqa: BLE001 - an unreadable run shows no measurement
            continue
        if any((m := meta(c)) and m["answer"] == a.question for c in nb.cells):
            return measured_beside(nb, a.question)
    return ""


def copied_flag(a: Answer, model: str) -> str:
    """How much of the model answer an explanation copies, as the flag for the instructor ("" when it does not, and
    for every prediction: many honest students predict the same number)."""
    if a.kind != "explain" or a.blank or not model:
        return ""
    share = prose.copied_share(model, a.answer)
    if not share:
        return ""
    if prose.words(a.answer) == prose.words(model):
        return "copied from the model answer, word for word"
    return f"copied from the model answer ({int(share * 100)} % of its words, in order)"  # 99.6 % is not 100 %


def write(out: Path, answers: list[Answer], prompts: dict[tuple[str, str], str] | None = None,
          rubrics: dict | None = None) -> tuple[Path, Path]:
    """``answers.csv`` (a row per student and question, score, items and comment columns to fill in) and
    ``answers.html`` (per question its model answer and rubric, then every student's answer, a prediction beside what
    their run measured, a blank one said to be 0, an explanation copied from the model answer flagged)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rubrics = rubrics if rubrics is not None else _course_rubrics(answers)
    for a in answers:
        if a.kind == "predict" and not a.measured:
            a.measured = _measured(out, a)
        a.copied = copied_flag(a, str(rubrics.get(a.notebook, {}).get(a.question, {}).get("model_answer") or ""))
    csv_path, html_path = out / ANSWERS_CSV, out / ANSWERS_HTML
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for a in answers:
            w.writerow([a.student, a.notebook, a.question, a.kind, a.points, int(a.blank),
                        "" if a.score is None else f"{a.score:g}", a.items, a.comment, _digest(a.answer), a.answer,
                        a.note, a.copied])
    html_path.write_text(_page(answers, prompts or {}, rubrics), encoding="utf-8")
    return csv_path, html_path


def _course_rubrics(answers: list[Answer]) -> dict:
    """Without a release's rubrics: the model answers of the course's own labs, for the questions asked."""
    record = {"notebooks": {}}
    for a in answers:
        record["notebooks"].setdefault(a.notebook, {"answers": []})["answers"].append(
            {"id": a.question, "kind": a.kind, "points": a.points})
    try:
        return default_rubrics(record)
    except Exception:  # noqa: BLE001 - a page without model answers is still one to read
        return {}


_CSS = ("body{font-family:sans-serif;max-width:75em;margin:auto}table{border-collapse:collapse;width:100%}"
        "td,th{border:1px solid #ccc;padding:.4em;vertical-align:top;text-align:left}pre{white-space:pre-wrap;margin:0}"
        ".blank{color:#a00}.model{background:#f3f8f3;padding:.5em}.copied{color:#a00;font-weight:bold;margin:0 0 .3em}")


def _page(answers: list[Answer], prompts: dict[tuple[str, str], str], rubrics: dict) -> str:
    by_q: dict[tuple[str, str], list[Answer]] = {}
    for a in answers:
        by_q.setdefault((a.notebook, a.question), []).append(a)
    parts = ["<!doctype html><meta charset='utf-8'><title>Answers to score</title>", f"<style>{_CSS}</style>",
             "<h1>Answers to score</h1><p>One table per question, its model answer and rubric above it. Score them in "
             "<code>answers.csv</code> beside this page: a <code>score</code>, or the rubric <code>items</code> earned "
             "(<code>a,c</code>), and a <code>comment</code> for the student. The rubric is "
             f"<code>{RUBRICS_FILE}</code> in the release folder, to edit. A blank answer is 0 points.</p>"]
    for (notebook, qid), rows in by_q.items():
        rubric = rubrics.get(notebook, {}).get(qid, {})
        parts += _question(notebook, qid, rows, prompts.get((notebook, qid)), rubric)
    return "\n".join(parts) + "\n"


def _question(notebook: str, qid: str, rows: list[Answer], prompt: str | None, rubric: dict) -> list[str]:
    """One question's part of answers.html."""
    esc = html.escape
    predict = rows[0].kind == "predict"
    blanks, copies = sum(a.blank for a in rows), sum(bool(a.copied) for a in rows)
    parts = [f"<h2>{esc(notebook)}: {esc(qid)} ({esc(rows[0].kind)}, {rows[0].points} point"
             f"{'s' if rows[0].points != 1 else ''}; {blanks} of {len(rows)} blank"
             f"{f'; {copies} copied from the model answer' if copies else ''})</h2>"]
    prompt = prompt or rubric.get("question")  # the release's, where no notebook is at hand (a merge)
    if prompt:
        parts.append(f"<blockquote><pre>{esc(prompt)}</pre></blockquote>")
    if rubric.get("model_answer"):
        parts.append(f"<div class='model'><b>Model answer</b><pre>{esc(rubric['model_answer'])}</pre></div>")
    if rubric.get("items"):
        parts.append("<p><b>Rubric</b></p><table><tr><th>item</th><th>points</th><th>criterion</th><th>comment</th></tr>"
                     + "".join(f"<tr><td>{esc(str(i['id']))}</td><td>{float(i['points']):g}</td>"
                               f"<td>{esc(str(i.get('criterion', '')))}</td><td>{esc(str(i.get('comment', '')))}</td></tr>"
                               for i in rubric["items"]) + "</table>")
    parts.append("<table><tr><th>student</th><th>answer</th>" + ("<th>measured in their run</th>" if predict else "")
                 + "<th>score</th><th>comment</th></tr>")
    for a in rows:
        flag = f"<p class='copied'>{esc(a.copied)}</p>" if a.copied else ""
        body = (f"<span class='blank'>{BLANK}{': ' + esc(a.note) if a.note and a.note != BLANK else ''}</span>"
                if a.blank else f"{flag}<pre>{esc(a.answer)}</pre>")
        measured = f"<td><pre>{esc(a.measured) or '(nothing printed)'}</pre></td>" if predict else ""
        parts.append(f"<tr><td>{esc(a.student)}</td><td>{body}</td>{measured}"
                     f"<td>{'' if a.score is None else f'{a.score:g}'}</td><td>{esc(a.comment)}</td></tr>")
    parts.append("</table>")
    return parts


def as_dicts(answers: list[Answer]) -> list[dict]:
    return [asdict(a) for a in answers]


__all__ = ["ANSWERS_CSV", "ANSWERS_HTML", "Answer", "BLANK", "KINDS", "PLACEHOLDER", "RUBRICS_FILE", "answer_cells",
           "as_dicts", "blank_answers", "collect", "collect_against", "copied_flag", "default_rubrics", "expected", "hand_score",
           "is_blank", "load_rubrics", "measured_beside", "merge_scores", "meta", "question_text", "read", "student_source",
           "write"]
