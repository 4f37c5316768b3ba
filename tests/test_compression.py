
import numpy as np
import pytest
from conftest import ranks
from mpicases import mpi_cases

from labkit import compression as C


def grad(n=1000, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


def test_float16_roundtrip_and_bytes():
    g = grad()
    c = C.to_float16(g)
    assert c.nbytes == 2 * g.size
    np.testing.assert_allclose(c.decompress(), g, rtol=1e-3, atol=1e-4)
    assert c.decompress().dtype == np.float32


def test_int8_stochastic_rounding_is_unbiased_and_bounded():
    g = grad(200)
    rng = np.random.default_rng(1)
    runs = np.array([C.to_int8(g, rng).decompress() for _ in range(4000)])
    scale = np.abs(g).max() / 127
    assert np.abs(runs - g).max() <= scale * (1 + 1e-5)  # one step of the grid at most
    np.testing.assert_allclose(runs.mean(axis=0), g, atol=scale * 0.06)  # unbiased on average
    c = C.to_int8(g, rng)
    assert c.parts["values"].dtype == np.int8 and c.nbytes == g.size + 4
    assert np.array_equal(C.to_int8(np.zeros(5, np.float32)).decompress(), np.zeros(5))


def test_top_k_keeps_largest_magnitudes():
    g = grad(1000)
    c = C.top_k(g, 0.01)
    assert len(c.parts["indices"]) == 10 and c.nbytes == 10 * (4 + 4)
    kept = set(c.parts["indices"].tolist())
    assert kept == set(np.argsort(-np.abs(g))[:10].tolist())
    d = c.decompress()
    assert np.count_nonzero(d) == 10 and np.array_equal(d[list(kept)], g[list(kept)])
    assert len(C.top_k(g[:3], 0.01).parts["indices"]) == 1  # at least one
    with pytest.raises(ValueError, match="ratio must be"):
        C.top_k(g, 0)


def test_threshold():
    g = np.array([0.5, -2.0, 0.01, 3.0], dtype=np.float32)
    c = C.threshold(g, 1.0)
    assert c.parts["indices"].tolist() == [1, 3] and c.decompress().tolist() == [0, -2.0, 0, 3.0]


def test_bad_inputs():
    with pytest.raises(ValueError, match="1-D"):
        C.top_k(np.zeros((2, 2)), 0.5)
    with pytest.raises(TypeError, match="floating point"):
        C.to_float16(np.arange(3))
    with pytest.raises(ValueError, match="method must be"):
        C.CompressedAllreduce("zip")


def test_error_feedback_sends_everything_eventually():
    """With a constant gradient, what top-k sends over T steps adds up to T g minus a bounded residual."""
    g = grad(100)
    ef = C.ErrorFeedback(lambda v: C.top_k(v, 0.05))
    sent = sum(ef(g).decompress() for _ in range(200))
    np.testing.assert_allclose(sent + ef.residual, 200 * g, rtol=1e-4, atol=1e-3)
    assert np.abs(ef.residual).max() < np.abs(200 * g).max() * 0.2
    plain = sum(C.top_k(g, 0.05).decompress() for _ in range(200))
    assert np.count_nonzero(plain) == 5  # without feedback the same 5 entries, forever



def test_the_lab_10_references_and_the_table(capsys):
    g = grad(1000)
    q, scale = C.int8_nearest(g)
    assert q.dtype == np.int8 and np.abs(q).max() == 127 and np.abs(q * scale - g).max() <= scale / 2 * (1 + 1e-5)
    assert C.int8_nearest(np.zeros(4, np.float32))[1] == 1.0
    idx, values = C.top_k_indices(g, 10)
    assert set(idx.tolist()) == set(C.top_k(g, 0.01).parts["indices"].tolist()) and np.array_equal(values, g[idx])
    assert C.top_k_indices(g, 0)[0].size == 0 and C.top_k_indices(g[:5], 9)[0].size == 5
    pieces = [(np.array([0, 5]), np.array([1.0, 2.0], np.float32)), (np.array([5]), np.array([3.0], np.float32))]
    assert C.sparse_sum(pieces, 6).tolist() == [1, 0, 0, 0, 0, 5] and C.sparse_sum(pieces, 6).dtype == np.float32
    sent, values, left = C.top_k_with_feedback(g, np.zeros_like(g), 0.01)
    np.testing.assert_array_equal(C.sparse_sum([(sent, values)], g.size) + left, g)
    rows = C.table(g, {"float16": C.to_float16(g), "top-k 1 %": C.top_k(g, 0.01)})
    assert list(rows) == ["float32 (dense)", "float16", "top-k 1 %"] and rows["top-k 1 %"]["bytes"] == 80
    assert rows["float16"]["share"] == 0.5 and 0 < rows["float16"]["error"] < 1e-3 < rows["top-k 1 %"]["error"] < 1
    assert "relative error" in capsys.readouterr().out

test_compressed_allreduce_under_mpiexec = mpi_cases("cases_compression.py", ranks(1, 2, 3))
