import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labkit import mlp

COMBOS = [(a, c) for a in mlp.ACTIVATIONS for c in mlp.COSTS]


def small_problem(sizes=(6, 5, 4), batch=7, seed=0):
    rng = np.random.default_rng(seed)
    params = mlp.init_params(list(sizes), seed=seed, dtype=np.float64)
    x = rng.standard_normal((batch, sizes[0]))
    y = rng.integers(0, sizes[-1], batch)
    return params, x, y


@pytest.mark.parametrize("activation,cost", COMBOS)
@pytest.mark.parametrize("l2", [0.0, 0.3])
def test_gradient_matches_finite_differences(activation, cost, l2):
    params, x, y = small_problem((6, 5, 3, 4))
    if activation == "relu":
        x = x + 0.01  # keep pre-activations away from the kink at 0
    grads = mlp.backprop(params, x, y, activation, cost, l2)
    eps = 1e-6
    for (W, b), (gW, gb) in zip(params, grads):
        for arr, g in ((W, gW), (b, gb)):
            num = np.zeros_like(arr)
            for idx in np.ndindex(arr.shape):
                old = arr[idx]
                arr[idx] = old + eps
                up = mlp.loss(params, x, y, activation, cost, l2)
                arr[idx] = old - eps
                down = mlp.loss(params, x, y, activation, cost, l2)
                arr[idx] = old
                num[idx] = (up - down) / (2 * eps)
            np.testing.assert_allclose(g, num, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("activation,cost", COMBOS)
@pytest.mark.parametrize("batch", [1, 10])
def test_vectorised_equals_per_sample(activation, cost, batch):
    params, x, y = small_problem((12, 9, 5), batch=batch, seed=batch)
    lv, gv = mlp.loss_and_grads(params, x, y, activation, cost, l2=0.1)
    ls, gs = mlp.loss_and_grads_per_sample(params, x, y, activation, cost, l2=0.1)
    assert lv == pytest.approx(ls, rel=1e-6)
    for (a, b), (c, d) in zip(gv, gs):
        assert a.shape == c.shape and b.shape == d.shape
        np.testing.assert_allclose(a, c, rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(b, d, rtol=1e-6, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 8), min_size=2, max_size=4),
    batch=st.integers(1, 9),
    combo=st.sampled_from(COMBOS),
    seed=st.integers(0, 10_000),
)
def test_vectorised_equals_per_sample_property(sizes, batch, combo, seed):
    params, x, y = small_problem(sizes, batch, seed)
    gv = mlp.backprop(params, x, y, *combo)
    gs = mlp.backprop_per_sample(params, x, y, *combo)
    for (a, b), (c, d) in zip(gv, gs):
        np.testing.assert_allclose(a, c, rtol=1e-6, atol=1e-12)
        np.testing.assert_allclose(b, d, rtol=1e-6, atol=1e-12)


def test_one_hot_and_labels_give_same_gradients():
    params, x, y = small_problem()
    Y = np.eye(4)[y]
    for (a, _), (b, _) in zip(mlp.backprop(params, x, y), mlp.backprop(params, x, Y)):
        np.testing.assert_array_equal(a, b)


def test_float32_close_to_float64():
    params, x, y = small_problem((20, 16, 10), batch=32)
    p32 = [(W.astype(np.float32), b.astype(np.float32)) for W, b in params]
    g64 = mlp.backprop(params, x, y, "relu", "cross_entropy")
    g32 = mlp.backprop(p32, x.astype(np.float32), y, "relu", "cross_entropy")
    for (a, _), (b, _) in zip(g64, g32):
        assert b.dtype == np.float32
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    "make_bad,match",
    [
        (lambda p, x, y: (p, x[:, :5], y), "x has 5 features per sample but the first layer expects 6"),
        (lambda p, x, y: (p, x[0], y), "x must be 2-D"),
        (lambda p, x, y: (p, x, y[:3]), "x has 7 samples but y has 3"),
        (lambda p, x, y: (p, x, y + 10), r"labels must lie in \[0, 4\)"),
        (lambda p, x, y: (p, x, y.astype(float)), "labels y must be integers"),
        (lambda p, x, y: (p, x, np.zeros((7, 3))), "one-hot y has 3 columns but the network has 4 outputs"),
        (lambda p, x, y: ([p[0], (np.zeros((4, 3)), np.zeros(4))], x, y), "layer 1 expects 3 inputs but layer 0 produces 5"),
        (lambda p, x, y: ([(p[0][0], np.zeros(2)), p[1]], x, y), r"layer 0: b must have shape \(5,\)"),
        (lambda p, x, y: ([], x, y), "non-empty list"),
        (lambda p, x, y: (p, x[:0], y[:0]), "no samples"),
    ],
)
@pytest.mark.parametrize("fn", [mlp.backprop, mlp.backprop_per_sample])
def test_bad_input_gets_clear_error(make_bad, match, fn):
    args = make_bad(*small_problem())
    with pytest.raises(ValueError, match=match):
        fn(*args)


