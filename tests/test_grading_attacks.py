"""Grading against students who try to fool it: every attack fails, honest work passes, wrong work fails with the
check's message, and nothing a submission starts outlives it.

On lab 01 (serial), lab 07 (MPI engines, ``%%px``) and lab 05 (CUDA C on the emulator), each trimmed to the cells
its exercise needs (the instructor's versions, released with ``labkit assign``), so that a class of attacks grades
in a few minutes. Each attack is one student's notebook; one ``labkit grade`` run per lab grades them all.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
import solutions
from grading_image import as_a_grading_machine, needs_root
from nbformat.v4 import new_code_cell

import labkit
from labkit import labs, runner, settings
from labkit.grading import assign, exports, grade, replay, sandbox

pytestmark = [pytest.mark.notebooks, pytest.mark.sandbox, pytest.mark.slow]

ISOLATED, WHY = sandbox.available()
if not ISOLATED and settings.get("LABKIT_REQUIRE_SANDBOX"):  # CI installs bubblewrap: these tests must run there
    raise RuntimeError(f"LABKIT_REQUIRE_SANDBOX is set but no sandbox can be made: {WHY}")
needs_sandbox = pytest.mark.skipif(not ISOLATED, reason=f"no sandbox here: {WHY}")


def _lab(prefix: str, keep: list[str], out: Path) -> Path:
    """The instructor's notebook ``prefix*`` with only the cells of ids ``keep``, written into ``out``."""
    path = runner.find_notebooks(only=prefix)[0]
    nb = nbformat.read(path, as_version=4)
    nb.cells = [c for c in nb.cells if c.get("id") in keep]
    out.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out / path.name)
    return out / path.name


def _solution(source: str) -> str:
    return "\n".join(line for line in source.splitlines() if "### BEGIN SOLUTION" not in line and
                     "### END SOLUTION" not in line)


def _cell(nb, cell_id: str):
    return next(c for c in nb.cells if c.get("id") == cell_id)


def _before(nb, cell_id: str, source: str) -> None:
    """A cell of the student's own, just before cell ``cell_id``."""
    nb.cells.insert(nb.cells.index(_cell(nb, cell_id)), new_code_cell(source))


def _grade(tmp: Path, lab: Path, students: dict, **kw):
    """Release ``lab``, hand each student its version changed by their function, grade all; {student: (passed,
    message)} for the lab's first exercise, and the results."""
    assign.write_student_versions([lab], tmp / "blank", release_dir=tmp / "release")
    subs = tmp / "subs"
    for name, change in students.items():
        nb = nbformat.read(tmp / "blank" / lab.name, as_version=4)
        change(nb)
        (subs / name).mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, subs / name / lab.name)
    results, csv_path, json_path = grade.grade(subs, tmp / "out", progress=False, release=tmp / "release", **kw)
    first = {}
    for r in results:
        first.setdefault(r.student, (r.passed, r.message))
    return first, results, json_path


def _escapes(json_path: Path) -> dict[str, list[tuple[str, str]]]:
    """{student: [(kind, target)]}: the escape attempts grades.json lists for each student, over their notebooks."""
    data = json.loads(Path(json_path).read_text())
    return {s: [(e["kind"], e["target"]) for entry in per.values() for e in entry["escapes"]]
            for s, per in data["students"].items()}


def _escape_cell(write: str, read: str) -> str:
    """A cell that tries to write ``write``, read ``read``, connect beyond loopback and signal pid 1; it says nothing."""
    return ("import os, signal, socket\n"
            f"for attempt in (lambda: open({write!r}, 'w'), lambda: open({read!r}).read(1),\n"
            "                lambda: socket.create_connection(('192.0.2.1', 80), timeout=2),\n"
            "                lambda: os.kill(1, signal.SIGCONT)):\n"
            "    try:\n        attempt()\n    except OSError:\n        pass")


def _no_process_mentions(marker: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if marker in line and "ps -eo" not in line]


# ---- lab 01: serial -------------------------------------------------------------------------------------------------

SERIAL_KEEP = ["c01", "c02", "c11", "c12"]


