"""Parameter servers under a real mpiexec."""


import pytest
from conftest import ranks, run_failing_mpi
from mpicases import mpi_cases

pytestmark = pytest.mark.mpi


test_parameter_servers = mpi_cases("cases_param_server.py", ranks(2, 3, 4))


@pytest.mark.slow
def test_stalled_worker_times_out(tmp_path):
    err = run_failing_mpi(tmp_path, (
        "import time, numpy as np\nfrom mpi4py import MPI\nfrom labkit import mlp, param_server\n"
        "c = MPI.COMM_WORLD\n"
        "if c.rank == 2:  # this worker stalls inside its first backprop\n"
        "    real = mlp.loss_and_grads_unchecked\n"
        "    def slow(*a, **k):\n"
        "        time.sleep(30)\n"
        "        return real(*a, **k)\n"
        "    mlp.loss_and_grads_unchecked = slow\n"
        "x = np.random.rand(40, 6).astype(np.float32)\n"
        "param_server.train(c, [6, 5, 3], (x, np.arange(40) % 3), masters=1, epochs=1, batch_size=5, timeout=3)\n"),
        n=3, within=20)
    assert "TimeoutError" in err and "no message from workers [2]" in err, err[-2000:]


test_async_worker_exercise_check = mpi_cases("cases_ps_exercise.py", ranks(2, 3), marks=[pytest.mark.slow])
