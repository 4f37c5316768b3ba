"""Launchers for softmax.cu: softmax cross-entropy forward (probabilities and per-row loss) and backward."""

from __future__ import annotations

import numpy as np

from ._launch import ceil_div, output, require, resolve
from .layers import THREADS
from .loader import load_file


def _labels(labels, rows: int, which: str):
    return require(labels, "labels", shape=(rows,), dtype=np.int32, which=which)


def softmax_xent_forward(logits, labels, probs=None, loss=None, *, backend: str | None = None):
    """(probs, loss): row-wise softmax of logits (rows, cols) and -log p[label] per row (NaN for a label out of range)."""
    which = resolve(backend)
    require(logits, "logits", ndim=2, which=which)
    rows, cols = logits.shape
    _labels(labels, rows, which)
    probs = output(probs, "probs", (rows, cols), which)
    loss = output(loss, "loss", (rows,), which)
    k = load_file("softmax", backend=which).get_function("softmax_xent_forward")
    k((ceil_div(rows, THREADS),), (THREADS,), (logits, labels, probs, loss, np.int32(rows), np.int32(cols)))
    return probs, loss


def softmax_xent_backward(probs, labels, out=None, *, scale: float = 1.0, backend: str | None = None):
    """scale * (probs - onehot(labels)): the gradient with respect to the logits (scale = 1/batch for a mean)."""
    which = resolve(backend)
    require(probs, "probs", ndim=2, which=which)
    rows, cols = probs.shape
    _labels(labels, rows, which)
    out = output(out, "out", (rows, cols), which)
    k = load_file("softmax", backend=which).get_function("softmax_xent_backward")
    k((ceil_div(rows * cols, THREADS),), (THREADS,), (probs, labels, out, np.int32(rows), np.int32(cols), np.float32(scale)))
    return out
