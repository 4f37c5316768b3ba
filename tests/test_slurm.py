"""A real SLURM (Debian's slurm-wlm and munge) on two namespace hosts: slurmctld and a slurmd on the first, a slurmd
on the second (labkit.cluster.slurm.slurm_cluster). The README's SLURM commands run on it as written; MPICluster starts its
engines as a SLURM job over both nodes and runs lab 06's %%px cells; run_mpi spreads its ranks over an allocation; a
job past its time limit and a cancelled engines' job end with a clear report and nothing left on either node."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

from labkit import runner, settings
from labkit.cluster import slurm

pytestmark = [pytest.mark.mpi, pytest.mark.hosts, pytest.mark.slow]

OK, WHY = slurm.available()
if not OK and settings.get("LABKIT_REQUIRE_SLURM"):
    raise RuntimeError(f"LABKIT_REQUIRE_SLURM is set but a test SLURM cluster cannot be made: {WHY}")
needs_slurm = pytest.mark.skipif(not OK, reason=WHY)
VENV_BIN = str(Path(sys.executable).parent)


@pytest.fixture(scope="module")
def cluster():
    try:
        with slurm.slurm_cluster(2, cpus=8) as made:  # room for the job past its time beside the others
            saved = {k: os.environ.get(k) for k in made.env}
            os.environ.update(made.env)  # as a login node's shell has them: SLURM's commands find this cluster
            try:
                yield made
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
    except slurm.SlurmUnavailable as e:
        if settings.get("LABKIT_REQUIRE_SLURM"):
            raise
        pytest.skip(f"SLURM did not start here: {e}")


@pytest.fixture(scope="module")
def past_its_time(cluster):
    """A 4-rank MPI job over both nodes that would sleep for 10 minutes, with a time limit of 1 minute (SLURM's least):
    submitted once, early, so that SLURM's minute (and its 30 s check) passes while the other tests run."""
    prog = cluster.folder / "sleeper.py"
    prog.write_text("from mpi4py import MPI\nimport socket, time\nMPI.COMM_WORLD.Barrier()\n"
                    f"open({str(cluster.folder)!r} + '/started-' + str(MPI.COMM_WORLD.Get_rank()), 'w')"
                    ".write(socket.gethostname())\ntime.sleep(600)\n")
    code = (f"from labkit import cluster; cluster.run_mpi([{str(prog)!r}], n=4, hosts='slurm', timeout=900)")
    job = cluster.submit(wrap=f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}",
                         options=["--job-name=past-its-time", "--nodes=2", "--ntasks-per-node=2", "--time=1",
                                  f"--output={cluster.folder}/past-its-time.log"])
    return job


def _job_env(cluster) -> dict:
    return {**os.environ, **cluster.env, "PATH": VENV_BIN + os.pathsep + os.environ["PATH"], "LABKIT_PROGRESS": "0"}


def _nothing_left(cluster, *jobs: int, within: float = 15) -> None:
    """Nothing of these jobs (of any job, without ids) runs on either node."""
    def left_now():
        if not jobs:
            return cluster.jobs_processes()
        return {f"job {j} on {node}": ps for j in jobs for node, ps in cluster.jobs_processes(j).items()}

    deadline = time.monotonic() + within
    while (left := left_now()) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not left, f"processes left on the nodes: {left}"


@needs_slurm
def test_a_job_runs_on_both_nodes_and_leaves_nothing(cluster, past_its_time):
    job = cluster.submit(wrap="srun hostname", options=["--nodes=2", "--ntasks-per-node=1",
                                                       f"--output={cluster.folder}/hostname-%j.log"])
    done = cluster.wait(job, timeout=60)
    assert done.state == "COMPLETED", done.describe()
    assert sorted(Path(done.output).read_text().split()) == ["labkit-host0", "labkit-host1"]
    _nothing_left(cluster, job)
    with pytest.raises(ValueError, match="not in one"):  # hosts="slurm" outside an allocation says what to do
        from labkit.cluster import hosts_args

        hosts_args("slurm", 2)


def test_mpicluster_slurm_arguments_are_checked_before_anything_starts(tmp_path, monkeypatch):
    from labkit.cluster import MPICluster

    with pytest.raises(ValueError, match="launcher must be 'mpi'"):
        MPICluster(2, launcher="ssh")
    with pytest.raises(ValueError, match="takes its nodes from SLURM"):
        MPICluster(2, launcher="slurm", hosts=["node1"])
    with pytest.raises(ValueError, match="sbatch options such as"):
        MPICluster(2, launcher="slurm", slurm_options=["time=60"])
    with pytest.raises(ValueError, match="sbatch options such as"):
        MPICluster(2, launcher="slurm", slurm_options=["--time=60\nrm -rf ~"])
    monkeypatch.setenv("PATH", str(tmp_path))  # no SLURM commands: said before a controller starts
    with pytest.raises(slurm.SlurmUnavailable, match="scontrol is not on PATH: run this on a SLURM cluster"):
        MPICluster(2, launcher="slurm").start()


