"""Feedback a student can read: their executed notebook, with each exercise's verdict beside its check cell.

    labkit grade submissions/ --out grades/ --feedback feedback/ [--hidden NAME ...]

One page per student and lab, ``feedback/<student>/<lab>.html``: at the top the lab's score after any late penalty
(the score before it beside), the deadline and how late the work came, the written answers' points, comments and
notes, and the limits the notebook ran under; then the notebook as the grader ran it (its figures too), and
after every check cell a box with the grader's verdict and the check's message (the grader's replayed verdict, not
what the cell itself printed). An open exercise (one whose check scores a passing answer: a modelled time, say) has
its class's leaderboard after that box: the passing scores, best first, by rank and score alone (no other student
is named), the student's own row marked "you". Each page is one file that can be sent alone: its math is MathML
written into the page (:func:`labkit.runner.standalone_exporter`), its figures are embedded, and it loads nothing.
:func:`write_zip` puts one page per student (all their labs) into a zip to upload.

An exercise named in ``hidden`` counts for the grade like any other, but its page shows neither the check cell's
output nor the check's message: only whether it passed, and "a hidden check failed" when it did not. A hidden part
(``labkit grade --hidden-part``: the check run again on inputs drawn apart) shows the same way, in a box of its own
after the public verdict, whose message and the cell's output stay.

The notebook is the student's, so the page keeps nothing that could run script on whoever opens it: outputs only
as text and images (no HTML, JavaScript or SVG), raw HTML in markdown only as plain tags without attributes, every
other tag shown as text; the messages are set as literal text. (nbconvert's own sanitiser would also escape the
paragraphs and headings of every markdown cell.)
"""

from __future__ import annotations

import html
import re
import zipfile
from pathlib import Path

from ..runner import standalone_exporter, without_injected
from . import exports

HIDDEN_FAILED = "a hidden check failed"


SAFE_OUTPUTS = ("text/plain", "image/png", "image/jpeg", "image/gif")
_PLAIN_TAG = re.compile(r"</?(?:br|p|div|span|b|i|em|strong|code|pre|sub|sup|hr|ul|ol|li|blockquote|table|thead|tbody|"
                        r"tr|td|th|h[1-6])\s*/?>", re.I)
_ANY_TAG = re.compile(r"<(?=[A-Za-z/!?])")


def safe_markdown(text: str) -> str:
    """Markdown whose raw HTML is only attribute-free plain tags; any other tag (script, img with onerror, iframe,
    a comment) is escaped, so it shows as text."""
    out, last = [], 0
    for m in _PLAIN_TAG.finditer(text):
        out.append(_ANY_TAG.sub("&lt;", text[last:m.start()]))
        out.append(m.group(0))
        last = m.end()
    out.append(_ANY_TAG.sub("&lt;", text[last:]))
    return "".join(out)


def safe_cells(nb) -> None:
    """The student's notebook made safe to open: markdown by :func:`safe_markdown`, outputs as text and images."""
    for cell in nb.cells:
        if cell.cell_type == "markdown" and not cell.metadata.get("labkit_feedback"):
            cell.source = safe_markdown(cell.source)
            cell.attachments = {}
        elif cell.cell_type == "raw":
            cell.cell_type, cell.source = "markdown", _fence(cell.source)
            cell.pop("attachments", None)
        elif cell.cell_type == "code":
            for out in cell.get("outputs", []):
                if "data" in out:
                    data = {k: v for k, v in out["data"].items() if k in SAFE_OUTPUTS}
                    out["data"] = data or {"text/plain": "(an output that is not text or an image)"}


