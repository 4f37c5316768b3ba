"""Lab 05's kernels: their answers for the contract every exercise keeps (``CONTRACT``, tests/test_contract.py: right,
blank, hints, replay, labkit's own; lab 05's naive matmul is tests/test_exercises_c.py's), and wrong answers whose
values are right on the emulator. The block and warp reductions:
atomics per thread or per warp instead of one per block (or warp), a block summed by one thread, lanes collected one
at a time, and a tree whose steps race (named as a race). The tiled matmul:
B (or C) read from global memory inside the k loop. The row softmax: rows far below zero, where a max started at a
constant or an online softmax started from a -inf gives nan. Each is named by the check. ``MISTAKES``: wrong answers
of lab 05's six exercises (a tree a level short, shuffles from offset 32, a k loop to K, a max started at INFINITY,
...), each named with a hint of its own and no step of the derivation."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Answers, Mistake, Reference, Wrong, needs_cxx

from labkit import check
from labkit.check import ExerciseError
from labkit.check.capture import _c_function
from labkit.kernels import tools
from labkit.kernels.loader import KERNEL_DIR

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
    if (threadIdx.x == 0) atomicAdd(out, s[0]);""", "a race between the threads of a block .*race on `s\\[\\d+\\]`"),
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
    size = "n=1 over 1 blocks of 256" if kind == "racing steps" else "n=10,000 over 8 blocks of 256"  # named at once
    with pytest.raises(ExerciseError, match=f"(?s){size}: .*{match}"):
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


# -- the tiled matmul: every operand's loads counted, not only A's ------------------------------------------------------

# A tiled through shared memory, B read through a pointer into its column inside the k loop: the source scan sees no
# B[...] outside a tile's store, so only the count of every global load finds it
ONLY_A_TILED = r"""#define TILE 16
extern "C" __global__ void matmul_tiled(const float* A, const float* B, float* C, int M, int N, int K)
{
    __shared__ float As[TILE][TILE];
    int ty = threadIdx.y, tx = threadIdx.x;
    int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
    const float* Bcol = B + col;
    float acc = 0.0f;
    for (int t = 0; t < K; t += TILE) {
        As[ty][tx] = (row < M && t + tx < K) ? A[row * K + t + tx] : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE && t + k < K; ++k)
            if (col < N) acc += As[ty][k] * Bcol[(t + k) * N];
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = acc;
}
"""
IN_K_LOOP = "B is read from global memory inside the k loop, each element n = 64 times, not n / TILE"
TILED_WRONG = {
    "B through a pointer of its own": (ONLY_A_TILED, f"loads each element of B 64 times on average from global memory; "
                                                     f"a tiled kernel loads it 64 / TILE = 4 times: {IN_K_LOOP}"),
    "B as *(B + i)": (ONLY_A_TILED.replace("    const float* Bcol = B + col;\n", "").replace(
        "Bcol[(t + k) * N]", "*(B + (t + k) * N + col)"), IN_K_LOOP),
    "B's tile stored, B read": (None, IN_K_LOOP),
    "B handed to a helper": (ONLY_A_TILED.replace("    const float* Bcol = B + col;\n", "").replace(
        "#define TILE 16\n", "#define TILE 16\n__device__ float at(const float* p, int i) { return p[i]; }\n").replace(
        "Bcol[(t + k) * N]", "at(B, (t + k) * N + col)"), "hands B to a function of its own, where they cannot be "
                                                          "counted: `at\\(B, \\(t \\+ k\\) \\* N \\+ col\\)`"),
    "C accumulated in global memory": (None, "your kernel makes 262,144 loads from global memory beyond those of A and B "
                                             "\\(64 per entry of C\\): C is read inside the k loop"),
}
INNER = "        for (int k = 0; k < TILE; ++k) acc += As[ty][k] * Bs[k][tx];"