@pytest.fixture(scope="module")
def lab01(tmp_path_factory):
    """Lab 01's attacks, graded once for the module's tests."""
    tmp = tmp_path_factory.mktemp("lab01")
    lab = _lab("01_", SERIAL_KEEP, tmp / "instructor")
    solution = _solution(_cell(nbformat.read(lab, as_version=4), "c11").source)
    wrong = solution.replace("delta.sum(axis=0))", "2 * delta.sum(axis=0))")
    assert wrong != solution
    grades_file = tmp / "out" / "grades.json"
    other = tmp / "subs" / "honest" / lab.name
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]

    def solve(nb, source=solution):
        _cell(nb, "c11").source = source

    def probe(nb):  # what a submission can reach: printed into its executed notebook
        solve(nb)
        paths = {"other": str(other), "instructor": str(lab), "release": str(tmp / "release" / "release.json"),
                 "repo_notebooks": str(runner.find_notebooks(only="01_")[0])}
        _before(nb, "c12", "import json, os, socket\nseen = {}\n"
                f"for k, p in {paths!r}.items():\n"
                "    try:\n        open(p).read(1)\n        seen[k] = 'read'\n    except OSError as e:\n"
                "        seen[k] = type(e).__name__\n"
                "try:\n    open(os.path.join(os.path.dirname(" + repr(str(other)) + "), 'x.txt'), 'w').write('x')\n"
                "    seen['write_other'] = 'written'\nexcept OSError as e:\n    seen['write_other'] = type(e).__name__\n"
                "s = socket.socket()\ns.settimeout(3)\ntry:\n"
                f"    s.connect(('127.0.0.1', {port}))\n    seen['grader_port'] = 'connected'\n"
                "except OSError as e:\n    seen['grader_port'] = type(e).__name__\n"
                "print('PROBE', json.dumps(seen))")

    students = {
        "honest": solve,
        "wrong": lambda nb: solve(nb, wrong),
        "blank": lambda nb: None,
        "patch_check": lambda nb: _before(nb, "c12", "import labkit.check\nlabkit.check.backprop = lambda *a, **k: "
                                                    "print('✔ vectorised backprop: all 3 checks passed')"),
        "patch_numpy": lambda nb: (solve(nb, wrong), _before(nb, "c12", "np.allclose = lambda *a, **k: True\n"
                                                                       "np.isclose = lambda a, b, **k: a == a")),
        "redefine_check": lambda nb: _before(nb, "c12", "class check:\n    @staticmethod\n    def backprop(fn):\n"
                                                       "        print('✔ vectorised backprop: all 3 checks passed')"),
        "swallow_errors": lambda nb: (solve(nb, wrong), _before(
            nb, "c12", "get_ipython().set_custom_exc((Exception,), lambda *a, **k: print('✔ all checks passed'))")),
        "fake_print": lambda nb: solve(nb, "def my_backprop(params, x, Y):\n    print('✔ vectorised backprop: all 3 "
                                           "checks passed')\n    return [(W * 0, b * 0) for W, b in params]"),
        "forge_record": lambda nb: _before(nb, "c12", (
            "import os, json, threading, time\nd = dict(os.environ).get('LABKIT' + '_CAPTURE', '/tmp/none')\n"
            "def forge():\n    while True:\n        os.makedirs(d, exist_ok=True)\n"
            "        open(os.path.join(d, 'backprop.r0.json'), 'w').write(json.dumps({'labkit_capture': 1, "
            "'check': 'backprop', 'rank': 0, 'entries': []}))\n        time.sleep(0.01)\n"
            "threading.Thread(target=forge, daemon=True).start()")),
        "write_grades": lambda nb: (solve(nb), _before(nb, "c12", (
            "import subprocess, sys\n"
            "subprocess.Popen([sys.executable, '-c', 'import time, os\\n"
            f"p = {str(grades_file)!r}\\nmarker = \"labkit-detached-marker\"\\n"
            "while True:\\n    try:\\n        open(p, \"w\").write(\"{}\")\\n    except OSError:\\n        pass\\n"
            "    time.sleep(0.2)', 'labkit-detached-marker'], start_new_session=True)"))),
        "alias_reference": lambda nb: solve(nb, "my_backprop = mlp.backprop"),
        "call_reference": lambda nb: solve(nb, "def my_backprop(params, x, Y):\n    return mlp.backprop(params, x, Y)"),
        "probe": probe,
        "escape": lambda nb: (solve(nb), _before(nb, "c12", _escape_cell(ESCAPE_WRITE, str(tmp / "release" /
                                                                                             "release.json")))),
        "search": lambda nb: (solve(nb), _before(nb, "c12", solutions.search_cell(["/"]))),
        "exec_source": lambda nb: solve(nb, "import inspect\nspace = dict(vars(mlp))\n"
                                            "exec(inspect.getsource(mlp.backprop).replace('def backprop(', "
                                            "'def my_backprop('), space)\nmy_backprop = space['my_backprop']"),
        # accidents: each gets one readable row
        "unbalanced": lambda nb: solve(nb, solution.replace("acts[-1] @ W.T + b))", "acts[-1] @ W.T + b)", 1)),
        "renamed": lambda nb: solve(nb, solution.replace("def my_backprop(", "def my_backprop_v2(")),
        "saved_mid_run": lambda nb: _cell(nb, "c12").update(execution_count=3, outputs=[nbformat.v4.new_output(
            "stream", name="stdout", text="✔ vectorised backprop: all 3 checks passed\n")]),
    }
    try:
        first, results, json_path = _grade(tmp, lab, students, timeout=60)
    finally:
        server.close()
    time.sleep(1.0)  # a detached writer, had it survived, would have rewritten grades.json by now
    return {"first": first, "results": results, "json": json_path, "tmp": tmp, "lab": lab,
            "escapes": _escapes(json_path)}


