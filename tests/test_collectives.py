"""Collectives under a real mpiexec: every algorithm against the MPI library, with 1 to 6 ranks."""


from pathlib import Path

import numpy as np
import pytest
from conftest import ranks, run_failing_mpi, run_mpi_cases

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("n", ranks(1, 2, 3, 4, 5, 6))
def test_collectives_match_mpi(n):
    run_mpi_cases("cases_collectives.py", n)


def test_rank_raising_inside_collective_ends_job(tmp_path):
    err = run_failing_mpi(tmp_path, (
        "import numpy as np\nfrom mpi4py import MPI\nfrom labkit.collectives import ring_allreduce\n"
        "c = MPI.COMM_WORLD\n"
        "x = np.ones(10) if c.rank != 1 else np.ones(10, dtype=object)  # rank 1 passes a bad buffer\n"
        "ring_allreduce(c, x, check=False)  # the others are already waiting for rank 1\n"), n=3, within=10)
    assert "TypeError" in err and "dtype object" in err  # rank 1's traceback is shown


def test_missing_rank_times_out_instead_of_hanging(tmp_path):
    err = run_failing_mpi(tmp_path, (
        "import numpy as np\nfrom mpi4py import MPI\nfrom labkit.collectives import ring_allreduce\n"
        "c = MPI.COMM_WORLD\n"
        "if c.rank != 1:  # rank 1 never calls the collective\n"
        "    ring_allreduce(c, np.ones(8), check=False, timeout=2)\n"
        "else:\n"
        "    import time; time.sleep(30)\n"), n=3, within=20)
    assert "TimeoutError" in err and "waited 2 s" in err


def test_single_process_without_mpiexec():
    """With one rank (a plain Python, singleton MPI) every collective is the identity."""
    from mpi4py import MPI

    from labkit import collectives as C

    x = np.arange(5.0)
    for fn in C.ALLREDUCES.values():
        np.testing.assert_array_equal(fn(MPI.COMM_SELF, x), x)
    np.testing.assert_array_equal(C.broadcast(MPI.COMM_SELF, x), x)
    np.testing.assert_array_equal(C.alltoall(MPI.COMM_SELF, x), x)


@pytest.mark.smoke
@pytest.mark.slow
def test_ring_exercise_check_under_mpiexec():
    out = run_mpi_cases("cases_ring_exercise.py", 3)
    assert "✔ ring allreduce on 1 to 3 ranks" in out


@pytest.mark.mpi
def test_a_failing_mpi_case_is_named_with_its_rank(tmp_path):
    """The MPI test programs report which case failed on which rank, and stop every rank there."""
    from labkit import cluster

    prog = tmp_path / "cases_demo.py"
    prog.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent / 'mpi')!r})\n"
        "from _cases import case, run_cases\n"
        "from mpi4py import MPI\n"
        "@case('fine')\n"
        "def _(): pass\n"
        "@case('rank 1 disagrees')\n"
        "def _(): assert MPI.COMM_WORLD.Get_rank() != 1, 'rank 1 got 3, expected 2'\n"
        "@case('never reached')\n"
        "def _(): print('REACHED', flush=True)\n"
        "run_cases()\n")
    res = cluster.run_mpi([str(prog)], n=2, timeout=60)
    assert res.returncode != 0 and "REACHED" not in res.stdout
    assert "FAIL case 'rank 1 disagrees' on rank 1:" in res.stdout and "rank 1 got 3, expected 2" in res.stdout
    one = cluster.run_mpi([str(prog), "-k", "fine"], n=2, timeout=60)
    assert one.returncode == 0 and "OK 2 (1 cases)" in one.stdout
