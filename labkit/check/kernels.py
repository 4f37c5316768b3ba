"""Checks of the CUDA C exercises (labs 04-05): the student's source runs on the CPU emulator in checked mode, so
an out-of-bounds access or a barrier some threads miss is reported with the kernel, block, thread and line."""

from __future__ import annotations

import numpy as np

from . import capture
from .common import ExerciseError, fail, passed, recorded
from .exercises import Exercise

KERNEL_TODO = "YOUR CODE HERE"


def load_student_kernel(ex: str, source: str, name: str, must_have: dict[str, str]):
    from .. import kernels
    from ..kernels.source import strip_comments

    if not isinstance(source, str):
        fail(ex, f"expected the kernel's CUDA C source as a string, got {type(source).__name__}")
    if KERNEL_TODO in source:
        raise ExerciseError(f"{ex}: not written yet (the kernel still says {KERNEL_TODO})\nHint: write the kernel's body in "
                            "place of the comment, run the cell, then run this check again")

    def compile_():
        try:
            mod = kernels.load(source, backend="emulator", checked=True)
        except kernels.KernelCompileError as e:
            fail(ex, f"your kernel does not compile:\n{e}", "the first error is usually the one to fix; the line numbers "
                  "are lines of your source")
        if name not in mod.kernel_names:
            fail(ex, f"no kernel called {name!r} in your source (found {mod.kernel_names or 'none'})",
                  f'declare it as extern "C" __global__ void {name}(...)')
        return mod.get_function(name)

    kernel = capture.build("kernel", compile_, ex)
    code = strip_comments(source)
    for needle, hint in must_have.items():
        if needle not in code:
            fail(ex, f"your kernel does not use {needle}", hint)
    return kernel


def _tiles_staged(ex: str, source: str, name: str) -> None:
    """Fail a kernel that declares ``__shared__`` tiles but does not work from them: a tile never stored or never
    read, or the global inputs read anywhere but in a store to a tile (the naive kernel with a shared array beside
    it). Read from the source: the emulator's counts of memory traffic will judge it by what it does."""
    import re

    from ..kernels.source import strip_comments

    code = strip_comments(source)
    tiles = re.findall(r"__shared__\s+[\w\s]+?\b(\w+)\s*\[", code)
    for t in tiles:
        if not re.search(rf"\b{t}\s*(\[[^\]]*\]\s*)+=(?!=)", code):
            fail(ex, f"the __shared__ array {t} is never stored to", "each thread stores one element of the current "
                 "tile of A (or B) into the shared array, then the block waits for all the stores")
        if not any(not re.match(r"\s*=(?!=)", code[m.end():]) for m in re.finditer(rf"\b{t}\s*(?:\[[^\]]*\]\s*)+", code)):
            fail(ex, f"the __shared__ array {t} is never read", "the products of the inner loop read their operands "
                 "from the shared tiles, not from A and B")
    signature = re.search(rf"\b{re.escape(name)}\s*\(([^)]*)\)", code)
    inputs = re.findall(r"\*\s*(?:const\s+|__restrict__\s+)*(\w+)\s*(?:,|$)", signature.group(1))[:2] if signature else []
    for line in re.split(r"[;{}]", code):  # statement by statement
        for g in inputs:
            if re.search(rf"\b{g}\s*\[", line) and not any(re.search(rf"\b{t}\s*(\[[^\]]*\]\s*)+=(?!=)", line)
                                                               for t in tiles):
                private = re.match(r"\s*(\w+)\s*(?:\[[^\]]*\]\s*)+=(?!=)", line)
                if private and private.group(1) not in (*inputs, *tiles):
                    fail(ex, f"the array {private.group(1)} that you store {g} into is not __shared__: every thread has "
                         "its own copy, so no thread sees what the others loaded", f"declare it __shared__ float "
                         f"{private.group(1)}[TILE][TILE]; one copy per block")
                fail(ex, f"your kernel reads {g} from global memory outside storing a tile: `{' '.join(line.split())}`",
                     f"each element of {g} should come from global memory once per tile, into a __shared__ array, and "
                     "be used TILE times from there; the inner product reads only the shared tiles")


def run_student_kernel(ex: str, kernel, grid, block, args, hint: str) -> None:
    from .. import kernels

    try:
        kernel(grid, block, args)
    except kernels.KernelError as e:
        fail(ex, f"the emulator stopped your kernel: {e}", hint)
    except (TypeError, ValueError) as e:
        fail(ex, f"your kernel's parameters do not fit the launch: {e}",
              "keep the signature given in the exercise: the check launches it with exactly those arguments")


