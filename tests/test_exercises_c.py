"""The exercises added to labs 03 and 05, in C and CUDA C: simd_forward (one fused layer pass on vector lanes,
labkit.check.openmp), reduction_by_hand (OpenMP's reduction written out: private blocks, then a combine shared out by
entries) and naive_matmul (one thread per entry of C, labkit.check.kernels): the answers of these and of lab 03's
other exercises for the contract every exercise keeps (``CONTRACT``, tests/test_contract.py: right, blank, hints,
replay, labkit's own), and the typical wrong ones, each named by the check's message. Also: the ladder of both labs,
and the loads that lab 05's question counts."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import pytest
from conftest import Answers, Mistake, Reference, Wrong, needs_cc, needs_cxx
from test_openmp import GOOD_OMP, GOOD_OUTER

from labkit import check, openmp, runner
from labkit.check import ExerciseError
from labkit.check.capture import _c_function
from labkit.check.exercises import exercise, in_lab
from labkit.grading import assign
from labkit.kernels.loader import KERNEL_DIR

KDIR = Path(__file__).parent / "kernels"
SEED = 515


def _lab(prefix: str):
    return nbformat.read(runner.find_notebooks(only=prefix)[0], as_version=4)


# ---- the ladders ----------------------------------------------------------------------------------------------------

LADDERS = {"03": ["simd_forward", "loop_interchange", "omp_reduction", "reduction_by_hand"],
           "05": ["naive_matmul", "tiled_matmul", "block_reduction", "warp_reduction", "shared_transpose", "row_softmax",
                  "fast_matmul"]}


@pytest.mark.parametrize("lab", sorted(LADDERS))
def test_the_exercises_of_a_lab_easy_to_hard_each_with_its_derivation_as_hints(lab):
    assert [name for _, name in assign.exercises_in(_lab(f"{lab}_"))] == LADDERS[lab]  # in the notebook's order
    assert sorted(e.name for e in in_lab(lab)) == sorted(LADDERS[lab])
    for name in LADDERS[lab]:
        assert len(exercise(name).hints) >= 3, name
    assert len(exercise("reduction_by_hand").hints) >= 4


@pytest.mark.parametrize("lab, dictated, hinted", [
    ("03", ["reduction(+ : cost, gW1[:nW1]", "**`j` innermost**", "omp simd reduction(+ : acc)", "u * total + e",
            "mine + nW1"], ["name[start:length]", "which index must the innermost loop run over", "4 lanes and n_in = 8",
                            "Which two floats of the buffer"]),
    ("05", ["row = blockIdx.y * TILE + threadIdx.y", "for (int h = blockDim.x / 2", "atomicAdd(out, s[0])",
            "i + gridDim.x * blockDim.x", "s[t] = fmaxf(s[t], s[t + h])"],
     []),  # lab 05's steps hand out no code either now: what they ask is its owner's (tests/test_exercises_kernels.py)
])
def test_the_text_states_the_goal_and_leaves_the_derivation_to_the_hints(lab, dictated, hinted):
    text = "\n".join(c.source for c in _lab(f"{lab}_").cells if c.cell_type == "markdown")
    for answer in dictated:
        assert answer not in text, f"lab {lab}'s text still dictates {answer!r}"
    hints = " ".join(h for name in LADDERS[lab] for h in exercise(name).hints)
    for step in hinted:
        assert step in hints, f"lab {lab}: no hint gives {step!r}"


# what lab 03's solutions write, which no step of a ladder may hand out (beside each solution's lines)
SOLVED = ["u * total + e", "t * total", "mine + nW1", "gW1[:nW1]", "reduction(+ : acc)", "sigmoid(acc)",
          "omp_get_max_threads()", "i * n_in", "gi[j] += di"]


def _solution_lines(nb) -> list[str]:
    """The lines of a notebook's solution regions (comments aside) that its text does not already give."""
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    lines = []
    for cell in nb.cells:
        for region in re.findall(r"### BEGIN SOLUTION(.*?)### END SOLUTION", cell.source, re.S):
            lines += [ln for ln in (raw.split("//")[0].strip() for raw in region.splitlines())
                      if len(ln) >= 8 and ln not in text]
    return lines


