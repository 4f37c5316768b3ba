"""A fully connected network trained by backpropagation, two ways.

* :func:`backprop_per_sample` is the course's serial baseline in the style of network.py:
  one sample at a time as column vectors, gradients summed over the mini-batch.
* :func:`backprop` does the same maths for the whole mini-batch at once as matrix products.

Both return the gradient of the *mean* loss over the batch, in the same structure as ``params``:
a list of ``(W, b)`` pairs with ``W`` of shape (n_out, n_in) and ``b`` of shape (n_out,).
Everything here runs on NumPy or CuPy arrays: the array module is taken from the inputs.

Costs: ``"quadratic"`` (0.5 ||a - y||^2 on the activation of the last layer, as network.py) or
``"cross_entropy"`` (softmax output, -sum y log p). Activations: ``"sigmoid"`` or ``"relu"``.
``l2`` adds 0.5 * l2 * sum(W**2) to the loss (biases are not decayed).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .device import array_module, to_numpy
from .errors import LabkitError
from .progress import progress_bar

ACTIVATIONS = ("sigmoid", "relu")
COSTS = ("quadratic", "cross_entropy")

Params = list  # list[tuple[W, b]], W (n_out, n_in), b (n_out,)


class DivergenceError(LabkitError, FloatingPointError):
    """Training produced a NaN or infinite loss."""


# -- building blocks --------------------------------------------------------------------------


def sigmoid(z):
    """1 / (1 + exp(-z)), written with tanh so large |z| never overflows."""
    xp = array_module(z)
    return 0.5 * (xp.tanh(0.5 * z) + 1.0)


def relu(z):
    """max(z, 0)."""
    xp = array_module(z)
    return xp.maximum(z, 0)


def activate(z, activation: str):
    """The hidden-layer activation by name: sigmoid(z) or relu(z)."""
    return sigmoid(z) if activation == "sigmoid" else relu(z)


def act_prime_from_output(name: str, a):
    """The activation's derivative from its output a: sigmoid' = a (1 - a), relu' = [a > 0] (backprop keeps the
    outputs, not the inputs z, so every layer's derivative is computed from what the forward pass stored)."""
    if name == "sigmoid":
        return a * (1.0 - a)
    return (a > 0).astype(a.dtype)


def softmax(z):
    """Row-wise softmax of (batch, classes) logits, shifted by the row maximum for stability."""
    xp = array_module(z)
    e = xp.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def init_params(sizes: Sequence[int], seed: int = 0, dtype=np.float32, init: str = "scaled", xp=np) -> Params:
    """Random weights for layer sizes like [784, 30, 10].

    W ~ N(0, 1/n_in) ("scaled", network2.py), N(0, 2/n_in) ("he", for ReLU) or N(0, 1) ("unit", network.py);
    b ~ N(0, 1), or zero for "he".
    """
    sizes = [int(s) for s in sizes]
    if len(sizes) < 2 or any(s < 1 for s in sizes):
        raise ValueError(f"sizes must list at least two positive layer widths, got {list(sizes)}")
    if init not in ("scaled", "he", "unit"):
        raise ValueError(f"init must be 'scaled', 'he' or 'unit', got {init!r}")
    rng = np.random.default_rng(seed)
    params = []
    for n_in, n_out in zip(sizes[:-1], sizes[1:]):
        scale = {"scaled": 1 / math.sqrt(n_in), "he": math.sqrt(2 / n_in), "unit": 1.0}[init]
        W = rng.standard_normal((n_out, n_in)) * scale
        b = np.zeros(n_out) if init == "he" else rng.standard_normal(n_out)
        params.append((xp.asarray(W, dtype=dtype), xp.asarray(b, dtype=dtype)))
    return params


def sizes_of(params: Params) -> list[int]:
    """Layer widths of a parameter list, e.g. [784, 30, 10]."""
    return [params[0][0].shape[1]] + [W.shape[0] for W, _ in params]


