"""labkit grade: the reference solutions pass, the student versions fail clearly, an endless loop costs one exercise."""

import csv
import hashlib
import json
import re
import tempfile

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from test_grading_attacks import SERIAL_KEEP, _lab

from labkit import cli
from labkit.grading import assign, grade, notebook

ENDLESS = new_notebook(cells=[
    new_markdown_cell("# Lab 99"),
    new_code_cell('PROFILE = "quick"', metadata={"tags": ["parameters"]}),
    new_code_cell("from labkit import check, mlp"),
    new_code_cell("def accumulate(params, x, Y, acc):\n    while True:\n        pass"),
    new_code_cell("check.accumulate(accumulate)"),
    new_code_cell("def accumulate(params, x, Y, acc):\n    total = 0.0\n    for k in range(x.shape[0]):\n"
                  "        loss, grads = mlp.loss_and_grads_per_sample(params, x[k:k + 1], Y[k:k + 1])\n"
                  "        total += loss\n        for (aW, ab), (dW, db) in zip(acc, grads):\n"
                  "            aW += dW\n            ab += db\n    return total"),
    new_code_cell("check.accumulate(accumulate)"),
    new_code_cell("check.accumulate(None)  # a wrong call fails with its message"),
])


HONEST_ACCUMULATE = ENDLESS.cells[5].source
WORK_OR_WAIT = new_notebook(cells=[
    new_markdown_cell("# Lab 97"),
    new_code_cell('PROFILE = "quick"', metadata={"tags": ["parameters"]}),
    new_code_cell("from labkit import check, mlp"),
    # 2.5 CPU-seconds of work, then the right answer: under a 4 s limit however busy the machine
    new_code_cell("import time\nt = time.process_time()\nwhile time.process_time() - t < 2.5:\n    pass\n"
                  + HONEST_ACCUMULATE),
    new_code_cell("check.accumulate(accumulate)"),
    new_code_cell("def accumulate(params, x, Y, acc):\n    import time\n    time.sleep(3600)"),  # no work, no end
    new_code_cell("check.accumulate(accumulate)"),  # the clock stops it
])


@pytest.mark.sandbox
@pytest.mark.notebooks
@pytest.mark.slow
def test_a_cells_limit_is_its_work_so_a_busy_machine_fails_no_honest_cell_and_the_clock_stops_a_wait(tmp_path):
    """Beside a busy loop on every core, a cell that does 2.5 CPU-seconds of work under a limit of 4 passes, though it
    takes longer than 4 s of the clock; a cell that sleeps is stopped by the clock, after 3 x 4 + 30 s, and the
    message says it did no work."""
    import os
    import subprocess
    import sys
    import time

    (tmp_path / "subs" / "bo").mkdir(parents=True)
    nbformat.write(WORK_OR_WAIT, tmp_path / "subs" / "bo" / "97_work.ipynb")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        t0 = time.monotonic()
        results, _, _ = grade.grade(tmp_path / "subs", tmp_path / "out", timeout=4, progress=False)
        took = time.monotonic() - t0
    finally:
        for b in busy:
            b.kill()
            b.wait()
    assert [(r.exercise, r.passed) for r in results] == [("accumulate", True), ("accumulate#2", False)], results
    assert notebook.hang_limit(4) == 42
    done = re.search(r"stopped after 42 s without finishing, having done ([0-9.]+) CPU-seconds of work",
                     results[1].message)
    assert done and float(done.group(1)) < 2, results[1].message  # the check's own setup, no more
    assert "a deadlock, or a wait that never ends" in results[1].message
    assert took < 42 + 60, took


def test_exercises_are_the_check_calls_with_repeats_numbered():
    assert grade.exercises_in(ENDLESS) == [(4, "accumulate"), (6, "accumulate#2"), (7, "accumulate#3")]