def test_lab_03s_ladders_end_on_a_question_and_hand_out_no_line_of_the_solutions():
    solved = SOLVED + _solution_lines(_lab("03_"))
    for name in LADDERS["03"]:
        hints = exercise(name).hints
        assert "?" in hints[-1], f"{name}: the last step is a question or a smaller case, not the answer"
        for hint in hints:
            assert not [s for s in solved if s in hint], f"{name}: a step hands out {[s for s in solved if s in hint]}"


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
def test_simd_forward_passes_the_lanes_on_the_rows(capsys):
    check.simd_forward(FORWARD_OUTER)
    assert "✔ simd forward: all 7 checks passed" in capsys.readouterr().out


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


def test_without_simd_takes_out_the_directive_and_nothing_else():
    plain = openmp.without_simd(FORWARD)
    assert "#pragma" not in plain and plain.replace("\n", "") == FORWARD.replace(
        "        #pragma omp simd reduction(+ : acc)", "").replace("\n", "")


# ---- lab 03: the reduction by hand, private blocks and a combine split over the entries ----------------------------

PRIVATE_HEAD = r"""
double my_bp_private(const float* W1, const float* b1, const float* W2, const float* b2, const float* x, const float* y,
                     int B, int n_in, int n_hid, int n_out, float* gW1, float* gb1, float* gW2, float* gb2)
{
    const size_t nW1 = (size_t)n_hid * n_in, nW2 = (size_t)n_out * n_hid, total = nW1 + n_hid + nW2 + n_out;
    double cost = 0.0;
"""
PRIVATE_TAIL = """    return cost;
}
"""
PRIVATE = PRIVATE_HEAD + r"""    const int p = omp_get_max_threads();
    float* blocks = calloc((size_t)p * total, sizeof(float));
    double* costs = calloc(p, sizeof(double));
    #pragma omp parallel num_threads(p)
    {
        const int t = omp_get_thread_num();
        float *mine = blocks + (size_t)t * total, *work = malloc(sizeof(float) * 2 * n_hid);
        #pragma omp for
        for (int s = 0; s < B; ++s)
            costs[t] += add_sample(W1, b1, W2, b2, x + (size_t)s * n_in, y + (size_t)s * n_out, n_in, n_hid, n_out,
                                   work, mine, mine + nW1, mine + nW1 + n_hid, mine + nW1 + n_hid + nW2);
        free(work);
        #pragma omp for
        for (size_t e = 0; e < total; ++e) {
            float sum = 0.0f;
            for (int u = 0; u < p; ++u) sum += blocks[(size_t)u * total + e];
            if (e < nW1) gW1[e] = sum;
            else if (e < nW1 + n_hid) gb1[e - nW1] = sum;
            else if (e < nW1 + n_hid + nW2) gW2[e - nW1 - n_hid] = sum;
            else gb2[e - nW1 - n_hid - nW2] = sum;
        }
    }
    for (int u = 0; u < p; ++u) cost += costs[u];
    free(blocks);
    free(costs);
""" + PRIVATE_TAIL
# the other way the text allows: the buffer allocated inside the region under omp single, a thread's cost in a local
# variable, the combine one omp for per array; a simd reduction over the threads' blocks is no reduction between threads
PRIVATE_SINGLE = PRIVATE_HEAD + r"""    float* blocks;
    double* costs;
    int p;
    #pragma omp parallel
    {
        #pragma omp single
        {
            p = omp_get_num_threads();
            blocks = calloc((size_t)p * total, sizeof(float));
            costs = malloc(sizeof(double) * p);
        }
        const int t = omp_get_thread_num();
        float* mine = blocks + (size_t)t * total;
        float* work = malloc(sizeof(float) * 2 * n_hid);
        double c = 0.0;
        #pragma omp for
        for (int s = 0; s < B; ++s)
            c += add_sample(W1, b1, W2, b2, x + (size_t)s * n_in, y + (size_t)s * n_out, n_in, n_hid, n_out, work,
                            mine, mine + nW1, mine + nW1 + n_hid, mine + nW1 + n_hid + nW2);
        costs[t] = c;
        free(work);
        float* g[4] = {gW1, gb1, gW2, gb2};
        const size_t start[5] = {0, nW1, nW1 + n_hid, nW1 + n_hid + nW2, total};
        for (int a = 0; a < 4; ++a) {
            #pragma omp for nowait
            for (size_t e = start[a]; e < start[a + 1]; ++e) {
                float sum = 0.0f;
                #pragma omp simd reduction(+ : sum)
                for (int u = 0; u < p; ++u) sum += blocks[(size_t)u * total + e];
                g[a][e - start[a]] = sum;
            }
        }
    }
    for (int u = 0; u < p; ++u) cost += costs[u];
    free(blocks);
    free(costs);
""" + PRIVATE_TAIL
COMBINE = """        #pragma omp for
        for (size_t e = 0; e < total; ++e) {
            float sum = 0.0f;
            for (int u = 0; u < p; ++u) sum += blocks[(size_t)u * total + e];
            if (e < nW1) gW1[e] = sum;
            else if (e < nW1 + n_hid) gb1[e - nW1] = sum;
            else if (e < nW1 + n_hid + nW2) gW2[e - nW1 - n_hid] = sum;
            else gb2[e - nW1 - n_hid - nW2] = sum;
        }
"""
SAMPLES = "        #pragma omp for\n        for (int s"


