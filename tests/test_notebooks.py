"""The lab notebooks: committed clean, structured for assignments, and executed on the quick profile."""

import json

import nbformat
import pytest

from labkit import assign, report

NOTEBOOKS = report.find_notebooks()
IDS = [p.name for p in NOTEBOOKS]
WITH_EXERCISES = [p for p in NOTEBOOKS if "### BEGIN SOLUTION" in p.read_text()]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_without_outputs_and_structured(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), "commit notebooks cleared"
    assert nb["cells"][0]["cell_type"] == "markdown" and "".join(nb["cells"][0]["source"]).startswith("# Lab ")
    params = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1 and "PROFILE" in "".join(params[0]["source"])
    sources = ["".join(c["source"]) for c in code]
    regions = [i for i, s in enumerate(sources) if "### BEGIN SOLUTION" in s]
    for i in regions:
        assert sources[i].count("### BEGIN SOLUTION") == sources[i].count("### END SOLUTION")
        assert "check." in sources[i + 1], "an exercise cell is followed by its check"


@pytest.mark.notebooks
@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_runs_quick_profile(path, tmp_path):
    result = report.execute(path, tmp_path, {"PROFILE": "quick"}, timeout=300, progress=False)
    assert result.ok, result.error
    assert result.figures, "every lab draws at least one figure"
    assert result.metrics, "every lab records its key numbers for the report"
    assert result.seconds < 120, f"quick profile took {result.seconds:.0f} s"


@pytest.mark.notebooks
@pytest.mark.parametrize("path", WITH_EXERCISES, ids=[p.name for p in WITH_EXERCISES])
def test_student_version_fails_its_check_clearly(path, tmp_path):
    nb = assign.student_notebook(nbformat.read(path, as_version=4))
    assert "### BEGIN SOLUTION" not in "".join(c.source for c in nb.cells)
    stub = tmp_path / path.name
    nbformat.write(nb, stub)
    result = report.execute(stub, tmp_path / "out", {"PROFILE": "quick"}, timeout=300, progress=False)
    assert not result.ok
    assert "ExerciseError" in result.error and "not written yet" in result.error
