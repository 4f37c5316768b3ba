"""One loader for CUDA C: CuPy RawModule on a CUDA device, the CPU emulator everywhere else.

    mod = load(source)                       # or load_file("matmul") for labkit's own kernels
    k = mod.get_function("matmul_tiled")
    k((gx, gy), (16, 16), (a, b, c, np.int32(m), np.int32(n), np.int32(k)))

The call is CuPy's ``RawKernel`` call on both back ends. Before a launch the arguments are checked
against the kernel's parameter list as written in the source: an array for each pointer (on the
right device, C-contiguous, of the pointee's dtype, writeable unless ``const``) and a NumPy scalar of
exactly the parameter's type for each value (``np.int32(n)`` for ``int n``: the GPU does not convert).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
from pathlib import Path

import numpy as np

from .. import settings
from ..device import gpu_status
from ..native.csource import Param, UnbalancedBracket, check_args, matching_bracket, strip_comments
from . import emulator, tools
from .emulator import EmulatorUnavailable, KernelError
from .gpus import DEFAULT, GPUS
from .source import KERNEL_DIR, KernelCompileError, KernelDecl, UnsupportedFeature, find_constants, find_kernels, read_source

__all__ = ["KernelCompileError", "KernelError", "UnsupportedFeature", "EmulatorUnavailable", "backend", "load", "load_file",
           "kernel_source", "Module", "Kernel", "KERNEL_DIR"]

BACKENDS = ("cupy", "emulator")
MAX_THREADS_PER_BLOCK = 1024
# Shared memory per block, as a GPU allows it: 48 KB unless a kernel opts in (CuPy's max_dynamic_shared_size_bytes),
# and with the opt-in at most what the device has (the emulator takes the default GPU's: an H100's 227 KB).
SHARED_DEFAULT_LIMIT = 48 * 1024
SHARED_DEVICE_MAX_EMULATED = GPUS[DEFAULT].shared_per_block


def backend() -> str:
    """"cupy" when a CUDA device works (and $LABKIT_DEVICE is not "cpu"), else "emulator"."""
    device = settings.device()
    if device == "cpu":
        return "emulator"
    ok, why = gpu_status()
    if device == "gpu" and not ok:
        raise RuntimeError(f"LABKIT_DEVICE={device} but no GPU can be used: {why}")
    return "cupy" if ok else "emulator"


def _resolve(which: str | None) -> str:
    which = which or backend()
    if which not in BACKENDS:
        raise ValueError(f"unknown kernel back end {which!r}; use one of {BACKENDS}")
    if which == "cupy":
        ok, why = gpu_status()
        if not ok:
            raise RuntimeError(f"the cupy back end needs a working CUDA device: {why}")
    return which


def checked_default() -> bool:
    """Whether labkit's own kernels run checked on the emulator: $LABKIT_CHECKED=1 (the tests set it)."""
    return settings.checked()


def _defines(defines: dict | None) -> tuple[str, ...]:
    return tuple(f"-D{k}={v}" for k, v in sorted((defines or {}).items()))


class Kernel:
    """A launchable kernel: ``kernel(grid, block, args, shared_mem=0)``, as CuPy's RawKernel."""

    def __init__(self, module: Module, decl: KernelDecl):
        self.module = module
        self.decl = decl
        self.name = decl.name
        self.params: tuple[Param, ...] = decl.params
        self._raw = None  # the CuPy RawKernel, fetched on first use
        self._max_dynamic_shared = 0

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        """Dynamic shared memory this kernel may ask for above 48 KB, as CuPy's attribute of the same name: a launch
        with ``shared_mem`` over 48 KB is refused unless this opts in, and never above the device's maximum."""
        return self._max_dynamic_shared

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, nbytes: int) -> None:
        nbytes = int(nbytes)
        top = self._device_shared_max()
        if not 0 <= nbytes <= top:
            raise ValueError(f"kernel {self.name}: max_dynamic_shared_size_bytes must be between 0 and the device's "
                             f"{top} bytes, got {nbytes}")
        if self.module.backend == "cupy":
            self._cupy_function().max_dynamic_shared_size_bytes = nbytes
        self._max_dynamic_shared = nbytes

    def _device_shared_max(self) -> int:
        if self.module.backend == "cupy":
            import cupy

            return int(cupy.cuda.Device().attributes.get("MaxSharedMemoryPerBlockOptin", SHARED_DEVICE_MAX_EMULATED))
        return SHARED_DEVICE_MAX_EMULATED

    def _cupy_function(self):
        if self._raw is None:
            self._raw = self.module._cupy.get_function(self.name)
        return self._raw

    def __repr__(self):
        sig = ", ".join(p.describe() for p in self.params)
        return f"<kernel {self.name}({sig}) on {self.module.backend}{' (checked)' if self.module.checked else ''}>"

    def __call__(self, grid, block, args, shared_mem: int = 0, timeout_s: float | None = None, reversed_order: bool = False):
        """Launch, as CuPy's RawKernel; on the emulator ``reversed_order`` runs each block's threads last to first."""
        grid3, block3 = launch_shape(grid, "grid"), launch_shape(block, "block")
        _check_launch(self.name, grid3, block3, shared_mem, self._max_dynamic_shared)
        args = tuple(args)
        nbytes = self._check_args(args)
        if self.module.backend == "cupy":
            self._cupy_function()(grid3, block3, args, shared_mem=int(shared_mem))
            return
        if timeout_s is None:
            timeout_s = settings.kernel_timeout() if self.module.checked else 0.0
        self.module._emu.launch(self.name, grid3, block3, args, nbytes, shared_mem=int(shared_mem), timeout_s=timeout_s,
                                writable=[p.pointer and not p.const for p in self.params], reversed_order=reversed_order)

    def _check_args(self, args) -> list[int]:
        return check_args(self.params, args, f"kernel {self.name}", self.module.backend == "cupy")


