"""Model and pipeline parallelism under a real mpiexec, 1 to 4 ranks."""

import pytest
from conftest import ranks, run_mpi_cases

from labkit.model_parallel import partition_layers


@pytest.mark.mpi
@pytest.mark.parametrize("n", ranks(1, 2, 3, 4))
def test_model_parallel_equals_serial(n):
    run_mpi_cases("cases_model_parallel.py", n)


def test_partition_layers_balances_work():
    assert partition_layers([784, 100, 10], 1) == [(0, 2)]
    assert partition_layers([784, 100, 10], 2) == [(0, 1), (1, 2)]
    # four equal layers and a tiny one: the tiny one rides along with a big one
    assert partition_layers([100, 100, 100, 100, 100, 2], 4) in ([(0, 1), (1, 2), (2, 3), (3, 5)],)
    with pytest.raises(ValueError, match="cannot split 2 layers into 3 stages"):
        partition_layers([784, 100, 10], 3)
