"""Collectives under a real mpiexec: every algorithm against the MPI library, with 1 to 6 ranks."""


from pathlib import Path

import numpy as np
import pytest
from conftest import ranks, run_failing_mpi
from mpicases import mpi_cases

pytestmark = pytest.mark.mpi


test_collectives_match_mpi = mpi_cases("cases_collectives.py", ranks(1, 2, 3, 4, 5, 6))


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


test_ring_exercise_check_under_mpiexec = mpi_cases("cases_ring_exercise.py", ranks(3, smoke=3), marks=[pytest.mark.slow])


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


def test_under_pytest_each_case_has_its_verdict_and_a_hung_case_is_named(tmp_path):
    """In a job run for pytest (tests/mpicases.py), a failed case does not stop the cases after it; what a case must
    print is checked; the case a job ended in says how the job ended, and the cases after it say they did not run."""
    from mpicases import run_job

    prog = tmp_path / "cases_demo.py"
    prog.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent / 'mpi')!r})\n"
        "from _cases import case, on_ranks, run_cases\n"
        "from mpi4py import MPI\n"
        "c = MPI.COMM_WORLD\n"
        "case('fine')(lambda: None)\n"
        "@case('rank 1 disagrees')\n"
        "def _(): assert c.Get_rank() != 1, 'rank 1 got 3, expected 2'\n"
        "case('prints its line', prints='on {p} ranks')(lambda: print('on 2 ranks'))\n"
        "case('forgets its line', prints='on {p} ranks')(lambda: print('on no ranks'))\n"
        "with on_ranks(3):\n"
        "    case('three ranks or more')(lambda: None)\n"
        "@case('rank 0 waits for a message never sent')\n"
        "def _():\n"
        "    if c.Get_rank() == 0:\n"
        "        c.recv(source=1)\n"
        "case('never reached')(lambda: None)\n"
        "run_cases()\n")
    names = ["fine", "rank 1 disagrees", "prints its line", "forgets its line", "rank 0 waits for a message never sent",
             "never reached"]
    got = run_job(str(prog), 2, names, timeout=6)
    assert got["fine"] is None and got["prints its line"] is None
    assert got["rank 1 disagrees"].startswith("case 'rank 1 disagrees' failed on rank 1:")
    assert "rank 1 got 3, expected 2" in got["rank 1 disagrees"]
    assert "rank 0 should have printed 'on 2 ranks'" in got["forgets its line"]
    assert "on 2 ranks passed its 6 s limit and was ended in this case" in got["rank 0 waits for a message never sent"]
    assert got["never reached"].startswith("not run: ") and "in case 'rank 0 waits for a message never sent'" in got[
        "never reached"]


def test_a_case_for_more_ranks_is_a_test_only_where_it_runs():
    from mpicases import listing, mpi_cases

    chain = next(c for c in listing()["cases_collectives_exercise.py"] if c["name"] == "tree_broadcast: a chain")
    assert (chain["least"], chain["most"]) == (4, None)
    test = mpi_cases("cases_collectives_exercise.py", [2, 4])
    ids = next(m for m in test.pytestmark if m.name == "parametrize").kwargs.get("ids") or [
        p.id for p in next(m for m in test.pytestmark if m.name == "parametrize").args[1]]
    assert "4-tree_broadcast: a chain" in ids and "2-tree_broadcast: a chain" not in ids
    assert "2-tree_broadcast: not written" in ids
