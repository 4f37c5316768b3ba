"""A sandbox for each graded notebook: bubblewrap's Linux namespaces, a cgroup and rlimits.

The notebook's kernel, and everything it starts (MPI ranks, ipyparallel's controller and engines, the compiler), sees:

- **read only:** the system's programs and libraries (``/usr``, a few files of ``/etc``), Python and this environment,
  labkit, and the data sets;
- **read and write:** its own scratch folder (its copy of the notebook, its HOME, its caches), a private ``/tmp``;
- **nothing else:** no other submission, no instructor's notebook, no release record, no grades;
- **network:** a namespace of its own with only its loopback, on which its own MPI ranks and engines talk;
- **processes:** a PID namespace of its own: when the kernel ends or is killed, everything it started ends with it.

Limits: memory and the number of processes through a cgroup when the grader may make one (root on Linux; cgroup v1 or
v2), else per-process rlimits; CPU seconds per process and file size always through rlimits. The launcher that sets
them (``python -m labkit.grading.sandbox run``) runs before any of the student's code and then becomes bubblewrap.

Where bubblewrap or user namespaces are missing (macOS, a locked-down host), :func:`available` says why and grading
runs without isolation, after a warning.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import data, settings
from ..cluster.processes import kill_until_gone

ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "hosts", "nsswitch.conf", "localtime",
       "timezone", "alternatives", "ssl", "ca-certificates", "os-release", "gai.conf", "host.conf", "fonts")
ENV_PREFIXES = ("LABKIT_", "OMP_", "OPENBLAS_", "MKL_", "PYDEVD_", "JPY_", "LC_", "MPIR_", "MPICH_", "HYDRA_")
ENV_NAMES = ("PATH", "LANG", "TERM", "MPLBACKEND", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONHASHSEED", "CC")


@dataclass
class Limits:
    """What one notebook may use. memory and processes are for all its processes together (a cgroup) where the
    grader can make one, else per process; cpu_seconds is per process."""

    memory_mb: int = 4096
    processes: int = 256
    cpu_seconds: int = 1800
    file_mb: int = 2048


@functools.lru_cache(maxsize=1)
def available() -> tuple[bool, str]:
    """(True, "") where bubblewrap can make the namespaces here, else (False, why)."""
    if not sys.platform.startswith("linux"):
        return False, f"sandboxing needs Linux namespaces; this is {sys.platform}"
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return False, "bubblewrap is not installed (Debian/Ubuntu: apt install bubblewrap)"
    try:
        done = subprocess.run([bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "true"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"bubblewrap did not start: {e}"
    if done.returncode != 0:
        return False, f"bubblewrap cannot make namespaces here: {done.stderr.strip()[:200]}"
    return True, ""


def _readable() -> list[tuple[Path, Path]]:
    """What the notebook must read, as (where it is, where the notebook sees it): Python, this environment, labkit,
    the data. A path through a symbolic link (LABKIT_DATA=/scratch/course/data, with /scratch a link, say) is seen
    both where the link points and where the variables name it."""
    paths = [Path(sys.base_prefix), Path(sys.prefix), Path(__file__).resolve().parent.parent]  # labkit/
    for p in (data.REPO_DATA, data.default_dir(), settings.data_dir()):
        if p:
            paths.append(Path(p))
    exe = Path(sys.executable)
    if exe.is_symlink():
        paths.append(exe.resolve().parent.parent)
    out = []
    for p in paths:
        if not p.exists():
            continue
        real = p.resolve()
        for seen in (real, Path(os.path.abspath(p))):
            if seen != Path("/") and (real, seen) not in out:
                out.append((real, seen))
    return sorted(out, key=lambda pair: len(pair[1].parts))  # parents before children


def environment(scratch: Path, env: dict | None = None) -> dict:
    """The variables the sandboxed kernel gets: an allowlist of the grader's (never its secrets), HOME and caches
    in the scratch folder."""
    env = os.environ if env is None else env
    keep = {k: v for k, v in env.items() if k in ENV_NAMES or k.startswith(ENV_PREFIXES)}
    if "LABKIT_DATA" not in keep:  # the data set in the grader's cache (bound read-only), where labkit looks by HOME
        from .. import data

        try:
            if data.locate("mnist").found_by == "cache":
                keep["LABKIT_DATA"] = str(data.default_dir())
        except data.DataError:
            pass
    keep.update({"HOME": str(scratch), "TMPDIR": "/tmp", "LABKIT_CACHE": str(scratch / ".cache" / "labkit"),
                 "XDG_CACHE_HOME": str(scratch / ".cache"), "MPLCONFIGDIR": str(scratch / ".config" / "matplotlib"),
                 "IPYTHONDIR": str(scratch / ".ipython"), "JUPYTER_RUNTIME_DIR": str(scratch / ".runtime")})
    return keep


def bwrap_args(scratch: Path, env: dict) -> list[str]:
    args = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--hostname", "sandbox", "--clearenv"]
    for k, v in env.items():
        args += ["--setenv", k, v]
    args += ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = Path("/") / name
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            args += ["--ro-bind", str(p), str(p)]
    for name in ETC:
        if (Path("/etc") / name).exists():
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    args += ["--ro-bind-try", "/sys", "/sys", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
             "--tmpfs", "/dev/shm"]
    for real, seen in _readable():
        if not str(seen).startswith("/usr/"):
            args += ["--ro-bind", str(real), str(seen)]
    args += ["--bind", str(scratch), str(scratch), "--chdir", str(scratch)]
    return args


# ---- cgroups -------------------------------------------------------------------------------------------------------

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _cgroup_v2() -> bool:
    return (CGROUP_ROOT / "cgroup.controllers").is_file()


def make_cgroup(limits: Limits) -> list[Path]:
    """A cgroup (one folder per hierarchy) holding the notebook's processes, or [] where none can be made."""
    name = f"labkit-grade-{uuid.uuid4().hex[:12]}"
    made = []
    try:
        if _cgroup_v2():
            parent = CGROUP_ROOT / "labkit-grade"
            parent.mkdir(exist_ok=True)
            wanted = {"memory", "pids"} & set((CGROUP_ROOT / "cgroup.controllers").read_text().split())
            (parent / "cgroup.subtree_control").write_text(" ".join("+" + c for c in sorted(wanted)))
            d = parent / name
            d.mkdir()
            made.append(d)
            (d / "memory.max").write_text(str(limits.memory_mb << 20))
            (d / "memory.swap.max").write_text("0") if (d / "memory.swap.max").exists() else None
            (d / "pids.max").write_text(str(limits.processes))
        else:
            for controller, files in (("memory", {"memory.limit_in_bytes": limits.memory_mb << 20}),
                                      ("pids", {"pids.max": limits.processes})):
                d = CGROUP_ROOT / controller / name
                d.mkdir()
                made.append(d)
                for f, v in files.items():
                    (d / f).write_text(str(v))
    except OSError:
        remove_cgroup(made)
        return []
    return made


