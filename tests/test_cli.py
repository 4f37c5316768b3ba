import json
import subprocess
import sys

import pytest

from labkit import cli
from labkit.benchmarks import backprop


def test_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "labkit.cli", "--help"], capture_output=True, text=True, check=True).stdout
    for cmd in ("report", "lab", "data", "doctor", "bench"):
        assert cmd in out


def test_data_status_and_errors(capsys, tmp_path):
    assert cli.main(["data", "status"]) == 0
    assert "mnist" in capsys.readouterr().out
    assert cli.main(["data", "verify", "--root", str(tmp_path)]) == 2
    assert "holds no mnist files" in capsys.readouterr().err


def test_doctor_checks_mpi_for_real(capsys):
    code = cli.main(["doctor"])
    out = capsys.readouterr().out
    assert "2 ranks ran an Allreduce" in out, out
    assert code == 0, out


@pytest.mark.slow
def test_bench_backprop_quick_json(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert cli.main(["bench", "backprop", "--quick", "--json", "--out", str(out)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == result
    for key in ("speedup_batch10", "speedup_batch100", "gemm_ratio"):
        assert result[key] > 0
    assert len(result["rows"]) == 4 and result["max_accuracy_gap"] < 0.01
    assert "speedup_batch10" in backprop.report(result)


def test_bare_matmul_epoch_times_something():
    t = backprop.bare_matmul_epoch([784, 30, 10], batch=10, n=100, repeat=1)
    assert t.median > 0
