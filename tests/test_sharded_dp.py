"""Memory per rank and sharded data parallelism (labkit.sharded_dp): formulas, counts and steps against NumPy's serial
step; the MPI steps also under a real mpiexec at 1, 2 and 4 ranks."""

import numpy as np
import pytest
from conftest import ranks
from mpi4py import MPI
from mpicases import mpi_cases

from labkit import mlp
from labkit.sharded_dp import (
    STATE_BYTES,
    FullySharded,
    MemoryMeter,
    Zero2,
    accumulated_grads,
    backprop_layers,
    checkpoint_every,
    memory_per_rank,
)

test_sharded_steps_under_mpiexec = mpi_cases("cases_sharded_dp.py", ranks(1, 2, 4))

SIZES = [20, 16, 8, 4]
COMBOS = [("relu", "cross_entropy"), ("sigmoid", "quadratic")]
rng = np.random.default_rng(0)


def test_memory_per_rank_gives_the_zero_papers_figures():
    """7.5 billion parameters on 64 ranks, mixed-precision Adam: 120, 31.4, 16.6 and 1.9 GB per rank."""
    psi, k = 7.5e9, STATE_BYTES["adam_mixed"]
    got = {stage: memory_per_rank(psi, 64, stage, 2, k)["total"] / 1e9 for stage in ("dp", "zero1", "zero2", "zero3")}
    assert got == pytest.approx({"dp": 120, "zero1": 31.40625, "zero2": 16.640625, "zero3": 1.875})
    sgd = memory_per_rank(1000, 4, "zero1", weight_bytes=4, state_bytes=STATE_BYTES["sgd_momentum_fp32"])
    assert sgd == {"parameters": 4000, "gradients": 4000, "optimizer": 1000, "total": 9000}
    assert memory_per_rank(1000, 1, "zero3") == memory_per_rank(1000, 1, "dp"), "one rank shards nothing"
    with pytest.raises(ValueError, match="zero1, zero2, zero3"):
        memory_per_rank(1000, 4, "zero4")


def test_the_meter_counts_nbytes_and_keeps_the_peak():
    m = MemoryMeter()
    a, b = np.zeros(10), np.zeros(30, dtype=np.float32)
    m.hold("parameters", "W", a)
    m.hold("activations", 1, b, b)
    m.free("activations", 1)
    m.hold("gradients", "g", a)
    assert m.now() == {"parameters": 80, "gradients": 80, "optimizer": 0, "activations": 0}
    assert m.peak == {"parameters": 80, "gradients": 0, "optimizer": 0, "activations": 240}
    assert m.most["gradients"] == 80 and m.most["activations"] == 240
    m.reset_peak()
    assert m.peak == m.now()
    with pytest.raises(ValueError, match="kind must be one of"):
        m.hold("weights", "W", a)


@pytest.mark.parametrize(("act", "cost"), COMBOS)
def test_accumulated_micro_batches_give_the_large_batchs_gradient(act, cost):
    params = mlp.init_params(SIZES, seed=1, dtype=np.float64)
    x, y = rng.random((13, 20)), rng.integers(0, 4, 13)
    want_loss, want = mlp.loss_and_grads(params, x, y, act, cost)
    for micro in (1, 3, 13, 20):  # uneven, one row each, more micro-batches than rows
        loss, got = accumulated_grads(params, x, y, micro, act, cost)
        assert loss == pytest.approx(want_loss, rel=1e-12)
        assert mlp.largest_difference(got, want) < 1e-14, micro


def _checkpointed(params, x, y, act, cost, every):
    """(gradients, activation bytes held at most) of backprop_layers keeping every ``every``-th input."""
    got, meter = {}, MemoryMeter()
    Y = mlp.targets(y, params[-1][0].shape[0], x.dtype)
    backprop_layers(lambda i: params[i], len(params), x, Y, act, cost, on_grad=lambda i, gW, gb: got.update({i: (gW, gb)}),
                    every=every, memory=meter)
    return [got[i] for i in range(len(params))], meter.most["activations"]


@pytest.mark.parametrize(("act", "cost"), COMBOS)
def test_checkpointing_gives_backprops_gradients_holding_fewer_activations(act, cost):
    for layers in (9, 16):
        params = mlp.init_params([8] * (layers + 1), seed=2, dtype=np.float64)
        x, y = rng.random((5, 8)), rng.integers(0, 8, 5)
        _, want = mlp.loss_and_grads(params, x, y, act, cost)
        held = {}
        for every in range(1, layers + 1):
            got, held[every] = _checkpointed(params, x, y, act, cost, every)
            assert mlp.largest_difference(got, want) < 1e-13, (layers, every)
        assert held[1] == (layers + 1) * x.nbytes, "plain backprop keeps the input and every layer's output"
        k = checkpoint_every(layers)
        assert k == round(layers ** 0.5) and held[k] == min(held.values()) and 2 * held[k] <= held[1], held
    with pytest.raises(ValueError, match="every must be >= 1"):
        _checkpointed(params, x, y, act, cost, 0)


@pytest.mark.parametrize("step_class", [Zero2, FullySharded])
def test_one_rank_steps_equal_serial_sgd(step_class):
    """On MPI.COMM_SELF, without mpiexec: three steps of SGD with momentum, the serial weights and losses."""
    x, y = rng.random((9, 20)), rng.integers(0, 4, 9)
    for act, cost in COMBOS:
        want, opt = mlp.init_params(SIZES, seed=1, dtype=np.float64), mlp.SGD(0.5, 0.9)
        params = mlp.init_params(SIZES, seed=1, dtype=np.float64)
        step = step_class(MPI.COMM_SELF, params, lr=0.5, momentum=0.9)
        for _ in range(3):
            want_loss, grads = mlp.loss_and_grads(want, x, y, act, cost)
            opt.step(want, grads)
            assert step.step(x, y, act, cost) == pytest.approx(want_loss, rel=1e-12)
        got = step.gather() if step_class is FullySharded else params
        assert mlp.largest_difference(got, want) < 1e-12
    with pytest.raises(ValueError, match="learning rate"):
        step_class(MPI.COMM_SELF, mlp.init_params(SIZES), lr=0.0)