def cgroup_pids(cgroups: list[Path]) -> set[int]:
    pids = set()
    for d in cgroups:
        try:
            pids |= {int(x) for x in (d / "cgroup.procs").read_text().split()}
        except (OSError, ValueError):
            pass
    return pids


def kill_cgroup(cgroups: list[Path]) -> None:
    """SIGKILL every process in the cgroup, until it is empty (a fork bomb keeps forking while it is killed)."""
    for d in cgroups:
        if (d / "cgroup.kill").exists():
            try:
                (d / "cgroup.kill").write_text("1")
            except OSError:
                pass
    kill_until_gone(lambda: cgroup_pids(cgroups), wait=10.0)


def remove_cgroup(cgroups: list[Path]) -> None:
    kill_cgroup(cgroups)
    for d in cgroups:
        for _ in range(50):
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
    if cgroups and cgroups[0].parent.name == "labkit-grade":  # v2's parent, when no other grading uses it
        try:
            cgroups[0].parent.rmdir()
        except OSError:
            pass


def peak_memory_mb(cgroups: list[Path]) -> float | None:
    for d in cgroups:
        for f in ("memory.peak", "memory.max_usage_in_bytes"):
            try:
                return int((d / f).read_text()) / 2**20
            except (OSError, ValueError):
                continue
    return None


def hit_process_limit(cgroups: list[Path]) -> bool:
    """Whether a fork or a new thread of the notebook was refused by its process limit."""
    for d in cgroups:
        try:
            for line in (d / "pids.events").read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == "max" and int(v) > 0:
                    return True
        except (OSError, ValueError):
            continue
    return False


def oom_killed(cgroups: list[Path]) -> bool:
    """Whether the memory limit killed a process of the notebook."""
    for d in cgroups:
        for f, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
            try:
                for line in (d / f).read_text().splitlines():
                    k, _, v = line.partition(" ")
                    if k == key and int(v) > 0:
                        return True
            except (OSError, ValueError):
                continue
    return False


# ---- the launcher --------------------------------------------------------------------------------------------------

def command(argv: list[str], scratch: Path, limits: Limits, cgroups: list[Path], env: dict,
            log: Path | None = None) -> list[str]:
    """The command line that runs ``argv`` in the sandbox: the launcher (limits, cgroup, output to ``log``), then
    bubblewrap."""
    spec = {"limits": asdict(limits), "cgroups": [str(d) for d in cgroups], "log": str(log) if log else None}
    return [sys.executable, "-m", "labkit.grading.sandbox", "run", json.dumps(spec), "--", *bwrap_args(scratch, env), "--", *argv]


def _owner(proc: Path) -> int | None:
    try:
        return proc.stat().st_uid
    except OSError:
        return None


def _enter(spec: dict) -> None:
    limits = Limits(**spec["limits"])
    if spec.get("log"):  # what the kernel prints outside the notebook goes to the grader's log, not its terminal
        fd = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    for d in spec.get("cgroups", []):
        Path(d, "cgroup.procs").write_text(str(os.getpid()))
    mb = 1 << 20
    wanted = [(resource.RLIMIT_CPU, limits.cpu_seconds), (resource.RLIMIT_FSIZE, limits.file_mb * mb),
              (resource.RLIMIT_CORE, 0)]
    if not spec.get("cgroups"):  # no cgroup: per process, what the cgroup would have bounded for all
        wanted += [(resource.RLIMIT_AS, limits.memory_mb * mb)]
        if os.getuid() != 0:  # root is exempt from RLIMIT_NPROC; a user's count includes their other processes
            mine = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit() and _owner(p) == os.getuid())
            wanted.append((resource.RLIMIT_NPROC, mine + limits.processes))
    for which, value in wanted:
        soft, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[0] != "run" or "--" not in argv:
        print("usage: python -m labkit.grading.sandbox run SPEC -- COMMAND...", file=sys.stderr)
        return 2
    spec = json.loads(argv[1])
    cmd = argv[argv.index("--") + 1:]
    _enter(spec)
    os.execvp(cmd[0], cmd)
    return 127  # not reached


if __name__ == "__main__":
    from labkit.grading.sandbox import main as _main

    sys.exit(_main())