def _fence(text: str) -> str:
    """``text`` as a fenced code block that no backtick run inside it can close: shown literally, never rendered."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def verdict_cell(exercise: str, passed: bool, message: str, hidden: bool, points: float | None = None,
                 score: float | None = None, cases=None):
    """The markdown cell put after a check cell: a quoted box with the verdict and the points it earned (``score``:
    a share of them, partial credit for the ``cases`` (passed, of them) of its check), and the message (as literal
    text) unless the check is hidden."""
    import nbformat

    from .notebook import shown_name

    earned = score if score is not None else (points if passed else 0)
    worth = "" if points is None else f", {_fmt(earned)} of {_points(points)}"
    if points is not None and not passed and earned and cases:
        worth += f" (partial credit: {cases[0]} of the check's {cases[1]} cases passed before it failed)"
    lines = [f"**{'✔ passed' if passed else '✘ failed'}**: exercise `{shown_name(exercise)}`"
             + (" (a hidden check)" if hidden else "") + worth]
    if not passed and hidden:
        lines += ["", f"{HIDDEN_FAILED}."]
    elif not passed:
        lines += ["", "What the grader's check said:", ""] + _fence(message).splitlines()
    cell = nbformat.v4.new_markdown_cell("\n".join("> " + line if line else ">" for line in lines))
    cell.metadata["labkit_feedback"] = True
    return cell


def leaderboard_cell(exercise: str, board, student: str, shown: int = 10):
    """The markdown cell put after an open exercise's verdict: its class's leaderboard (:func:`.scores.leaderboards`)
    as a small table of rank and score, the top ``shown`` and the student's own row below them, marked "you". No
    other student is named: the page goes to each student."""
    import nbformat

    from .notebook import shown_name

    column = _cell_text(f"{board.label} ({board.unit})" if board.unit else board.label)
    rank, n = board.rank_of(student), len(board.places)
    yours = f"yours ranks {rank} of {n}" if rank else "yours is not ranked (only a passing answer's score is)"
    better = "lower" if board.lower_is_better else "higher"
    lines = [f"**Class leaderboard** of `{shown_name(exercise)}`: {column}, {better} is better; {n} passing "
             f"answer{'' if n == 1 else 's'}, {yours}.", "", f"| rank | {column} | |", "|---:|---:|:---|"]
    for i in _board_rows(board, student, shown):
        place, value, who = board.places[i] if i is not None else ("…", None, None)
        lines.append(f"| {place} | {'' if value is None else f'{value:g}'} | {'**you**' if who == student else ''} |")
    cell = nbformat.v4.new_markdown_cell("\n".join(lines))
    cell.metadata["labkit_feedback"] = True
    return cell


def _board_rows(board, student: str, shown: int) -> list[int | None]:
    """The leaderboard's places a page shows: the top ``shown``, then (None standing for the gap) the student's own."""
    mine = next((i for i, (_, _, who) in enumerate(board.places) if who == student), None)
    rows: list[int | None] = list(range(min(shown, len(board.places))))
    if mine is not None and mine >= shown:
        rows += ([None] if mine > shown else []) + [mine]
    return rows


def _cell_text(text: str) -> str:
    """Literal text for a markdown table's cell: one line, no tag, no column break."""
    return _one_line(text).replace("|", "&#124;")


def summary_cell(student: str, notebook: str, entry: dict, data: dict, hidden_here: int):
    """The page's first cell: the lab's score after any late penalty, the deadline and how late it came, the exercises
    and the written answers with their comments, and how the notebook was run."""
    import nbformat

    limits = data.get("limits") or {}
    answers = entry.get("answers") or []
    lines = [f"# Feedback: {html.escape(notebook)}", f"**Student:** {html.escape(student)}  "]
    lines += _score_lines(entry)
    exercise_points = (f" ({_fmt(entry['exercise_score'])} of {_points(entry['exercise_points'])})"
                       if "exercise_points" in entry else "")
    lines += [f"**Exercises passed:** {entry.get('passed', 0)} of {entry.get('exercises', 0)}{exercise_points}"
              + (f" ({hidden_here} of them hidden checks: they count, their messages are not shown)" if hidden_here
                 else "") + "  "]
    if answers:
        lines += _answer_lines(answers, entry.get("answer_points", sum(a.get("points", 0) for a in answers)),
                               entry.get("answers_unscored"))
    lines += ["",
              f"Graded on the `{data.get('profile', 'quick')}` profile with labkit {data.get('labkit_version', '')}: "
              f"each cell was allowed {data.get('timeout_s', '?')} s; the notebook "
              + (("ran in a sandbox" + (f" with {limits['memory_mb']} MB of memory, {limits['processes']} processes "
                                        f"and {limits['cpu_seconds']} CPU seconds per process" if limits else ""))
                 if data.get("isolated") else "ran without a sandbox") + f" ({exports.isolation(data)})"
              + ". Below is your notebook as the grader ran it; after each check cell, the grader's verdict."]
    cell = nbformat.v4.new_markdown_cell("\n".join(lines))
    cell.metadata["labkit_feedback"] = True
    return cell


