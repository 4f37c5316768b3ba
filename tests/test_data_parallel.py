"""Synchronous data parallelism under a real mpiexec, 1 to 4 ranks."""

from pathlib import Path

import numpy as np
import pytest

from labkit import cluster, mlp
from labkit.data_parallel import DataParallel, flatten, unflatten

HERE = Path(__file__).parent


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_data_parallel_equals_serial(n):
    res = cluster.run_mpi([str(HERE / "mpi" / "check_data_parallel.py")], n=n, timeout=300)
    assert res.returncode == 0 and f"OK {n}" in res.stdout, res.stderr[-4000:]


def test_flatten_roundtrip_and_extra():
    g = mlp.init_params([5, 4, 3], dtype=np.float64)
    v = flatten(g, extra=(7.0,))
    assert v.shape == (5 * 4 + 4 + 4 * 3 + 3 + 1,) and v[-1] == 7.0
    for (a, b), (c, d) in zip(unflatten(v[:-1], g), g):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, d)


def test_bad_allreduce_names():
    from mpi4py import MPI

    with pytest.raises(ValueError, match="allreduce must be one of"):
        DataParallel(MPI.COMM_SELF, allreduce="tree")
    with pytest.raises(ValueError, match="needs CuPy"):
        DataParallel(MPI.COMM_SELF, allreduce="nccl")