ESCAPE_WRITE = "/usr/lib/labkit-escape-attempt"


@needs_sandbox
def test_honest_work_passes_and_wrong_work_fails_with_the_checks_message(lab01):
    first = lab01["first"]
    assert first["honest"] == (True, "passed")
    assert not first["wrong"][0] and "db differs from the reference" in first["wrong"][1]
    assert not first["blank"][0] and "not written yet" in first["blank"][1]


@needs_sandbox
@pytest.mark.parametrize("student", ["patch_check", "patch_numpy", "redefine_check", "swallow_errors", "fake_print",
                                     "forge_record", "alias_reference", "call_reference", "exec_source"])
def test_every_attack_on_the_verdict_fails(lab01, student):
    passed, message = lab01["first"][student]
    assert not passed, message
    assert message, "an attack gets a message an instructor can read"


@needs_sandbox
def test_the_messages_say_what_happened(lab01):
    first = lab01["first"]
    assert "recorded nothing" in first["patch_check"][1]
    assert "recorded nothing" in first["redefine_check"][1]
    assert "db differs" in first["patch_numpy"][1]  # the comparison is the grader's, not the patched NumPy's
    assert "db differs" in first["swallow_errors"][1]
    assert "uses labkit's reference (labkit.mlp.backprop)" in first["alias_reference"][1]
    assert "uses labkit's reference (labkit.mlp.backprop)" in first["call_reference"][1]
    assert "uses labkit's reference (labkit.mlp." in first["exec_source"][1]  # its source, compiled again


@needs_sandbox
def test_accidents_get_one_readable_row_each(lab01):
    first = lab01["first"]
    passed, message = first["unbalanced"]
    assert not passed and "NameError: name 'my_backprop' is not defined" in message and "SyntaxError" in message, message
    passed, message = first["renamed"]
    assert not passed and message == "NameError: name 'my_backprop' is not defined", message
    passed, message = first["saved_mid_run"]  # the stale pass in the saved outputs counts for nothing: it is run again
    assert not passed and "not written yet" in message, message
    rows = [r for r in lab01["results"] if r.student in ("unbalanced", "renamed", "saved_mid_run")]
    assert len(rows) == 3


@needs_sandbox
def test_a_submission_reads_and_writes_only_its_own_files_and_has_no_network(lab01):
    executed = nbformat.read(lab01["tmp"] / "out" / "executed" / "probe" / lab01["lab"].name, as_version=4)
    text = "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", []))
    seen = json.loads(text.split("PROBE ", 1)[1].splitlines()[0])
    assert seen == {"other": "FileNotFoundError", "instructor": "FileNotFoundError", "release": "FileNotFoundError",
                    "repo_notebooks": "FileNotFoundError", "write_other": "FileNotFoundError",
                    "grader_port": "ConnectionRefusedError"}, seen
    assert lab01["first"]["probe"] == (True, "passed")


