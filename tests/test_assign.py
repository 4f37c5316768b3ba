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


def _assign(tmp_path, *args) -> int:
    from labkit import cli

    return cli.main(["assign", "--out", str(tmp_path / "student"), "--release", str(tmp_path / "rel"), *args])


def test_assign_takes_every_only_and_adds_to_the_release_record(tmp_path, capsys):
    import json

    from labkit.grading import answers

    assert _assign(tmp_path, "--only", "01_", "--deadline", "01=2026-10-02T23:59:00+02:00") == 0
    rubrics = answers.load_rubrics(tmp_path / "rel")  # written by the first grade; the instructor edits lab 01's
    q01 = next(iter(rubrics["01_serial_backprop.ipynb"]))
    rubrics["01_serial_backprop.ipynb"][q01]["items"][0]["criterion"] = "mine"
    (tmp_path / "rel" / answers.RUBRICS_FILE).write_text(json.dumps(rubrics))
    assert _assign(tmp_path, "--only", "07_", "--deadline", "07=2026-10-09T23:59:00+02:00") == 0
    assert "lab 01, 07" in capsys.readouterr().out
    record = json.loads((tmp_path / "rel" / assign.RELEASE_FILE).read_text())["notebooks"]
    assert {n: e["deadline"] for n, e in record.items()} == {"01_serial_backprop.ipynb": "2026-10-02T23:59:00+02:00",
                                                             "07_ring_allreduce.ipynb": "2026-10-09T23:59:00+02:00"}
    rubrics = json.loads((tmp_path / "rel" / answers.RUBRICS_FILE).read_text())
    assert rubrics["01_serial_backprop.ipynb"][q01]["items"][0]["criterion"] == "mine" and "07-latency" in rubrics[
        "07_ring_allreduce.ipynb"]
    # both again, in one run: each replaces its own entry and says so; the edited rubric stays
    assert _assign(tmp_path, "--only", "01_", "--only", "07_", "--deadline", "01=2026-10-03T23:59:00+02:00") == 0
    out = capsys.readouterr().out
    assert "lab 01 was released there before (01_serial_backprop.ipynb): its entry is replaced" in out
    assert "lab 07 was released there before" in out and out.count("wrote ") == 2
    assert "its deadline is now none, was 2026-10-09T23:59:00+02:00" in out  # lab 07's, given no --deadline this time
    record = json.loads((tmp_path / "rel" / assign.RELEASE_FILE).read_text())["notebooks"]
    assert [e["deadline"] for e in record.values()] == ["2026-10-03T23:59:00+02:00", None]
    rubrics = json.loads((tmp_path / "rel" / answers.RUBRICS_FILE).read_text())
    assert rubrics["01_serial_backprop.ipynb"][q01]["items"][0]["criterion"] == "mine"


def test_a_deadline_for_a_lab_not_assigned_is_refused_before_anything_is_written(tmp_path, capsys):
    from labkit.errors import LabkitError

    assert _assign(tmp_path, "--only", "01_", "--deadline", "07=2026-10-09T23:59:00+02:00") == 2
    err = capsys.readouterr().err
    assert "lab 07, which this assign does not hand out (it hands out lab 01): add --only 07_" in err
    assert not (tmp_path / "student").exists() and not (tmp_path / "rel").exists()
    lab = runner.find_notebooks(only="01_")
    with pytest.raises(assign.NotAssigned, match="lab 07") as caught:
        assign.write_student_versions(lab, tmp_path / "s", release_dir=tmp_path / "r", policy={"07": {"late": {}}})
    assert isinstance(caught.value, LabkitError) and isinstance(caught.value, ValueError)
    with pytest.raises(SystemExit, match="two deadlines for lab 07"):  # 7 and 07 are one lab
        _assign(tmp_path, "--only", "07_", "--deadline", "07=2026-10-09T23:59:00+02:00", "--deadline",
                "7=2026-10-10T23:59:00+02:00")
    with pytest.raises(SystemExit, match="--format nbgrader does not write"):  # nbgrader keeps no deadline of ours
        _assign(tmp_path, "--only", "01_", "--format", "nbgrader", "--deadline", "01=2026-10-09T23:59:00+02:00")


def test_a_release_record_that_cannot_be_read_stops_assign_before_it_writes(tmp_path, capsys):
    (tmp_path / "rel").mkdir()
    (tmp_path / "rel" / assign.RELEASE_FILE).write_text("{not json")
    assert _assign(tmp_path, "--only", "01_") == 2
    assert "is not a release record written by labkit assign" in capsys.readouterr().err
    assert not (tmp_path / "student").exists()
