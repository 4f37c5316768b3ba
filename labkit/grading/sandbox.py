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

Where bubblewrap cannot make its namespaces (a container that forbids them, as Gradescope's may) and the grader is
root, each notebook runs instead as an **unprivileged user of its own** (:func:`kind` is ``"user"``): a user id from
:data:`USER_IDS` with no name and no files, claimed for one notebook. It owns only its scratch folder, so it cannot
write the grader, labkit, the release or the results; everything it starts runs as it, and every process of it is
killed when the notebook ends, before the grader writes anything. It reads what any user of the machine may read, so
keep the instructor's notebooks and the grades where others cannot (``chmod o-rwx``); the bundle's setup.sh does so.
It has the machine's network. ``LABKIT_SANDBOX`` chooses (``auto``, ``bubblewrap``, ``user``).

Where neither can be made (macOS, a grader that is not root), :func:`available` says why; ``labkit grade`` then
refuses unless told ``--no-sandbox``.

Either way the kernel starts under an audit hook (:mod:`.audit`; :func:`audited` says which folders are the
notebook's), which notes what it tries beyond them, so that the grader can list who tried.
"""

from __future__ import annotations

import functools
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
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


DESCRIBED = {"bubblewrap": "bubblewrap's namespaces", "user": "an unprivileged user of its own (no bubblewrap here)",
             "none": "nothing (--no-sandbox)", "": "nothing"}


def kind() -> str:
    """How a notebook is isolated here: "bubblewrap", "user" (an unprivileged user of its own), or "" (neither can
    be made: :func:`available` says why)."""
    wanted = settings.get("LABKIT_SANDBOX")
    if wanted != "user" and _bubblewrap()[0]:
        return "bubblewrap"
    if wanted != "bubblewrap" and _user()[0]:
        return "user"
    return ""


def available() -> tuple[bool, str]:
    """(True, "") where a notebook can be isolated here (:func:`kind`), else (False, why)."""
    if kind():
        return True, ""
    wanted = settings.get("LABKIT_SANDBOX")
    why = [w for name, (ok, w) in (("bubblewrap", _bubblewrap()), ("user", _user())) if wanted in ("auto", name)]
    return False, "; and ".join(why)


def _user() -> tuple[bool, str]:
    if not sys.platform.startswith("linux"):
        return False, f"an unprivileged user of its own needs Linux; this is {sys.platform}"
    if os.geteuid() != 0:
        return False, ("the fallback without bubblewrap runs each notebook as an unprivileged user of its own, which "
                       "only root can start (Gradescope's run_autograder runs as root)")
    closed = [str(p) for p in (Path(sys.executable).resolve(), Path(sys.prefix), Path(sys.base_prefix),
                               Path(__file__).resolve().parent.parent) if not _open_to_others(p)]
    if closed:
        return False, (f"an unprivileged user could not run this Python: {closed[0]} is not open to other users (a "
                       "folder above it lacks o+x, as /root does): install Python and labkit where every user may "
                       "read them, or install bubblewrap")
    if exposed := exposed_solutions():
        return False, (f"the instructor's notebooks in {exposed} are open to every user of this machine, so an "
                       f"unprivileged user of its own would read the solutions: chmod o-rwx {exposed}, or install "
                       "bubblewrap")
    return True, ""


def exposed_solutions() -> Path | None:
    """The folder of the instructor's notebooks (a checkout's notebooks/, with the solutions), where any user of the
    machine may read it; None where it is closed to them, or holds the handouts alone (an installed labkit)."""
    from ..handout import is_handout
    from ..labs import NOTEBOOKS

    folder = Path(NOTEBOOKS)
    found = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if not found or not _open_to_others(folder) or not os.stat(folder).st_mode & 0o001:
        return None
    try:
        if all(is_handout(json.loads(p.read_text(encoding="utf-8"))) for p in found):
            return None
    except (OSError, ValueError):
        pass
    return folder


def _open_to_others(path: Path) -> bool:
    """Whether a user who owns nothing can reach ``path`` (o+x on every folder above it) and read it."""
    import stat

    try:
        if not os.stat(path).st_mode & stat.S_IROTH:
            return False
        return all(os.stat(folder).st_mode & stat.S_IXOTH for folder in path.parents)
    except OSError:
        return False


@functools.lru_cache(maxsize=1)
def _bubblewrap() -> tuple[bool, str]:
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


def audited(scratch: Path, user: bool) -> dict[str, list[str]]:
    """The folders the kernel's audit hook (:mod:`.audit`) counts as the notebook's: ``own`` (read and written), its
    private temporary folders ``temp`` (written), and ``system``, what it reads besides the system's (Python, this
    environment, labkit, the data)."""
    # bubblewrap's /tmp and /dev/shm are the notebook's alone; a user of its own shares the machine's /tmp (its TMPDIR
    # is in its folder), and /dev/shm, where multiprocessing keeps its shared arrays
    temp = ["/dev/shm"] if user else ["/tmp", "/dev/shm"]
    return {"own": [str(scratch)], "temp": temp, "system": sorted({str(p) for pair in _readable() for p in pair})}


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


# ---- an unprivileged user of its own -------------------------------------------------------------------------------

USER_IDS = range(61000, 62000)  # ids no account has: each graded notebook runs as one, which owns nothing else


def claim_uid() -> int:
    """A user id of :data:`USER_IDS` that no process runs as, no account names, and no other grading holds (a lock
    file, removed by :func:`release_uid`)."""
    import pwd
    import secrets

    named = {p.pw_uid for p in pwd.getpwall()}
    for _ in range(200):
        uid = USER_IDS[secrets.randbelow(len(USER_IDS))]
        if uid in named or user_pids(uid):
            continue
        try:
            os.close(os.open(_uid_lock(uid), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            continue
        return uid
    raise RuntimeError(f"no free user id in {USER_IDS.start}-{USER_IDS.stop - 1} to grade a notebook as")


def scratch_parent() -> str:
    """Where a user of its own can reach its scratch folder: the temporary folder, else /tmp (a grader's TMPDIR may
    be a folder of its own, 0700)."""
    return next((d for d in (tempfile.gettempdir(), "/tmp", "/var/tmp") if _open_to_others(Path(d) / ".")),
                "/tmp")


def _uid_lock(uid: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"labkit-grade-uid-{uid}.lock")


def user_pids(uid: int) -> set[int]:
    """Every live process running as ``uid`` (its real or effective id), from /proc; a zombie, already dead and
    waiting for its parent to read its status, is not counted."""
    found = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
            if fields["State"].split()[0] != "Z" and uid in {int(x) for x in fields["Uid"].split()[:2]}:
                found.add(int(status.parent.name))
        except (OSError, ValueError, KeyError, IndexError):
            continue
    return found


def kill_user(uid: int | None) -> None:
    """SIGKILL every process of ``uid`` until none is left (a process that forks while it is killed included)."""
    if uid is not None:
        kill_until_gone(lambda: user_pids(uid), wait=10.0)


def release_uid(uid: int | None) -> None:
    """Kill what ``uid`` still runs, and give the id back."""
    if uid is None:
        return
    kill_user(uid)
    try:
        os.unlink(_uid_lock(uid))
    except FileNotFoundError:
        pass


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
            log: Path | None = None, uid: int | None = None) -> list[str]:
    """The command line that runs ``argv`` in the sandbox: the launcher (limits, cgroup, output to ``log``), then
    bubblewrap; with ``uid``, the launcher gives ``scratch`` to that user and becomes it, with ``env``."""
    spec = {"limits": asdict(limits), "cgroups": [str(d) for d in cgroups], "log": str(log) if log else None}
    launcher = [sys.executable, "-m", "labkit.grading.sandbox", "run"]
    if uid is not None:
        spec.update(uid=uid, scratch=str(scratch), env={**env, "TMPDIR": str(scratch / ".tmp"), "USER": "student",
                                                         "LOGNAME": "student"})
        return [*launcher, json.dumps(spec), "--", *argv]
    return [*launcher, json.dumps(spec), "--", *bwrap_args(scratch, env), "--", *argv]


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
        if os.getuid() != 0 and spec.get("uid") is None:  # root is exempt; a user's count includes their others
            mine = sum(1 for p in Path("/proc").iterdir() if p.name.isdigit() and _owner(p) == os.getuid())
            wanted.append((resource.RLIMIT_NPROC, mine + limits.processes))
    if spec.get("uid") is not None:  # a user of its own runs nothing else: its count is the notebook's
        wanted.append((resource.RLIMIT_NPROC, limits.processes))
    for which, value in wanted:
        soft, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))
    if spec.get("uid") is not None:
        _become(spec["uid"], Path(spec["scratch"]), spec["env"])


def _become(uid: int, scratch: Path, env: dict) -> None:
    """Give ``scratch`` to ``uid`` and become that user, with ``env`` alone: from here on
    the notebook writes nothing but its own folder."""
    (scratch / ".tmp").mkdir(exist_ok=True)
    for folder, dirs, files in os.walk(scratch):
        for name in [folder, *(os.path.join(folder, n) for n in dirs + files)]:
            os.lchown(name, uid, uid)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit(f"labkit sandbox: could not become user {uid}")
    os.umask(0o077)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(scratch)


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