@needs_cc
def test_reduction_by_hand_passes_the_buffer_allocated_under_single_and_reads_code_not_comments(capsys):
    check.reduction_by_hand(PRIVATE_SINGLE)
    # what the exercise refuses is read from the code, not from its comments
    check.reduction_by_hand(PRIVATE.replace("    double cost = 0.0;\n", "    double cost = 0.0;  // not reduction(+ : cost)\n"
                                            "    /* #pragma omp atomic, #pragma omp critical, omp_set_lock(&l) */\n"))
    assert capsys.readouterr().out.count("✔ reduction by hand at 1, 2") == 2


@pytest.mark.parametrize("old, new, used", [
    ("#pragma omp parallel num_threads(p)", "#pragma omp parallel num_threads(p) reduction(+ : costs[:p])",
     "a reduction clause"),
    ("        #pragma omp for\n        for (size_t e",
     "        #pragma omp parallel for reduction(+ : cost)\n        for (size_t e", "a reduction clause"),
    ("            costs[t] += add_sample", "            #pragma omp atomic\n            cost += add_sample", "omp atomic"),
    ("            if (e < nW1)", "            #pragma omp critical\n            if (e < nW1)", "omp critical"),
    ("        free(work);\n", "        free(work);\n        omp_lock_t lock;\n        omp_init_lock(&lock);\n",
     "an OpenMP lock"),
])
def test_reduction_by_hand_refuses_openmps_own_reduction_and_turn_taking(old, new, used):
    assert old in PRIVATE
    with pytest.raises(ExerciseError, match=f"uses {used}: this exercise builds the reduction itself"):
        check.reduction_by_hand(PRIVATE.replace(old, new))


@needs_cc
@pytest.mark.parametrize("changes, match", [
    # one block for all threads: they add into the same entries, seen inside add_sample whatever the scheduler does
    ([("blocks + (size_t)t * total", "blocks")], "a race: .* two threads were inside add_sample at the same moment"),
    # malloc'd blocks, never zeroed: the check's malloc hands out NaN, as a reused one hands out old sums
    ([("calloc((size_t)p * total, sizeof(float))", "malloc(sizeof(float) * p * total)")],
     "with 1 thread, 6 of 6 runs .*NaN in the gradients.*a block never zeroed"),
    ([(COMBINE, "")], "gW1, gb1, gW2, gb2 never written .*not combined into them"),
    ([("gb2[e - nW1 - n_hid - nW2] = sum", "gb2[e - nW1 - n_hid - nW2] += sum")],
     "NaN in the gradients, which are right when gW1..gb2 arrive holding zeros: your code adds into them"),
    # the combine on one thread: right values, the rule broken
    ([(COMBINE, COMBINE.replace("omp for", "omp single"))], "the values are right, but .*the combine of the blocks runs "
                                                           "on one thread"),
    ([(COMBINE, ""), ("    for (int u = 0; u < p; ++u) cost", COMBINE.replace("#pragma omp for\n", "").replace(
        "        ", "    ") + "    for (int u = 0; u < p; ++u) cost")], "the combine of the blocks runs on one thread"),
    # before the samples are done: no barrier between a thread's samples and its share of the combine
    ([(SAMPLES, SAMPLES.replace("omp for", "omp for nowait"))],
     "with 2 threads, .*the combine starts before every thread has finished its samples"),
    ([(SAMPLES, "        for (int s")], "with 2 threads, .*your loop over the samples is not under omp for"),
    # the cost: lost, one thread's only, or summed into the one shared variable
    ([("    for (int u = 0; u < p; ++u) cost += costs[u];\n", "")],
     "with 1 thread, .*the gradients are right, but the cost is 0: the threads' costs were never added"),
    ([("for (int u = 0; u < p; ++u) cost += costs[u];", "cost = costs[0];")],
     r"with 2 threads, 6 of 6 runs .*the cost is 0\.\d+ of the reference: not every thread's cost was added"),
    ([("costs[t] += add_sample", "cost += add_sample")], "a race on the cost"),  # named by the code, before any run
    # the samples under omp single: one thread does them all, while the others wait
    ([(SAMPLES, "        #pragma omp single\n        for (int s")], "the samples ran one at a time"),
    ([("calloc((size_t)p * total, sizeof(float))", "calloc(total, sizeof(float))")],
     r"in my_bp_private \(in its parallel region\), line 16 of yours.c"),
])
def test_reduction_by_hand_mistakes_are_named(changes, match):
    source = PRIVATE
    for old, new in changes:
        assert old in source, old
        source = source.replace(old, new)
    with pytest.raises(ExerciseError, match=f"(?s){match}"):
        check.reduction_by_hand(source, runs=12 if "a race" in match else 6)  # a lost update is not in every run



