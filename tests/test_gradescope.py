"""labkit gradescope: the autograder bundle of one lab, its layout, and a submission graded from it as Gradescope
runs it: unzipped into /autograder/source, setup.sh once, run_autograder per submission, all without a network."""

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import nbformat
import pytest
import solutions
from grading_image import as_a_grading_machine
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from labkit.grading import assign, gradescope

ROOT = Path(__file__).resolve().parent.parent
LAB = "12_quick.ipynb"  # lab 12 by its content: karp_flatt is lab 12's exercise
# as Gradescope writes /autograder/submission_metadata.json (its documentation's fields)
METADATA = {"id": 123456, "created_at": "2026-10-02T14:22:32.365935-07:00",
            "assignment": {"due_date": "2026-10-02T23:00:00.000000-07:00", "id": 25828, "title": "Lab 12",
                           "total_points": "2.0"},
            "submission_method": "upload", "users": [{"email": "ana@example.edu", "id": 1234, "name": "Ana"}],
            "previous_submissions": []}


QUICK = new_notebook(cells=[
    new_markdown_cell("# Lab 12"),
    new_code_cell('PROFILE = "quick"', metadata={"tags": ["parameters"]}),
    new_code_cell("from labkit import check"),
    new_code_cell("check.karp_flatt(lambda p, s: (1 / s - 1 / p) / (1 - 1 / p))"),
    new_code_cell("check.karp_flatt(None)"),
])


def _release(tmp_path, deadline=None):
    """A release of two labs: 12 (two checks, the second fails as written; due at ``deadline``, 10 % off a day late)
    and 11."""
    course = tmp_path / "course"
    course.mkdir()
    nbformat.write(QUICK, course / LAB)
    nbformat.write(new_notebook(cells=QUICK.cells[:2]), course / "11_other.ipynb")
    assign.write_student_versions([course / LAB, course / "11_other.ipynb"], tmp_path / "handout",
                                  release_dir=tmp_path / "release")
    (tmp_path / "release" / "rubrics.json").write_text(json.dumps({LAB: {}, "11_other.ipynb": {}}))
    if deadline:
        record = json.loads((tmp_path / "release" / "release.json").read_text())
        record["notebooks"][LAB].update(deadline=deadline, late={"percent_per_day": 10, "max_days": 5})
        (tmp_path / "release" / "release.json").write_text(json.dumps(record))
    return tmp_path / "release", QUICK


def _fake_wheels(tmp_path):
    house = tmp_path / "house"
    house.mkdir()
    for name in ("pip-26.0-py3-none-any.whl", "labkit-0.1.0-py3-none-any.whl", "numpy-2.0-cp311-x86_64.whl"):
        (house / name).write_bytes(b"PK")
    return house


def test_the_bundle_holds_its_scripts_the_labs_release_and_the_wheels(tmp_path):
    release, _ = _release(tmp_path)
    path = gradescope.build(release, "12", tmp_path / "autograder.zip", wheels=_fake_wheels(tmp_path))
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        assert {"setup.sh", "run_autograder", "labkit-autograder.json", "release/release.json",
                "release/rubrics.json", "wheels/pip-26.0-py3-none-any.whl", "wheels/labkit-0.1.0-py3-none-any.whl",
                "wheels/numpy-2.0-cp311-x86_64.whl"} == names
        for script in ("setup.sh", "run_autograder"):
            assert stat.S_IMODE(z.getinfo(script).external_attr >> 16) == 0o755
        record = json.loads(z.read("release/release.json"))
        assert list(record["notebooks"]) == [LAB]  # the lab alone: its results hold no other lab's rows
        assert json.loads(z.read("release/rubrics.json")) == {LAB: {}}
        assert json.loads(z.read("labkit-autograder.json"))["lab"] == "12"
        setup = z.read("setup.sh").decode()
    assert "--no-index" in setup and "--find-links" in setup and "labkit[mpi]" in setup
    assert not list(tmp_path.glob("*.part"))


def test_a_lab_not_in_the_release_or_wheels_missing_are_named(tmp_path):
    release, _ = _release(tmp_path)
    held = r"no notebook of lab '05' in the release \(it holds 11 \(11_other.ipynb\), 12 \(12_quick"
    with pytest.raises(gradescope.BundleError, match=held):
        gradescope.build(release, "05", tmp_path / "a.zip", wheels=_fake_wheels(tmp_path))
    (tmp_path / "house" / "labkit-0.1.0-py3-none-any.whl").unlink()
    with pytest.raises(gradescope.BundleError, match="lacks pip's or labkit's wheel"):
        gradescope.build(release, "12", tmp_path / "a.zip", wheels=tmp_path / "house")
    assert not (tmp_path / "a.zip").exists()


