"""The tiers hold: a test that starts a costly program without its marker fails and says which marker, and a run that
leaves a process behind fails, whatever subset it ran (each tried in a pytest of its own, with this suite's hooks)."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import tiers

HERE = Path(__file__).resolve().parent


def _suite(tmp_path: Path, test_source: str) -> subprocess.CompletedProcess:
    """Run ``test_source`` as test_inner.py under this suite's conftest, tiers and leaks, in a pytest of its own."""
    for name in ("conftest.py", "tiers.py", "leaks.py", "bylab.py", "labruns.py"):
        (tmp_path / name).write_text((HERE / name).read_text())
    (tmp_path / "test_inner.py").write_text(test_source)
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "mpiexec"  # a program named as MPI's launcher, which does nothing
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_inner.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_test_that_starts_mpiexec_without_the_mpi_marker_fails_and_names_it(tmp_path):
    done = _suite(tmp_path, "import subprocess\nimport pytest\n\n"
                            "def test_unmarked():\n    subprocess.run(['mpiexec', '-n', '2', 'true'], check=True)\n\n"
                            "@pytest.mark.mpi\ndef test_marked():\n"
                            "    subprocess.run(['mpiexec', '-n', '2', 'true'], check=True)\n")
    assert done.returncode == 1, done.stdout
    assert "1 failed, 1 passed" in done.stdout, done.stdout
    assert "mpiexec -n 2 true  -> mark it mpi" in done.stdout, done.stdout


def test_a_helper_that_runs_mpi_marks_the_tests_that_call_it(tmp_path):
    done = _suite(tmp_path, "import subprocess\n\n"
                            "def run_mpi_cases(*a):\n    subprocess.run(['mpiexec', 'true'], check=True)\n\n"
                            "def _mine():\n    run_mpi_cases()\n\n"
                            "def test_through_a_helper_of_the_module():\n    _mine()\n")
    assert done.returncode == 0, done.stdout
    listed = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                             "-m", "not mpi", "test_inner.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert "no tests collected" in listed.stdout or "1 deselected" in listed.stdout, listed.stdout


@pytest.mark.slow  # the leak check waits 10 s for a process that may still be stopping
def test_a_run_that_leaves_a_process_behind_fails_and_names_it(tmp_path):
    pid_file = tmp_path / "leaked.pid"
    done = _suite(tmp_path, "import subprocess, sys\n\n"
                            "def test_leaks():\n"
                            "    p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)',"
                            " 'labkit-leaked-by-a-test'])\n"
                            f"    open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
                            "    import time\n"  # until it is that program, not the fork of pytest it starts as
                            "    while b'leaked' not in open(f'/proc/{p.pid}/cmdline', 'rb').read():\n"
                            "        time.sleep(0.01)\n"
                            "    assert p.poll() is None, 'the process meant to be left behind ended'\n")
    try:
        assert done.returncode == 1, done.stdout
        assert "1 passed" in done.stdout and "left behind by the tests" in done.stdout, done.stdout
        assert "time.sleep(120) labkit-leaked-by-a-test" in done.stdout, done.stdout
    finally:
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGKILL)
        for _ in range(50):
            if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
                break
            time.sleep(0.1)


def test_a_run_passes_beside_another_jobs_kernel_labkit_process_and_folder(tmp_path):
    """What another job starts while this run goes on is not this run's: a lab's kernel in a student's JupyterLab, an
    unrelated labkit process and a grading folder of another grader, none carrying the run's mark."""
    started, go = tmp_path / "started", tmp_path / "go"
    inner = ("import pathlib, time\n\n"
             "def test_waits_while_another_job_starts_its_processes():\n"
             f"    pathlib.Path({str(started)!r}).touch()\n"
             f"    while not pathlib.Path({str(go)!r}).exists():\n"
             "        time.sleep(0.05)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LABKIT_TEST_RUN", "TMPDIR")}
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    others, folder = [], None
    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(_suite, tmp_path, inner)
        try:
            while not started.exists() and not done.done():
                time.sleep(0.05)
            kernel = str(Path.home() / ".local/share/jupyter/runtime/kernel-labkit-lab-01.json")  # as JupyterLab names it
            others = [subprocess.Popen(sleeper + ["-f", kernel], env=env),
                      subprocess.Popen(sleeper + ["labkit-of-another-job"], env=env)]
            folder = tempfile.mkdtemp(prefix="labkit-grader-", dir=os.environ.get("PYTEST_DEBUG_TEMPROOT", "/tmp"))
            time.sleep(0.5)  # until they are those programs, not forks of this pytest
        finally:
            go.touch()
            result = done.result()
            for p in others:
                p.kill()
                p.wait()
            if folder:
                shutil.rmtree(folder)
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout


