"""The emulator's memory counts (labkit.kernels.counts.traffic) on kernels whose counts are known by hand: requests,
32-byte sectors per request, loads per thread, shared-memory wavefronts and bank conflicts."""

import numpy as np
import pytest
from conftest import needs_cxx

from labkit.kernels import load
from labkit.kernels.counts import FIELDS, traffic

pytestmark = needs_cxx

COPIES = r"""
extern "C" __global__ void copy_coalesced(const float* in, float* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}
extern "C" __global__ void copy_strided(const float* in, float* out, int n)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    int i = (t % 32) * 32 + t / 32;  // lane j of a warp reads element 32 j (+ its warp): a float per 128-byte line
    if (t < n) out[i] = in[i];
}
extern "C" __global__ void copy_pairs(const double* in, double* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}
extern "C" __global__ void every_other(const float* in, float* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (2 * i < n) out[i] = in[2 * i];
}
"""


def i32(v):
    return np.int32(v)


@pytest.mark.parametrize("kernel, dtype, sectors", [
    ("copy_coalesced", np.float32, 4),   # 32 floats, 128 bytes
    ("copy_strided", np.float32, 32),    # a sector per lane
    ("copy_pairs", np.float64, 8),       # 32 doubles, 256 bytes
])
def test_sectors_per_request_of_a_copy(kernel, dtype, sectors):
    n = 1024
    x = np.arange(n, dtype=dtype)
    y = np.zeros_like(x)
    t = traffic(COPIES, kernel, (n // 128,), (128,), (x, y, i32(n)))
    np.testing.assert_array_equal(np.sort(y), x)  # the launch did its work
    assert t.global_loads == t.global_stores == n
    assert t.total("load_requests") == t.total("store_requests") == n // 32
    assert t.sectors_per_load == t.sectors_per_store == sectors
    assert t.warps.shape == (n // 128, 4, len(FIELDS))
    assert (t.thread_loads == 1).all() and t.thread_loads.shape == (1, 1, n // 128, 1, 1, 128)
    assert t.total("shared_requests") == 0 and t.bank_conflicts == 0


def test_a_stride_of_two_floats_touches_twice_the_sectors():
    n = 2048
    x, y = np.arange(n, dtype=np.float32), np.zeros(n // 2, np.float32)
    t = traffic(COPIES, "every_other", (n // 2 // 128,), (128,), (x, y, i32(n)))
    assert t.sectors_per_load == 8 and t.sectors_per_store == 4


MATMUL = r"""
#define TILE 16
extern "C" __global__ void naive(const float* A, const float* B, float* C, int n)
{
    int row = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
    float acc = 0.0f;
    for (int k = 0; k < n; ++k) acc += A[row * n + k] * B[k * n + col];
    C[row * n + col] = acc;
}
extern "C" __global__ void tiled(const float* A, const float* B, float* C, int n)
{
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int ty = threadIdx.y, tx = threadIdx.x;
    int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int t = 0; t < n; t += TILE) {
        As[ty][tx] = A[row * n + t + tx];
        Bs[ty][tx] = B[(t + ty) * n + col];
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    C[row * n + col] = acc;
}
"""


def test_matmul_reads_per_thread_naive_against_tiled():
    """Each thread of the naive kernel reads 2n values; of the tiled one 2n / TILE. In the tiled kernel's inner
    product a warp (two rows of 16 threads) reads As[ty][k] at two addresses (a broadcast each) and Bs[k][tx] at 16
    words in 16 banks, read by both rows: one wavefront each, no conflicts."""
    n, tile = 64, 16
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    grid, block = (n // tile, n // tile), (tile, tile)
    for name, per_thread in (("naive", 2 * n), ("tiled", 2 * n // tile)):
        c = np.zeros((n, n), np.float32)
        t = traffic(MATMUL, name, grid, block, (a, b, c, i32(n)))
        np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
        assert (t.thread_loads == per_thread).all(), name
        assert (t.thread_stores == 1).all()
        assert t.thread_loads.shape == (1, n // tile, n // tile, 1, tile, tile)
    shared_reads = (n // tile) * 2 * tile  # per warp: per tile step, TILE products of two shared reads
    warps = (n // tile) ** 2 * tile * tile // 32
    assert t.total("shared_requests") == warps * (2 * (n // tile) + shared_reads)
    assert t.bank_conflicts == 0


TRANSPOSE = r"""
#define PAD 0
extern "C" __global__ void transpose(const float* in, float* out, int n)
{
    __shared__ float tile[32][32 + PAD];
    int x = blockIdx.x * 32 + threadIdx.x, y = blockIdx.y * 32 + threadIdx.y;
    tile[threadIdx.y][threadIdx.x] = in[y * n + x];
    __syncthreads();
    x = blockIdx.y * 32 + threadIdx.x;
    y = blockIdx.x * 32 + threadIdx.y;
    out[y * n + x] = tile[threadIdx.x][threadIdx.y];
}
extern "C" __global__ void broadcast(const float* in, float* out)
{
    __shared__ float s[64];
    s[threadIdx.x] = in[threadIdx.x];
    __syncthreads();
    out[threadIdx.x] = s[0] + s[threadIdx.x & 1];
}
"""


@pytest.mark.parametrize("pad, conflicts", [(0, 31), (1, 0)])
def test_bank_conflicts_of_a_shared_memory_transpose(pad, conflicts):
    """A column of a 32 x 32 float tile lies in one bank: reading it is 32 wavefronts, 31 conflicts per request. One
    float of padding per row spreads the column over all 32 banks."""
    n = 64
    x = np.arange(n * n, dtype=np.float32)
    y = np.zeros_like(x)
    t = traffic(TRANSPOSE.replace("#define PAD 0", f"#define PAD {pad}"), "transpose", (2, 2), (32, 32), (x, y, i32(n)))
    np.testing.assert_array_equal(y.reshape(n, n), x.reshape(n, n).T)
    requests = 2 * 4 * 32  # a store and a load per warp, 32 warps a block, 4 blocks
    assert t.total("shared_requests") == requests
    assert t.bank_conflicts == (requests // 2) * conflicts
    assert t.sectors_per_load == t.sectors_per_store == 4


@pytest.mark.parametrize("width", [32, 33, 34, 40, 48, 64])
def test_tile_column_conflicts_against_the_banks_of_a_column(width):
    """Lab 05's counted figure: lane i of a warp reads word i * width of the tile; the words in the busiest of the 32
    banks, less one, are the conflicts (NumPy's count of the same)."""
    from labkit.kernels.counts import tile_column_conflicts

    banks = np.arange(32) * width % 32
    assert tile_column_conflicts(width) == np.bincount(banks, minlength=32).max() - 1
    with pytest.raises(ValueError, match="at least 32"):
        tile_column_conflicts(16)


def test_a_broadcast_is_no_conflict():
    x, y = np.ones(64, np.float32), np.zeros(64, np.float32)
    t = traffic(TRANSPOSE, "broadcast", (1,), (64,), (x, y))
    assert t.total("shared_requests") == 3 * 2 and t.bank_conflicts == 0  # s[0], s[0 or 1]: one or two words
    assert (y == 2).all()


KINDS = r"""
extern "C" __global__ void kinds(const float* x, float* y, float* total)
{
    int i = threadIdx.x;
    y[i] += x[i];                 // a load and a store of y
    y[i]++;                       // again
    atomicAdd(total, __ldg(&x[i]));  // a load of x; the atomic is not a load or a store
    atomicAdd(&total[0], 1.0f);
}
"""


def test_loads_and_stores_are_told_apart():
    x, y, total = np.ones(32, np.float32), np.zeros(32, np.float32), np.zeros(1, np.float32)
    t = traffic(KINDS, "kinds", (1,), (32,), (x, y, total))
    assert (y == 2).all() and total[0] == 64
    assert t.total("load_requests") == 4 and t.total("store_requests") == 2
    assert (t.thread_loads == 4).all() and (t.thread_stores == 2).all()


def test_a_partial_warp_is_counted_as_its_lanes():
    n = 48
    x, y = np.arange(n, dtype=np.float32), np.zeros(n, np.float32)
    t = traffic(COPIES, "copy_coalesced", (1,), (n,), (x, y, i32(n)))
    assert t.warps.shape == (1, 2, len(FIELDS))
    assert list(t.warps[0, :, FIELDS.index("load_sectors")]) == [4, 2]


def test_counting_is_compiled_only_when_asked():
    module = load(COPIES, backend="emulator")
    with pytest.raises(RuntimeError, match="not compiled for counting"):
        module.count_into(np.zeros(1, np.uint32), np.zeros(1, np.uint32), np.zeros((1, len(FIELDS)), np.uint64))


ATOMICS = r"""
extern "C" __global__ void histogram(const int* keys, int* bins, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&bins[keys[i]], 1);
}
extern "C" __global__ void shared_count(float* out)
{
    __shared__ int hits[2];
    if (threadIdx.x < 2) hits[threadIdx.x] = 0;
    __syncthreads();
    atomicAdd(&hits[threadIdx.x % 2], 1);
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(out, (float)hits[0]);
}
"""


def test_atomics_are_counted_with_the_most_on_one_address():
    keys = np.array([i % 4 if i < 200 else 3 for i in range(256)], np.int32)  # bin 3: 50 + 56 keys
    bins = np.zeros(4, np.int32)
    t = traffic(ATOMICS, "histogram", (4,), (64,), (keys, bins, i32(256)))
    assert list(bins) == [50, 50, 50, 106]
    assert t.atomics == 256 and t.atomics_max_per_address == 106 and t.barriers == 0
    assert t.flops is None  # not counted: a model's caller declares them


def test_shared_atomics_count_per_block_and_barriers_per_block_and_barrier():
    out = np.zeros(1, np.float32)
    t = traffic(ATOMICS, "shared_count", (3,), (64,), (out,))
    assert out[0] == 3 * 32
    # each block: 64 atomics on its own hits (32 on each word), 1 on out; 2 barriers
    assert t.atomics == 3 * 65 and t.atomics_max_per_address == 32 and t.barriers == 3 * 2


def test_barriers_of_a_tiled_matmul_and_a_tree():
    n = 64
    a, b, c = np.ones((n, n), np.float32), np.ones((n, n), np.float32), np.zeros((n, n), np.float32)
    t = traffic(MATMUL, "tiled", (n // 16, n // 16), (16, 16), (a, b, c, i32(n)))
    assert (c == n).all()
    assert t.barriers == 16 * (n // 16) * 2 and t.atomics == 0  # 16 blocks, 2 barriers per step of 16
    x, out = np.ones(1000, np.float32), np.zeros(1, np.float32)
    t = traffic("reduce", "sum_reduce", (3,), (256,), (x, out, i32(1000)))
    assert out[0] == 1000
    assert t.barriers == 3 * (1 + 8) and t.atomics == t.atomics_max_per_address == 3  # a store, then log2(256) levels
