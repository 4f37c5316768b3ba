"""labkit check-submission: a student runs the grader on their own notebook, by its rules, before handing in."""

import nbformat
import pytest

from labkit import cli
from labkit.check import capture
from labkit.grading import sandbox, selfcheck


def _quick(tmp_path):
    from test_grade import QUICK  # here, not at the top: importing test_grade probes the sandbox

    path = tmp_path / "97_quick.ipynb"
    nbformat.write(QUICK, path)
    return path


@pytest.mark.sandbox
@pytest.mark.notebooks
def test_the_grader_run_says_public_checks_passed_and_never_all(tmp_path, capsys):
    path = _quick(tmp_path)
    assert cli.main(["check-submission", str(path), "--timeout", "60"]) == 1  # one of its two checks fails
    out = capsys.readouterr().out
    assert "✔ karp_flatt\n" in out and "✘ karp_flatt#2: " in out
    assert "public checks passed: 1 of 2" in out and "hidden checks" in out and "all passed" not in out
    assert ("NOT isolated" in out) != sandbox.available()[0]  # isolated exactly where a sandbox can be made


@pytest.mark.notebooks
def test_on_a_laptop_without_a_sandbox_it_runs_and_says_it_is_not_isolated(tmp_path, monkeypatch):
    path = _quick(tmp_path)
    monkeypatch.setattr(sandbox, "available", lambda: (False, "bubblewrap cannot make namespaces here"))
    result = selfcheck.check_submission(path, quiet=True)
    assert not result.isolated and [r.passed for r in result.results] == [True, False]
    assert "NOT isolated (bubblewrap cannot make namespaces here)" in result.report()


def test_inside_a_grading_run_it_does_nothing(tmp_path, monkeypatch, capsys):
    # a notebook that checks itself, being graded, would otherwise run itself again and again
    monkeypatch.setenv(capture.ENV, str(tmp_path))
    result = selfcheck.check_submission(tmp_path / "whatever.ipynb")
    assert result.results == [] and "skipped while the notebook is being graded" in capsys.readouterr().out


def test_a_missing_or_empty_notebook_is_named(tmp_path):
    with pytest.raises(SystemExit, match="no notebook at"):
        cli.main(["check-submission", str(tmp_path / "nothing.ipynb")])
    (tmp_path / "empty.ipynb").write_text("")
    with pytest.raises(SystemExit, match="empty"):
        cli.main(["check-submission", str(tmp_path / "empty.ipynb")])