def test_a_run_that_leaves_a_grading_folder_fails_and_names_it(tmp_path):
    done = _suite(tmp_path, "import tempfile\n\n"
                            "def test_leaves_a_folder():\n"
                            "    print(tempfile.mkdtemp(prefix='labkit-grader-'))\n")
    assert done.returncode == 1, done.stdout
    assert "1 passed" in done.stdout and "left behind by the tests" in done.stdout, done.stdout
    assert "/labkit-grader-" in done.stdout and "labkit-test-" in done.stdout, done.stdout


def test_a_grading_cgroup_is_blamed_only_if_it_stays():
    """An empty grading cgroup made during the run is this run's leak only if it is still there a moment later:
    another job's grader leaves its own empty for a moment after making it and before removing it."""
    import threading

    import leaks

    from labkit.grading import sandbox

    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    kept, brief = sandbox.make_cgroup(sandbox.Limits()), sandbox.make_cgroup(sandbox.Limits())
    if not kept or not brief:
        sandbox.remove_cgroup(kept + brief)
        pytest.skip("no cgroup can be made here")
    gone = threading.Timer(0.5, sandbox.remove_cgroup, args=(brief,))
    try:
        gone.start()
        blamed = leaks.folders_and_cgroups(settle=3)
        assert {str(d) for d in kept} <= set(blamed), blamed
        assert not {str(d) for d in brief} & set(blamed), blamed
    finally:
        gone.join()
        sandbox.remove_cgroup(kept)


@pytest.mark.cluster
def test_a_left_process_whose_files_are_in_pytests_temporary_folders_is_named(tmp_path):
    """A controller whose profile or cluster file is in tmp_path (/tmp/pytest-of-...) has "pytest" on its command line:
    it is a leak all the same, and only pytest itself is left out."""
    import subprocess

    import leaks

    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "ipyparallel.controller",
                             f"--cluster-file={tmp_path}/c.json"])
    try:
        assert "pytest" in str(tmp_path)
        assert any(line.startswith(f"{left.pid}: ") for line in leaks.processes()), leaks.processes()
    finally:
        left.kill()
        left.wait()
    assert not any(line.startswith(f"{left.pid}: ") for line in leaks.processes())


def test_the_kinds_of_a_command_line():
    assert tiers.kinds_of(["/venv/bin/mpiexec", "-n", "2", "python"]) == {"mpi"}
    assert tiers.kinds_of(["/usr/bin/x86_64-linux-gnu-gcc-12", "-O2", "a.c"]) == {"compile"}
    assert tiers.kinds_of("bwrap --unshare-all -- python") == {"sandbox"}
    assert tiers.kinds_of(["ip", "netns", "add", "x"]) == {"hosts"}
    assert tiers.kinds_of([sys.executable, "-m", "ipykernel_launcher", "-f", "k.json"]) == {"notebooks"}
    assert tiers.kinds_of([sys.executable, "-m", "labkit", "lab", "--no-browser"]) == {"cluster"}
    assert tiers.kinds_of([sys.executable, "-m", "labkit", "lab", "--help"]) == set()
    assert tiers.kinds_of(["git", "ls-files"]) == tiers.kinds_of(["pip", "wheel"]) == set()
