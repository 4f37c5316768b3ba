"""A report safe to publish: the exercises as students get them, the instructor's run's outputs beside them; the
solution code only with solutions=True (``labkit report --solutions``)."""

import json

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


# a lab that asks for a prediction: its model answer (4,321 kB and "ring") is what the published copy must not show
PREDICT = "predicted_kB = 4321  # kB rank 0 sends\npredicted_faster = 'ring'  # the faster allreduce"
MEASURE = ("import matplotlib.pyplot as plt\nsent, faster = 1234.0, 'naive'\nprint(f'rank 0 sent {sent:.0f} kB')\n"
           "plt.bar(['sent'], [sent])\nplt.show()")
COMPARE = ("from labkit.questions import compare\nfrom labkit.claims import claim\ncompare(predicted_kB, sent, 'kB', 'sent')\n"
           "compare(predicted_faster, faster, what='faster')\n"
           "claim('the model prediction is within 4x of the measurement', 0.25 < sent / predicted_kB < 4, f'{sent:.0f} kB')")
SHOWN = ("sent: your prediction: (yours to make); measured 1,234 kB.",
         "faster: your prediction: (yours to make); it was 'naive'.")


def _predicting_lab(path):
    """:func:`_lab` with a prediction before the experiment, the experiment printing and plotting its measurement, and
    the comparison of the two, beside a claim that rests on the model prediction."""
    _lab(path)
    nb = nbformat.read(path, as_version=4)
    nb.cells += [new_markdown_cell("**Question 2.** How many kB does rank 0 send, and which is faster?"),
                 new_code_cell(PREDICT, metadata={"labkit": {"answer": "98-kB", "kind": "predict", "points": 1}}),
                 new_code_cell(MEASURE), new_code_cell(COMPARE)]
    nbformat.write(nb, path)
    return path


def _outputs(nb) -> str:
    """Every output of the notebook's code cells, as JSON."""
    return "\n".join(json.dumps(c.get("outputs", [])) for c in nb.cells if c.cell_type == "code")


def _no_prediction_in(text: str) -> None:
    for value in ("4321", "4,321", "'ring'", "&#x27;ring", "&#39;ring", "you predicted", "than your prediction"):
        assert value not in text, f"the model prediction ({value!r}) is in the published copy"


def test_published_shows_the_measurement_beside_no_model_prediction(tmp_path, monkeypatch):
    import IPython.display

    from labkit import questions

    shown = []  # what compare displays in a kernel
    monkeypatch.setattr(questions, "_shell", lambda: object())
    monkeypatch.setattr(IPython.display, "display", lambda bundle, raw=False: shown.append(bundle))
    questions.compare(4321, 1234.0, "kB", "sent")
    questions.compare("ring", "naive", what="faster")
    nb = nbformat.read(_predicting_lab(tmp_path / "98_lab.ipynb"), as_version=4)
    nb.cells[7].outputs = [new_output("execute_result", data={"text/plain": "4321"}, execution_count=7)]  # were it to
    nb.cells[8].outputs = [new_output("stream", name="stdout", text="rank 0 sent 1234 kB\n"),
                           new_output("display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})]
    nb.cells[9].outputs = [new_output("display_data", data=bundle) for bundle in shown]
    assert "you predicted 4,321 kB; measured 1,234 kB: the measurement is 3.5x smaller" in _outputs(nb)
    public = report.published(nb)
    _no_prediction_in(_outputs(public))
    assert public.cells[7].outputs == [] and public.cells[8].outputs == nb.cells[8].outputs  # the figure stays
    assert [out["data"] for out in public.cells[9].outputs] == [{"text/plain": line} for line in SHOWN]
    assert "4321" in nb.cells[7].source and "you predicted 4,321 kB" in _outputs(nb)  # the run itself as it was


@pytest.mark.notebooks
@pytest.mark.slow
def test_the_report_publishes_the_measurements_and_keeps_the_model_predictions_for_the_instructor(tmp_path):
    notebooks = tmp_path / "nbs"
    notebooks.mkdir()
    _predicting_lab(notebooks / "98_lab.ipynb")
    (result,), _ = report.run(out=tmp_path / "pub", notebooks=notebooks, timeout=60, progress=False, fetch=False)
    assert result.ok, result.error
    assert [c["holds"] for c in result.claims] == [True]  # the kernel ran on the model prediction
    public = nbformat.read(result.executed, as_version=4)
    _no_prediction_in(_outputs(public))
    _no_prediction_in(result.html.read_text())
    text = _outputs(public)
    assert all(line in text for line in SHOWN) and "rank 0 sent 1234 kB" in text and "image/png" in text
    assert "predicted_kB = ...  # kB rank 0 sends" in nbformat.writes(public)
    (result,), _ = report.run(out=tmp_path / "own", notebooks=notebooks, timeout=60, progress=False, fetch=False,
                              solutions=True)
    assert "you predicted 4,321 kB; measured 1,234 kB" in _outputs(nbformat.read(result.executed, as_version=4))


def test_the_labs_show_a_model_prediction_only_through_compare():
    """What publishing hides is compare's line: a lab that printed, plotted or claimed a prediction any other way would
    publish the model answer."""
    import ast

    from labkit import handout, runner

    elsewhere = []
    for path in runner.find_notebooks():
        nb = nbformat.read(path, as_version=4)
        names = {t.id for c in nb.cells if (m := handout.answer_meta(c)) and m["kind"] == "predict"
                 for s in handout.assignments(c.source) for t in s.targets}
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or handout.answer_meta(cell):
                continue
            tree = ast.parse("\n".join("" if line.lstrip().startswith(("%", "!")) else line
                                       for line in cell.source.splitlines()))
            passed = {id(call.args[0]) for call in ast.walk(tree) if isinstance(call, ast.Call) and call.args
                      and getattr(call.func, "id", getattr(call.func, "attr", "")) == "compare"}
            elsewhere += [f"{path.name} cell {i}: {n.id}" for n in ast.walk(tree)
                          if isinstance(n, ast.Name) and n.id in names and id(n) not in passed]
    assert not elsewhere, "a prediction used other than as compare's first argument: " + "; ".join(elsewhere)
