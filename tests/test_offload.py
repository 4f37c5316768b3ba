"""Lab 04's offloaded per-sample backprop against labkit.mlp, and the transfer breakdown."""

import numpy as np
import pytest
from conftest import needs_cxx

from labkit import bench, mlp
from labkit.device import gpu_status
from labkit.kernels.offload import MODES, PHASES, OffloadedBackprop, transfer_breakdown

ON_GPU = [pytest.mark.gpu, pytest.mark.skipif(not gpu_status()[0], reason="no usable CUDA GPU")]
BACKENDS = ["emulator", pytest.param("cupy", marks=ON_GPU)]


def batch(n=9, n_in=12, n_out=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, n_in)).astype(np.float32), rng.integers(0, n_out, n)


@needs_cxx
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("activation,cost", [("sigmoid", "quadratic"), ("relu", "cross_entropy")])
def test_offloaded_gradients_equal_the_per_sample_reference(backend, mode, activation, cost):
    params = mlp.init_params([12, 17, 6, 4], seed=2, init="he" if activation == "relu" else "scaled")
    x, y = batch()
    fn = OffloadedBackprop(mode, backend=backend)
    for l2 in (0.0, 1e-2):
        value, grads = fn(params, x, y, activation=activation, cost=cost, l2=l2)
        ref_value, ref = mlp.loss_and_grads_per_sample(params, x, y, activation=activation, cost=cost, l2=l2)
        assert value == pytest.approx(ref_value, rel=1e-5)
        for (gW, gb), (rW, rb) in zip(grads, ref):
            assert gW.dtype == np.float32
            np.testing.assert_allclose(gW, rW, rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(gb, rb, rtol=1e-4, atol=1e-6)


@needs_cxx
def test_resident_mode_trains_like_the_host_loop():
    x, y = batch(n=40)
    runs = {}
    for name, method in (("host", "per_sample"), ("resident", OffloadedBackprop("resident", backend="emulator"))):
        p = mlp.init_params([12, 9, 4], seed=0)
        mlp.train(p, (x, y), epochs=2, batch_size=8, lr=0.5, method=method, progress=False)
        runs[name] = p
    for (W, b), (W2, b2) in zip(runs["host"], runs["resident"]):
        np.testing.assert_allclose(W, W2, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(b, b2, rtol=1e-4, atol=1e-5)


def test_bad_mode_and_float64_weights_are_named():
    with pytest.raises(ValueError, match="mode must be one of"):
        OffloadedBackprop("teleport")
    params = mlp.init_params([12, 5, 4], dtype=np.float64)
    x, y = batch()
    with pytest.raises(TypeError, match="layer 0.*float32"):
        OffloadedBackprop("copy", backend="emulator")(params, x, y)


@needs_cxx
@pytest.mark.parametrize("backend", BACKENDS)
def test_transfer_breakdown_times_every_phase(backend):
    t = transfer_breakdown(50, 70, repeat=2, backend=backend)
    assert set(t) == {*PHASES, "host"}
    assert all(v >= 0 for v in t.values()) and t["kernel"] > 0
    with pytest.raises(ValueError, match=">= 1"):
        transfer_breakdown(0, 5, backend=backend)


def test_crossover_interpolates_in_log_x():
    assert bench.crossover([10, 100, 1000], [0.1, 0.5, 2.0]) == pytest.approx(10 ** (2 + 1 / 3))
    assert bench.crossover([10, 100], [1.5, 3]) == 10
    assert bench.crossover([10, 100], [0.2, 0.9]) is None
    assert bench.crossover([0, 2], [0.0, 2.0]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="increase"):
        bench.crossover([10, 5], [1, 2])
    with pytest.raises(ValueError, match="same length"):
        bench.crossover([1, 2], [1])


# -- section 7: pinned memory and two streams ------------------------------------------------------

STREAM_BACKENDS = [pytest.param("emulator", id="emulator"),
                   pytest.param("cupy", id="cuda", marks=[pytest.mark.gpu,
                                                          pytest.mark.skipif(not gpu_status()[0], reason="no usable CUDA GPU")])]


@pytest.mark.parametrize("backend", STREAM_BACKENDS)
def test_pinned_and_pageable_copies_are_both_measured(backend):
    from labkit.kernels.streams import pinned_vs_pageable

    bw = pinned_vs_pageable(4 << 20, repeat=2, backend=backend)
    assert bw["pageable"] > 0 and bw["pinned"] > 0 and bw["bytes"] == 4 << 20
    assert bw["device"] == (backend == "cupy")


@needs_cxx
@pytest.mark.parametrize("backend", STREAM_BACKENDS)
def test_batches_on_two_streams_give_the_products_and_say_whether_they_overlapped(backend):
    """The function checks the last batch's product against NumPy itself (a buffer reused too early would fail it);
    on the emulator the overlap is said not to be shown. Each batch's copy and kernel seconds come with it, for
    lab 04's model of the two runs."""
    from labkit.kernels.streams import stream_overlap

    r = stream_overlap(batches=3, rows=64, n_in=96, width=32, repeat=1, backend=backend)
    assert r["one stream"] > 0 and r["two streams"] > 0 and r["gain"] > 0 and r["batches"] == 3
    for phase in ("copy", "kernel"):  # each batch's copy and kernel, timed apart in the one-stream runs
        assert r[phase].shape == (3,) and (r[phase] > 0).all()
    assert r["copy"].sum() + r["kernel"].sum() <= 1.5 * r["one stream"], "the phases are parts of the one-stream time"
    assert r["overlap_shown"] == r["device"] == (backend == "cupy")
