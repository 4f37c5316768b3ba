from pathlib import Path

import numpy as np
import pytest

from labkit import check, mlp
from labkit.check import ExerciseError, common


def reference_backprop(params, x, Y):
    return mlp.backprop(params, x, Y, "sigmoid", "quadratic")


def test_backprop_check_passes_reference(capsys):
    check.backprop(reference_backprop)
    assert "✔ vectorised backprop: all 5 checks passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong,match",
    [
        (lambda p, x, Y: [(gW * len(x), gb * len(x)) for gW, gb in reference_backprop(p, x, Y)], "batch size"),
        (lambda p, x, Y: [(gW.T, gb) for gW, gb in reference_backprop(p, x, Y)], "transposed"),
        (lambda p, x, Y: reference_backprop(p, x, Y)[:-1], "expected a list of 2"),
        (lambda p, x, Y: [(gW, gb) if i == len(p) - 1 else (gW * 1.5, gb)
                          for i, (gW, gb) in enumerate(reference_backprop(p, x, Y))],
         "(?s)layer 0: dW differs.*output layer is right"),
        (lambda p, x, Y: [(gW + 0.1, gb) for gW, gb in reference_backprop(p, x, Y)], "(?s)layer 1.*output layer's delta"),
        (lambda p, x, Y: (_ for _ in ()).throw(NotImplementedError), "not written yet"),
        (lambda p, x, Y: 1 / 0, "ZeroDivisionError"),
    ],
)
def test_backprop_check_names_the_mistake(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.backprop(wrong)


def test_backprop_check_catches_modified_params():
    def sneaky(params, x, Y):
        params[0][0][0, 0] += 1
        return reference_backprop(params, x, Y)

    with pytest.raises(ExerciseError, match="changed params"):
        check.backprop(sneaky)


def right_accumulate(params, x, Y, acc):
    total = 0.0
    for k in range(len(x)):
        loss, g = mlp.loss_and_grads_per_sample(params, x[k:k + 1], Y[k:k + 1])
        total += loss
        for (aW, ab), (gW, gb) in zip(acc, g):
            aW += gW
            ab += gb
    return total


def test_accumulate_check_passes_reference(capsys):
    check.accumulate(right_accumulate)
    assert "✔ per-thread accumulator" in capsys.readouterr().out


def overwrite(params, x, Y, acc):
    total = 0.0
    for k in range(len(x)):
        loss, g = mlp.loss_and_grads_per_sample(params, x[k:k + 1], Y[k:k + 1])
        total += loss
        for (aW, ab), (gW, gb) in zip(acc, g):
            aW[...] = gW
            ab[...] = gb
    return total


def rebinds(params, x, Y, acc):
    for k in range(len(x)):
        _, g = mlp.loss_and_grads_per_sample(params, x[k:k + 1], Y[k:k + 1])
        for (aW, _), (gW, _) in zip(acc, g):
            aW = aW + gW  # noqa: F841 - the mistake under test: a new array, acc untouched
    return 0.0


def mean_not_sum(params, x, Y, acc):
    loss, g = mlp.loss_and_grads_per_sample(params, x, Y)
    for (aW, ab), (gW, gb) in zip(acc, g):
        aW += gW
        ab += gb
    return loss * len(x)


@pytest.mark.parametrize("wrong,match", [(overwrite, "only the last sample"), (rebinds, "all zeros"),
                                         (mean_not_sum, "the mean, not the sum")])
def test_accumulate_check_names_the_mistake(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.accumulate(wrong)


def test_accumulate_check_wrong_loss():
    def bad_loss(params, x, Y, acc):
        right_accumulate(params, x, Y, acc)
        return 0.0

    with pytest.raises(ExerciseError, match="summed loss"):
        check.accumulate(bad_loss)


def test_exercise_error_is_assertion():
    assert issubclass(ExerciseError, AssertionError)
    np.testing.assert_equal(True, True)


def _topk(g, residual, ratio, by=np.abs, use_residual=True, reset=True, k_of=None):
    c = g + residual if use_residual else g.copy()
    k = k_of(g.size, ratio) if k_of else min(g.size, max(1, int(np.ceil(ratio * g.size))))
    idx = np.argpartition(by(c), g.size - k)[g.size - k:] if k else np.zeros(0, dtype=int)
    left = (g + residual).copy()
    if reset:
        left[idx] = 0
    return idx, c[idx], left


def test_topk_feedback_check_passes_reference(capsys):
    check.topk_feedback(_topk)
    assert "passed" in capsys.readouterr().out


@pytest.mark.parametrize("kw, match", [
    ({"by": lambda c: c}, "by magnitude"),
    ({"use_residual": False}, r"g \+ residual"),
    ({"reset": False}, "with the sent entries set to 0"),
    ({"k_of": lambda n, r: int(r * n)}, "at least one entry"),
])
def test_topk_feedback_check_names_the_mistake(kw, match):
    with pytest.raises(ExerciseError, match=match):
        check.topk_feedback(lambda g, res, ratio: _topk(g, res, ratio, **kw))


def test_topk_feedback_check_not_written():
    def stub(g, residual, ratio):
        raise NotImplementedError
    with pytest.raises(ExerciseError, match="not written yet"):
        check.topk_feedback(stub)


# -- the kernel exercises (labs 04/05): checked on the emulator --------------------------------------

from conftest import needs_cxx  # noqa: E402

KDIR = Path(__file__).parent / "kernels"


@pytest.fixture(scope="module")
def tiled_solution():
    return (KDIR / "tiled_matmul_solution.cu").read_text()


@pytest.fixture(scope="module")
def reduction_solution():
    return (KDIR / "block_sum_solution.cu").read_text()


@needs_cxx
def test_tiled_matmul_solution_passes(tiled_solution, capsys):
    check.tiled_matmul(tiled_solution)
    out = capsys.readouterr().out
    assert out.startswith("tiled matmul: C on 5 sizes, then how often each element of A and each of B is loaded from "
                          "global memory in one product of 64 x 64 matrices (a tiled kernel: 64 / TILE = 4 times)")
    assert "all 7 checks passed" in out


@needs_cxx
def test_tiled_matmul_that_reads_A_in_its_inner_product_fails_by_its_count(tiled_solution):
    """Tiles stored, read and waited for, values right, and the source scan satisfied (A is read in a statement that
    stores a tile), and yet every thread reads A from global memory in its inner product: the count finds it."""
    cheat = tiled_solution.replace("acc += As[ty][k] * Bs[k][tx];",
                                   "acc += (As[ty][k] = (row < M && t + k < K) ? A[row * K + t + k] : 0.0f) * Bs[k][tx];")
    assert cheat != tiled_solution
    with pytest.raises(check.ExerciseError, match=r"loads each element of A 68 times on average from global memory; "
                                                  r"a tiled kernel loads it 64 / TILE = 4 times"):
        check.tiled_matmul(cheat)
    helper = tiled_solution.replace("#define TILE 16", "#define TILE 16\n__device__ float at(const float* p, int i) "
                                    "{ return p[i]; }").replace("A[row * K + t + tx]", "at(A, row * K + t + tx)")
    with pytest.raises(check.ExerciseError, match=r"hands A to a function or a pointer of its own"):
        check.tiled_matmul(helper)


@needs_cxx
def test_tiled_matmul_without_shared_memory_is_the_naive_kernel():
    naive = ('extern "C" __global__ void matmul_tiled(const float* A, const float* B, float* C, int M, int N, int K)\n'
             '{ int r = blockIdx.y * 16 + threadIdx.y, c = blockIdx.x * 16 + threadIdx.x; if (r < M && c < N) {\n'
             '  float s = 0; for (int k = 0; k < K; ++k) s += A[r * K + k] * B[k * N + c]; C[r * N + c] = s; } }\n')
    with pytest.raises(check.ExerciseError, match="does not use __shared__"):
        check.tiled_matmul(naive)
    beside = naive.replace("{ int r", "{ __shared__ float As[16][16];\n  __shared__ float Bs[16][16];\n  __syncthreads(); int r")
    with pytest.raises(check.ExerciseError, match="the __shared__ array As is never stored to"):
        check.tiled_matmul(beside)
    touched = beside.replace("s = 0;", "s = 0; As[threadIdx.y][threadIdx.x] = A[0]; Bs[0][0] = As[0][0]; s = Bs[0][0] * 0;")
    with pytest.raises(check.ExerciseError, match=r"reads A from global memory outside storing a tile: `.*s \+= A\[r \* K"):
        check.tiled_matmul(touched)


@needs_cxx
def test_tiled_matmul_with_another_tile_size_passes(tiled_solution, capsys):
    check.tiled_matmul(tiled_solution.replace("#define TILE 16", "#define TILE 8"))
    assert "all 7 checks passed" in capsys.readouterr().out


@needs_cxx
def test_block_reduction_solution_passes(reduction_solution, capsys):
    check.block_reduction(reduction_solution)
    assert "all 8 checks passed" in capsys.readouterr().out


@needs_cxx
@pytest.mark.parametrize("old,new,match", [
    ("if (threadIdx.x == 0) atomicAdd", "atomicAdd", "only thread 0 should call atomicAdd"),
    ("i += gridDim.x * blockDim.x", "i += n", "grid-stride loop"),
    ("if (threadIdx.x < h)", "", r"__shared__ array index 256 out of range \[0, 256\)"),
    ("s[threadIdx.x] += s[threadIdx.x + h];\n        __syncthreads();",
     "{ s[threadIdx.x] += s[threadIdx.x + h]; __syncthreads(); }", "returned without reaching it"),
    ("atomicAdd(out, s[0]);", "out[0] = s[0];", "does not use atomicAdd"),
])
def test_block_reduction_mistakes_are_named(reduction_solution, old, new, match):
    assert old in reduction_solution
    with pytest.raises(check.ExerciseError, match=match):
        check.block_reduction(reduction_solution.replace(old, new))


@pytest.fixture(scope="module")
def warp_solution():
    return (KDIR / "warp_sum_solution.cu").read_text()


@needs_cxx
def test_warp_reduction_solution_passes(warp_solution, capsys):
    check.warp_reduction(warp_solution)
    assert "all 9 checks passed" in capsys.readouterr().out


@needs_cxx
@pytest.mark.parametrize("old,new,match", [
    ("if ((threadIdx.x & 31) == 0) atomicAdd", "atomicAdd",
     r"every lane added what it holds\nHint: only lane 0 of each warp holds the warp's total"),
    ("offset = 16", "offset = 8", "lane 0 collected 16 lanes, not 32"),
    ("__shfl_down_sync", "__shfl_up_sync", "__shfl_up_sync moves values to higher lanes"),
    ("    for (int offset", "    if (i < n) for (int offset", r"does not compile"),
    ("    for (int offset", "    if (threadIdx.x < n) for (int offset",
     r"__shfl_down_sync with mask 0xffffffff waits for lane 1 \(thread \(1,0,0\)\), which never arrives"),
    ("i += gridDim.x * blockDim.x", "i += n", "grid-stride loop"),
    ("float v = 0.0f;", "__shared__ float s[32];\n    float v = 0.0f;", "declares __shared__ memory"),
    ("atomicAdd(out, v);", "out[0] = v;", "does not use atomicAdd"),
])
def test_warp_reduction_mistakes_are_named(warp_solution, old, new, match):
    assert old in warp_solution
    with pytest.raises(check.ExerciseError, match=match):
        check.warp_reduction(warp_solution.replace(old, new))


@pytest.fixture(scope="module")
def transpose_solution():
    return (KDIR / "transpose_solution.cu").read_text()


@needs_cxx
def test_shared_transpose_solution_passes(transpose_solution, capsys):
    check.shared_transpose(transpose_solution)
    out = capsys.readouterr().out
    assert out.startswith("shared transpose: out on 5 sizes, then, counted in a 64 x 64 transpose")
    assert "all 7 checks passed" in out


@needs_cxx
@pytest.mark.parametrize("old,new,match", [
    ("tile[32][33]", "tile[32][32]",
     r"3,968 bank conflicts in 256 shared-memory requests(.|\n)*for which W do i = 0 .. 31 fall in 32 different banks"),
    ("if (orow < cols && ocol < rows) out[orow * rows + ocol] = tile[tx][ty]",
     "if (r < rows && c < cols) out[c * rows + r] = tile[ty][tx]",
     r"a warp's stores to out touch 32 sectors of 32 bytes on average; coalesced, they touch 4"),
    ("if (r < rows && c < cols) tile", "tile", r"out-of-bounds access in\["),
    ("    __syncthreads();\n", "", "does not use __syncthreads"),
    ("out[orow * rows + ocol] = tile[tx][ty]", "out[orow * rows + ocol] = tile[ty][tx]", r"out\[0, 1\] is .* \(yours\)"),
])
def test_shared_transpose_mistakes_are_named(transpose_solution, old, new, match):
    assert old in transpose_solution
    with pytest.raises(check.ExerciseError, match=match):
        check.shared_transpose(transpose_solution.replace(old, new))


@pytest.fixture(scope="module")
def softmax_solution():
    return (KDIR / "softmax_rows_solution.cu").read_text()


MAX_LEVEL = "s[t] = fmaxf(s[t], s[t + h]);\n        __syncthreads();"
SUM_LEVEL = "s[t] += s[t + h];\n        __syncthreads();"
MAX_LOOP = "for (int c = t; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);"
SUM_LOOP = "for (int c = t; c < cols; c += blockDim.x) sum += expf(xr[c] - m);"
# correct, with a __shared__ array and a barrier, but every thread works through the whole row
SOFTMAX_SERIAL = r"""
extern "C" __global__ void softmax_rows(const float* x, float* y, int rows, int cols)
{
    __shared__ float s[256];
    const float* xr = x + (long long)blockIdx.x * cols;
    float m = xr[0], sum = 0.0f;
    for (int c = 1; c < cols; ++c) m = fmaxf(m, xr[c]);
    for (int c = 0; c < cols; ++c) sum += expf(xr[c] - m);
    s[threadIdx.x] = sum;
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += blockDim.x) y[(long long)blockIdx.x * cols + c] = expf(xr[c] - m) / sum;
}
"""


@needs_cxx
def test_row_softmax_solution_passes(softmax_solution, capsys):
    check.row_softmax(softmax_solution)
    out = capsys.readouterr().out
    assert out.startswith("row softmax: y on 7 shapes from (1, 1) to (1, 4097), with rows of large and of equal values")
    assert "✔ row softmax: all 9 checks passed" in out


@needs_cxx
def test_row_softmax_passes_labkits_kernel_which_a_record_names_as_a_copy(capsys):
    from labkit.check import capture
    from labkit.kernels.loader import KERNEL_DIR

    reference = (KERNEL_DIR / "softmax_rows.cu").read_text()
    check.row_softmax(reference)
    assert "all 9 checks passed" in capsys.readouterr().out
    assert capture.source_reference("row_softmax", reference) == "labkit/kernels/softmax_rows.cu (softmax_rows)"
    assert capture.source_reference("row_softmax", (KDIR / "softmax_rows_solution.cu").read_text()) is None


def test_row_softmax_blank_is_not_written_yet_and_gets_no_hint(softmax_solution):
    with pytest.raises(ExerciseError, match="not written yet") as e:
        check.row_softmax(softmax_solution.replace("    __shared__", f"    // {check.KERNEL_TODO}\n    __shared__"))
    assert "Step" not in str(e.value)


@needs_cxx
@pytest.mark.parametrize("changes, match", [
    ([("expf(xr[c] - m)", "expf(xr[c])")], r"rows=3, cols=5: row 1, values of -100, 100 and 1000, gives 3 nan in y: exp "
                                            r"overflowed. Subtract the row's max before exp\nHint: expf\(100\) is already inf"),
    ([("c += blockDim.x", "c += cols")], r"rows=2, cols=257: only the first 256 columns of each row were written \(2 entries "
                                         r"of y never written\): stride over the row"),
    ([(MAX_LEVEL, "s[t] = fmaxf(s[t], s[t + h]);")], r"rows=1, cols=1: a race between the threads of a block \(.*race on "
     r"`s\[\d+\]`: thread \d+ wrote it at line 12, thread \d+ read it at line 12 with no `__syncthreads\(\)` between"
     r"(.|\n)*Hint: between one thread's store and another thread's load"),
    ([("m = s[0];\n    __syncthreads();", "m = s[0];")], r"rows=1, cols=1: a race between the threads of a block \(.*race "
     r"on `s\[0\]`: thread 0 wrote it at line 18, thread \d+ read it at line 15"),
    ([(SUM_LEVEL, "s[t] += s[t + h];")], r"rows=1, cols=1: a race between the threads of a block \(.*race on `s\[\d+\]`: "
                                         r"thread \d+ wrote it at line 22, thread \d+ read it at line 22"),
    ([("float m = xr[0];", "float m = 0.0f;")], r"row 2, every value -300, gives 5 nan in y, where each entry is 1 / 5: "
                                                r"the max you subtract is above the row's values \(did it start at 0\?\)"),
    ([(MAX_LOOP, MAX_LOOP.replace("c < cols", "c < rows * cols").replace("xr[c]", "x[c]")),
      (SUM_LOOP, SUM_LOOP.replace("c < cols", "c < rows * cols").replace("xr[c]", "x[c]"))],
     r"rows=3, cols=5: y sums to 1 over the whole matrix, not in each row \(row sums 0, 1, 0\): the sum is over all rows "
     r"instead of one"),
    ([("x + (long long)blockIdx.x * cols", "x")], r"every row of y holds the softmax of row 0"),
    ([("y + (long long)blockIdx.x * cols", "y + blockIdx.x * blockDim.x")],
     r"rows=3, cols=5: the emulator stopped your kernel: .*out-of-bounds access y\[(256|512)\]: 'y' has 15 elements"),
    ([("c < cols; c += blockDim.x) yr[c]", "c <= cols; c += blockDim.x) yr[c]")],
     r"rows=1, cols=1: .*out-of-bounds access x\[1\]"),
    ([("if (t < h) s[t] += s[t + h];\n        __syncthreads();", "if (t < h) { s[t] += s[t + h]; __syncthreads(); }")],
     r"rows=1, cols=1: a race between the threads of a block \(.*race on `s\[0\]`: thread 0 wrote it at line 22, thread "
     r"\d+ read it at line 24"),
    ([("for (int c = t; c < cols; c += blockDim.x) yr[c]",
       "int per = (cols + 255) / 256;\n    for (int c = t * per; c < cols && c < (t + 1) * per; ++c) yr[c]")],
     r"a warp's loads touch 7.46 sectors of 32 bytes on average; coalesced, they touch 4"),
    ([("__syncthreads();", "")], "does not use __syncthreads"),
    ([("__shared__ float s[256];", "float s[256];")], "does not use __shared__"),
])
def test_row_softmax_mistakes_are_named(softmax_solution, changes, match):
    source = softmax_solution
    for old, new in changes:
        assert old in source, old
        source = source.replace(old, new)
    with pytest.raises(ExerciseError, match=match):
        check.row_softmax(source)


@needs_cxx
def test_row_softmax_with_every_thread_working_through_the_row_fails_by_its_loads():
    with pytest.raises(ExerciseError, match=r"in a \(2, 1024\) softmax thread 0 of block 0 loads 2,052 floats from global "
                                            r"memory; a thread that works on its own 4 columns .* loads about 12"):
        check.row_softmax(SOFTMAX_SERIAL)


@needs_cxx
def test_row_softmax_asks_for_a_number_where_a_gpu_knows_no_infinity(softmax_solution):
    from labkit.kernels.tools import compiler_for_check

    if compiler_for_check() is None:
        pytest.skip("no NVRTC and no nvcc: the emulator alone cannot tell")
    with pytest.raises(ExerciseError, match=r"does not compile for a GPU(.|\n)*INFINITY comes from a C header"):
        check.row_softmax(softmax_solution.replace("float m = xr[0];", "float m = -INFINITY;"))


def test_row_softmax_hints_derive_it_a_step_at_a_time_without_the_code():
    from labkit.check.exercises import exercise

    hints = exercise("row_softmax").hints
    assert len(hints) >= 4
    text = " ".join(hints)
    for step in ("blockIdx.x", "t + blockDim.x", "fmaxf", "__syncthreads()", "s[0]", "expf(x - max)", "overflow"):
        assert step in text, step
    for code in ("s[t] = fmaxf(s[t], s[t + h])", "s[t] += s[t + h]", "for (int"):
        assert code not in text, code


@needs_cxx
def test_row_softmax_replays_with_the_checks_verdict(softmax_solution, tmp_path, monkeypatch):
    from conftest import record_check

    from labkit.check import common
    from labkit.grading import replay

    wrong = softmax_solution.replace("c += blockDim.x", "c += cols")
    assert record_check(monkeypatch, tmp_path / "right", "row_softmax", softmax_solution, 77) == (True, "")
    assert replay.replay("row_softmax", tmp_path / "right", 77)[0] is True
    plain = record_check(monkeypatch, tmp_path / "wrong", "row_softmax", wrong, 77)
    assert plain[0] is False and "stride over the row" in plain[1]
    monkeypatch.setattr(common, "_failed_runs", {})
    got = replay.replay("row_softmax", tmp_path / "wrong", 77)
    assert got[0] is False and got[1].split("\nStep")[0] == plain[1].split("\nStep")[0]


@pytest.mark.parametrize("got, said", [(np.array([1.0, 2.0]), r"expected one number, got ndarray of shape \(2,\)"),
                                       ("1.0", "expected one number, got str"), (True, "expected one number, got bool"),
                                       ([[1, 2]], r"got list of shape \(1, 2\)"), (None, "got NoneType")])
def test_one_number_names_what_came_back(got, said):
    with pytest.raises(check.ExerciseError, match=said):
        common.one_number("ex", "case 1", got, "expected one number", "return a float")


def test_one_number_takes_any_single_value_and_refuses_inf_where_asked():
    assert [common.one_number("ex", "", v, "x") for v in (2, np.float32(0.5), np.array(3.0), [4.0])] == [2, 0.5, 3, 4]
    with pytest.raises(check.ExerciseError, match="the value you returned is inf\nHint: divided by zero?"):
        common.one_number("ex", "", np.inf, "x", not_finite="divided by zero?")
