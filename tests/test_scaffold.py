"""``labkit labs new`` (labkit/scaffold.py): it refuses what it must, writing nothing; written into a copy of this
checkout, the skeleton of the next lab passes the fast tier as written and its notebook runs; and CONTRIBUTING.md's
"Adding a lab" is that command and what it leaves to fill in."""

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest
import tiers

from labkit import labs, runner, scaffold
from labkit.grading import assign

ROOT = Path(__file__).resolve().parent.parent
NEXT = f"{int(labs.LABS[-1].number) + 1:02d}"  # the next free number, whichever labs there are
PROBE, TITLE = "scaffold_probe", "Probing the scaffold"  # a slug no lab nor coming lesson (labs.COMING) has
# the files a lab with one exercise touches: its notebook, lesson, check family and tests, its entry in labs.py and
# its rows in CONTRIBUTING.md (where each lab lives, the lessons); README.md and docs/labs.md list it once it is no
# draft (labs.table() lists the finished labs)
TOUCHES = 6
# the fast tier's tests that read every lab: the registry, the notebooks, the exercises, the documents
LAB_TESTS = ("test_labs.py", "test_lessons.py", "test_layering.py", "test_contract.py", "test_hints.py", "test_notebooks.py",
             "test_docs.py", "test_assign.py", "test_predictions.py", "test_publish.py", "test_similarity.py", "test_cli.py")


# ---- it refuses, writing nothing ------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, says", [
    (["01", "new_lab", "T"], f"lab 01 exists \\(01_{labs.get('01').slug}.ipynb\\); the next free number is {NEXT}"),
    ([f"{int(NEXT) + 1:02d}", "new_lab", "T"], f"is not the next free number, {NEXT}"),
    (["7", "new_lab", "T"], "two digits"),
    ([NEXT, labs.get("07").slug, "T"], f"the slug '{labs.get('07').slug}' is lab 07's"),
    ([NEXT, "RingAllreduce", "T"], "not snake_case"),
    ([NEXT, "fp16_training", "T"], "not snake_case"),  # letters only, as tests/bylab.py reads a notebook's name
    ([NEXT, "class", "T"], "no Python keyword"),
    ([NEXT, "report", "T"], "labkit/report.py exists already, and labkit labs new never overwrites"),
    ([NEXT, "check", "T"], "labkit/check exists already"),
    ([NEXT, "new_lab", 'A "quoted" title'], "one line of plain text"),
    ([NEXT, "new_lab", "lab | table"], "one line of plain text"),
])
def test_it_refuses_and_says_why(argv, says, capsys):
    assert scaffold.main(argv) == 2
    err = capsys.readouterr().err
    assert re.search(says, err), err
    assert not list((ROOT / "notebooks").glob(f"{NEXT}_*")) and not (ROOT / "labkit" / "new_lab.py").exists()


def test_labkit_labs_new_is_the_scaffold(capsys):
    from labkit import cli

    assert cli.main(["labs", "new", NEXT, "report", "T"]) == 2  # refused as the scaffold refuses it, nothing written
    assert "labkit/report.py exists already" in capsys.readouterr().err
    assert cli.main(["labs", "07", "extra"]) == 2 and "labkit labs takes one lab's number" in capsys.readouterr().err


