"""C on the host (labkit.hostc) and network.py's backprop in C (labkit.openmp), against the NumPy reference."""

import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import needs_cc

from labkit import hostc, mlp, openmp

pytestmark = needs_cc

SRC = r"""
void axpy(float a, const float* x, float* y, int n) {
    #pragma omp parallel for
    for (int i = 0; i < n; ++i) y[i] += a * x[i];
}
double dot(const double* x, const double* y, long long n) {
    double s = 0.0;
    for (long long i = 0; i < n; ++i) s += x[i] * y[i];
    return s;
}
static int helper(int k) { return k; }
void one_past_the_end(float* y, int n) {
    for (int i = 0; i <= n; ++i) y[i] = 1.0f;
}
int overflows(int a) { return a + 2147483647; }
void null_write(float* y, int n) { float* p = 0; if (n > 0) p[n] = y[0]; }
void forever(float* y) { volatile int k = 1; while (k) y[0] += 1.0f; }
"""


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(3)
    x = rng.random((13, 784), dtype=np.float32)
    return x, mlp.targets(rng.integers(0, 10, 13), 10, np.float32)


@pytest.mark.parametrize("width", [30, 100])
@pytest.mark.parametrize("opt", ["-O0", "-O2"])
@pytest.mark.parametrize("version", openmp.VERSIONS + openmp.OMP_VERSIONS)
def test_every_c_version_matches_numpy_per_sample_backprop(version, opt, width, batch):
    x, Y = batch
    params = mlp.init_params([784, width, 10], seed=1)
    want_loss, want = mlp.loss_and_grads_per_sample(params, x, Y)  # the mean over the batch
    for threads in ([1, 2, 4] if version.startswith("omp") else [None]):
        loss, got = openmp.backprop_c(params, x, Y, version, opt, threads=threads)
        assert loss / len(x) == pytest.approx(want_loss, rel=1e-5)
        for (gW, gb), (wW, wb) in zip(got, want):
            np.testing.assert_allclose(gW / len(x), wW, rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(gb / len(x), wb, rtol=1e-4, atol=1e-6)


def test_functions_are_found_called_and_their_threads_counted():
    m = hostc.load(SRC, openmp=True)
    assert set(m.functions) == {"axpy", "dot", "one_past_the_end", "overflows", "null_write", "forever"}  # no static
    x, y = np.arange(5, dtype=np.float32), np.ones(5, np.float32)
    m.axpy(np.float32(0), x, y, np.int32(5))
    default = m.axpy.threads_used  # OMP_NUM_THREADS, else one per core
    m.axpy(np.float32(2), x, y, np.int32(5), threads=default + 1)
    np.testing.assert_array_equal(y, 1 + 2 * x)
    assert m.axpy.threads_used == default + 1
    m.axpy(np.float32(0), x, y, np.int32(5))  # per call: the next call is back to the run's setting
    assert m.axpy.threads_used == default
    assert m.dot(np.ones(3), np.full(3, 2.0), np.int64(3)) == 6.0
    with pytest.raises(AttributeError, match="defines no callable function 'helper'"):
        m.get_function("helper")


def test_every_call_is_checked_against_the_c_signature():
    m = hostc.load(SRC)
    x, y = np.arange(5, dtype=np.float32), np.ones(5, np.float32)
    with pytest.raises(TypeError, match=r"argument 0 \(float a\) needs a float32.*pass float32\(2.0\)"):
        m.axpy(2.0, x, y, np.int32(5))
    with pytest.raises(TypeError, match=r"argument 1 \(const float\* x\) points to float, but the array's dtype is float64"):
        m.axpy(np.float32(2), x.astype(np.float64), y, np.int32(5))
    with pytest.raises(ValueError, match="not C-contiguous"):
        m.axpy(np.float32(2), np.ones(10, np.float32)[::2], y, np.int32(5))
    ro = np.ones(5, np.float32)
    ro.flags.writeable = False
    m.axpy(np.float32(2), ro, y, np.int32(5))  # const: read-only is fine
    with pytest.raises(ValueError, match=r"argument 2 \(float\* y\) is written by the function, but the array is read-only"):
        m.axpy(np.float32(2), x, ro, np.int32(5))
    with pytest.raises(TypeError, match="takes 4 arguments"):
        m.axpy(np.float32(2), x, y)


def test_checked_mode_names_the_fault_and_the_line_and_the_notebook_survives():
    m = hostc.load(SRC, checked=True)
    y = np.zeros(7, np.float32)
    with pytest.raises(hostc.CError, match=r"outside an array.*a write of 4 bytes in one_past_the_end, line 13 of code.c"):
        m.one_past_the_end(y, np.int32(7))
    assert not y.any(), "a failed checked call leaves the arrays as they were"
    with pytest.raises(hostc.CError, match=r"undefined behaviour \(line 15 of code.c\): signed integer overflow"):
        m.overflows(np.int32(5))
    with pytest.raises(hostc.CError, match=r"segmentation fault.*null_write, line 16"):
        m.null_write(y, np.int32(3))
    t0 = time.monotonic()
    with pytest.raises(hostc.CError, match="ran past the 2 s limit"):
        m.forever(y, timeout_s=2)
    assert time.monotonic() - t0 < 10
    x, out = np.arange(5, dtype=np.float32), np.ones(5, np.float32)
    hostc.load(SRC, checked=True, openmp=True).axpy(np.float32(3), x, out, np.int32(5), threads=2)
    np.testing.assert_array_equal(out, 1 + 3 * x)  # a clean checked call writes its results back


WORKER_FAULT = r"""
#include <omp.h>
void fault_in_a_worker(float* y, int n)
{
    #pragma omp parallel num_threads(2)
    {
        if (omp_get_thread_num() == 1)
            y[n] = 1.0f;
    }
}
"""


def test_a_fault_in_a_worker_thread_names_the_function_and_its_line():
    # A worker thread's stack holds only GCC's outlined region (fault_in_a_worker._omp_fn.0), not the function: the
    # message names the same function and line whichever thread faults.
    m = hostc.load(WORKER_FAULT, checked=True, openmp=True)
    y = np.zeros(3, np.float32)
    with pytest.raises(hostc.CError, match=r"a write of 4 bytes in fault_in_a_worker \(in its parallel region\), "
                                           r"line 8 of code.c"):
        m.fault_in_a_worker(y, np.int32(3), threads=2)


def test_a_compile_error_names_the_line():
    with pytest.raises(hostc.CCompileError, match=r"code.c:2:.*error"):
        hostc.load("void f(float* y) {\n    y[0] = undeclared;\n}\n")
    with pytest.raises(ValueError, match="opt must be one of"):
        hostc.load(SRC, opt="-O9")


def test_an_unclosed_bracket_is_a_compile_error_of_c():
    """The shared scanner's own error comes back as the C lab's, as the compiler's refusal would."""
    with pytest.raises(hostc.CCompileError, match=r"code.c did not compile: unbalanced '\(' at line 2"):
        hostc.load("int one(void) { return 1; }\nvoid f(float* y, int n {\n    y[0] = 1.0f;\n}\n")


def test_without_a_compiler_the_message_says_how_to_get_one(tmp_path):
    code = "from labkit import hostc\ntry:\n    hostc.compiler()\nexcept hostc.CompilerMissing as e:\n    print(e)\n"
    env = {**os.environ, "PATH": str(tmp_path), "CC": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60).stdout
    assert "none was found" in out and "apt install gcc" in out


def test_a_whole_epoch_in_c_takes_numpys_sgd_steps():
    rng = np.random.default_rng(5)
    x = rng.random((95, 784), dtype=np.float32)  # the last batch is short
    Y = mlp.targets(rng.integers(0, 10, 95), 10, np.float32)
    in_c = mlp.init_params([784, 30, 10], seed=2)
    in_numpy = [(W.copy(), b.copy()) for W, b in in_c]
    cost = openmp.train_epoch_c(in_c, x, Y, batch_size=10, lr=3.0)
    total = 0.0
    for lo in range(0, len(x), 10):
        loss, grads = mlp.loss_and_grads_per_sample(in_numpy, x[lo:lo + 10], Y[lo:lo + 10])
        total += loss * len(x[lo:lo + 10])
        for (W, b), (gW, gb) in zip(in_numpy, grads):
            W -= 3.0 * gW
            b -= 3.0 * gb
    assert cost == pytest.approx(total / len(x), rel=1e-4)
    for (Wc, bc), (Wn, bn) in zip(in_c, in_numpy):
        np.testing.assert_allclose(Wc, Wn, atol=1e-5)
        np.testing.assert_allclose(bc, bn, atol=1e-5)
    with pytest.raises(TypeError, match="C-contiguous float32"):
        openmp.train_epoch_c(mlp.init_params([784, 30, 10], dtype=np.float64), x, Y)


GOOD_OUTER = r"""
void outer_acc(const float* d, const float* x, float* g, int B, int n_out, int n_in)
{
    for (int i = 0; i < n_out; ++i) {
        float* gi = g + (size_t)i * n_in;
        for (int s = 0; s < B; ++s) {
            const float di = d[(size_t)s * n_out + i];
            const float* xs = x + (size_t)s * n_in;
            for (int j = 0; j < n_in; ++j) gi[j] += di * xs[j];
        }
    }
}
"""
GOOD_OMP = r"""
double my_bp_omp(const float* W1, const float* b1, const float* W2, const float* b2, const float* x, const float* y,
                 int B, int n_in, int n_hid, int n_out, float* gW1, float* gb1, float* gW2, float* gb2)
{
    zero_grads(n_in, n_hid, n_out, gW1, gb1, gW2, gb2);
    const size_t nW1 = (size_t)n_hid * n_in, nW2 = (size_t)n_out * n_hid;
    double cost = 0.0;
    #pragma omp parallel reduction(+ : cost, gW1[:nW1], gb1[:n_hid], gW2[:nW2], gb2[:n_out])
    {
        float* work = malloc(sizeof(float) * 2 * n_hid);
        #pragma omp for
        for (int s = 0; s < B; ++s)
            cost += add_sample(W1, b1, W2, b2, x + (size_t)s * n_in, y + (size_t)s * n_out, n_in, n_hid, n_out, work,
                               gW1, gb1, gW2, gb2);
        free(work);
    }
    return cost;
}
"""
REDUCTION = "reduction(+ : cost, gW1[:nW1], gb1[:n_hid], gW2[:nW2], gb2[:n_out])"


needs_valgrind = pytest.mark.skipif(shutil.which("valgrind") is None, reason="counting needs Valgrind (apt install "
                                    "valgrind)")


def _order(first: str, second: str, third: str) -> str:
    """outer_acc with its three loops in the order given (each "i", "j" or "s")."""
    head = {"i": "for (int i = 0; i < n_out; ++i)", "j": "for (int j = 0; j < n_in; ++j)", "s": "for (int s = 0; s < B; ++s)"}
    return ("void outer_acc(const float* d, const float* x, float* g, int B, int n_out, int n_in)\n{\n    "
            f"{head[first]}\n        {head[second]}\n            {head[third]}\n"
            "                g[(size_t)i * n_in + j] += d[(size_t)s * n_out + i] * x[(size_t)s * n_in + j];\n}\n")


@needs_valgrind
def test_the_loop_interchange_verdict_is_a_count_the_same_however_busy_the_machine(capsys):
    """Every order of the three loops: those with j innermost pass, the others fail, on cachegrind's exact count of
    memory instructions; the time is printed beside, and judged nowhere."""
    from labkit import check

    for order in ("sij", "isj"):
        check.loop_interchange(_order(*order))
        assert "counted by cachegrind (exact" in capsys.readouterr().out
    for order in ("ijs", "jis", "jsi", "sji"):
        with pytest.raises(check.ExerciseError, match=r"(?s)your loop order runs \d\.\dx the memory instructions of "
                                                      "the row order.*make j .* the inner loop"):
            check.loop_interchange(_order(*order))


@needs_valgrind
def test_the_versions_work_is_counted_the_same_on_every_run_and_simd_executes_the_least():
    """Lab 03's single-thread claims rest on cachegrind's instruction counts: exact, so two runs agree to the
    instruction, and the order holds whatever else the machine runs."""
    runs = {f"{v} -O2": (v, "-O2") for v in openmp.VERSIONS} | {"fused -O0": ("fused", "-O0")}
    first, again = openmp.version_counts(runs), openmp.version_counts(runs)
    assert {k: v["Ir"] for k, v in first.items()} == {k: v["Ir"] for k, v in again.items()}
    ir = {k: v["Ir"] for k, v in first.items()}
    assert min(ir, key=ir.get) == "simd -O2" and ir["fused -O0"] > 2 * ir["fused -O2"], ir
    work, said = openmp.work_of({k: dict(version=v, opt=o) for k, (v, o) in runs.items()}, dict.fromkeys(runs, 0.001))
    assert work == {k: float(v) for k, v in ir.items()} and said["simd -O2"].endswith(" instructions (1.00 ms)")


def test_without_valgrind_the_versions_are_judged_on_their_times_and_say_so(monkeypatch):
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "valgrind" else real(name, *a, **k))
    work, said = openmp.work_of({"simd -O2": dict(version="simd")}, {"simd -O2": 0.002})
    assert work == {"simd -O2": 0.002} and "timed: Valgrind, which counts, is not installed" in said["simd -O2"]