@needs_slurm
def test_the_doctor_lists_the_partitions_or_says_there_is_no_cluster(cluster, monkeypatch):
    from labkit import doctor

    found = doctor.check_slurm()
    assert found.status == doctor.OK and found.detail.startswith("lab: 2 "), found
    monkeypatch.setenv("SLURM_CONF", str(cluster.folder / "no-such.conf"))
    found = doctor.check_slurm()
    assert found.status != doctor.OK and "no-such.conf" in found.detail, found


SCRIPT = """from mpi4py import MPI
import json, socket
import numpy as np
comm = MPI.COMM_WORLD
out = np.empty(1000)
comm.Allreduce(np.full(1000, comm.Get_rank() + 1.0), out)
rows = comm.gather([comm.Get_rank(), socket.gethostname(), float(out[0])])
if comm.Get_rank() == 0:
    print("WHERE", json.dumps(rows), flush=True)
"""


def _rows(text: str) -> list:
    return json.loads(text.split("WHERE ", 1)[1].splitlines()[0])


def _readme_commands() -> list[str]:
    readme = (ROOT / "docs" / "clusters-and-gpus.md").read_text()
    section = readme.split("### On a SLURM cluster", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def _by_name(commands: list[str], name: str) -> list[str]:
    found = [c for c in commands if f"--job-name={name} " in c]
    assert found, f"docs/clusters-and-gpus.md's SLURM section has no job named {name}"
    return found


def _submit_line(cluster, line: str, cwd: Path) -> int:
    done = subprocess.run(["sh", "-c", line], cwd=cwd, env=_job_env(cluster), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return int(re.search(r"Submitted batch job (\d+)", done.stdout).group(1))


@needs_slurm
def test_the_readme_mpi_job_spreads_its_ranks_over_both_nodes(cluster, tmp_path):
    (tmp_path / "script.py").write_text(SCRIPT)
    job = _submit_line(cluster, _by_name(_readme_commands(), "labkit-mpi")[0], tmp_path)
    done = cluster.wait(job, timeout=120)
    log = (tmp_path / f"mpi-{job}.log").read_text()
    assert done.state == "COMPLETED", done.describe() + "\n" + log[-3000:]
    rows = _rows(log)
    assert [r[0] for r in rows] == list(range(8)) and all(r[2] == 36.0 for r in rows)  # 1 + ... + 8
    assert [r[1] for r in rows] == ["labkit-host0"] * 4 + ["labkit-host1"] * 4
    _nothing_left(cluster, job)


@needs_slurm
def test_run_mpi_inside_an_allocation(cluster, tmp_path):
    """hosts="slurm": the job's nodes, through hydra's slurm launcher; no hosts: every rank on the node it runs on
    (hydra would otherwise take the job's nodes too, while the ranks are held to loopback)."""
    (tmp_path / "script.py").write_text(SCRIPT)
    code = ("import sys; from labkit import cluster\n"
            "for hosts in ('slurm', None):\n"
            "    r = cluster.run_mpi(['script.py'], n=4, hosts=hosts, timeout=120)\n"
            "    print(r.stdout, r.stderr[-2000:], 'EXIT', r.returncode, flush=True)\n")
    (tmp_path / "job.py").write_text(code)
    job = cluster.submit(wrap=f"{shlex.quote(sys.executable)} job.py",
                         options=["--nodes=2", "--ntasks-per-node=2", f"--chdir={tmp_path}",
                                  f"--output={tmp_path}/out.log"])
    done = cluster.wait(job, timeout=180)
    log = (tmp_path / "out.log").read_text()
    assert done.state == "COMPLETED", done.describe() + "\n" + log[-3000:]
    across, here = (_rows(part) for part in log.split("EXIT")[:2])
    assert [r[1] for r in across] == ["labkit-host0", "labkit-host0", "labkit-host1", "labkit-host1"], across
    assert {r[1] for r in here} == {"labkit-host0"} and all(r[2] == 10.0 for r in across + here)
    _nothing_left(cluster, job)


@needs_slurm
def test_the_readme_report_grading_and_jupyterlab_jobs(cluster, tmp_path):
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    commands = _readme_commands()
    body = "def karp_flatt(p, s):\n    return (1 / s - 1 / p) / (1 - 1 / p)"
    for student, code in (("ana", body), ("ben", body.replace("1 / s - 1 / p", "1 / p - 1 / s")), ("cy", body),
                          ("dee", body)):
        (tmp_path / "submissions" / student).mkdir(parents=True)
        nbformat.write(new_notebook(cells=[new_code_cell("from labkit import check"), new_code_cell(code),
                                           new_code_cell("check.karp_flatt(karp_flatt)")]),
                       tmp_path / "submissions" / student / "12_x.ipynb")
    grading = [_submit_line(cluster, line, tmp_path) for line in _by_name(commands, "labkit-grade")]
    # lab 01 alone; its claims time things, and they are judged on a quiet machine (tests/test_notebooks.py): here,
    # beside other tests, one read 2.2x where it needs under 1.8x, so the job is judged by its notebook running
    report_line = _by_name(commands, "labkit-report")[0].replace(
        'labkit report --out report"', 'labkit report --out report --only 01_ --allow-unheld-claims"')
    assert "--only 01_ --allow-unheld-claims" in report_line
    report = _submit_line(cluster, report_line, tmp_path)
    lab = _submit_line(cluster, _by_name(commands, "labkit-lab")[0], tmp_path)
    # JupyterLab: the log gives the URL with its token; it answers on its node's loopback, and only there
    log = tmp_path / f"lab-{lab}.log"
    deadline = time.monotonic() + 120
    while not (url := re.search(r"http://127\.0\.0\.1:8888/lab\?token=\w+", log.read_text() if log.exists() else "")):
        assert time.monotonic() < deadline, (log.read_text() if log.exists() else "no log") + cluster.job(lab).describe()
        assert not cluster.job(lab).ended, cluster.job(lab).describe() + "\n" + log.read_text()[-3000:]
        time.sleep(0.5)
    node = cluster.nodes.index(cluster.job(lab).nodes)
    fetch = f"import urllib.request; print(urllib.request.urlopen({url.group(0)!r}, timeout=20).status)"
    answered = cluster.hosts.run(node, [sys.executable, "-c", shlex.quote(fetch)], capture_output=True, text=True,
                                 timeout=60)
    assert answered.stdout.strip() == "200", answered.stderr
    cluster.cancel(lab)
    assert cluster.wait(lab, timeout=60).state == "CANCELLED"
    for job in grading + [report]:
        done = cluster.wait(job, timeout=300)
        assert done.state == "COMPLETED", done.describe() + "\n" + "\n".join(
            p.read_text()[-2000:] for p in tmp_path.glob("*.log"))
    import csv

    grades = list(csv.DictReader(open(tmp_path / "grades" / "grades.csv")))
    assert [(r["student"], r["passed"]) for r in grades] == [("ana", "1"), ("ben", "0"), ("cy", "1"), ("dee", "1")]
    merged = json.loads((tmp_path / "grades" / "grades.json").read_text())
    assert [p["part"] for p in merged["parts"]] == [[k, 4] for k in range(4)]
    assert merged["isolated"], "each array task sandboxes its notebooks on its node"
    assert (tmp_path / "report" / "index.html").exists() and list((tmp_path / "report").glob("01_*.ipynb"))
    _nothing_left(cluster, *grading, report, lab)


@needs_slurm
def test_mpi_engines_as_a_slurm_job_run_lab_06(cluster):
    """ipyparallel's SLURM launcher starts the 4 engines as one job over both nodes; the controller listens on the
    address toward the SLURM controller (the bridge), not 0.0.0.0; lab 06's %%px cells run; stop() ends the job."""
    import nbformat

    from labkit.cluster import MPICluster
    from labkit.cluster.processes import process_tree

    lab = nbformat.read(runner.find_notebooks(only="06_")[0], as_version=4)
    px = [c.source.split("\n", 1)[1] for c in lab.cells if c.cell_type == "code" and c.source.startswith("%%px")]
    with MPICluster(4, launcher="slurm", slurm_options=["--nodes=2", "--ntasks-per-node=2", "--time=10"],
                    start_timeout=120) as engines:
        job = engines.slurm_job
        assert cluster.job(job).state == "RUNNING"
        engines.view.execute("import socket; host = socket.gethostname()", block=True)
        assert engines.view["host"] == ["labkit-host0", "labkit-host0", "labkit-host1", "labkit-host1"]
        mine = set(process_tree(os.getpid()))
        listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout.splitlines()
        ours = [ln.split()[3] for ln in listening if {int(p) for p in re.findall(r"pid=(\d+)", ln)} & mine]
        wide = [a for a in ours if not a.startswith((cluster.hosts.bridge_address + ":", "127.0.0.1:"))]
        assert ours and not wide, wide  # the bridge and loopback only: nothing on 0.0.0.0
        engines.view.push({"SIZES": [8, 8000], "REPEAT": 2})
        for source in px:
            engines.px(source, timeout=120)
        assert engines.view["bcast_logs"][0]["tree"].shape[1] == 4
    assert cluster.job(job).state == "CANCELLED"
    _nothing_left(cluster, job)


@needs_slurm
def test_a_job_slurm_refuses_or_cannot_start_is_an_error_in_slurms_words(cluster):
    from labkit.cluster import ClusterError, MPICluster

    with pytest.raises(ClusterError, match="SLURM did not take the engines' job: sbatch: error: .*invalid partition"):
        MPICluster(2, launcher="slurm", slurm_options=["--partition=gpu"]).start()
    started = time.monotonic()  # a job SLURM takes but will never start: said at once, not after start_timeout
    with pytest.raises(ClusterError, match=r"will not start: it is PENDING for PartitionConfig, it asks for more"):
        MPICluster(64, launcher="slurm", slurm_options=["--nodes=2", "--ntasks-per-node=32"]).start()
    assert time.monotonic() - started < 30


@needs_slurm
def test_a_cancelled_engines_job_ends_the_cell_with_slurms_word(cluster):
    from labkit.cluster import ClusterError, MPICluster

    with MPICluster(2, launcher="slurm", slurm_options=["--nodes=2"], start_timeout=120) as engines:
        job = engines.slurm_job
        started = time.monotonic()
        subprocess.Popen(["sh", "-c", f"sleep 2; scancel {job}"], env=_job_env(cluster))
        with pytest.raises(ClusterError, match=rf"SLURM job {job} ended CANCELLED: it was cancelled"):
            engines.px("import time\nwhile True:\n    time.sleep(0.1)", timeout=120)
        assert time.monotonic() - started < 60
    _nothing_left(cluster, job)


@needs_slurm
def test_engines_that_die_with_their_job_end_the_cell_with_slurms_word_not_died(cluster):
    """Every engine exits mid-cell (their job's mpiexec then ends): ipyparallel's controller notices the engines gone
    before SLURM has said the job ended, which under load is the usual order. The cell still ends with the job's
    state in SLURM's words."""
    from labkit.cluster import ClusterError, MPICluster

    with MPICluster(2, launcher="slurm", slurm_options=["--nodes=2"], start_timeout=120) as engines:
        job = engines.slurm_job
        with pytest.raises(ClusterError, match=rf"SLURM job {job} ended (FAILED|COMPLETED|CANCELLED)"):
            engines.px("import os, time\ntime.sleep(0.5)\nos._exit(3)", timeout=120)
    _nothing_left(cluster, job)


@needs_slurm
def test_a_killed_notebook_kernel_does_not_keep_its_engines_job(cluster, tmp_path):
    """The process that started MPICluster(launcher="slurm") is SIGKILLed (a kernel killed for memory): its
    watchdog cancels the engines' job, so it does not hold the nodes until its time limit."""
    import signal

    owner = subprocess.Popen(
        [sys.executable, "-c", "from labkit.cluster import MPICluster\n"
         "c = MPICluster(2, launcher='slurm', slurm_options=['--nodes=2'], start_timeout=120).start()\n"
         "print('JOB', c.slurm_job, c._folder, flush=True)\nimport time; time.sleep(600)\n"],
        stdout=subprocess.PIPE, text=True, env=_job_env(cluster), cwd=tmp_path)
    try:
        line = owner.stdout.readline()
        assert line.startswith("JOB "), line
        job, scripts = int(line.split()[1]), [Path(line.split()[2])]
        assert cluster.job(job).state == "RUNNING"
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    done = cluster.wait(job, timeout=60)
    assert done.state == "CANCELLED", done.describe()
    _nothing_left(cluster, job)
    deadline = time.monotonic() + 15  # the watchdog removes the engines' batch script last
    while any(batch.exists() for batch in scripts) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(batch.exists() for batch in scripts), scripts


@needs_slurm
def test_a_job_past_its_time_limit_is_ended_and_reported(cluster, past_its_time):
    done = cluster.wait(past_its_time, timeout=200)
    log = (cluster.folder / "past-its-time.log").read_text()
    started = sorted(p.read_text() for p in cluster.folder.glob("started-*"))
    assert started == ["labkit-host0", "labkit-host0", "labkit-host1", "labkit-host1"], log[-3000:]
    assert done.state == "TIMEOUT" and "DUE TO TIME LIMIT" in log, done.describe()
    assert "ran past its time limit" in done.describe() and "time limit 00:01:00" in done.describe()
    _nothing_left(cluster)  # of any job: this one ran last
