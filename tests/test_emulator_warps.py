"""Warps on the emulator: every warp intrinsic against the NumPy warp of labkit.kernels.warp (and against a GPU where
one is lent), and the mistakes with masks that are reported with the kernel, warp and line."""

import numpy as np
import pytest
from conftest import needs_cxx

from labkit.device import gpu_status
from labkit.kernels import KernelError, load
from labkit.kernels import warp as W

pytestmark = needs_cxx

GPU = gpu_status()[0]
BACKENDS = [pytest.param(("emulator", False), id="emulator"), pytest.param(("emulator", True), id="checked"),
            pytest.param(("cupy", False), id="cuda", marks=[pytest.mark.gpu,
                                                            pytest.mark.skipif(not GPU, reason="no usable CUDA GPU")])]
TYPES = {"float": np.float32, "double": np.float64, "int": np.int32, "unsigned long long": np.uint64}
FN = {"idx": "__shfl_sync", "up": "__shfl_up_sync", "down": "__shfl_down_sync", "xor": "__shfl_xor_sync"}


def mod(src, backend):
    name, checked = backend
    return load(src, backend=name, checked=checked)


def shuffles_source():
    out = []
    for kind, fn in FN.items():
        for ctype in TYPES:
            tag = ctype.replace(" ", "_")
            out.append(f"""
extern "C" __global__ void shfl_{kind}_{tag}(const {ctype}* x, const int* arg, {ctype}* out, int width)
{{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = {fn}(0xffffffff, x[i], arg[i], width);
}}""")
    return "\n".join(out)


SHUFFLES = shuffles_source()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", W.KINDS)
def test_every_shuffle_matches_the_numpy_warp(backend, kind):
    m = mod(SHUFFLES, backend)
    rng = np.random.default_rng(7)
    warps = 4
    for ctype, dtype in TYPES.items():
        k = m.get_function(f"shfl_{kind}_{ctype.replace(' ', '_')}")
        for width in (1, 2, 4, 8, 16, 32):
            x = (rng.random(32 * warps) * 1000).astype(dtype)
            arg = rng.integers(0, 70, 32 * warps).astype(np.int32)  # past the width and the warp too
            out = np.zeros_like(x)
            k((2,), (64,), (x, arg, out, np.int32(width)))
            want = np.concatenate([W.shfl(x[w * 32:(w + 1) * 32], kind, arg[w * 32:(w + 1) * 32], width)
                                   for w in range(warps)])
            np.testing.assert_array_equal(out, want, err_msg=f"{kind} {ctype} width {width}")