def _tiled_wrong(kind: str) -> str:
    source = TILED_WRONG[kind][0]
    solution = (KDIR / "tiled_matmul_solution.cu").read_text()
    assert INNER in solution
    if kind == "B's tile stored, B read":  # the tile of B is filled and waited for, then B read beside it
        source = solution.replace(INNER, "        const float* Bk = B + t * N + col;\n        for (int k = 0; k < TILE; ++k) "
                                         "acc += As[ty][k] * (col < N && t + k < K ? Bk[k * N] : Bs[k][tx]);")
    if kind == "C accumulated in global memory":
        source = solution.replace("    float acc = 0.0f;\n", "    if (row < M && col < N) C[row * N + col] = 0.0f;\n").replace(
            INNER, "        if (row < M && col < N) for (int k = 0; k < TILE; ++k) C[row * N + col] += As[ty][k] * Bs[k][tx];"
        ).replace("    if (row < M && col < N) C[row * N + col] = acc;\n", "")
    return source


@needs_cxx
@pytest.mark.parametrize("kind", sorted(TILED_WRONG))
def test_tiled_matmul_names_b_or_c_read_from_global_memory(kind):
    with pytest.raises(ExerciseError, match=f"tiled matmul: .*{TILED_WRONG[kind][1]}"):
        check.tiled_matmul(_tiled_wrong(kind))


@needs_cxx
def test_tiled_matmul_says_it_counts_both_operands_and_passes_the_solutions(capsys):
    solution = (KDIR / "tiled_matmul_solution.cu").read_text()
    check.tiled_matmul(solution)
    check.tiled_matmul(solution.replace("#define TILE 16", "#define TILE 8"))
    out = capsys.readouterr().out
    assert "how often each element of A and each of B is loaded from global memory in one product of 64 x 64" in out
    assert "32 x 32 matrices (a tiled kernel: 32 / TILE = 4 times)" in out
    assert out.count("✔ tiled matmul: all 7 checks passed") == 2


# -- the row softmax: rows far below zero ----------------------------------------------------------------------------

# one pass per thread with a running max and a sum rescaled when the max grows, the (max, sum) pairs merged by a tree;
# started from the row's first element, a -inf there makes expf(-inf - -inf) = nan
ONLINE_SOFTMAX = r"""extern "C" __global__ void softmax_rows(const float* x, float* y, int rows, int cols)
{
    __shared__ float sm[256];
    __shared__ float sd[256];
    const float* xr = x + (long long)blockIdx.x * cols;
    float* yr = y + (long long)blockIdx.x * cols;
    int t = threadIdx.x;
    float m = xr[0], d = 0.0f;
    for (int c = t; c < cols; c += blockDim.x) {
        float mn = fmaxf(m, xr[c]);
        d = d * expf(m - mn) + expf(xr[c] - mn);
        m = mn;
    }
    sm[t] = m;
    sd[t] = d;
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h /= 2) {
        if (t < h) {
            float mn = fmaxf(sm[t], sm[t + h]);
            sd[t] = sd[t] * expf(sm[t] - mn) + sd[t + h] * expf(sm[t + h] - mn);
            sm[t] = mn;
        }
        __syncthreads();
    }
    m = sm[0];
    d = sd[0];
    for (int c = t; c < cols; c += blockDim.x) yr[c] = expf(xr[c] - m) / d;
}
"""
START = "float m = xr[0];"
AT_A_CONSTANT = ("the max you subtract is above every value of the row, so every exp is 0 and the sum is 0: a max started "
                 "at a constant")
SOFTMAX_WRONG = {
    "max from -500": (START, "float m = -500.0f;", f"rows=7, cols=1000: row 4, values about -1000, gives 1000 nan in y, "
                                                   f"while the row of -300 came out right: {AT_A_CONSTANT}"),
    "max from -200": (START, "float m = -200.0f;", f"row 4, values about -1000, gives 1000 nan in y.*{AT_A_CONSTANT}"),
    "max from -1e9": (START, "float m = -1e9f;", f"rows=7, cols=1000: row 6, every value -3e38 \\(near float32's lowest, "
                                                 f"-3.4e38\\), gives 1000 nan in y, where each entry is 1 / 1000, while "
                                                 f"the row of values about -1000 came out right: {AT_A_CONSTANT}"),
    "exp before the max": ("sum += expf(xr[c] - m);", "sum += expf(xr[c]) / expf(m);",
                           "row 1, values of -100, 100 and 1000, gives .* nan in y: exp overflowed. Subtract the row's "
                           "max before exp"),
    "online from the first element": (None, None, "rows=7, cols=1000: row 5, -inf in every column but one -1000 "
                                                  "\\(column \\d+\\), gives 1000 nan in y, where it is 1 in column \\d+ "
                                                  "and 0 elsewhere, while the row of values about -1000 came out right: "
                                                  "a -inf minus a -inf is nan"),
    "online from -500": (None, "float m = -500.0f, d", f"row 4, values about -1000, gives 1000 nan in y.*{AT_A_CONSTANT}"),
}


