"""Neuron-parallel and pipeline-parallel gradients equal serial backprop, on every rank.

Run: mpiexec -n 3 python -m mpi4py tests/mpi/cases_model_parallel.py [-k NAME]   (prints "OK <p>" on rank 0)
"""

import numpy as np
from _cases import case, run_cases
from mpi4py import MPI

from labkit import mlp
from labkit.model_parallel import NeuronParallel, Pipeline, gpipe_bubble

comm = MPI.COMM_WORLD
p, r = comm.Get_size(), comm.Get_rank()
rng = np.random.default_rng(0)
COMBOS = [("sigmoid", "quadratic"), ("relu", "cross_entropy")]


def close(a, b, what):
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12, err_msg=what)


@case("neuron parallel equals serial")
def _():  # hidden widths divisible, not divisible, and narrower than the rank count
    for hidden in (12, 10, 3):
        sizes = [7, hidden, 4]
        x, y = rng.random((9, 7)), rng.integers(0, 4, 9)
        for act, cost in COMBOS:
            npar = NeuronParallel(comm, sizes, seed=2, dtype=np.float64)
            full = mlp.init_params(sizes, seed=2, dtype=np.float64)
            want_loss, want = mlp.loss_and_grads(full, x, y, act, cost)
            loss, (g1, g2) = npar.loss_and_grads(x, y, act, cost)
            what = f"neuron-parallel hidden={hidden} {act} {cost}"
            assert abs(loss - want_loss) < 1e-12, what
            close(g1[0], want[0][0][npar.lo:npar.hi], what)
            close(g1[1], want[0][1][npar.lo:npar.hi], what)
            close(g2[0], want[1][0], what)
            close(g2[1], want[1][1], what)
            for _ in range(3):  # a few SGD steps stay equal to serial ones
                _, g = npar.loss_and_grads(x, y, act, cost)
                npar.step(g, 0.5)
                mlp.SGD(0.5).step(full, mlp.backprop(full, x, y, act, cost))
            for (a, b), (c, d) in zip(npar.gather(), full):
                close(a, c, what + " after steps")
                close(b, d, what + " after steps")


@case("pipeline equals serial")
def _():  # stages of one or more layers, micro-batches dividing the batch or not
    sizes = [12, 10, 8, 6, 4]
    if p <= len(sizes) - 1:
        x, y = rng.random((11, 12)), rng.integers(0, 4, 11)
        for act, cost in COMBOS:
            for m in (1, 3, 5, 20):
                pipe = Pipeline(comm, sizes, seed=5, dtype=np.float64)
                full = mlp.init_params(sizes, seed=5, dtype=np.float64)
                want_loss, want = mlp.loss_and_grads(full, x, y, act, cost)
                loss, grads = pipe.loss_and_grads(x, y, micro_batches=m, activation=act, cost=cost)
                lo, hi = pipe.stages[r]
                what = f"pipeline p={p} m={m} {act} {cost}"
                for (a, b), (c, d) in zip(grads, want[lo:hi]):
                    close(a, c, what)
                    close(b, d, what)
                if r == p - 1:
                    assert abs(loss - want_loss) < 1e-12, what
                ev = pipe.timeline.events
                assert len(ev) == 2 * min(m, 11) * p and set(ev[:, 1]) == {0, 1}, what
                assert 0 <= pipe.timeline.bubble() < 1, what
            pipe.step(grads, 0.1)
            mlp.SGD(0.1).step(full, want)
            for (a, b), (c, d) in zip(pipe.gather(), full):
                close(a, c, "pipeline after a step")
                close(b, d, "pipeline after a step")


@case("the bubble formula")
def _():
    assert gpipe_bubble(4, 4) == 3 / 7 and gpipe_bubble(1, 8) == 0


run_cases(comm)