def test_submissions_by_folder_or_by_file(tmp_path):
    (tmp_path / "ana").mkdir()
    (tmp_path / "ana" / "02_x.ipynb").write_text("{}")
    (tmp_path / "ana" / ".ipynb_checkpoints").mkdir()
    (tmp_path / "ana" / ".ipynb_checkpoints" / "02_x-checkpoint.ipynb").write_text("{}")
    (tmp_path / "ben_02.ipynb").write_text("{}")
    assert [(s, p.name) for s, p in grade.submissions(tmp_path)] == [("ana", "02_x.ipynb"), ("ben_02", "ben_02.ipynb")]
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no notebooks"):
        grade.submissions(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no submissions folder"):
        grade.submissions(tmp_path / "missing")


RUNAWAY_KERNEL = new_notebook(cells=[
    new_markdown_cell("# Lab 98"),
    new_code_cell('PROFILE = "quick"', metadata={"tags": ["parameters"]}),
    new_code_cell("import numpy as np\nfrom labkit import check"),
    new_code_cell('SRC = r"""extern \"C\" __global__ void block_sum(const float* x, float* out, int n)\n'
                  '{ __shared__ float s[256]; int k = 0; while (true) { k++; } atomicAdd(out, s[0]); }"""'),
    new_code_cell("check.block_reduction(SRC)"),
    new_code_cell("print('the next cell runs')"),
])


@pytest.mark.sandbox
@pytest.mark.notebooks
def test_a_runaway_kernel_costs_its_exercise_within_the_cell_limit(tmp_path):
    """An endless loop in a CUDA C exercise is stopped at the grader's limit (not the emulator's 120 s)."""
    import time

    (tmp_path / "subs" / "di").mkdir(parents=True)
    nbformat.write(RUNAWAY_KERNEL, tmp_path / "subs" / "di" / "98_kernel.ipynb")
    t0 = time.monotonic()
    results, _, _ = grade.grade(tmp_path / "subs", tmp_path / "out", timeout=8, progress=False)
    assert time.monotonic() - t0 < 60
    assert [(r.exercise, r.passed) for r in results] == [("block_reduction", False)]
    assert "stopped after 8 CPU-seconds of work, the limit per cell" in results[0].message
    executed = nbformat.read(tmp_path / "out" / "executed" / "di" / "05_cuda_kernels.ipynb", as_version=4)
    assert any("the next cell runs" in o.get("text", "") for o in executed.cells[-1].outputs)


@pytest.mark.sandbox
@pytest.mark.notebooks
def test_an_endless_loop_is_stopped_and_the_rest_still_graded(tmp_path):
    (tmp_path / "subs" / "cy").mkdir(parents=True)
    nbformat.write(ENDLESS, tmp_path / "subs" / "cy" / "99_loop.ipynb")
    results, csv_path, json_path = grade.grade(tmp_path / "subs", tmp_path / "out", timeout=8, progress=False)
    assert [(r.exercise, r.passed) for r in results] == [("accumulate", False), ("accumulate#2", True), ("accumulate#3", False)]
    assert "stopped after 8 CPU-seconds of work, the limit per cell" in results[0].message
    assert results[2].message.startswith("ExerciseError")
    rows = list(csv.DictReader(open(csv_path)))
    assert [r["passed"] for r in rows] == ["0", "1", "0"] and rows[0]["student"] == "cy"
    summary = json.loads(json_path.read_text())["students"]["cy"]["02_cpu_threads.ipynb"]
    assert summary["passed"] == 1 and summary["exercises"] == 3
    assert (tmp_path / "out" / "executed" / "cy" / "02_cpu_threads.ipynb").exists()


def test_a_px_cell_is_graded_by_the_engines_own_error():
    """A %%px check cell ends in ipyparallel's AlreadyDisplayedError; the message must be rank 0's ExerciseError."""
    import nbformat

    ansi = "\x1b[31m"
    cell = nbformat.v4.new_code_cell("%%px\ncheck.ring_allreduce(my_ring_allreduce)")
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stderr", text=(
            f"[1:execute]\n{ansi}ExerciseError\x1b[39m   Traceback (most recent call last)\n----> 1 check.ring_allreduce(f)\n"
            "ExerciseError: ring allreduce: failed (rank 0 shows what went wrong)\n")),
        nbformat.v4.new_output("stream", name="stderr", text=(
            "[0:execute]\nTraceback (most recent call last)\n"
            "labkit.check.ExerciseError: ring allreduce: 2 ranks, n=5: rank 1 got [3. 3.], expected [2. 2.]\n")),
        nbformat.v4.new_output("error", ename="AlreadyDisplayedError", evalue="2 errors", traceback=["2 errors"]),
    ]
    passed, message = notebook._outcome(cell, 60)
    assert not passed
    assert message == "ExerciseError: ring allreduce: 2 ranks, n=5: rank 1 got [3. 3.], expected [2. 2.] (on the MPI engines)"
    cell.outputs = cell.outputs[-1:]  # nothing printed by the engines: the error itself
    assert notebook._outcome(cell, 60) == (False, "AlreadyDisplayedError: 2 errors")


def test_assign_records_the_release_and_locks_the_given_cells(tmp_path):
    lab = _lab("01_", SERIAL_KEEP, tmp_path / "instructor")  # lab 01's backprop exercise alone
    assign.write_student_versions([lab], tmp_path / "student", release_dir=tmp_path / "release")
    record = json.loads((tmp_path / "release" / assign.RELEASE_FILE).read_text())
    entry = record["notebooks"][lab.name]
    student = nbformat.read(tmp_path / "student" / lab.name, as_version=4)
    by_id = {c.id: c for c in student.cells}
    assert [e["name"] for e in entry["exercises"]] == ["backprop"] and record["labkit_version"]
    check_cell = by_id[entry["exercises"][0]["check_cell_id"]]
    assert check_cell.source == entry["exercises"][0]["check_source"] == "check.backprop(my_backprop)"
    assert check_cell.metadata["editable"] is False and check_cell.metadata["deletable"] is False
    exercise = next(c for c in student.cells if "raise NotImplementedError" in c.source)
    params = next(c for c in student.cells if "parameters" in c.metadata.get("tags", []))
    assert "editable" not in exercise.metadata and "editable" not in params.metadata  # the student writes there
    with pytest.raises(ValueError, match="not in the students' folder"):
        assign.write_student_versions([lab], tmp_path / "student", release_dir=tmp_path / "student" / "release")