@needs_sandbox
def test_no_line_of_a_worked_solution_or_model_answer_is_readable_from_a_graded_notebook(lab01):
    """The submission walks everything it can read (labkit's package, Python, the environment, the data, its own
    folder): no file holds a line of any lab's worked solution or model answer."""
    executed = nbformat.read(lab01["tmp"] / "out" / "executed" / "search" / lab01["lab"].name, as_version=4)
    seen = solutions.searched(executed)
    assert seen["found"] == {}, seen["found"]
    assert seen["files"] > 1000, "the search read the environment"
    assert lab01["first"]["search"] == (True, "passed")


@needs_sandbox
def test_contained_escape_attempts_are_listed_for_the_student_who_made_them(lab01):
    escapes, release = lab01["escapes"], str(lab01["tmp"] / "release" / "release.json")
    assert lab01["first"]["escape"] == (True, "passed"), "an attempt the sandbox contains costs no exercise"
    assert escapes["escape"] == [("write", ESCAPE_WRITE), ("read", release), ("connect", "192.0.2.1:80"),
                                 ("kill", "pid 1")], escapes["escape"]
    tried = {s for s, found in escapes.items() if found}
    assert tried == {"escape", "probe"}, {s: escapes[s] for s in tried}  # no one else tried anything
    honest_or_blank = ("honest", "wrong", "blank", "unbalanced", "renamed", "saved_mid_run")
    assert all(escapes[s] == [] for s in honest_or_blank)
    # the probe tried to read the others' files and write beside another submission; the grader's port is loopback
    other = lab01["tmp"] / "subs" / "honest"
    assert set(escapes["probe"]) == {("read", str(other / lab01["lab"].name)), ("read", str(lab01["lab"])),
                                     ("read", release), ("read", str(runner.find_notebooks(only="01_")[0])),
                                     ("write", str(other / "x.txt"))}, escapes["probe"]
    rows = list(csv.DictReader(open(lab01["tmp"] / "out" / grade.ESCAPES_CSV)))
    assert {(r["kind"], r["target"]) for r in rows if r["student"] == "escape"} == set(escapes["escape"])
    assert grade.escape_summary(json.loads(lab01["json"].read_text())).startswith("contained escape attempts: escape (4: "
                                                                                 f"wrote {ESCAPE_WRITE}")


@needs_sandbox
def test_a_detached_process_does_not_outlive_its_notebook(lab01):
    assert lab01["first"]["write_grades"] == (True, "passed")
    assert not _no_process_mentions("labkit-detached-marker")
    data = json.loads(lab01["json"].read_text())  # whole and the grader's
    assert data["isolated"] is True and "honest" in data["students"]


# ---- without bubblewrap: an unprivileged user of its own --------------------------------------------------------------

