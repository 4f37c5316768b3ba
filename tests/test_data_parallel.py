"""Synchronous data parallelism under a real mpiexec, 1 to 4 ranks."""


import numpy as np
import pytest
from conftest import ranks, run_mpi_cases
from mpicases import mpi_cases

from labkit import mlp
from labkit.data_parallel import DataParallel
from labkit.device import gpu_status
from labkit.shards import flatten, unflatten

test_data_parallel_equals_serial = mpi_cases("cases_data_parallel.py", ranks(1, 2, 3, 4))


def _nccl_ready() -> tuple[bool, str]:
    ok, why = gpu_status()
    if not ok:
        return False, why
    from cupy.cuda import nccl

    return bool(getattr(nccl, "available", False)), "CuPy has no NCCL here"


@pytest.mark.skipif(gpu_status()[0], reason="checks the error without a GPU")
def test_nccl_without_a_gpu_is_a_clear_error():
    from mpi4py import MPI

    with pytest.raises(RuntimeError, match="allreduce='nccl' cannot start: rank 0: no usable GPU"):
        DataParallel(MPI.COMM_SELF, allreduce="nccl")


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.gpu
@pytest.mark.skipif(not _nccl_ready()[0], reason=_nccl_ready()[1])
def test_nccl_allreduce_and_data_parallel_on_gpus(n):
    """Against NumPy and the serial run where the machine has n GPUs; the one-GPU-per-rank error where it has fewer."""
    run_mpi_cases("cases_nccl.py", n)


def test_flatten_roundtrip_and_extra():
    g = mlp.init_params([5, 4, 3], dtype=np.float64)
    v = flatten(g, extra=(7.0,))
    assert v.shape == (5 * 4 + 4 + 4 * 3 + 3 + 1,) and v[-1] == 7.0
    for (a, b), (c, d) in zip(unflatten(v[:-1], g), g):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, d)


def test_bad_allreduce_names():
    from mpi4py import MPI

    with pytest.raises(ValueError, match="allreduce must be one of"):
        DataParallel(MPI.COMM_SELF, allreduce="tree")


def test_scaled_backprop_into_buffers_matches_reference():
    """The two hooks data parallelism uses: a different scale, and writing into given arrays."""
    from labkit import mlp as m

    rng = np.random.default_rng(0)
    params = m.init_params([6, 5, 3], dtype=np.float64)
    x, Y = rng.random((8, 6)), m.targets(rng.integers(0, 3, 8), 3, np.float64)
    _, want = m.loss_and_grads_unchecked(params, x, Y, "relu", "cross_entropy", 0.0)
    out = m.zeros_like(params)
    value, got = m.loss_and_grads_unchecked(params, x[:3], Y[:3], "relu", "cross_entropy", 0.0, scale=1 / 8, out=out)
    _, rest = m.loss_and_grads_unchecked(params, x[3:], Y[3:], "relu", "cross_entropy", 0.0, scale=1 / 8)
    for (a, b), (c, d), (e, f), (g, h) in zip(got, rest, want, out):
        assert a is g and b is h  # written into the given arrays
        np.testing.assert_allclose(a + c, e, rtol=1e-12)
        np.testing.assert_allclose(b + d, f, rtol=1e-12)


def test_ring_and_mpi_allreduce_in_place():
    from mpi4py import MPI

    from labkit import collectives

    x = np.arange(5.0)
    for fn in (collectives.ring_allreduce, collectives.mpi_allreduce):
        assert fn(MPI.COMM_SELF, x, out=x) is x
        out = np.empty_like(x)
        assert fn(MPI.COMM_SELF, x, out=out) is out and np.array_equal(out, x)
    with pytest.raises(ValueError, match="out must be"):
        collectives.ring_allreduce(MPI.COMM_SELF, x, out=np.empty(3))


test_data_parallel_exercise_check_under_mpiexec = mpi_cases("cases_dp_exercise.py", ranks(3, smoke=3))
