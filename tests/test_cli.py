import json
import subprocess
import sys

import pytest
from conftest import needs_cc, needs_cxx

from labkit import cli, labs, runner
from labkit.benchmarks import backprop
from labkit.check.exercises import in_lab


def test_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "labkit.cli", "--help"], capture_output=True, text=True, check=True).stdout
    for cmd in ("report", "lab", "data", "doctor", "assign", "grade", "bench"):
        assert cmd in out


def test_data_status_and_errors(capsys, tmp_path):
    assert cli.main(["data", "status"]) == 0
    assert "mnist" in capsys.readouterr().out
    assert cli.main(["data", "verify", "--root", str(tmp_path)]) == 2
    assert "holds no mnist files" in capsys.readouterr().err


@pytest.mark.mpi
@pytest.mark.compile
def test_doctor_checks_mpi_for_real(capsys):
    code = cli.main(["doctor"])
    out = capsys.readouterr().out
    assert "2 ranks ran an Allreduce" in out, out
    assert "kernel checks' GPU compiler" in out
    assert code == 0, out


@pytest.mark.slow
def test_bench_backprop_quick_json(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert cli.main(["bench", "backprop", "--quick", "--json", "--out", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == result
    for key in ("speedup_batch10", "speedup_batch100", "gemm_ratio", "per_sample_vs_networkpy"):
        assert result[key] > 0
    assert len(result["rows"]) == 4 and result["max_accuracy_gap"] < 0.01
    assert result["rounds"] == 1 and len(result["networkpy"]["rounds_s"]) == 1
    assert all(len(r["rounds_s"]["per_sample"]) == 1 for r in result["rows"])  # every round's figure is kept
    assert "speedup_batch10" in backprop.report(result) and "network.py's own loop" in backprop.report(result)


def test_networkpy_reimplementation_matches_labkit_per_sample_gradient():
    """The benchmark's network.py loop computes the same gradients as labkit's per-sample reference."""
    import numpy as np

    from labkit import mlp

    net = backprop.NetworkPy([6, 5, 3], seed=3)
    params = [(W.copy(), b[:, 0].copy()) for W, b in zip(net.weights, net.biases)]
    rng = np.random.default_rng(0)
    x, y = rng.random((4, 6)), rng.integers(0, 3, 4)
    want = mlp.backprop_per_sample(params, x, y)  # the mean over the batch
    got_b = [np.zeros(b.shape) for b in net.biases]
    got_w = [np.zeros(w.shape) for w in net.weights]
    for xi, yi in backprop.networkpy_data(x, y, classes=3):
        db, dw = net.backprop(xi, yi)
        got_b = [a + d for a, d in zip(got_b, db)]
        got_w = [a + d for a, d in zip(got_w, dw)]
    for (gW, gb), w, b in zip(want, got_w, got_b):
        np.testing.assert_allclose(gW * 4, w, rtol=1e-10)
        np.testing.assert_allclose(gb * 4, b[:, 0], rtol=1e-10)
    before = [w.copy() for w in net.weights]
    seconds = net.epoch(backprop.networkpy_data(x, y, classes=3)[:2], batch_size=2, eta=3.0)
    assert seconds > 0 and not np.allclose(before[0], net.weights[0])


def test_bare_matmul_epoch_times_something():
    t = backprop.bare_matmul_epoch([784, 30, 10], batch=10, n=100, repeat=1)
    assert t.median > 0


def test_unknown_arguments_rejected_except_for_lab(capsys):
    with pytest.raises(SystemExit):
        cli.main(["data", "status", "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["report", "--timeout", "0"], ["report", "--timeout", "-1"],
                                  ["grade", "somewhere", "--timeout", "0"], ["report", "--timeout", "2.5"]])
def test_meaningless_time_limits_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --timeout" in err and ("at least 1 second" in err or "whole number" in err)


def test_grading_an_empty_folder_says_so(tmp_path, capsys):
    assert cli.main(["grade", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "no notebooks (*.ipynb) under" in capsys.readouterr().err


@pytest.mark.cluster
def test_lab_serves_the_notebooks(tmp_path):
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "labkit", "lab", "--no-warm", "--no-browser", f"--ServerApp.port={port}",
           "--ServerApp.open_browser=False"]  # as root too: labkit adds --allow-root itself
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        seen, deadline = [], time.monotonic() + 90
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if "token=" in line or "is running at" in "".join(seen[:-3]):  # the URL follows that line
                break
        text = "".join(seen)
        assert f"Serving notebooks from local directory: {tmp_path / 'labkit-work'}" in text, text  # the copies
        served = list((tmp_path / "labkit-work").glob("[0-9][0-9]_*.ipynb"))
        assert len(served) == sum(not labs.is_draft(p.name) for p in runner.find_notebooks())  # a draft stays out
        assert not any("BEGIN SOLUTION" in p.read_text() for p in served)  # the student versions (tests/test_lab.py)
        assert "is running at" in text and "token=" in text, text  # never a server without a token
    finally:
        proc.terminate()  # SIGTERM reaches JupyterLab itself (labkit execs it), which shuts down
        proc.wait(30)
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", f"ServerApp.port={port}"], capture_output=True, text=True).stdout.split()
    assert not left, f"JupyterLab still running after SIGTERM: {left}"


@pytest.mark.mpi
@pytest.mark.slow
def test_bench_allreduce_quick_json(capsys):
    assert cli.main(["bench", "allreduce", "--quick", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ring_vs_mpi_1e6_p2"] > 0 and result["ring_vs_mpi_1e7_p2"] > 0
    assert {r["p"] for r in result["rows"]} == {2} and len(result["rows"]) == 4
    for row in result["rows"]:
        assert row["vs_mpi"]["mpi"] == 1.0 and set(row["algbw_GBs"]) == {"naive", "recursive_doubling", "ring", "mpi"}


def test_bench_training_needs_a_round():
    from labkit.benchmarks import training

    with pytest.raises(ValueError, match="rounds must be >= 1"):
        training.run(quick=True, rounds=0)


@pytest.mark.mpi
@pytest.mark.slow
def test_bench_training_quick_json(capsys):
    assert cli.main(["bench", "training", "--quick", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["dp_speedup_p2"] > 0 and abs(result["dp"]["serial_accuracy"] - result["dp"]["p2_accuracy"]) < 0.01
    assert result["dp_speedup_p2_independent"] > 0 and result["dp_speedup_p2_no_exchange"] > 0
    assert result["dp"]["rounds"] == 1 and len(result["dp"]["seconds_per_round"]["dp2"]) == 1
    assert -1 < result["topk1_accuracy_gap"] < 1 and 0 < result["topk"]["bytes_ratio"] < 0.05
    assert 0 < result["async_accuracy_w4_m2"] <= 1 and len(result["async"]["master_updates"]) == 2


@needs_cxx
def test_bench_kernels_quick_json(capsys):
    assert cli.main(["bench", "kernels", "--quick", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert 0 < result["emulator_matmul256_s"] < 30
    assert [r["kernel"] for r in result["emulator_rows"]] == ["matmul_naive", "matmul_tiled", "matmul_regblock", "numpy.matmul"]
    assert "emulator_matmul256_s" in result["targets_met"]
    assert 0.3 < result["warp_overhead_matmul256"] < 3 and "warp_overhead_matmul256" in result["targets_met"]
    assert 0 < result["emulator_warp_reduce_1e6_s"] < 30
    if result["backend"] == "cupy":
        assert 0 < result["sgemm_fraction_of_cublas"] and 0 < result["elementwise_fraction_of_copy"]
        assert result["copy_d2d_GBs"] > 0


@needs_cc
def test_bench_openmp_quick_json(capsys):
    assert cli.main(["bench", "openmp", "--quick", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("c_per_sample_vs_numpy_per_sample", "loop_interchange_speedup", "omp_speedup_2threads",
                "atomic_over_reduction"):
        assert 0 < result[key] < 1000, key
    assert set(result["targets_met"]) == {"c_per_sample_vs_numpy_per_sample", "omp_speedup_2threads"}
    assert {"naive -O2", "simd -O2", "fused -O0", "reduction, 2 threads, wide"} <= set(result["seconds"])


@pytest.mark.sandbox
@pytest.mark.notebooks
def test_bench_grading_quick_json(capsys):
    assert cli.main(["bench", "grading", "--quick", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)  # nothing but the JSON on stdout
    # the reference passes every way: one job, a job per core, and one job without the sandbox
    rows = [2 * len(in_lab("01"))] * 2  # two copies of lab 01, every exercise passed
    assert result["passed"] == {"1": rows, str(result["cores"]): rows, "1 unisolated": rows}
    assert result["grading_notebooks_per_minute_jobs1"] > 0 and result["grading_parallel_speedup"] > 0
    assert 0 < result["grading_cores_busy_jobs1"] <= result["cores"] + 0.5
    assert ("grading_sandbox_overhead_s" in result) == result["isolated"]
    assert result["feedback_pages"] == 2 and 0 < result["feedback_seconds_per_notebook"] and result["exports_seconds"] > 0


@pytest.mark.notebooks
def test_bench_grading_times_the_command_each_way_and_says_why_it_failed(tmp_path):
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    from labkit.benchmarks import grading

    for student in ("ana", "ben"):
        (tmp_path / "subs" / student).mkdir(parents=True)
        nbformat.write(new_notebook(cells=[new_code_cell("1 + 1")]), tmp_path / "subs" / student / "97_tiny.ipynb")
    got = grading._command_once(tmp_path / "subs", tmp_path, 2)
    assert set(got["grading_command_seconds"]) == {"1", "2"} and got["grading_command_speedup"] > 0
    assert (tmp_path / "command2" / "grades.json").is_file()
    with pytest.raises(RuntimeError, match="labkit grade --jobs 1 failed .*no notebooks"):
        (tmp_path / "empty").mkdir()
        grading._command_once(tmp_path / "empty", tmp_path, 2)


def test_assign_writes_student_versions(tmp_path, capsys):
    release = ["--release", str(tmp_path / "release")]
    assert cli.main(["assign", "--out", str(tmp_path / "student"), *release, "--only", "05_"]) == 0
    out = capsys.readouterr().out
    assert "1 student notebook(s)" in out
    text = (tmp_path / "student" / "05_cuda_kernels.ipynb").read_text()
    assert "BEGIN SOLUTION" not in text and "YOUR CODE HERE" in text and "check.tiled_matmul" in text
    assert cli.main(["assign", "--out", str(tmp_path / "s2"), *release, "--only", "no-such-lab"]) == 2
    assert "no lab notebooks" in capsys.readouterr().err


def test_assign_never_overwrites_a_students_edits_silently(tmp_path, capsys):
    out, release = tmp_path / "student", ["--release", str(tmp_path / "release")]
    assert cli.main(["assign", "--out", str(out), *release, "--only", "01_"]) == 0
    assert cli.main(["assign", "--out", str(out), *release, "--only", "01_"]) == 0  # the same version again: nothing lost
    mine = out / "01_serial_backprop.ipynb"
    edited = mine.read_text().replace("raise NotImplementedError", "return 42  # my work", 1)
    mine.write_text(edited)
    capsys.readouterr()
    assert cli.main(["assign", "--out", str(out), *release, "--only", "01_"]) == 2
    err = capsys.readouterr().err
    assert "01_serial_backprop.ipynb" in err and "may hold students' work" in err and "--force" in err
    assert mine.read_text() == edited  # untouched
    assert cli.main(["assign", "--out", str(out), *release, "--only", "01_", "--force"]) == 0
    assert "my work" not in mine.read_text()
