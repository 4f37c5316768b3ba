"""Lab 05's block and warp reductions against the wrong answers whose sums are right on the emulator: atomics per
thread or per warp instead of one per block (or warp), a block summed by one thread, lanes collected one at a time,
and a tree whose steps race between warps (right only in the emulator's order of warps). Each is named by the check."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import needs_cxx

from labkit import check
from labkit.check import ExerciseError

KDIR = Path(__file__).parent / "kernels"
TREE = """    for (int h = blockDim.x / 2; h > 0; h /= 2) {
        if (threadIdx.x < h) s[threadIdx.x] += s[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, s[0]);"""
SHUFFLES = """    for (int offset = 16; offset > 0; offset /= 2)
        v += __shfl_down_sync(0xffffffff, v, offset);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, v);"""
BLOCK_WRONG = {
    "per thread": ("    atomicAdd(out, v);", "256 atomicAdd calls in a block where one per block \\(1\\) are expected: every "
                                              "thread calls it"),
    "per warp": ("""    for (int h = 16; h > 0; h /= 2) {
        if ((threadIdx.x & 31) < h) s[threadIdx.x] += s[threadIdx.x + h];
        __syncthreads();
    }
    if ((threadIdx.x & 31) == 0) atomicAdd(out, s[threadIdx.x]);""",
                 "8 atomicAdd calls in a block where one per block \\(1\\) are expected: one thread of each warp calls it"),
    "thread 0 alone": ("""    if (threadIdx.x == 0) {
        float b = 0.0f;
        for (int i = 0; i < blockDim.x; ++i) b += s[i];
        atomicAdd(out, b);
    }""", "one warp made 257 shared-memory requests, where a tree of log2\\(256\\) = 8 steps makes about 3 per step: "
          "the block's values were added one after the other"),
    # each step reads s[t + h] while the thread that owns it writes it: right only when warp 0 runs first
    "racing steps": ("""    for (int h = 1; h < blockDim.x; h *= 2) {
        if (threadIdx.x + h < blockDim.x) s[threadIdx.x] += s[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, s[0]);""", "when the warps of each block run in the opposite order .*a race "
                                                     "between warps"),
}
WARP_WRONG = {
    "per thread": ("""    float w = v;
    for (int offset = 16; offset > 0; offset /= 2)
        w += __shfl_down_sync(0xffffffff, w, offset);
    atomicAdd(out, v);""", "256 atomicAdd calls in a block where one per warp \\(8\\) are expected: every thread calls it"),
    "lane 0 collects": ("""    float total = 0.0f;
    for (int j = 0; j < 32; ++j) total += __shfl_sync(0xffffffff, v, j);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, total);""",
                        "a lane made 32 shuffles, where a tree over the 32 lanes of a warp takes log2\\(32\\) = 5"),
}


@needs_cxx
@pytest.mark.parametrize("kind", sorted(BLOCK_WRONG))
def test_block_reduction_names_a_right_sum_made_the_wrong_way(kind):
    solution = (KDIR / "block_sum_solution.cu").read_text()
    body, match = BLOCK_WRONG[kind]
    assert TREE in solution
    with pytest.raises(ExerciseError, match=f"(?s)n=10,000 over 8 blocks of 256: .*{match}"):
        check.block_reduction(solution.replace(TREE, body))


@needs_cxx
@pytest.mark.parametrize("kind", sorted(WARP_WRONG))
def test_warp_reduction_names_a_right_sum_made_the_wrong_way(kind):
    solution = (KDIR / "warp_sum_solution.cu").read_text()
    body, match = WARP_WRONG[kind]
    assert SHUFFLES in solution
    with pytest.raises(ExerciseError, match=f"(?s)n=10,000 over 8 blocks of 256: .*{match}"):
        check.warp_reduction(solution.replace(SHUFFLES, body))


@needs_cxx
def test_the_reductions_pass_with_their_counts_said_before_they_run(capsys):
    check.block_reduction((KDIR / "block_sum_solution.cu").read_text())
    check.warp_reduction((KDIR / "warp_sum_solution.cu").read_text())
    out = capsys.readouterr().out
    assert "the atomicAdds of each block (one)" in out and "✔ block reduction: all 8 checks passed" in out
    assert "the shuffles of each lane (a tree's 5 steps)" in out and "✔ warp reduction: all 9 checks passed" in out
