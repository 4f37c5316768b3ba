"""What the suite may not leave behind, checked once at the end of every run, whatever subset was selected.

Only what this run started counts, never another job's processes nor a student's JupyterLab beside it:
- a process, when it started after this pytest process, its command line is one of those labkit starts (JupyterLab,
  an ipyparallel controller or engine, mpiexec and its proxies, a labkit job, SLURM's daemons), and it carries this
  run's mark (``LABKIT_TEST_RUN`` in its environment, or in its nearest marked ancestor's) or descends from pytest;
- a temporary folder of grading, hosts, SLURM or engines in this run's own temporary folder (``TMPDIR`` points every
  process of the run there, see :func:`own_tempdir`);
- a network namespace or link whose name this run gave to ``ip``;
- a grading cgroup made since this run started, unless processes of another run or job are in it.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

KINDS = ("jupyter", "ipcontroller", "ipengine", "ipyparallel", "mpiexec", "hydra_pmi_proxy", "labkit", "mpi4py",
         "slurmctld", "slurmd", "slurmstepd", "munged")
# pytest's own helpers live as long as pytest does: multiprocessing's resource tracker and fork server
PYTEST_OWN = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")
FOLDERS = ("grader", "sandbox", "hosts", "slurm", "engines", "cgroup")
RUN = "LABKIT_TEST_RUN"  # this run's mark, inherited by what it starts: another run's processes are not this one's
TMP_ROOT = "LABKIT_TEST_TMPROOT"  # where the run's temporary folder is made (a worker's beside its controller's, not
# inside it: a SLURM daemon's socket path must stay under the 108 bytes a Unix socket's name may have)


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _start_ticks(pid: int) -> int:
    return int(_stat(pid)[19])


def pytest_started() -> float:
    """When this pytest process started, in seconds since the epoch."""
    boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
    return boot + _start_ticks(os.getpid()) / os.sysconf("SC_CLK_TCK")


def _mark(pid: int) -> str | None:
    """The test run's mark a process carries in its environment, or None."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    found = [e.split(b"=", 1)[1].decode(errors="replace") for e in environ if e.startswith(RUN.encode() + b"=")]
    return found[0] if found else None