@pytest.fixture(scope="module")
def lab01_user(tmp_path_factory):
    """Lab 01 graded with bubblewrap turned off: each notebook runs as a user of its own."""
    tmp = tmp_path_factory.mktemp("lab01user")
    os.chmod(tmp, 0o755)  # the grading folders open to all: the user's rights alone must keep it out
    lab = _lab("01_", SERIAL_KEEP, tmp / "instructor")
    solution = _solution(_cell(nbformat.read(lab, as_version=4), "c11").source)
    grader = Path(replay.__file__)
    targets = {"grader": str(grader), "labkit": str(Path(labkit.__file__).parent / "mlp.py"),
               "release": str(tmp / "release" / "release.json"), "grades": str(tmp / "out" / "grades.json"),
               "results_dir": str(tmp / "out" / "injected.json")}
    readable = {"repo_notebooks": str(runner.find_notebooks(only="01_")[0])}

    def solve(nb, source=solution):
        _cell(nb, "c11").source = source

    writes = ("import json\nseen = {}\n"
              f"for k, p in {targets!r}.items():\n"
              "    try:\n        open(p, 'a').write('# patched\\n')\n        seen[k] = 'written'\n"
              "    except OSError as e:\n        seen[k] = type(e).__name__\n"
              f"for k, p in {readable!r}.items():\n"
              "    try:\n        open(p).read(1)\n        seen['read_' + k] = 'read'\n"
              "    except OSError as e:\n        seen['read_' + k] = type(e).__name__\n"
              "print('WRITES', json.dumps(seen))")
    roots = [sys.prefix, sys.base_prefix, str(Path(labkit.__file__).parent), "."]
    students = {
        "honest": solve,
        "blank": lambda nb: None,
        "patch_grader": lambda nb: (solve(nb), _before(nb, "c12", writes)),
        "write_grades": lambda nb: (solve(nb), _before(nb, "c12", (
            "import subprocess, sys\n"
            "subprocess.Popen([sys.executable, '-c', 'import time\\n"
            f"p = {targets['grades']!r}\\n"
            "while True:\\n    try:\\n        open(p, \"w\").write(\"{}\")\\n    except OSError:\\n        pass\\n"
            "    time.sleep(0.2)', 'labkit-user-detached-marker'], start_new_session=True)"))),
        "search": lambda nb: (solve(nb), _before(nb, "c12", solutions.search_cell(roots))),
        "escape": lambda nb: (solve(nb), _before(nb, "c12", _escape_cell(ESCAPE_WRITE, readable["repo_notebooks"]))),
        "exec_source": lambda nb: solve(nb, "import inspect\nspace = dict(vars(mlp))\n"
                                            "exec(inspect.getsource(mlp.backprop).replace('def backprop(', "
                                            "'def my_backprop('), space)\nmy_backprop = space['my_backprop']"),
    }
    before = grader.read_bytes()
    with as_a_grading_machine():
        first, results, json_path = _grade(tmp, lab, students, timeout=60)
    time.sleep(1.0)  # a detached writer, had it survived, would have rewritten grades.json by now
    return {"first": first, "json": json_path, "tmp": tmp, "lab": lab, "grader_unchanged": grader.read_bytes() == before,
            "results": results, "escapes": _escapes(json_path), "targets": targets, "readable": readable}


def _printed(lab01_user, student: str, tag: str) -> dict:
    executed = nbformat.read(lab01_user["tmp"] / "out" / "executed" / student / lab01_user["lab"].name, as_version=4)
    text = "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", []))
    return json.loads(text.split(tag + " ", 1)[1].splitlines()[0])


@needs_root
def test_without_bubblewrap_a_user_of_its_own_grades_honest_work_and_fails_cheats(lab01_user):
    first = lab01_user["first"]
    assert first["honest"] == (True, "passed")
    assert not first["blank"][0] and "not written yet" in first["blank"][1]
    assert not first["exec_source"][0] and "uses labkit's reference (labkit.mlp." in first["exec_source"][1]


@needs_root
def test_without_bubblewrap_a_submission_cannot_write_the_grader_labkit_the_release_or_the_results(lab01_user):
    seen = _printed(lab01_user, "patch_grader", "WRITES")
    assert {k: v for k, v in seen.items() if not k.startswith("read_")} == dict.fromkeys(
        ("grader", "labkit", "release", "grades", "results_dir"), "PermissionError"), seen
    assert seen["read_repo_notebooks"] == "PermissionError", seen
    assert lab01_user["grader_unchanged"]
    assert lab01_user["first"]["patch_grader"] == (True, "passed")
    assert not lab01_user["first"]["blank"][0], "the submission graded after it met the grader unchanged"


@needs_root
def test_without_bubblewrap_no_process_of_a_submission_outlives_it_and_the_grades_are_the_graders(lab01_user):
    assert lab01_user["first"]["write_grades"] == (True, "passed")
    assert not _no_process_mentions("labkit-user-detached-marker")
    assert not [uid for uid in sandbox.USER_IDS if sandbox.user_pids(uid)], "every user of its own is gone"
    data = json.loads(lab01_user["json"].read_text())
    assert data["isolated"] is True and "honest" in data["students"]


