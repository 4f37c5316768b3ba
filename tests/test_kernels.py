"""Every kernel launcher against its NumPy reference, on the emulator (fast and checked) and on a GPU when there is one."""

import numpy as np
import pytest
from conftest import needs_cxx

from labkit import kernels as K
from labkit.device import gpu_status
from labkit.kernels import reference as R
from labkit.kernels.matmul import VARIANTS

pytestmark = needs_cxx

GPU = gpu_status()[0]
BACKENDS = [pytest.param("emulator", id="emulator"),
            pytest.param("emulator-checked", id="checked"),
            pytest.param("cupy", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not GPU, reason="no usable CUDA GPU")])]


@pytest.fixture(params=BACKENDS)
def dev(request, monkeypatch):
    """(to_device, to_host) for the back end under test; the launchers pick it up from the environment."""
    name = request.param
    monkeypatch.setenv("LABKIT_CHECKED", "1" if name == "emulator-checked" else "0")
    if name == "cupy":
        import cupy

        monkeypatch.setenv("LABKIT_DEVICE", "gpu")
        return cupy.asarray, cupy.asnumpy
    monkeypatch.setenv("LABKIT_DEVICE", "cpu")
    return (lambda a: a.copy()), np.asarray


def rnd(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


SIZES = [(1, 1, 1), (5, 3, 7), (16, 16, 16), (17, 33, 19), (130, 129, 9), (64, 200, 128)]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_matmul(dev, variant, ta, tb):
    to, host = dev
    for M, N, Kd in SIZES:
        a = rnd(*((Kd, M) if ta else (M, Kd)))
        b = rnd(*((N, Kd) if tb else (Kd, N)), seed=1)
        got = host(K.matmul(to(a), to(b), variant=variant, trans_a=bool(ta), trans_b=bool(tb)))
        np.testing.assert_allclose(got, R.matmul(a, b, trans_a=bool(ta), trans_b=bool(tb)), rtol=1e-4, atol=1e-4,
                                   err_msg=f"{variant} {M}x{N}x{Kd}")


@pytest.mark.smoke
def test_matmul_writes_into_out(dev):
    to, host = dev
    a, b = rnd(20, 30), rnd(30, 10)
    out = to(np.full((20, 10), np.nan, np.float32))
    assert K.matmul(to(a), to(b), out, variant="tiled") is out
    np.testing.assert_allclose(host(out), a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n_out,n_in", [(1, 1), (10, 30), (33, 300)])
def test_the_two_backprop_products(dev, n_out, n_in):
    to, host = dev
    W, d, a = rnd(n_out, n_in), rnd(n_out, seed=1), rnd(n_in, seed=2)
    np.testing.assert_allclose(host(K.wt_delta(to(W), to(d))), R.wt_delta(W, d), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(host(K.outer(to(d), to(a))), R.outer(d, a), rtol=1e-6)
    acc = rnd(n_out, n_in, seed=3)
    np.testing.assert_allclose(host(K.outer(to(d), to(a), to(acc), beta=1.0)), R.outer(d, a, acc.copy(), beta=1.0), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("activation", ["identity", "sigmoid", "relu"])
def test_bias_activation_forward_and_backward(dev, activation):
    to, host = dev
    for rows, cols in [(1, 1), (7, 10), (300, 33)]:
        z, b = rnd(rows, cols), rnd(cols, seed=1)
        np.testing.assert_allclose(host(K.bias_act_forward(to(z), to(b), activation=activation)),
                                   R.bias_act_forward(z, b, activation=activation), rtol=1e-5, atol=1e-6)
        a = R.bias_act_forward(z, b, activation=activation)
        g = rnd(rows, cols, seed=2)
        np.testing.assert_allclose(host(K.act_backward(to(g), to(a), activation=activation)),
                                   R.act_backward(g, a, activation=activation), rtol=1e-5, atol=1e-6)
    zd = to(z)
    out = K.bias_act_forward(zd, to(b), zd, activation=activation)  # in place
    np.testing.assert_allclose(host(out), R.bias_act_forward(z, b, activation=activation), rtol=1e-5, atol=1e-6)


@pytest.mark.smoke
def test_col_sum(dev):
    to, host = dev
    for shape in [(1, 1), (256, 10), (3, 1000)]:
        x = rnd(*shape)
        np.testing.assert_allclose(host(K.col_sum(to(x))), R.col_sum(x), rtol=1e-4, atol=1e-4)


@pytest.mark.smoke
@pytest.mark.parametrize("momentum,l2", [(0.0, 0.0), (0.9, 0.0), (0.5, 1e-3)])
def test_sgd_momentum_matches_labkit_sgd(dev, momentum, l2):
    to, host = dev
    from labkit import mlp

    w, g, v = rnd(1001), rnd(1001, seed=1), np.zeros(1001, np.float32)
    wd, gd, vd = to(w), to(g), to(v)
    ref = [(w.reshape(7, 143).copy(), np.zeros(1, np.float32))]
    opt = mlp.SGD(lr=0.1, momentum=momentum) if momentum else mlp.SGD(lr=0.1)
    for _ in range(3):
        K.sgd_momentum(wd, gd, vd, lr=0.1, momentum=momentum, l2=l2)
        gw = g.reshape(7, 143) + l2 * ref[0][0]
        opt.step(ref, [(gw, np.zeros(1, np.float32))])
    np.testing.assert_allclose(host(wd), ref[0][0].ravel(), rtol=1e-5, atol=1e-6)


@pytest.mark.smoke
def test_softmax_cross_entropy(dev):
    to, host = dev
    for rows, cols in [(1, 2), (70, 10), (513, 10)]:
        z = rnd(rows, cols) * 5
        y = np.random.default_rng(rows).integers(0, cols, rows).astype(np.int32)
        p, loss = K.softmax_xent_forward(to(z), to(y))
        rp, rl = R.softmax_xent_forward(z, y)
        np.testing.assert_allclose(host(p), rp, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(host(loss), rl, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(host(K.softmax_xent_backward(p, to(y), scale=1 / rows)),
                                   R.softmax_xent_backward(rp, y, scale=1 / rows), rtol=1e-4, atol=1e-6)


def test_softmax_bad_label_gives_nan_not_a_crash(dev):
    to, host = dev
    _, loss = K.softmax_xent_forward(to(rnd(3, 4)), to(np.array([0, 7, -1], np.int32)))
    loss = host(loss)
    assert np.isfinite(loss[0]) and np.isnan(loss[1:]).all()


@pytest.mark.smoke
@pytest.mark.parametrize("n", [1, 255, 256, 257, 100_003])
def test_reductions_with_atomics(dev, n):
    to, host = dev
    x, y = rnd(n), rnd(n, seed=1)
    assert K.sum_reduce(to(x)) == pytest.approx(R.sum_reduce(x), rel=1e-4, abs=1e-3)
    assert K.sse_reduce(to(x), to(y)) == pytest.approx(R.sse_reduce(x, y), rel=1e-4)
    rows = max(1, n // 10)
    s, lab = rnd(rows, 10), np.random.default_rng(n).integers(0, 10, rows).astype(np.int32)
    assert K.accuracy_count(to(s), to(lab)) == R.accuracy_count(s, lab)


@pytest.mark.smoke
@pytest.mark.parametrize("shape", [(2, 1, 8, 8, 3, 3, 3), (3, 2, 9, 11, 4, 3, 3), (1, 3, 5, 6, 2, 5, 1)])
@pytest.mark.parametrize("pad", [0, 1, 2])
def test_conv2d_relu(dev, shape, pad):
    to, host = dev
    N, C, H, W, Kc, Rr, S = shape
    if H + 2 * pad - Rr + 1 < 1 or W + 2 * pad - S + 1 < 1:
        pytest.skip("filter larger than the padded input")
    x, w, b = rnd(N, C, H, W), rnd(Kc, C, Rr, S, seed=1), rnd(Kc, seed=2) * 0.1
    y = K.conv2d_relu_forward(to(x), to(w), to(b), pad=pad)
    ry = R.conv2d_relu_forward(x, w, b, pad=pad)
    np.testing.assert_allclose(host(y), ry, rtol=1e-4, atol=1e-5)
    dy = rnd(*ry.shape, seed=3)
    for got, want, name in zip(K.conv2d_relu_backward(to(dy), y, to(x), to(w), pad=pad),
                               R.conv2d_relu_backward(dy, ry, x, w, pad=pad), ("dx", "dw", "db")):
        np.testing.assert_allclose(host(got), want, rtol=1e-4, atol=1e-4, err_msg=name)


def test_conv_reference_is_the_convolution_and_its_gradient():
    """The reference itself: against a plain loop, and its gradients against finite differences."""
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s) for s in [(2, 2, 5, 6), (3, 2, 3, 3), (3,)])
    pad = 1
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    y = np.zeros((2, 3, 5, 6))
    for n in range(2):
        for k in range(3):
            for i in range(5):
                for j in range(6):
                    y[n, k, i, j] = max(0.0, (xp[n, :, i:i + 3, j:j + 3] * w[k]).sum() + b[k])
    np.testing.assert_allclose(R.conv2d_relu_forward(x, w, b, pad=pad), y, rtol=1e-5, atol=1e-6)
    dy = rng.standard_normal(y.shape)
    dx, dw, db = R.conv2d_relu_backward(dy, y, x, w, pad=pad)
    f = lambda x_, w_, b_: (np.maximum(0, np.einsum("ncijrs,kcrs->nkij", np.lib.stride_tricks.sliding_window_view(  # noqa: E731
        np.pad(x_, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3)), w_) + b_[None, :, None, None]) * dy).sum()
    eps = 1e-6
    for arr, grad, idx in [(x, dx, (1, 0, 2, 3)), (w, dw, (2, 1, 0, 2)), (b, db, (1,))]:
        plus, minus = arr.copy(), arr.copy()
        plus[idx] += eps
        minus[idx] -= eps
        args_p = [plus if arr is v else v for v in (x, w, b)]
        args_m = [minus if arr is v else v for v in (x, w, b)]
        assert grad[idx] == pytest.approx((f(*args_p) - f(*args_m)) / (2 * eps), rel=1e-4, abs=1e-6)


# -- launchers refuse bad input before they launch ------------------------------------------------


@pytest.fixture
def emu(monkeypatch):
    monkeypatch.setenv("LABKIT_DEVICE", "cpu")


def test_launcher_rejects_wrong_dtype(emu):
    with pytest.raises(TypeError, match=r"a has dtype float64; the kernel takes float32"):
        K.matmul(np.ones((2, 2)), np.ones((2, 2), np.float32))
    with pytest.raises(TypeError, match="labels has dtype int64"):
        K.softmax_xent_forward(rnd(3, 4), np.zeros(3, np.int64))


def test_launcher_rejects_non_contiguous(emu):
    a = rnd(4, 6)
    with pytest.raises(ValueError, match="b is not C-contiguous"):
        K.matmul(a, np.asfortranarray(rnd(6, 4)))
    with pytest.raises(ValueError, match="z is not C-contiguous"):
        K.bias_act_forward(a[:, ::2], rnd(3))


def test_launcher_rejects_wrong_shapes(emu):
    with pytest.raises(ValueError, match=r"inner dimensions differ: op\(a\) is \(2, 3\) and op\(b\) is \(4, 5\)"):
        K.matmul(rnd(2, 3), rnd(4, 5))
    with pytest.raises(ValueError, match="a must be 2-D"):
        K.matmul(rnd(6), rnd(6, 2))
    with pytest.raises(ValueError, match=r"delta must have shape \(3,\)"):
        K.wt_delta(rnd(3, 5), rnd(5))
    with pytest.raises(ValueError, match=r"out must have shape \(2, 5\)"):
        K.matmul(rnd(2, 3), rnd(3, 5), np.zeros((5, 2), np.float32))
    with pytest.raises(ValueError, match="w has 2 input channels but x has 3"):
        K.conv2d_relu_forward(rnd(1, 3, 5, 5), rnd(4, 2, 3, 3), rnd(4))
    with pytest.raises(ValueError, match="x is empty"):
        K.col_sum(np.zeros((0, 3), np.float32))


def test_launcher_rejects_bad_options(emu):
    with pytest.raises(ValueError, match="variant must be one of"):
        K.matmul(rnd(2, 2), rnd(2, 2), variant="fast")
    with pytest.raises(ValueError, match="activation must be one of"):
        K.bias_act_forward(rnd(2, 2), rnd(2), activation="tanh")
    with pytest.raises(ValueError, match="out is read-only"):
        out = np.zeros((2, 2), np.float32)
        out.flags.writeable = False
        K.matmul(rnd(2, 2), rnd(2, 2), out)


def test_launcher_rejects_arrays_on_the_wrong_device():
    from labkit.kernels._launch import require

    with pytest.raises(TypeError, match="a is a NumPy array, but the kernels run on the GPU"):
        require(rnd(2), "a", which="cupy")
    with pytest.raises(TypeError, match="a must be a NumPy array, got list"):
        require([1.0], "a", which="emulator")


def test_backend_names(monkeypatch):
    monkeypatch.setenv("LABKIT_DEVICE", "cpu")
    assert K.backend() == "emulator"
    monkeypatch.setenv("LABKIT_DEVICE", "auto")
    assert K.backend() == ("cupy" if GPU else "emulator")


def test_kernel_source_shows_one_kernel_with_its_comment():
    text = K.kernel_source("layers", "outer")
    assert text.startswith("// out = beta * out + delta a^T") and text.rstrip().endswith("}")
    assert "wt_delta" not in text and text.count("__global__") == 1
    src = 'extern "C" __global__ void a(float* x) { if (x) { x[0] = 1; } }\n// b\n__global__ void b(int n) {}\n'
    assert K.kernel_source(src, "a") == 'extern "C" __global__ void a(float* x) { if (x) { x[0] = 1; } }'
    assert K.kernel_source(src, "b") == "// b\n__global__ void b(int n) {}"
    with pytest.raises(KeyError, match="no kernel 'c'.*'a', 'b'"):
        K.kernel_source(src, "c")


@pytest.mark.parametrize("pad", [0, 1, 2])
def test_im2col_library_convolution_equals_the_reference(pad):
    from labkit.kernels.conv import im2col_conv2d_relu, library_convolutions

    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 2, 9, 7)).astype(np.float32)
    w = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    got = im2col_conv2d_relu(x, w, b, pad=pad)
    assert got.flags.c_contiguous and got.dtype == np.float32
    np.testing.assert_allclose(got, R.conv2d_relu_forward(x, w, b, pad=pad), rtol=1e-4, atol=1e-5)
    libs = library_convolutions(backend="emulator")
    assert list(libs) == ["im2col + BLAS (NumPy)"]


def test_lab05_measurements_refuse_to_time_a_wrong_kernel(monkeypatch):
    """measure.* hold every kernel to NumPy before timing it: a fast wrong kernel is an error naming it, not a bar."""
    from labkit.kernels import measure

    monkeypatch.setenv("LABKIT_DEVICE", "cpu")
    wrong = ("#define TILE 8\nextern \"C\" __global__ void matmul_tiled(const float* A, const float* B, float* C, "
             "int M, int N, int K)\n{ int r = blockIdx.y * TILE + threadIdx.y, c = blockIdx.x * TILE + threadIdx.x;\n"
             "  if (r < M && c < N) C[r * N + c] = A[r * K + c]; }\n")
    with pytest.raises(AssertionError, match=r"yours \(tiled\): wrong result"):
        measure.matmul_rates(16, 1, tiled=wrong)
    rates = measure.matmul_rates(16, 1)
    assert list(rates) == ["naive", "tiled (labkit)", "register-blocked", "BLAS (numpy.matmul)"]
    assert all(r > 0 for r in rates.values())
    leaky = ("extern \"C\" __global__ void sum_atomic_only(const float* x, float* out, int n)\n"
             "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n && i % 2) atomicAdd(out, x[i]); }\n")
    with pytest.raises(AssertionError, match="every thread atomicAdd: .* not timed"):
        measure.reduction_rates(1000, 1, atomic_only=leaky)