def launch_shape(v, what: str) -> tuple[int, int, int]:
    """(x, y, z) from an int or a tuple of 1 to 3 ints, each >= 1."""
    t = (v,) if isinstance(v, int | np.integer) else tuple(v)
    if not 1 <= len(t) <= 3 or not all(isinstance(x, int | np.integer) for x in t):
        raise TypeError(f"{what} must be an int or a tuple of 1 to 3 ints, got {v!r}")
    t = tuple(int(x) for x in t) + (1,) * (3 - len(t))
    if any(x < 1 for x in t):
        raise ValueError(f"{what} dimensions must be >= 1, got {t}: an empty launch is a bug in the size computation")
    return t


def _check_launch(name: str, grid, block, shared_mem, opted_in: int = 0) -> None:
    threads = block[0] * block[1] * block[2]
    if threads > MAX_THREADS_PER_BLOCK:
        raise ValueError(f"kernel {name}: a block of {block} is {threads} threads; at most {MAX_THREADS_PER_BLOCK} per block")
    if block[2] > 64:
        raise ValueError(f"kernel {name}: block z is {block[2]}; at most 64")
    if grid[0] > 2**31 - 1 or grid[1] > 65535 or grid[2] > 65535:
        raise ValueError(f"kernel {name}: grid {grid} is too large (x < 2^31, y and z <= 65535)")
    if int(shared_mem) < 0:
        raise ValueError(f"kernel {name}: shared_mem must be >= 0")
    limit = max(SHARED_DEFAULT_LIMIT, opted_in)
    if int(shared_mem) > limit:
        how = ("" if opted_in else "; above 48 KB a GPU needs an opt-in first: kernel.max_dynamic_shared_size_bytes = "
               f"{int(shared_mem)} (at most the device's maximum)")
        raise ValueError(f"kernel {name}: shared_mem={int(shared_mem)} bytes is more dynamic shared memory than this "
                         f"launch may use ({limit} bytes){how}")


class Module:
    """Kernels compiled from one source on one back end."""

    def __init__(self, source: str, filename: str = "kernel.cu", backend: str | None = None, checked: bool | None = None,
                 defines: dict | None = None, isolated: bool | None = None, counting: bool = False):
        self.backend = _resolve(backend)
        self.filename = filename
        self.source = source
        try:  # the source is read here, and again by the emulator as it rewrites it
            clean = strip_comments(source)
            self.decls = {k.name: k for k in find_kernels(clean)}
            self.constants = find_constants(clean)
            options = _defines(defines)
            if self.backend == "cupy":
                import cupy

                self.checked = False
                self._cupy = cupy.RawModule(code=source, options=("-std=c++17", *options))
                self._emu = None
            else:
                self.checked = True if checked is None else bool(checked)
                self._emu = emulator.EmulatorModule(source, filename, checked=self.checked, options=options,
                                                    isolated=self.checked if isolated is None else isolated,
                                                    counting=counting)
                self._cupy = None
        except UnbalancedBracket as e:
            raise KernelCompileError(f"{filename} did not compile: {e}") from None
        self._kernels: dict[str, Kernel] = {}

    @property
    def kernel_names(self) -> list[str]:
        return list(self.decls)

    def get_function(self, name: str) -> Kernel:
        """The kernel called ``name`` (declared ``extern "C" __global__ void name(...)``)."""
        if name not in self._kernels:
            if name not in self.decls:
                raise KeyError(f"{self.filename} has no kernel {name!r}; it has {sorted(self.decls) or 'none'}")
            if self.decls[name].template:
                raise UnsupportedFeature(f"{name} is a template kernel; give each instance its own extern \"C\" kernel")
            self._kernels[name] = Kernel(self, self.decls[name])
        return self._kernels[name]

    def __getattr__(self, name: str) -> Kernel:
        if name.startswith("_") or name not in self.__dict__.get("decls", {}):
            raise AttributeError(name)
        return self.get_function(name)

    def count_into(self, thread_loads, thread_stores, warps, launch=None) -> None:
        """A counting module (``counting=True``, the emulator): where its launches add their counts."""
        if self._emu is None:
            raise RuntimeError("memory traffic is counted on the emulator only")
        self._emu.count_into(thread_loads, thread_stores, warps, launch)

    def set_constant(self, name: str, value) -> None:
        """Copy a host array (or scalar) into the ``__constant__`` variable ``name``."""
        if name not in self.constants:
            raise KeyError(f"{self.filename} has no __constant__ {name!r}; it has {self.constants or 'none'}")
        host = np.ascontiguousarray(value)
        if self.backend == "cupy":
            ptr = self._cupy.get_global(name)
            if host.nbytes > ptr.mem.size:
                raise ValueError(f"__constant__ {name} holds {ptr.mem.size} bytes; the value has {host.nbytes}")
            ptr.copy_from_host(ctypes.c_void_p(host.ctypes.data), host.nbytes)  # older CuPy takes only c_void_p
            return
        addr, size = self._emu.constant_address(name)
        if host.nbytes > size:
            raise ValueError(f"__constant__ {name} holds {size} bytes; the value has {host.nbytes}")
        ctypes.memmove(addr, host.ctypes.data, host.nbytes)


