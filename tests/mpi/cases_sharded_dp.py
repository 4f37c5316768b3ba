"""ZeRO-2 and fully sharded steps equal the serial step; their memory and bytes sent are counted exactly.

Run: mpiexec -n 4 python -m mpi4py tests/mpi/cases_sharded_dp.py [-k NAME]   (prints "OK <p>" on rank 0)
The exact counts hold at 1, 2 and 4 ranks, which split every layer of SIZES evenly.
"""

import numpy as np
from _cases import case, run_cases
from mpi4py import MPI

from labkit import mlp
from labkit.collectives import ring_allreduce
from labkit.data_parallel import ring_reduce_scatter
from labkit.sharded_dp import FullySharded, Zero2, memory_per_rank, ring_allgather
from labkit.shards import flatten, shard_bounds
from labkit.traffic import TrafficComm

comm = MPI.COMM_WORLD
p, r = comm.Get_size(), comm.Get_rank()
SIZES = [20, 16, 8, 4]  # each layer's 336, 136 and 36 values split evenly over 1, 2 and 4 ranks
PSI = 336 + 136 + 36
COMBOS = [("relu", "cross_entropy"), ("sigmoid", "quadratic")]
rng = np.random.default_rng(0)
x = rng.random((11, 20))
y = rng.integers(0, 4, 11)


def _serial(steps: int, batch: int, act: str, cost: str):
    """The weights and losses of ``steps`` serial steps on the whole batch."""
    params, opt, losses = mlp.init_params(SIZES, seed=1, dtype=np.float64), mlp.SGD(0.5, 0.9), []
    for _ in range(steps):
        value, grads = mlp.loss_and_grads(params, x[:batch], y[:batch], act, cost)
        opt.step(params, grads)
        losses.append(value)
    return params, losses


def _same_on_every_rank(params, what: str) -> None:
    everyone = comm.allgather(flatten(params).tobytes())
    assert all(e == everyone[0] for e in everyone), f"{what}: ranks disagree"


def _equal_to_serial_case(step_class):
    @case(f"{step_class.__name__} equals the serial step")
    def _():
        for batch in (11, 3):  # 3 < 4 ranks: a rank with no rows still takes part in every collective
            for act, cost in COMBOS:
                want, want_losses = _serial(3, batch, act, cost)
                params = mlp.init_params(SIZES, seed=1, dtype=np.float64)
                step = step_class(comm, params, lr=0.5, momentum=0.9)
                losses = [step.step(x[:batch], y[:batch], act, cost) for _ in range(3)]
                got = step.gather() if step_class is FullySharded else params
                what = f"{step_class.__name__}, batch {batch}, {act}, {cost}"
                assert mlp.largest_difference(got, want) < 1e-12, what
                np.testing.assert_allclose(losses, want_losses, rtol=1e-12, err_msg=what)
                _same_on_every_rank(got, what)


_equal_to_serial_case(Zero2)
_equal_to_serial_case(FullySharded)


@case("the ring's two halves make an allreduce")
def _():  # lengths shorter than, equal to and longer than the rank count
    for n in (1, p, 2 * p + 1, 101):
        a = np.random.default_rng(r).standard_normal(n)
        want = np.empty_like(a)
        comm.Allreduce(a, want)
        flat = np.empty(n)
        lo, hi = shard_bounds(n, p)[(r + 1) % p]  # where the reduce-scatter leaves the finished chunk
        flat[lo:hi] = ring_reduce_scatter(comm, a)
        np.testing.assert_allclose(ring_allgather(comm, flat), want, rtol=1e-12, err_msg=f"n={n}")


@case("held between steps: ZeRO's formula, counted")
def _():  # float64 weights and gradients, K = 8 bytes of momentum
    for step_class, stage in ((Zero2, "zero2"), (FullySharded, "zero3")):
        step = step_class(comm, mlp.init_params(SIZES, seed=1, dtype=np.float64), lr=0.5, momentum=0.9)
        step.step(x, y, "relu", "cross_entropy")
        want = memory_per_rank(PSI, p, stage, weight_bytes=8, state_bytes=8)
        kept = {kind: want[kind] for kind in ("parameters", "gradients", "optimizer")}
        assert step.memory.now() == {**kept, "activations": 0}, (stage, step.memory.now(), want)


@case("FSDP holds one layer whole beside its shards")
def _():
    step = FullySharded(comm, mlp.init_params(SIZES, seed=1, dtype=np.float64), lr=0.5, momentum=0.9)
    step.step(x, y, "relu", "cross_entropy")
    largest = (20 * 16 + 16) * 8
    assert step.memory.most["parameters"] == PSI * 8 // p + largest, step.memory.most
    assert step.memory.most["gradients"] == PSI * 8 // p + largest, "a layer's gradient is whole until reduce-scattered"
    zero2 = Zero2(comm, mlp.init_params(SIZES, seed=1, dtype=np.float64), lr=0.5, momentum=0.9)
    zero2.step(x, y, "relu", "cross_entropy")
    assert zero2.memory.most["parameters"] == zero2.memory.most["gradients"] == PSI * 8


@case("bytes sent: ZeRO-2 as the allreduce, FSDP 1.5x")
def _():
    sent = {}
    for name, step_class in (("zero2", Zero2), ("fsdp", FullySharded)):
        traffic = TrafficComm(comm)
        step_class(traffic, mlp.init_params(SIZES, seed=1, dtype=np.float64), lr=0.5, momentum=0.9).step(x, y)
        sent[name] = sum(b for _, _, b, _ in traffic.log)
    traffic = TrafficComm(comm)
    ring_allreduce(traffic, np.zeros(PSI), check=False)  # plain data parallelism's allreduce of the gradient
    dp = sum(b for _, _, b, _ in traffic.log)
    assert dp == 2 * (p - 1) * PSI * 8 // p, dp
    assert sent["zero2"] == dp and 2 * sent["fsdp"] == 3 * dp, (sent, dp)


run_cases(comm)