def _wheel(house, name, *requires):
    """A wheel holding only its METADATA, with these Requires-Dist lines."""
    with zipfile.ZipFile(house / f"{name}-1.0-py3-none-any.whl", "w") as z:
        z.writestr(f"{name}-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: {}\nVersion: 1.0\n{}\n\nText.\n".format(
            name, "".join(f"Requires-Dist: {r}\n" for r in requires)))


def test_the_wheels_complete_what_the_target_pythons_markers_ask_for(tmp_path):
    """pip download evaluates markers for the Python it runs on: a backport only Python 3.10 needs is found missing."""
    _wheel(tmp_path, "labkit", "ipython", 'mpi4py; extra == "mpi"', 'pytest; extra == "test"')
    _wheel(tmp_path, "ipython", 'exceptiongroup; python_version < "3.11"', "jedi[fast]>=0.16",
           'docrepr; extra == "doc"')
    _wheel(tmp_path, "mpi4py")
    _wheel(tmp_path, "jedi", 'parso; extra == "fast"', 'pytest; extra == "testing"')
    assert gradescope.missing_requirements(tmp_path, "3.10") == ["exceptiongroup", "parso"]
    assert gradescope.missing_requirements(tmp_path, "3.12") == ["parso"]  # the extras asked for only


def test_the_submission_time_and_ids_come_from_the_metadata():
    row = gradescope.submission_row(METADATA, "12", LAB)
    assert row == {"student": "ana@example.edu", "lab": "12", "file": LAB,
                   "submitted_at": "2026-10-02T14:22:32.365935-07:00", "lms": "gradescope", "lms_user_id": "1234",
                   "lms_submission_id": "123456"}
    assert tuple(row) == gradescope.SUBMISSIONS_FIELDS
    assert gradescope.student_of({"users": [{"id": 7}]}) == "7" and gradescope.student_of({}) == "student"


def test_the_grade_command_passes_the_lab_and_the_submission_time(tmp_path):
    from labkit import cli

    args = gradescope.grade_command(tmp_path / "s", tmp_path / "r", tmp_path / "g", "97", tmp_path / "s.csv", 60)
    assert args[:2] == ["grade", str(tmp_path / "s")] and "gradescope" in args
    assert args[args.index("--lab") + 1] == "97" and args[args.index("--submissions") + 1] == str(tmp_path / "s.csv")
    parsed = cli.build_parser().parse_args(args)  # options labkit grade has
    assert (parsed.lab, parsed.submissions, parsed.export) == (["97"], str(tmp_path / "s.csv"), ["gradescope"])
    assert gradescope.submission_row({"created_at": "2026-10-02 14:22:32 -0700"}, "12", LAB)["submitted_at"] == (
        "2026-10-02T14:22:32-07:00")
    assert gradescope.submission_row({"created_at": "yesterday"}, "12", LAB)["submitted_at"] == ""  # no penalty, said


def _tree(tmp_path, zip_path, submission, metadata=METADATA):
    """The folders Gradescope makes: source/ (the zip unpacked), submission/, results/, submission_metadata.json."""
    root = tmp_path / "autograder"
    with zipfile.ZipFile(zip_path) as z:
        z.extractall(root / "source")
        for info in z.infolist():  # zipfile drops the modes: Gradescope's unzip keeps them
            os.chmod(root / "source" / info.filename, info.external_attr >> 16 or 0o644)
    shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")  # as Gradescope copies it, runnable
    (root / "submission").mkdir()
    nbformat.write(submission, root / "submission" / LAB)
    (root / "results").mkdir()
    (root / "submission_metadata.json").write_text(json.dumps(metadata))
    return root


def _check_results(root):
    results = json.loads((root / "results" / "results.json").read_text())
    tests = {t["name"]: t for t in results["tests"]}
    assert len(tests) == 2, results
    assert sorted(t["score"] for t in tests.values()) == [0.0, 1.0]
    return results


@pytest.mark.notebooks
def test_run_autograder_grades_the_submission_into_results_json(tmp_path, monkeypatch):
    from labkit.grading import sandbox

    monkeypatch.setattr(sandbox, "available", lambda: (False, "not probed here"))
    release, quick = _release(tmp_path)
    root = _tree(tmp_path, gradescope.build(release, "12", tmp_path / "autograder.zip", wheels=_fake_wheels(tmp_path)),
                 quick)
    assert gradescope.autograde(root) == 0
    _check_results(root)
    (root / "submission" / LAB).unlink()  # an upload of no notebook: a results.json that says so
    assert gradescope.autograde(root) == 1
    assert "no notebook (.ipynb) in the submission" in (root / "results" / "results.json").read_text()