def test_it_refuses_a_folder_that_is_not_a_labkit_checkout(tmp_path):
    with pytest.raises(scaffold.ScaffoldError, match="is not a labkit checkout: it has no labkit/labs.py"):
        scaffold.new_lab(NEXT, PROBE, TITLE, root=tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.fixture
def small_checkout(tmp_path):
    """The files of this checkout the scaffold reads and edits, and the folders it writes into."""
    for name in ("labkit/labs.py", "README.md", "CONTRIBUTING.md", "docs/labs.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    for folder in ("notebooks", "labkit/check", "tests"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    return tmp_path


def _texts(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_it_never_overwrites_a_file(small_checkout):
    (small_checkout / "labkit" / "check" / f"{PROBE}.py").write_text("# someone's work\n")
    before = _texts(small_checkout)
    with pytest.raises(scaffold.ScaffoldError, match=f"labkit/check/{PROBE}.py exists already.*never overwrites"):
        scaffold.new_lab(NEXT, PROBE, TITLE, root=small_checkout)
    assert _texts(small_checkout) == before


def test_it_writes_each_piece_once_and_then_the_lab_is_taken(small_checkout):
    before = _texts(small_checkout)
    written = scaffold.new_lab(NEXT, PROBE, TITLE, root=small_checkout)
    after = _texts(small_checkout)
    assert sorted(str(p.relative_to(small_checkout)) for p in written) == sorted(
        k for k in after if before.get(k) != after[k]) and len(written) == TOUCHES
    text = {str(p.relative_to(small_checkout)): p.read_text() for p in written}
    compile(text["labkit/labs.py"], "labs.py", "exec")
    assert f'    Lab("{NEXT}", "{PROBE}", "{TITLE}",\n' in text["labkit/labs.py"] and "draft=True" in text["labkit/labs.py"]
    assert scaffold._registry(text["labkit/labs.py"])[1][NEXT] == PROBE
    nb = nbformat.reads(text[f"notebooks/{NEXT}_{PROBE}.ipynb"], as_version=4)
    assert nb.cells[0].source.splitlines()[0] == f"# Lab {NEXT} — {TITLE}"
    assert f"| `check.{PROBE}`: `{scaffold.EXERCISE}` | 1 | `pytest -m lab{NEXT}` |" in text["CONTRIBUTING.md"]
    assert after["README.md"] == before["README.md"] and after["docs/labs.md"] == before["docs/labs.md"]  # a draft
    with pytest.raises(scaffold.ScaffoldError, match=f"lab {NEXT} exists"):
        scaffold.new_lab(NEXT, "another_one", TITLE, root=small_checkout)


# ---- what it wrote passes the fast tier ------------------------------------------------------------------------------

def _copy_checkout(to: Path) -> None:
    """The files of this checkout that git holds or would (untracked but not ignored: .venv, build and data stay out)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # not one deleted in the working tree
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, to / name)


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def scaffolded():
    """A copy of this checkout with the next lab scaffolded in it: (the copy, the files written, the files that
    changed). The copy is removed afterwards."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the copy is made of the files git holds")
    with tempfile.TemporaryDirectory(prefix="labkit-scaffold-") as tmp:
        copy = Path(tmp) / "checkout"
        _copy_checkout(copy)
        before = _digests(copy)
        written = scaffold.new_lab(NEXT, PROBE, TITLE, root=copy)
        after = _digests(copy)
        yield copy, written, sorted(name for name in after if before.get(name) != after[name])


def _pytest(where: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest in the checkout ``where``, importing its labkit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | {"PYTHONPATH": str(where)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", *args], cwd=where,
                          env=env, capture_output=True, text=True, timeout=600)


def _ids(output: str, outcome: str) -> set[str]:
    return {m.group(1) for m in re.finditer(rf"^{outcome} (\S+?)(?: - .*)?$", output, re.M)}


FAST = f"not ({' or '.join(tiers.COSTLY)})"


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_fast_tier_passes_on_what_the_scaffold_wrote(scaffolded):
    copy, written, changed = scaffolded
    assert changed == sorted(str(p.relative_to(copy)) for p in written) and len(changed) <= TOUCHES, changed
    mine = f"tests/test_exercises_{PROBE}.py"
    ran = _pytest(copy, "-n", "2", "-m", FAST, *(f"tests/{name}" for name in LAB_TESTS), mine)
    said = ran.stdout[-6000:] + ran.stderr[-2000:]
    assert ran.returncode in (0, 1), said  # 1: some failed; anything else: it could not run them
    failed = _ids(ran.stdout, "FAILED") | _ids(ran.stdout, "ERROR")
    if failed:  # those that fail in this checkout too are not the new lab's: run their files here
        here = _pytest(ROOT, "-n", "2", "-m", FAST, *sorted({name.split("::")[0] for name in failed}))
        failed -= _ids(here.stdout, "FAILED") | _ids(here.stdout, "ERROR")
    assert not failed, f"the new lab fails these: {sorted(failed)}\n{said}"
    passed = _ids(ran.stdout, "PASSED")
    for test in (f"{mine}::test_combined_mean_is_numpys_weighted_average",
                 f"tests/test_lessons.py::test_prose_a_student_reads_once[{NEXT}]",
                 f"tests/test_contract.py::test_the_right_answer_passes[{scaffold.EXERCISE}]"):
        assert test in passed, f"{test} did not run"
    rows = subprocess.run([sys.executable, "-c", "from labkit import labs; print(labs.table().splitlines()[-1]); "
                           "print(labs.where_table().splitlines()[-1])"], cwd=copy, env={**os.environ, "PYTHONPATH": str(copy)},
                          capture_output=True, text=True, check=True).stdout.splitlines()
    assert rows[0] in (copy / "README.md").read_text() and rows[1] in (copy / "CONTRIBUTING.md").read_text()
    marked = _pytest(copy, "--collect-only", "-m", f"lab{NEXT}", mine)
    assert f"{mine}::test_combined_mean_is_numpys_weighted_average" in marked.stdout, marked.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.notebooks
def test_the_scaffolded_notebook_runs_its_claim_holds_and_its_student_version_waits_for_the_exercise(scaffolded):
    copy, _, _ = scaffolded
    path, env, out = copy / "notebooks" / f"{NEXT}_{PROBE}.ipynb", {"PYTHONPATH": str(copy)}, copy / "ran"
    ran = runner.execute(path, out / "instructor", {"PROFILE": "quick"}, timeout=120, env=env)
    assert ran.ok, ran.error
    assert [(c["statement"], c["holds"]) for c in ran.claims] == [(scaffold.CLAIM, True)]
    handout = out / "student" / path.name
    handout.parent.mkdir(parents=True)
    nbformat.write(assign.student_notebook(nbformat.read(path, as_version=4)), handout)
    ran = runner.execute(handout, out / "student-ran", {"PROFILE": "quick"}, timeout=120, env=env, allow_errors=True)
    errors = [o.evalue for c in nbformat.read(ran.executed, as_version=4).cells for o in c.get("outputs", [])
              if o.output_type == "error"]
    assert len(errors) == 1 and "combined mean: not written yet" in errors[0], errors


# ---- CONTRIBUTING.md says the same ---------------------------------------------------------------------------------

def test_contributings_adding_a_lab_is_the_command_and_what_it_leaves_to_fill_in():
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text.split("\n## Adding a lab\n", 1)[1].split("\n## ", 1)[0]
    assert re.search(r'labkit labs new \d\d [a-z_]+ "', section), "it starts from the command"
    named = re.findall(r"^- \*\*(.+?)\*\*", section, re.M)
    assert named == [name for name, _ in scaffold.FILL_IN], \
        "CONTRIBUTING.md's 'Adding a lab' lists what labkit.scaffold.FILL_IN does, in bold, in its order"
