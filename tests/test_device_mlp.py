"""The device MLP (every step in labkit's kernels) against labkit.mlp, on the emulator and on a GPU when present."""

import numpy as np
import pytest
from conftest import needs_cxx

from labkit import mlp
from labkit.device import gpu_status
from labkit.kernels.device_mlp import MATMULS, DeviceMLP, train_device

pytestmark = needs_cxx

ON_GPU = [pytest.mark.gpu, pytest.mark.skipif(not gpu_status()[0], reason="no usable CUDA GPU")]
BACKENDS = ["emulator", pytest.param("cupy", marks=ON_GPU)]


def data(n=23, n_in=13, n_out=5, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, n_in)).astype(np.float32), rng.integers(0, n_out, n)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("matmul", MATMULS)
@pytest.mark.parametrize("activation,cost", [("sigmoid", "cross_entropy"), ("relu", "cross_entropy"), ("sigmoid", "quadratic")])
def test_loss_and_gradients_equal_labkit_mlp(backend, matmul, activation, cost):
    params = mlp.init_params([13, 20, 7, 5], seed=1, init="he" if activation == "relu" else "scaled")
    x, y = data()
    net = DeviceMLP(params, batch_size=32, activation=activation, cost=cost, matmul=matmul, backend=backend)
    for l2 in (0.0, 1e-2):
        for rows in (23, 4):  # a full and a partial batch through the same buffers
            value, grads = net.loss_and_grads(x[:rows], y[:rows], l2=l2)
            ref_value, ref = mlp.loss_and_grads(params, x[:rows], y[:rows], activation=activation, cost=cost, l2=l2)
            assert value == pytest.approx(ref_value, rel=1e-4)
            for (gW, gb), (rW, rb) in zip(grads, ref):
                np.testing.assert_allclose(gW, rW, rtol=1e-3, atol=1e-5)
                np.testing.assert_allclose(gb, rb, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("momentum,l2", [(0.0, 1e-3), (0.9, 0.0)])
def test_training_follows_labkit_mlp_train(backend, momentum, l2):
    x, y = data(n=100, seed=3)
    params = mlp.init_params([13, 16, 5], seed=2)
    ref = [(W.copy(), b.copy()) for W, b in params]
    net = DeviceMLP(params, batch_size=10, cost="cross_entropy", matmul="tiled", backend=backend)
    hist = train_device(net, (x, y), epochs=2, lr=0.5, momentum=momentum, l2=l2, test_data=(x, y), seed=7)
    ref_hist = mlp.train(ref, (x, y), epochs=2, batch_size=10, lr=0.5, momentum=momentum, l2=l2, cost="cross_entropy",
                         test_data=(x, y), seed=7)
    for (W, b), (rW, rb) in zip(net.numpy_params(), ref):
        np.testing.assert_allclose(W, rW, rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(b, rb, rtol=1e-3, atol=1e-4)
    # with L2 the device adds the penalty at the epoch's end weights, labkit.mlp at every batch's
    assert hist.train_loss == pytest.approx(ref_hist.train_loss, rel=1e-3 if l2 == 0 else 2e-2)
    assert hist.test_accuracy == pytest.approx(ref_hist.test_accuracy, abs=0.011)


def test_bad_settings_are_refused():
    params = mlp.init_params([4, 3], seed=0)
    with pytest.raises(ValueError, match="matmul must be one of"):
        DeviceMLP(params, batch_size=4, matmul="blas", backend="emulator")
    net = DeviceMLP(params, batch_size=4, backend="emulator")
    with pytest.raises(ValueError, match="a batch of 5 samples does not fit"):
        net.loss_and_grads(np.zeros((5, 4), np.float32), np.zeros(5, int))
    with pytest.raises(ValueError, match="x has 3 features per sample but the first layer expects 4"):
        net.loss_and_grads(np.zeros((2, 3), np.float32), np.zeros(2, int))