# The families of wrong answers whose values are right at the counts of a plain run: a buffer of fixed size, the
# count asked for ignored, memory never freed, every thread asked for counted on
ZEROED_BY_EACH_THREAD = [
    ("float* blocks = calloc((size_t)p * total, sizeof(float));", "float* blocks = malloc(sizeof(float) * p * total);"),
    ("double* costs = calloc(p, sizeof(double));", "double* costs = malloc(sizeof(double) * p);"),
    ("        const int t = omp_get_thread_num();\n", "        const int t = omp_get_thread_num();\n"
     "        memset(blocks + (size_t)t * total, 0, sizeof(float) * total);\n        costs[t] = 0.0;\n"
     "        #pragma omp barrier\n")]


@needs_cc
@pytest.mark.parametrize("changes, match", [
    ([("double* costs = calloc(p, sizeof(double));", "double costs[8] = {0};"), ("    free(costs);\n", "")],
     r"with a team of 100 threads: .*an access outside a local array.*line 16 of yours.c.*Hint: .*fixed size"),
    ([("double* costs = calloc(p, sizeof(double));",
       "static double costs[64];\n    for (int u = 0; u < p; ++u) costs[u] = 0.0;"), ("    free(costs);\n", "")],
     r"with a team of 100 threads: .*index 64 out of bounds for type 'double \[64\]'"),
    ([("const int p = omp_get_max_threads();", "const int p = 4;")],
     r"asked for 1, 2, \d.*100 threads .*your samples ran in teams of 4, 4, .*4: your code sets the size of its team "
     "itself, and ignores the count it is asked for"),
    ([("const int p = omp_get_max_threads();", "const int p = omp_get_max_threads() < 8 ? omp_get_max_threads() : 8;")],
     r"your samples ran in teams of 1, 2, .*, 8: your code sets the size of its team itself"),
    # no parallel region: the two omp for share their loops among a team of one
    ([("    #pragma omp parallel num_threads(p)\n", "")], r"your samples ran in teams of 1, 1, .*1: your code runs on one "
                                                          "thread"),
    ([("        free(work);\n", ""), ("    free(costs);\n", "")],
     r"after one call with 1 thread 2 allocations of your code were never freed \(1 from line 9, 1 from line 13\): "
     "memory not freed"),
    (ZEROED_BY_EACH_THREAD, r"NaN in the gradients when the team is smaller than asked for: .*gets 1 thread while "
                            r"omp_get_max_threads\(\) still says \d.*counts on every thread it asked for having run"),
])
def test_reduction_by_hand_names_what_right_values_at_a_few_counts_hide(changes, match):
    source = PRIVATE
    for old, new in changes:
        assert old in source, old
        source = source.replace(old, new)
    with pytest.raises(ExerciseError, match=f"(?s){match}"):
        check.reduction_by_hand(source, runs=1)

# ---- lab 05: the naive matmul, one thread per entry of C -----------------------------------------------------------

NAIVE = (KDIR / "naive_matmul_solution.cu").read_text()


@pytest.fixture(scope="module")
def naive():
    return NAIVE


ROW = "int row = blockIdx.y * blockDim.y + threadIdx.y;"
COL = "int col = blockIdx.x * blockDim.x + threadIdx.x;"
GUARD = "if (row < M && col < N) {"
SUM = "acc += A[row * K + k] * B[k * N + col];"


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
# lab 03's notebook's solutions of its first two exercises, as tests/test_openmp.py holds them
OUTER, OMP = GOOD_OUTER, GOOD_OMP


# ---- the contract's answers (tests/test_contract.py) ---------------------------------------------------------------