def test_without_valgrind_the_loop_the_source_puts_innermost_is_judged(monkeypatch):
    from labkit import check

    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "valgrind" else real(name, *a, **k))
    assert openmp.outer_counts(GOOD_OUTER) is None
    for order, bound in (("jsi", "n_out"), ("ijs", "B")):
        with pytest.raises(check.ExerciseError, match=f"your innermost loop runs to {bound}, not along a row"):
            check.loop_interchange(_order(*order))


def _alone_without_valgrind(test):
    """Valgrind counts the memory instructions; without it a right order must also be timed 1.5x faster (the CONTRACT
    in test_exercises_c), which a busy neighbour would change: then the test runs alone (quiet)."""
    return test if shutil.which("valgrind") else pytest.mark.quiet(test)


@_alone_without_valgrind
def test_the_loop_interchange_check_passes_a_right_order_and_names_mistakes(capsys):
    from labkit import check

    check.loop_interchange(GOOD_OUTER)
    assert "loop interchange" in capsys.readouterr().out
    for source, words in ((GOOD_OUTER.replace("j < n_in", "j <= n_in"), "outside an array.*line 9 of yours.c"),
                          (check.openmp.NAIVE_OUTER, r"runs \d\.\dx the memory instructions|not clearly faster"),
                          (GOOD_OUTER.replace("+= di", "= di"), r"g\[0\]\[0\] is .* expected"),
                          (GOOD_OUTER.replace("{\n    for", "{\n    // " + check.KERNEL_TODO + "\n    for"), "not written yet")):
        with pytest.raises(check.ExerciseError, match=f"(?s){words}"):
            check.loop_interchange(source)