def _softmax_wrong(kind: str) -> str:
    old, new, _ = SOFTMAX_WRONG[kind]
    if kind.startswith("online"):
        return ONLINE_SOFTMAX if new is None else ONLINE_SOFTMAX.replace("float m = xr[0], d", new)
    solution = (KDIR / "softmax_rows_solution.cu").read_text()
    assert old in solution
    source = solution.replace(old, new)
    return source.replace("yr[c] = expf(xr[c] - m) / sum;", "yr[c] = expf(xr[c]) / expf(m) / sum;") \
        if kind == "exp before the max" else source


@needs_cxx
@pytest.mark.parametrize("kind", sorted(SOFTMAX_WRONG))
def test_row_softmax_names_rows_far_below_zero(kind):
    with pytest.raises(ExerciseError, match=f"row softmax: .*{SOFTMAX_WRONG[kind][2]}"):
        check.row_softmax(_softmax_wrong(kind))


@needs_cxx
def test_row_softmax_says_it_tries_rows_far_below_zero_and_passes_a_max_from_below_them(capsys):
    check.row_softmax((KDIR / "softmax_rows_solution.cu").read_text())
    check.row_softmax(ONLINE_SOFTMAX.replace("float m = xr[0], d", "float m = -3.4e38f, d"))
    out = capsys.readouterr().out
    assert "with rows of large and of equal values and rows far below zero (about -1000; -inf but for one -1000; all " \
           "-3e38)" in out
    assert out.count("✔ row softmax: all 9 checks passed") == 2


# -- the contract's answers (tests/test_contract.py) ---------------------------------------------------------------------

def _solution(name: str) -> str:
    return (KDIR / f"{name}_solution.cu").read_text()


def _blank(source: str, before: str) -> str:
    """The kernel as a student version hands it out: its body still says YOUR CODE HERE."""
    assert before in source
    return source.replace(before, f"// {check.KERNEL_TODO}\n    {before}", 1)


def _labkits(file: str, kernel: str | None = None) -> str:
    """labkit's own kernel file, or one kernel of it as a student would copy it out."""
    text = (KERNEL_DIR / file).read_text()
    return text if kernel is None else 'extern "C" __global__ void ' + _c_function(text, kernel) + "\n"


def _compiled(source: str, says: str = "") -> Wrong:
    return Wrong(source, says, (needs_cxx,))


