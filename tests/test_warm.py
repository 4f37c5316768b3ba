"""Warming the compile cache (labkit/kernels/warm.py): what it compiles is what the labs then load, a second warm-up
compiles nothing, and it says what it did in one line."""

import subprocess
import sys
import time

import pytest

from labkit.kernels import warm
from labkit.native.build import cache_dir


def _made(name: str) -> None:
    """A stand-in for one library: a file in the cache folder, as a compile leaves one."""
    (cache_dir() / f"{name}-0123.so").write_text(name)


def _refused() -> None:
    raise RuntimeError("no compiler here\nand more")


def _libraries() -> set[str]:
    return {p.name for p in cache_dir().iterdir() if not p.name.startswith(warm.STAMP)}


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """An empty cache folder, and the kernels on the emulator (as without a GPU)."""
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    monkeypatch.setenv("LABKIT_DEVICE", "cpu")
    return tmp_path


def test_a_warm_up_says_what_it_compiled_and_what_failed_and_the_next_is_a_glance(empty_cache, monkeypatch, capsys):
    todo = [("one", _made, ("one",)), ("two", _made, ("two",)), ("matmul.cu", _refused, ())]
    done = warm.warm_cache(cores=2, todo=todo)
    assert (done.compiled, done.total, done.cores) == (2, 3, 2) and _libraries() == {"one-0123.so", "two-0123.so"}
    out = capsys.readouterr().out
    assert out.startswith("compiled 2 of labkit's kernels in ") and "(2 cores)" in out, out
    assert "1 did not compile (matmul.cu: RuntimeError: no compiler here)" in out and out.count("\n") == 1, out

    start = time.perf_counter()
    again = warm.warm_cache(cores=2, todo=todo)
    assert again.compiled == 0 and not again.failed and time.perf_counter() - start < 1
    assert capsys.readouterr().out == "", "a warm cache is warmed quietly"

    monkeypatch.setenv("LABKIT_EMU_STACK_KB", "128")  # a setting the flags depend on: the jobs run again
    assert warm.warm_cache(cores=1, todo=todo[:2]).compiled == 0 and capsys.readouterr().out == ""
    assert len(list(cache_dir().glob(f"{warm.STAMP}*"))) == 1, "one stamp, the latest fingerprint's"


def test_the_line_of_a_warm_up():
    assert warm.Warmed(23, 26, seconds=41.2, cores=2).line() == (
        "compiled 23 of labkit's kernels in 41 s (2 cores); the next runs load them")
    assert warm.Warmed(0, 26).line() == "labkit's kernels were compiled already"


# what labs 03, 04 and 05 load first, each as the lab calls it, in a process of its own (one that never loaded them)
LAB_LOADS = """
import numpy as np
from labkit import kernels, mlp, openmp
from labkit.kernels import counts, offload, speed_of_light

a = np.ones((32, 32), np.float32)
kernels.matmul(a, a, variant="tiled")
kernels.sum_reduce(np.ones(1000, np.float32))
counts.matmul_loads(None, "naive")
counts.tile_column_conflicts(33)
speed_of_light.matmul_counts("naive", 64)
offload.wt_delta_throughput(64, n_out=32)
kernels.load("softmax_rows", backend="emulator", checked=True)
params = mlp.init_params([784, 30, 10], seed=0)
x, y = np.zeros((4, 784), np.float32), np.zeros((4, 10), np.float32)
openmp.backprop_c(params, x, y, "fused", opt="-O3")
openmp.backprop_c(params, x, y, "simd", opt="-O3", native=True)
"""


@pytest.mark.slow
@pytest.mark.compile("c++")
@pytest.mark.compile("c")
def test_after_a_warm_up_the_labs_compile_nothing_of_labkits_and_a_second_warm_up_nothing(empty_cache, capsys):
    done = warm.warm_cache()
    assert not done.failed, done.failed
    assert done.compiled == len(_libraries()) >= 17, done  # 8 programs more where Valgrind counts them
    assert f"compiled {done.compiled} of labkit's kernels in" in capsys.readouterr().out

    before = _libraries()
    ran = subprocess.run([sys.executable, "-c", LAB_LOADS], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert _libraries() == before, f"compiled by the lab after the warm-up: {sorted(_libraries() - before)}"

    assert warm.warm_cache().compiled == 0 and capsys.readouterr().out == ""
    for stamp in cache_dir().glob(f"{warm.STAMP}*"):
        stamp.unlink()
    again = warm.warm_cache()  # every job runs again, and finds its library
    assert again.compiled == 0 and not again.failed and _libraries() == before
