"""Launching MPI jobs: the virtual environment's own ``mpiexec``, its environment, and running a script under it safely
(every rank ended when the job ends, times out or loses a host)."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..machine import usable_cores
from ..native.build import BuildFailed, c_compiler_path, shared_library
from .hosts import TCP_BETWEEN_HOSTS, NamespaceHosts
from .processes import kill_until_gone


def mpiexec_path() -> Path:
    """The ``mpiexec`` of this environment (the ``mpich`` wheel's in a venv, conda's in a conda environment), the one
    mpi4py was built against; never a different MPI's from PATH."""
    here = Path(sys.prefix) / "bin" / "mpiexec"
    if here.exists():
        return here
    exe = Path(sys.executable).parent / "mpiexec"
    if exe.exists():
        return exe
    found = shutil.which("mpiexec")
    hint = (f" (a different one is on PATH at {found}; it may not match mpi4py's MPI)" if found else "")
    raise FileNotFoundError(
        f"no mpiexec in {here.parent}{hint}. Install MPI into this environment: `pip install -e '.[mpi]'` "
        "(the mpich wheel; `make test` sets up .venv with it), or in a conda environment `conda install mpich mpi4py`."
    )


@functools.cache
def loopback_preload() -> Path | None:
    """A small shared library that binds sockets meant for every interface to loopback instead (compiled once from
    labkit/native/loopback_bind.c into the cache; None where that cannot be: not Linux, or no C compiler).

    Hydra, MPICH's ``mpiexec``, listens for its proxies on 0.0.0.0 and has no option to change that; measured here,
    ``-iface lo``, ``-localhost 127.0.0.1``, ``-pmi-port`` and ``-launcher fork`` all left it there, and MPICH's
    other launcher, ``mpiexec.gforker``, cuts its ranks' output at the first byte that is not ASCII. Preloaded into a
    job on one machine, this keeps the control port on 127.0.0.1."""
    if not sys.platform.startswith("linux"):
        return None
    src = Path(__file__).resolve().parent.parent / "native" / "loopback_bind.c"
    cc = c_compiler_path()  # no process started to ask its version: this runs before every job's first MPI launch
    if cc is None or not src.exists():
        return None
    try:
        return shared_library((cc, ""), src.read_text(), src.name, ["-O2", "-fPIC", "-shared"], libs=("-ldl",))
    except BuildFailed:
        return None


# The network modules MPICH may pick (UCX, or libfabric's tcp and sockets providers) open a listening socket on the
# machine's network interface even when every rank is local; these keep them on loopback. A user's own setting wins.
LOOPBACK_ONLY = {"UCX_NET_DEVICES": "lo", "FI_TCP_IFACE": "lo", "FI_SOCKETS_IFACE": "lo"}


def mpi_env(n_ranks: int, heavy_yield: bool | None = None, local: bool = True) -> dict:
    """Environment for MPI jobs. ``heavy_yield`` (default: when ranks outnumber cores) makes MPICH give up
    the core while it waits instead of spinning. ``local`` keeps MPI's network modules on loopback
    (:data:`LOOPBACK_ONLY`): nothing of a job on one machine can be reached from the network.

    Measured on a 2-core machine: with 8 ranks, one rank's computation ran 2x faster while the others
    waited with heavy yield; but every small message took about 150 µs instead of about 7 µs.
    """
    env = dict(os.environ)
    if local:
        for k, v in LOOPBACK_ONLY.items():
            env.setdefault(k, v)
        preload = loopback_preload()
        if preload is not None:
            env["LD_PRELOAD"] = " ".join(filter(None, [str(preload), env.get("LD_PRELOAD", "")]))
    if heavy_yield is None:
        heavy_yield = n_ranks > usable_cores()
    if heavy_yield:
        env["MPIR_CVAR_ENABLE_HEAVY_YIELD"] = "1"
    else:
        env.pop("MPIR_CVAR_ENABLE_HEAVY_YIELD", None)
    return env


# Every rank on this machine: hydra's own launch by fork, and no resource manager's host list (inside a SLURM job of
# several nodes hydra would otherwise spread the ranks over them, while LOOPBACK_ONLY keeps them from meeting)
LOCAL_ARGS = ["-rmk", "user", "-launcher", "fork"]
# The nodes of the SLURM job mpiexec runs in, its proxies started by srun (as many ranks on a node as it has tasks)
SLURM_ARGS = ["-rmk", "slurm", "-launcher", "slurm"]
def hosts_args(hosts, n: int) -> tuple[list[str], dict]:
    """mpiexec's arguments and environment for a job over ``hosts``: ``"slurm"``, the nodes of the SLURM allocation
    this runs in (hydra's slurm launcher: ``srun`` starts its proxies); real hosts by name (hydra's own ssh launcher,
    mpiexec listening on every interface as MPI across machines needs), or :class:`labkit.cluster.hosts.NamespaceHosts`
    (their launcher, mpiexec listening on the bridge only, MPI's network modules on each host's one interface)."""
    if isinstance(hosts, str) and hosts == "slurm":
        if "SLURM_JOB_ID" not in os.environ:
            raise ValueError("hosts='slurm' spreads the ranks over the nodes of a SLURM allocation, and this is not in "
                             "one: run it in a job (sbatch, salloc, or srun --pty for a shell), or leave hosts out")
        return list(SLURM_ARGS), {}
    if isinstance(hosts, NamespaceHosts):
        args = ["-hosts", ",".join(hosts.addresses), "-launcher", "ssh", "-launcher-exec", str(hosts.launcher),
                "-localhost", hosts.bridge_address]
        return args, {"LABKIT_BIND_ADDRESS": hosts.bridge_address, **TCP_BETWEEN_HOSTS}
    names = [str(h) for h in hosts]
    if not names or any(not h or "," in h or h.startswith("-") for h in names):
        raise ValueError(f"hosts must be host names or addresses, got {hosts!r}")
    return ["-hosts", ",".join(names)], {}


