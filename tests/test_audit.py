"""The graded kernel's audit hook (labkit.grading.audit): which events are escape attempts, the notes it writes, the
grader's reading of them, and where grading puts them (grades.json, escapes.csv, the console), without a kernel."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from labkit.grading import audit, grade
from labkit.grading.notebook import ExerciseResult

W = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


@pytest.fixture
def watch(tmp_path, monkeypatch):
    """A notebook's folder, a private temporary folder, a folder it reads, and a folder of someone else's."""
    for name in ("nb", "tmp", "data", "other"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path / "nb")
    return audit.Watch(own=[tmp_path / "nb"], temp=[tmp_path / "tmp"], system=[tmp_path / "data"])


def test_writes_outside_the_notebooks_folders_are_attempts(watch, tmp_path):
    outside = str(tmp_path / "other" / "grades.json")
    assert watch.decide("open", ("x.txt", "w", W)) == []
    assert watch.decide("open", (str(tmp_path / "tmp" / "scratch.npz"), "wb", W)) == []
    into = str(tmp_path / "tmp" / "grader" / "grades.json")  # the grader's folder, absent from its private /tmp
    assert watch.decide("open", (into, "w", W)) == [("write", into)]
    assert watch.decide("os.mkdir", (str(tmp_path / "tmp" / "made"), 0o777, -1)) == []
    assert watch.decide("open", ("/dev/null", "w", W)) == []
    assert watch.decide("open", (outside, "w", W)) == [("write", outside)]
    assert watch.decide("open", (Path(outside), None, os.O_RDWR)) == [("write", outside)]  # os.open, a Path
    assert watch.decide("open", ("../other/grades.json", "a", os.O_APPEND)) == [("write", outside)]
    assert watch.decide("open", ("/usr/lib/x", "r+", 0)) == [("write", "/usr/lib/x")]
    assert watch.decide("open", (3, "w", W)) == [], "a descriptor was decided when opened"
    assert watch.decide("os.rename", ("mine", outside, -1, -1)) == [("write", outside)]
    assert watch.decide("os.rename", (outside, "mine", -1, -1)) == [("write", outside)]
    assert watch.decide("shutil.rmtree", (str(tmp_path / "other"), None)) == [("write", str(tmp_path / "other"))]
    assert watch.decide("os.chmod", ("/etc/passwd", 0o777, -1)) == [("write", "/etc/passwd")]
    assert watch.decide("os.symlink", ("/usr", "link", -1)) == [], "the link is made in its own folder"
    fd = os.open(tmp_path / "other", os.O_RDONLY)
    try:  # shutil.rmtree's removals name a file relative to a folder's descriptor
        assert watch.decide("os.remove", ("f", fd)) == [("write", str(tmp_path / "other" / "f"))]
    finally:
        os.close(fd)


def test_a_link_in_its_own_folder_does_not_hide_where_it_writes(watch, tmp_path):
    (tmp_path / "nb" / "link").symlink_to(tmp_path / "other")
    assert watch.decide("open", ("link/x", "w", W)) == [("write", str(tmp_path / "other" / "x"))]


def test_python_caching_bytecode_in_a_read_only_folder_is_not_the_students():
    watch = audit.Watch()
    target = "/usr/lib/python3/dist-packages/__pycache__/m.cpython-311.pyc.1234"
    assert watch.decide("open", (target, None, W)) == [("write", target)]  # a student's own call
    space = {"watch": watch, "target": target, "W": W}
    exec(compile("found = watch.decide('open', (target, None, W))", "<frozen importlib._bootstrap_external>", "exec"),
         space)
    assert space["found"] == []
    exec(compile("found = watch.decide('os.mkdir', ('/usr/lib/__pycache__', 0o777, -1))",
                 "<frozen importlib._bootstrap_external>", "exec"), space)
    assert space["found"] == [], "its folder, made first"


def test_reads_are_attempts_only_where_the_sandbox_refuses_them(watch, tmp_path):
    (tmp_path / "other" / "seen.txt").write_text("x")
    gone = str(tmp_path / "gone" / "release.json")
    assert watch.decide("open", (gone, "r", os.O_RDONLY)) == [("read", gone)], "its folder is not there"
    assert watch.decide("open", (str(tmp_path / "tmp" / "away" / "x"), "r", 0)) == [
        ("read", str(tmp_path / "tmp" / "away" / "x"))]
    assert watch.decide("open", (str(tmp_path / "other" / "seen.txt"), "r", 0)) == [], "readable"
    assert watch.decide("open", (str(tmp_path / "other" / "cache.json"), "r", 0)) == [], "only looked for"
    assert watch.decide("open", (str(tmp_path / "data" / "no" / "x"), "rb", 0)) == [], "a folder it reads"
    assert watch.decide("open", ("/usr/share/nowhere/x", "r", 0)) == [], "the system"
    assert watch.decide("open", ("/proc/999999999/stat", "rb", 0)) == []
    assert watch.decide("open", ("no/such/file", "r", 0)) == [], "its own folder"
    assert watch.decide("os.listdir", ("/root",)) == [], "not an event it watches"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_a_file_there_and_unreadable_is_an_attempt(watch, tmp_path):
    closed = tmp_path / "other" / "closed"
    closed.write_text("x")
    closed.chmod(0)
    assert watch.decide("open", (str(closed), "r", 0)) == [("read", str(closed))]


def test_connections_beyond_loopback_are_attempts(watch):
    inet, inet6 = SimpleNamespace(family=socket.AF_INET), SimpleNamespace(family=socket.AF_INET6)
    for host in ("127.0.0.1", "127.3.2.1", "localhost", "0.0.0.0", ""):
        assert watch.decide("socket.connect", (inet, (host, 80))) == [], host
    for host in ("::1", "::ffff:127.0.0.1", "::1%lo"):
        assert watch.decide("socket.connect", (inet6, (host, 80, 0, 0))) == [], host
    assert watch.decide("socket.connect", (inet, ("192.0.2.1", 80))) == [("connect", "192.0.2.1:80")]
    assert watch.decide("socket.sendto", (inet, ("1.1.1.1", 53))) == [("connect", "1.1.1.1:53")]
    assert watch.decide("socket.connect", (inet, ("example.com", 443))) == [("connect", "example.com:443")]
    assert watch.decide("socket.connect", (inet6, ("2001:db8::1", 80, 0, 0))) == [("connect", "[2001:db8::1]:80")]
    assert watch.decide("socket.connect", (SimpleNamespace(family=socket.AF_UNIX), "/tmp/x.sock")) == []
    assert watch.decide("socket.sendmsg", (inet, None)) == [], "a connected socket"


def test_signals_to_processes_not_its_own_are_attempts(watch, monkeypatch):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        assert watch.decide("os.kill", (os.getpid(), signal.SIGINT)) == []
        assert watch.decide("os.kill", (child.pid, signal.SIGTERM)) == [], "a process of its own"
        assert watch.decide("os.killpg", (child.pid, signal.SIGTERM)) == [], "its group"
        assert watch.decide("os.kill", (0, signal.SIGTERM)) == [], "its own process group"
        assert watch.decide("os.killpg", (os.getpgrp(), signal.SIGTERM)) == []
        assert watch.decide("os.kill", (1, 0)) == [], "signal 0 signals nothing"
        assert watch.decide("os.kill", (4_000_000_000, signal.SIGKILL)) == [], "gone: a job ended before its cleanup"
        assert watch.decide("os.killpg", (4_000_000_000, signal.SIGKILL)) == []
        assert watch.decide("os.kill", (1, signal.SIGKILL)) == [("kill", "pid 1")]
        assert watch.decide("os.kill", (-1, signal.SIGKILL)) == [("kill", "every process (pid -1)")]
        monkeypatch.setattr(audit.os, "geteuid", lambda: 4_000_000)  # as a user of its own: the rest is another's
        assert watch.decide("os.kill", (child.pid, signal.SIGTERM)) == [("kill", f"pid {child.pid}")]
        assert watch.decide("os.kill", (-child.pid, signal.SIGTERM)) == [("kill", f"process group {child.pid}")]
    finally:
        child.kill()
        child.wait()


HOOKED = """
import os, socket, sys
from labkit.grading import audit
audit.install(audit.Watch(own=[os.getcwd()]), 1)
for _ in range(3):
    try:
        open('/nonexistent-labkit-folder/x', 'w')
    except OSError:
        pass
