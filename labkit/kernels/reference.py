"""NumPy references: the executable spec of every kernel, with the launcher's signature.

Each function here gives what the kernel of the same name must give (to float32 tolerance); the tests
compare them, and ``labkit.check`` prints "yours" next to these when a student's kernel is wrong.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def matmul(a, b, out=None, *, variant: str = "regblock", trans_a: bool = False, trans_b: bool = False, backend=None):
    """op(a) @ op(b)."""
    r = np.matmul(a.T if trans_a else a, b.T if trans_b else b, dtype=np.float32)
    return _into(out, r)


def wt_delta(W, delta, out=None, *, backend=None):
    """W^T delta."""
    return _into(out, (W.T @ delta).astype(np.float32))


def outer(delta, a, out=None, *, beta: float = 0.0, backend=None):
    """beta * out + delta a^T."""
    r = np.outer(delta, a).astype(np.float32)
    if beta != 0.0:
        r = np.float32(beta) * out + r
    return _into(out, r)


def _activate(z, activation):
    if activation == "sigmoid":
        return (1.0 / (1.0 + np.exp(-z))).astype(np.float32)
    if activation == "relu":
        return np.maximum(z, 0).astype(np.float32)
    return z.astype(np.float32)


def bias_act_forward(z, bias, out=None, *, activation: str = "sigmoid", backend=None):
    """act(z + bias)."""
    return _into(out, _activate(z + bias, activation))


def act_backward(grad_out, a, out=None, *, activation: str = "sigmoid", backend=None):
    """grad_out * act'(a) from the activation's output a."""
    prime = {"sigmoid": a * (1 - a), "relu": (a > 0).astype(np.float32), "identity": np.ones_like(a)}[activation]
    return _into(out, (grad_out * prime).astype(np.float32))


def col_sum(x, out=None, *, backend=None):
    """x.sum(axis=0)."""
    return _into(out, x.sum(axis=0, dtype=np.float32))


def sgd_momentum(w, g, v, *, lr: float, momentum: float = 0.0, l2: float = 0.0, backend=None):
    """v = momentum v - lr (g + l2 w); w += v (in place)."""
    v[...] = np.float32(momentum) * v - np.float32(lr) * (g + np.float32(l2) * w)
    w += v
    return w


def softmax_xent_forward(logits, labels, probs=None, loss=None, *, backend=None):
    """(softmax(logits), -log p[label])."""
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    p = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
    rows = np.arange(len(labels))
    ok = (labels >= 0) & (labels < logits.shape[1])
    lab = np.where(ok, labels, 0)
    l_ = np.where(ok, -np.log(np.maximum(p[rows, lab], 1e-30)), np.nan).astype(np.float32)
    return _into(probs, p), _into(loss, l_)


def softmax_xent_backward(probs, labels, out=None, *, scale: float = 1.0, backend=None):
    """scale * (probs - onehot(labels))."""
    g = probs.copy()
    g[np.arange(len(labels)), labels] -= 1.0
    return _into(out, (np.float32(scale) * g).astype(np.float32))


def sum_reduce(x, *, backend=None) -> float:
    """sum(x)."""
    return float(x.sum(dtype=np.float64))


def sse_reduce(a, b, *, backend=None) -> float:
    """sum((a - b)^2)."""
    d = a.astype(np.float64) - b
    return float((d * d).sum())


def accuracy_count(scores, labels, *, backend=None) -> int:
    """Rows whose arg-max is the label (ties go to the first maximum, as in the kernel)."""
    return int((scores.argmax(axis=1) == labels).sum())


def _windows(x, R, S, pad):
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    return sliding_window_view(xp, (R, S), axis=(2, 3))  # (N, C, OH, OW, R, S)


def conv2d_relu_forward(x, w, b, out=None, *, pad: int = 0, backend=None):
    """relu(conv2d(x, w) + b), stride 1, zero padding."""
    K, C, R, S = w.shape
    z = np.einsum("ncijrs,kcrs->nkij", _windows(x, R, S, pad), w, optimize=True) + b[None, :, None, None]
    return _into(out, np.maximum(z, 0).astype(np.float32))


def conv2d_relu_backward(dy, y, x, w, *, pad: int = 0, backend=None):
    """(dx, dw, db) through the ReLU mask y > 0."""
    K, C, R, S = w.shape
    N, _, H, W = x.shape
    dz = dy * (y > 0)
    dw = np.einsum("ncijrs,nkij->kcrs", _windows(x, R, S, pad), dz, optimize=True).astype(np.float32)
    db = dz.sum(axis=(0, 2, 3), dtype=np.float32)
    OH, OW = dz.shape[2:]
    dxp = np.zeros((N, C, H + 2 * pad, W + 2 * pad), np.float32)
    for r in range(R):
        for s in range(S):
            dxp[:, :, r:r + OH, s:s + OW] += np.einsum("nkij,kc->ncij", dz, w[:, :, r, s])
    dx = dxp[:, :, pad:pad + H, pad:pad + W].copy()
    return dx, dw, db


def _into(out, r):
    if out is None:
        return r
    out[...] = r
    return out
