import numpy as np
import pytest

from labkit import bench


def test_amdahl_fit_recovers_serial_fraction():
    p = np.array([1, 2, 4, 8, 16])
    for f in (0.0, 0.05, 0.3):
        assert bench.fit_amdahl(p, bench.amdahl(p, f)) == pytest.approx(f, abs=1e-12)
        np.testing.assert_allclose(bench.karp_flatt(p[1:], bench.amdahl(p[1:], f)), f, atol=1e-12)
    with pytest.raises(ValueError, match="more than one worker"):
        bench.fit_amdahl([1], [1.0])


def test_laws_at_limits():
    assert bench.amdahl(1, 0.3) == pytest.approx(1.0)
    assert bench.amdahl(1e9, 0.25) == pytest.approx(4.0, rel=1e-6)
    assert bench.gustafson(8, 0.0) == pytest.approx(8.0)
    assert bench.gustafson(8, 1.0) == pytest.approx(1.0)
    np.testing.assert_allclose(bench.efficiency(bench.speedup(8.0, [8.0, 4.0, 2.5]), [1, 2, 4]), [1, 1, 0.8])


def test_measure_and_format():
    calls = []
    t = bench.measure(lambda: calls.append(1), repeat=4, warmup=2)
    assert len(calls) == 6 and len(t.times) == 4 and t.best <= t.median and t.spread >= 0
    assert bench.format_seconds(2.5) == "2.50 s" and bench.format_seconds(0.0032) == "3.2 ms"
    assert bench.format_seconds(4.1e-5) == "41 µs"
    info = bench.machine_info()
    assert info["cpus"] >= 1 and "numpy" in info