def test_the_omp_reduction_check_names_a_bad_write_and_no_openmp(capsys):
    from labkit import check

    check.omp_reduction(GOOD_OMP)
    assert "OpenMP reduction at 1, 2" in capsys.readouterr().out
    too_small = GOOD_OMP.replace("sizeof(float) * 2 * n_hid", "sizeof(float) * n_hid")
    serial = GOOD_OMP.replace("#pragma omp parallel " + REDUCTION, "").replace("#pragma omp for", "")
    lost = GOOD_OMP.replace(REDUCTION, "firstprivate(cost)")  # the cost dropped, the gradients shared: a race
    for source, words in ((too_small, "outside an array.*in my_bp_omp \\(in its parallel region\\), line 13 of yours.c"),
                          (serial, "no OpenMP directive"), (lost, "a race: .*same gradient arrays")):
        with pytest.raises(check.ExerciseError, match=f"(?s){words}"):
            check.omp_reduction(source)


# A race loses updates only while two threads run at the same moment, which a busy machine may never let happen (with
# three test workers on 2 cores the threads took turns for whole runs): the check names it from what it sees inside
# add_sample, where its rendezvous holds the first thread until a second one comes in.
def test_the_omp_reduction_check_names_a_race_whatever_the_scheduler_does():
    from labkit import check

    with pytest.raises(check.ExerciseError, match="a race: in .* runs at 2.* threads, two threads were inside add_sample at the "
                                                  "same moment, adding into the same gradient arrays"):
        check.omp_reduction(GOOD_OMP.replace(REDUCTION, "reduction(+ : cost)"))