@needs_root
def test_without_bubblewrap_escape_attempts_are_listed_too(lab01_user):
    escapes, notebooks = lab01_user["escapes"], lab01_user["readable"]["repo_notebooks"]
    assert lab01_user["first"]["escape"] == (True, "passed")
    assert escapes["escape"] == [("write", ESCAPE_WRITE), ("read", notebooks), ("connect", "192.0.2.1:80"),
                                 ("kill", "pid 1")], escapes["escape"]
    assert escapes["patch_grader"] == [*(("write", str(Path(p).resolve())) for p in lab01_user["targets"].values()),
                                       ("read", notebooks)], escapes["patch_grader"]
    assert escapes["honest"] == [] and escapes["blank"] == [] and escapes["exec_source"] == []
    assert {kind for kind, _ in escapes["search"]} <= {"read"}, escapes["search"]


@needs_root
def test_without_bubblewrap_no_solution_is_readable_where_labkit_runs_the_notebook(lab01_user):
    """Python, the environment, labkit's package and the notebook's folder: no line of a solution or model answer."""
    seen = _printed(lab01_user, "search", "SOLUTION-SEARCH")
    assert seen["found"] == {} and seen["files"] > 1000, seen


@needs_root
def test_the_fallback_refuses_a_python_others_cannot_run_and_open_solutions(monkeypatch):
    monkeypatch.setenv("LABKIT_SANDBOX", "user")
    top = Path(tempfile.mkdtemp(prefix="labkit-open-", dir="/tmp"))  # pytest's own folders are closed to others
    try:
        closed, nb = top / "closed", top / "open" / "notebooks"
        closed.mkdir(mode=0o700)
        nb.mkdir(parents=True)
        for folder in (top, top / "open", nb):
            os.chmod(folder, 0o755)
        (closed / "python").write_text("")
        monkeypatch.setattr(sys, "executable", str(closed / "python"))
        ok, why = sandbox.available()
        assert not ok and f"{closed / 'python'} is not open to other users" in why and "install bubblewrap" in why
        (nb / "01_x.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
        monkeypatch.setattr(labs, "NOTEBOOKS", nb)
        assert sandbox.exposed_solutions() == nb
        handout = {"cells": [], "metadata": {"labkit": {"handout": True}}, "nbformat": 4, "nbformat_minor": 5}
        (nb / "01_x.ipynb").write_text(json.dumps(handout))
        assert sandbox.exposed_solutions() is None, "handouts are no solutions"
        os.chmod(nb, 0o750)
        (nb / "01_x.ipynb").write_text(json.dumps({**handout, "metadata": {}}))
        assert sandbox.exposed_solutions() is None, "closed to others"
    finally:
        shutil.rmtree(top)


# ---- limits enforced from outside -----------------------------------------------------------------------------------

@needs_sandbox
def test_endless_loops_bombs_and_ignored_interrupts_cost_one_submission(tmp_path):
    lab = _lab("01_", SERIAL_KEEP, tmp_path / "instructor")
    solution = _solution(_cell(nbformat.read(lab, as_version=4), "c11").source)

    def solve(nb):
        _cell(nb, "c11").source = solution

    students = {
        "loop": lambda nb: _cell(nb, "c11").__setitem__("source", "def my_backprop(params, x, Y):\n    while True:\n"
                                                                   "        pass"),
        "deaf": lambda nb: (solve(nb), _before(nb, "c12", "import signal, time\n"
                                                          "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                                          "while True:\n    time.sleep(0.1)")),
        "memory": lambda nb: (solve(nb), _before(nb, "c12", "hog = []\nwhile True:\n"
                                                            "    hog.append(bytearray(64 << 20))")),
        "forks": lambda nb: (solve(nb), _before(nb, "c12", "import os, time\nkids = 0\nwhile True:\n"
                                                           "    if os.fork() == 0:\n        time.sleep(600)\n"
                                                           "        os._exit(0)\n    kids += 1")),
        "honest": solve,
    }
    t0 = time.monotonic()
    first, results, json_path = _grade(tmp_path, lab, students, timeout=8,
                                       limits=sandbox.Limits(memory_mb=600, processes=64))
    took = time.monotonic() - t0
    assert first["honest"] == (True, "passed")
    assert _escapes(json_path)["honest"] == []
    assert not first["loop"][0] and "stopped after 8 CPU-seconds of work" in first["loop"][1], first["loop"]
    assert not first["deaf"][0] and "killed" in first["deaf"][1], first["deaf"]
    assert not first["memory"][0] and ("memory" in first["memory"][1] or "MemoryError" in first["memory"][1]), first["memory"]
    assert not first["forks"][0] and "limit of 64 processes" in first["forks"][1], first["forks"]
    assert took < 240, took
    assert not _no_process_mentions("labkit-sandbox-")


# ---- lab 07: the MPI engines ----------------------------------------------------------------------------------------

MPI_KEEP = ["c01", "c02", "c03", "c10", "c11", "c22"]


@needs_sandbox
@pytest.mark.mpi
def test_mpi_exercise_attacks_fail_and_no_engine_outlives_its_notebook(tmp_path):
    lab = _lab("07_", MPI_KEEP, tmp_path / "instructor")
    solution = _solution(_cell(nbformat.read(lab, as_version=4), "c10").source)
    students = {
        "honest": lambda nb: _cell(nb, "c10").__setitem__("source", solution),
        "library": lambda nb: _cell(nb, "c10").__setitem__("source", solution.replace(
            "    combine = {", "    return C.ring_allreduce(comm, x, op)\n    combine = {")),
        "patch_check": lambda nb: _before(nb, "c11", "%%px\ncheck.ring_allreduce = lambda *a, **k: None"),
        "raises": lambda nb: _cell(nb, "c10").__setitem__(
            "source", "%%px\ndef my_ring_allreduce(comm, x, op=None):\n    raise ValueError('chunk sizes differ')"),
        "died": lambda nb: _before(nb, "c11", "import os\nos._exit(1)"),
        # the world instead of the communicator given: named at once by the check
        "world": lambda nb: _cell(nb, "c10").__setitem__("source", "%%px\ndef my_ring_allreduce(comm, x, op=MPI.SUM):\n"
                                                         "    out = x.copy()\n    MPI.COMM_WORLD.Allreduce(x, out, op)\n"
                                                         "    return out"),
        # the world kept in a name the check cannot guard: the ranks block inside MPI, where no interrupt reaches
        # (the hardest of the endless cells, so it stands for them: an endless loop of lab 01's is graded above)
        "world_kept": lambda nb: _cell(nb, "c10").__setitem__("source", "%%px\nWORLD = MPI.COMM_WORLD\n"
                                                              "def my_ring_allreduce(comm, x, op=MPI.SUM):\n"
                                                              "    out = x.copy()\n    WORLD.Allreduce(x, out, op)\n"
                                                              "    return out"),
    }
    t0 = time.monotonic()
    first, results, json_path = _grade(tmp_path, lab, students, timeout=20)
    took = time.monotonic() - t0
    assert first["honest"] == (True, "passed")
    assert not any(_escapes(json_path).values()), "none of them tried to leave the sandbox, the MPI engines included"
    assert not first["library"][0] and "uses labkit's reference (labkit.collectives.ring_allreduce)" in first["library"][1]
    assert not first["patch_check"][0] and "recorded nothing" in first["patch_check"][1]
    assert not first["raises"][0] and "your function raised ValueError: chunk sizes differ" in first["raises"][1]
    assert not first["died"][0] and "kernel" in first["died"][1], first["died"]
    assert not first["world"][0] and "used MPI.COMM_WORLD.Allreduce" in first["world"][1], first["world"]
    assert not first["world_kept"][0] and re.search(  # MPICH's ranks spin while they wait: CPU-seconds, or the clock
        r"stopped after (20 CPU-seconds of work|90 s without finishing)", first["world_kept"][1]), first["world_kept"]
    assert "the MPI engines were stopped with it" in first["world_kept"][1]
    # the hung engines were killed, not waited for at every later cell: each of the 7 notebooks within its cells'
    # limits (a class of these once took 15 minutes and more on one notebook)
    assert took < 7 * 60, f"grading took {took:.0f} s"
    assert not _no_process_mentions("ipengine") and not _no_process_mentions("ipcontroller")
    assert not _no_process_mentions("labkit-sandbox-")


# ---- lab 05: CUDA C on the emulator ---------------------------------------------------------------------------------

CUDA_KEEP = ["c01", "c02", "c06", "c07"]


@needs_sandbox
def test_cuda_exercise_attacks_fail(tmp_path):
    lab = _lab("05_", CUDA_KEEP, tmp_path / "instructor")
    solution = _solution(_cell(nbformat.read(lab, as_version=4), "c06").source)
    wrong = solution.replace("acc += As[ty][k] * Bs[k][tx];", "acc += As[ty][k] * Bs[k][tx] + 0.5f;")
    assert wrong != solution
    students = {
        "honest": lambda nb: _cell(nb, "c06").__setitem__("source", solution),
        "wrong": lambda nb: _cell(nb, "c06").__setitem__("source", wrong),
        "library_source": lambda nb: _cell(nb, "c06").__setitem__(
            "source", "import labkit, pathlib\nTILED_MATMUL = (pathlib.Path(labkit.__file__).parent / 'kernels' / "
                      "'matmul.cu').read_text()"),
        "patch_check": lambda nb: (_cell(nb, "c06").__setitem__("source", wrong),
                                   _before(nb, "c07", "check.tiled_matmul = lambda *a, **k: None")),
        "patch_numpy": lambda nb: (_cell(nb, "c06").__setitem__("source", wrong),
                                   _before(nb, "c07", "np.isclose = lambda a, b, **k: np.ones(np.shape(a), bool)")),
    }
    first, results, json_path = _grade(tmp_path, lab, students, timeout=60)
    assert first["honest"] == (True, "passed")
    assert not any(_escapes(json_path).values()), "none of them tried to leave the sandbox (the emulator compiles)"
    assert not first["wrong"][0] and "(spec)" in first["wrong"][1]
    assert not first["library_source"][0] and "uses labkit's reference (labkit/kernels/matmul.cu" in first["library_source"][1]
    assert not first["patch_check"][0] and "recorded nothing" in first["patch_check"][1]
    assert not first["patch_numpy"][0] and "(spec)" in first["patch_numpy"][1]


def test_without_a_sandbox_grading_refuses_unless_told_no_sandbox_and_then_says_so(tmp_path, capsys, monkeypatch):
    (tmp_path / "subs" / "ana").mkdir(parents=True)
    nbformat.write(nbformat.v4.new_notebook(cells=[new_code_cell("print(1)")]), tmp_path / "subs" / "ana" / "a.ipynb")
    with monkeypatch.context() as m:
        m.setattr(sandbox, "available", lambda: (False, "bubblewrap is not installed"))
        with pytest.raises(grade.NoSandbox, match="bubblewrap is not installed.*--no-sandbox"):
            grade.grade(tmp_path / "subs", tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "grades.json").exists(), "nothing graded, nothing written"
    _, _, json_path = grade.grade(tmp_path / "subs", tmp_path / "out", progress=False, isolate=False)
    assert "isolation turned off (--no-sandbox): the submissions' code runs with your rights" in capsys.readouterr().err
    data = json.loads(json_path.read_text())
    assert data["isolated"] is False and data["isolation"] == "none"
    assert "NOT isolated: graded with --no-sandbox" in exports.gradescope_result(data["students"]["ana"], data)["output"]


@needs_sandbox
def test_a_data_folder_behind_a_symbolic_link_is_where_labkit_data_names_it(tmp_path, monkeypatch):
    """LABKIT_DATA=/tmp/x/link/data with link -> the real folder: the sandboxed notebook finds the data at the name it
    is given (bound where the link points, and at that name)."""
    real = tmp_path / "real" / "data"
    (real / "mnist").mkdir(parents=True)
    (real / "mnist" / "marker").write_text("here")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.setenv("LABKIT_DATA", str(tmp_path / "link" / "data"))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = sandbox.environment(scratch)
    assert env["LABKIT_DATA"] == str(tmp_path / "link" / "data")
    argv = sandbox.bwrap_args(scratch, env) + ["--", "cat", str(tmp_path / "link" / "data" / "mnist" / "marker"),
                                               str(real / "mnist" / "marker")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout == "herehere", done.stderr