def zeros_like(params: Params) -> Params:
    """A gradient-shaped structure of zeros."""
    xp = array_module(params[0][0])
    return [(xp.zeros_like(W), xp.zeros_like(b)) for W, b in params]


def add_into(acc: Params, grads: Params) -> Params:
    """acc += grads, layer by layer, in place; returns acc."""
    for (aW, ab), (gW, gb) in zip(acc, grads):
        aW += gW
        ab += gb
    return acc


# -- checks -----------------------------------------------------------------------------------


def check_params(params: Params) -> None:
    """Raise ValueError naming the layer whose shapes do not fit together."""
    if not isinstance(params, (list, tuple)) or not params:
        raise ValueError("params must be a non-empty list of (W, b) pairs; make one with init_params([784, 30, 10])")
    for i, layer in enumerate(params):
        if not isinstance(layer, (list, tuple)) or len(layer) != 2:
            raise ValueError(f"layer {i}: expected a (W, b) pair, got {type(layer).__name__}")
        W, b = layer
        if getattr(W, "ndim", None) != 2:
            raise ValueError(f"layer {i}: W must be 2-D (n_out, n_in), got shape {getattr(W, 'shape', None)}")
        if getattr(b, "ndim", None) != 1 or b.shape[0] != W.shape[0]:
            got = getattr(b, "shape", None)
            raise ValueError(f"layer {i}: b must have shape ({W.shape[0]},) to match W {W.shape}, got {got}")
        if i and W.shape[1] != params[i - 1][0].shape[0]:
            raise ValueError(
                f"layer {i} expects {W.shape[1]} inputs but layer {i - 1} produces {params[i - 1][0].shape[0]} outputs"
            )


