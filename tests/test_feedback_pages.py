"""Feedback pages that travel: one file each, math as MathML written into the page, the run's figures embedded, no
machinery cell, and one file per student in a zip to upload."""

import json
import re
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from labkit import runner
from labkit.grading import feedback

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def _class(tmp_path, labs=("01_serial_backprop.ipynb",)):
    """grades.json of one student, bo, and bo's executed notebooks: math in the text, a figure, the grader's cell."""
    students = {"bo": {}}
    for lab in labs:
        params = new_code_cell("PROFILE = 'quick'")
        params.metadata["tags"] = ["parameters"]
        injected = new_code_cell("# Parameters injected by labkit report\nPROFILE = 'quick'")
        injected.metadata["tags"] = ["injected-parameters"]
        nb = new_notebook(cells=[
            new_markdown_cell(f"# {lab}\n\nThe ring sends $2\\frac{{p-1}}{{p}}N$ elements.\n\n$$\\sigma'(z) = "
                              "\\sigma(z)(1 - \\sigma(z))$$"),
            params, injected,
            new_code_cell("plt.plot(losses)", outputs=[new_output("display_data", data={
                "image/png": PNG, "text/plain": "<Figure size 640x480 with 1 Axes>"})]),
            new_code_cell("check.backprop(backprop)", outputs=[])])
        folder = tmp_path / "grades" / "executed" / "bo"
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, folder / lab)
        students["bo"][lab] = {
            "passed": 1, "exercises": 1,
            "results": [{"student": "bo", "notebook": lab, "exercise": "backprop", "passed": True, "message": ""}],
            "answers": [{"question": "why_sigmoid", "kind": "explain", "points": 2, "blank": False, "score": 1.5,
                         "comment": "Right about saturation; the $ cost of exp is not the reason."},
                        {"question": "predicted_speedup", "kind": "predict", "points": 1, "blank": True, "score": 0}],
            "answer_points": 3}
    return {"profile": "quick", "timeout_s": 60, "labkit_version": "0", "isolated": True, "limits": {},
            "students": students}


def test_a_page_is_one_file_with_its_math_as_mathml_its_figures_and_no_injected_cell(tmp_path):
    (page,) = feedback.write(_class(tmp_path), tmp_path / "fb", tmp_path / "grades")
    assert sorted(p.name for p in (tmp_path / "fb").rglob("*")) == ["01_serial_backprop.html", "bo"]  # nothing beside
    text = page.read_text()
    assert text.count("<math") == 2 and "<mfrac>" in text and "$2\\frac" not in text and "$$" not in text
    assert "mathjax" not in text.lower() and not re.search(r"<script[^>]* src=", text)
    assert not re.search(r"""(?:src|href)=["'](?:https?:|//|[^"'#d])""", text), "the page links to a file or a site"
    assert f"data:image/png;base64,{PNG}" in text  # the run's figure, in the page
    assert "Parameters injected" not in text and text.count("PROFILE") == 1  # the student's own cell stays
    assert "Written answers:</strong> 1.5 of 3 points; 1 left blank, 0 points each" in text
    assert "<code>why_sigmoid</code> (explain): 1.5 of 2 points: Right about saturation; the &amp;#36; cost" not in text
    assert "(explain): 1.5 of 2 points: Right about saturation; the $ cost of exp is not the reason." in text
    assert "<code>predicted_speedup</code> (predict): blank: 0 points" in text
    assert "still to be read" not in text


def test_unscored_answers_are_still_to_be_read_and_blank_ones_are_not():
    lines = feedback._answer_lines([{"question": "a", "kind": "explain", "points": 2, "blank": False, "score": None},
                                    {"question": "b", "kind": "explain", "points": 1, "blank": True, "score": None}], 3)
    assert lines[0] == "**Written answers:** 0 of 3 points scored so far (1 of 2 still to be read); 1 left blank, 0 " \
                       "points each  "
    assert lines[1:] == ["- question `a` (explain): still to be read", "- question `b` (explain): blank: 0 points"]