def load(source: str | Path, *, backend: str | None = None, checked: bool | None = None, defines: dict | None = None,
         gpu_check: bool = True) -> Module:
    """Compile CUDA C (text, a .cu path, or a labkit kernel file's name). On the emulator ``checked`` defaults to True,
    and with ``gpu_check`` the source must also compile for a GPU (NVRTC, where a CUDA compiler is installed): what a
    GPU's compiler refuses (``std::max`` in a kernel) raises KernelCompileError with its message, not runs here."""
    text, filename = read_source(source)
    module = Module(text, filename, backend=backend, checked=checked, defines=defines)
    if gpu_check and module.backend == "emulator":
        compiles_for_gpus(text, filename, defines)
    return module


GPU_ONLY_HINT = ("The CPU emulator compiles kernels with this computer's C++ compiler, which also knows the C and C++ "
                 "standard libraries; a GPU's compiler knows neither. Use CUDA's own device functions (fmaxf, fminf, "
                 "sqrtf, expf, ...) instead of std::max, std::sqrt, rand() or strlen, and keep the kernel free of #include")
_compiled_for_gpus: set[str] = set()


def compiles_for_gpus(text: str, filename: str = "kernel.cu", defines: dict | None = None) -> None:
    """Raise KernelCompileError (NVRTC's message and what to do) where a GPU's compiler refuses the source; nothing
    where no CUDA compiler is installed. Remembered in this process and in labkit's cache: a second call costs nothing."""
    head = "".join(f"#define {k} {v}\n" for k, v in sorted((defines or {}).items()))
    full = head + ("#line 1\n" if head else "") + text
    key = hashlib.sha256(f"{filename}\0{full}".encode()).hexdigest()
    if key in _compiled_for_gpus:
        return
    try:
        tools.compile_for_gpus(full if "\n" in full else full + "\n")
    except tools.KernelCompileError as e:
        raise KernelCompileError(f"{filename} runs on the CPU emulator but a GPU's compiler refuses it:\n{e}\n"
                                 f"{GPU_ONLY_HINT}") from None
    except RuntimeError:  # no CUDA compiler here: the emulator alone cannot tell
        return
    _compiled_for_gpus.add(key)


def kernel_source(source: str | Path, name: str) -> str:
    """The text of kernel ``name`` (with the comment lines just above it) from CUDA C text, a .cu path or a labkit
    kernel file's name: for showing a kernel in a notebook, ``print(kernels.kernel_source("layers", "outer"))``."""
    text, filename = read_source(source)
    clean = strip_comments(text)
    decl = next((k for k in find_kernels(clean) if k.name == name), None)
    if decl is None:
        raise KeyError(f"no kernel {name!r} in {filename}; it has {[k.name for k in find_kernels(clean)]}")
    body = clean.find("{", decl.params_span[1])
    end = matching_bracket(clean, body, "{", "}")
    start = clean.rfind("\n", 0, clean.rfind("__global__", 0, decl.params_span[0])) + 1
    lines = text[:start].split("\n")[:-1]
    while lines and lines[-1].lstrip().startswith("//"):  # the comment that introduces the kernel
        start -= len(lines.pop()) + 1
    return text[start:end + 1]


@functools.cache
def _library_module(name: str, which: str, checked: bool, defines: tuple) -> Module:
    path = KERNEL_DIR / f"{name}.cu"
    # labkit's own kernels are trusted: checked (the tests do that) but run in this process, without a fork per launch
    return Module(path.read_text(), path.name, backend=which, checked=checked, defines=dict(defines), isolated=False)


def load_file(name: str, *, backend: str | None = None, checked: bool | None = None, defines: dict | None = None) -> Module:
    """One of labkit's own kernel files (``"matmul"`` is labkit/kernels/matmul.cu), compiled once per process."""
    if not (KERNEL_DIR / f"{name}.cu").exists():
        have = sorted(p.stem for p in KERNEL_DIR.glob("*.cu"))
        raise KeyError(f"labkit has no kernel file {name}.cu; it has {have}")
    which = _resolve(backend)
    chk = checked_default() if checked is None else bool(checked)
    return _library_module(name, which, chk and which == "emulator", tuple(sorted((defines or {}).items())))


