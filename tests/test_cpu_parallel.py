import os
import signal

import numpy as np
import pytest

from labkit import cpu_parallel as cp
from labkit import mlp
from labkit.shards import shard_bounds


def problem(sizes=(20, 16, 10), batch=23, seed=0):
    rng = np.random.default_rng(seed)
    params = mlp.init_params(list(sizes), seed=seed, dtype=np.float64)
    return params, rng.standard_normal((batch, sizes[0])), rng.integers(0, sizes[-1], batch)


def assert_same(got, want, rtol=1e-6):
    (lg, gg), (lw, gw) = got, want
    assert lg == pytest.approx(lw, rel=rtol)
    for (a, b), (c, d) in zip(gg, gw):
        np.testing.assert_allclose(a, c, rtol=rtol, atol=1e-10)
        np.testing.assert_allclose(b, d, rtol=rtol, atol=1e-10)


@pytest.mark.parametrize("n,parts", [(10, 3), (3, 5), (0, 2), (12, 4), (1, 1)])
def test_shard_bounds_floor_plus_remainder(n, parts):
    b = shard_bounds(n, parts)
    sizes = [hi - lo for lo, hi in b]
    assert len(b) == parts and sum(sizes) == n and b[0][0] == 0 and b[-1][1] == n
    assert all(b[i][1] == b[i + 1][0] for i in range(parts - 1))
    assert sizes == [n // parts + (1 if k < n % parts else 0) for k in range(parts)]


@pytest.mark.parametrize("combine", cp.ThreadedBackprop.COMBINES)
@pytest.mark.parametrize("work", cp.ThreadedBackprop.WORK)
@pytest.mark.parametrize("n_threads", [1, 3, 30])  # 30 threads for 23 samples: some get none
def test_threads_match_reference(combine, work, n_threads):
    params, x, y = problem()
    with cp.ThreadedBackprop(n_threads, combine, work) as f:
        assert_same(f(params, x, y, activation="relu", cost="cross_entropy", l2=0.01),
                    mlp.loss_and_grads(params, x, y, "relu", "cross_entropy", 0.01))


def test_thread_errors_surface():
    params, x, y = problem()
    with cp.ThreadedBackprop(2, "queue") as f:
        with pytest.raises(ValueError, match="x has 5 features"):
            f(params, x[:, :5], y)
    with pytest.raises(ValueError, match="combine must be one of"):
        cp.ThreadedBackprop(2, "atomic")


def test_threads_train_like_vectorised(digits):
    (x, y), _ = digits
    runs = []
    for method in ("vectorised", cp.ThreadedBackprop(2, "local")):
        params = mlp.init_params([784, 12, 10], dtype=np.float64)
        mlp.train(params, (x[:300], y[:300]), epochs=1, batch_size=20, lr=1.0, method=method)
        runs.append(params)
    for (a, _), (b, _) in zip(*runs):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("work", cp.ThreadedBackprop.WORK)
def test_processes_match_reference(work):
    params, x, y = problem(batch=23)
    with cp.ProcessBackprop([20, 16, 10], n_procs=3, max_batch=32, dtype=np.float64, work=work) as f:
        assert_same(f(params, x, y, activation="sigmoid", cost="quadratic", l2=0.1),
                    mlp.loss_and_grads(params, x, y, "sigmoid", "quadratic", 0.1))
        assert_same(f(params, x[:2], y[:2]), mlp.loss_and_grads(params, x[:2], y[:2]))  # fewer samples than workers


def test_processes_answer_past_the_1024th_file_descriptor():
    """A long session (or test run) holds many files: the pool's sockets then get numbers select() cannot watch."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this process may open at most {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200) if hard == resource.RLIM_INFINITY else hard, hard))
    held = []
    try:
        while len(held) < 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        params, x, y = problem(batch=6)
        with cp.ProcessBackprop([20, 16, 10], n_procs=2, max_batch=8, dtype=np.float64) as f:
            assert_same(f(params, x, y), mlp.loss_and_grads(params, x, y))
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_processes_bad_input_and_closed_pool():
    params, x, y = problem(batch=8)
    f = cp.ProcessBackprop([20, 16, 10], n_procs=2, max_batch=4, dtype=np.float64)
    try:
        with pytest.raises(ValueError, match="exceeds max_batch=4"):
            f(params, x, y)
        with pytest.raises(ValueError, match="built for"):
            f(mlp.init_params([20, 8, 10], dtype=np.float64), x[:4], y[:4])
    finally:
        f.close()
    f.close()  # twice is fine
    with pytest.raises(cp.WorkerError, match="not running"):
        f(params, x[:4], y[:4])


def test_dead_worker_is_reported_not_hung():
    params, x, y = problem(batch=8)
    f = cp.ProcessBackprop([20, 16, 10], n_procs=2, max_batch=8, dtype=np.float64, timeout=20)
    os.kill(f._procs[1].pid, signal.SIGKILL)
    f._procs[1].wait()
    with pytest.raises(cp.WorkerError, match=r"worker\(s\) \[1\] died"):
        f(params, x, y)
    assert not f._procs  # closed and cleaned up


def test_worker_exception_is_reported():
    params, x, y = problem(batch=8)
    with cp.ProcessBackprop([20, 16, 10], n_procs=2, max_batch=8, dtype=np.float64) as f:
        with pytest.raises(cp.WorkerError, match="(?s)worker 0 failed during a step.*ValueError"):
            f._socks[0].sendall(b'["step", 0]\n')  # a malformed message: the worker answers with its traceback
            f._recv(0, "a step")


def test_time_per_batch_positive():
    params, x, y = problem()
    assert cp.time_per_batch(mlp.loss_and_grads, params, x, y, repeat=2) > 0


def test_the_cores_free_for_threads_are_what_other_work_leaves_them():
    """cores_free measures what the threads got, so it falls when a busy loop runs on every core beside them."""
    import subprocess
    import sys

    from labkit.machine import cores_free, cores_reading, usable_cores

    n = usable_cores()
    assert 0 < cores_free(1) <= 1 and 0 < cores_free(n) <= n
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        crowded = cores_free(n, seconds=0.5)
    finally:
        for b in busy:
            b.kill()
            b.wait()
    if n >= 2:  # a fair scheduler shares each core between a thread and a busy loop
        assert crowded < 0.85 * n, crowded
    said = cores_reading(2, 1.3, 1.2)
    assert said.startswith("1.3 of") and "the limit was 1.3x" in said and "92% of it" in said
    assert "free for 4 ranks this run, so the limit was 1.3x" in cores_reading(4, 1.3, 0.9, "ranks")


def test_the_width_sweep_counts_the_cores_the_two_threads_kept_busy(digits):
    from labkit.machine import usable_cores

    (x, y), _ = digits
    sweep = cp.two_worker_speedups([30], x[:20], y[:20], repeat=1)
    kept = sweep[cp.CORES_KEPT]
    # CPU seconds over wall seconds: some work was done, and never by more threads at once than there are cores
    assert len(kept) == 1 and 0 < kept[0] <= usable_cores() + 0.25, kept
    assert set(sweep) == {"threads (2), per-sample", "processes (2), per-sample", cp.CORES_KEPT}
