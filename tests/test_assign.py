"""Student versions: solution regions stubbed (Python and CUDA C), outputs cleared, markers validated."""

import nbformat
import pytest

from labkit import check, runner
from labkit.grading import assign

PY = '''def f(x):
    """Double x."""
    ### BEGIN SOLUTION
    y = 2 * x
    return y
    ### END SOLUTION

check.f(f)
'''

CU = '''SRC = r"""
extern "C" __global__ void k(float* x)
{
    // ### BEGIN SOLUTION
    x[threadIdx.x] = 1.0f;
    // ### END SOLUTION
}
"""
'''


def test_python_region_becomes_raise_at_its_indentation():
    out = assign.student_source(PY)
    assert "y = 2 * x" not in out and "return y" not in out
    assert '    """Double x."""\n    raise NotImplementedError\n\ncheck.f(f)\n' in out
    ns = {}
    exec(out.replace("check.f(f)", ""), ns)
    with pytest.raises(NotImplementedError):
        ns["f"](1)


def test_cuda_region_becomes_the_kernel_todo_that_the_checks_recognise():
    out = assign.student_source(CU)
    assert "x[threadIdx.x]" not in out
    assert f"    // {check.KERNEL_TODO}\n}}" in out
    with pytest.raises(check.ExerciseError, match="not written yet"):
        check.tiled_matmul(out.split('r"""')[1])


def test_two_regions_in_one_cell_and_text_outside_kept():
    out = assign.student_source(PY + "\n" + PY.replace("f(", "g("))
    assert out.count("raise NotImplementedError") == 2 and out.count("check.") == 2


@pytest.mark.parametrize("bad", ["### BEGIN SOLUTION\nx = 1\n", "x = 1\n### END SOLUTION\n",
                                 "### BEGIN SOLUTION\n### BEGIN SOLUTION\nx\n### END SOLUTION\n"])
def test_unpaired_markers_are_refused_so_no_solution_leaks(bad):
    with pytest.raises(ValueError, match="unpaired solution marker"):
        assign.student_source(bad)


def test_student_notebook_clears_outputs_and_leaves_the_original_alone():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Lab 99"), nbformat.v4.new_code_cell(PY)])
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="hi")]
    nb.cells[1].execution_count = 3
    st = assign.student_notebook(nb)
    assert st.cells[1].outputs == [] and st.cells[1].execution_count is None
    assert "raise NotImplementedError" in st.cells[1].source
    assert "### BEGIN SOLUTION" in nb.cells[1].source and nb.cells[1].outputs  # the instructor's copy is untouched


def test_markers_in_a_markdown_cell_are_an_error():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("### BEGIN SOLUTION\nx\n### END SOLUTION")])
    with pytest.raises(ValueError, match="markdown"):
        assign.student_notebook(nb)


def test_write_student_versions_of_every_lab(tmp_path):
    labs = runner.find_notebooks()
    written = assign.write_student_versions(labs, tmp_path)
    assert [p.name for p in written] == [p.name for p in labs]
    for p in written:
        text = p.read_text()
        assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
        nb = nbformat.read(p, as_version=4)
        nbformat.validate(nb)
    with_exercises = [p for p in labs if assign.has_exercises(nbformat.read(p, as_version=4))]
    assert len(with_exercises) >= 4
    with pytest.raises(ValueError, match="overwrite"):
        assign.write_student_versions(labs[:1], labs[0].parent)


def test_assign_writes_each_labs_points_deadline_and_late_policy_into_the_release(tmp_path, capsys):
    import json

    from labkit import cli

    assert cli.main(["assign", "--only", "01_", "--out", str(tmp_path / "student"), "--release", str(tmp_path / "rel"),
                     "--deadline", "01=2026-10-02T23:59:00+02:00", "--late", "20/3"]) == 0
    entry = json.loads((tmp_path / "rel" / "release.json").read_text())["notebooks"]["01_serial_backprop.ipynb"]
    assert entry["lab"] == "01" and entry["deadline"] == "2026-10-02T23:59:00+02:00" and entry["hidden_share"] == 0.5
    assert entry["late"] == {"percent_per_day": 20.0, "max_days": 3}
    assert [e["points"] for e in entry["exercises"]] == [1, 1, 1, 1] and sum(q["points"] for q in entry["answers"]) == 6
    assert cli.main(["assign", "--only", "01_", "--out", str(tmp_path / "s2"), "--release", str(tmp_path / "r2"),
                     "--deadline", "01=2026-10-02T23:59"]) == 2
    assert "names no timezone; add it" in capsys.readouterr().err and not (tmp_path / "r2").exists()
