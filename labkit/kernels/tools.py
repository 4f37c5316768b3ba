"""Looking at kernels without running them: a compile check for real GPUs and the resources each kernel uses.

Both need no GPU: ``nvcc`` compiles for any architecture on a machine without one. Where nvcc is
missing, the compile check falls back to NVRTC through CuPy (``pip install 'cupy-cuda12x[ctk]'``, which imports
without a GPU).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .loader import read_source
from .source import KernelCompileError

ARCHS = ("sm_80", "sm_90")


def nvcc() -> str | None:
    """The nvcc on PATH (or under $CUDA_HOME/bin), or None."""
    found = shutil.which("nvcc")
    if not found and os.environ.get("CUDA_HOME"):
        cand = Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"
        found = str(cand) if cand.exists() else None
    return found


def nvrtc_available() -> bool:
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
        return True
    except Exception:
        return False


def compiler_for_check() -> str | None:
    """"nvcc", "nvrtc" or None: what compile_check would use here."""
    if nvcc():
        return "nvcc"
    if nvrtc_available():
        return "nvrtc"
    return None


def _nvcc_cubin(text: str, name: str, arch: str, verbose: bool) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / name
        src.write_text(text)
        cmd = [nvcc(), f"-arch={arch}", "-cubin", "-std=c++17", "-o", str(Path(tmp) / "k.cubin"), str(src)]
        if verbose:
            cmd[1:1] = ["-Xptxas", "-v"]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
    if r.returncode != 0:
        raise KernelCompileError(f"{name} does not compile for {arch} with nvcc:\n{r.stderr.strip()}")
    return r.stderr


def compile_check(source: str | Path, arch: str = "sm_90") -> str:
    """Compile for a real GPU architecture (no GPU needed); raise KernelCompileError with the message if it fails.

    ``source`` is CUDA C, a .cu path, or the name of one of labkit's kernel files ("matmul"). Returns the tool used.
    """
    text, name = read_source(source)
    tool = compiler_for_check()
    if tool == "nvcc":
        _nvcc_cubin(text, name, arch, verbose=False)
    elif tool == "nvrtc":
        from cupy.cuda import nvrtc

        prog = nvrtc.createProgram(text, name, [], [])
        try:
            nvrtc.compileProgram(prog, [f"--gpu-architecture={arch}", "-std=c++17"])
        except nvrtc.NVRTCError as e:
            raise KernelCompileError(f"{name} does not compile for {arch} with NVRTC:\n{nvrtc.getProgramLog(prog)}") from e
        finally:
            nvrtc.destroyProgram(prog)
    else:
        raise RuntimeError("no CUDA compiler here: install the CUDA toolkit (nvcc), "
                           "or pip install 'cupy-cuda12x[ctk]'")
    return tool


_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(text: str) -> dict[str, dict[str, int]]:
    """{kernel: {"registers", "shared_bytes", "stack_bytes", "spill_stores", "spill_loads"}} from ``ptxas -v`` output."""
    out: dict[str, dict[str, int]] = {}
    current = None
    for line in text.splitlines():
        m = _ENTRY.search(line)
        if m:
            current = m.group(1)
            out[current] = {"registers": 0, "shared_bytes": 0, "stack_bytes": 0, "spill_stores": 0, "spill_loads": 0}
            continue
        if current is None:
            continue
        m = _STACK.search(line)
        if m:
            out[current].update(stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        m = _USED.search(line)
        if m:
            out[current]["registers"] = int(m.group(1))
            s = _SMEM.search(line)
            out[current]["shared_bytes"] = int(s.group(1)) if s else 0
    return out


def resource_usage(source: str | Path, arch: str = "sm_90") -> dict[str, dict[str, int]]:
    """Registers, shared memory, stack and spills per kernel, as ptxas reports them for ``arch``.

    Uses nvcc where present; on a machine with a working GPU and no nvcc, CuPy's kernel attributes
    (registers and static shared memory only, for the GPU present rather than ``arch``).
    """
    text, name = read_source(source)
    if nvcc():
        return parse_ptxas(_nvcc_cubin(text, name, arch, verbose=True))
    from ..device import gpu_status
    from .loader import Module

    ok, why = gpu_status()
    if not ok:
        raise RuntimeError(f"resource_usage needs nvcc (the CUDA toolkit) or a working GPU: {why}")
    mod = Module(text, name, backend="cupy")
    out = {}
    for k in mod.kernel_names:
        attrs = mod._cupy.get_function(k).attributes
        out[k] = {"registers": attrs["num_regs"], "shared_bytes": attrs["shared_size_bytes"],
                  "stack_bytes": attrs["local_size_bytes"], "spill_stores": -1, "spill_loads": -1}
    return out