def test_the_page_shows_the_late_penalty_the_total_each_rows_points_and_each_answers_comment_and_note(tmp_path):
    data = _class(tmp_path)
    entry = data["students"]["bo"]["01_serial_backprop.ipynb"]
    entry["results"] += [{"student": "bo", "notebook": "01_serial_backprop.ipynb", "exercise": "output_error",
                          "passed": False, "message": "wrong sign", "points": 2.0}]
    entry["results"][0]["points"] = 1.5
    entry["answers"] += [{"question": "why_batches", "kind": "explain", "points": 2, "blank": False, "score": None},
                         {"question": "why_ring", "kind": "explain", "points": 1, "blank": True, "score": 0,
                          "note": "its answer cell is missing from the notebook (deleted?)"}]
    entry.update({"answer_points": 6, "answers_unscored": 1, "exercise_points": 3.5, "exercise_score": 1.5,
                  "points_possible": 9.5, "score_before_penalty": 3.0, "total": 2.4,
                  "submission": {"submitted_at": "2026-10-04T10:00:00+02:00"},
                  "late": {"deadline": "2026-10-02T23:59:00+02:00", "days_late": 2, "percent": 20.0,
                           "note": "2 days late: -20 %"}})
    nb = feedback.page_notebook(data, tmp_path / "grades", "bo", "01_serial_backprop.ipynb")
    top = nb.cells[0].source
    assert "**Score:** 2.4 of 9.5 points (3 before the late penalty) so far: written answers are still to be read" in top
    assert ("**Deadline:** 2026-10-02T23:59:00+02:00; handed in 2026-10-04T10:00:00+02:00: 2 days late: -20 %"
            in top)
    assert "**Exercises passed:** 1 of 1 (1.5 of 3.5 points)" in top
    assert "1.5 of 6 points scored so far (1 of 4 still to be read); 2 left blank" in top  # the blank ones apart
    assert ("- question `why_ring` (explain): blank: 0 points (its answer cell is missing from the notebook "
            "(deleted?))") in top
    assert "- question `why_sigmoid` (explain): 1.5 of 2 points: Right about saturation" in top
    verdicts = [c.source for c in nb.cells if c.metadata.get("labkit_feedback")][1:]
    assert verdicts == ["> **✔ passed**: exercise `backprop`, 1.5 of 1.5 points"]  # its check cell's box
    missing = feedback.missing_notebook("bo", "01_serial_backprop.ipynb", entry, data, set())
    assert [c.source.splitlines()[0] for c in missing.cells[1:]] == [
        "> **✔ passed**: exercise `backprop`, 1.5 of 1.5 points", "> **✘ failed**: exercise `output_error`, 0 of 2 points"]


def test_the_zip_holds_one_page_per_student_with_every_lab(tmp_path):
    data = _class(tmp_path, labs=("01_serial_backprop.ipynb", "07_ring_allreduce.ipynb"))
    data["students"]["cy"] = {"07_ring_allreduce.ipynb": {"passed": 0, "exercises": 1, "results": [
        {"student": "cy", "notebook": "07_ring_allreduce.ipynb", "exercise": "ring_allreduce", "passed": False,
         "message": "notebook not handed in"}]}}
    path = feedback.write_zip(data, tmp_path / "up" / "feedback.zip", tmp_path / "grades")
    with zipfile.ZipFile(path) as z:
        assert sorted(z.namelist()) == ["bo.html", "cy.html"]
        bo, cy = z.read("bo.html").decode(), z.read("cy.html").decode()
    assert "Feedback: 01_serial_backprop.ipynb" in bo and "Feedback: 07_ring_allreduce.ipynb" in bo
    assert bo.count(f"data:image/png;base64,{PNG}") == 2 and bo.count("<mfrac>") == 2
    assert "notebook not handed in" in cy and "Feedback: 01" not in cy
    assert not list(path.parent.glob("*.part"))


@pytest.mark.notebooks
def test_the_figures_a_students_run_draws_reach_the_executed_notebook_and_the_page(tmp_path):
    from labkit.grading import grade

    drawn = new_notebook(cells=[new_markdown_cell("# A figure"), new_code_cell(
        "import matplotlib.pyplot as plt\nplt.plot([3, 1, 2])\nplt.title('losses')")])
    (tmp_path / "subs" / "bo").mkdir(parents=True)
    nbformat.write(drawn, tmp_path / "subs" / "bo" / "draws.ipynb")
    _, _, json_path = grade.grade(tmp_path / "subs", tmp_path / "out", progress=False, isolate=False)
    executed = nbformat.read(tmp_path / "out" / "executed" / "bo" / "draws.ipynb", as_version=4)
    (cell,) = [c for c in executed.cells if "plt.plot" in c.source]
    figures = [o["data"]["image/png"] for o in cell.outputs if "image/png" in o.get("data", {})]
    assert len(figures) == 1, cell.outputs  # the inline backend, not Agg, which keeps none
    (page,) = feedback.write(json.loads(json_path.read_text()), tmp_path / "fb", tmp_path / "out")
    assert f"data:image/png;base64,{figures[0].strip()}" in page.read_text()


@pytest.mark.parametrize("tex", [r"\href{javascript:alert(1)}{x}", r"\text{<script>alert(1)</script>}",
                                 r"\text{<img src=x onerror=alert(2)>}"])
def test_math_keeps_no_link_and_no_tag_whatever_the_tex(tex):
    out = runner.tex_to_mathml(tex)
    assert out.startswith(("<math", "<code>")) and "href" not in out and "<script" not in out and "<img" not in out


