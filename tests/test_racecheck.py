"""Checked mode names a race between the threads of a block as compute-sanitizer's racecheck does (the element, both
threads, both lines), whatever order the emulator runs the threads in; the checks of lab 05 name every barrier removed
from a solution as a race, and pass the solutions, warp shuffles and atomics without a false one."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import needs_cxx

from labkit import check
from labkit.check import ExerciseError
from labkit.kernels import KernelError, load

pytestmark = needs_cxx

ROOT = Path(__file__).resolve().parent.parent
KDIR = Path(__file__).parent / "kernels"
BARRIER = "__syncthreads();"
CHECKS = {"matmul_tiled": check.tiled_matmul, "block_sum": check.block_reduction, "transpose_tiled": check.shared_transpose,
          "softmax_rows": check.row_softmax}
NAMED = (r"a race between the threads of a block \(kernel '\w+', block \(\d+,\d+,\d+\): race on `\w+(\[\d+\])*`: thread "
         r"\S+ wrote it at line \d+, thread \S+ (read|wrote a different value to) it at line \d+ with no "
         r"`__syncthreads\(\)` between")
ORDERS = pytest.mark.parametrize("reversed_order", [False, True], ids=["in order", "reversed"])


def lab_solutions() -> list[tuple[str, str, str]]:
    """(where, kernel, source) of each lab 05 solution with a barrier: tests/kernels and the notebook's solution cells."""
    found = [(f.name, name, f.read_text()) for f in sorted(KDIR.glob("*_solution.cu")) for name in CHECKS
             if f"void {name}(" in f.read_text()]
    nb = json.loads(ROOT.joinpath("notebooks", "05_cuda_kernels.ipynb").read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] != "code" or "BEGIN SOLUTION" not in src:
            continue
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found += [("lab 05", name, node.value) for name in CHECKS if f"void {name}(" in node.value]
    return [(where, name, text) for where, name, text in found if BARRIER in text]


SOLUTIONS = lab_solutions()
WITHOUT_ONE = [(where, name, text, i) for where, name, text in SOLUTIONS for i in range(text.count(BARRIER))]


def without_barrier(text: str, i: int) -> str:
    """``text`` with its i-th __syncthreads() blanked (the lines stay where they were)."""
    at = [m.start() for m in re.finditer(re.escape(BARRIER), text)][i]
    return text[:at] + " " * len(BARRIER) + text[at + len(BARRIER):]


def test_the_lab_solutions_with_barriers_are_found():
    assert {name for _, name, _ in SOLUTIONS} == set(CHECKS)
    assert {where for where, _, _ in SOLUTIONS} >= {"lab 05", "tiled_matmul_solution.cu", "softmax_rows_solution.cu"}
    assert len(WITHOUT_ONE) >= 20  # 2 in the tiled matmul, 2 in the block sum, 1 in the transpose, 5 in the softmax


@pytest.mark.slow
@pytest.mark.parametrize("where, name, text, i", WITHOUT_ONE, ids=[f"{w}-{n}-{i}" for w, n, _, i in WITHOUT_ONE])
def test_every_barrier_of_every_solution_removed_is_named_a_race(where, name, text, i, capsys):
    with pytest.raises(ExerciseError, match=NAMED):
        CHECKS[name](without_barrier(text, i))


@pytest.mark.slow
@pytest.mark.parametrize("where, name, text", SOLUTIONS, ids=[f"{w}-{n}" for w, n, _ in SOLUTIONS])
def test_the_solutions_pass_with_races_tracked(where, name, text, capsys):
    CHECKS[name](text)
    out = capsys.readouterr().out
    assert "Every launch names a race between the threads of a block" in out and "checks passed" in out


# thread 0 reduces the row alone and the others read its result with no barrier: its values are right in the emulator's
# order, where thread 0 runs first (before races were tracked, only its loads per thread failed it); a race on a GPU
SOFTMAX_THREAD0 = r"""extern "C" __global__ void softmax_rows(const float* x, float* y, int rows, int cols)
{
    __shared__ float s[256];
    __shared__ float total;
    const float* xr = x + (long long)blockIdx.x * cols;
    float* yr = y + (long long)blockIdx.x * cols;
    int t = threadIdx.x;
    if (t == 0) {
        float m = xr[0], sum = 0.0f;
        for (int c = 0; c < cols; ++c) m = fmaxf(m, xr[c]);
        for (int c = 0; c < cols; ++c) sum += expf(xr[c] - m);
        s[0] = m;
        total = sum;
    }
    float m = s[0], sum = total;
    for (int c = t; c < cols; c += blockDim.x) yr[c] = expf(xr[c] - m) / sum;
}
"""


