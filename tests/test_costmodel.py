import math

import numpy as np
import pytest

from labkit import cluster, costmodel
from labkit.costmodel import AlphaBeta


def test_fit_recovers_alpha_beta():
    true = AlphaBeta(alpha=2e-6, beta=1 / 5e9)
    m = np.logspace(0, 8, 20)
    fitted = costmodel.fit(m, true.time(m) * (1 + 0.01 * np.sin(np.arange(20))))  # 1 % wobble
    assert fitted.alpha == pytest.approx(2e-6, rel=0.05)
    assert fitted.bandwidth == pytest.approx(5e9, rel=0.05)
    assert fitted.half_performance_size() == pytest.approx(2e-6 * 5e9, rel=0.1)
    assert "µs" in str(fitted) and "GB/s" in str(fitted)
    with pytest.raises(ValueError, match="at least two"):
        costmodel.fit([1], [1e-6])
    with pytest.raises(ValueError, match="positive"):
        costmodel.fit([1, 2], [1e-6, 0])


def test_predictions_follow_the_formulas():
    ab = AlphaBeta(1e-6, 1e-9)
    n = 8e6
    assert costmodel.predict("ring", ab, 4, n)[0] == pytest.approx(6 * (1e-6 + 2e6 * 1e-9))
    assert costmodel.predict("naive", ab, 4, n)[0] == pytest.approx(3 * (1e-6 + n * 1e-9))
    assert costmodel.predict("recursive_doubling", ab, 4, n)[0] == pytest.approx(2 * (1e-6 + n * 1e-9))
    assert costmodel.predict("reduce_broadcast", ab, 5, n)[0] == pytest.approx(6 * (1e-6 + n * 1e-9))
    assert costmodel.predict("ring", ab, 1, n)[0] == 0
    with pytest.raises(ValueError, match="no prediction"):
        costmodel.predict("magic", ab, 4, n)


def test_crossover_ring_vs_recursive_doubling():
    ab = AlphaBeta(1e-5, 1e-9)
    for p in (4, 8, 16):
        x = costmodel.crossover(ab, p)
        assert costmodel.predict("ring", ab, p, x * 1.01)[0] < costmodel.predict("recursive_doubling", ab, p, x * 1.01)[0]
        assert costmodel.predict("ring", ab, p, x * 0.99)[0] > costmodel.predict("recursive_doubling", ab, p, x * 0.99)[0]
    assert costmodel.crossover(ab, 2) == math.inf or costmodel.crossover(ab, 2) >= 0


@pytest.mark.mpi
def test_pingpong_and_timing_under_mpiexec(tmp_path):
    script = tmp_path / "pp.py"
    script.write_text(
        "import numpy as np\nfrom mpi4py import MPI\nfrom labkit import costmodel, collectives\n"
        "c = MPI.COMM_WORLD\n"
        "t = costmodel.pingpong(c, [8, 8000, 800000], repeat=5)\n"
        "tc = costmodel.time_collective(c, collectives.ring_allreduce, np.ones(1000), repeat=3)\n"
        "assert c.allgather(tc) == [tc] * c.size\n"
        "if c.rank == 0:\n"
        "    assert (t > 0).all() and t[2] > t[0], t\n"
        "    ab = costmodel.fit([8, 8000, 800000], t)\n"
        "    print('OK', ab, flush=True)\n"
        "else:\n"
        "    assert t is None\n")
    res = cluster.run_mpi([str(script)], n=3, timeout=120)
    assert res.returncode == 0 and "OK alpha" in res.stdout, res.stderr[-3000:]
