import subprocess
import sys

import nbformat
import pytest
from conftest import busy_loops

from labkit import cli, report, runner
from labkit.labs import NOTEBOOKS, is_draft
from labkit.machine import usable_cores


def make_nb(path, *sources, params="PROFILE = 'quick'"):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cells = [nbformat.v4.new_markdown_cell(f"# Title of {path.stem}")]
    p = nbformat.v4.new_code_cell(params)
    p.metadata["tags"] = ["parameters"]
    cells.append(p)
    cells += [nbformat.v4.new_code_cell(s) for s in sources]
    nb.cells = cells
    nbformat.write(nb, path)
    return path


@pytest.fixture
def nbdir(tmp_path):
    d = tmp_path / "nbs"
    d.mkdir()
    make_nb(d / "01_good.ipynb",
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.title(PROFILE)\nplt.show()",
            "from labkit.claims import record\nrecord('answer', 42.0, 's', 'a note')\nrecord('acc', 0.9512, '%')",
            "from labkit.claims import claim\nclaim('two is more than one', 2 > 1, '2 and 1')\n"
            "claim('the text is right here', 1 > 2, '1 and 2')")
    make_nb(d / "02_bad.ipynb", "raise ValueError('deliberate failure in cell 2')", "print('never runs')")
    make_nb(d / "03_slow.ipynb", "import time\ntime.sleep(60)")
    (d / "scratch.ipynb").write_text("{}")  # not a numbered lab: ignored
    return d


@pytest.mark.notebooks
@pytest.mark.slow
def test_report_runs_all_collects_and_reports_failures(nbdir, tmp_path):
    out = tmp_path / "out"
    results, page = report.run(profile="full", out=out, notebooks=nbdir, timeout=5, progress=False, fetch=False)
    good, bad, slow = results
    assert [r.name for r in results] == ["01_good.ipynb", "02_bad.ipynb", "03_slow.ipynb"]
    assert good.ok and len(good.figures) == 1 and good.title == "Title of 01_good"
    assert [m["name"] for m in good.metrics] == ["answer", "acc"] and good.metrics[0]["value"] == 42.0
    assert [(c["statement"], c["holds"]) for c in good.claims] == [("two is more than one", True),
                                                                   ("the text is right here", False)]
    assert not bad.ok and "deliberate failure in cell 2" in bad.error
    assert not slow.ok and "longer than the 5 s limit" in slow.error
    executed = nbformat.read(out / "01_good.ipynb", as_version=4)
    injected = [c for c in executed.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and "PROFILE = 'full'" in injected[0].source
    html = page.read_text()
    assert "data:image/png;base64," in html and "deliberate failure in cell 2" in html
    assert "answer: 42 s" in html and "acc: 95.12%" in html and "1/3 notebooks passed" in html
    exported = (out / "01_good.html").read_text()  # each executed notebook, for a browser, linked from the page
    assert good.html == out / "01_good.html" and "href='01_good.html'" in html
    assert "<html" in exported and "data:image/png;base64," in exported and "deliberate" not in exported
    text = report.summary(results, page)
    assert "FAIL 02_bad.ipynb" in text and "ValueError: deliberate failure in cell 2" in text
    assert "\ndata: mnist: " in text  # which data the numbers came from, in the terminal too
    assert "claims of the labs' text checked on this run: 1 of 2 held" in text
    assert "not held: 01: the text is right here (1 and 2)" in text
    assert "✘ not in this run:</span> the text is right here" in html


@pytest.mark.notebooks
@pytest.mark.slow
def test_cli_report_exit_code(nbdir, tmp_path, capsys):
    # 01 runs, but one of its claims does not hold: not a report to publish, unless the run is exploratory
    assert cli.main(["report", "--notebooks", str(nbdir), "--only", "01", "--out", str(tmp_path / "o")]) == 1
    out = capsys.readouterr().out
    assert "1/1 notebooks passed" in out and "exit 1: 1 claim of the labs' text did not hold" in out
    assert cli.main(["report", "--notebooks", str(nbdir), "--only", "01", "--out", str(tmp_path / "o"),
                     "--allow-unheld-claims"]) == 0
    assert "not held: 01: the text is right here" in capsys.readouterr().out
    assert cli.main(["report", "--notebooks", str(nbdir), "--only", "02", "--out", str(tmp_path / "o"),
                     "--allow-unheld-claims"]) == 1
    assert "0/1 notebooks passed" in capsys.readouterr().out


def test_find_notebooks_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no notebooks folder"):
        runner.find_notebooks(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no lab notebooks"):
        runner.find_notebooks(tmp_path)
    with pytest.raises(ValueError, match="profile must be"):
        report.run(profile="medium", notebooks=tmp_path)


@pytest.mark.notebooks
@pytest.mark.slow
@pytest.mark.full
@pytest.mark.timeout(2400)
def test_the_quick_report_holds_every_claim_beside_a_busy_loop_on_every_core(tmp_path):
    """``labkit report --profile quick`` as a class's shared machine runs it, with another process spinning on every
    core: every lab runs and every claim of the text holds (the exit code says both). About 6 minutes on 2
    cores."""
    with busy_loops(usable_cores()):
        done = subprocess.run([sys.executable, "-m", "labkit", "report", "--profile", "quick", "--no-fetch",
                               "--out", str(tmp_path / "report")], capture_output=True, text=True, timeout=2300)
    said = done.stdout[-4000:] + done.stderr[-2000:]
    n = sum(not is_draft(p.name) for p in runner.find_notebooks(NOTEBOOKS))  # a draft runs only when named
    assert done.returncode == 0 and f"{n}/{n} notebooks passed" in done.stdout, said
    assert "claims of the labs' text checked on this run" in done.stdout, said
