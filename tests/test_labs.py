"""The registry of labs (labkit/labs.py) holds every lab and every piece of one: each lesson and check module of
labkit, each notebook, each exercise belongs to a declared lab, and the tables that list the labs are its own."""

import json
import pkgutil
from pathlib import Path

import pytest

import labkit
from labkit import labs, runner
from labkit.check import exercises

ROOT = Path(__file__).resolve().parent.parent


def test_every_module_of_labkit_is_a_lesson_of_a_lab_or_of_the_house_around_them():
    found = {m.name for m in pkgutil.iter_modules(labkit.__path__)} | {
        p.name for p in Path(labkit.__file__).parent.iterdir() if p.is_dir() and not p.name.startswith("__")}
    lessons = set(labs.lessons())
    assert not lessons & set(labs.AROUND), f"declared both a lesson and the house's: {lessons & set(labs.AROUND)}"
    undeclared = found - lessons - set(labs.AROUND) - set(labs.COMING)
    assert not undeclared, f"modules of labkit in no lab of labkit/labs.py nor in its AROUND or COMING: {sorted(undeclared)}"
    assert not (lessons | set(labs.AROUND) | set(labs.COMING)) - found, "labkit/labs.py names modules labkit does not have"
    assert not lessons & set(labs.COMING), "a lab declares these lessons: take them out of COMING"
    untested = [m for m in labs.COMING if not (ROOT / "tests" / f"test_{m}.py").is_file()]
    assert not untested, f"lessons of a coming lab without their tests/test_<module>.py: {untested}"


def test_every_notebook_is_a_lab_and_every_lab_has_its_notebook_and_heading():
    notebooks = {p.name: p for p in runner.find_notebooks()}
    assert set(notebooks) == {lab.notebook for lab in labs.LABS}
    assert [lab.number for lab in labs.LABS] == [f"{i:02d}" for i in range(1, len(labs.LABS) + 1)]
    for lab in labs.LABS:
        first = json.loads(notebooks[lab.notebook].read_text())["cells"][0]["source"][0].strip()
        assert first == f"# Lab {lab.number} — {lab.title}", f"{lab.notebook}'s heading is not its registry title"
        assert set(lab.needs + lab.uses) <= set(labs.NEEDS)
        assert not set(lab.claims) & set(lab.optional_claims)


def test_every_check_family_and_exercise_belongs_to_its_lab():
    families = set(exercises.families())
    declared = {c for lab in labs.LABS for c in lab.checks}
    assert families == declared, f"check modules in no lab: {families - declared}; named but missing: {declared - families}"
    for e in exercises.EXERCISES.values():
        assert e.module in labs.get(e.lab).checks, f"exercise {e.name} of lab {e.lab} is in check.{e.module}"


def test_the_tables_that_list_the_labs_are_the_registrys():
    assert labs.table() in (ROOT / "README.md").read_text(), "README.md's table of labs differs from labkit.labs.table()"
    contributing = (ROOT / "CONTRIBUTING.md").read_text()
    assert labs.where_table() in contributing, "CONTRIBUTING.md's table of where each lab lives differs from the registry"
    missing = [m for m in labs.lessons() if f"| `{m}` |" not in contributing and f"| `{m}/` |" not in contributing]
    assert not missing, f"CONTRIBUTING.md's table of modules leaves out the lessons {missing}"


UNKNOWN = f"{int(labs.LABS[-1].number) + 1:02d}"  # the lab after the last: none yet, whichever labs are added


def test_a_lab_is_found_by_number_or_notebook_and_an_unknown_one_is_named():
    assert labs.get(7) is labs.get("07") is labs.get("7") is labs.of_notebook("07_ring_allreduce.ipynb")
    assert labs.get("07").marker == "lab07"
    with pytest.raises(labs.UnknownLab, match=f"no lab '{UNKNOWN}'.*01, 02"):
        labs.get(UNKNOWN)
    assert labs.of_notebook("Lab 1 - Bob (1).ipynb") is None


def test_every_lab_has_tests_found_by_its_marker():
    import bylab

    modules = {p.name: bylab.labs_of_module(str(p)) for p in (ROOT / "tests").glob("test_*.py")}
    for lab in labs.LABS:
        assert [m for m, found in modules.items() if lab.number in found], f"no test module is {lab.marker}'s"
    assert modules["test_param_server.py"] == {"09"}  # by the MPI cases it runs: it imports no labkit module
    assert modules["test_exercises_ring.py"] >= {"07", "08"}
    assert modules["test_data.py"] == {"01"} and modules["test_cpu_parallel.py"] == {"02"}


def test_labkit_labs_lists_the_labs_and_one_labs_pieces(capsys):
    from labkit import cli, labs

    assert cli.main(["labs"]) == 0 and labs.table(mark_drafts=True) in capsys.readouterr().out
    assert cli.main(["labs", "7"]) == 0
    out = capsys.readouterr().out
    assert "notebooks/07_ring_allreduce.ipynb" in out and "pytest -m lab07" in out and "check.ring" in out
    assert cli.main(["labs", UNKNOWN]) == 2 and f"no lab '{UNKNOWN}'" in capsys.readouterr().err


def test_the_markers_read_the_exercises_as_the_registry_declares_them():
    import bylab

    assert bylab._exercises() == {name: e.lab for name, e in exercises.EXERCISES.items()}


def test_an_exercise_is_declared_with_the_lab_whose_notebook_calls_it_and_in_its_familys_module():
    import re

    calls = re.compile(r"^\s*check\.(\w+)\(", re.M)  # a check cell's call, as labkit assign reads it
    called = {}
    for path in runner.find_notebooks():
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "code":
                for name in calls.findall("".join(cell["source"])):
                    called.setdefault(name, set()).add(path.name[:2])
    declared = exercises.EXERCISES
    assert {name: {e.lab} for name, e in declared.items()} == called, "an exercise's lab is the notebook calling it"
    assert all(e.check().__module__ == f"labkit.check.{e.module}" for e in declared.values())


def test_a_draft_is_marked_by_labkit_labs_and_run_by_the_report_only_when_named(monkeypatch, tmp_path):
    from dataclasses import replace

    from labkit import report

    draft = replace(labs.LABS[-1], draft=True)
    monkeypatch.setattr(labs, "LABS", labs.LABS[:-1] + (draft,))
    assert labs.is_draft(draft.notebook) and not labs.is_draft(labs.LABS[0].notebook)
    assert f"| {draft.title} (draft) |" in labs.table(mark_drafts=True) and "(draft)" not in labs.table()
    ran = []  # the README's table stays as it is when the flag goes
    monkeypatch.setattr(report, "execute", lambda path, *a, **k: ran.append(path.name) or runner.NotebookResult(path.name, ""))
    monkeypatch.setattr(report, "write_html", lambda *a: tmp_path / "index.html")
    report.run(out=tmp_path, fetch=False, progress=False)
    assert ran == [lab.notebook for lab in labs.LABS if not lab.draft]
    ran.clear()
    report.run(out=tmp_path, only=f"{draft.number}_", fetch=False, progress=False)
    assert ran == [draft.notebook]
