"""Counting what a kernel reads and writes, on the emulator, where a GPU's profiler would count it.

    counts = loads(source, "matmul_naive", "A", grid, block, args)   # an array shaped like A: loads per element
    t = traffic(source, "copy_strided", grid, block, args)          # requests, sectors, bank conflicts, per thread

The kernel runs on the CPU emulator (on any machine, GPU or not) with that one pointer parameter wrapped in a counter:
every subscript through it, in the kernel or in a macro the kernel uses, adds one to the element's count. A count is
what a GPU would fetch without caches, and it is exact, where the emulator's timings mean little: the naive matmul
reads each element of A N times, a tiled one N / TILE times.
"""

from __future__ import annotations

import mmap
import re
from dataclasses import dataclass

import numpy as np

from ..handout import KERNEL_TODO
from ..native.csource import matching_bracket, strip_comments
from .loader import Module, read_source
from .matmul import TILE
from .source import define, find_kernels

COUNTER = "labkit_loads_"
NOT_WRITTEN = KERNEL_TODO  # the stub of a kernel handed out
_WRAPPER = (
    "template <class T> struct labkit_counted {"
    " const T* p; unsigned int* c; long long off;"
    " const T& operator[](long long i) const { atomicAdd(&c[off + i], 1u); return p[off + i]; }"
    " const T& operator*() const { return (*this)[0]; }"
    " labkit_counted operator+(long long i) const { return labkit_counted{p, c, off + i}; }"
    " };\n"
)


def counting_source(source: str, name: str, array: str) -> str:
    """``source`` with kernel ``name``'s pointer parameter ``array`` counted: the parameter is renamed, a counter
    array (``unsigned int*``) is added as the kernel's last parameter, and the body sees ``array`` as a counting
    wrapper of the same name."""
    text = strip_comments(source)
    decl = next((k for k in find_kernels(text) if k.name == name), None)
    if decl is None:
        raise KeyError(f"no kernel {name!r} in the source; it has {[k.name for k in find_kernels(text)]}")
    param = next((p for p in decl.params if p.name == array), None)
    if param is None or not param.pointer or not param.const:
        raise ValueError(f"kernel {name}: {array!r} must be one of its const pointer parameters (an input to count)")
    a, b = decl.params_span
    params = [re.sub(rf"\b{re.escape(array)}\s*$", f"{COUNTER}{array}", p.text) if p.name == array else p.text
              for p in decl.params]
    head = text[:a] + ", ".join(params) + f", unsigned int* {COUNTER}" + text[b:]
    body = head.find("{", a + len(", ".join(params)))
    matching_bracket(head, body, "{", "}")  # the body is whole
    wrap = f" const labkit_counted<{param.ctype}> {array}{{{COUNTER}{array}, {COUNTER}, 0}};"
    return _WRAPPER + head[:body + 1] + wrap + head[body + 1:]


def loads(source: str, name: str, array: str, grid, block, args, shared_mem: int = 0) -> np.ndarray:
    """Loads of each element of kernel ``name``'s input ``array`` in one launch (``args`` as for the kernel itself,
    NumPy arrays), counted on the emulator; an array of the input's shape. ``source``: CUDA C text, a .cu path or a
    labkit kernel file's name ("matmul")."""
    text, filename = read_source(source)
    decl = next((k for k in find_kernels(strip_comments(text)) if k.name == name), None)
    if decl is None:
        raise KeyError(f"no kernel {name!r} in {filename}")
    index = [p.name for p in decl.params].index(array) if array in [p.name for p in decl.params] else None
    if index is None:
        raise ValueError(f"kernel {name} has no parameter {array!r}")
    target = np.asarray(args[index])
    counts = np.zeros(target.size, np.uint32)
    module = Module(counting_source(text, name, array), filename, backend="emulator", checked=False, isolated=True)
    module.get_function(name)(grid, block, (*args, counts), shared_mem=shared_mem)
    return counts.reshape(target.shape)


