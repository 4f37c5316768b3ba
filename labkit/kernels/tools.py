"""Looking at kernels without running them: a compile check for real GPUs and the resources each kernel uses.

Neither needs a GPU. The compiler is NVRTC where it can be found, the compiler CuPy's RawKernel uses on a GPU: from
the ``nvidia-cuda-nvrtc-cu12`` wheel (the test extra installs it, ``pip install nvidia-cuda-nvrtc-cu12`` anywhere),
a CUDA toolkit's libnvrtc, or CuPy's. Else ``nvcc``. A kernel the emulator runs can still fail here: the emulator
compiles with the host's C++ compiler, which knows ``std::max``, ``strlen`` and ``rand()``; a GPU does not.

    compile_check(source, "sm_90")        # raises KernelCompileError with the compiler's message
    compile_for_gpus(source)              # for every modelled GPU's arch, remembered per source in labkit's cache
    resource_usage("matmul")              # {kernel: {"registers", "shared_bytes", ...}} from ptxas -v
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .. import settings
from ..device import gpu_status
from ..native.csource import strip_comments
from .gpus import GPUS
from .source import KernelCompileError, find_kernels, read_source

ARCHS = tuple(sorted({g.arch for g in GPUS.values()}))  # every GPU the course models (labkit.kernels.gpus)
NO_COMPILER = ("no CUDA compiler here to check that the kernel compiles for a GPU: pip install nvidia-cuda-nvrtc-cu12 "
               "(NVRTC, about 90 MB, no GPU needed), or install the CUDA toolkit (nvcc)")


def nvcc() -> str | None:
    """The nvcc on PATH (or under $CUDA_HOME/bin), or None."""
    found = shutil.which("nvcc")
    if not found and os.environ.get("CUDA_HOME"):
        cand = Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"
        found = str(cand) if cand.exists() else None
    return found


def nvrtc_library() -> str | None:
    """The path of a libnvrtc: the nvidia-cuda-nvrtc wheel's, a CUDA toolkit's ($CUDA_HOME, /usr/local/cuda), or
    the system's; None if there is none."""
    places = []
    try:
        import nvidia.cuda_nvrtc as wheel  # the nvidia-cuda-nvrtc-cu12 wheel (a namespace package)

        places += [os.path.join(d, "lib", "libnvrtc.so*") for d in wheel.__path__]
        places += [os.path.join(d, "bin", "nvrtc64_*.dll") for d in wheel.__path__]
    except ImportError:
        pass
    places += [os.path.join(sys.prefix, "lib", "python3*", "site-packages", "nvidia", "cu1*", "lib", "libnvrtc.so*")]
    places.append(os.path.join(sys.prefix, "lib", "libnvrtc.so*"))  # a conda environment's cuda-nvrtc
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            places.append(os.path.join(home, "lib64", "libnvrtc.so*"))
    for pattern in places:
        found = sorted(f for f in glob.glob(pattern) if "builtins" not in f and ".alt." not in f)
        if found:
            return found[0]
    return ctypes.util.find_library("nvrtc")


@functools.cache
def _nvrtc() -> ctypes.CDLL | None:
    path = nvrtc_library()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
        major, minor = ctypes.c_int(), ctypes.c_int()
        if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) != 0:
            return None
    except OSError:
        return None
    return lib


def _cupy_nvrtc():
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
        return nvrtc
    except Exception:
        return None


def nvrtc_available() -> bool:
    return _nvrtc() is not None or _cupy_nvrtc() is not None


def compiler_for_check() -> str | None:
    """"nvrtc", "nvcc" or None: what compile_check would use here (NVRTC first: it is what CuPy compiles with)."""
    if nvrtc_available():
        return "nvrtc"
    if nvcc():
        return "nvcc"
    return None