CONTRACT = {
    "tiled_matmul": Answers(
        _solution("tiled_matmul"), _compiled(_solution("tiled_matmul").replace("__syncthreads();", ""),
                                             "does not use __syncthreads"),
        blank=_blank(_solution("tiled_matmul"), "__shared__"), passes="✔ tiled matmul: all 7 checks passed",
        replayed=_compiled(ONLY_A_TILED, IN_K_LOOP), marks=(needs_cxx,),
        references=(Reference(_labkits("matmul.cu"), "labkit/kernels/matmul.cu (matmul_tiled)", passes=False),)),
    "fast_matmul": Answers(
        _solution("fast_matmul"), _compiled(_solution("fast_matmul").replace("+= ra[a] * rb[b]", "= ra[a] * rb[b]"),
                                              "entries wrong"),
        blank=_blank(_solution("fast_matmul"), "__shared__ float As"), passes="✔ fast matmul: all 5 checks passed",
        marks=(needs_cxx,), references=(Reference(_labkits("matmul.cu"), "labkit/kernels/matmul.cu (matmul_regblock)",
                                                  passes=False),)),
    "block_reduction": Answers(
        _solution("block_sum"), _compiled(_solution("block_sum").replace("atomicAdd(out, s[0]);", "out[0] = s[0];"),
                                          "does not use atomicAdd"),
        blank=_blank(_solution("block_sum"), "__shared__"), passes="✔ block reduction: all 8 checks passed",
        marks=(needs_cxx,), references=(Reference(_labkits("reduce.cu") + _solution("block_sum"),
                                                  "labkit/kernels/reduce.cu"),)),
    "warp_reduction": Answers(
        _solution("warp_sum"), _compiled(_solution("warp_sum").replace(SHUFFLES, WARP_WRONG["per thread"][0]),
                                         WARP_WRONG["per thread"][1]),
        blank=_blank(_solution("warp_sum"), "float v"), passes="✔ warp reduction: all 9 checks passed",
        marks=(needs_cxx,), references=(Reference(_labkits("reduce.cu", "warp_sum"), "labkit/kernels/reduce.cu (warp_sum)"),)),
    "shared_transpose": Answers(
        _solution("transpose"), _compiled(_solution("transpose").replace("tile[32][33]", "tile[32][32]"),
                                          "bank conflicts"),
        blank=_blank(_solution("transpose"), "__shared__"), passes="✔ shared transpose: all 7 checks passed",
        marks=(needs_cxx,)),
    "row_softmax": Answers(
        _solution("softmax_rows"), _compiled(_solution("softmax_rows").replace("c += blockDim.x", "c += cols"),
                                             "stride over the row"),
        blank=_blank(_solution("softmax_rows"), "__shared__"), passes="✔ row softmax: all 9 checks passed",
        replayed=_compiled(ONLINE_SOFTMAX, "a -inf minus a -inf is nan"), marks=(needs_cxx,),
        references=(Reference(_labkits("softmax_rows.cu"), "labkit/kernels/softmax_rows.cu (softmax_rows)"),)),
}


# -- mistakes each named with a hint of its own (tests/test_contract.py walks MISTAKES) ----------------------------------

needs_gpu_compiler = pytest.mark.skipif(tools.compiler_for_check() is None,
                                        reason="no CUDA compiler (NVRTC or nvcc): only a GPU's compiler refuses these")
BLOCK = _solution("block_sum")
WARP = _solution("warp_sum")
NAIVE = _solution("naive_matmul")
SOFTMAX = _solution("softmax_rows")
TRANSPOSE = _solution("transpose")
TILED = _solution("tiled_matmul")
FAST = _solution("fast_matmul")
GRID_STRIDE = "for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) v += x[i];"
ONE_EACH = "int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) v = x[i];"


def _mistake(source: str, old: str, new: str, says: str, hint: str, marks: tuple = (needs_cxx,)) -> Mistake:
    assert old in source, old
    return Mistake(source.replace(old, new), says, hint, marks)


NAIVE_FAST = """#define THREADS 256
#define BM 16
#define BN 16
extern "C" __global__ void matmul_fast(const float* A, const float* B, float* C, int M, int N, int K)
{
    int i = blockIdx.y * BM + threadIdx.x / 16, j = blockIdx.x * BN + threadIdx.x % 16;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += A[i * K + k] * B[k * N + j];
    C[i * N + j] = acc;
}
"""

