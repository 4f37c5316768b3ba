"""Every kernel compiles for real GPUs (sm_80, sm_90) without one: labkit's .cu files, every kernel in the labs, and
every kernel a check receives; what a GPU's compiler refuses fails the check even where the emulator runs it; ptxas's
resource report is read right."""

import ast
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import needs_cxx

from labkit import check
from labkit.check.common import ExerciseError
from labkit.kernels import KernelCompileError, load
from labkit.kernels.tools import ARCHS, compile_check, compile_for_gpus, compiler_for_check, nvcc, parse_ptxas, resource_usage

ROOT = Path(__file__).resolve().parent.parent
CU_FILES = sorted(ROOT.joinpath("labkit", "kernels").glob("*.cu"))
needs_compiler = pytest.mark.skipif(compiler_for_check() is None,
                                    reason="neither NVRTC (pip install nvidia-cuda-nvrtc-cu12) nor nvcc is installed")
pytestmark = pytest.mark.compile  # NVRTC or nvcc: needs_compiler skips without either


def notebook_kernels():
    """(lab, first kernel's name, source) for every string in the labs' code cells that holds a __global__ kernel."""
    found = []
    for nb in sorted(ROOT.joinpath("notebooks").glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            src = "".join(cell["source"])
            if cell["cell_type"] != "code" or "__global__" not in src:
                continue
            lines = [ln for ln in src.splitlines() if not ln.lstrip().startswith(("%", "!"))]
            for node in ast.walk(ast.parse("\n".join(lines))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and "__global__" in node.value:
                    name = node.value.split("__global__", 1)[1].split("(", 1)[0].split()[-1]
                    found.append((nb.stem[:2], name, node.value))
    return found


NOTEBOOK_KERNELS = notebook_kernels()


def test_there_are_kernel_files():
    assert {p.stem for p in CU_FILES} >= {"matmul", "layers", "optim", "softmax", "reduce", "conv"}


@needs_compiler
@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", CU_FILES, ids=lambda p: p.stem)
def test_every_kernel_file_compiles_for_the_gpu(path, arch):
    assert compile_check(path, arch) in ("nvcc", "nvrtc")


@needs_compiler
def test_compile_check_reports_errors():
    with pytest.raises(KernelCompileError, match="does not compile for sm_90"):
        compile_check('extern "C" __global__ void k(float* x) { x[0] = nope; }\n', "sm_90")


PTXAS = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'matmul_tiled' for 'sm_90'
ptxas info    : Function properties for matmul_tiled
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 31 registers, used 1 barriers, 2112 bytes smem
ptxas info    : Compiling entry function 'big' for 'sm_90'
ptxas info    : Function properties for big
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers
"""


def test_parse_ptxas():
    got = parse_ptxas(PTXAS)
    assert got["matmul_tiled"] == {"registers": 31, "shared_bytes": 2112, "stack_bytes": 0, "spill_stores": 0, "spill_loads": 0}
    assert got["big"] == {"registers": 255, "shared_bytes": 0, "stack_bytes": 16, "spill_stores": 8, "spill_loads": 4}


@needs_compiler
def test_resource_usage_of_the_matmuls():
    use = resource_usage("matmul", "sm_90")
    assert set(use) == {"matmul_naive", "matmul_tiled", "matmul_regblock"}
    assert use["matmul_naive"]["shared_bytes"] == 0
    assert use["matmul_tiled"]["shared_bytes"] == 4 * (16 * 16 + 16 * 17)
    assert use["matmul_regblock"]["registers"] > use["matmul_tiled"]["registers"]  # the 8x8 accumulators live in registers
    assert use["matmul_regblock"]["spill_stores"] == 0


def test_the_labs_hold_kernels():
    assert {lab for lab, _, _ in NOTEBOOK_KERNELS} >= {"05"}
    assert {"matmul_naive", "matmul_tiled", "block_sum"} <= {name for _, name, _ in NOTEBOOK_KERNELS}


@needs_compiler
@pytest.mark.parametrize("lab, name, source", NOTEBOOK_KERNELS, ids=[f"{lab}-{name}" for lab, name, _ in NOTEBOOK_KERNELS])
def test_every_kernel_in_the_labs_compiles_for_the_gpu(lab, name, source):
    """The solutions as the instructor's notebooks hold them, and every kernel the labs hand out whole."""
    for arch in ARCHS:
        compile_check(source, arch)


# Four one-line kernels the host's C++ compiler accepts, so the emulator runs them, and a GPU's compiler does not
REFUSED = {
    "std::max": "x[0] = std::max(x[0], 1.0f);",
    "strlen": 'x[0] = strlen("ab");',
    "rand": "x[0] = rand();",
    "std::sqrt": "x[0] = std::sqrt(x[0]);",
}


def one_line_kernel(statement: str) -> str:
    return 'extern "C" __global__ void k(float* x)\n{\n    ' + statement + '\n}\n'


@needs_cxx
@needs_compiler
@pytest.mark.parametrize("what", REFUSED)
def test_what_the_emulator_runs_and_a_gpu_compiler_refuses(what):
    src = one_line_kernel(REFUSED[what])
    load(src, backend="emulator", checked=False, gpu_check=False).k((1,), (1,), (np.ones(1, np.float32),))  # runs here
    with pytest.raises(KernelCompileError, match=rf"does not compile for sm_\d\d .*\n.*\(3\): error: .*{what.split(':')[-1]}"):
        compile_for_gpus(src)


@needs_cxx
@needs_compiler
@pytest.mark.parametrize("what", REFUSED)
def test_load_refuses_what_a_gpu_compiler_refuses(what):
    """kernels.load, what a student calls to try a kernel of their own, compiles it with NVRTC too."""
    with pytest.raises(KernelCompileError, match=rf"(?s)kernel.cu runs on the CPU emulator but a GPU's compiler refuses it:"
                                                 rf"\n.*\(3\): error: .*{what.split(':')[-1]}.*fmaxf"):
        load(one_line_kernel(REFUSED[what]), backend="emulator")


@needs_cxx
@needs_compiler
def test_loading_again_does_not_compile_for_gpus_again(monkeypatch, tmp_path):
    from labkit.kernels import loader, tools

    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(loader, "_compiled_for_gpus", set())
    calls = []
    compile_ = tools._compile
    monkeypatch.setattr(tools, "_compile", lambda *a, **k: calls.append(a[2]) or compile_(*a, **k))
    src = one_line_kernel("x[0] = fmaxf(x[0], 1.0f);")
    load(src, backend="emulator").k((1,), (1,), (np.zeros(1, np.float32),))
    assert sorted(calls) == sorted(ARCHS)
    load(src, backend="emulator")
    monkeypatch.setattr(loader, "_compiled_for_gpus", set())  # a new process: labkit's cache remembers it
    load(src, backend="emulator")
    assert len(calls) == len(ARCHS)
    with pytest.raises(KernelCompileError, match="refuses it"):
        load(src.replace("fmaxf", "std::max"), backend="emulator")


@needs_cxx
def test_without_a_gpu_compiler_load_runs_on_the_emulator(monkeypatch):
    from labkit.kernels import loader, tools

    monkeypatch.setattr(loader, "_compiled_for_gpus", set())
    monkeypatch.setattr(tools, "compiler_for_check", lambda: None)
    x = np.ones(1, np.float32)
    load(one_line_kernel(REFUSED["std::max"]), backend="emulator").k((1,), (1,), (x,))
    assert x[0] == 1


@pytest.mark.skipif(nvcc() is None or compiler_for_check() != "nvrtc", reason="needs both nvcc and NVRTC")
def test_nvcc_is_more_lenient_than_nvrtc(monkeypatch):
    """nvcc's implicit CUDA headers bring device forms of std::sqrt and strlen, which NVRTC (what CuPy compiles a
    RawKernel with) lacks: that is why the checks use NVRTC first."""
    from labkit.kernels import tools

    monkeypatch.setattr(tools, "compiler_for_check", lambda: "nvcc")
    for what, body in REFUSED.items():
        src = one_line_kernel(body)
        if what in ("std::max", "rand"):
            with pytest.raises(KernelCompileError, match="with nvcc"):
                compile_check(src)
        else:
            assert compile_check(src) == "nvcc"


BLOCK_SUM = (ROOT / "tests" / "kernels" / "block_sum_solution.cu").read_text().replace(
    "v += x[i];", "v = MAX(v + x[i], 0.0f);")  # x >= 0: the same sum, through a maximum


@needs_cxx
@needs_compiler
def test_a_check_fails_a_kernel_that_only_the_emulator_compiles(capsys):
    """The student's kernel passes every run on the emulator; the check still fails it, with NVRTC's message."""
    with pytest.raises(ExerciseError, match=r"(?s)your kernel runs on the emulator but does not compile for a GPU:.*"
                                            r"namespace \"std\" has no member \"max\".*Hint: .*fmaxf"):
        check.block_reduction(BLOCK_SUM.replace("MAX(", "std::max("))
    check.block_reduction(BLOCK_SUM.replace("MAX(", "fmaxf("))
    assert "all 8 checks passed" in capsys.readouterr().out


@needs_cxx
def test_without_a_gpu_compiler_a_check_says_so(monkeypatch, capsys):
    from labkit.kernels import tools

    monkeypatch.setattr(tools, "compiler_for_check", lambda: None)
    check.block_reduction(BLOCK_SUM.replace("MAX(", "fmaxf("))
    out = capsys.readouterr().out
    assert "no CUDA compiler here" in out and "pip install nvidia-cuda-nvrtc-cu12" in out and "all 8 checks passed" in out
