"""labkit.mlp on the device: the whole training step done by labkit's kernels, weights kept on the device.

    net = DeviceMLP(mlp.init_params([784, 1024, 1024, 10]), batch_size=256, cost="cross_entropy")
    hist = train_device(net, (x, y), epochs=1, lr=0.1, test_data=(xt, yt))

Every buffer (activations, deltas, gradients, velocities, the batch itself) is allocated once in the
constructor; a step only launches kernels. ``matmul`` picks the product: one of labkit's kernels
("regblock", "tiled", "naive") or "library" (cupy.matmul, i.e. cuBLAS; numpy.matmul on the emulator).
The maths is labkit.mlp's: the same gradients within float32 tolerance (tests/test_device_mlp.py).
"""

from __future__ import annotations

import time

import numpy as np

from .. import mlp
from ..device import to_numpy
from ..progress import progress_bar
from ._launch import array_module_for, resolve
from .layers import act_backward, bias_act_forward, col_sum
from .loader import load_file
from .matmul import VARIANTS
from .matmul import matmul as kernel_matmul
from .optim import sgd_momentum
from .reduce import THREADS as REDUCE_THREADS
from .reduce import reduce_blocks
from .softmax import softmax_xent_backward, softmax_xent_forward

MATMULS = (*VARIANTS, "library")