@pytest.mark.notebooks
def test_a_late_submission_scores_each_test_less_the_penalty(tmp_path, monkeypatch):
    from labkit.grading import sandbox

    monkeypatch.setattr(sandbox, "available", lambda: (False, "not probed here"))
    release, quick = _release(tmp_path, deadline="2026-10-01T23:00:00-07:00")  # handed in 15 h after: 1 day late
    due_1st = {**METADATA, "assignment": {**METADATA["assignment"], "due_date": "2026-10-01T23:00:00.000000-07:00"}}
    root = _tree(tmp_path, gradescope.build(release, "12", tmp_path / "autograder.zip", wheels=_fake_wheels(tmp_path)),
                 quick, due_1st)
    assert gradescope.autograde(root) == 0
    results = json.loads((root / "results" / "results.json").read_text())
    assert sorted((t["score"], t["max_score"]) for t in results["tests"]) == [(0.0, 1.0), (0.9, 1.0)]
    assert results["score"] == 0.9 and "1 day late: -10 %" in results["output"]


needs_root_unshare = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                        reason="blocking the network for one command needs root and unshare")


@pytest.mark.slow
@pytest.mark.full  # downloads every wheel (about 110 MB) and installs them offline: make test-full
@pytest.mark.hosts  # a network namespace (unshare)
@pytest.mark.cluster  # the tier guard reads jupyterlab and ipyparallel in pip download's arguments as a cluster
@pytest.mark.sandbox
@pytest.mark.notebooks
@needs_root_unshare
def test_the_bundle_installs_and_grades_in_a_tree_as_gradescope_lays_it_out_without_a_network(tmp_path):
    """Built here with a network (the wheels downloaded, labkit's built); then setup.sh and run_autograder in a
    network namespace of their own, as root, from the unpacked zip alone."""
    release, quick = _release(tmp_path)
    zip_path = gradescope.build(release, "12", tmp_path / "autograder.zip")
    root = _tree(tmp_path, zip_path, quick)
    offline = ["unshare", "--net", "--"]
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "AUTOGRADER_PYTHON": sys.executable}
    env.pop("VIRTUAL_ENV", None)
    r = subprocess.run([*offline, "bash", str(root / "source" / "setup.sh")], capture_output=True, text=True,
                       env=env, timeout=900, cwd=root / "source")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "labkit" in r.stdout and "installed" in r.stdout
    assert "sandbox: bubblewrap" in r.stdout, r.stdout
    assert not os.stat(root / "source").st_mode & 0o077, "the release and its rubrics are closed to all but root"
    r = subprocess.run([*offline, str(root / "run_autograder")], capture_output=True, text=True, env=env, timeout=600,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    results = _check_results(root)
    assert "karp_flatt" in json.dumps(results) and "isolated by bubblewrap" in results["output"]

    # a submission that searches all it can read for a line of any worked solution or model answer: its kernel ends
    # (and karp_flatt goes unchecked) if it finds one, or reads almost nothing
    searcher = nbformat.from_dict(json.loads(json.dumps(quick)))
    searcher.cells.insert(2, new_code_cell(solutions.search_cell(["/"]) + "\nif _found or _files < 1000:\n"
                                           "    import os; os._exit(1)"))
    nbformat.write(searcher, root / "submission" / LAB)
    r = subprocess.run([*offline, str(root / "run_autograder")], capture_output=True, text=True, env=env, timeout=600,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    _check_results(root)  # karp_flatt passed: nothing found

    # without bubblewrap, as Gradescope's image may be: the installed grader patched and results.json rewritten by a
    # process left behind, both from a submission graded as a user of its own
    installed = next((root / "venv").rglob("labkit/grading/replay.py"))
    before = installed.read_bytes()
    attack = nbformat.from_dict(json.loads(json.dumps(quick)))
    target = str(root / "results" / "results.json")
    writer = (f"import time\nwhile True:\n    try:\n        open({target!r}, 'w').write('{{\"score\": 100}}')\n"
              "    except OSError:\n        pass\n    time.sleep(0.1)\n")
    attack.cells.insert(2, new_code_cell(
        "import subprocess, sys\nimport labkit.grading.replay as r\ntry:\n    open(r.__file__, 'a').write('#')\n"
        "except OSError as e:\n    print(type(e).__name__)\n"
        f"subprocess.Popen([sys.executable, '-c', {writer!r}, 'labkit-bundle-detached'], start_new_session=True)"))
    nbformat.write(attack, root / "submission" / LAB)
    with as_a_grading_machine(root / "venv", root / "venv" / "bin" / "python"):
        r = subprocess.run([*offline, str(root / "run_autograder")], capture_output=True, text=True,
                           env={**env, "LABKIT_SANDBOX": "user"}, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    time.sleep(1.0)  # a writer that outlived the run would have rewritten results.json by now
    results = _check_results(root)
    assert "isolated by an unprivileged user of its own" in results["output"], results["output"]
    assert installed.read_bytes() == before, "the installed grader is as it was"
    assert "labkit-bundle-detached" not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def test_gradescopes_deadline_is_the_students_own_else_the_assignments():
    assert gradescope.due_date(METADATA) == "2026-10-02T23:00:00-07:00"
    extended = {**METADATA, "users": [{**METADATA["users"][0],
                                       "assignment": {"due_date": "2026-10-04T23:00:00.000000-07:00"}}]}
    assert gradescope.due_date(extended) == "2026-10-04T23:00:00-07:00"
    assert gradescope.due_date({"assignment": {"due_date": None}}) == "" and gradescope.due_date({}) == ""
    assert gradescope.due_date({"assignment": {"due_date": "friday"}}) == ""  # unreadable: said, the release's stands
    args = gradescope.grade_command(Path("s"), Path("r"), Path("g"), "12", Path("s.csv"), 60, Path("ext.csv"))
    assert args[args.index("--extensions") + 1] == "ext.csv"


@pytest.mark.notebooks
def test_gradescopes_extension_stands_in_for_the_releases_deadline(tmp_path, monkeypatch):
    """Due on the 1st in the release, and for the class in Gradescope, handed in on the 2nd: the student's extension
    in Gradescope, to the 4th, makes it on time."""
    from labkit.grading import sandbox

    monkeypatch.setattr(sandbox, "available", lambda: (False, "not probed here"))
    release, quick = _release(tmp_path, deadline="2026-10-01T23:00:00-07:00")
    root = _tree(tmp_path, gradescope.build(release, "12", tmp_path / "autograder.zip", wheels=_fake_wheels(tmp_path)),
                 quick)
    metadata = json.loads((root / "submission_metadata.json").read_text())
    metadata["assignment"]["due_date"] = "2026-10-01T23:00:00.000000-07:00"
    metadata["users"][0]["assignment"] = {"due_date": "2026-10-04T23:00:00.000000-07:00"}
    (root / "submission_metadata.json").write_text(json.dumps(metadata))
    assert gradescope.autograde(root) == 0
    results = _check_results(root)
    assert results["score"] == 1.0 and not re.search(r"\blate\b", results["output"]), results["output"]


@pytest.mark.notebooks
def test_partial_credit_scores_the_cases_passed_before_the_failure(tmp_path, monkeypatch):
    """An answer right until its check's fifth case (it clips e to [0, 1]), in a release with partial credit: 4 of
    the check's 9 cases, in results.json."""
    from labkit.grading import sandbox

    monkeypatch.setattr(sandbox, "available", lambda: (False, "not probed here"))
    lab = new_notebook(cells=[
        new_markdown_cell("# Lab 12"),
        new_code_cell('PROFILE = "quick"', metadata={"tags": ["parameters"]}),
        new_code_cell("import numpy as np\nfrom labkit import check"),
        new_code_cell("def e(p, s):\n    ### BEGIN SOLUTION\n    return (1 / s - 1 / p) / (1 - 1 / p)\n    ### END SOLUTION"),
        new_code_cell("check.karp_flatt(e)"),
    ])
    course = tmp_path / "course"
    course.mkdir()
    nbformat.write(lab, course / LAB)
    assign.write_student_versions([course / LAB], tmp_path / "handout", release_dir=tmp_path / "release",
                                  policy={"*": {"partial_credit": True}})
    handed = nbformat.read(tmp_path / "handout" / LAB, as_version=4)
    handed.cells[3].source = "def e(p, s):\n    return np.clip((1 / s - 1 / p) / (1 - 1 / p), 0, 1)"
    root = _tree(tmp_path, gradescope.build(tmp_path / "release", "12", tmp_path / "autograder.zip",
                                            wheels=_fake_wheels(tmp_path)), handed)
    assert gradescope.autograde(root) == 0
    results = json.loads((root / "results" / "results.json").read_text())
    (test,) = results["tests"]
    assert (test["status"], test["score"], test["max_score"]) == ("failed", round(4 / 9, 4), 1.0), test
    assert "you clipped e to [0, 1]" in test["output"]
