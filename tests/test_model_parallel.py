"""Model and pipeline parallelism under a real mpiexec, 1 to 4 ranks."""

import pytest
from conftest import ranks
from mpicases import mpi_cases

from labkit.model_parallel import partition_layers

test_model_parallel_equals_serial = mpi_cases("cases_model_parallel.py", ranks(1, 2, 3, 4))


def test_partition_layers_balances_work():
    assert partition_layers([784, 100, 10], 1) == [(0, 2)]
    assert partition_layers([784, 100, 10], 2) == [(0, 1), (1, 2)]
    # four equal layers and a tiny one: the tiny one rides along with a big one
    assert partition_layers([100, 100, 100, 100, 100, 2], 4) in ([(0, 1), (1, 2), (2, 3), (3, 5)],)
    with pytest.raises(ValueError, match="cannot split 2 layers into 3 stages"):
        partition_layers([784, 100, 10], 3)


def test_one_ranks_block_forward_and_backward_are_the_serial_layers_rows():
    """Lab 11's neuron_part and neuron_part_grads: the blocks side by side are the serial hidden layer, and each
    block's gradients are the serial gradient's rows, uneven splits and empty blocks included."""
    import numpy as np

    from labkit import mlp
    from labkit.model_parallel import neuron_part, neuron_part_grads
    from labkit.shards import shard_bounds

    rng = np.random.default_rng(1)
    for hidden, p in ((10, 3), (4, 4), (3, 5), (8, 1)):
        params = mlp.init_params([6, hidden, 4], seed=3, dtype=np.float64)
        (W1, b1), (W2, b2) = params
        x, y = rng.random((5, 6)), rng.integers(0, 4, 5)
        parts = [neuron_part(W1, b1, x, r, p, "sigmoid") for r in range(p)]
        assert [(lo, hi) for lo, hi, _ in parts] == shard_bounds(hidden, p)
        h = np.concatenate([part for _, _, part in parts], axis=1)
        np.testing.assert_allclose(h, mlp.sigmoid(x @ W1.T + b1))
        out = mlp.sigmoid(h @ W2.T + b2)
        delta = (out - mlp.targets(y, 4, np.float64)) * out * (1 - out) / len(x)  # quadratic cost, the mean
        (gW1, gb1), _ = mlp.backprop(params, x, y, "sigmoid", "quadratic")
        for lo, hi, part in parts:
            dW, db = neuron_part_grads(x, part, delta, W2, lo, hi, "sigmoid")
            np.testing.assert_allclose(dW, gW1[lo:hi], atol=1e-12)
            np.testing.assert_allclose(db, gb1[lo:hi], atol=1e-12)


def test_the_step_time_of_unequal_stages_and_the_schedule_of_equal_ones():
    """pipeline_step_time is the fill-drain flow shop: sum of the stages' times plus M - 1 times the slowest, for the
    forwards and the backwards each; with unit times it is the length of gpipe_schedule."""
    import numpy as np

    from labkit.model_parallel import gpipe_bubble, gpipe_schedule, pipeline_step_time

    rng = np.random.default_rng(2)
    for _ in range(20):
        S, M = int(rng.integers(1, 7)), int(rng.integers(1, 13))
        f, b = rng.uniform(0.1, 3, S), rng.uniform(0.1, 3, S)
        want = f.sum() + (M - 1) * f.max() + b.sum() + (M - 1) * b.max()
        assert abs(pipeline_step_time(f, b, M) - want) < 1e-9 * want
        forward, backward = gpipe_schedule(S, M)
        steps = 1 + max(forward.max(), backward.max())
        assert steps == pipeline_step_time(np.ones(S), np.ones(S), M) == 2 * (M + S - 1)
        assert abs(1 - 2 * M / steps - gpipe_bubble(S, M)) < 1e-12