def test_a_softmax_whose_thread_0_reduces_alone_is_named_a_race():
    with pytest.raises(ExerciseError, match=r"row softmax: your kernel does not use __syncthreads: " +
                       NAMED.replace(r"`\w+(\[\d+\])*`", r"`s\[0\]`") + r".*\nHint: wait with __syncthreads\(\)"):
        check.row_softmax(SOFTMAX_THREAD0)
    one_barrier = SOFTMAX_THREAD0.replace("    __shared__ float total;\n", "    __shared__ float total;\n    __syncthreads();\n")
    with pytest.raises(ExerciseError, match=r"rows=1, cols=1: " + NAMED.replace(r"`\w+(\[\d+\])*`", r"`s\[0\]`") +
                       r".*\nHint: .*every thread of the block must pass a __syncthreads\(\)"):
        check.row_softmax(one_barrier)
    fixed = SOFTMAX_THREAD0.replace("    float m = s[0], sum = total;", "    __syncthreads();\n    float m = s[0], sum = total;")
    with pytest.raises(ExerciseError, match="a single thread|loads|floats from global memory"):  # no race, only slow
        check.row_softmax(fixed)


TREE = """    for (int h = blockDim.x / 2; h > 0; h /= 2) {
        if (threadIdx.x < h) s[threadIdx.x] += s[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, s[0]);"""
# Reductions whose sums came out right in the emulator's order: each step reads s[t + h] while thread t + h adds
# into it. Upwards across the block (caught before only by a launch with the warps reversed, unnamed), and within each
# warp, the block's total then added by thread 0 (which passed every check).
REDUCTION_RACES = {
    "racing steps": """    for (int h = 1; h < blockDim.x; h *= 2) {
        if (threadIdx.x + h < blockDim.x) s[threadIdx.x] += s[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(out, s[0]);""",
    "racing lanes": """    for (int h = 1; h < 32; h *= 2) {
        if ((threadIdx.x & 31) + h < 32) s[threadIdx.x] += s[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        float b = 0.0f;
        for (int w = 0; w < blockDim.x; w += 32) b += s[w];
        atomicAdd(out, b);
    }""",
}


@pytest.mark.parametrize("kind", sorted(REDUCTION_RACES))
def test_reduction_races_that_passed_are_named(kind):
    solution = (KDIR / "block_sum_solution.cu").read_text()
    assert TREE in solution
    with pytest.raises(ExerciseError, match=r"n=1 over 1 blocks of 256: " +
                       NAMED.replace(r"`\w+(\[\d+\])*`", r"`s\[\d+\]`")):
        check.block_reduction(solution.replace(TREE, REDUCTION_RACES[kind]))


# -- the emulator's reports ---------------------------------------------------------------------------------------------

TILED = r"""#define T 8
extern "C" __global__ void mm(const float* A, const float* B, float* C, int n)
{
    __shared__ float As[T][T];
    __shared__ float Bs[T][T];
    int r = blockIdx.y * T + threadIdx.y, c = blockIdx.x * T + threadIdx.x;
    float acc = 0.0f;
    for (int t = 0; t < n; t += T) {
        As[threadIdx.y][threadIdx.x] = A[r * n + t + threadIdx.x];
        Bs[threadIdx.y][threadIdx.x] = B[(t + threadIdx.y) * n + c];
        __syncthreads();
        for (int k = 0; k < T; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    C[r * n + c] = acc;
}
"""