def matmul_launch(source: str | None, variant: str, n: int):
    """(source, kernel, grid, block, args, whose, tile) of an n x n x n product by ``variant``: the student's kernel
    where it is written, else labkit's (whose own signature has two more flags)."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    c = np.zeros((n, n), np.float32)
    size = (np.int32(n),) * 3
    mine = source is not None and NOT_WRITTEN not in source
    tile = (define(source, "TILE", TILE) if mine else TILE) if variant == "tiled" else 16
    grid, block = (-(-n // tile), -(-n // tile)), (tile, tile)
    if mine:
        return source, f"matmul_{variant}", grid, block, (a, b, c, *size), "yours", tile
    return ("matmul", f"matmul_{variant}", grid, block, (a, b, c, *size, np.int32(0), np.int32(0)),
            "labkit's (yours is not written yet)", tile)


def matmul_reads_per_thread(source: str | None, variant: str, n: int = 64) -> tuple[np.ndarray, str]:
    """(an n x n map over C: how many values the thread computing each entry loads from global memory, whose kernel)
    for an n x n x n product by ``variant`` ("naive" or "tiled"), yours where written, as for :func:`matmul_loads`."""
    src, name, grid, block, args, whose, tile = matmul_launch(source, variant, n)
    t = traffic(src, name, grid, block, args)
    per = t.thread_loads[0]  # (grid y, grid x, block z = 1, block y, block x)
    gy, gx, _, by, bx = per.shape
    return per[:, :, 0].transpose(0, 2, 1, 3).reshape(gy * by, gx * bx)[:n, :n], whose


def matmul_loads(source: str | None, variant: str, n: int = 64) -> tuple[float, str]:
    """(mean loads of each element of A, whose kernel) for an n x n x n product by ``variant`` ("naive" or "tiled"):
    your kernel from ``source`` (signature (A, B, C, M, N, K); the tiled one with its ``#define TILE``), or labkit's
    own where ``source`` is None or not written yet."""
    src, name, grid, block, args, whose, _ = matmul_launch(source, variant, n)
    return float(loads(src, name, "A", grid, block, args).mean()), whose


FIELDS = ("load_requests", "load_sectors", "store_requests", "store_sectors", "shared_requests", "shared_wavefronts")
LAUNCH_FIELDS = ("atomics", "atomics_max_per_address", "barriers")  # labkit::LaunchCount in cuda_emu.h


@dataclass
class Traffic:
    """The memory traffic of one launch, as a GPU would see it (no caches): counted per thread and per warp.

    A *request* is one load or store instruction of one warp: the 32 lanes' accesses of one subscript of the source,
    on the same pass through it. Global memory moves 32-byte *sectors*: a warp's float load touches 4 when its lanes
    read 32 neighbouring floats, 32 when they read one float each 32 floats apart. Shared memory has 32 banks of 4
    bytes; a request takes as many *wavefronts* as the most distinct words any one bank must serve (all lanes reading
    one word is a broadcast: 1), so ``bank_conflicts`` is the wavefronts beyond one per request.

    In the same run: ``atomics``, every atomic operation of the launch; ``atomics_max_per_address``, the most of them on
    any one address (a GPU performs those one after another); ``barriers``, the ``__syncthreads()`` passed, once per
    block per barrier it passes. ``flops`` is None: floating-point operations are not counted (the emulator runs the
    kernel's arithmetic as the host's own instructions, with nothing to count them by), so a model declares them.
    """

    kernel: str
    grid: tuple
    block: tuple
    thread_loads: np.ndarray    # global loads of each thread, shaped grid[::-1] + block[::-1] (z, y, x)
    thread_stores: np.ndarray
    warps: np.ndarray           # (blocks, warps per block, len(FIELDS)) in launch order
    atomics: int = 0
    atomics_max_per_address: int = 0
    barriers: int = 0
    flops: int | None = None    # not counted: the caller of a model declares them

    def total(self, field: str) -> int:
        return int(self.warps[..., FIELDS.index(field)].sum())

    @property
    def global_loads(self) -> int:
        return int(self.thread_loads.sum())

    @property
    def global_stores(self) -> int:
        return int(self.thread_stores.sum())

    @property
    def sectors_per_load(self) -> float:
        """Sectors per global load request: 4 for a warp reading 32 consecutive floats, up to 32."""
        r = self.total("load_requests")
        return self.total("load_sectors") / r if r else 0.0

    @property
    def sectors_per_store(self) -> float:
        r = self.total("store_requests")
        return self.total("store_sectors") / r if r else 0.0

    @property
    def bank_conflicts(self) -> int:
        return self.total("shared_wavefronts") - self.total("shared_requests")

    def summary(self) -> dict:
        return {"kernel": self.kernel, "global_loads": self.global_loads, "global_stores": self.global_stores,
                **{f: self.total(f) for f in FIELDS}, "sectors_per_load": self.sectors_per_load,
                "sectors_per_store": self.sectors_per_store, "bank_conflicts": self.bank_conflicts,
                **{f: getattr(self, f) for f in LAUNCH_FIELDS}}

    def describe(self) -> str:
        s = self.summary()
        return (f"{self.kernel}: {s['global_loads']:,} global loads in {s['load_requests']:,} requests "
                f"({s['sectors_per_load']:.1f} sectors each), {s['global_stores']:,} stores in {s['store_requests']:,} "
                f"({s['sectors_per_store']:.1f} sectors each); {s['shared_requests']:,} shared-memory requests, "
                f"{s['bank_conflicts']:,} bank conflicts; {s['atomics']:,} atomics (at most "
                f"{s['atomics_max_per_address']:,} on one address), {s['barriers']:,} barriers passed")


def traffic(source: str, name: str, grid, block, args, shared_mem: int = 0) -> Traffic:
    """Run kernel ``name`` once on the emulator with every access counted (in checked mode, in a child process for a
    source that is not labkit's) and return its :class:`Traffic`. ``source``: CUDA C text, a .cu path or a labkit
    kernel file's name; ``args`` as for the kernel, NumPy arrays (they are written as by a normal launch)."""
    grid = tuple(grid) + (1,) * (3 - len(tuple(grid)))
    block = tuple(block) + (1,) * (3 - len(tuple(block)))
    text, filename = read_source(source)
    nblocks, nthreads = int(np.prod(grid)), int(np.prod(block))
    nwarps = -(-nthreads // 32)
    sizes = (nblocks * nthreads * 4, nblocks * nthreads * 4, nblocks * nwarps * len(FIELDS) * 8, len(LAUNCH_FIELDS) * 8)
    region = mmap.mmap(-1, sum(sizes))  # shared with the child process that runs the launch
    try:
        raw = np.frombuffer(region, np.uint8)
        loads_, stores_ = (raw[i * sizes[0]:(i + 1) * sizes[0]].view(np.uint32) for i in range(2))
        warps = raw[2 * sizes[0]:2 * sizes[0] + sizes[2]].view(np.uint64).reshape(nblocks * nwarps, len(FIELDS))
        launch = raw[2 * sizes[0] + sizes[2]:].view(np.uint64)
        module = Module(text, filename, backend="emulator", checked=True, counting=True)
        module.count_into(loads_, stores_, warps, launch)
        module.get_function(name)(grid, block, args, shared_mem=shared_mem)
        shape = grid[::-1] + block[::-1]
        result = Traffic(name, grid, block, loads_.reshape(shape).copy(), stores_.reshape(shape).copy(),
                         warps.reshape(nblocks, nwarps, len(FIELDS)).copy(),
                         **{f: int(v) for f, v in zip(LAUNCH_FIELDS, launch)})
        del raw, loads_, stores_, warps, launch
    finally:
        try:
            region.close()
        except BufferError:  # a view still alive: the mapping goes with it
            pass
    return result


_COLUMN = r"""
extern "C" __global__ void column(const float* in, float* out, int width)
{
    extern __shared__ float tile[];  // tile[32][width], one source for every width (one compile)
    tile[threadIdx.y * width + threadIdx.x] = in[threadIdx.y * 32 + threadIdx.x];
    __syncthreads();
    out[threadIdx.y * 32 + threadIdx.x] = tile[threadIdx.x * width + threadIdx.y];
}
"""


def tile_column_conflicts(width: int) -> float:
    """Bank conflicts per warp when the 32 lanes read one column of a ``__shared__ float tile[32][width]``, counted:
    each row of ``width`` floats moves the column's next element ``width`` banks on."""
    if int(width) < 32:
        raise ValueError(f"a tile[32][width] holds rows of 32 floats: width must be at least 32, got {width}")
    x, y = np.arange(32 * 32, dtype=np.float32), np.zeros(32 * 32, np.float32)
    t = traffic(_COLUMN, "column", (1,), (32, 32), (x, y, np.int32(width)), shared_mem=32 * int(width) * 4)
    reads = t.total("shared_requests") // 2  # a store of a row and a read of a column per warp
    return t.bank_conflicts / reads