MISTAKES = {
    "fast_matmul": (
        Mistake(NAIVE_FAST, "slower than labkit's tiled kernel .*bounds yours is L2: every multiply-add loads its "
                "operands from global memory", "stage tiles of A and B in shared memory", (needs_cxx,)),
        _mistake(FAST, "#define BM 64", "#define BM 48", "#define BM 48: the tile's sides are powers of two",
                 "set BM to 8, 16, 32, 64, 128 or 256", ()),
        _mistake(FAST, "#define THREADS 256", "#define THREADS 200", "#define THREADS 200: a block holds whole "
                 "warps", "THREADS is 32 times the number of warps", ()),
    ),
    "block_reduction": (
        _mistake(BLOCK, "h > 0; h /= 2", "h > 1; h /= 2", "n=256 over 1 blocks of 256: .*the tree stopped one level "
                 "early", "log2\\(256\\) = 8 levels.*does it reach the last one, where a single thread adds"),
        _mistake(BLOCK, "h = blockDim.x / 2", "h = blockDim.x / 4", "only its first 128 threads' values: the tree "
                 "started one level late", "the first level must bring the upper half of the 256 entries into the "
                 "lower half"),
        _mistake(BLOCK, GRID_STRIDE, ONE_EACH, "n=10000 over 8 blocks of 256: .*only the first 2,048 values were added",
                 "more values than threads: each thread loops"),
        _mistake(BLOCK, "i += gridDim.x * blockDim.x", "i += blockDim.x", "n=257 over 2 blocks of 256: .*added more "
                 "than once", "the number of threads in the whole grid, not in one block"),
        _mistake(BLOCK, "if (threadIdx.x == 0) atomicAdd", "atomicAdd", "every thread added the block's total",
                 "only thread 0 should call atomicAdd, once per block"),
    ),
    "warp_reduction": (
        _mistake(WARP, "offset = 16", "offset = 32", "the first shuffle's offset is 32, a whole warp",
                 "no lane has a partner 32 lanes above it.*What is the farthest a value must travel"),
        _mistake(WARP, "offset = 16", "offset = 8", "lane 0 collected 16 lanes, not 32, the sum of lanes 0 to 15 only",
                 "lanes 16 to 31 never came down.*which offset must come first\\?"),
        _mistake(WARP, "offset > 0", "offset > 1", "the sum of the even lanes only: the tree stopped one level early",
                 "log2\\(32\\) = 5.*Does your loop run that step\\?"),
        _mistake(WARP, "if ((threadIdx.x & 31) == 0) atomicAdd", "atomicAdd", "every lane added what it holds",
                 "how does a thread tell, from threadIdx.x, that it is lane 0"),
        _mistake(WARP, "__shfl_down_sync", "__shfl_up_sync", "lane 0 ended with 32 times its own value",
                 "__shfl_up_sync moves values to higher lanes"),
    ),
    "naive_matmul": (
        _mistake(NAIVE, "k < K", "k <= K", "a read past the end of B: your k loop, `for \\(int k = 0; k <= K; \\+\\+k\\)`, "
                 "runs K \\+ 1 times", "the sum over k has K terms.*Which comparison stops the loop"),
        _mistake(NAIVE, "C[row * N + col]", "C[col * M + row]", "row and col swapped: C is transposed",
                 "writes row `row` of C.*where does row `row` of C start"),
        _mistake(NAIVE, "int row = blockIdx.y * blockDim.y + threadIdx.y;", "int row = threadIdx.y;",
                 "only the first 16 rows of C were written: the blocks along y all compute the same rows",
                 "count over the whole grid, not only its block"),
        _mistake(NAIVE, "int col = blockIdx.x * blockDim.x + threadIdx.x;", "int col = threadIdx.x;",
                 "only the first 16 columns of C were written", "count over the whole grid, not only its block"),
    ),
    "row_softmax": (
        _mistake(SOFTMAX, "float m = xr[0];", "float m = -INFINITY;", "`float m = -INFINITY;` starts from INFINITY: "
                 "INFINITY comes from a C header", "a start value that cannot win.*a GPU compiles",
                 (needs_cxx, needs_gpu_compiler)),
        _mistake(SOFTMAX, "float m = xr[0];", "float m = -FLT_MAX;", "starts from FLT_MAX", "a start value that cannot "
                 "win.*a GPU compiles", (needs_cxx, needs_gpu_compiler)),
        _mistake(SOFTMAX, "float m = xr[0];", "float m = 0.0f;", "every value -300.*did it start at 0\\?",
                 "a value that cannot win"),
    ),
    "shared_transpose": (
        _mistake(TRANSPOSE, "tile[32][33]", "tile[32][32]", "bank conflicts in .* shared-memory requests",
                 "for which W do i = 0 .. 31 fall in 32 different banks\\?"),
        _mistake(TRANSPOSE, "int orow = blockIdx.x * 32 + ty, ocol = blockIdx.y * 32 + tx;\n    if (orow < cols && ocol "
                 "< rows) out[orow * rows + ocol] = tile[tx][ty];", "int orow = blockIdx.x * 32 + tx, ocol = "
                 "blockIdx.y * 32 + ty;\n    if (orow < cols && ocol < rows) out[orow * rows + ocol] = tile[ty][tx];",
                 "a warp's stores to out touch 32 sectors", "Which entry of the tile holds"),
    ),
    "tiled_matmul": (
        _mistake(TILED, "__shared__ float As", "float As", "the array As that you store A into is not "
                 "__shared__", "As __shared__, TILE by TILE: one copy per block"),
    ),
}