def _nvrtc_compile(text: str, name: str, arch: str, verbose: bool) -> str:
    """Compile with NVRTC for ``arch``; the log (ptxas's report with ``verbose``). Raises KernelCompileError."""
    options = [f"--gpu-architecture={arch}", "-std=c++17"] + (["--ptxas-options=-v"] if verbose else [])
    lib = _nvrtc()
    if lib is None:
        nvrtc = _cupy_nvrtc()
        prog = nvrtc.createProgram(text, name, [], [])
        try:
            nvrtc.compileProgram(prog, options)
            return nvrtc.getProgramLog(prog)
        except nvrtc.NVRTCError as e:
            raise KernelCompileError(f"{name} does not compile for {arch} with NVRTC:\n{nvrtc.getProgramLog(prog)}") from e
        finally:
            nvrtc.destroyProgram(prog)
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), name.encode(), 0, None, None) != 0:
        raise KernelCompileError(f"{name}: NVRTC could not take the source")
    try:
        opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        status = lib.nvrtcCompileProgram(prog, len(options), opts)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(max(size.value, 1))
        lib.nvrtcGetProgramLog(prog, log)
        text_log = log.value.decode(errors="replace").strip()
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    if status != 0:
        raise KernelCompileError(f"{name} does not compile for {arch} with NVRTC:\n{text_log}")
    return text_log


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


def _compile(text: str, name: str, arch: str, verbose: bool) -> tuple[str, str]:
    """(tool, log) of compiling for ``arch`` with the first compiler here; RuntimeError if there is none."""
    tool = compiler_for_check()
    if tool == "nvrtc":
        return tool, _nvrtc_compile(text, name, arch, verbose)
    if tool == "nvcc":
        return tool, _nvcc_cubin(text, name if name.endswith(".cu") else name + ".cu", arch, verbose)
    raise RuntimeError(NO_COMPILER)


def compile_check(source: str | Path, arch: str = "sm_90") -> str:
    """Compile for a real GPU architecture (no GPU needed); raise KernelCompileError with the message if it fails.

    ``source`` is CUDA C, a .cu path, or the name of one of labkit's kernel files ("matmul"). Returns the tool used.
    """
    text, name = read_source(source)
    return _compile(text, name, arch, verbose=False)[0]


def compile_for_gpus(source: str | Path, archs: tuple[str, ...] = ARCHS) -> str:
    """Compile for each of ``archs`` (every modelled GPU's) and return the tool; a source that compiled once is remembered
    in labkit's cache, so a check run again does not compile again. Raises KernelCompileError naming the first
    architecture that fails, RuntimeError where there is no compiler."""
    text, name = read_source(source)
    tool = compiler_for_check()
    if tool is None:
        raise RuntimeError(NO_COMPILER)
    key = hashlib.sha256("\0".join([text, tool, *archs]).encode()).hexdigest()[:24]
    try:
        stamp = settings.cache_dir() / "gpu-compiled" / key
    except OSError:  # no writable cache (a sandbox): compile every time
        stamp = None
    if stamp is not None and stamp.exists():
        return tool
    for arch in archs:
        _compile(text, name, arch, verbose=False)
    if stamp is not None:
        try:
            stamp.parent.mkdir(parents=True, exist_ok=True)
            stamp.write_text(f"{name} compiled for {', '.join(archs)} with {tool}\n")
        except OSError:
            pass
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
    """Registers, shared memory, stack and spills per kernel, as ptxas reports them for ``arch`` (no GPU needed).

    Uses NVRTC or nvcc where present; on a machine with a working GPU and neither, CuPy's kernel attributes
    (registers and static shared memory only, for the GPU present rather than ``arch``).
    """
    text, name = read_source(source)
    if compiler_for_check() is not None:
        return parse_ptxas(_compile(text, name, arch, verbose=True)[1])
    ok, why = gpu_status()
    if not ok:
        raise RuntimeError(f"resource_usage needs NVRTC (pip install nvidia-cuda-nvrtc-cu12), nvcc or a working GPU: {why}")
    import cupy

    mod = cupy.RawModule(code=text, options=("-std=c++17",))
    out = {}
    for k in (d.name for d in find_kernels(strip_comments(text))):
        attrs = mod.get_function(k).attributes
        out[k] = {"registers": attrs["num_regs"], "shared_bytes": attrs["shared_size_bytes"],
                  "stack_bytes": attrs["local_size_bytes"], "spill_stores": -1, "spill_loads": -1}
    return out