def test_tex_the_converter_cannot_read_is_shown_as_code():
    assert runner.tex_to_mathml(r"\frac{1}{") == r"<code>\frac{1}{</code>"
    assert runner.tex_to_mathml("a &lt; b").count("&lt;") == 1  # the markdown parser's escape undone, then redone
    assert runner.tex_to_mathml("x", display=True).startswith("<span class='labkit-math'><math display=\"block\"")


@pytest.mark.browser
@pytest.mark.slow
def test_a_page_sent_alone_shows_typeset_math_and_its_figure_in_chromium(tmp_path):
    """The page copied alone into an empty folder, opened in Chromium with every request refused: its formulas are
    laid out as math (a fraction's numerator above its denominator), no raw TeX shows, the figure is drawn, and the page
    asked for nothing."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_browser import _chromium, _missing

    chromium = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright is not installed (pip install -e '.[test]')")
    (page_path,) = feedback.write(_class(tmp_path), tmp_path / "fb", tmp_path / "grades")
    alone = tmp_path / "sent" / "page.html"
    alone.parent.mkdir()
    alone.write_bytes(page_path.read_bytes())
    asked = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.route("**/*", lambda r: r.continue_() if r.request.url == alone.as_uri() else (
                asked.append(r.request.url), r.abort()))
            page.goto(alone.as_uri())
            body = page.inner_text("body")
            assert "\\frac" not in body and "$" not in body.split("Written answers")[0]
            top, bottom = page.eval_on_selector("mfrac", "e => [e.children[0].getBoundingClientRect().bottom, "
                                                         "e.children[1].getBoundingClientRect().top]")
            assert top <= bottom, f"the numerator ends at {top} px, the denominator starts at {bottom}: not math"
            drawn = page.eval_on_selector("img[src^='data:image/png']", "e => e.complete && e.naturalWidth")
            assert drawn == 1
        finally:
            browser.close()
    assert asked == [], f"the page asked for {asked}"


def _timed(student, us, passed=True, lab="01_serial_backprop.ipynb"):
    return {"student": student, "notebook": lab, "exercise": "backprop", "passed": passed, "message": "m",
            "performance": {"label": "modelled time", "value": us, "unit": "µs", "lower_is_better": True}}


def _board(page) -> list[str]:
    (cell,) = [c for c in page.cells if c.source.startswith("**Class leaderboard**")]
    return cell.source.splitlines()


def test_an_open_exercise_shows_the_class_leaderboard_by_rank_and_score_naming_no_one_but_you(tmp_path):
    """bo's 30 µs is 13th of 13 passing answers: the top 10 (two tied first), a gap, then bo's own row; the other
    students, and the failed answer's 1 µs, are nowhere on bo's page."""
    lab = "01_serial_backprop.ipynb"
    data = _class(tmp_path)
    data["students"]["bo"][lab]["results"] = [_timed("bo", 30.0)]
    rivals = {f"rival_{k:02d}": 10.0 + max(0, k - 1) for k in range(12)}  # rival_00 and rival_01 tie at 10 µs
    for name, us in [*rivals.items(), ("rival_failed", 1.0)]:
        data["students"][name] = {lab: {"passed": 1, "exercises": 1,
                                        "results": [_timed(name, us, passed=name != "rival_failed")]}}
    page = feedback.page_notebook(data, tmp_path / "grades", "bo", lab)
    lines = _board(page)
    assert lines[0] == ("**Class leaderboard** of `backprop`: modelled time (µs), lower is better; 13 passing answers, "
                        "yours ranks 13 of 13.")
    assert lines[2:5] == ["| rank | modelled time (µs) | |", "|---:|---:|:---|", "| 1 | 10 |  |"]
    assert lines[5:7] == ["| 1 | 10 |  |", "| 3 | 11 |  |"] and len(lines) == 4 + 10 + 2
    assert lines[-2:] == ["| … |  |  |", "| 13 | 30 | **you** |"]
    text = feedback.write(data, tmp_path / "fb", tmp_path / "grades")[0].read_text()
    assert "rival_" not in text and "<table>" in text and "| 1 | 1 |  |" not in lines  # nor the failed 1 µs
    top = _board(feedback.page_notebook(data, tmp_path / "grades", "rival_00", lab))
    assert top[4:6] == ["| 1 | 10 | **you** |", "| 1 | 10 |  |"] and "…" not in "\n".join(top) and len(top) == 14
    failed = _board(feedback.page_notebook(data, tmp_path / "grades", "rival_failed", lab))
    assert failed[0].endswith("yours is not ranked (only a passing answer's score is).") and "**you**" not in "\n".join(failed)
    assert not [c for c in feedback.page_notebook(data, tmp_path / "grades", "bo", lab, hidden={"backprop"}).cells
                if c.source.startswith("**Class leaderboard**")]  # a hidden check shows no scores
