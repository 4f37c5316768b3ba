import os
import warnings
from pathlib import Path

import pytest

os.environ.setdefault("LABKIT_PROGRESS", "0")
os.environ.setdefault("MPLBACKEND", "Agg")

ROOT = Path(__file__).resolve().parent.parent


def real_data_dir() -> Path | None:
    """The folder with the reference MNIST files, when the run has one (CI points LABKIT_DATA at it)."""
    from labkit import settings

    env = settings.data_dir()
    for cand in ([env] if env else []) + [ROOT / "data", ROOT.parent / "shared" / "data"]:
        if (cand / "mnist" / "train-labels-idx1-ubyte.gz").exists():
            return cand
    return None


@pytest.fixture(scope="session")
def data_dir():
    d = real_data_dir()
    if d is None:
        pytest.skip("no MNIST files here (set LABKIT_DATA to a folder holding mnist/ and fashion-mnist/)")
    return d


@pytest.fixture(scope="session")
def digits():
    """MNIST when available, else the subset shipped with labkit: ((x_train, y_train), (x_test, y_test))."""
    from labkit.data import SubsetDataWarning, load_mnist

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SubsetDataWarning)
        return load_mnist(root=real_data_dir())


def run_mpi_cases(script: str, n: int, timeout: float = 300, only: str | None = None, hosts=None) -> str:
    """Run the named cases of tests/mpi/<script> under the real mpiexec on n ranks (``only``: those whose name holds
    it; ``hosts``: spread over these, see labkit.hosts); assert every case passed, and on failure say which case failed
    on which rank and why. Returns stdout."""
    from labkit import cluster

    args = [str(ROOT / "tests" / "mpi" / script)] + (["-k", only] if only else [])
    res = cluster.run_mpi(args, n=n, timeout=timeout, hosts=hosts)
    if res.returncode == 0 and f"OK {n} (" in res.stdout:
        return res.stdout
    failed = [ln for ln in res.stdout.splitlines() if ln.startswith("FAIL case")]
    started = [ln[5:] for ln in res.stdout.splitlines() if ln.startswith("case ")]
    head = (res.stdout[res.stdout.index(failed[0]):][:3000] if failed else
            f"{script} on {n} ranks ended (exit {res.returncode}) in case {started[-1]!r}" if started else
            f"{script} on {n} ranks ended (exit {res.returncode}) before its first case")
    pytest.fail(f"{head}\n--- stderr ---\n{res.stderr[-3000:]}", pytrace=False)


def run_failing_mpi(tmp_path, source: str, n: int, within: float) -> str:
    """Run ``source`` as an MPI program on n ranks that must fail: assert it ended with an error within
    ``within`` seconds and left no process behind; return its stderr (where the failing rank's traceback is)."""
    import subprocess
    import time

    from labkit import cluster

    script = tmp_path / "failing_job.py"
    script.write_text(source)
    t0 = time.monotonic()
    res = cluster.run_mpi([str(script)], n=n, timeout=60)
    elapsed = time.monotonic() - t0
    assert res.returncode != 0, "the job should have failed"
    assert elapsed < within, f"the job took {elapsed:.1f} s to end (limit {within} s)"
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes left behind: {left}"
    return res.stderr


def _have_cxx() -> bool:
    from labkit.kernels.emulator import EmulatorUnavailable, compiler

    try:
        compiler()
        return True
    except EmulatorUnavailable:
        return False


needs_cxx = pytest.mark.skipif(not _have_cxx(), reason="no C++ compiler here for the CUDA emulator (apt install g++)")


def _have_cc() -> bool:
    from labkit.hostc import CompilerMissing, compiler

    try:
        compiler()
        return True
    except CompilerMissing:
        return False


needs_cc = pytest.mark.skipif(not _have_cc(), reason="no C compiler here for labkit.hostc (apt install gcc)")
