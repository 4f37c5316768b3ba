"""MPI launching: the virtual environment's own ``mpiexec``, and running a script under it safely.

(The ipyparallel cluster of MPI engines joins this module with the collectives lab.)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path


def mpiexec_path() -> Path:
    """The ``mpiexec`` next to this Python (from the ``mpich`` wheel); never a different MPI's from PATH."""
    here = Path(sys.prefix) / "bin" / "mpiexec"
    if here.exists():
        return here
    exe = Path(sys.executable).parent / "mpiexec"
    if exe.exists():
        return exe
    found = shutil.which("mpiexec")
    hint = (f" (a different one is on PATH at {found}; it may not match mpi4py's MPI)" if found else "")
    raise FileNotFoundError(
        f"no mpiexec in {here.parent}{hint}. Install MPI into this environment: `pip install mpich mpi4py` "
        "(or `make test`, which sets up .venv with it)."
    )


def mpi_env(n_ranks: int) -> dict:
    """Environment for MPI jobs: with more ranks than cores, MPICH must yield instead of spinning."""
    env = dict(os.environ)
    if n_ranks > (os.cpu_count() or 1):
        env["MPIR_CVAR_ENABLE_HEAVY_YIELD"] = "1"
    return env


def run_mpi(args: list[str], n: int, timeout: float = 120.0, python: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -m mpi4py ARGS`` (or a plain command) on ``n`` ranks; one rank's exception aborts the job.

    Raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds, with the job killed.
    """
    cmd = [str(mpiexec_path()), "-n", str(n)]
    cmd += ([sys.executable, "-m", "mpi4py"] if python else []) + list(args)
    # a session of its own, so that a timeout kills mpiexec *and* every rank it started
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=mpi_env(n), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
