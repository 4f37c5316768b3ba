"""The CPU emulator itself: CUDA features it runs, the mistakes it reports, and what it refuses."""

import numpy as np
import pytest
from conftest import needs_cxx

from labkit.kernels import KernelCompileError, KernelError, UnsupportedFeature, load, tools

pytestmark = needs_cxx


def i32(v):
    return np.int32(v)


INDEX_SRC = r"""
extern "C" __global__ void where_am_i(int* out, int n)
{
    int tx = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int bx = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    int k = bx * blockDim.x * blockDim.y * blockDim.z + tx;
    if (k >= n) return;
    int* o = out + 8 * k;
    o[0] = blockIdx.x; o[1] = blockIdx.y; o[2] = blockIdx.z;
    o[3] = threadIdx.x; o[4] = threadIdx.y; o[5] = threadIdx.z;
    o[6] = blockDim.x * 100 + blockDim.y * 10 + blockDim.z;
    o[7] = gridDim.x * 100 + gridDim.y * 10 + gridDim.z;
}
"""


@pytest.mark.parametrize("checked", [False, True])
def test_three_dimensional_indices(checked):
    k = load(INDEX_SRC, backend="emulator", checked=checked).get_function("where_am_i")
    grid, block = (3, 2, 2), (4, 3, 2)
    n = 3 * 2 * 2 * 4 * 3 * 2
    out = np.zeros(8 * n, np.int32)
    k(grid, block, (out, i32(n)))
    want = [(bx, by, bz, tx, ty, tz, 432, 322) for bz in range(2) for by in range(2) for bx in range(3)
            for tz in range(2) for ty in range(3) for tx in range(4)]
    np.testing.assert_array_equal(out.reshape(n, 8), np.array(want))


SHARED_REVERSE = r"""
#define N 64
extern "C" __global__ void reverse_blocks(float* x)
{
    __shared__ float s[N];
    int t = threadIdx.x, base = blockIdx.x * N;
    s[t] = x[base + t];
    __syncthreads();
    x[base + t] = s[N - 1 - t];
}
"""


@pytest.mark.parametrize("checked", [False, True])
def test_shared_memory_and_barrier(checked):
    k = load(SHARED_REVERSE, backend="emulator", checked=checked).reverse_blocks
    x = np.arange(64 * 37, dtype=np.float32)
    k((37,), (64,), (x,))
    np.testing.assert_array_equal(x, np.arange(64 * 37, dtype=np.float32).reshape(37, 64)[:, ::-1].ravel())


def test_ucontext_fibers_give_the_same_result(monkeypatch):
    monkeypatch.setenv("LABKIT_EMU_UCONTEXT", "1")
    k = load(SHARED_REVERSE, backend="emulator", checked=False).reverse_blocks
    x = np.arange(64 * 5, dtype=np.float32)
    k((5,), (64,), (x,))
    np.testing.assert_array_equal(x, np.arange(64 * 5, dtype=np.float32).reshape(5, 64)[:, ::-1].ravel())


ATOMICS = r"""
extern "C" __global__ void count(const float* x, float* total, int* hits, unsigned int* uhits, int* biggest, int n)
{
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    atomicAdd(total, x[k]);
    atomicAdd(hits, 1);
    atomicAdd(uhits, 2u);
    atomicMax(biggest, k);
}
"""