@recorded
def tiled_matmul(source: str, name: str = "matmul_tiled", tile: int | None = None) -> None:
    """Lab 05: C = A B with tile x tile blocks staged in shared memory.

    Signature (const float* A, const float* B, float* C, int M, int N, int K); launched with block
    (tile, tile) and grid (ceil(N/tile), ceil(M/tile)); ``tile`` is the source's ``#define TILE`` (else 16).
    """
    from ..kernels.source import define

    ex = "tiled matmul"
    source = capture.source(source)
    tile = tile or (define(source, "TILE", 16) if isinstance(source, str) else 16)
    if not 1 <= tile <= 32:
        fail(ex, f"#define TILE {tile}: a block of TILE x TILE threads needs 1 <= TILE <= 32 (at most 1,024 threads)")
    k = load_student_kernel(ex, source, name, {
        "__shared__": "stage a tile of A and a tile of B in __shared__ arrays; without them this is the naive kernel",
        "__syncthreads": "wait with __syncthreads() after loading a tile (before using it) and after using it (before the "
                         "next load overwrites it)"})
    if isinstance(source, str):
        _tiles_staged(ex, source, name)
    rng = np.random.default_rng(capture.seed(0))
    checks = 0
    for M, N, K in [(tile, tile, tile), (2 * tile, 3 * tile, 4 * tile), (1, 1, 1), (tile + 1, 2 * tile + 1, tile + 3),
                    (37, 5, 70)]:
        a = rng.standard_normal((M, K)).astype(np.float32)
        b = rng.standard_normal((K, N)).astype(np.float32)
        c = np.full((M, N), np.nan, np.float32)
        multiple = M % tile == 0 and N % tile == 0 and K % tile == 0
        hint = ("" if multiple else "this size is not a multiple of the tile: load 0.0 for elements outside A or B, keep every "
                "thread going through every __syncthreads(), and write C only where row < M and col < N")
        run_student_kernel(ex, k, (-(-N // tile), -(-M // tile)), (tile, tile),
                           (a, b, c, np.int32(M), np.int32(N), np.int32(K)), hint)
        want = a @ b
        bad = ~np.isclose(c, want, rtol=1e-4, atol=1e-4)
        if bad.any():
            i, j = map(int, np.argwhere(bad)[0])
            unwritten = np.isnan(c).sum()
            fail(ex, f"M={M}, N={N}, K={K}: C[{i}, {j}] is {float(c[i, j]):.6g} (yours) but should be {want[i, j]:.6g} (spec); "
                  f"{int(bad.sum())} of {c.size} entries wrong" + (f", {unwritten} never written" if unwritten else ""),
                  hint or "check the indices: row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x, "
                  "and the tile loads A[row][t + threadIdx.x], B[t + threadIdx.y][col]")
        checks += 1
    passed(ex, checks)


@recorded
def block_reduction(source: str, name: str = "block_sum", threads: int = 256) -> None:
    """Lab 05: *out += sum(x) with a shared-memory tree in each block and one atomicAdd per block;
    signature (const float* x, float* out, int n), launched with `threads` per block over a grid-stride loop."""
    ex = "block reduction"
    source = capture.source(source)
    k = load_student_kernel(ex, source, name, {
        "__shared__": "each block sums its values in a __shared__ array, halving the active threads each step",
        "atomicAdd": "finish with atomicAdd(out, block_total) from one thread of each block: blocks cannot see each other's "
                     "shared memory"})
    rng = np.random.default_rng(capture.seed(1))
    checks = 0
    for n, blocks in [(1, 1), (threads, 1), (threads + 1, 2), (10_000, 8), (100_003, 16)]:
        x = rng.random(n).astype(np.float32)
        out = np.zeros(1, np.float32)
        run_student_kernel(ex, k, (blocks,), (threads,), (x, out, np.int32(n)),
                           "every thread must reach each __syncthreads() of the tree; guard the additions, not the barrier")
        want = float(x.sum(dtype=np.float64))
        if not np.isclose(out[0], want, rtol=1e-4):
            hint = "add the values of a grid-stride loop first: for (i = blockIdx.x * blockDim.x + threadIdx.x; i < n; " \
                   "i += gridDim.x * blockDim.x)"
            if n <= threads and blocks == 1 and out[0] == 0:
                hint = "nothing reached *out: thread 0 of each block must atomicAdd the block's total"
            elif np.isclose(out[0], want * threads, rtol=1e-3):
                hint = "every thread added the block's total: only thread 0 should call atomicAdd"
            fail(ex, f"n={n} over {blocks} blocks of {threads}: the sum is {float(out[0]):.6g} (yours) "
                  f"but should be {want:.6g} (spec)", hint)
        checks += 1
    passed(ex, checks)


EXERCISES = (
    Exercise("block_reduction", "05", "kernels", sources=(("kernels/reduce.cu", None),)),
    Exercise("tiled_matmul", "05", "kernels", sources=(("kernels/matmul.cu", "matmul_tiled"),)),
)