def run_mpi(args: list[str], n: int, timeout: float = 120.0, python: bool = True,
            hosts=None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m mpi4py ARGS`` (or a plain command) on ``n`` ranks; one rank's exception aborts the job.

    ``hosts``: the machines to spread the ranks over, round robin (host names, or namespace hosts from
    :func:`labkit.cluster.hosts.namespace_hosts`), or ``"slurm"``: the nodes of the SLURM job this runs in, as many ranks on
    each as the job has tasks there; by default every rank runs here, talking over loopback only.
    ``env``: variables to add to every rank's environment (set before MPI starts, as MPICH's ``MPIR_CVAR_*`` must be).
    Raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds, with the job killed.
    """
    cmd = [str(mpiexec_path())]
    extra_vars = dict(env or {})
    env = mpi_env(n, local=hosts is None)
    env.update(extra_vars)
    if hosts is None:
        cmd += LOCAL_ARGS
    else:
        extra, extra_env = hosts_args(hosts, n)
        cmd += extra
        env.update(extra_env)
        if "LABKIT_BIND_ADDRESS" in extra_env and (preload := loopback_preload()) is not None:
            env["LD_PRELOAD"] = " ".join(filter(None, [str(preload), env.get("LD_PRELOAD", "")]))
    launch_errors = getattr(hosts, "launch_errors", None)
    said_before = len(launch_errors()) if launch_errors else 0
    job = os.urandom(8).hex()
    env[JOB_MARK] = job
    cmd += ["-n", str(n)] + ([sys.executable, "-m", "mpi4py"] if python else []) + list(args)
    # a session of its own, so that a timeout kills mpiexec *and* every rank it started
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        # across hosts, the abort after a rank's failure may wait on a host that cannot be reached: end such a job
        out, err = _outputs(proc, cmd, timeout, failed=() if hosts is None else FAILED if python else (ABORTED,))
    finally:
        # mpiexec has ended; a rank it could not reach to stop (its host cut off, say) may still run: end it too,
        # found by the mark the job's processes carry (hydra puts its ranks and proxies in sessions of their own)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        kill_marked(job)
    if proc.returncode and launch_errors:
        # the launcher's own words (a host it does not know), which hydra may have ended too soon to pass on
        err += "".join(line + "\n" for line in launch_errors()[said_before:].splitlines() if line not in err)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


ABORTED = "application called MPI_Abort"  # MPICH's line when a rank aborts the job
# a rank's exception under python -m mpi4py, which then aborts the job
FAILED = (ABORTED, "Traceback (most recent call last):")
ABORT_GRACE = 5.0  # seconds a job has, after a rank failed, to end by itself before it is ended


def _outputs(proc: subprocess.Popen, cmd: list[str], timeout: float, failed: tuple[str, ...]) -> tuple[str, str]:
    """The job's stdout and stderr once it has ended. A job in which a rank failed (a line of ``failed`` on stderr)
    is ended :data:`ABORT_GRACE` seconds later if it is still running: the abort that follows can wait without end
    on the proxy of a host whose cable was cut, which never answers. Raises ``subprocess.TimeoutExpired`` after
    ``timeout`` seconds."""
    out: list[str] = []
    err: list[str] = []
    def read(stream, sink: list[str]) -> None:
        for line in stream:
            sink.append(line)

    readers = [threading.Thread(target=read, args=pair, daemon=True) for pair in ((proc.stdout, out), (proc.stderr, err))]
    for reader in readers:
        reader.start()
    deadline, aborted, seen, timed_out = time.monotonic() + timeout, None, 0, False
    while proc.poll() is None:
        now = time.monotonic()
        if aborted is None and failed:
            lines = err[seen:]
            seen += len(lines)
            aborted = now if any(mark in line for line in lines for mark in failed) else None
        timed_out = now > deadline
        if timed_out or (aborted is not None and now - aborted > ABORT_GRACE):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            break
        time.sleep(0.05)
    for reader in readers:  # a rank on a host cut off may hold the pipes open: the caller ends it by its mark
        reader.join(timeout=1.0)
    if aborted is not None and proc.returncode == -signal.SIGKILL and not timed_out:
        err.append(f"labkit: a rank failed and the job had not ended {ABORT_GRACE:g} s later (mpiexec waiting for a "
                   "host it cannot reach?), so labkit ended it\n")
    if timed_out:
        raise subprocess.TimeoutExpired(cmd, timeout, output="".join(out), stderr="".join(err))
    return "".join(out), "".join(err)


JOB_MARK = "LABKIT_MPI_JOB"


def marked(job: str) -> list[int]:
    """The processes on this machine (in any namespace) whose environment carries ``LABKIT_MPI_JOB=job``."""
    needle = f"{JOB_MARK}={job}".encode()
    found = []
    for d in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle in (d / "environ").read_bytes().split(b"\0"):
                found.append(int(d.name))
        except OSError:
            continue
    return found


def kill_marked(job: str, wait: float = 5.0) -> None:
    """End every process of MPI job ``job`` (see :func:`marked`), waiting up to ``wait`` seconds."""
    kill_until_gone(lambda: marked(job), wait=wait)


def address_toward(host: str) -> str:
    """This machine's address on the route toward ``host`` (no packet is sent): the one that host reaches it by."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(host), 9))
        return s.getsockname()[0]