def test_bad_options():
    params, x, y = small_problem()
    with pytest.raises(ValueError, match="activation must be one of"):
        mlp.backprop(params, x, y, activation="tanh")
    with pytest.raises(ValueError, match="cost must be one of"):
        mlp.backprop(params, x, y, cost="hinge")
    with pytest.raises(ValueError, match="at least two"):
        mlp.init_params([784])
    with pytest.raises(ValueError, match="learning rate must be positive"):
        mlp.SGD(0)
    with pytest.raises(ValueError, match="method must be"):
        mlp.train(params, (x, y), method="magic")


def test_sgd_momentum_matches_hand_computation():
    W, b = np.ones((2, 2)), np.zeros(2)
    g = [(np.full((2, 2), 0.5), np.ones(2))]
    opt = mlp.SGD(lr=0.1, momentum=0.9)
    opt.step([(W, b)], g)
    opt.step([(W, b)], g)
    # v1 = -0.05, v2 = 0.9 * -0.05 - 0.05 = -0.095; W = 1 - 0.145
    np.testing.assert_allclose(W, 1 - 0.145)
    np.testing.assert_allclose(b, -(0.1 + 0.19))


def test_exploding_loss_stops_with_learning_rate_hint(digits):
    (x, y), _ = digits
    params = mlp.init_params([784, 30, 10], init="he")
    with pytest.raises(mlp.DivergenceError, match=r"(?s)exploded.*learning rate is probably too large: try lr=3"):
        mlp.train(params, (x[:2000], y[:2000]), epochs=3, batch_size=10, lr=30, momentum=0.9, activation="relu")


def test_nan_loss_stops_with_hint(digits):
    (x, y), _ = digits
    params = mlp.init_params([784, 30, 10])
    params[0][0][0, 0] = np.inf  # inf * 0-valued pixels gives NaN, as an overflow in training would
    with pytest.raises(mlp.DivergenceError, match=r"(?s)became nan in epoch 1.*try lr=0.3"):
        mlp.train(params, (x[:500], y[:500]), epochs=1, batch_size=10, lr=3.0)


def test_training_learns_and_records_history(digits):
    (x, y), (xt, yt) = digits
    params = mlp.init_params([784, 30, 10])
    before = mlp.accuracy(params, xt, yt)
    h = mlp.train(params, (x[:3000], y[:3000]), epochs=3, batch_size=10, lr=3.0, test_data=(xt, yt))
    assert h.epoch == [1, 2, 3] and len(h.train_loss) == 3 and len(h.epoch_time) == 3
    assert h.train_loss[-1] < h.train_loss[0]
    assert h.final_accuracy > 0.8 > before
    assert "3 epochs" in h.summary()


def test_training_methods_agree(digits):
    """The per-sample and vectorised loops follow the same trajectory from the same seed."""
    (x, y), _ = digits
    runs = []
    for method in ("per_sample", "vectorised"):
        params = mlp.init_params([784, 16, 10], dtype=np.float64)
        mlp.train(params, (x[:200], y[:200]), epochs=2, batch_size=10, lr=0.5, momentum=0.5, method=method)
        runs.append(params)
    for (a, _), (b, _) in zip(*runs):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


def test_misclassified(digits):
    _, (xt, yt) = digits
    params = mlp.init_params([784, 10, 10])
    wrong, pred = mlp.misclassified(params, xt, yt)
    assert len(wrong) == round((1 - mlp.accuracy(params, xt, yt)) * len(yt))
    assert (pred != yt[wrong]).all()


@pytest.mark.gpu
def test_runs_on_cupy_when_available():
    from labkit.device import gpu_status

    ok, why = gpu_status()
    if not ok:
        pytest.skip(f"no usable GPU: {why}")
    import cupy as cp

    params, x, y = small_problem((30, 20, 10), batch=16)
    gpu = [(cp.asarray(W), cp.asarray(b)) for W, b in params]
    got = mlp.backprop(gpu, cp.asarray(x), cp.asarray(y), "relu", "cross_entropy")
    want = mlp.backprop(params, x, y, "relu", "cross_entropy")
    for (a, _), (b, _) in zip(got, want):
        np.testing.assert_allclose(cp.asnumpy(a), b, rtol=1e-6, atol=1e-9)


def test_on_layer_is_called_as_each_layers_gradients_are_final_last_layer_first():
    params = mlp.init_params([6, 5, 4, 3], seed=2, dtype=np.float64)
    x = np.random.default_rng(0).random((7, 6))
    Y = mlp.targets(np.arange(7) % 3, 3, np.float64)
    expected = mlp.loss_and_grads_unchecked(params, x, Y, "relu", "cross_entropy", 0.0)[1]
    seen, out = [], mlp.zeros_like(params)

    def on_layer(i):  # layer i is final here: it must already equal the reference, and the layers above too
        seen.append(i)
        for j in range(i, len(params)):
            np.testing.assert_array_equal(out[j][0], expected[j][0])

    mlp.loss_and_grads_unchecked(params, x, Y, "relu", "cross_entropy", 0.0, out=out, on_layer=on_layer)
    assert seen == [2, 1, 0]