def check_options(activation: str, cost: str) -> None:
    """Raise ValueError unless ``activation`` is one of :data:`ACTIVATIONS` and ``cost`` one of :data:`COSTS`."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if cost not in COSTS:
        raise ValueError(f"cost must be one of {COSTS}, got {cost!r}")


def targets(y, n_out: int, dtype):
    """Labels (batch,) or one-hot rows (batch, n_out) -> one-hot rows of ``dtype``."""
    xp = array_module(y)
    if y.ndim == 2:
        if y.shape[1] != n_out:
            raise ValueError(f"one-hot y has {y.shape[1]} columns but the network has {n_out} outputs")
        return y.astype(dtype, copy=False)
    if y.ndim != 1:
        raise ValueError(f"y must be labels (batch,) or one-hot (batch, {n_out}), got shape {y.shape}")
    if y.dtype.kind not in "iu":
        raise ValueError(f"labels y must be integers, got dtype {y.dtype}")
    if y.size and (int(y.min()) < 0 or int(y.max()) >= n_out):
        raise ValueError(
            f"labels must lie in [0, {n_out}) for a network with {n_out} outputs; got {int(y.min())}..{int(y.max())}"
        )
    Y = xp.zeros((y.shape[0], n_out), dtype=dtype)
    Y[xp.arange(y.shape[0]), y] = 1
    return Y


def check_batch(params: Params, x, y):
    """Validate a batch against the network; return one-hot targets."""
    check_params(params)
    n_in, n_out = params[0][0].shape[1], params[-1][0].shape[0]
    if getattr(x, "ndim", None) != 2:
        raise ValueError(f"x must be 2-D (batch, {n_in}); got shape {getattr(x, 'shape', None)} (for one sample use x[None, :])")
    if x.shape[1] != n_in:
        raise ValueError(f"x has {x.shape[1]} features per sample but the first layer expects {n_in}")
    if x.shape[0] == 0:
        raise ValueError("x holds no samples")
    if len(y) != x.shape[0]:
        raise ValueError(f"x has {x.shape[0]} samples but y has {len(y)}")
    return targets(y, n_out, params[0][0].dtype)


# -- forward ----------------------------------------------------------------------------------


def forward(params: Params, x, activation: str = "sigmoid", cost: str = "quadratic") -> list:
    """Activations of every layer for a batch x (batch, n_in): [x, a1, ..., output]."""
    xp = array_module(x)
    acts = [x]
    a = x
    last = len(params) - 1
    for i, (W, b) in enumerate(params):
        z = a @ W.T  # (batch, n_out)
        z += b
        if i == last and cost == "cross_entropy":
            a = softmax(z)
        elif activation == "sigmoid":  # in place: 0.5 (tanh(z / 2) + 1), no temporaries
            z *= 0.5
            xp.tanh(z, out=z)
            z += 1.0
            z *= 0.5
            a = z
        else:
            a = xp.maximum(z, 0, out=z)
        acts.append(a)
    return acts


def predict(params: Params, x, activation: str = "sigmoid", cost: str = "quadratic", chunk: int = 4096):
    """Class predictions (batch,) for inputs x (batch, n_in), in chunks to bound memory."""
    xp = array_module(x, params[0][0])
    x = xp.asarray(x, dtype=params[0][0].dtype)
    out = [forward(params, x[i:i + chunk], activation, cost)[-1].argmax(axis=1) for i in range(0, len(x), chunk)]
    return xp.concatenate(out) if out else xp.zeros(0, dtype=np.int64)


def largest_difference(params, reference, relative: bool = False) -> float:
    """The largest absolute difference between two networks' weights and biases, over all their arrays; with
    ``relative=True`` each array's difference is divided by the largest magnitude in ``reference``'s array."""
    worst = 0.0
    for pair, ref_pair in zip(params, reference):
        for a, b in zip(pair, ref_pair):
            d = float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).max())
            worst = max(worst, d / float(np.abs(b).max()) if relative else d)
    return worst


def accuracy(params: Params, x, y, activation: str = "sigmoid", cost: str = "quadratic") -> float:
    """Fraction of samples classified correctly; y are integer labels."""
    xp = array_module(x, params[0][0])
    return float((predict(params, x, activation, cost) == xp.asarray(y)).mean())


def l2_penalty(params: Params, l2: float) -> float:
    """0.5 * l2 * sum of squared weights (biases excluded)."""
    if not l2:
        return 0.0
    xp = array_module(params[0][0])
    return 0.5 * l2 * sum(float(xp.vdot(W, W)) for W, _ in params)


def _loss(out, Y, cost: str, params: Params, l2: float):
    xp = array_module(out)
    n = out.shape[0]
    if cost == "quadratic":
        d = (out - Y).ravel()
        loss = 0.5 * float(xp.dot(d, d)) / n
    else:
        loss = -float((Y * xp.log(xp.maximum(out, 1e-30))).sum()) / n
    return loss + l2_penalty(params, l2)


def loss(params: Params, x, y, activation: str = "sigmoid", cost: str = "quadratic", l2: float = 0.0) -> float:
    """Mean loss over the batch (plus the L2 term)."""
    check_options(activation, cost)
    Y = check_batch(params, x, y)
    return _loss(forward(params, x, activation, cost)[-1], Y, cost, params, l2)


# -- vectorised backprop ------------------------------------------------------------------------


def loss_and_grads_unchecked(params: Params, x, Y, activation: str, cost: str, l2: float, scale: float | None = None,
                    out: Params | None = None, on_layer: Callable[[int], None] | None = None):
    """Vectorised backprop without the argument checks, for loops that validated their data once: (mean loss, grads).

    Y is one-hot (batch, n_out) of the parameters' dtype (:func:`check_batch` makes it); ``activation`` and ``cost``
    must be valid (:func:`check_options`).
    ``scale`` replaces the 1/batch of the mean (data parallelism passes 1/global batch, so a shard's
    result is its share of the global mean); ``out`` is a params-like list of arrays to write into;
    ``on_layer(i)`` is called as soon as layer i's gradients are final, last layer first (data parallelism starts
    their allreduce there, while the layers below are still computing).
    """
    xp = array_module(x)
    acts = forward(params, x, activation, cost)
    a_out = acts[-1]
    n = x.shape[0]
    scale = 1.0 / n if scale is None else scale
    delta = a_out - Y  # (batch, n_out); for softmax + cross-entropy this is dL/dz exactly
    if cost == "quadratic":
        value = 0.5 * float(xp.vdot(delta, delta)) * scale
        delta *= act_prime_from_output(activation, a_out)
    else:
        value = _loss(a_out, Y, cost, params, 0.0) * n * scale
    value += l2_penalty(params, l2)
    delta *= scale  # gradients of the mean loss
    grads = [None] * len(params)
    for i in range(len(params) - 1, -1, -1):
        W = params[i][0]
        if out is None:
            gW, gb = delta.T @ acts[i], delta.sum(axis=0)  # (n_out, n_in): the outer products delta a^T, summed
        else:
            gW, gb = out[i]
            xp.matmul(delta.T, acts[i], out=gW)
            delta.sum(axis=0, out=gb)
        if l2:
            gW += l2 * W
        grads[i] = (gW, gb)
        if on_layer is not None:
            on_layer(i)
        if i:  # the input layer needs no delta
            delta = delta @ W  # (batch, n_in): W^T delta for every sample
            delta *= act_prime_from_output(activation, acts[i])
    return value, grads


def loss_and_grads(params: Params, x, y, activation: str = "sigmoid", cost: str = "quadratic", l2: float = 0.0):
    """Vectorised backprop over a whole mini-batch: (mean loss, gradients like params)."""
    check_options(activation, cost)
    Y = check_batch(params, x, y)
    return loss_and_grads_unchecked(params, x, Y, activation, cost, l2)


def output_error(a, Y):
    """The output layer's error dC/dz of every row, for sigmoid outputs ``a`` and the quadratic cost against one-hot
    ``Y``: (a - y) sigma'(z), with sigma'(z) = a (1 - a) read from the output a = sigma(z). One row per sample, not
    divided by the batch size (lab 01's first exercise)."""
    return (a - Y) * act_prime_from_output("sigmoid", a)


def layer_backward(delta, a_in, W):
    """One layer's backward pass for a batch (lab 01's second exercise): the layer computes Z = A_in W^T + b; from
    its error ``delta`` = dC/dZ (batch, n_out) return (dC/dW (n_out, n_in), dC/db (n_out,), dC/dA_in (batch, n_in)).
    The sums run over the batch's rows: any 1/batch of a mean cost is already inside ``delta``."""
    return delta.T @ a_in, delta.sum(axis=0), delta @ W


def numerical_grad(f, W, eps: float = 1e-5):
    """Central differences (f(W + eps e_i) - f(W - eps e_i)) / (2 eps) for every entry i of ``W`` (lab 01's fourth
    exercise): ``f()`` reads ``W``, which is changed in place one entry at a time and restored. The error is of order
    eps^2 (a one-sided difference: eps); checks an analytic gradient without another implementation of it."""
    G = np.zeros(W.shape, dtype=np.float64)
    for idx in np.ndindex(W.shape):
        old = W[idx]
        W[idx] = old + eps
        up = float(f())
        W[idx] = old - eps
        down = float(f())
        W[idx] = old
        G[idx] = (up - down) / (2 * eps)
    return G


def backprop(params: Params, x, y, activation: str = "sigmoid", cost: str = "quadratic", l2: float = 0.0, *,
             scale: float | None = None, out: Params | None = None, on_layer: Callable[[int], None] | None = None) -> Params:
    """Gradients of the mean loss over the mini-batch x (batch, n_in), y labels or one-hot.

    ``scale`` replaces the 1/batch of the mean; ``out`` (arrays shaped like ``params``) receives the gradients;
    ``on_layer(i)`` is called as soon as layer i's gradients are final, last layer first, while the layers below
    are still to be computed (lab 08 starts each layer's allreduce there)."""
    check_options(activation, cost)
    Y = check_batch(params, x, y)
    return loss_and_grads_unchecked(params, x, Y, activation, cost, l2, scale=scale, out=out, on_layer=on_layer)[1]


# -- the per-sample reference (network.py style) -------------------------------------------------


def backprop_one(params: Params, x, y, activation: str, cost: str, outer=None, wt_delta=None):
    """One sample as column vectors: x (n_in, 1), y (n_out, 1) -> (loss, [(nabla_W, nabla_b)]).

    ``outer(i, delta, a)`` and ``wt_delta(i, delta)`` replace the two products of layer i (lab 04 runs them as
    kernels); both take and return column vectors or matrices, as the NumPy expressions they replace.
    """
    xp = array_module(x)
    activations = [x]
    a = x
    for i, (W, b) in enumerate(params):
        z = xp.dot(W, a) + b[:, None]
        if i == len(params) - 1 and cost == "cross_entropy":
            e = xp.exp(z - z.max())
            a = e / e.sum()
        else:
            a = activate(z, activation)
        activations.append(a)
    out = activations[-1]
    if cost == "quadratic":
        value = 0.5 * float(((out - y) ** 2).sum())
        delta = (out - y) * act_prime_from_output(activation, out)
    else:
        value = -float((y * xp.log(xp.maximum(out, 1e-30))).sum())
        delta = out - y
    nabla = [None] * len(params)
    for i in range(len(params) - 1, -1, -1):
        nabla[i] = (outer(i, delta, activations[i]) if outer else xp.dot(delta, activations[i].T), delta[:, 0])  # delta a^T
        if i:
            back = wt_delta(i, delta) if wt_delta else xp.dot(params[i][0].T, delta)  # W^T delta
            delta = back * act_prime_from_output(activation, activations[i])
    return value, nabla


def _times_act_prime(v, a, sigmoid_hidden: bool) -> None:
    """v *= the activation's derivative from its output a, in place: a (1 - a) for sigmoid, [a > 0] for relu."""
    if sigmoid_hidden:
        prime = 1.0 - a
        prime *= a
        v *= prime
    else:
        v *= a > 0


def _sample_forward(xp, Ws, bias, a, acts, softmax_out: bool, sigmoid_hidden: bool):
    """One sample a (n_in, 1) through every layer: acts[i + 1] = f(W_i acts[i] + b_i), computed in place; returns the output."""
    last = len(Ws) - 1
    acts[0] = a
    for i in range(last + 1):
        z = xp.dot(Ws[i], a)  # (n_out, 1), a new array: the activation is computed in it, in place
        z += bias[i]
        if i == last and softmax_out:
            z -= z.max()
            xp.exp(z, out=z)
            z /= z.sum()
        elif sigmoid_hidden:  # sigma(z) = (tanh(z / 2) + 1) / 2, never overflows
            z *= 0.5
            xp.tanh(z, out=z)
            z += 1.0
            z *= 0.5
        else:
            xp.maximum(z, 0, out=z)
        a = acts[i + 1] = z
    return a


def _sample_output_error(xp, a, t, quadratic: bool, sigmoid_hidden: bool):
    """One sample's loss and output error dL/dz (n_out, 1): 0.5 ||a - y||^2 with (a - y) f'(z), or -sum y log a with a - y."""
    delta = a - t  # (n_out, 1)
    if not quadratic:  # softmax + cross-entropy: a - y is dL/dz exactly
        return -float(xp.log(xp.maximum(a[t > 0], 1e-30)).sum()), delta
    value = 0.5 * float(xp.vdot(delta, delta))
    _times_act_prime(delta, a, sigmoid_hidden)  # under the quadratic cost the output layer has the hidden activation
    return value, delta


def _sample_backward(xp, WTs, acts, delta, acc_W, acc_b, sigmoid_hidden: bool) -> None:
    """Add one sample's delta a^T and delta into every layer's sums, from the output back: delta <- (W^T delta) f'(z)."""
    for i in range(len(WTs) - 1, -1, -1):
        acc_W[i] += xp.dot(delta, acts[i].T)  # the outer product delta a^T (dot: matmul skips BLAS here, 8x slower)
        acc_b[i] += delta
        if i:  # the input layer needs no delta
            delta = xp.dot(WTs[i], delta)  # W^T delta, (n_in, 1)
            _times_act_prime(delta, acts[i], sigmoid_hidden)


def per_sample_sum(params: Params, x, Y, activation: str, cost: str):
    """Sum of per-sample losses and gradients over the rows of x (Y one-hot), without checks: (loss sum, grads sum).

    The same maths as :func:`backprop_one` for every row, written as the tight loop the serial baseline must be:
    column views and transposes made once per batch, activations computed in place, gradients added straight into
    the sums. Per sample that is about 27 NumPy calls for [784,30,10], fewer than network.py's loop makes, in three
    steps: :func:`_sample_forward`, :func:`_sample_output_error`, :func:`_sample_backward`. Products of column vectors
    use ``dot``: NumPy's ``matmul`` does a (30,1) x (1,784) outer product without BLAS, about 8x slower (measured:
    35 µs against 4.3 µs).
    """
    xp = array_module(x)
    Ws = [W for W, _ in params]
    WTs = [W.T for W in Ws]  # (n_in, n_out) views, for W^T delta
    bias = [b[:, None] for _, b in params]  # (n_out, 1) views
    acc = zeros_like(params)
    acc_W = [gW for gW, _ in acc]
    acc_b = [gb[:, None] for _, gb in acc]  # views: adding a column adds into the bias sums
    X, T = x[:, :, None], Y[:, :, None]  # row k as a column vector (n_in, 1) without a copy
    sigmoid_hidden, quadratic = activation == "sigmoid", cost == "quadratic"
    acts = [None] * (len(params) + 1)  # the current sample's [x, a1, ..., output], each (width, 1)
    total = 0.0
    for k in range(x.shape[0]):
        out = _sample_forward(xp, Ws, bias, X[k], acts, not quadratic, sigmoid_hidden)
        value, delta = _sample_output_error(xp, out, T[k], quadratic, sigmoid_hidden)
        total += value
        _sample_backward(xp, WTs, acts, delta, acc_W, acc_b, sigmoid_hidden)
    return total, acc


def loss_and_grads_per_sample(params: Params, x, y, activation: str = "sigmoid", cost: str = "quadratic", l2: float = 0.0):
    """The serial baseline: backprop one sample at a time and sum, as network.py's update_mini_batch."""
    check_options(activation, cost)
    Y = check_batch(params, x, y)
    total, acc = per_sample_sum(params, x, Y, activation, cost)
    return mean_from_sums(params, total, acc, x.shape[0], l2)


def mean_from_sums(params: Params, total: float, acc: Params, n: int, l2: float = 0.0):
    """Summed losses and gradients over n samples -> (mean loss, mean gradients), plus the L2 term (in place)."""
    for (gW, gb), (W, _) in zip(acc, params):
        gW /= n
        gb /= n
        if l2:
            gW += l2 * W
    return total / n + l2_penalty(params, l2), list(acc)


def backprop_per_sample(params: Params, x, y, activation: str = "sigmoid", cost: str = "quadratic", l2: float = 0.0) -> Params:
    """Gradients of the mean loss, computed one sample at a time (the reference for :func:`backprop`)."""
    return loss_and_grads_per_sample(params, x, y, activation, cost, l2)[1]


# -- optimiser and training loop -----------------------------------------------------------------


class SGD:
    """Stochastic gradient descent with optional momentum: v = mu v - lr g; W += v (in place)."""

    def __init__(self, lr: float, momentum: float = 0.0):
        if not lr > 0:
            raise ValueError(f"learning rate must be positive, got {lr}")
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.lr, self.momentum = float(lr), float(momentum)
        self.velocity: Params | None = None

    def step(self, params: Params, grads: Params) -> None:
        """Update ``params`` in place from ``grads``."""
        if self.momentum == 0:
            for (W, b), (gW, gb) in zip(params, grads):
                W -= self.lr * gW
                b -= self.lr * gb
            return
        if self.velocity is None:
            self.velocity = zeros_like(params)
        for (W, b), (gW, gb), (vW, vb) in zip(params, grads, self.velocity):
            vW *= self.momentum
            vW -= self.lr * gW
            vb *= self.momentum
            vb -= self.lr * gb
            W += vW
            b += vb


@dataclass
class History:
    """What a training run measured, one entry per epoch."""

    epoch: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    test_accuracy: list[float] = field(default_factory=list)
    epoch_time: list[float] = field(default_factory=list)  # seconds of training, evaluation excluded

    @property
    def final_accuracy(self) -> float:
        """Test accuracy after the last epoch (NaN without test data)."""
        return self.test_accuracy[-1] if self.test_accuracy else float("nan")

    def summary(self) -> str:
        """One line: epochs, final loss and accuracy, mean epoch time."""
        t = sum(self.epoch_time) / max(len(self.epoch_time), 1)
        acc = f", test accuracy {self.final_accuracy:.2%}" if self.test_accuracy else ""
        n = len(self.epoch)
        return f"{n} epoch{'' if n == 1 else 's'}, loss {self.train_loss[-1]:.4f}{acc}, {t:.2f} s/epoch"


GradFn = Callable[..., tuple]


def _grad_function(method: str | GradFn) -> GradFn:
    """The gradient function ``method`` names: :func:`loss_and_grads`, :func:`loss_and_grads_per_sample`, or itself."""
    grad_fn = {"vectorised": loss_and_grads, "per_sample": loss_and_grads_per_sample}.get(method, method)
    if not callable(grad_fn):
        raise ValueError(f"method must be 'vectorised', 'per_sample' or a function, got {method!r}")
    return grad_fn


def _checked_data(params: Params, train_data: tuple):
    """(x, Y): the inputs as arrays of the parameters' module and dtype, the labels one-hot, checked against the network."""
    x, y = train_data
    xp = array_module(params[0][0])
    x = xp.asarray(x, dtype=params[0][0].dtype)
    return x, check_batch(params, x, xp.asarray(y))


def _optimizer(grad_fn: GradFn, params: Params, lr: float, momentum: float):
    """The method's own optimizer if it brings one (``make_optimizer``: a sharded one), else :class:`SGD`."""
    make_optimizer = getattr(grad_fn, "make_optimizer", None)
    return make_optimizer(params, lr, momentum) if make_optimizer is not None else SGD(lr, momentum)


def _batch_loss_and_grads(grad_fn: GradFn, params: Params, xb, Yb, activation: str, cost: str, l2: float):
    """(mean loss, gradients) of one batch; labkit's own methods skip the checks :func:`train` made once."""
    if grad_fn is loss_and_grads:
        return loss_and_grads_unchecked(params, xb, Yb, activation, cost, l2)
    if grad_fn is loss_and_grads_per_sample:
        return mean_from_sums(params, *per_sample_sum(params, xb, Yb, activation, cost), len(xb), l2)
    return grad_fn(params, xb, Yb, activation=activation, cost=cost, l2=l2)


def _check_divergence(window: float, first_loss: float, epoch: int, batch: int, lr: float, momentum: float,
                      activation: str, cost: str) -> None:
    """Raise :class:`DivergenceError` if a window's mean batch loss is not finite or > 100 max(first loss, 0.001)."""
    if not math.isfinite(window) or window > 100 * max(first_loss, 1e-3):
        what = f"became {window}" if not math.isfinite(window) else f"exploded from {first_loss:.3g} to {window:.3g}"
        raise DivergenceError(
            f"training diverged: the loss {what} in epoch {epoch}, batch {batch} (lr={lr:g}, "
            f"momentum={momentum:g}, {activation}, {cost}). The learning rate is probably too "
            f"large: try lr={lr / 10:g}, or scaled initial weights (init_params(..., init='scaled'))."
        )


def _end_epoch(hist: History, bar, epoch: int, seconds: float, mean_loss: float, params: Params, test_data,
               activation: str, cost: str) -> None:
    """Record the epoch in ``hist`` (and the test accuracy, with test data) and show its loss on the progress bar."""
    hist.epoch_time.append(seconds)
    hist.epoch.append(epoch)
    hist.train_loss.append(mean_loss)
    if test_data is not None:
        hist.test_accuracy.append(accuracy(params, test_data[0], test_data[1], activation, cost))
    bar.set_postfix_str(
        f"epoch {epoch}: loss {mean_loss:.4f}"
        + (f", test acc {hist.test_accuracy[-1]:.2%}" if test_data is not None else "")
    )


def train(
    params: Params,
    train_data: tuple,
    epochs: int = 1,
    batch_size: int = 10,
    lr: float = 3.0,
    momentum: float = 0.0,
    l2: float = 0.0,
    activation: str = "sigmoid",
    cost: str = "quadratic",
    method: str | GradFn = "vectorised",
    test_data: tuple | None = None,
    seed: int = 0,
    progress: bool | None = None,
    check_every: int = 20,
) -> History:
    """Mini-batch SGD on ``train_data = (x, y)``; updates ``params`` in place and returns a :class:`History`.

    ``method`` is ``"vectorised"``, ``"per_sample"``, or any function with the signature of
    :func:`loss_and_grads` (for example a thread or process pool from ``labkit.cpu_parallel``). A method with a
    ``make_optimizer(params, lr, momentum)`` brings its own optimizer (``step(params, grads)``, and ``close()``, called
    when training ends however it ends): :class:`labkit.data_parallel.DataParallel` shards the update that way.
    A NaN or infinite loss, or one whose mean over a window of batches grows to 100 times the first batch's loss,
    stops the run with :class:`DivergenceError` and a hint.
    """
    check_options(activation, cost)
    if epochs < 1 or batch_size < 1:
        raise ValueError(f"epochs and batch_size must be >= 1, got {epochs} and {batch_size}")
    grad_fn = _grad_function(method)
    x, Y = _checked_data(params, train_data)  # validated once; batches below are slices of checked data
    xp = array_module(x)
    opt = _optimizer(grad_fn, params, lr, momentum)
    rng = np.random.default_rng(seed)
    n = x.shape[0]
    n_batches = -(-n // batch_size)
    hist = History()
    first_loss = None  # the loss before any update: the yardstick for "exploded"
    bar = progress_bar(total=epochs * n_batches, enable=progress, unit="batch", desc="training")
    closing = contextlib.closing(opt) if hasattr(opt, "close") else contextlib.nullcontext()  # however training ends
    with np.errstate(over="ignore", invalid="ignore"), bar, closing:
        for epoch in range(1, epochs + 1):
            t0 = time.perf_counter()
            order = xp.asarray(rng.permutation(n))
            total = window = 0.0  # the epoch's summed loss; the summed batch losses since the last check
            for j in range(n_batches):
                idx = order[j * batch_size:(j + 1) * batch_size]
                xb, Yb = x[idx], Y[idx]  # gathering each batch stays in cache; a shuffled copy of x would not
                value, grads = _batch_loss_and_grads(grad_fn, params, xb, Yb, activation, cost, l2)
                total += value * xb.shape[0]
                window += value
                first_loss = value if first_loss is None else first_loss
                if (j + 1) % check_every == 0 or j == n_batches - 1:  # every check_every batches, and the epoch's last
                    window /= (j % check_every) + 1
                    _check_divergence(window, first_loss, epoch, j + 1, lr, momentum, activation, cost)
                    window = 0.0
                opt.step(params, grads)
                bar.update(1)
            _end_epoch(hist, bar, epoch, time.perf_counter() - t0, total / n, params, test_data, activation, cost)
    return hist


def misclassified(params: Params, x, y, activation: str = "sigmoid", cost: str = "quadratic") -> tuple[np.ndarray, np.ndarray]:
    """Indices of wrongly classified samples and what the network predicted for them (NumPy)."""
    pred = to_numpy(predict(params, x, activation, cost))
    wrong = np.flatnonzero(pred != to_numpy(y))
    return wrong, pred[wrong]
