"""Every .cu compiles for real GPUs (sm_80, sm_90) without one; ptxas's resource report is read right."""

from pathlib import Path

import pytest

from labkit.kernels import KernelCompileError
from labkit.kernels.tools import ARCHS, compile_check, compiler_for_check, parse_ptxas, resource_usage

CU_FILES = sorted(Path(__file__).resolve().parent.parent.joinpath("labkit", "kernels").glob("*.cu"))
needs_compiler = pytest.mark.skipif(compiler_for_check() is None,
                                    reason="neither nvcc nor NVRTC (cupy + nvidia-cuda-nvrtc-cu12) is installed")
pytestmark = pytest.mark.compile  # nvcc or NVRTC: needs_compiler skips without either


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


@pytest.mark.skipif(compiler_for_check() != "nvcc", reason="needs nvcc")
def test_resource_usage_of_the_matmuls():
    use = resource_usage("matmul", "sm_90")
    assert set(use) == {"matmul_naive", "matmul_tiled", "matmul_regblock"}
    assert use["matmul_naive"]["shared_bytes"] == 0
    assert use["matmul_tiled"]["shared_bytes"] == 4 * (16 * 16 + 16 * 17)
    assert use["matmul_regblock"]["registers"] > use["matmul_tiled"]["registers"]  # the 8x8 accumulators live in registers
    assert use["matmul_regblock"]["spill_stores"] == 0