VOTES = r"""
extern "C" __global__ void votes(const int* pred, const unsigned* mask, const int* src, unsigned* out)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned m = mask[i];
    out[4 * i + 0] = __ballot_sync(m, pred[i]);
    out[4 * i + 1] = __any_sync(m, pred[i]);
    out[4 * i + 2] = __all_sync(m, pred[i]);
    out[4 * i + 3] = __shfl_sync(m, (unsigned)(i * 10), src[i]);
}
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_votes_and_shuffles_within_groups_of_lanes(backend):
    """The warp split into groups by their masks (each lane's mask names its group): each group votes and shuffles
    alone, as CUDA's masks say."""
    k = mod(VOTES, backend).votes
    rng = np.random.default_rng(3)
    for trial in range(6):
        group = rng.integers(0, 1 + trial, 64)  # 1..6 groups per warp, lanes interleaved
        mask = np.zeros(64, np.uint32)
        src = np.zeros(64, np.int32)
        for w in range(2):
            lanes = group[w * 32:(w + 1) * 32]
            for g in np.unique(lanes):
                members = np.flatnonzero(lanes == g)
                mask[w * 32 + members] = sum(1 << int(j) for j in members)
                src[w * 32 + members] = rng.choice(members, len(members))
        pred = (rng.random(64) < 0.5).astype(np.int32)
        if trial == 0:
            pred[:32] = 1  # one warp all true
        out = np.zeros(4 * 64, np.uint32)
        k((1,), (64,), (pred, mask, src, out))
        out = out.reshape(64, 4)
        for i in range(64):
            w, lane = divmod(i, 32)
            p = pred[w * 32:(w + 1) * 32]
            assert out[i, 0] == W.ballot(p, int(mask[i])), (trial, i)
            assert out[i, 1] == W.any_(p, int(mask[i])), (trial, i)
            assert out[i, 2] == W.all_(p, int(mask[i])), (trial, i)
            assert out[i, 3] == (w * 32 + src[i]) * 10, (trial, i)


ACTIVE = r"""
extern "C" __global__ void active(const float* x, unsigned* out)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (x[i] > 0.5f)
        out[i] = __activemask();
    else
        out[i] = __activemask();
}
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_activemask_names_the_lanes_on_the_same_branch(backend):
    x = np.random.default_rng(1).random(64).astype(np.float32)
    out = np.zeros(64, np.uint32)
    mod(ACTIVE, backend).active((1,), (64,), (x, out))
    for w in range(2):
        hi = x[w * 32:(w + 1) * 32] > 0.5
        for lane in range(32):
            same = hi if hi[lane] else ~hi
            assert out[w * 32 + lane] == W.ballot(same), lane


SYNCWARP = r"""
extern "C" __global__ void neighbours(const float* x, float* out, int sync)
{
    __shared__ float s[64];
    int t = threadIdx.x;
    s[t] = -1.0f;
    __syncthreads();
    s[t] = x[t];
    if (sync) __syncwarp();
    out[t] = s[t ^ 1];
}
"""


def test_syncwarp_orders_shared_memory_within_a_warp():
    """Lanes run one after another on the emulator, so without __syncwarp a lane reads its neighbour's slot before
    the neighbour wrote it (a race that a GPU may or may not show): checked mode names it, in either order of the
    threads; with __syncwarp every lane reads what the other wrote, and no race is named."""
    x = np.arange(64, dtype=np.float32) + 1
    out = np.zeros(64, np.float32)
    checked = load(SYNCWARP, backend="emulator").neighbours
    for reversed_order in (False, True):
        checked((1,), (64,), (x, out, np.int32(1)), reversed_order=reversed_order)
        np.testing.assert_array_equal(out, x[np.arange(64) ^ 1])
        with pytest.raises(KernelError, match=r"race on `s\[\d+\]`: thread \d+ wrote it at line 8, thread \d+ read it at "
                                              r"line 10 with no `__syncthreads\(\)` between"):
            checked((1,), (64,), (x, out, np.int32(0)), reversed_order=reversed_order)
    load(SYNCWARP, backend="emulator", checked=False).neighbours((1,), (64,), (x, out, np.int32(0)))
    assert (out[0::2] == -1).all() and (out[1::2] == x[0::2]).all()  # even lanes read before the odd ones wrote


REDUCE = r"""
extern "C" __global__ void warp_reduce(const float* x, float* out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[i] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2)
        v += __shfl_down_sync(0xffffffff, v, offset);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, v);
}
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_warp_shuffle_reduction_sums(backend):
    k = mod(REDUCE, backend).warp_reduce
    rng = np.random.default_rng(0)
    for n in (1, 31, 32, 33, 1000, 4097):
        x = rng.random(n).astype(np.float32)
        out = np.zeros(1, np.float32)
        k((-(-n // 128),), (128,), (x, out, np.int32(n)))
        assert out[0] == pytest.approx(float(x.sum(dtype=np.float64)), rel=1e-5), n
    v = rng.random(32).astype(np.float32)
    assert W.tree_sum(v)[0] == pytest.approx(float(v.sum()), rel=1e-6)


# -- the mistakes ----------------------------------------------------------------------------------

MISSING = r"""
extern "C" __global__ void k(float* x)
{
    if (threadIdx.x == 37) return;
    float v = x[threadIdx.x];
    v += __shfl_down_sync(0xffffffff, v, 1);
    x[threadIdx.x] = v;
}
"""
OUTSIDE = r"""
extern "C" __global__ void k(float* x)
{
    float v = x[threadIdx.x];
    if ((threadIdx.x & 31) < 16)
        v += __shfl_down_sync(0x0000ffff, v, 8);
    x[threadIdx.x] = v;
}
"""
SHORT = r"""
extern "C" __global__ void k(float* x)
{
    float v = x[threadIdx.x];
    v += __shfl_xor_sync(0xffffffff, v, 1);
    x[threadIdx.x] = v;
}
"""
AT_BARRIER = r"""
extern "C" __global__ void k(float* x)
{
    float v = x[threadIdx.x];
    if (threadIdx.x == 3) __syncthreads();
    else v += __shfl_xor_sync(0xffffffff, v, 1);
    x[threadIdx.x] = v;
}
"""
NOT_OWN = r"""
extern "C" __global__ void k(float* x)
{
    x[threadIdx.x] = __shfl_sync(0x1, x[threadIdx.x], 0);
}
"""
WIDTH = r"""
extern "C" __global__ void k(float* x)
{
    x[threadIdx.x] = __shfl_sync(0xffffffff, x[threadIdx.x], 0, 12);
}
"""
MIXED = r"""
extern "C" __global__ void k(float* x)
{
    float v = x[threadIdx.x];
    if (threadIdx.x < 8) v = __shfl_sync(0xffffffff, v, 0);
    else v = __ballot_sync(0xffffffff, v > 0);
    x[threadIdx.x] = v;
}
"""


@pytest.mark.parametrize("checked", [False, True])
@pytest.mark.parametrize("src, threads, message", [
    (MISSING, 64, r"kernel 'k', block \(0,0,0\), warp 1 \(threads 32-63\), line 6: __shfl_down_sync with mask "
                  r"0xffffffff waits for lane 5 \(thread \(37,0,0\)\), which never arrives: it returned from the kernel"),
    (OUTSIDE, 32, r"warp 0 \(threads 0-31\), line 6: __shfl_down_sync: lane 8 \(thread \(8,0,0\)\) reads lane 16, "
                  r"which is not in the mask 0x0000ffff"),
    (SHORT, 48, r"warp 1 \(threads 32-47\), line 5: __shfl_xor_sync: mask 0xffffffff names lanes this warp does not "
                r"have \(the block's 48 threads leave it 16 lanes: mask 0x0000ffff\)"),
    (AT_BARRIER, 32, r"waits for lane 3 \(thread \(3,0,0\)\), which never arrives: it waits at __syncthreads\(\) on line 5"),
    (NOT_OWN, 32, r"line 4: __shfl_sync with mask 0x00000001 called by lane 1, which is not in its own mask"),
    (WIDTH, 32, r"line 4: __shfl_sync: width 12 must be a power of 2 from 1 to 32"),
    (MIXED, 32, r"lanes of mask 0xffffffff meet at different warp operations: lane 0 at __shfl_sync \(line 5\), "
                r"lane 8 at __ballot_sync \(line 6\)"),
], ids=["lane-returned", "reads-outside-mask", "mask-beyond-block", "lane-at-barrier", "not-own-lane", "width",
        "mixed-operations"])
def test_mask_mistakes_are_named_with_kernel_warp_and_line(checked, src, threads, message):
    k = load(src, backend="emulator", checked=checked).k
    with pytest.raises(KernelError, match=message):
        k((1,), (threads,), (np.ones(threads, np.float32),))