def test_atomics_across_blocks_running_in_parallel(monkeypatch):
    monkeypatch.setenv("LABKIT_EMU_THREADS", "4")
    k = load(ATOMICS, backend="emulator", checked=False).count
    n = 200_000
    x = np.ones(n, np.float32) * 0.5
    total, hits, uhits, big = np.zeros(1, np.float32), np.zeros(1, np.int32), np.zeros(1, np.uint32), np.zeros(1, np.int32)
    k((n // 128 + 1,), (128,), (x, total, hits, uhits, big, i32(n)))
    assert total[0] == n * 0.5 and hits[0] == n and uhits[0] == 2 * n and big[0] == n - 1


def test_dynamic_shared_memory_and_constants():
    src = r"""
    __constant__ float scale[2];
    extern "C" __global__ void scaled_rev(const float* x, float* y, int n)
    {
        extern __shared__ float buf[];
        int t = threadIdx.x;
        buf[t] = x[blockIdx.x * blockDim.x + t];
        __syncthreads();
        y[blockIdx.x * blockDim.x + t] = buf[blockDim.x - 1 - t] * scale[0] + scale[1];
    }
    """
    for checked in (False, True):
        mod = load(src, backend="emulator", checked=checked)
        mod.set_constant("scale", np.array([2.0, 1.0], np.float32))
        x = np.arange(96, dtype=np.float32)
        y = np.zeros_like(x)
        mod.scaled_rev((3,), (32,), (x, y, i32(96)), shared_mem=32 * 4)
        np.testing.assert_array_equal(y, x.reshape(3, 32)[:, ::-1].ravel() * 2 + 1)
    with pytest.raises(ValueError, match="holds 8 bytes"):
        mod.set_constant("scale", np.zeros(3, np.float32))
    with pytest.raises(KeyError, match="no __constant__ 'shift'"):
        mod.set_constant("shift", 1.0)


def test_kernels_named_like_c_library_functions():
    """div and abs are C library functions too. As a kernel name div works on the emulator as on a GPU; abs is refused
    by a GPU's compiler (CUDA declares its own abs with C linkage), so load refuses it where NVRTC can say so, and only
    the emulator alone (gpu_check=False) runs it."""
    div = r"""
    extern "C" __global__ void div(const float* x, float* y, float d, int n)
    { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = x[i] / d; }
    """
    absolute = r"""
    extern "C" __global__ void abs(float* y, int n)
    { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = fabsf(y[i]); }
    """
    for checked in (False, True):
        x = np.arange(-40, 40, dtype=np.float32)
        y = np.zeros_like(x)
        load(div, backend="emulator", checked=checked).div((3,), (32,), (x, y, np.float32(2), i32(80)))
        load(absolute, backend="emulator", checked=checked, gpu_check=False).get_function("abs")((3,), (32,), (y, i32(80)))
        np.testing.assert_array_equal(y, np.abs(x / 2))
    if tools.compiler_for_check() is not None:
        with pytest.raises(KernelCompileError, match="a GPU's compiler refuses it(?s:.*)abs"):
            load(absolute, backend="emulator")


def test_shared_memory_limits_are_a_gpus():
    src = r"""
    extern "C" __global__ void fill(float* y)
    { extern __shared__ float buf[]; buf[threadIdx.x] = 1.0f; __syncthreads(); y[threadIdx.x] = buf[threadIdx.x]; }
    """
    mod = load(src, backend="emulator", checked=False)
    k = mod.get_function("fill")
    y = np.zeros(32, np.float32)
    k((1,), (32,), (y,), shared_mem=48 * 1024)  # within a GPU's default 48 KB
    for too_much in (100 * 1024, 2**45):
        with pytest.raises(ValueError, match="above 48 KB a GPU needs an opt-in first: kernel.max_dynamic_shared_size"):
            k((1,), (32,), (y,), shared_mem=too_much)
    k.max_dynamic_shared_size_bytes = 100 * 1024  # the opt-in, as with CuPy
    k((1,), (32,), (y,), shared_mem=100 * 1024)
    assert (y == 1).all()
    with pytest.raises(ValueError, match="more dynamic shared memory than this launch may use"):
        k((1,), (32,), (y,), shared_mem=101 * 1024)
    with pytest.raises(ValueError, match="between 0 and the device's"):
        k.max_dynamic_shared_size_bytes = 2**45


@pytest.mark.parametrize("checked", [False, True])
def test_static_shared_memory_over_48_kb_does_not_compile(checked):
    big = r"""
    extern "C" __global__ void big(float* y)
    {
        __shared__ float a[64][256];   // 64 KB alone
        __shared__ int flag[4];
        a[threadIdx.x][0] = 1.0f; flag[0] = 1; __syncthreads(); y[threadIdx.x] = a[threadIdx.x][0];
    }
    """
    with pytest.raises(KernelCompileError, match=r"kernel big: its __shared__ arrays \(a, flag\) need more than the 48 KB"):
        load(big, backend="emulator", checked=checked)
    fits = big.replace("[64][256]", "[32][256]")  # 32 KB + 16 bytes: fine
    y = np.zeros(32, np.float32)
    load(fits, backend="emulator", checked=checked).big((1,), (32,), (y,))
    assert (y == 1).all()


# -- mistakes it reports -------------------------------------------------------------------------

TILED = r"""
#define T 8
extern "C" __global__ void mm(const float* A, const float* B, float* C, int n)
{
    __shared__ float As[T][T];
    __shared__ float Bs[T][T];
    int r = blockIdx.y * T + threadIdx.y, c = blockIdx.x * T + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < n; t += T) {
        As[threadIdx.y][threadIdx.x] = (r < n && t + threadIdx.x < n) ? A[r * n + t + threadIdx.x] : 0.0f;
        Bs[threadIdx.y][threadIdx.x] = (c < n && t + threadIdx.y < n) ? B[(t + threadIdx.y) * n + c] : 0.0f;
        __syncthreads();
        for (int k = 0; k < T; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (r < n && c < n) C[r * n + c] = acc;
}
"""


def _run_tiled(src, checked=True, n=20):
    k = load(src, backend="emulator", checked=checked).mm
    a, b = np.ones((n, n), np.float32), np.ones((n, n), np.float32)
    c = np.zeros((n, n), np.float32)
    k((3, 3), (8, 8), (a, b, c, i32(n)))
    return c


def test_the_reference_tiled_kernel_is_right():
    np.testing.assert_array_equal(_run_tiled(TILED), np.full((20, 20), 20.0))


def test_out_of_bounds_global_read_is_reported_with_where():
    bad = TILED.replace("(r < n && t + threadIdx.x < n) ? A[r * n + t + threadIdx.x] : 0.0f", "A[r * n + t + threadIdx.x]")
    with pytest.raises(KernelError) as e:
        _run_tiled(bad)
    msg = str(e.value)
    assert "kernel 'mm'" in msg and "line 10" in msg and "'A' has 400 elements" in msg
    assert "block (" in msg and "thread (" in msg


def test_out_of_bounds_write_is_reported_before_it_happens():
    bad = TILED.replace("if (r < n && c < n) C[r * n + c] = acc;", "C[r * n + c] = acc;")
    with pytest.raises(KernelError, match=r"line 16: out-of-bounds access C\[\d+\]: 'C' has 400 elements"):
        _run_tiled(bad)


def test_out_of_bounds_shared_index_is_reported():
    bad = TILED.replace("acc += As[threadIdx.y][k]", "acc += As[threadIdx.y][k + 1]")
    with pytest.raises(KernelError, match=r"kernel 'mm', .*line 13: __shared__ array index 8 out of range \[0, 8\)"):
        _run_tiled(bad)


@pytest.mark.parametrize("checked", [False, True])
def test_barrier_some_threads_never_reach_is_reported_not_hung(checked):
    bad = TILED.replace("    float acc = 0.0f;", "    if (r >= n || c >= n) return;\n    float acc = 0.0f;")
    with pytest.raises(KernelError, match=r"waits at __syncthreads\(\) \(line 13\), but 32 of the block's 64 threads returned"):
        _run_tiled(bad, checked=checked)


def test_threads_at_different_barriers_are_reported():
    src = r"""
    extern "C" __global__ void split(float* x)
    {
        if (threadIdx.x < 16) { x[threadIdx.x] = 1.0f; __syncthreads(); }
        else { __syncthreads(); x[threadIdx.x] = 2.0f; }
    }
    """
    k = load(src, backend="emulator", checked=True).split
    with pytest.raises(KernelError, match=r"waits at the __syncthreads\(\) on line 5 while thread 0 of its block waits at the "
                                          r"one on line 4"):
        k((1,), (32,), (np.zeros(32, np.float32),))


def test_endless_loop_is_stopped_in_checked_mode():
    src = r"""
    extern "C" __global__ void spin(float* x, int n)
    {
        for (int i = 0; i < n; i += 0) x[0] += 1.0f;
    }
    """
    k = load(src, backend="emulator", checked=True).spin
    with pytest.raises(KernelError, match=r"still running after \d+\.\d s \(an endless loop\?\)"):
        k((1,), (1,), (np.zeros(1, np.float32), i32(1)), timeout_s=0.5)


def test_unsupported_features_are_named():
    src = r"""
    extern "C" __global__ void warp_sum(float* x)
    {
        float v = x[threadIdx.x];
        for (int o = 16; o > 0; o /= 2) v += __shfl_down(v, o);
        x[threadIdx.x] = v;
    }
    """
    with pytest.raises(UnsupportedFeature, match=r"line 5: __shfl_down is the form without a mask, which CUDA removed.*"
                                                 r"use __shfl_down_sync\(mask, ...\)"):
        load(src, backend="emulator")
    with pytest.raises(UnsupportedFeature, match=r"__match_any_sync is not supported on the emulator"):
        load('extern "C" __global__ void k(int* x) { x[0] = __match_any_sync(0xffffffff, x[0]); }', backend="emulator")
    with pytest.raises(UnsupportedFeature, match="#include is not supported"):
        load('#include <stdio.h>\nextern "C" __global__ void k(float* x) {}', backend="emulator")


def test_compile_errors_point_at_the_line():
    src = 'extern "C" __global__ void k(float* x)\n{\n    x[0] = undefined_name;\n}\n'
    with pytest.raises(KernelCompileError, match=r"kernel.cu:3:.*undefined_name"):
        load(src, backend="emulator")


@pytest.mark.parametrize("checked", [False, True])
def test_an_unclosed_bracket_is_a_compile_error_of_cuda(checked):
    """The shared scanner's own error comes back as the CUDA labs', whether the kernel's parameters or (read only
    when checked mode rewrites the source) its body is left open."""
    with pytest.raises(KernelCompileError, match=r"kernel.cu did not compile: unbalanced '\(' at line 1"):
        load('extern "C" __global__ void k(float* x, int n\n{\n    x[0] = 1.0f;\n}\n', backend="emulator", checked=checked)
    if checked:
        src = 'extern "C" __global__ void k(float* x)\n{\n    float* y = x + 1;\n    y[0] = 1.0f;\n'
        with pytest.raises(KernelCompileError, match=r"unbalanced '\{' at line 2"):
            load(src, backend="emulator", checked=True, gpu_check=False)


# -- the launch call checks its arguments ----------------------------------------------------------

ARGS = r"""
extern "C" __global__ void axpy(const float* x, float* y, float a, int n)
{
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n) y[k] += a * x[k];
}
"""


@pytest.fixture(scope="module")
def axpy():
    return load(ARGS, backend="emulator", checked=False).axpy


def test_launch_runs(axpy):
    x, y = np.ones(10, np.float32), np.ones(10, np.float32)
    axpy((1,), (32,), (x, y, np.float32(2.0), i32(10)))
    np.testing.assert_array_equal(y, 3.0)


@pytest.mark.parametrize("args,err,match", [
    (lambda x, y: (x, y, 2.0, i32(10)), TypeError, r"argument 2 \(float a\) needs a float32 .* got float: pass float32\(2.0\)"),
    (lambda x, y: (x, y, np.float32(2), 10), TypeError, r"argument 3 \(int n\) needs a int32"),
    (lambda x, y: (x, y, np.float64(2), i32(10)), TypeError, r"argument 2 \(float a\) needs a float32"),
    (lambda x, y: (x.astype(np.float64), y, np.float32(2), i32(10)), TypeError,
     r"argument 0 \(const float\* x\) points to float, but the array's dtype is float64"),
    (lambda x, y: (x, y[::2], np.float32(2), i32(5)), ValueError, r"argument 1 \(float\* y\) is not C-contiguous"),
    (lambda x, y: (x, y, np.float32(2)), TypeError, r"takes 4 arguments \(const float\* x, float\* y, float a, int n\), got 3"),
    (lambda x, y: (x, 1.0, np.float32(2), i32(10)), TypeError, r"argument 1 \(float\* y\) must be an array, got float"),
    (lambda x, y: (x, y, x, i32(10)), TypeError, r"argument 2 \(float a\) takes a single value, got an array"),
])
def test_launch_argument_errors(axpy, args, err, match):
    x, y = np.ones(10, np.float32), np.ones(10, np.float32)
    with pytest.raises(err, match=match):
        axpy((1,), (32,), args(x, y))


def test_read_only_array_for_a_written_pointer(axpy):
    x, y = np.ones(10, np.float32), np.ones(10, np.float32)
    y.flags.writeable = False
    with pytest.raises(ValueError, match=r"argument 1 \(float\* y\) is written by the function, but the array is read-only"):
        axpy((1,), (32,), (x, y, np.float32(1), i32(10)))


@pytest.mark.parametrize("grid,block,match", [
    ((1,), (1025,), "at most 1024 per block"), ((1,), (1, 1, 65), "block z is 65"), ((0,), (32,), "dimensions must be >= 1"),
    ((1, 2, 3, 4), (32,), "1 to 3 ints"), ((1,), (32.0,), "1 to 3 ints"),
])
def test_launch_shape_errors(axpy, grid, block, match):
    x, y = np.ones(10, np.float32), np.ones(10, np.float32)
    with pytest.raises((ValueError, TypeError), match=match):
        axpy(grid, block, (x, y, np.float32(1), i32(10)))


def test_unknown_kernel_name():
    mod = load(ARGS, backend="emulator")
    with pytest.raises(KeyError, match=r"has no kernel 'saxpy'; it has \['axpy'\]"):
        mod.get_function("saxpy")


# -- kernels that would take the notebook down: run in a child process in checked mode -------------

WILD = {
    "a pointer made from a number": "((float*)0x10)[0] = 1.0f;",
    "an index far out of bounds through a pointer of its own": "float* q = &x[0]; q[i + 100000000] = 1.0f;",
    "an index far out of bounds through an int cast": "float* q = (float*)(long long)x; q[i + 100000000] = 1.0f;",
    "unbounded recursion": "y[i] = deep(i);",
}


@pytest.mark.parametrize("what", list(WILD))
def test_a_wild_kernel_is_an_error_not_a_dead_process(what):
    src = r"""
    __device__ float deep(int n) { volatile float pad[64]; pad[0] = n; return pad[0] + deep(n + 1); }
    extern "C" __global__ void wild(float* x, float* y)
    { int i = threadIdx.x; BODY }
    """.replace("BODY", WILD[what])
    mod = load(src, backend="emulator", checked=True)
    x, y = np.arange(32, dtype=np.float32), np.full(32, 7.0, np.float32)
    with pytest.raises(KernelError, match=r"kernel 'wild' crashed the emulator \(block \(0,0,0\), thread \(\d+,0,0\)\) "
                                          "with a segmentation fault"):
        mod.wild((1,), (32,), (x, y))
    assert (y == 7).all() and (x == np.arange(32)).all()  # the arrays are as before the launch
    ok = load("extern \"C\" __global__ void one(float* y) { y[threadIdx.x] = 1.0f; }", backend="emulator")
    ok.one((1,), (32,), (y,))  # and this process goes on launching kernels
    assert (y == 1).all()


def test_an_endless_loop_without_arrays_or_barriers_is_stopped_from_outside(monkeypatch):
    monkeypatch.setenv("LABKIT_KERNEL_TIMEOUT", "1")
    src = 'extern "C" __global__ void spin(int* out) { int k = 0; while (true) { k++; } out[0] = k; }'
    mod = load(src, backend="emulator", checked=True)
    out = np.zeros(1, np.int32)
    import time

    t0 = time.monotonic()
    with pytest.raises(KernelError, match="ran past the 1 s limit"):
        mod.spin((1,), (1,), (out,))
    assert time.monotonic() - t0 < 10


def test_a_huge_grid_is_stopped_by_the_time_limit(monkeypatch):
    monkeypatch.setenv("LABKIT_KERNEL_TIMEOUT", "1")
    src = 'extern "C" __global__ void many(float* y) { if (blockIdx.x == 0 && threadIdx.x == 0) y[0] += 1.0f; }'
    mod = load(src, backend="emulator", checked=True)
    y = np.zeros(1, np.float32)
    with pytest.raises(KernelError, match="limit"):
        mod.many((2**31 - 1,), (1,), (y,))


def test_ctrl_c_stops_a_running_kernel():
    import signal
    import time

    src = 'extern "C" __global__ void spin(int* out) { int k = 0; while (true) { k++; } out[0] = k; }'
    mod = load(src, backend="emulator", checked=True)

    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            mod.spin((1,), (1,), (np.zeros(1, np.int32),), timeout_s=0)  # no limit: only the interrupt ends it
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert time.monotonic() - t0 < 5


def test_checked_mode_follows_pointers_made_from_arguments():
    """`float* q = x + off;` keeps x's bounds in checked mode: writing past x through q is reported with its line,
    not a silent write into the neighbouring array."""
    src = r"""
    extern "C" __global__ void shifted(float* x, float* y, int n)
    {
        int t = threadIdx.x;
        const float* src = y;
        float* q = x + 1;
        q[t] = src[t] * 2.0f;   // line 7: thread n - 1 writes x[n]
    }
    """
    mod = load(src, backend="emulator", checked=True)
    x, y = np.zeros(8, np.float32), np.arange(8, dtype=np.float32)
    with pytest.raises(KernelError, match=r"thread \(7,0,0\), line 7: out-of-bounds access x\[8\]: 'x' has 8 elements"):
        mod.shifted((1,), (8,), (x, y, i32(8)))
    fine = np.zeros(9, np.float32)
    mod.shifted((1,), (8,), (fine, y, i32(8)))  # with room for the shift it runs, and computes the same as before
    np.testing.assert_array_equal(fine[1:], y * 2)