def _mm(src, reversed_order=False, n=16):
    a, b, c = np.ones((n, n), np.float32), np.ones((n, n), np.float32), np.zeros((n, n), np.float32)
    load(src, backend="emulator").mm((n // 8, n // 8), (8, 8), (a, b, c, np.int32(n)), reversed_order=reversed_order)
    return c


@ORDERS
def test_a_missing_barrier_is_named_with_element_threads_and_lines(reversed_order):
    assert (_mm(TILED, reversed_order) == 16).all()
    after_loads = without_barrier(TILED, 0)
    with pytest.raises(KernelError, match=r"kernel 'mm', block \(\d,0,0\): race on `As\[\d\]\[\d\]`: thread \(\d,\d\) wrote "
                                          r"it at line 9, thread \(\d,\d\) read it at line 12 with no `__syncthreads\(\)` "
                                          "between"):
        _mm(after_loads, reversed_order)
    before_next = without_barrier(TILED, 1)  # the next step's store overwrites what another thread still reads
    with pytest.raises(KernelError, match=r"race on `As\[\d\]\[\d\]`: thread \(\d,\d\) wrote it at line 9, thread "
                                          r"\(\d,\d\) read it at line 12"):
        _mm(before_next, reversed_order)


NOT_RACES = r"""
extern "C" __global__ void fine(const float* x, float* out, int* hits)
{
    __shared__ float s[64];
    __shared__ int flag;
    int t = threadIdx.x;
    s[t] = x[t];
    flag = 1;                                 // every thread stores the same value: racecheck's benign hazard
    atomicAdd(&hits[0], 1);                   // atomics are not races
    atomicAdd(&s[0], 0.0f);
    __syncthreads();
    float v = s[(t + 1) % 64] + s[0];         // written before the last barrier
    for (int o = 16; o > 0; o /= 2) v += __shfl_down_sync(0xffffffff, v, o);
    __syncthreads();
    s[t] = v;
    __syncwarp();
    v = s[t ^ 1];                             // lanes of one warp, ordered by __syncwarp
    out[t] = v + flag;
}
extern "C" __global__ void differ(float* out)
{
    __shared__ int flag;
    flag = threadIdx.x;                       // different values, no barrier
    __syncthreads();
    out[threadIdx.x] = flag;
}
extern "C" __global__ void global_race(float* out)
{
    out[threadIdx.x] = 1.0f;
    out[threadIdx.x] += out[(threadIdx.x + 1) % blockDim.x];
}
"""


@ORDERS
def test_barriers_warp_operations_atomics_and_same_values_are_not_races(reversed_order):
    mod = load(NOT_RACES, backend="emulator")
    x, out, hits = np.arange(64, dtype=np.float32), np.zeros(64, np.float32), np.zeros(1, np.int32)
    mod.fine((2,), (64,), (x, out, hits), reversed_order=reversed_order)
    assert hits[0] == 128 and np.isfinite(out).all()
    with pytest.raises(KernelError, match=r"race on `flag`: thread \d+ wrote it at line 23, thread \d+ wrote a different "
                                          r"value to it at line 23"):
        mod.differ((1,), (32,), (out,), reversed_order=reversed_order)
    with pytest.raises(KernelError, match=r"race on `out\[\d+\]`: thread \d+ wrote it at line (29|30), thread \d+ read it "
                                          "at line 30"):
        mod.global_race((1,), (32,), (out,), reversed_order=reversed_order)


def test_a_race_hidden_by_the_emulators_order_shows_in_the_other_order():
    """Unchecked, the emulator runs thread 0 first, so every thread reads what thread 0 wrote; in the other order the
    others read what the launch before left (the checks' second launch compares the two). Checked: named either way."""
    src = r"""extern "C" __global__ void first(float* out, float value)
{
    __shared__ float v[2];
    if (threadIdx.x == 0) v[0] = value;
    out[threadIdx.x] = v[0];
}
"""
    k = load(src, backend="emulator", checked=False).first
    out = np.zeros(32, np.float32)
    k((1,), (32,), (out, np.float32(7)))
    assert (out == 7).all()
    k((1,), (32,), (out, np.float32(8)), reversed_order=True)
    assert out[0] == 8 and (out[1:] == 7).all()
    checked = load(src, backend="emulator").first
    for reversed_order in (False, True):
        with pytest.raises(KernelError, match=r"race on `v\[0\]`: thread 0 wrote it at line 4, thread \d+ read it at line 5"):
            checked((1,), (32,), (out, np.float32(9)), reversed_order=reversed_order)
