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
those scores (:func:`merge_scores`) and adds them to ``grades.json``. The machine never scores an answer.
"""

from __future__ import annotations

import ast
import csv
import hashlib
import html
from dataclasses import asdict, dataclass
from pathlib import Path

KINDS = ("predict", "explain")
PLACEHOLDER = "_Your answer here._"
ANSWERS_CSV, ANSWERS_HTML = "answers.csv", "answers.html"


def meta(cell) -> dict | None:
    """The answer cell's labkit metadata, or None for any other cell."""
    m = cell.get("metadata", {}).get("labkit", {})
    return m if isinstance(m, dict) and "answer" in m else None


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


def _assignments(source: str, where: str = "the cell") -> list[ast.Assign]:
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise ValueError(f"{where}: not valid Python ({e.msg}, line {e.lineno})") from None
    if not tree.body or not all(isinstance(s, ast.Assign) and all(isinstance(t, ast.Name) for t in s.targets)
                                for s in tree.body):
        raise ValueError(f"{where}: a predict cell holds only assignments of names, `predicted_x = 3.5  # comment`")
    return tree.body


def student_source(cell) -> str:
    """The answer cell as handed out: a predict cell's values replaced by ``...`` (its names and comments kept), an
    explain cell's text by :data:`PLACEHOLDER`."""
    m = meta(cell)
    if m is None:
        return cell.source
    if m["kind"] == "explain":
        return PLACEHOLDER
    lines = cell.source.splitlines()
    for stmt in reversed(_assignments(cell.source)):
        first, last = stmt.lineno - 1, stmt.end_lineno - 1
        head = lines[first][:stmt.targets[-1].end_col_offset]  # the names, up to the last "="
        tail = lines[last][stmt.end_col_offset:]  # a comment after the value (its brackets go with it)
        lines[first:last + 1] = [head + " = ..." + tail]
    return "\n".join(lines)


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


FIELDS = ("student", "notebook", "question", "kind", "points", "blank", "score", "answer_sha", "answer", "note")


def merge_scores(answers: list[Answer], previous_csv: Path) -> list[str]:
    """Take the scores an instructor wrote into an earlier ``answers.csv`` (same student, notebook and question)
    into ``answers``; return a warning for each score whose answer has changed since (it is dropped: read it again)
    and for each score out of range."""
    previous_csv = Path(previous_csv)
    if not previous_csv.is_file():
        return []
    warnings = []
    with open(previous_csv, newline="", encoding="utf-8") as f:
        rows = {(r.get("student"), r.get("notebook"), r.get("question")): r for r in csv.DictReader(f)}
    for a in answers:
        row = rows.get((a.student, a.notebook, a.question))
        if not row or not (row.get("score") or "").strip():
            continue
        try:
            score = float(row["score"])
        except ValueError:
            warnings.append(f"{a.student} / {a.question}: score {row['score']!r} is not a number; left unscored")
            continue
        if row.get("answer_sha") and row["answer_sha"] != _digest(a.answer):
            warnings.append(f"{a.student} / {a.question}: the answer changed since it was scored; score it again")
            continue
        if not 0 <= score <= a.points:
            warnings.append(f"{a.student} / {a.question}: score {score:g} is outside 0..{a.points}; left unscored")
            continue
        a.score = score
    return warnings


def write(out: Path, answers: list[Answer], prompts: dict[tuple[str, str], str] | None = None) -> tuple[Path, Path]:
    """``answers.csv`` (a row per student and question, a score column to fill in) and ``answers.html`` (per
    question, every student's answer, blank ones said to be blank)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    csv_path, html_path = out / ANSWERS_CSV, out / ANSWERS_HTML
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for a in answers:
            w.writerow([a.student, a.notebook, a.question, a.kind, a.points, int(a.blank),
                        "" if a.score is None else f"{a.score:g}", _digest(a.answer), a.answer, a.note])
    html_path.write_text(_page(answers, prompts or {}), encoding="utf-8")
    return csv_path, html_path


def _page(answers: list[Answer], prompts: dict[tuple[str, str], str]) -> str:
    esc = html.escape
    by_q: dict[tuple[str, str], list[Answer]] = {}
    for a in answers:
        by_q.setdefault((a.notebook, a.question), []).append(a)
    parts = ["<!doctype html><meta charset='utf-8'><title>Answers to score</title>",
             "<style>body{font-family:sans-serif;max-width:60em;margin:auto}table{border-collapse:collapse;width:100%}"
             "td,th{border:1px solid #ccc;padding:.4em;vertical-align:top;text-align:left}pre{white-space:pre-wrap;margin:0}"
             ".blank{color:#a00}</style>",
             "<h1>Answers to score</h1><p>One table per question. Score them in the <code>score</code> column of "
             "<code>answers.csv</code> beside this page; the next <code>labkit grade</code> into the same folder "
             "keeps the scores and adds them to <code>grades.json</code>.</p>"]
    for (notebook, qid), rows in by_q.items():
        blanks = sum(a.blank for a in rows)
        parts.append(f"<h2>{esc(notebook)}: {esc(qid)} ({esc(rows[0].kind)}, {rows[0].points} point"
                     f"{'s' if rows[0].points != 1 else ''}; {blanks} of {len(rows)} blank)</h2>")
        if prompts.get((notebook, qid)):
            parts.append(f"<blockquote><pre>{esc(prompts[(notebook, qid)])}</pre></blockquote>")
        parts.append("<table><tr><th>student</th><th>answer</th><th>score</th></tr>")
        for a in rows:
            body = (f"<span class='blank'>blank{': ' + esc(a.note) if a.note else ''}</span>" if a.blank
                    else f"<pre>{esc(a.answer)}</pre>")
            parts.append(f"<tr><td>{esc(a.student)}</td><td>{body}</td>"
                         f"<td>{'' if a.score is None else f'{a.score:g}'}</td></tr>")
        parts.append("</table>")
    return "\n".join(parts) + "\n"


def as_dicts(answers: list[Answer]) -> list[dict]:
    return [asdict(a) for a in answers]


__all__ = ["ANSWERS_CSV", "ANSWERS_HTML", "Answer", "KINDS", "PLACEHOLDER", "answer_cells", "as_dicts", "collect",
           "collect_against", "expected", "is_blank", "merge_scores", "meta", "question_text", "student_source",
           "write"]
