"""A report safe to publish: the exercises as students get them, the instructor's run's outputs beside them; the
solution code only with solutions=True (``labkit report --solutions``)."""

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from labkit import report

SOLVED = "def speedup(t1, tp):\n    ### BEGIN SOLUTION\n    return t1 / tp  # THE SOLUTION\n    ### END SOLUTION\n"


def _lab(path):
    """A lab of the course's shape: an exercise with its solution, its use printing a number, and a question whose
    answer cell holds the model answer."""
    params = new_code_cell("PROFILE = 'quick'")
    params.metadata["tags"] = ["parameters"]
    model = new_markdown_cell("THE MODEL ANSWER: the serial part bounds it.")
    model.metadata["labkit"] = {"answer": "why_bound", "kind": "explain", "points": 2}
    nb = new_notebook(cells=[new_markdown_cell("# Lab 98\n\nSpeedup is $S = T_1 / T_p$."), params,
                             new_code_cell(SOLVED), new_code_cell("print('speedup', speedup(12.0, 4.0))"),
                             new_markdown_cell("**Question 1.** Why is the speedup bounded?"), model])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_published_stubs_the_solutions_and_the_model_answers_and_keeps_the_outputs(tmp_path):
    nb = nbformat.read(_lab(tmp_path / "98_lab.ipynb"), as_version=4)
    nb.cells[3].outputs = [new_output("stream", name="stdout", text="speedup 3.0\n")]
    shown = report.published(nb)
    text = nbformat.writes(shown)
    assert "THE SOLUTION" not in text and "### BEGIN SOLUTION" not in text and "THE MODEL ANSWER" not in text
    assert "def speedup(t1, tp):\n    raise NotImplementedError" in shown.cells[2].source
    assert shown.cells[3].outputs[0]["text"] == "speedup 3.0\n" and shown.cells[5].source == "_Your answer here._"
    assert "THE SOLUTION" in nb.cells[2].source  # the executed notebook itself is left as it was


def test_unpaired_markers_are_refused_rather_than_published(tmp_path):
    nb = nbformat.read(_lab(tmp_path / "98_lab.ipynb"), as_version=4)
    nb.cells[2].source = "### BEGIN SOLUTION\nsecret = 1\n"
    with pytest.raises(ValueError, match="cell 2: unpaired solution marker"):
        report.published(nb)


@pytest.mark.notebooks
@pytest.mark.slow
def test_the_report_publishes_no_solution_code_unless_asked(tmp_path):
    notebooks = tmp_path / "nbs"
    notebooks.mkdir()
    _lab(notebooks / "98_lab.ipynb")
    (result,), page = report.run(out=tmp_path / "pub", notebooks=notebooks, timeout=60, progress=False, fetch=False)
    assert result.ok, result.error
    for path in (result.html, result.executed, page):
        text = path.read_text()
        assert "THE SOLUTION" not in text and "BEGIN SOLUTION" not in text and "THE MODEL ANSWER" not in text
    html = result.html.read_text()
    assert "speedup 3.0" in html and "NotImplementedError" in html  # the run's output beside the stub
    assert "Parameters injected" in result.executed.read_text()  # the record of the run keeps what it ran with
    (result,), _ = report.run(out=tmp_path / "own", notebooks=notebooks, timeout=60, progress=False, fetch=False,
                              solutions=True)
    assert "THE SOLUTION" in result.html.read_text() and "THE MODEL ANSWER" in result.executed.read_text()
