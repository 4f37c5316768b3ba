"""Collectives under a real mpiexec: every algorithm against the MPI library, with 1 to 6 ranks."""

import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from labkit import cluster

pytestmark = pytest.mark.mpi
HERE = Path(__file__).parent


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6])
def test_collectives_match_mpi(n):
    res = cluster.run_mpi([str(HERE / "mpi" / "check_collectives.py")], n=n, timeout=300)
    assert res.returncode == 0 and f"OK {n}" in res.stdout, res.stderr[-4000:]


def left_behind(marker: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()


def test_rank_raising_inside_collective_ends_job(tmp_path):
    script = tmp_path / "raise_inside.py"
    script.write_text(
        "import numpy as np\nfrom mpi4py import MPI\nfrom labkit.collectives import ring_allreduce\n"
        "c = MPI.COMM_WORLD\n"
        "x = np.ones(10) if c.rank != 1 else np.ones(10, dtype=object)  # rank 1 passes a bad buffer\n"
        "ring_allreduce(c, x, check=False)  # the others are already waiting for rank 1\n")
    t0 = time.monotonic()
    res = cluster.run_mpi([str(script)], n=3, timeout=60)
    elapsed = time.monotonic() - t0
    assert res.returncode != 0
    assert "TypeError" in res.stderr and "dtype object" in res.stderr  # rank 1's traceback is shown
    assert elapsed < 10, f"the job took {elapsed:.1f} s to end"
    time.sleep(0.5)
    assert not left_behind(str(script))


def test_missing_rank_times_out_instead_of_hanging(tmp_path):
    script = tmp_path / "skip.py"
    script.write_text(
        "import numpy as np\nfrom mpi4py import MPI\nfrom labkit.collectives import ring_allreduce\n"
        "c = MPI.COMM_WORLD\n"
        "if c.rank != 1:  # rank 1 never calls the collective\n"
        "    ring_allreduce(c, np.ones(8), check=False, timeout=2)\n"
        "else:\n"
        "    import time; time.sleep(30)\n")
    t0 = time.monotonic()
    res = cluster.run_mpi([str(script)], n=3, timeout=60)
    assert res.returncode != 0 and "TimeoutError" in res.stderr and "waited 2 s" in res.stderr
    assert time.monotonic() - t0 < 20
    time.sleep(0.5)
    assert not left_behind(str(script))


def test_single_process_without_mpiexec():
    """With one rank (a plain Python, singleton MPI) every collective is the identity."""
    from mpi4py import MPI

    from labkit import collectives as C

    x = np.arange(5.0)
    for fn in C.ALLREDUCES.values():
        np.testing.assert_array_equal(fn(MPI.COMM_SELF, x), x)
    np.testing.assert_array_equal(C.broadcast(MPI.COMM_SELF, x), x)
    np.testing.assert_array_equal(C.alltoall(MPI.COMM_SELF, x), x)


def test_ring_exercise_check_under_mpiexec():
    res = cluster.run_mpi([str(HERE / "mpi" / "check_ring_exercise.py")], n=3, timeout=300)
    assert res.returncode == 0 and "OK" in res.stdout, res.stdout[-2000:] + res.stderr[-4000:]
    assert "✔ ring allreduce on 1 to 3 ranks" in res.stdout