def _score_lines(entry: dict) -> list[str]:
    """The lab's score (after the late penalty, the score before it beside) and its deadline, time and penalty."""
    lines = []
    if "total" in entry:
        before = float(entry.get("score_before_penalty", entry["total"]))
        lines.append(f"**Score:** {_fmt(entry['total'])} of {_points(entry.get('points_possible', 0))}"
                     + (f" ({_fmt(before)} before the late penalty)" if abs(before - entry["total"]) > 1e-9 else "")
                     + (" so far: written answers are still to be read" if entry.get("answers_unscored") else "")
                     + "  ")
    late = entry.get("late") or {}
    if late.get("deadline"):
        when = (entry.get("submission") or {}).get("submitted_at")
        lines.append(f"**Deadline:** {_one_line(late['deadline'])}" + (f"; handed in {_one_line(when)}" if when else "")
                     + f": {_one_line(late.get('note', ''))}  ")
    return lines


def _answer_lines(answers: list[dict], points: float, unscored: int | None = None) -> list[str]:
    """The written answers' part of the summary: the points so far, then each question's score, comment and note. A
    blank answer is 0 points and says so; one not yet scored (``unscored``, grades.json's count) is still to be read."""
    from .scores import BLANK_NOTE

    blank = [a for a in answers if a.get("blank") and a.get("score") in (None, 0)]
    unread = len([a for a in answers if a.get("score") is None and not a.get("blank")]) if unscored is None else unscored
    got = sum(a.get("score") or 0 for a in answers)
    head = f"**Written answers:** {got:g} of {points:g} points"
    head += f" scored so far ({unread} of {len(answers)} still to be read)" if unread else ""
    head += f"; {len(blank)} left blank, 0 points each" if blank else ""
    lines = [head + "  "]
    for a in answers if any("question" in a for a in answers) else []:
        score = ("blank: 0 points" if a in blank else "still to be read" if a.get("score") is None
                 else f"{a['score']:g} of {_points(a.get('points', 0))}")
        note = a.get("note") if a.get("note") not in (None, "", BLANK_NOTE, "blank: 0 points") else ""
        comment = f": {_one_line(a['comment'])}" if a.get("comment") else ""
        lines.append(f"- question `{a.get('question', '?')}` ({a.get('kind', '?')}): {score}"
                     + (f" ({_one_line(note)})" if note else "") + comment)
    return lines


def _fmt(x) -> str:
    return f"{float(x):g}"


def _points(x) -> str:
    return f"{float(x):g} point{'' if float(x) == 1 else 's'}"


def _one_line(text: str) -> str:
    """An instructor's comment as one line of literal text in markdown."""
    return html.escape(" ".join(str(text).split())).replace("$", "&#36;").replace("`", "&#96;")


def feedback_notebook(nb, student: str, notebook: str, entry: dict, data: dict, hidden: set[str]):
    """The executed notebook with the summary at the top and a verdict after each check cell; a hidden check's
    cell has its outputs removed."""
    from .assign import exercises_in
    from .notebook import HIDDEN, is_secret

    nb = without_injected(nb)  # the grader's PROFILE cell: its machinery, not the student's notebook
    rows = {r["exercise"]: r for r in entry.get("results", [])}
    boards = _leaderboards(data)
    after: dict[int, list] = {}
    for i, name in exercises_in(nb):
        for part in (name, name + HIDDEN):
            row = rows.get(part)
            if row is None:
                continue
            secret = is_secret(part, hidden)
            if secret and part == name:
                nb.cells[i].outputs = []
            after.setdefault(i, []).extend(_boxes(row, secret, boards.get((notebook, part)), student))
    cells = []
    for i, cell in enumerate(nb.cells):
        cells.append(cell)
        cells += after.get(i, [])
    hidden_here = sum(1 for name in rows if is_secret(name, hidden))
    nb.cells = [summary_cell(student, notebook, entry, data, hidden_here)] + cells
    safe_cells(nb)
    return nb