open('mine.txt', 'w').write('x')
print('still here')
"""


def test_the_hook_notes_each_attempt_on_its_descriptor_and_never_raises_into_the_students_code(tmp_path):
    done = subprocess.run([sys.executable, "-c", HOOKED], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    notes = [audit.parse(line) for line in done.stdout.splitlines()]
    assert [n for n in notes if n] == [("write", "/nonexistent-labkit-folder/x")] * 3
    assert "still here" in done.stdout
    boom = HOOKED.replace(
        "audit.install(audit.Watch(own=[os.getcwd()]), 1)",
        "w = audit.Watch()\nw.handlers['open'] = lambda *a: 1 / 0\naudit.install(w, 1)")
    done = subprocess.run([sys.executable, "-c", boom], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "still here" in done.stdout, done.stderr


def test_a_loop_of_attempts_writes_at_most_so_many_notes(tmp_path):
    code = HOOKED.replace("range(3)", f"range({audit.LINES + 50})")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert sum(1 for line in done.stdout.splitlines() if audit.parse(line)) == audit.LINES


def test_the_launcher_refuses_what_it_does_not_understand(capsys):
    assert audit.main(["--own"]) == 2
    assert audit.main(["--elsewhere", "/x", "--", "ipykernel_launcher"]) == 2
    assert "usage: python -m labkit.grading.audit" in capsys.readouterr().err
    argv = audit.kernel_argv(own=["/s"], temp=["/tmp"], system=["/d"])
    assert argv[1:] == ["-m", "labkit.grading.audit", "--own", "/s", "--temp", "/tmp", "--system", "/d", "--",
                        "ipykernel_launcher", "-f", "{connection_file}"]


def _note(kind, target) -> str:
    return audit.TAG + json.dumps({"kind": kind, "target": target})


def test_the_grader_reads_each_attempt_once_with_its_count(tmp_path):
    log = tmp_path / "kernel.log"
    lines = ["[IPKernelApp] ERROR something", _note("write", "/usr/x"), "half a line " + "y" * 10000,
             _note("connect", "192.0.2.1:80"), _note("write", "/usr/x"), _note("fly", "/x"), audit.TAG + "{not json",
             audit.TAG + json.dumps({"kind": "read"}), "  " + _note("read", "/indented"),
             *(_note("read", f"/r/{i}") for i in range(30)), _note("write", "/usr/x")]
    log.write_text("\n".join(lines) + "\n")
    found = audit.read(log)
    assert found[:2] == [{"kind": "write", "target": "/usr/x", "count": 3},
                         {"kind": "connect", "target": "192.0.2.1:80", "count": 1}]
    assert len(found) == audit.LIMIT and found[-1] == {"kind": "read", "target": "/r/17", "count": 1}
    assert audit.read(tmp_path / "missing.log") == []
    assert audit.describe(found[1]) == "connected to 192.0.2.1:80"
    assert audit.parse(b"LABKIT-ESCAPE " + json.dumps({"kind": "kill", "target": "pid 1"}).encode()) == ("kill", "pid 1")


# ---- in the grades -----------------------------------------------------------------------------------------------------

TRIED = {"ana": [{"kind": "write", "target": "/usr/x", "count": 2}, {"kind": "connect", "target": "1.1.1.1:53",
                                                                       "count": 1}]}


def _class(tmp_path: Path, folder: str, students: list[str]) -> Path:
    for s in students:
        (tmp_path / folder / s).mkdir(parents=True)
        nbformat.write(new_notebook(cells=[new_code_cell("1")]), tmp_path / folder / s / "a.ipynb")
    return tmp_path / folder


@pytest.fixture
def fake_runs(monkeypatch):
    def run(path, student, *a, name=None, escapes=None, **k):
        escapes += TRIED.get(student, [])
        return [ExerciseResult(student, name, "backprop", True, "passed")]

    monkeypatch.setattr(grade, "grade_notebook", run)


def test_each_labs_escapes_are_in_grades_json_and_escapes_csv_and_kept_by_later_runs(tmp_path, fake_runs, capsys):
    subs = _class(tmp_path, "subs", ["ana", "bob"])
    _, _, json_path = grade.grade(subs, tmp_path / "out", progress=False, isolate=False)
    data = json.loads(json_path.read_text())
    assert data["students"]["ana"]["a.ipynb"]["escapes"] == TRIED["ana"]
    assert data["students"]["bob"]["a.ipynb"]["escapes"] == []
    rows = list(csv.DictReader(open(tmp_path / "out" / grade.ESCAPES_CSV)))
    assert [(r["student"], r["notebook"], r["kind"], r["target"], r["count"]) for r in rows] == [
        ("ana", "a.ipynb", "write", "/usr/x", "2"), ("ana", "a.ipynb", "connect", "1.1.1.1:53", "1")]
    assert grade.escape_summary(data).startswith("contained escape attempts: ana (2: wrote /usr/x, connected to "
                                                 "1.1.1.1:53)")
    assert "bob" not in grade.escape_summary(data)
    # a later run into the same folder that grades bob alone keeps ana's, and a merge keeps them too
    _, _, json_path = grade.grade(_class(tmp_path, "later", ["bob"]), tmp_path / "out", progress=False, isolate=False)
    assert json.loads(json_path.read_text())["students"]["ana"]["a.ipynb"]["escapes"] == TRIED["ana"]
    _, _, merged = grade.merge([tmp_path / "out"], tmp_path / "merged")
    assert json.loads(merged.read_text())["students"]["ana"]["a.ipynb"]["escapes"] == TRIED["ana"]
    assert (tmp_path / "merged" / grade.ESCAPES_CSV).read_text() == (tmp_path / "out" / grade.ESCAPES_CSV).read_text()


def test_no_escapes_no_escapes_csv(tmp_path, fake_runs):
    out = tmp_path / "out"
    out.mkdir()
    (out / grade.ESCAPES_CSV).write_text("stale\n")
    _, _, json_path = grade.grade(_class(tmp_path, "subs", ["bob"]), out, progress=False, isolate=False)
    assert not (out / grade.ESCAPES_CSV).exists()
    assert grade.escape_summary(json.loads(json_path.read_text())) == ""


def test_an_interrupted_run_resumes_with_the_escapes_it_had_found(tmp_path, fake_runs, monkeypatch):
    subs = _class(tmp_path, "subs", ["ana", "bob"])
    real = grade.grade_notebook

    def interrupted(path, student, *a, **k):
        if student == "bob":
            raise KeyboardInterrupt
        return real(path, student, *a, **k)

    monkeypatch.setattr(grade, "grade_notebook", interrupted)
    with pytest.raises(KeyboardInterrupt):
        grade.grade(subs, tmp_path / "out", progress=False, isolate=False)
    monkeypatch.setattr(grade, "grade_notebook", lambda path, student, *a, name=None, **k: [
        ExerciseResult(student, name, "backprop", True, "passed")])  # finds nothing: ana's come from the first run
    _, _, json_path = grade.grade(subs, tmp_path / "out", progress=False, isolate=False, resume=True)
    assert json.loads(json_path.read_text())["students"]["ana"]["a.ipynb"]["escapes"] == TRIED["ana"]