# every sample's work under one lock: the values are right, the threads take turns
TAKES_TURNS = GOOD_OMP.replace("#pragma omp parallel " + REDUCTION, "#pragma omp parallel").replace(
    "            cost += add_sample(", "            #pragma omp critical\n            cost += add_sample(")
# each thread sums its samples on its own, then adds its sums to the shared ones once, under a lock: parallel
MERGE_ONCE = r"""
double my_bp_omp(const float* W1, const float* b1, const float* W2, const float* b2, const float* x, const float* y,
                 int B, int n_in, int n_hid, int n_out, float* gW1, float* gb1, float* gW2, float* gb2)
{
    zero_grads(n_in, n_hid, n_out, gW1, gb1, gW2, gb2);
    const size_t nW1 = (size_t)n_hid * n_in, nW2 = (size_t)n_out * n_hid, n = nW1 + nW2 + n_hid + n_out;
    double cost = 0.0;
    #pragma omp parallel
    {
        float* mine = calloc(n + 2 * (size_t)n_hid, sizeof(float));
        float *pW1 = mine, *pW2 = mine + nW1, *pb1 = pW2 + nW2, *pb2 = pb1 + n_hid, *work = pb2 + n_out;
        double c = 0.0;
        #pragma omp for
        for (int s = 0; s < B; ++s)
            c += add_sample(W1, b1, W2, b2, x + (size_t)s * n_in, y + (size_t)s * n_out, n_in, n_hid, n_out, work,
                            pW1, pb1, pW2, pb2);
        #pragma omp critical
        {
            for (size_t t = 0; t < nW1; ++t) gW1[t] += pW1[t];
            for (size_t t = 0; t < nW2; ++t) gW2[t] += pW2[t];
            for (int t = 0; t < n_hid; ++t) gb1[t] += pb1[t];
            for (int t = 0; t < n_out; ++t) gb2[t] += pb2[t];
            cost += c;
        }
        free(mine);
    }
    return cost;
}
"""


