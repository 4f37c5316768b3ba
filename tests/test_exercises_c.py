"""The exercises added to labs 03 and 05, in C and CUDA C: simd_forward (one fused layer pass on vector lanes,
labkit.check.openmp) and naive_matmul (one thread per entry of C, labkit.check.kernels). The right answer passes, a
blank one is "not written yet", the typical wrong ones are each named by the check's message, every failed run shows
one more hint, and the grader's replay gives the check's own verdict. Also: the ladder of both labs, and the loads that
lab 05's question counts."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from conftest import needs_cc, needs_cxx, record_check

from labkit import check, openmp, report
from labkit.check import ExerciseError, common
from labkit.check.exercises import exercise, in_lab
from labkit.grading import assign, replay

KDIR = Path(__file__).parent / "kernels"
SEED = 515


def _lab(prefix: str):
    return nbformat.read(report.find_notebooks(only=prefix)[0], as_version=4)


# ---- the ladders ----------------------------------------------------------------------------------------------------

LADDERS = {"03": ["simd_forward", "loop_interchange", "omp_reduction"],
           "05": ["naive_matmul", "tiled_matmul", "block_reduction", "warp_reduction", "shared_transpose"]}


@pytest.mark.parametrize("lab", sorted(LADDERS))
def test_the_exercises_of_a_lab_easy_to_hard_each_with_its_derivation_as_hints(lab):
    assert [name for _, name in assign.exercises_in(_lab(f"{lab}_"))] == LADDERS[lab]  # in the notebook's order
    assert sorted(e.name for e in in_lab(lab)) == sorted(LADDERS[lab])
    for name in LADDERS[lab]:
        assert len(exercise(name).hints) >= 3, name


@pytest.mark.parametrize("lab, dictated, hinted", [
    ("03", ["reduction(+ : cost, gW1[:nW1]", "**`j` innermost**", "omp simd reduction(+ : acc)"],
     ["gW1[:nW1]", "j innermost", "reduction(+ : ...)"]),
    ("05", ["row = blockIdx.y * TILE + threadIdx.y", "for (int h = blockDim.x / 2", "atomicAdd(out, s[0])",
            "i + gridDim.x * blockDim.x"], ["blockIdx.x * blockDim.x", "h = blockDim.x / 2", "atomicAdd(out, s[0])"]),
])
def test_the_text_states_the_goal_and_leaves_the_derivation_to_the_hints(lab, dictated, hinted):
    text = "\n".join(c.source for c in _lab(f"{lab}_").cells if c.cell_type == "markdown")
    for answer in dictated:
        assert answer not in text, f"lab {lab}'s text still dictates {answer!r}"
    hints = " ".join(h for name in LADDERS[lab] for h in exercise(name).hints)
    for step in hinted:
        assert step in hints, f"lab {lab}: no hint gives {step!r}"


# ---- lab 03: one fused layer pass on vector lanes ------------------------------------------------------------------

FORWARD = r"""
void layer_forward(const float* W, const float* b, const float* x, float* a, int n_out, int n_in)
{
    for (int i = 0; i < n_out; ++i) {
        const float* w = W + (size_t)i * n_in;
        float acc = b[i];
        #pragma omp simd reduction(+ : acc)
        for (int j = 0; j < n_in; ++j) acc += w[j] * x[j];
        a[i] = sigmoid(acc);
    }
}
"""
# the rows on the lanes instead: each lane's sum is its own, so no reduction is needed
FORWARD_OUTER = r"""
void layer_forward(const float* W, const float* b, const float* x, float* a, int n_out, int n_in)
{
    #pragma omp simd
    for (int i = 0; i < n_out; ++i) {
        float z = b[i];
        for (int j = 0; j < n_in; ++j) z = z + W[i * n_in + j] * x[j];
        a[i] = 1.0f / (1.0f + expf(-z));
    }
}
"""
NO_REDUCTION = FORWARD.replace(" reduction(+ : acc)", "")


@needs_cc
def test_simd_forward_passes_the_right_answer_with_the_lanes_on_the_row_or_on_the_rows(capsys):
    check.simd_forward(FORWARD)
    check.simd_forward(FORWARD_OUTER)
    assert capsys.readouterr().out.count("✔ simd forward: all 6 checks passed") == 2


def test_simd_forward_blank_is_not_written_yet_and_gets_no_hint():
    blank = FORWARD.replace("    for (int i", f"    // {check.KERNEL_TODO}\n    for (int i")
    with pytest.raises(ExerciseError, match="not written yet") as e:
        check.simd_forward(blank)
    assert "Step" not in str(e.value)


@needs_cc
@pytest.mark.parametrize("old, new, match", [
    ("        #pragma omp simd reduction(+ : acc)\n", "", "no #pragma omp simd"),
    (" reduction(+ : acc)", "", "a race between vector lanes: the simd loop adds into acc"),
    ("acc += w[j] * x[j]", "acc = acc + w[j] * x[j]", None),  # the same sum written out, with its reduction: right
    ("sigmoid(acc)", "acc", "n_out=1, n_in=1: a holds z = W x \\+ b: the sigmoid is missing"),
    ("float acc = b[i];", "float acc = 0.0f;", "the bias b is missing"),
    ("w[j]", "W[(size_t)j * n_out + i]", "n_out=5, n_in=5: W is read by columns"),
    ("j < n_in", "j <= n_in", "outside an array.*in layer_forward, line 8 of yours.c"),
    ("a[i] = sigmoid(acc);", "", "a is never written"),
])
def test_simd_forward_mistakes_are_named(old, new, match, capsys):
    assert old in FORWARD
    source = FORWARD.replace(old, new)
    if match is None:
        check.simd_forward(source)
        assert "✔" in capsys.readouterr().out
        return
    with pytest.raises(ExerciseError, match=f"(?s){match}"):
        check.simd_forward(source)


def test_simd_forward_race_names_every_unreduced_sum_and_only_those():
    two = FORWARD.replace("float acc = b[i];", "float acc = b[i], sq = 0.0f;").replace(
        "acc += w[j] * x[j];", "{ acc += w[j] * x[j]; sq += w[j] * w[j]; }")
    with pytest.raises(ExerciseError, match=r"adds into sq from every lane"):
        check.simd_forward(two)
    assert check.openmp._simd_races(two.replace("reduction(+ : acc)", "reduction(+ : acc, sq)")) == []
    assert check.openmp._simd_races(FORWARD_OUTER) == []  # z is declared inside the loop: one per lane


def test_simd_forward_gives_one_more_hint_after_each_failed_run():
    hints = exercise("simd_forward").hints
    seen = []
    for _ in range(len(hints) + 1):
        with pytest.raises(ExerciseError) as e:
            check.simd_forward(NO_REDUCTION)
        seen.append(str(e.value))
    for k, message in enumerate(seen[:len(hints)], 1):
        assert f"Step {k} of {len(hints)}" in message and hints[k - 1] in message
    assert hints[-1] in seen[-1]  # the last one repeats
    with pytest.raises(ExerciseError) as e:
        check.simd_forward(FORWARD.replace("    for (int i", f"    // {check.KERNEL_TODO}\n    for (int i"))
    assert "Step" not in str(e.value)


def test_without_simd_takes_out_the_directive_and_nothing_else():
    plain = openmp.without_simd(FORWARD)
    assert "#pragma" not in plain and plain.replace("\n", "") == FORWARD.replace(
        "        #pragma omp simd reduction(+ : acc)", "").replace("\n", "")


# ---- lab 05: the naive matmul, one thread per entry of C -----------------------------------------------------------

@pytest.fixture(scope="module")
def naive():
    return (KDIR / "naive_matmul_solution.cu").read_text()


ROW = "int row = blockIdx.y * blockDim.y + threadIdx.y;"
COL = "int col = blockIdx.x * blockDim.x + threadIdx.x;"
GUARD = "if (row < M && col < N) {"
SUM = "acc += A[row * K + k] * B[k * N + col];"


@needs_cxx
def test_naive_matmul_passes_the_right_answer(naive, capsys):
    check.naive_matmul(naive)
    assert "✔ naive matmul: all 6 checks passed" in capsys.readouterr().out


def test_naive_matmul_blank_is_not_written_yet_and_gets_no_hint(naive):
    with pytest.raises(ExerciseError, match="not written yet") as e:
        check.naive_matmul(naive.replace("    " + ROW, f"    // {check.KERNEL_TODO}\n    " + ROW))
    assert "Step" not in str(e.value)


@needs_cxx
@pytest.mark.parametrize("changes, match", [
    ([("C[row * N + col]", "C[col * M + row]")], "M=16, N=16, K=16: row and col swapped: C is transposed"),
    ([(SUM, "acc += A[col * K + k] * B[k * N + row];")], "row and col swapped: C is transposed"),
    ([(ROW, "int row = blockIdx.x * blockDim.x + threadIdx.x;"), (COL, "int col = blockIdx.y * blockDim.y + threadIdx.y;")],
     r"M=32, N=48, K=16: 512 entries of C were never written: row and col come from the wrong dimensions"),
    ([(GUARD, "{")], r"M=1, N=1, K=1: threads past the edge read outside B .*out-of-bounds access B\[1\]"),
    ([(GUARD + "\n        float acc = 0.0f;", "{\n        float acc = 0.0f;\n        if (row < M && col < N)")],
     r"M=1, N=1, K=1: threads past the edge write outside C .*out-of-bounds access C\[1\]"),
    ([("blockIdx.y * blockDim.y + ", ""), ("blockIdx.x * blockDim.x + ", "")],
     "only the first 16 x 16 entries of C were written: every block computes the same entries"),
    ([("A[row * K + k]", "A[row * N + k]")], r"an index runs outside A, although the size is a multiple of the block"),
    ([(SUM, "acc += A[row * K + k] * B[k * N + col] + 1.0f;")],
     r"M=16, N=16, K=16: C\[0, 0\] is .* \(yours\) but should be .* \(spec\); 256 of 256 entries wrong"),
    ([("int M, int N, int K", "long long M, int N, int K")], "parameters do not fit the launch"),
])
def test_naive_matmul_mistakes_are_named(naive, changes, match):
    source = naive
    for old, new in changes:
        assert old in source, old
        source = source.replace(old, new)
    with pytest.raises(ExerciseError, match=f"(?s){match}"):
        check.naive_matmul(source)


@needs_cxx
def test_naive_matmul_gives_one_more_hint_after_each_failed_run(naive):
    wrong = naive.replace("blockIdx.y * blockDim.y + ", "").replace("blockIdx.x * blockDim.x + ", "")
    hints = exercise("naive_matmul").hints
    seen = []
    for _ in range(len(hints) + 1):  # compiled once: the emulator's cache serves the later runs
        with pytest.raises(ExerciseError) as e:
            check.naive_matmul(wrong)
        seen.append(str(e.value))
    for k, message in enumerate(seen[:len(hints)], 1):
        assert f"Step {k} of {len(hints)}" in message and hints[k - 1] in message
    assert hints[-1] in seen[-1]


@needs_cxx
def test_the_loads_lab_05_asks_about_are_counted_for_yours_and_for_labkits(naive):
    from labkit.kernels import counts

    tiled = (KDIR / "tiled_matmul_solution.cu").read_text()
    assert counts.matmul_loads(naive, "naive", n=32) == (32.0, "yours")
    assert counts.matmul_loads(tiled.replace("#define TILE 16", "#define TILE 8"), "tiled", n=32) == (4.0, "yours")
    reads, whose = counts.matmul_loads(f"// {check.KERNEL_TODO}", "tiled", n=32)
    assert reads == 2.0 and whose.startswith("labkit's")
    counted = counts.counting_source(naive, "matmul_naive", "A")
    assert "labkit_loads_A" in counted and re.search(r"unsigned int\* labkit_loads_\s*\)", counted)


# ---- the four exercises the labs had: their derivation now comes as hints -----------------------------------------

OMP_SERIAL = r"""
double my_bp_omp(const float* W1, const float* b1, const float* W2, const float* b2, const float* x, const float* y,
                 int B, int n_in, int n_hid, int n_out, float* gW1, float* gb1, float* gW2, float* gb2)
{
    zero_grads(n_in, n_hid, n_out, gW1, gb1, gW2, gb2);
    float* work = malloc(sizeof(float) * 2 * n_hid);
    double cost = 0.0;
    for (int s = 0; s < B; ++s)
        cost += add_sample(W1, b1, W2, b2, x + (size_t)s * n_in, y + (size_t)s * n_out, n_in, n_hid, n_out, work,
                           gW1, gb1, gW2, gb2);
    free(work);
    return cost;
}
"""
OUTER_PAST_THE_ROW = r"""
void outer_acc(const float* d, const float* x, float* g, int B, int n_out, int n_in)
{
    for (int i = 0; i < n_out; ++i)
        for (int s = 0; s < B; ++s)
            for (int j = 0; j <= n_in; ++j) g[(size_t)i * n_in + j] += d[(size_t)s * n_out + i] * x[(size_t)s * n_in + j];
}
"""


def _wrong_kernel(name: str) -> str:
    solution = (KDIR / ("tiled_matmul_solution.cu" if name == "tiled_matmul" else "block_sum_solution.cu")).read_text()
    return solution.replace("__syncthreads();", "") if name == "tiled_matmul" else solution.replace(
        "atomicAdd(out, s[0]);", "out[0] = s[0];")


@needs_cc
@needs_cxx
@pytest.mark.parametrize("name, match", [
    ("omp_reduction", "no OpenMP directive"),
    ("loop_interchange", "outside an array"),
    ("tiled_matmul", "does not use __syncthreads"),
    ("block_reduction", "does not use atomicAdd"),
])
def test_the_four_older_exercises_give_their_hints_one_at_a_time(name, match):
    wrong = {"omp_reduction": OMP_SERIAL, "loop_interchange": OUTER_PAST_THE_ROW}.get(name) or _wrong_kernel(name)
    hints = exercise(name).hints
    for k in range(1, len(hints) + 1):
        with pytest.raises(ExerciseError, match=match) as e:
            getattr(check, name)(wrong)
        assert f"Step {k} of {len(hints)}" in str(e.value) and hints[k - 1] in str(e.value)


# ---- the grader's replay ---------------------------------------------------------------------------------------------

@needs_cc
@needs_cxx
@pytest.mark.parametrize("name, old, new", [
    ("simd_forward", "sigmoid(acc)", "acc"),
    ("naive_matmul", "C[row * N + col]", "C[col * M + row]"),
])
def test_the_replay_gives_the_checks_verdict_and_message(tmp_path, monkeypatch, naive, name, old, new):
    right = FORWARD if name == "simd_forward" else naive
    wrong = right.replace(old, new)
    assert wrong != right

    def record(folder, source, seed=SEED):
        return record_check(monkeypatch, folder, name, source, seed)

    assert record(tmp_path / "right", right) == (True, "")
    assert replay.replay(name, tmp_path / "right", SEED)[0] is True
    plain = record(tmp_path / "wrong", wrong)
    assert plain[0] is False
    monkeypatch.setattr(common, "_failed_runs", {})  # the grader counts its own failed runs
    got = replay.replay(name, tmp_path / "wrong", SEED)
    assert got[0] is False and got[1].split("\nStep")[0] == plain[1].split("\nStep")[0]