@pytest.mark.sandbox
@pytest.mark.notebooks
def test_grading_by_the_release_names_deleted_edited_and_converted_check_cells(tmp_path):
    lab = _lab("01_", SERIAL_KEEP, tmp_path / "instructor")  # lab 01's backprop exercise alone
    assign.write_student_versions([lab], tmp_path / "handout", release_dir=tmp_path / "release")
    teacher = nbformat.read(lab, as_version=4)
    solution = next(c for c in teacher.cells if assign.BEGIN in c.source)
    check_id = json.loads((tmp_path / "release" / assign.RELEASE_FILE).read_text())["notebooks"][lab.name][
        "exercises"][0]["check_cell_id"]

    def submit(student, change):
        nb = nbformat.read(tmp_path / "handout" / lab.name, as_version=4)
        change(nb)
        (tmp_path / "subs" / student).mkdir(parents=True)
        nbformat.write(nb, tmp_path / "subs" / student / lab.name)

    def solve(nb):
        next(c for c in nb.cells if c.id == solution.id).source = solution.source

    def cell(nb):
        return next(c for c in nb.cells if c.id == check_id)

    submit("honest", solve)
    submit("deleter", lambda nb: (solve(nb), nb.cells.remove(cell(nb))))
    wrapped = "try:\n    check.backprop(my_backprop)\nexcept Exception:\n    pass"
    submit("wrapper", lambda nb: setattr(cell(nb), "source", wrapped))
    submit("converter", lambda nb: nb.cells.__setitem__(nb.cells.index(cell(nb)), new_markdown_cell("check", id=check_id)))
    (tmp_path / "subs" / "absent").mkdir()
    nbformat.write(new_notebook(cells=[new_code_cell("print('my notes')")]), tmp_path / "subs" / "absent" / "notes.ipynb")
    results, _, json_path = grade.grade(tmp_path / "subs", tmp_path / "out", timeout=60, progress=False,
                                        release=tmp_path / "release")
    got = {(r.student, r.notebook): (r.passed, r.message) for r in results}
    assert got[("honest", lab.name)] == (True, "passed")
    assert got[("deleter", lab.name)] == (False, "its check cell is missing from the notebook (deleted?)")
    passed, message = got[("wrapper", lab.name)]
    assert not passed and message.startswith("its check cell was edited") and "not written yet" in message
    assert got[("converter", lab.name)] == (False, "its check cell was turned into a markdown cell")
    assert got[("absent", lab.name)] == (False, "notebook not handed in")
    data = json.loads(json_path.read_text())
    assert len(data["release_sha256"]) == 64 and data["labkit_version"] and data["graded_at"]
    assert len(data["students"]["honest"][lab.name]["sha256"]) == 64


QUICK = new_notebook(cells=[
    new_markdown_cell("# Lab 97"),
    new_code_cell('PROFILE = "quick"', metadata={"tags": ["parameters"]}),
    new_code_cell("import os\nfrom labkit import check"),
    new_code_cell("check.karp_flatt(lambda p, s: (1 / s - 1 / p) / (1 - 1 / p))"),
    new_code_cell("check.karp_flatt(None)"),
    new_code_cell("print('threads', os.environ.get('OMP_NUM_THREADS'))"),
])


SHOWN_ONLY = new_notebook(cells=[  # right on the inputs the check showed it (its first 9 calls), wrong on any others
    new_markdown_cell("# Lab 97"),
    new_code_cell('PROFILE = "quick"', metadata={"tags": ["parameters"]}),
    new_code_cell("from labkit import check\ncalls = []"),
    new_code_cell("def karp_flatt(p, s):\n    calls.append(1)\n    e = (1 / s - 1 / p) / (1 - 1 / p)\n"
                  "    return e if len(calls) <= 9 else e + 0.5"),
    new_code_cell("check.karp_flatt(karp_flatt)"),
    new_code_cell("check.karp_flatt(lambda p, s: (1 / s - 1 / p) / (1 - 1 / p))"),
])