def test_the_omp_reduction_check_fails_threads_that_take_turns_and_passes_a_merge_once(capsys):
    from labkit import check

    assert "omp critical" in TAKES_TURNS and REDUCTION not in TAKES_TURNS
    with pytest.raises(check.ExerciseError, match="(?s)no two threads were ever inside add_sample.*held the first one "
                                                  "there.*one at a time.*omp critical.*combine them once"):
        check.omp_reduction(TAKES_TURNS)
    check.omp_reduction(MERGE_ONCE)  # a lock, but taken once per thread: the samples still run side by side
    assert "OpenMP reduction at 1, 2" in capsys.readouterr().out


def test_batch_times_times_each_run_and_sets_the_schedule_back():
    params = mlp.init_params([20, 8, 3], seed=0)
    x = np.random.default_rng(0).random((16, 20), dtype=np.float32)
    Y = mlp.targets(np.arange(16) % 3, 3, np.float32)
    got = openmp.batch_times({"one": dict(params=params, version="omp_reduction", threads=1),
                              "dynamic": dict(params=params, version="omp_reduction", threads=2, schedule=("dynamic", 1))},
                             x, Y, repeat=1, rounds=2)
    assert list(got) == ["one", "dynamic"] and all(t > 0 for t in got.values())
    # a run backprop_c would refuse is refused by name, and the schedule set back even then
    with pytest.raises(ValueError, match="version must be one of"):
        openmp.batch_times({"bad": dict(params=params, version="nonesuch")}, x, Y, repeat=1, rounds=1)


def test_lab03_readings_name_a_gain_a_loss_or_no_difference():
    assert "paid off" in openmp.interchange_reading(1.2)
    assert "no more than these timings vary" in openmp.interchange_reading(1.05)
    assert "a loss" in openmp.interchange_reading(0.8)
    t = {"static, chunk default": 1.0, "static, chunk 1": 0.9}
    assert "only added its own cost" in openmp.schedule_reading(t | {"dynamic, chunk 1": 1.3})
    assert "did not run alike" in openmp.schedule_reading(t | {"dynamic, chunk 1": 0.8})
    assert "nothing to balance" in openmp.schedule_reading(t | {"dynamic, chunk 1": 1.02})
    said = openmp.layer_scaling_reading([1, 2, 4, 5], {"n": np.array([1, 1.48, 1.23, 1.04]),
                                                       "w": np.array([1, 1.65, 1.19, 1.44])}, "n", "w")
    assert said.endswith("fell behind at 2 and 5 threads; the two scaled alike (within 10 %) at 4 threads.")