def _this_run(pid: int, run: str | None) -> bool:
    """Whether the process is this run's: its own mark, or its nearest marked ancestor's, is ``run`` (a sandbox starts
    its processes with a clean environment), or pytest (this process, whose own /proc environment predates the mark)
    is among its ancestors."""
    me = os.getpid()
    for _ in range(64):
        if pid == me:
            return True
        mark = _mark(pid)
        if mark is not None:
            return mark == run
        try:
            pid = int(_stat(pid)[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid <= 1:
            return False
    return False


def processes() -> list[str]:
    """The suite's processes still running: 'pid: command line'."""
    me, mine, run = os.getpid(), _start_ticks(os.getpid()), os.environ.get(RUN)
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            argv = Path(f"/proc/{d}/cmdline").read_bytes().decode(errors="replace").split("\0")
            cmd = " ".join(argv).strip()
            stat = _stat(int(d))
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        state, parent, started = stat[0], int(stat[1]), int(stat[19])
        if parent == me and any(k in cmd for k in PYTEST_OWN):
            continue
        pytest = any("pytest" in a for a in argv[:3])  # pytest itself, not a process whose files are in tmp_path
        if (state != "Z" and started >= mine and any(k in cmd for k in KINDS) and not pytest
                and _this_run(int(d), run)):
            found.append(f"{d}: {cmd[:160]}")
    return found


def namespaces(made: set[str]) -> list[str]:
    """Of the network namespaces and links this run made (``made``: the names it gave ``ip netns add`` and ``ip link
    add``), those still there. Another run's, made meanwhile, are not this run's to report."""
    if shutil.which("ip") is None or not made:
        return []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout.splitlines()
    names = {line.split()[0] for line in listed if line.strip()}
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=30).stdout.splitlines()
    names |= {line.split(":")[1].strip().split("@")[0] for line in links if line.count(":") >= 2}
    return sorted(made & names)


def own_tempdir(run: str) -> Path:
    """Point this run's temporary files (``TMPDIR``, inherited by everything it starts) at a folder of its own, so that
    the folders it leaves are told apart from another job's; pytest's own tmp_path stays where it was."""
    base = os.environ.setdefault(TMP_ROOT, tempfile.gettempdir())  # pytest-xdist's workers: beside their controller's
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", base)  # pytest's basetemp root, read when tmp_path is first used
    folder = Path(base) / f"labkit-test-{run[:12]}"
    folder.mkdir(mode=0o700, exist_ok=True)
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = None  # read TMPDIR again
    return folder


def remove_own_tempdir(folder: Path) -> None:
    """Remove the run's temporary folder (what was left there is reported by now). multiprocessing removes its own
    folder there (pymp-*) as this process exits, so the folder itself goes after that, by a finalizer of lower
    priority than multiprocessing's."""
    from multiprocessing import util

    for path in Path(folder).glob("*"):
        if not path.name.startswith("pymp-"):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() and not path.is_symlink() else path.unlink()
    util.Finalize(None, shutil.rmtree, args=(str(folder),), kwargs={"ignore_errors": True}, exitpriority=-101)


def _cgroup_pids(path: str) -> list[int]:
    for name in ("cgroup.procs", "tasks"):
        try:
            return [int(x) for x in Path(path, name).read_text().split()]
        except (OSError, ValueError):
            continue
    return []


def folders_and_cgroups(run: str | None = None, settle: float = 5) -> list[str]:
    """This run's temporary folders of grading, hosts, SLURM and engines (in its own TMPDIR, see :func:`own_tempdir`),
    and the grading cgroups made since it started that hold no process of another run or job (a cgroup's time is its
    creation), so that what another job makes, or a killed run left earlier, is not blamed on this one. A cgroup is
    blamed only if it is still so after up to ``settle`` s: another job's grader leaves its cgroup empty for a moment
    after making it and before removing it (a test run beside two others once blamed two such on itself)."""
    run = os.environ.get(RUN) if run is None else run
    tmp = os.environ.get("TMPDIR", "")
    left = [path for kind in FOLDERS for path in glob.glob(f"{tmp}/labkit-{kind}-*")] if "labkit-test-" in tmp else []
    cgroups, deadline = _own_cgroups(run), time.monotonic() + settle
    while cgroups and time.monotonic() < deadline:
        time.sleep(0.5)
        cgroups &= _own_cgroups(run)
    return left + sorted(cgroups)


def _own_cgroups(run: str | None) -> set[str]:
    mine, own = pytest_started(), set()
    for path in glob.glob("/sys/fs/cgroup/*/labkit-grade-*") + glob.glob("/sys/fs/cgroup/labkit-grade/labkit-grade-*"):
        try:
            if os.stat(path).st_mtime >= mine and all(_this_run(pid, run) for pid in _cgroup_pids(path)):
                own.add(path)
        except OSError:
            continue  # removed meanwhile
    return own


def made_by(argv) -> str | None:
    """The namespace or link a command makes (``ip netns add NAME``, ``ip link add NAME ...``), if it makes one."""
    argv = [str(a) for a in argv] if not isinstance(argv, str) else argv.split()
    if len(argv) >= 4 and argv[0].rsplit("/", 1)[-1] == "ip" and argv[2] == "add" and argv[1] in ("netns", "link"):
        return argv[3]
    return None


def left_behind(made: set[str], wait: float = 10) -> dict[str, list[str]]:
    """What the run left behind, by kind (empty when nothing); waits up to ``wait`` s for processes still stopping.
    ``made``: the namespaces and links the run made."""
    if not Path("/proc/self/stat").exists():
        return {}  # not Linux: nothing to read
    deadline = time.monotonic() + wait  # a cluster stopped by the last test may still be shutting down
    procs = processes()
    while procs and time.monotonic() < deadline:
        time.sleep(0.5)
        procs = processes()
    found = {"processes": procs, "network namespaces and links": namespaces(made),
             "grading cgroups and temporary folders": folders_and_cgroups()}
    return {kind: items for kind, items in found.items() if items}