def _blank(source: str, before: str) -> str:
    """The exercise as a student version hands it out: its body still says YOUR CODE HERE."""
    assert before in source
    return source.replace(before, f"// {check.KERNEL_TODO}\n    {before}", 1)


def _labkits(file: str, function: str, prefix: str, name: str) -> str:
    """labkit's own ``function`` of ``file``, as a student would copy it into the exercise's function ``name``."""
    return prefix + _c_function((KERNEL_DIR.parent / file).read_text(), function).replace(function, name, 1) + "\n"


CONTRACT = {
    "loop_interchange": Answers(
        OUTER, Wrong(OUTER_PAST_THE_ROW, "outside an array", (needs_cc,)), blank=_blank(OUTER, "for (int i"),
        # judged on cachegrind's exact counts where Valgrind is here; without it, a right answer must also be timed 1.5x
        # faster than the naive order: alone then, as the claims (beside two other test workers the row order once ran
        # 3x slower than its usual for three measurements in a row)
        passes="✔ loop interchange (", marks=(needs_cc, *(() if shutil.which("valgrind") else (pytest.mark.quiet,)))),
    "omp_reduction": Answers(
        OMP, Wrong(OMP_SERIAL, "no OpenMP directive"), blank=_blank(OMP, "const size_t"),
        passes="✔ OpenMP reduction at 1, 2",
        marks=(needs_cc,), references=(Reference(_labkits("c/backprop.c", "bp_omp_reduction", "double ", "my_bp_omp"),
                                                 "labkit/c/backprop.c (bp_omp_reduction)"),)),
    "simd_forward": Answers(
        FORWARD, Wrong(NO_REDUCTION, "a race between vector lanes"), blank=_blank(FORWARD, "for (int i"),
        passes="✔ simd forward: all 7 checks passed", marks=(needs_cc,),
        replayed=Wrong(FORWARD.replace("sigmoid(acc)", "acc"), "the sigmoid is missing", (needs_cc,))),
    "reduction_by_hand": Answers(
        PRIVATE, Wrong(PRIVATE.replace("            costs[t] += add_sample", "            #pragma omp atomic\n"
                                       "            cost += add_sample"), "uses omp atomic"),
        blank=PRIVATE_HEAD + f"    // {check.KERNEL_TODO}\n" + PRIVATE_TAIL, passes="✔ reduction by hand at 1, 2",
        marks=(needs_cc,),
        replayed=Wrong(PRIVATE.replace("gb2[e - nW1 - n_hid - nW2] = sum", "gb2[e - nW1 - n_hid - nW2] += sum"),
                       "adds into them", (needs_cc,))),  # a second run finds the gradients holding the first's sums
    "naive_matmul": Answers(
        NAIVE, NAIVE.replace("blockIdx.y * blockDim.y + ", "").replace("blockIdx.x * blockDim.x + ", ""),
        blank=_blank(NAIVE, ROW), passes="✔ naive matmul: all 6 checks passed", marks=(needs_cxx,),
        replayed=Wrong(NAIVE.replace("C[row * N + col]", "C[col * M + row]"), "row and col swapped", (needs_cxx,)),
        references=(Reference(_labkits("kernels/matmul.cu", "matmul_naive", 'extern "C" __global__ void ',
                                       "matmul_naive"), "labkit/kernels/matmul.cu (matmul_naive)", passes=False),)),
}


# ---- lab 03's mistakes that a plain run lets through, or blames on another cause: each named, with its own hint ----

# one work array for the whole team: the reduction is there, the threads overwrite each other's scratch mid-sample
SHARED_WORK = OMP.replace("""    #pragma omp parallel reduction""", """    float* work = malloc(sizeof(float) * 2 * n_hid);
    #pragma omp parallel reduction""").replace("        float* work = malloc(sizeof(float) * 2 * n_hid);\n", "").replace(
    "        free(work);\n    }\n", "    }\n    free(work);\n")
# each thread's private copy of gW1 is n_in floats long: add_sample writes past it
SHORT_SECTION = OMP.replace("gW1[:nW1]", "gW1[:n_in]")
# the cost summed per thread, then added into the shared one with nothing to keep the threads apart
COST_AFTER_LOOP = OMP.replace("reduction(+ : cost, ", "reduction(+ : ").replace(
    "        #pragma omp for", "        double c = 0.0;\n        #pragma omp for").replace(
    "cost += add_sample", "c += add_sample").replace("        free(work);", "        cost += c;\n        free(work);")