class DeviceMLP:
    """A network whose weights, gradients and work buffers live on the kernels' device."""

    def __init__(self, params: mlp.Params, batch_size: int, activation: str = "sigmoid", cost: str = "cross_entropy",
                 matmul: str = "regblock", backend: str | None = None):
        mlp.check_params(params)
        mlp.check_options(activation, cost)
        if matmul not in MATMULS:
            raise ValueError(f"matmul must be one of {MATMULS}, got {matmul!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.backend = resolve(backend)
        xp = self.xp = array_module_for(self.backend)
        self.activation, self.cost, self.matmul_kind, self.batch_size = activation, cost, matmul, int(batch_size)
        f32 = np.float32
        self.params = [(xp.array(to_numpy(W), dtype=f32), xp.array(to_numpy(b), dtype=f32)) for W, b in params]
        self.sizes = [self.params[0][0].shape[1]] + [W.shape[0] for W, _ in self.params]
        B = self.batch_size
        self.acts = [xp.zeros((B, n), f32) for n in self.sizes]          # acts[0] is the batch itself
        self.deltas = [None] + [xp.zeros((B, n), f32) for n in self.sizes[1:]]
        self.grads = [(xp.zeros_like(W), xp.zeros_like(b)) for W, b in self.params]
        self.velocity = [(xp.zeros_like(W), xp.zeros_like(b)) for W, b in self.params]
        self.labels = xp.zeros(B, np.int32)
        self.probs = xp.zeros((B, self.sizes[-1]), f32)
        self.row_loss = xp.zeros(B, f32)
        self.loss_sum = xp.zeros(1, f32)        # summed on the device over many steps; read when asked
        self.zero_out = xp.zeros((B, self.sizes[-1]), f32) if cost == "quadratic" else None  # targets of sse_reduce
        self._reduce = load_file("reduce", backend=self.backend)

    # -- pieces ------------------------------------------------------------------------------------

    def _mm(self, a, b, out, trans_a=False, trans_b=False):
        if self.matmul_kind == "library":
            self.xp.matmul(a.T if trans_a else a, b.T if trans_b else b, out=out)
            return out
        return kernel_matmul(a, b, out, variant=self.matmul_kind, trans_a=trans_a, trans_b=trans_b, backend=self.backend)

    def load_batch(self, x, y) -> int:
        """Copy a batch (on the device already, or NumPy) into the input buffers; return its size."""
        n = x.shape[0]
        if not 1 <= n <= self.batch_size:
            raise ValueError(f"a batch of {n} samples does not fit this network's buffers (batch_size={self.batch_size})")
        if x.shape[1] != self.sizes[0]:
            raise ValueError(f"x has {x.shape[1]} features per sample but the first layer expects {self.sizes[0]}")
        self.acts[0][:n] = self.xp.asarray(x)
        self.labels[:n] = self.xp.asarray(y)
        return n

    def forward(self, n: int):
        """Forward pass over the first n rows of the loaded batch; returns the output rows (probabilities for cross-entropy)."""
        last = len(self.params) - 1
        for i, (W, b) in enumerate(self.params):
            z = self.acts[i + 1][:n]
            self._mm(self.acts[i][:n], W, z, trans_b=True)          # (n, n_in) @ (n_out, n_in)^T
            act = "identity" if (i == last and self.cost == "cross_entropy") else self.activation
            bias_act_forward(z, b, z, activation=act, backend=self.backend)
        if self.cost == "cross_entropy":
            softmax_xent_forward(self.acts[-1][:n], self.labels[:n], self.probs[:n], self.row_loss[:n], backend=self.backend)
            return self.probs[:n]
        return self.acts[-1][:n]

    def backward(self, n: int, l2: float = 0.0) -> None:
        """Gradients of the mean loss over the n rows into self.grads; adds the batch's summed loss to loss_sum
        (sum of -log p for cross-entropy, sum of (a - y)^2 for the quadratic cost)."""
        out = self.forward(n)
        d = self.deltas[-1][:n]
        if self.cost == "cross_entropy":
            k = self._reduce.get_function("sum_reduce")
            k((reduce_blocks(n),), (REDUCE_THREADS,), (self.row_loss[:n], self.loss_sum, np.int32(n)))
        else:  # the loss needs sum (a - y)^2 before the 1/n scaling
            softmax_xent_backward(out, self.labels[:n], d, scale=1.0, backend=self.backend)
            self._reduce.get_function("sse_reduce")((reduce_blocks(d.size),), (REDUCE_THREADS,),
                                                    (d, self.zero_out[:n], self.loss_sum, np.int32(d.size)))
        softmax_xent_backward(out, self.labels[:n], d, scale=1.0 / n, backend=self.backend)  # (out - onehot(y)) / n
        if self.cost == "quadratic":
            act_backward(d, self.acts[-1][:n], d, activation=self.activation, backend=self.backend)
        for i in range(len(self.params) - 1, -1, -1):
            W = self.params[i][0]
            gW, gb = self.grads[i]
            self._mm(self.deltas[i + 1][:n], self.acts[i][:n], gW, trans_a=True)   # delta^T a: (n_out, n_in)
            col_sum(self.deltas[i + 1][:n], gb, backend=self.backend)
            if i:
                prev = self.deltas[i][:n]
                self._mm(self.deltas[i + 1][:n], W, prev)                            # delta W: (n, n_in)
                act_backward(prev, self.acts[i][:n], prev, activation=self.activation, backend=self.backend)
        if l2:
            for (W, _), (gW, _) in zip(self.params, self.grads):
                gW += np.float32(l2) * W

    def update(self, lr: float, momentum: float = 0.0, l2: float = 0.0) -> None:
        """SGD with momentum on every weight and bias (L2 on weights only), in place."""
        for (W, b), (gW, gb), (vW, vb) in zip(self.params, self.grads, self.velocity):
            sgd_momentum(W, gW, vW, lr=lr, momentum=momentum, l2=l2, backend=self.backend)
            sgd_momentum(b, gb, vb, lr=lr, momentum=momentum, backend=self.backend)

    def step(self, x, y, lr: float, momentum: float = 0.0, l2: float = 0.0) -> None:
        """One SGD step on the batch (x, y): load, forward, backward, update: all kernels."""
        n = self.load_batch(x, y)
        self.backward(n)
        self.update(lr, momentum, l2)

    # -- for checking and reading ------------------------------------------------------------------

    def loss_and_grads(self, x, y, l2: float = 0.0):
        """(mean loss, grads as NumPy (W, b) pairs) for one batch, as labkit.mlp.loss_and_grads gives them."""
        n = self.load_batch(x, y)
        self.loss_sum[...] = 0
        self.backward(n, l2=l2)
        total = float(self.loss_sum[0])
        value = total / n if self.cost == "cross_entropy" else 0.5 * total / n
        value += mlp.l2_penalty(self.numpy_params(), l2)
        grads = [(to_numpy(gW).copy(), to_numpy(gb).copy()) for gW, gb in self.grads]
        return value, grads

    def numpy_params(self) -> mlp.Params:
        """The weights, copied to NumPy."""
        return [(to_numpy(W).copy(), to_numpy(b).copy()) for W, b in self.params]

    def accuracy(self, x, y, chunk: int | None = None) -> float:
        """Fraction of samples classified right, evaluated in batch-sized chunks on the device."""
        chunk = chunk or self.batch_size
        right = self.xp.zeros(1, np.int32)
        acc_k = self._reduce.get_function("accuracy_count")
        for s in range(0, x.shape[0], chunk):
            n = self.load_batch(x[s:s + chunk], y[s:s + chunk])
            out = self.forward(n)
            acc_k((reduce_blocks(n),), (REDUCE_THREADS,), (out, self.labels[:n], right, np.int32(n), np.int32(out.shape[1])))
        return int(right[0]) / x.shape[0]


def train_device(net: DeviceMLP, train_data: tuple, epochs: int = 1, lr: float = 0.1, momentum: float = 0.0,
                 l2: float = 0.0, test_data: tuple | None = None, seed: int = 0, progress: bool | None = None) -> mlp.History:
    """Mini-batch SGD with every step on the device; the data are copied there once. Returns a labkit.mlp.History.

    Batches are drawn as labkit.mlp.train draws them (same seed, same order). The epoch's loss is the mean
    over its batches, summed on the device; the L2 term is added from the epoch's final weights.
    """
    if epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    xp = net.xp
    x = xp.asarray(np.asarray(train_data[0], dtype=np.float32))
    y = xp.asarray(np.asarray(train_data[1]).astype(np.int32))
    if test_data is not None:
        xt = xp.asarray(np.asarray(test_data[0], dtype=np.float32))
        yt = xp.asarray(np.asarray(test_data[1]).astype(np.int32))
    n, B = x.shape[0], net.batch_size
    n_batches = -(-n // B)
    rng = np.random.default_rng(seed)
    hist = mlp.History()
    order = xp.zeros(n, np.int64)
    with progress_bar(total=epochs * n_batches, enable=progress, unit="batch", desc=f"training on {net.backend}") as bar:
        for epoch in range(1, epochs + 1):
            order[...] = xp.asarray(rng.permutation(n))
            net.loss_sum[...] = 0
            _sync(xp)
            t0 = time.perf_counter()
            for j in range(n_batches):
                idx = order[j * B:(j + 1) * B]
                m = idx.shape[0]
                xp.take(x, idx, axis=0, out=net.acts[0][:m])   # gather the batch straight into the input buffer
                xp.take(y, idx, out=net.labels[:m])
                net.backward(m)
                net.update(lr, momentum, l2)
                bar.update(1)
            _sync(xp)
            hist.epoch_time.append(time.perf_counter() - t0)
            total = float(net.loss_sum[0])
            hist.epoch.append(epoch)
            data_loss = total / n if net.cost == "cross_entropy" else 0.5 * total / n
            hist.train_loss.append(data_loss + mlp.l2_penalty(net.params, l2))
            if not np.isfinite(hist.train_loss[-1]):
                raise mlp.DivergenceError(f"training diverged on the device in epoch {epoch} (lr={lr:g}): try lr={lr / 10:g}")
            if test_data is not None:
                hist.test_accuracy.append(net.accuracy(xt, yt))
            bar.set_postfix_str(f"epoch {epoch}: loss {hist.train_loss[-1]:.4f}"
                                + (f", test acc {hist.test_accuracy[-1]:.2%}" if test_data is not None else ""))
    return hist


def _sync(xp) -> None:
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()