@pytest.mark.sandbox
@pytest.mark.notebooks
def test_a_hidden_part_runs_the_check_again_on_inputs_drawn_apart_and_only_the_instructor_reads_it(tmp_path, capsys):
    (tmp_path / "subs" / "ana").mkdir(parents=True)
    nbformat.write(SHOWN_ONLY, tmp_path / "subs" / "ana" / "97_quick.ipynb")
    assert cli.main(["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "x"), "--hidden-part", "karp_flat"]) == 2
    assert "karp_flat is no exercise labkit knows" in capsys.readouterr().err
    assert cli.main(["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "out"), "--hidden-part", "karp_flatt",
                     "--feedback", str(tmp_path / "fb"), "--export", "gradescope"]) == 0
    rows = list(csv.DictReader((tmp_path / "out" / "grades.csv").open()))
    got = {r["exercise"]: (r["passed"], r["message"]) for r in rows}
    assert list(got) == ["karp_flatt", "karp_flatt~hidden", "karp_flatt#2", "karp_flatt#2~hidden"]
    assert got["karp_flatt"] == ("1", "passed") and got["karp_flatt#2"] == got["karp_flatt#2~hidden"] == ("1", "passed")
    assert got["karp_flatt~hidden"][0] == "0" and "Karp-Flatt" in got["karp_flatt~hidden"][1]  # the instructor reads it
    data = json.loads((tmp_path / "out" / "grades.json").read_text())
    assert data["hidden_parts"] == ["karp_flatt"] and data["students"]["ana"]["12_speedup_plots.ipynb"]["passed"] == 3
    executed = nbformat.read(tmp_path / "out" / "executed" / "ana" / "12_speedup_plots.ipynb", as_version=4)
    (cell,) = [c for c in executed.cells if c.source == "check.karp_flatt(karp_flatt)"]
    shown = "".join(o.get("text", "") for o in cell.outputs)
    assert shown.count("checks passed") == 1  # the hidden run printed nothing into the notebook
    page = (tmp_path / "fb" / "ana" / "12_speedup_plots.html").read_text()
    assert "karp_flatt (hidden part)" in page and "a hidden check failed" in page
    assert got["karp_flatt~hidden"][1].splitlines()[0][:60] not in page  # its message stays with the instructor
    tests = json.loads((tmp_path / "out" / "gradescope" / "ana.json").read_text())["tests"]
    hidden = [t for t in tests if "(hidden part)" in t["name"]]
    assert len(hidden) == 2 and all(t["visibility"] == "after_published" for t in hidden)
    assert [t["output"] for t in hidden] == ["a hidden check failed", "passed"]


@pytest.mark.sandbox
@pytest.mark.notebooks
def test_jobs_grade_in_parallel_with_the_same_results_in_the_same_order(tmp_path, capsys):
    for student in ("ana", "ben", "cy"):
        (tmp_path / "subs" / student).mkdir(parents=True)
        nbformat.write(QUICK, tmp_path / "subs" / student / "97_quick.ipynb")
    one, _, _ = grade.grade(tmp_path / "subs", tmp_path / "out1", timeout=60, progress=False, jobs=1)
    two, _, json_path = grade.grade(tmp_path / "subs", tmp_path / "out2", timeout=60, progress=False, jobs=2)
    assert [(r.student, r.exercise, r.passed) for r in two] == [(r.student, r.exercise, r.passed) for r in one]
    assert [r.passed for r in two[:2]] == [True, False]
    executed = nbformat.read(tmp_path / "out2" / "executed" / "ben" / "12_speedup_plots.ipynb", as_version=4)
    from labkit.machine import usable_cores

    assert f"threads {max(1, usable_cores() // 2)}" in executed.cells[-1].outputs[0]["text"]  # a share of the cores
    with pytest.raises(ValueError, match="jobs must be a positive int"):
        grade.grade(tmp_path / "subs", tmp_path / "out3", jobs=0)
    err = capsys.readouterr().err
    assert "no release record" in err  # a warning on stderr, never in the JSON on stdout
    assert f"--jobs 2: {min(2, usable_cores())} notebooks at a time" in err
    run = json.loads(json_path.read_text())
    assert (run["jobs"], run["usable_cores"]) == (min(2, usable_cores()), usable_cores())


def test_jobs_never_give_a_notebook_less_than_a_core_and_say_what_they_did(capsys):
    assert grade.share_cores(1, 2) == (1, None)
    assert grade.share_cores(2, 8) == (2, 4)
    assert grade.share_cores(3, 8) == (3, 2)
    assert grade.share_cores(8, 2) == (2, 1)
    err = capsys.readouterr().err
    assert "--jobs 8: 2 notebooks at a time (not 8: only 2 cores are usable here, and a notebook gets at least one)" \
        in err and "threads set to 1 of the 2 cores" in err


def test_workers_are_forked_by_the_fork_server_and_start_with_the_environment_and_folder_of_now(tmp_path, monkeypatch):
    """The fork server keeps the environment and folder of its start; a pool's workers get those of the pool's."""
    import multiprocessing
    import os
    import sys

    from labkit.grading import workers

    if "forkserver" not in multiprocessing.get_all_start_methods():
        pytest.skip(f"multiprocessing has no fork server on {sys.platform}")
    workers.start()  # before the variable and the folder change, as the command line starts it
    monkeypatch.setenv("LABKIT_TEST_WORKER_ENV", "set after the fork server started")
    monkeypatch.chdir(tmp_path)
    pool = workers.pool(2)
    try:
        assert pool.submit(os.getenv, "LABKIT_TEST_WORKER_ENV").result(60) == "set after the fork server started"
        assert pool.submit(os.getcwd).result(60) == str(tmp_path)
        assert pool.submit(os.getppid).result(60) != os.getpid()  # a child of the fork server, not of this process
    finally:
        pool.shutdown()
    assert workers.context().get_start_method() == "forkserver"


KARP_FLATT = "def karp_flatt(p, s):\n    return (1 / s - 1 / p) / (1 - 1 / p)"


@pytest.mark.sandbox
@pytest.mark.notebooks
def test_parts_of_a_class_merge_into_the_grades_of_one_run(tmp_path, capsys):
    """What a SLURM array does: each task grades --part K/N of the students; --merge puts the parts together."""
    for student, body in (("ana", KARP_FLATT), ("ben", KARP_FLATT.replace("1 / s - 1 / p", "1 / p - 1 / s")),
                          ("cy", KARP_FLATT)):
        (tmp_path / "subs" / student).mkdir(parents=True)
        nbformat.write(new_notebook(cells=[new_code_cell("from labkit import check"), new_code_cell(body),
                                           new_code_cell("check.karp_flatt(karp_flatt)")]),
                       tmp_path / "subs" / student / "12_x.ipynb")
    for k in range(2):
        assert cli.main(["grade", str(tmp_path / "subs"), "--out", str(tmp_path / f"part{k}"), "--part", f"{k}/2"]) == 0
    assert cli.main(["grade", "--merge", str(tmp_path / "part0"), str(tmp_path / "part1"),
                     "--out", str(tmp_path / "all")]) == 0
    whole, _, _ = grade.grade(tmp_path / "subs", tmp_path / "whole", progress=False)
    merged = list(csv.DictReader(open(tmp_path / "all" / "grades.csv")))
    assert [(r["student"], r["passed"]) for r in merged] == [(r.student, str(int(r.passed))) for r in whole] == [
        ("ana", "1"), ("ben", "0"), ("cy", "1")]
    data = json.loads((tmp_path / "all" / "grades.json").read_text())
    assert [p["part"] for p in data["parts"]] == [[0, 2], [1, 2]]
    assert "ben" in json.loads((tmp_path / "part1" / "grades.json").read_text())["students"]
    # a later run regrades: its grade is kept; two shares of one split that both hold a student are refused
    assert [r.student for r in grade.merge([tmp_path / "part0", tmp_path / "whole"], tmp_path / "later")[0]] == [
        "ana", "ben", "cy"]
    doubled = json.loads((tmp_path / "part1" / "grades.json").read_text())
    doubled["students"] |= json.loads((tmp_path / "part0" / "grades.json").read_text())["students"]
    (tmp_path / "doubled").mkdir()
    (tmp_path / "doubled" / "grades.json").write_text(json.dumps(doubled))
    with pytest.raises(ValueError, match="was graded in two shares of one split"):
        grade.merge([tmp_path / "part0", tmp_path / "doubled"], tmp_path / "bad")
    with pytest.raises(SystemExit, match="K/N"):
        cli.main(["grade", str(tmp_path / "subs"), "--part", "2/2"])


ASKED = new_notebook(cells=[
    new_markdown_cell("# Lab 96"),
    new_code_cell('PROFILE = "quick"', metadata={"tags": ["parameters"]}),
    new_markdown_cell("**Question (predict).** How many kB does rank 0 send?"),
    new_code_cell("predicted_kB = 240  # kB", metadata={"labkit": {"answer": "96-kB", "kind": "predict", "points": 1}}),
    new_code_cell("from labkit.questions import compare\ncompare(predicted_kB, 240.0, 'kB')"),
    new_markdown_cell("**Question (explain).** Why?"),
    new_markdown_cell("Each chunk goes around twice.", metadata={"labkit": {"answer": "96-why", "kind": "explain",
                                                                           "points": 2}}),
])


@pytest.mark.notebooks
def test_answers_are_collected_per_question_and_their_scores_kept(tmp_path, capsys):
    nb_path = tmp_path / "96_asked.ipynb"
    nbformat.write(ASKED, nb_path)
    assign.write_student_versions([nb_path], tmp_path / "handout", release_dir=tmp_path / "release")
    handout = nbformat.read(tmp_path / "handout" / nb_path.name, as_version=4)
    assert handout.cells[3].source == "predicted_kB = ...  # kB" and handout.cells[3].metadata["editable"] is True
    for student, (kB, why) in {"ann": ("300", "The ring <b>halves</b> it."), "bob": (None, None)}.items():
        nb = nbformat.read(tmp_path / "handout" / nb_path.name, as_version=4)
        if kB:
            nb.cells[3].source = f"predicted_kB = {kB}"
            nb.cells[6].source = why
        (tmp_path / "subs" / student).mkdir(parents=True)
        nbformat.write(nb, tmp_path / "subs" / student / nb_path.name)
    (tmp_path / "subs" / "cyd").mkdir()  # handed in nothing of it
    nbformat.write(new_notebook(cells=[new_code_cell("1")]), tmp_path / "subs" / "cyd" / "notes.ipynb")

    def run():
        grade.grade(tmp_path / "subs", tmp_path / "out", progress=False, release=tmp_path / "release", isolate=False)
        return json.loads((tmp_path / "out" / "grades.json").read_text())["students"]

    run()
    page = (tmp_path / "out" / "answers.html").read_text()
    assert "96-why" in page and "The ring &lt;b&gt;halves&lt;/b&gt; it." in page and "2 of 3 blank" in page
    rows = list(csv.DictReader(open(tmp_path / "out" / "answers.csv")))
    assert {(r["student"], r["question"], r["blank"]) for r in rows} >= {("ann", "96-kB", "0"), ("bob", "96-kB", "1")}
    assert next(r for r in rows if r["student"] == "cyd")["note"] == "notebook not handed in"
    for r in rows:  # the instructor scores ann's answers; 5 is out of range for a 2-point question
        r["score"] = {"96-kB": "1", "96-why": "5"}[r["question"]] if r["student"] == "ann" else ""
    with open(tmp_path / "out" / "answers.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=rows[0].keys())
        w.writeheader()
        w.writerows(rows)
    students = run()
    assert "outside 0..2" in capsys.readouterr().err
    ann = students["ann"][nb_path.name]
    assert (ann["answer_points"], ann["answer_score"], ann["answers_unscored"]) == (3, 1, 1)
    assert students["bob"][nb_path.name]["answers_unscored"] == 0  # blank: nothing to read
    sub = tmp_path / "subs" / "ann" / nb_path.name  # ann changes her prediction: its score no longer counts
    nb = nbformat.read(sub, as_version=4)
    nb.cells[3].source = "predicted_kB = 160"
    nbformat.write(nb, sub)
    students = run()
    assert "changed since it was scored" in capsys.readouterr().err
    assert students["ann"][nb_path.name]["answer_score"] == 0


@pytest.mark.notebooks
def test_an_empty_a_broken_and_an_old_format_notebook_each_get_their_rows_and_the_class_goes_on(tmp_path):
    import nbformat.v3 as v3

    solved = new_notebook(cells=[
        new_code_cell('PROFILE = "quick"', metadata={"tags": ["parameters"]}),
        new_code_cell("from labkit import check\n"
                      "def mine(w, n):\n    have, out = [0] * w, []\n    for k in range(n):\n"
                      "        out.append(k - have[k % w])\n        have[k % w] = k + 1\n    return out"),
        new_code_cell("check.round_robin_staleness(mine)"),
    ])
    subs = tmp_path / "subs"
    for student in ("ann", "bob", "cyd", "dan"):
        (subs / student).mkdir(parents=True)
    nbformat.write(solved, subs / "ann" / "09_x.ipynb")
    (subs / "bob" / "09_x.ipynb").write_text("")  # an upload that failed
    (subs / "cyd" / "09_x.ipynb").write_text("{this is not json")
    old = v3.new_notebook(worksheets=[v3.new_worksheet(cells=[
        v3.new_code_cell(input='PROFILE = "quick"'),
        v3.new_code_cell(input="from labkit import check\ncheck.round_robin_staleness(lambda w, n: [0] * n)")])])
    (subs / "dan" / "09_x.ipynb").write_text(v3.writes_json(old))  # nbformat 3: read, converted, graded
    results, csv_path, _ = grade.grade(subs, tmp_path / "out", progress=False, isolate=False)
    got = {r.student: (r.passed, r.message) for r in results}
    assert got["ann"][0] and not got["bob"][0] and "empty (0 bytes)" in got["bob"][1]
    assert "not a notebook that can be read" in got["cyd"][1]
    assert not got["dan"][0] and "staleness of workers taking turns" in got["dan"][1]  # its check ran and failed
    assert csv_path.is_file()


def test_the_engines_of_a_notebook_are_found_below_its_kernel():
    # without a sandbox's cgroup, the MPI engines to stop after a hung %%px cell are the kernel's descendants
    import subprocess
    import sys

    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                               "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
                               "print(child.pid, flush=True)\ntime.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(parent.stdout.readline())
        assert grandchild in notebook._descendants(parent.pid)
        assert parent.pid not in notebook._descendants(parent.pid)
        assert notebook.ENGINE_PROGRAM.search("/venv/bin/mpiexec") and notebook.ENGINE_PROGRAM.search(
            "ipyparallel.engine") and not notebook.ENGINE_PROGRAM.search("ipykernel_launcher")
    finally:
        import os
        import signal

        os.kill(grandchild, signal.SIGKILL)
        parent.kill()
        parent.wait()


SLOW = new_notebook(cells=[
    new_markdown_cell("# Lab 96"),
    new_code_cell('PROFILE = "quick"', metadata={"tags": ["parameters"]}),
    new_code_cell("import time\nfrom labkit import check\ntime.sleep(25)"),
    new_code_cell("check.karp_flatt(lambda p, s: (1 / s - 1 / p) / (1 - 1 / p))"),
])


def _marked(mark: str) -> list[str]:
    """The processes whose environment holds ``mark``: what a run started, wherever it was re-parented."""
    from pathlib import Path

    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if mark.encode() in environ.read_bytes():
                found.append(f"{environ.parent.name}: {(environ.parent / 'cmdline').read_bytes()[:120]!r}")
        except OSError:
            continue
    return found


@pytest.mark.sandbox
@pytest.mark.notebooks
@pytest.mark.slow
def test_sigterm_stops_every_worker_and_sandbox_and_resume_grades_only_the_rest(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    import uuid

    for student, nb in (("ana", QUICK), ("ben", QUICK), ("cy", SLOW), ("dee", SLOW)):
        (tmp_path / "subs" / student).mkdir(parents=True)
        nbformat.write(nb, tmp_path / "subs" / student / f"9{6 + (nb is QUICK)}_lab.ipynb")
    mark = f"LABKIT_TEST_RUN={uuid.uuid4().hex}"
    env = {**os.environ, "LABKIT_TEST_RUN": mark.split("=")[1], "LABKIT_PROGRESS": "0"}
    argv = [sys.executable, "-m", "labkit", "grade", str(tmp_path / "subs"), "--out", str(tmp_path / "out"),
            "--jobs", "2", "--timeout", "60"]
    before = set(os.listdir(tempfile.gettempdir()))  # this run's own (tests/leaks.py)
    run = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    progress = tmp_path / "out" / grade.PROGRESS
    deadline = time.monotonic() + 240
    while len(list(progress.glob("*.json"))) < 3 and time.monotonic() < deadline:  # run.json and the two quick ones
        assert run.poll() is None, run.communicate()
        time.sleep(0.5)
    assert len(list(progress.glob("*.json"))) == 3, "the two quick notebooks were not kept in time"
    run.send_signal(signal.SIGTERM)  # while the two slow ones sleep in their sandboxes
    _, err = run.communicate(timeout=90)
    assert run.returncode == 130 and "interrupted" in err and "--resume" in err, err
    time.sleep(1)
    assert _marked(mark.split("=")[1]) == [], "processes outlived the interrupted run"
    assert not (tmp_path / "out" / "grades.csv").exists() and not (tmp_path / "out" / "grades.json").exists()
    def left() -> list[str]:
        return [d for d in set(os.listdir(tempfile.gettempdir())) - before if d.startswith(("labkit-sandbox-", "labkit-grader-"))]

    # another test file grading on another worker meanwhile has folders of its own, which it removes when its run ends
    # (CI saw one); this run's, if it left any, stay
    deadline = time.monotonic() + 180
    while left() and time.monotonic() < deadline:
        time.sleep(2)
    assert not left()
    kept = {json.loads(f.read_text())["student"]: json.loads(f.read_text())["seconds"]
            for f in progress.glob("*.json") if f.name != "run.json"}
    assert sorted(kept) == ["ana", "ben"]
    with pytest.raises(subprocess.CalledProcessError):  # other options than the interrupted run's: refused
        subprocess.run(argv + ["--resume", "--timeout", "90"], env=env, cwd=tmp_path, check=True, capture_output=True)
    done = subprocess.run(argv + ["--resume"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    students = json.loads((tmp_path / "out" / "grades.json").read_text())["students"]
    lab = "12_speedup_plots.ipynb"
    assert {s: students[s][lab]["seconds"] for s in ("ana", "ben")} == {s: round(t, 1) for s, t in kept.items()}
    assert [students[s]["12_speedup_plots.ipynb"]["passed"] for s in ("cy", "dee")] == [1, 1]
    assert not progress.exists() and _marked(mark.split("=")[1]) == []


LAB01 = "01_serial_backprop.ipynb"


def _run_folder(folder, answered: dict, executed: str = "my run"):
    """An output folder of labkit grade for lab 01: per student ({student: {question: (answer, score)}}) a passed row,
    their answers in grades.json and answers.csv (score "" when unscored), and an executed notebook printing
    ``executed``."""
    from labkit.grading import answers, scores

    data = {"release_sha256": "r" * 64, "labkit_version": "0.test", "profile": "quick", "hidden_parts": [],
            "part": None, "graded_at": "2026-10-05T10:00:00+0000", "students": {}}
    rows = []
    for student, mine in answered.items():
        entry = {"lab": "01", "passed": 1, "exercises": 1, "seconds": 4.2, "results": [
            {"student": student, "notebook": LAB01, "exercise": "backprop", "passed": True, "message": "passed",
             "points": 1}]}
        got = [answers.Answer(student, LAB01, q, "explain", 2, text, False, score=score) for q, (text, score) in
               mine.items()]
        scores.answers_into(entry, [{"question": a.question, "kind": a.kind, "points": 2, "blank": False,
                                     "score": a.score} for a in got])
        scores.total(entry)
        data["students"][student] = {LAB01: entry}
        rows += got
        nbformat.write(new_notebook(cells=[new_code_cell(f"print({executed!r})")]),
                       _mkdir(folder / "executed" / student) / LAB01)
    (folder / "grades.json").write_text(json.dumps(data))
    answers.write(folder, rows, {}, {})
    return folder


def _mkdir(path):
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_merge_keeps_the_executed_notebooks_and_the_hand_scores_of_answers_unchanged(tmp_path, capsys):
    first = _run_folder(tmp_path / "class", {"ana": {"01-a": ("Overhead.", 1.5)},
                                             "bo": {"01-a": ("Calls.", 1.0), "01-b": ("Old.", 2.0)}}, "first run")
    later = _run_folder(tmp_path / "later", {"bo": {"01-a": ("Calls.", None), "01-b": ("New.", None)}}, "regraded")
    _, _, json_path = grade.merge([first, later], tmp_path / "all")
    assert "bo / 01-b: the answer changed since it was scored" in capsys.readouterr().err
    rows = {(r["student"], r["question"]): r["score"] for r in csv.DictReader(open(tmp_path / "all" / "answers.csv"))}
    assert rows == {("ana", "01-a"): "1.5", ("bo", "01-a"): "1", ("bo", "01-b"): ""}  # bo's new 01-b: read it again
    bo = json.loads(json_path.read_text())["students"]["bo"][LAB01]
    assert (bo["answer_score"], bo["answers_unscored"], bo["total"]) == (1.0, 1, 2.0)
    for student, text in (("ana", "first run"), ("bo", "regraded")):  # each from the run whose grade was kept
        assert text in (tmp_path / "all" / "executed" / student / LAB01).read_text()
    from labkit.grading import feedback

    page = feedback.page_notebook(json.loads(json_path.read_text()), tmp_path / "all", "bo", LAB01)
    assert any("regraded" in c.source for c in page.cells)  # the page shows the notebook it says is below


def test_merge_into_a_folder_of_other_grades_is_refused_unless_they_are_merged_too(tmp_path):
    first = _run_folder(tmp_path / "class", {"ana": {"01-a": ("Overhead.", 1.5)}})
    later = _run_folder(tmp_path / "later", {"bo": {"01-a": ("Calls.", None)}})
    other = _run_folder(tmp_path / "other", {"cy": {"01-a": ("Mine.", 2.0)}})
    with pytest.raises(grade.WouldReplace, match=r"already holds grades .* merge them too, first"):
        grade.merge([first, later], other)
    assert "cy" in json.loads((other / "grades.json").read_text())["students"]
    results, _, _ = grade.merge([other, first, later], other)
    assert [r.student for r in results] == ["ana", "bo", "cy"]
    assert [r["score"] for r in csv.DictReader(open(other / "answers.csv"))] == ["1.5", "", "2"]


@pytest.mark.notebooks
@pytest.mark.slow
def test_grading_another_lab_into_the_same_out_keeps_the_grades_answers_and_runs_of_the_first(tmp_path, capsys):
    out = _run_folder(tmp_path / "grades", {"ana": {"01-a": ("Overhead.", 1.5)}}, "lab 01 run")
    (tmp_path / "subs" / "ana").mkdir(parents=True)
    nbformat.write(QUICK, tmp_path / "subs" / "ana" / "97_quick.ipynb")
    argv = ["grade", str(tmp_path / "subs"), "--out", str(out), "--no-sandbox", "--lab", "12", "--export", "gradescope"]
    for _ in range(2):  # lab 12 graded, then graded again: lab 01 stays, lab 12 is replaced, never doubled
        assert cli.main(argv) == 0
    assert "held earlier grades of lab 01 (1 student(s)) that this run did not grade: kept" in capsys.readouterr().err
    data = json.loads((out / "grades.json").read_text())
    assert sorted(data["students"]["ana"]) == [LAB01, "12_speedup_plots.ipynb"] and data["labs"] == ["01", "12"]
    assert data["students"]["ana"][LAB01]["answer_score"] == 1.5 and data["students"]["ana"][LAB01]["seconds"] == 4.2
    rows = [(r["notebook"], r["exercise"], r["passed"]) for r in csv.DictReader(open(out / "grades.csv"))]
    assert rows == [(LAB01, "backprop", "1"), ("12_speedup_plots.ipynb", "karp_flatt", "1"),
                    ("12_speedup_plots.ipynb", "karp_flatt#2", "0")]
    assert [(r["question"], r["score"]) for r in csv.DictReader(open(out / "answers.csv"))] == [("01-a", "1.5")]
    assert "lab 01 run" in (out / "executed" / "ana" / LAB01).read_text()
    tests = json.loads((out / "results.json").read_text())["tests"]  # Gradescope's: every lab of --out
    assert {t["tags"][0] for t in tests} == {LAB01, "12_speedup_plots.ipynb"}
    (out / "grades.json").write_text("{broken")
    with pytest.raises(ValueError, match="move it out of .* or grade into another --out"):
        grade.grade(tmp_path / "subs", out, progress=False, isolate=False)


# -- an open exercise's score: from the replay's verdict line to the row kept -------------------------------------------

TIME = {"label": "modelled time on H100", "value": 12.5, "unit": "µs", "lower_is_better": True}


def _scoring_check(monkeypatch):
    """The replay's karp_flatt made an open exercise's check: it scores 12.5 µs, then judges the answer as before."""
    from types import SimpleNamespace

    from labkit.check import common
    from labkit.check.exercises import exercise
    from labkit.grading import replay

    real = exercise("karp_flatt").check()

    @common.recorded
    def karp_flatt(fn):
        common.scored(TIME["label"], TIME["value"], TIME["unit"])  # before the verdict: a failed answer scores too
        return real(fn)

    monkeypatch.setattr(replay, "exercise", lambda name: SimpleNamespace(check=lambda: karp_flatt))


def test_the_replays_verdict_line_carries_a_passing_answers_score_and_null_for_a_failure(tmp_path, monkeypatch, capsys):
    from conftest import record_check

    from labkit.grading import replay

    right, wrong = (lambda p, s: (1 / s - 1 / p) / (1 - 1 / p)), (lambda p, s: 1 / s - 1 / p)
    assert record_check(monkeypatch, tmp_path / "right", "karp_flatt", right, 77)[0] is True
    assert record_check(monkeypatch, tmp_path / "wrong", "karp_flatt", wrong, 77)[0] is False

    def line(folder):
        replay.main(["karp_flatt", str(folder), "77"])
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    assert line(tmp_path / "right")["score"] is None  # a check that scores nothing
    _scoring_check(monkeypatch)
    passed = line(tmp_path / "right")
    assert passed["passed"] is True and passed["score"] == TIME
    failed = line(tmp_path / "wrong")
    assert failed["passed"] is False and failed["score"] is None  # a failed answer is never ranked
    assert replay.verdict("karp_flatt", tmp_path / "right", 77)[3] == TIME
    assert replay.counted("karp_flatt", tmp_path / "right", 77)[:2] == replay.replay("karp_flatt", tmp_path / "right", 77)


def test_the_mpi_replays_verdict_line_is_read_back_with_its_score(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from labkit.check import capture

    monkeypatch.setattr(capture, "records", lambda folder, check: ["r0", "r1"])  # two ranks' records: mpiexec
    monkeypatch.setattr(capture, "recorded_reference", lambda folder, check: None)
    said = {"passed": True, "message": "passed", "cases": [5, 5], "score": TIME}
    out = f"rank 1 says hello\n{json.dumps(said)}\n"
    monkeypatch.setattr(notebook, "run_mpi", lambda *a, **k: SimpleNamespace(stdout=out, stderr=""))
    assert notebook._replay("ring_allreduce", tmp_path, 7, 60) == (True, "passed", (5, 5), TIME)
    out = json.dumps({**said, "passed": False, "message": "wrong"})  # a failure's score is dropped, whatever it says
    assert notebook._replay("ring_allreduce", tmp_path, 7, 60) == (False, "wrong", (5, 5), None)
    out = json.dumps({k: v for k, v in said.items() if k != "score"})  # a line from before scores: none
    assert notebook._replay("ring_allreduce", tmp_path, 7, 60) == (True, "passed", (5, 5), None)


def test_a_rows_performance_is_kept_through_an_interrupted_runs_progress_and_grades_json(tmp_path):
    sub = tmp_path / "ana.ipynb"
    sub.write_text("{}")
    digest = hashlib.sha256(sub.read_bytes()).hexdigest()
    rows = [notebook.ExerciseResult("ana", "05_cuda_kernels.ipynb", "fast_matmul", True, "passed", cases=(5, 5),
                                    performance=dict(TIME)),
            notebook.ExerciseResult("ana", "05_cuda_kernels.ipynb", "tiled_matmul", False, "wrong")]
    kept = grade._Progress(tmp_path / "out", {"profile": "quick"}, resume=False)
    kept.put("ana", sub, (rows, 3.0, digest, []))
    back, _, _, _ = grade._Progress(tmp_path / "out", {"profile": "quick"}, resume=True).get("ana", sub)
    assert [r.performance for r in back] == [TIME, None]
    assert [(r.exercise, r.passed, tuple(r.cases or ())) for r in back] == [("fast_matmul", True, (5, 5)),
                                                                            ("tiled_matmul", False, ())]
    students = grade._by_student(back, {("ana", "05_cuda_kernels.ipynb"): 3.0}, {})
    grade._write(tmp_path / "out", {"students": students})
    again = grade._rows(json.loads((tmp_path / "out" / "grades.json").read_text())["students"])
    assert [r.performance for r in again] == [TIME, None]
    old = {k: v for k, v in again[0].__dict__.items() if k != "performance"}  # a row written before scores
    assert notebook.ExerciseResult(**old).performance is None