# the sigmoid in a second pass over a
TWO_PASSES = FORWARD.replace("a[i] = sigmoid(acc);", "a[i] = acc;").replace(
    "    }\n}", "    }\n    for (int i = 0; i < n_out; ++i) a[i] = sigmoid(a[i]);\n}")
# each thread's cost added into the shared cost, unprotected, after its samples
HAND_COST_AFTER_LOOP = PRIVATE_SINGLE.replace("        costs[t] = c;\n", "        cost += c;\n").replace(
    "    for (int u = 0; u < p; ++u) cost += costs[u];\n", "")

MISTAKES = {
    "simd_forward": (
        Mistake(TWO_PASSES, r"the values are right, but your layer_forward walks the output a in 2 loops",
                r"a second loop over a is what fusing removes", (needs_cc,)),
    ),
    "loop_interchange": (
        Mistake(OUTER.replace("gi[j] += di", "gi[j] = di"), r"g holds the last sample's product alone, so each "
                r"sample overwrote g", r"every sample adds its product", (needs_cc,)),
    ),
    "omp_reduction": (
        Mistake(SHARED_WORK, r"a race on the work array: .* the same work array\.",
                r"work is scratch space for one sample .* each thread needs one of its own", (needs_cc,)),
        Mistake(SHORT_SECTION, r"your reduction's array section gW1\[:n_in\] covers 784 floats, but gW1 holds "
                r"n_hid x n_in = 23,520", r"each section must run over its whole array", (needs_cc,)),
        Mistake(COST_AFTER_LOOP, r"a race on cost: .*\(cost \+= c;\) with no reduction, atomic or critical",
                r"Each thread needs a sum of its own", (needs_cc,)),
    ),
    "reduction_by_hand": (
        Mistake(HAND_COST_AFTER_LOOP, r"a race on cost: .*\(cost \+= c;\)", r"keep cost apart per thread",
                (needs_cc,)),
    ),
}


@pytest.mark.parametrize("source, races", [
    (OMP, []), (PRIVATE, []), (PRIVATE_SINGLE, []), (COST_AFTER_LOOP, [("cost", "cost += c;")]),
    (OMP.replace("reduction(+ : cost, ", "reduction(+ : "), [("cost", "cost += add_sample(W1, b1, W2, b2, x + (size_t)s "
                                                                   "* n_in, y + (size_t)s * n_out, n_in, n_hid, n_out, "
                                                                   "work,")]),
    # kept apart: atomic, critical, private, declared inside the region, the loop variable of omp for
    (COST_AFTER_LOOP.replace("        cost += c;", "        #pragma omp atomic\n        cost += c;"), []),
    (COST_AFTER_LOOP.replace("        cost += c;", "        #pragma omp critical\n        { cost += c; }"), []),
    (COST_AFTER_LOOP.replace("#pragma omp parallel reduction", "#pragma omp parallel private(cost) reduction"), []),
    ("void f(int B, double* v)\n{\n    int s;\n    double t = 0;\n    #pragma omp parallel for reduction(+ : t)\n"
     "    for (s = 0; s < B; s += 1) t += v[s];\n}\n", []),
])
def test_the_sums_a_team_shares_unprotected_are_read_from_the_code(source, races):
    from labkit.native.csource import strip_comments

    assert check.openmp._shared_sums(strip_comments(source)) == races


def test_the_reductions_sections_are_measured_against_their_arrays():
    from labkit.check.openmp import _bad_sections

    sizes = (601, 784, 30, 10)
    assert _bad_sections(OMP, "my_bp_omp", sizes) == []
    assert _bad_sections(OMP.replace("gW1[:nW1]", "gW1[0:(size_t)n_in * n_hid]"), "my_bp_omp", sizes) == []
    assert _bad_sections(SHORT_SECTION, "my_bp_omp", sizes) == ["gW1[:n_in] covers 784 floats, but gW1 holds "
                                                                "n_hid x n_in = 23,520"]
    assert _bad_sections(OMP.replace("gb2[:n_out]", "gb2[1:n_out]"), "my_bp_omp", sizes) == [
        "gb2[1:n_out] covers 10 floats from entry 1, but gb2 holds n_out = 10"]
    assert _bad_sections(OMP.replace("gW2[:nW2]", "gW2[:unknown]"), "my_bp_omp", sizes) == []  # nothing it can tell


def test_a_second_pass_over_the_output_is_counted():
    from labkit.check.openmp import _passes

    assert _passes(FORWARD, "layer_forward") == _passes(FORWARD_OUTER, "layer_forward") == 1
    assert _passes(TWO_PASSES, "layer_forward") == 2
