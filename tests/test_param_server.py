"""Parameter servers under a real mpiexec."""

import time
from pathlib import Path

import pytest

from labkit import cluster

pytestmark = pytest.mark.mpi
HERE = Path(__file__).parent


@pytest.mark.parametrize("n", [2, 3, 4])
def test_parameter_servers(n):
    res = cluster.run_mpi([str(HERE / "mpi" / "check_param_server.py")], n=n, timeout=300)
    assert res.returncode == 0 and f"OK {n}" in res.stdout, res.stderr[-4000:]


def test_stalled_worker_times_out(tmp_path):
    script = tmp_path / "stall.py"
    script.write_text(
        "import time, numpy as np\nfrom mpi4py import MPI\nfrom labkit import mlp, param_server\n"
        "c = MPI.COMM_WORLD\n"
        "if c.rank == 2:  # this worker stalls inside its first backprop\n"
        "    real = mlp._loss_and_grads\n"
        "    def slow(*a, **k):\n"
        "        time.sleep(30)\n"
        "        return real(*a, **k)\n"
        "    mlp._loss_and_grads = slow\n"
        "x = np.random.rand(40, 6).astype(np.float32)\n"
        "param_server.train(c, [6, 5, 3], (x, np.arange(40) % 3), masters=1, epochs=1, batch_size=5, timeout=3)\n")
    t0 = time.monotonic()
    res = cluster.run_mpi([str(script)], n=3, timeout=60)
    assert res.returncode != 0
    assert "TimeoutError" in res.stderr and "no message from workers [2]" in res.stderr, res.stderr[-2000:]
    assert time.monotonic() - t0 < 20
