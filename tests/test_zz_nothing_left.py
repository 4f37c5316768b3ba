"""Runs last (files run in name order): nothing the test suite started is still running or listening.

A process counts as the suite's when it started after this pytest process and its command line is one of those
labkit starts (JupyterLab, an ipyparallel controller or engine, mpiexec and its proxies, a labkit job), whether it
is still a child of pytest or was orphaned when its parent died.
"""

import os
import time
from pathlib import Path

KINDS = ("jupyter", "ipcontroller", "ipengine", "ipyparallel", "mpiexec", "hydra_pmi_proxy", "labkit", "mpi4py",
         "slurmctld", "slurmd", "slurmstepd", "munged")


def _start_ticks(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _ours() -> list[str]:
    me, mine = os.getpid(), _start_ticks(os.getpid())
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0]
            started = _start_ticks(int(d))
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if state != "Z" and started >= mine and any(k in cmd for k in KINDS) and "pytest" not in cmd:
            found.append(f"{d}: {cmd[:160]}")
    return found


def _pytest_started() -> float:
    """When this pytest process started, in seconds since the epoch (skips without /proc)."""
    if not Path("/proc/stat").exists():
        import pytest

        pytest.skip("needs /proc (Linux)")
    boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
    return boot + _start_ticks(os.getpid()) / os.sysconf("SC_CLK_TCK")


def test_the_suite_left_no_process_behind():
    if not Path("/proc/self/stat").exists():
        import pytest

        pytest.skip("needs /proc (Linux) to list processes")
    deadline = time.monotonic() + 10  # a cluster stopped by the last test may still be shutting down
    left = _ours()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _ours()
    assert not left, "still running after the tests that started them ended:\n" + "\n".join(left)


def test_the_suite_left_no_network_namespace_behind():
    """The several-hosts tests make network namespaces named labkit-*; none may outlive them."""
    import shutil
    import subprocess

    if shutil.which("ip") is None:
        import pytest

        pytest.skip("needs ip (iproute2) to list network namespaces")
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout.split("\n")
    left = [line.split()[0] for line in listed if line.strip().startswith("labkit")]
    assert not left, f"network namespaces left behind: {left}"
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=30).stdout.splitlines()
    bridges = [line.split(":")[1].strip() for line in links if line.split(":")[1].strip().startswith(("lkb", "lkv"))]
    assert not bridges, f"the namespace hosts' bridges or cables left behind: {bridges}"


def test_the_suite_left_no_sandbox_behind():
    """Grading makes a cgroup and two temporary folders per notebook (labkit.sandbox, labkit.grade); none may outlive it."""
    import glob
    import tempfile

    mine = _pytest_started()
    cgroups = glob.glob("/sys/fs/cgroup/*/labkit-grade-*") + glob.glob("/sys/fs/cgroup/labkit-grade/labkit-grade-*")
    assert not cgroups, f"cgroups left behind: {cgroups}"
    tmp = tempfile.gettempdir()
    folders = [p for p in glob.glob(f"{tmp}/labkit-grader-*") + glob.glob(f"{tmp}/labkit-sandbox-*")
               if os.stat(p).st_mtime >= mine]
    assert not folders, f"grading folders left behind: {folders}"


def test_the_suite_left_no_cluster_folder_behind():
    """The namespace hosts, the test SLURM cluster and the SLURM engines' batch scripts each have a temporary folder."""
    import glob
    import tempfile

    mine = _pytest_started()
    tmp = tempfile.gettempdir()
    folders = [p for kind in ("hosts", "slurm", "engines", "cgroup") for p in glob.glob(f"{tmp}/labkit-{kind}-*")
               if os.stat(p).st_mtime >= mine]
    assert not folders, f"cluster folders left behind: {folders}"