def missing_notebook(student: str, notebook: str, entry: dict, data: dict, hidden: set[str]):
    """A page for a lab with no executed notebook (not handed in, or a file that could not be read): the rows."""
    import nbformat

    from .notebook import is_secret

    nb = nbformat.v4.new_notebook()
    nb.cells = [summary_cell(student, notebook, entry, data, 0)]
    boards = _leaderboards(data)
    for r in entry.get("results", []):
        nb.cells += _boxes(r, is_secret(r["exercise"], hidden), boards.get((notebook, r["exercise"])), student)
    return nb


def _boxes(row: dict, secret: bool, board, student: str) -> list:
    """The cells after a check cell for one row: its verdict, then its exercise's leaderboard where it has one (a
    hidden check's, never)."""
    cells = [verdict_cell(row["exercise"], bool(row["passed"]), row.get("message", ""), secret, row.get("points"),
                          row.get("score"), row.get("cases"))]
    if board is not None and not secret:
        cells.append(leaderboard_cell(row["exercise"], board, student))
    return cells


def _leaderboards(data: dict) -> dict:
    from .scores import leaderboards

    return leaderboards(data)


def write(data: dict, out: Path | str, grades_dir: Path | str, hidden: set[str] | None = None) -> list[Path]:
    """One self-contained HTML page per student and lab in ``out`` from a grading run's grades.json (``data``) and the
    executed notebooks beside it in ``grades_dir``/executed. Returns the pages written."""
    exporter = standalone_exporter()
    out = Path(out)
    pages = []
    for student, notebooks in sorted(data["students"].items()):
        folder = out / _safe(student)
        folder.mkdir(parents=True, exist_ok=True)
        for name in sorted(notebooks):
            body, _ = exporter.from_notebook_node(page_notebook(data, grades_dir, student, name, hidden))
            page = folder / (Path(name).stem + ".html")
            page.write_text(body, encoding="utf-8")
            pages.append(page)
    return pages


def page_notebook(data: dict, grades_dir: Path | str, student: str, name: str, hidden: set[str] | None = None):
    """The notebook a student's page for one lab shows: their executed notebook with the verdicts, or, where there
    is none (not handed in, unreadable), the rows alone."""
    import nbformat

    hidden = set(hidden or ())
    entry = data["students"][student][name]
    try:
        executed = nbformat.read(Path(grades_dir) / "executed" / student / name, as_version=4)
    except (OSError, ValueError):
        return missing_notebook(student, name, entry, data, hidden)
    return feedback_notebook(executed, student, name, entry, data, hidden)


def write_zip(data: dict, zip_path: Path | str, grades_dir: Path | str, hidden: set[str] | None = None) -> Path:
    """``labkit feedback --zip``: one zip holding one self-contained page per student, ``<student>.html``, with every
    lab graded for them one after the other, to upload to the course's site. Returns the zip's path."""
    import nbformat

    exporter = standalone_exporter()
    zip_path = Path(zip_path)
    zip_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = zip_path.with_name(zip_path.name + ".part")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for student, notebooks in sorted(data["students"].items()):
            pages = [page_notebook(data, grades_dir, student, name, hidden) for name in sorted(notebooks)]
            nb = nbformat.v4.new_notebook(cells=[c for page in pages for c in page.cells])
            body, _ = exporter.from_notebook_node(nb)
            z.writestr(_safe(student) + ".html", body)
    tmp.replace(zip_path)  # whole or not at all
    return zip_path


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.@" else "_" for c in name) or "_"
