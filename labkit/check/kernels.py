"""Checks of the CUDA C exercises (labs 04-05): the student's source runs on the CPU emulator in checked mode, so
an out-of-bounds access, a barrier some threads miss or a race between the threads of a block (a store and another
thread's access of one element with no barrier between) is reported with the kernel, block, thread and line. Each
check also runs the kernel once with each block's threads in the opposite order and compares the results."""

from __future__ import annotations

import math
import re

import numpy as np

from .. import kernels
from ..handout import KERNEL_TODO
from ..kernels import KernelCompileError, counts, speed_of_light, tools, warp
from ..kernels.source import define, find_kernels
from ..native.csource import matching_bracket, strip_comments
from . import capture
from .common import ExerciseError, each_case, fail, passed, recorded, scored
from .exercises import Exercise


def load_student_kernel(ex: str, source: str, name: str, must_have: dict[str, str], probe=None, refused=None):
    """The student's kernel, compiled for the emulator (checked) and for GPUs; fail naming what ``must_have`` lists and
    the source lacks. Without a __syncthreads(), ``probe(kernel)`` (a small launch) names the race it leaves;
    ``refused(source, error)`` may name why a compiler refused it: (what, hint), or None."""
    if not isinstance(source, str):
        fail(ex, f"expected the kernel's CUDA C source as a string, got {type(source).__name__}")
    if KERNEL_TODO in source:
        raise ExerciseError(f"{ex}: not written yet (the kernel still says {KERNEL_TODO})\nHint: write the kernel's body in "
                            "place of the comment, run the cell, then run this check again")

    def compile_():
        try:
            mod = kernels.load(source, backend="emulator", checked=True, gpu_check=False)  # compiles_for_gpus below
        except kernels.KernelCompileError as e:
            said = refused(source, str(e)) if refused else None
            if said:
                fail(ex, f"your kernel does not compile: {said[0]}:\n{e}", said[1])
            fail(ex, f"your kernel does not compile:\n{e}", "the first error is usually the one to fix; the line numbers "
                  "are lines of your source")
        if name not in mod.kernel_names:
            fail(ex, f"no kernel called {name!r} in your source (found {mod.kernel_names or 'none'})",
                  f'declare it as extern "C" __global__ void {name}(...)')
        compiles_for_gpus(ex, source, refused)
        return mod.get_function(name)

    kernel = capture.build("kernel", compile_, ex)
    code = strip_comments(source)
    for needle, hint in must_have.items():
        if needle not in code:
            if needle == "__syncthreads" and probe is not None:
                try:
                    probe(kernel)
                except kernels.KernelError as e:
                    if "race on `" in str(e):
                        fail(ex, f"your kernel does not use __syncthreads: a race between the threads of a block ({e})",
                             hint)
            fail(ex, f"your kernel does not use {needle}", hint)
    return kernel


GPU_HINT = ("the emulator compiles your kernel with this computer's C++ compiler, which also knows the C and C++ "
            "standard libraries; a GPU knows neither. Use CUDA's own device functions (fmaxf, fminf, sqrtf, expf, ...) "
            "instead of std::max, std::sqrt, rand() or strlen, and keep the kernel free of #include")


def compiles_for_gpus(ex: str, source: str, refused=None) -> None:
    """Fail a kernel that the emulator runs but a GPU's compiler refuses (NVRTC or nvcc, for every modelled GPU's
    architecture), naming why where ``refused(source, error)`` does. Without a CUDA compiler here, say so and go on:
    the emulator alone cannot tell."""
    try:
        tools.compile_for_gpus(source)
    except tools.KernelCompileError as e:
        said = refused(source, str(e)) if refused else None
        if said:
            fail(ex, f"your kernel runs on the emulator but does not compile for a GPU: {said[0]}:\n{e}", said[1])
        headers = [w for w in ("INFINITY", "FLT_MAX", "HUGE_VAL") if f'"{w}" is undefined' in str(e)]
        fail(ex, f"your kernel runs on the emulator but does not compile for a GPU:\n{e}", GPU_HINT + (
            f". {headers[0]} comes from a C header: write the number itself (-3.4e38f for -FLT_MAX) or start from a "
            "value of the data" if headers else ""))
    except RuntimeError as e:
        print(f"note ({ex}): {e}; the checks below run on the emulator alone")


HEADER_VALUES = ("INFINITY", "FLT_MAX", "HUGE_VALF", "HUGE_VAL", "CUDART_INF_F", "FLT_MIN")


def _start_refused(source: str, error: str) -> tuple[str, str] | None:
    """(what, hint) where a compiler refused a value from a C header as the start of a max: NVRTC always, the
    emulator's host compiler where the header is not included."""
    word = next((w for w in HEADER_VALUES if f'"{w}" is undefined' in error or f"‘{w}’ was not declared" in error
                 or f"'{w}' was not declared" in error), None)
    if word is None:
        return None
    line = next((" ".join(ln.split()) for ln in strip_comments(source).splitlines() if re.search(rf"\b{word}\b", ln)),
                word)
    return (f"`{line}` starts from {word}: {word} comes from a C header (math.h, float.h) that a GPU's compiler lacks"
            + ("" if '" is undefined' in error else ", and that the emulator was not given either"),
            "a max needs a start value that cannot win, one that every score is at least, and that a GPU compiles: a "
            "number written out in full (float32's lowest is about -3.4e38), or a value the row itself holds, since "
            "none of a row's values is above its max")


def _tiles_staged(ex: str, source: str, name: str) -> None:
    """Fail a kernel that declares ``__shared__`` tiles but does not work from them: a tile never stored or never
    read, or the global inputs read anywhere but in a store to a tile (the naive kernel with a shared array beside
    it). Read from the source: the emulator's counts of memory traffic will judge it by what it does."""
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
                         "its own copy, so no thread sees what the others loaded", f"declare "
                         f"{private.group(1)} __shared__, TILE by TILE: one copy per block")
                fail(ex, f"your kernel reads {g} from global memory outside storing a tile: `{' '.join(line.split())}`",
                     f"each element of {g} should come from global memory once per tile, into a __shared__ array, and "
                     "be used TILE times from there; the inner product reads only the shared tiles")


RACE_HINT = ("between one thread's store and another thread's load or store of the same element, every thread of the "
             "block must pass a __syncthreads(): after the stores that the next step reads, and before a store "
             "overwrites what other threads still read. Put it where every thread reaches it, outside any if")
REVERSED = "once more with each block's threads in the opposite order"
RACES = f". Every launch names a race between the threads of a block, and one size runs {REVERSED}"


def named_race(ex: str, what: str, error: Exception) -> None:
    """Fail naming the race that checked mode found, where the emulator's error is one."""
    if "race on `" in str(error):
        fail(ex, f"{what + ': ' if what else ''}a race between the threads of a block ({error})", RACE_HINT)


def run_student_kernel(ex: str, kernel, grid, block, args, hint: str, reverse: bool = False, what: str = "") -> None:
    """Launch, failing with what the emulator reports; with ``reverse``, then again with each block's threads in the
    opposite order, failing where the results differ."""
    before = _copies(args) if reverse else None
    try:
        kernel(grid, block, args)
        if reverse:
            in_reverse_order(ex, kernel, grid, block, before, args, what)
    except kernels.KernelError as e:
        named_race(ex, what, e)
        fail(ex, f"{what + ': ' if what else ''}the emulator stopped your kernel: {e}", hint)
    except (TypeError, ValueError) as e:
        fail(ex, f"your kernel's parameters do not fit the launch: {e}",
              "keep the signature given in the exercise: the check launches it with exactly those arguments")


def _copies(args) -> tuple:
    return tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)


def in_reverse_order(ex: str, kernel, grid, block, before, after, what: str) -> None:
    """Launch on ``before`` (copies of the arguments as they were before a launch that left ``after``) with each
    block's threads last to first, and fail where an array ends differently: a race the emulator's usual order hid."""
    kernel(grid, block, before, reversed_order=True)
    for i, (a, b) in enumerate(zip(before, after)):
        if not isinstance(a, np.ndarray):
            continue
        differ = ~np.isclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)
        if differ.any():
            at = tuple(int(v) for v in np.argwhere(differ)[0])
            name = kernel.params[i].name if i < len(kernel.params) else f"argument {i}"
            fail(ex, f"{what + ': ' if what else ''}{name}{list(at)} is {float(a[at]):.6g} with each block's threads in "
                 f"the opposite order, {float(b[at]):.6g} in the emulator's usual order ({int(differ.sum())} entries "
                 "differ): a race between the threads of a block. On a GPU they run in any order", RACE_HINT)


def _loop_past_k(source: str) -> str | None:
    """The head of a for loop in ``source`` that runs while its variable is at most K (one step past the last k)."""
    m = re.search(r"for\s*\([^;]*;\s*\w+\s*<=\s*K\s*;[^)]*\)", strip_comments(source))
    return " ".join(m.group(0).split()) if m else None


def _edge(ex: str, kernel, grid, block, args, awkward: bool, what: str, reverse: bool = False,
          source: str = "") -> None:
    """Launch, naming an access out of bounds: past the edge of C (a missing guard) where the size is awkward, a wrong
    index formula where it is a multiple of the block; with ``reverse``, again with the threads in the opposite order."""
    before = _copies(args) if reverse else None
    try:
        kernel(grid, block, args)
        if reverse:
            in_reverse_order(ex, kernel, grid, block, before, args, what)
    except kernels.KernelError as e:
        named_race(ex, what, e)
        m = re.search(r"out-of-bounds access (\w+)\[", str(e))
        bound = _loop_past_k(source) if m and m.group(1) in ("A", "B") else None
        if bound:
            fail(ex, f"{what}: a read past the end of {m.group(1)}: your k loop, `{bound}`, runs K + 1 times, "
                 f"k = 0 .. K (the emulator stopped your kernel: {e})", "the sum over k has K terms: with K = 3 they "
                 "are k = 0, 1 and 2. Which comparison stops the loop after its K-th term?")
        if m and awkward:
            verb = "write outside C" if m.group(1) == "C" else f"read outside {m.group(1)}"
            fail(ex, f"{what}: threads past the edge {verb} (the emulator stopped your kernel: {e})",
                 "the grid is rounded up to whole blocks, so some threads have row >= M or col >= N: they must not "
                 "touch A, B or C")
        if m:
            fail(ex, f"{what}: an index runs outside {m.group(1)}, although the size is a multiple of the block (the "
                 f"emulator stopped your kernel: {e})", f"{m.group(1)} is row-major: element [r][c] of a matrix with "
                 "n_cols columns is at r * n_cols + c")
        fail(ex, f"{what}: the emulator stopped your kernel: {e}")
    except (TypeError, ValueError) as e:
        fail(ex, f"your kernel's parameters do not fit the launch: {e}",
             "keep the signature given in the exercise: the check launches it with exactly those arguments")


@recorded
def naive_matmul(source: str, name: str = "matmul_naive", block: int = 16) -> None:
    """Lab 05: C = A B with one thread per entry of C, every operand read from global memory.

    Signature (const float* A, const float* B, float* C, int M, int N, int K); launched with block (16, 16) and grid
    (ceil(N/16), ceil(M/16)): x along the columns of C, y along its rows. Checked on the emulator in checked mode.
    """
    ex = "naive matmul"
    source = capture.source(source)
    k = load_student_kernel(ex, source, name, {})
    rng = np.random.default_rng(capture.seed(2))
    checks = 0
    for M, N, K in each_case([(block, block, block), (2 * block, 3 * block, block), (1, 1, 1), (block + 1, 2 * block + 1, 19),
                    (37, 5, 70), (5, 37, 3)]):
        a = rng.standard_normal((M, K)).astype(np.float32)
        b = rng.standard_normal((K, N)).astype(np.float32)
        c = np.full((M, N), np.nan, np.float32)
        gx, gy = -(-N // block), -(-M // block)
        awkward = M % block != 0 or N % block != 0
        what = f"M={M}, N={N}, K={K}"
        _edge(ex, k, (gx, gy), (block, block), (a, b, c, np.int32(M), np.int32(N), np.int32(K)), awkward, what,
              reverse=M == 2 * block, source=source if isinstance(source, str) else "")
        want = a.astype(np.float64) @ b
        close = np.isclose(c, want, rtol=1e-4, atol=1e-4)
        if close.all():
            checks += 1
            continue
        written = ~np.isnan(c)
        if np.allclose(c.reshape(N, M), want.T, rtol=1e-4, atol=1e-4) and M * N > 1:
            fail(ex, f"{what}: row and col swapped: C is transposed (your C[i, j] holds entry (j, i) of A B)",
                 "the thread of C[row][col] multiplies row `row` of A by column `col` of B and writes row `row` of C. "
                 "In a row-major matrix of 3 columns, row 2 starts at offset 6: where does row `row` of C start, "
                 "and of A?")
        rows, cols = np.arange(M)[:, None], np.arange(N)[None, :]
        if not written.all() and (written == ((rows < min(M, gx * block)) & (cols < min(N, gy * block)))).all():
            fail(ex, f"{what}: {int((~written).sum())} entries of C were never written: row and col come from the wrong "
                 "dimensions (row from x, col from y)", "the grid's x runs along the columns of C (N of them) and its y "
                 "along the rows (M): col comes from the x indices, row from the y ones")
        first_rows = M > block and written[:block].all() and not written[block:].any()
        first_cols = N > block and written[:, :block].all() and not written[:, block:].any()
        whole_grid = (f"a thread's row and col count over the whole grid, not only its block: with blocks {block} wide, "
                      f"thread x = 3 of block x = 2 has {2 * block} columns of threads to its left in the blocks before "
                      "it, and 3 in its own")
        if not written.all() and written[:block, :block].all() and not written[block:, :].any() \
                and not written[:, block:].any():
            fail(ex, f"{what}: only the first {block} x {block} entries of C were written: every block computes the same "
                 "entries", whole_grid)
        if first_rows or first_cols:
            side, index = ("rows", "y") if first_rows else ("columns", "x")
            fail(ex, f"{what}: only the first {block} {side} of C were written: the blocks along {index} all compute "
                 f"the same {side}", whole_grid)
        i, j = map(int, np.argwhere(~close)[0])
        unwritten = int((~written).sum())
        fail(ex, f"{what}: C[{i}, {j}] is {float(c[i, j]):.6g} (yours) but should be {want[i, j]:.6g} (spec); "
             f"{int((~close).sum())} of {c.size} entries wrong" + (f", {unwritten} never written" if unwritten else ""))
    passed(ex, checks)


@recorded
def tiled_matmul(source: str, name: str = "matmul_tiled", tile: int | None = None) -> None:
    """Lab 05: C = A B with tile x tile blocks staged in shared memory.

    Signature (const float* A, const float* B, float* C, int M, int N, int K); launched with block
    (tile, tile) and grid (ceil(N/tile), ceil(M/tile)); ``tile`` is the source's ``#define TILE`` (else 16).
    """
    ex = "tiled matmul"
    source = capture.source(source)
    tile = tile or (define(source, "TILE", 16) if isinstance(source, str) else 16)
    if not 1 <= tile <= 32:
        fail(ex, f"#define TILE {tile}: a block of TILE x TILE threads needs 1 <= TILE <= 32 (at most 1,024 threads)")
    print(f"{ex}: C on 5 sizes, then how often each element of A and each of B is loaded from global memory in one "
          f"product of {4 * tile} x {4 * tile} matrices (a tiled kernel: {4 * tile} / TILE = 4 times){RACES}")
    k = load_student_kernel(ex, source, name, {
        "__shared__": "stage a tile of A and a tile of B in __shared__ arrays; without them this is the naive kernel",
        "__syncthreads": "wait with __syncthreads() after loading a tile (before using it) and after using it (before the "
                         "next load overwrites it)"}, probe=lambda k: k((2, 2), (tile, tile), _matmul_args(2 * tile)))
    if isinstance(source, str):
        _tiles_staged(ex, source, name)
    rng = np.random.default_rng(capture.seed(0))
    checks = 0
    for M, N, K in each_case([(tile, tile, tile), (2 * tile, 3 * tile, 4 * tile), (1, 1, 1), (tile + 1, 2 * tile + 1, tile + 3),
                    (37, 5, 70)], more=int(isinstance(source, str))):
        a = rng.standard_normal((M, K)).astype(np.float32)
        b = rng.standard_normal((K, N)).astype(np.float32)
        c = np.full((M, N), np.nan, np.float32)
        multiple = M % tile == 0 and N % tile == 0 and K % tile == 0
        hint = ("" if multiple else "this size is not a multiple of the tile: load 0.0 for elements outside A or B, keep every "
                "thread going through every __syncthreads(), and let only the threads inside C write it")
        run_student_kernel(ex, k, (-(-N // tile), -(-M // tile)), (tile, tile),
                           (a, b, c, np.int32(M), np.int32(N), np.int32(K)), hint, reverse=M == tile + 1,
                           what=f"M={M}, N={N}, K={K}")
        want = a @ b
        bad = ~np.isclose(c, want, rtol=1e-4, atol=1e-4)
        if bad.any():
            i, j = map(int, np.argwhere(bad)[0])
            unwritten = np.isnan(c).sum()
            fail(ex, f"M={M}, N={N}, K={K}: C[{i}, {j}] is {float(c[i, j]):.6g} (yours) but should be {want[i, j]:.6g} (spec); "
                  f"{int(bad.sum())} of {c.size} entries wrong" + (f", {unwritten} never written" if unwritten else ""),
                  hint)
        checks += 1
    if isinstance(source, str):
        _loads_per_element(ex, source, tile)
        checks += 2
    passed(ex, checks)


FAST_N = 1024  # the size the fast matmul is scored at: a GPU's, from counts carried from two small launches
FAST_GPU = speed_of_light.DEFAULT  # the GPU it is scored on, the same on every machine: the class's scores compare
FAST_BOUNDS = {  # the unit that bounds a matmul: what the kernel does that it waits on, and what would change that
    "L2": ("every multiply-add loads its operands from global memory",
           "stage tiles of A and B in shared memory, as in exercise 2: each value loaded then feeds a tile's products"),
    "shared memory": ("every multiply-add reads its operands from shared memory, or the reads collide in the banks",
                      "let each thread keep several entries of C in registers (section 4): each value it reads from "
                      "a shared tile then feeds several multiply-adds; and read the tiles without bank conflicts"),
    "FP32": ("the arithmetic itself, at the rate of the SMs your grid keeps busy",
             "a grid of fewer blocks than SMs leaves SMs idle: smaller tiles give more blocks"),
    "DRAM": ("the matrices' own bytes, moved once", "nothing: that is the least any kernel moves"),
    "atomics (one address)": ("atomics that all land on one address", "write each entry of C once, with a store"),
}


def _fast_launch(ex: str, source: str) -> tuple[int, int, int]:
    """(THREADS, BM, BN) from the source's #defines: a 1-D block of THREADS threads computes a BM x BN tile of C."""
    threads, bm, bn = (define(source, k, d) if isinstance(source, str) else d
                       for k, d in (("THREADS", 256), ("BM", 64), ("BN", 64)))
    if not (32 <= threads <= 1024 and threads % 32 == 0):
        fail(ex, f"#define THREADS {threads}: a block holds whole warps, 32 to 1,024 threads",
             "a warp is 32 threads: THREADS is 32 times the number of warps in a block, at most 32 of them")
    for name, side in (("BM", bm), ("BN", bn)):
        if side not in (8, 16, 32, 64, 128, 256):
            fail(ex, f"#define {name} {side}: the tile's sides are powers of two from 8 to 256, so that the sizes the "
                 "check runs are multiples of them", f"set {name} to 8, 16, 32, 64, 128 or 256 rows or columns of C, "
                 "and let each thread own BM x BN / THREADS of them")
    return threads, bm, bn


def _fast_counts(source: str, name: str, threads: int, bm: int, bn: int) -> tuple[list[dict], list[bool], dict]:
    """The counts of two n x n x n products by the kernel (n a multiple of the tile, at least 64, then twice that),
    as plain numbers, whether each product was right, and the counts of labkit's tiled kernel at FAST_N."""
    n1 = max(bm, bn, 64)
    out, right = [], []
    for n in (n1, 2 * n1):
        rng = np.random.default_rng(n)
        a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
        c = np.full((n, n), np.nan, np.float32)
        t = counts.traffic(source, name, (n // bn, n // bm), (threads,), (a, b, c, *(np.int32(n),) * 3))
        got = speed_of_light.counted(t, flops=2 * n**3, footprint=3 * 4 * n * n)
        out.append({f: getattr(got, f) for f in speed_of_light.CARRIED})
        right.append(bool(np.allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)))
    tiled = speed_of_light.matmul_counts("tiled", FAST_N)[0]  # labkit's, the bar to pass: counted here, not replayed
    return out, right, {f: getattr(tiled, f) for f in speed_of_light.CARRIED}


@recorded
def fast_matmul(source: str, name: str = "matmul_fast") -> None:
    """Lab 05, the open exercise: the fastest C = A B you can write, scored by its modelled time on an H100.

    Signature (const float* A, const float* B, float* C, int M, int N, int K); launched with block (THREADS) and grid
    (N / BN, M / BM), from the source's ``#define THREADS``, ``BM`` and ``BN``, on sizes whose M is a multiple of BM,
    N of BN and K of the larger of the two. Checked mode on three sizes, then the emulator's counts of two products,
    carried to 1024^3 and modelled on the H100: passed at or below labkit's tiled kernel's time, the score is that
    time."""
    ex = "fast matmul"
    source = capture.source(source)
    threads, bm, bn = _fast_launch(ex, source)
    side = max(bm, bn)
    print(f"{ex}: C on 3 sizes in checked mode, blocks of {threads} threads each computing {bm} x {bn} of C; then "
          f"its counts, carried to {FAST_N}^3 and modelled on the {FAST_GPU}{RACES}")
    k = load_student_kernel(ex, source, name, {})
    rng = np.random.default_rng(capture.seed(6))
    checks = 0
    for M, N, K in each_case([(bm, bn, side), (2 * bm, 3 * bn, 2 * side), (3 * bm, bn, side)], more=2):
        a, b = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
        c = np.full((M, N), np.nan, np.float32)
        what = f"M={M}, N={N}, K={K}"
        run_student_kernel(ex, k, (N // bn, M // bm), (threads,), (a, b, c, np.int32(M), np.int32(N), np.int32(K)),
                           "", reverse=M == 2 * bm, what=what)
        bad = ~np.isclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)
        if bad.any():
            i, j = map(int, np.argwhere(bad)[0])
            fail(ex, f"{what}: C[{i}, {j}] is {float(c[i, j]):.6g} (yours) but should be {float(a[i] @ b[:, j]):.6g}; "
                 f"{int(bad.sum())} of {c.size} entries wrong, {int(np.isnan(c).sum())} never written",
                 f"with blocks of {threads} threads for a {bm} x {bn} tile, each thread owns {bm * bn / threads:g} "
                 "entries of C: are they all written, each once, and does every k of each tile step reach them?")
        checks += 1
    _fast_score(ex, source, name, threads, bm, bn)
    passed(ex, checks + 2)


def _fast_score(ex: str, source: str, name: str, threads: int, bm: int, bn: int) -> None:
    """Model the kernel at FAST_N from its counts, fail it above labkit's tiled kernel, and score it."""
    small, right, bar = capture.step("counts", lambda: _fast_counts(source, name, threads, bm, bn))
    n1 = max(bm, bn, 64)
    if not all(right):
        fail(ex, f"the {n1}^3 and {2 * n1}^3 products the counts are taken from came out wrong: the kernel must be "
             "right on every size whose sides are multiples of its tile")
    a, b = (speed_of_light.Counts(name, **d) for d in small)
    carried = speed_of_light.extrapolate(a, b, n1, 2 * n1, FAST_N, flops=2 * FAST_N**3, footprint=12 * FAST_N**2,
                                         blocks=(FAST_N // bm) * (FAST_N // bn))
    yours = speed_of_light.model(carried, FAST_GPU)
    tiled = speed_of_light.model(speed_of_light.Counts("matmul_tiled", **bar), FAST_GPU)
    why, change = FAST_BOUNDS[yours.unit]
    if carried.blocks < yours.gpu.sms:
        why += f" ({carried.blocks} blocks for {yours.gpu.sms} SMs: some SMs have none)"
    if yours.unit == "shared memory" and carried.shared_requests:  # the two causes, counted
        per_read = carried.flops / 2 / (32 * carried.shared_requests)
        why += (f" (counted: {per_read:.2g} multiply-adds per float a thread moves through shared memory, and "
                f"{carried.shared_wavefronts / carried.shared_requests:.2f} wavefronts per warp request, 1 without "
                "bank conflicts)")
    print(f"{ex}: {yours.describe()}. Bound by {yours.unit}: {why}. What would change it: {change}.")
    if yours.bound > tiled.bound * (1 + 1e-9):
        fail(ex, f"modelled at {yours.bound * 1e6:.3g} µs, slower than labkit's tiled kernel ({tiled.bound * 1e6:.3g} "
             f"µs, exercise 2's): the unit that bounds yours is {yours.unit}: {why}", change)
    scored(f"modelled {FAST_N}^3 on the {FAST_GPU}", yours.bound * 1e6, "µs")
    print(f"{ex}: your score, {yours.bound * 1e6:.4g} µs ({yours.gflops:,.0f} GFLOP/s modelled); labkit's tiled kernel "
          f"{tiled.bound * 1e6:.3g} µs")


def _matmul_args(n: int) -> tuple:
    """(A, B, C, M, N, K) of an n x n x n product of ones."""
    return (np.ones((n, n), np.float32), np.ones((n, n), np.float32), np.zeros((n, n), np.float32), *(np.int32(n),) * 3)


def _loads_per_element(ex: str, source: str, tile: int) -> None:
    """Fail a "tiled" kernel whose inner product still reads A or B from global memory: counted on the emulator, each
    element of A and of B must be loaded n / TILE times in an n x n x n product, not n times as the naive kernel does."""
    n = 4 * tile

    def count():
        try:
            return counts.matmul_loads(source, "tiled", n)[0]
        except KernelCompileError:
            fail(ex, "the check counts the loads of A where your kernel reads A[...], and your kernel hands A to a "
                 "function or a pointer of its own, where they cannot be counted", "read A as A[index] in the kernel "
                 "itself (a __device__ helper may take the loaded value instead of the pointer)")

    reads = capture.step("loads of A", count)
    if reads > n / tile + 1e-9:
        fail(ex, f"in a {n} x {n} product your kernel loads each element of A {reads:g} times on average from global "
             f"memory; a tiled kernel loads it {n} / TILE = {n // tile} times", "the inner product must read only the "
             "__shared__ tiles: each thread loads one element of A's tile and one of B's per step, and every other use "
             "of them comes from shared memory")
    _loads_of_b(ex, source, tile, reads)


def _handed_to_helper(source: str, array: str) -> str | None:
    """The call in ``source`` that hands ``array`` (or a pointer made from it) to a ``__device__`` function of the
    source, where the emulator's counts cannot follow its loads; None if there is none."""
    code = strip_comments(source)
    helpers = set(re.findall(r"__device__\s+[\w\s\*&<>:]*?\b(\w+)\s*\(", code))
    names = {array} | set(re.findall(rf"\*\s*(?:const\s+|__restrict__\s+)*(\w+)\s*=[^;=]*\b{array}\b", code))
    for m in re.finditer(r"\b(\w+)\s*\(", code):
        args = code[m.end():matching_bracket(code, m.end() - 1)] if m.group(1) in helpers else ""
        if any(re.search(rf"\b{re.escape(p)}\b", args) for p in names):
            return " ".join(f"{m.group(1)}({args})".split())
    return None


def _loads_of_b(ex: str, source: str, tile: int, reads_a: float) -> None:
    """Fail a "tiled" kernel that loads B (or C) from global memory more often than a tiled kernel does: every global
    load of one n x n x n product is counted on the emulator, through any pointer made from B, and A's are taken
    off."""
    n = 4 * tile
    helper = _handed_to_helper(source, "B")
    if helper:
        fail(ex, f"the check counts the loads of B where your kernel reads them, and your kernel hands B to a function "
             f"of its own, where they cannot be counted: `{helper}`", "read B as B[index] in the kernel itself (a "
             "__device__ helper may take the loaded value instead of the pointer)")

    def count() -> tuple:
        total = float(counts.matmul_reads_per_thread(source, "tiled", n)[0].sum())
        rest = (total - reads_a * n * n) / (n * n)  # loads beyond A's, per element of B
        if rest <= n / tile + 1e-9:
            return rest, None
        try:  # whose loads they are: B's alone, where B is read as B[...]
            src, name, grid, block, args, _, _ = counts.matmul_launch(source, "tiled", n)
            return rest, float(counts.loads(src, name, "B", grid, block, args).mean())
        except (KernelCompileError, ValueError):
            return rest, None

    rest, reads_b = capture.step("loads of B", count)
    if rest <= n / tile + 1e-9:
        return
    if reads_b is not None and reads_b <= n / tile + 1e-9:
        fail(ex, f"in a {n} x {n} product your kernel makes {(rest - reads_b) * n * n:,.0f} loads from global memory "
             f"beyond those of A and B ({rest - reads_b:g} per entry of C): C is read inside the k loop", "a thread "
             "adds its products in a register of its own and writes its entry of C once, after the last tile")
    times = reads_b if reads_b is not None else rest
    inside = times >= n - 1e-9
    fail(ex, f"in a {n} x {n} product your kernel loads each element of B {times:g} times on average from global memory; "
         f"a tiled kernel loads it {n} / TILE = {n // tile} times" + (
             f": B is read from global memory inside the k loop, each element n = {n} times, not n / TILE"
             if inside else ": B is loaded more than once per tile"),
         "the inner product must read only the __shared__ tiles, B's as well as A's, and not B itself (nor a pointer "
         "into B): each thread loads one element of B's tile per step, and every other use of it comes from shared "
         "memory")


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
    print(f"{ex}: the sum on 5 sizes from n=1 to n=100,003 against NumPy to a relative 1e-4; then, counted in one launch "
          "of 8 blocks with the warps of each block in the opposite order: the sum again, the atomicAdds of each block "
          f"(one) and the shared-memory requests of each warp (a tree's steps){RACES}")
    rng = np.random.default_rng(capture.seed(1))
    checks = 0
    for n, blocks in each_case([(1, 1), (threads, 1), (threads + 1, 2), (10_000, 8), (100_003, 16)],
            more=int(isinstance(source, str))):
        x = rng.random(n).astype(np.float32)
        out = np.zeros(1, np.float32)
        run_student_kernel(ex, k, (blocks,), (threads,), (x, out, np.int32(n)),
                           "every thread must reach each __syncthreads() of the tree; guard the additions, not the barrier",
                           reverse=blocks == 2, what=f"n={n} over {blocks} blocks of {threads}")
        want = float(x.sum(dtype=np.float64))
        if not np.isclose(out[0], want, rtol=1e-4):
            what, hint = next(((w, h) for value, w, h in _block_mistakes(x, blocks, threads)
                               if np.isclose(out[0], value, rtol=1e-4)), ("", ""))
            fail(ex, f"n={n} over {blocks} blocks of {threads}: the sum is {float(out[0]):.6g} (yours) "
                  f"but should be {want:.6g} (spec){': ' + what if what else ''}", hint)
        checks += 1
    if isinstance(source, str):
        _reduction_counted(ex, source, name, "block", threads)
        checks += 3
    passed(ex, checks)


def _thread_sums(x: np.ndarray, blocks: int, threads: int) -> np.ndarray:
    """(blocks, threads): what each thread's grid-stride loop adds up, in float64."""
    total = blocks * threads
    return np.pad(x.astype(np.float64), (0, -len(x) % total)).reshape(-1, total).sum(0).reshape(blocks, threads)


def _block_mistakes(x: np.ndarray, blocks: int, threads: int) -> list[tuple[float, str, str]]:
    """(the sum it gives, what it is, its hint) for the usual mistakes of a block sum, worked out in NumPy from the
    same grid-stride partial sums: a tree one or two levels short at either end, a grid that misses or repeats
    values, atomics from every thread or from none."""
    part = _thread_sums(x, blocks, threads)
    x64 = x.astype(np.float64)
    found = []
    levels = int(math.log2(threads))
    for k, said in ((1, "one level"), (2, "two levels")):
        found.append((part[:, ::2 ** k].sum(), f"each block's total holds only the threads whose index is a multiple "
                      f"of {2 ** k}: the tree stopped {said} early", f"a tree over {threads} values takes log2("
                      f"{threads}) = {levels} levels; over 8 values it takes 3: 4 threads add, then 2, then 1 (s[1] "
                      "into s[0]). Count the levels your loop runs: does it reach the last one, where a single thread "
                      "adds?"))
        found.append((part[:, :threads // 2 ** k].sum(), f"each block's total holds only its first {threads // 2 ** k} "
                      f"threads' values: the tree started {said} late", f"the first level must bring the upper half of "
                      f"the {threads} entries into the lower half; over 8 values, 4 threads each add the entry 4 above "
                      "them. How far up does your first level reach, and which entries does it never add?"))
    if len(x) > blocks * threads:
        found.append((x64[:blocks * threads].sum(), f"only the first {blocks * threads:,} values were added, one per "
                      "thread: the threads do not loop over the rest", "there are more values than threads: each thread "
                      "loops, stepping by the number of threads in the whole grid, until it passes n (a grid-stride "
                      "loop)"))
    if blocks > 1:
        covered = np.minimum(np.arange(len(x)) // threads + 1, blocks)  # the blocks whose block-sized steps reach i
        found.append(((x64 * covered).sum(), "values were added more than once: each thread steps by one block's "
                      "threads, so the blocks' loops overlap", "step by the number of threads in the whole grid, not "
                      "in one block: then each value is taken by exactly one thread of one block"))
    found.append((x64.sum() * threads, "every thread added the block's total", "only thread 0 should call "
                  "atomicAdd, once per block"))
    found.append((0.0, "nothing reached *out", "one thread of each block must atomicAdd the block's total"))
    return found


@recorded
def warp_reduction(source: str, name: str = "warp_sum", threads: int = 256) -> None:
    """Lab 05: *out += sum(x) with a warp-shuffle tree in each warp (no shared memory) and one atomicAdd per warp;
    signature (const float* x, float* out, int n), launched with ``threads`` per block over a grid-stride loop."""
    ex = "warp reduction"
    source = capture.source(source)
    k = load_student_kernel(ex, source, name, {
        "_sync(": "each warp sums its 32 values with __shfl_down_sync: one lane reads another's register, no shared "
                  "memory needed",
        "atomicAdd": "finish with one atomicAdd of the warp's total to *out, from lane 0 of each warp: warps cannot "
                     "see each other's registers"})
    if isinstance(source, str) and "__shared__" in strip_comments(source):
        fail(ex, "your kernel declares __shared__ memory; this one sums within each warp through shuffles alone",
             "the lanes of a warp exchange registers with __shfl_down_sync, the mask naming all 32 lanes: no "
             "__shared__ array and no __syncthreads() are needed")
    print(f"{ex}: the sum on 6 sizes from n=1 to n=100,003 against NumPy to a relative 1e-4; then, counted in one launch "
          "of 8 blocks with the warps of each block in the opposite order: the sum again, the atomicAdds of each block "
          f"(one per warp) and the shuffles of each lane (a tree's 5 steps){RACES}")
    rng = np.random.default_rng(capture.seed(2))
    checks = 0
    for n, blocks in each_case([(1, 1), (32, 1), (33, 1), (threads, 1), (10_000, 8), (100_003, 16)],
            more=int(isinstance(source, str))):
        x = rng.random(n).astype(np.float32)
        out = np.zeros(1, np.float32)
        run_student_kernel(ex, k, (blocks,), (threads,), (x, out, np.int32(n)),
                           "every lane of a warp must reach each shuffle whose mask names it: keep the shuffles outside "
                           "any if that some lanes of the warp skip, and let the lanes without a value bring 0.0f",
                           reverse=n == threads, what=f"n={n} over {blocks} blocks of {threads}")
        want = float(x.sum(dtype=np.float64))
        if not np.isclose(out[0], want, rtol=1e-4):
            what, hint = next(((w, h) for value, w, h in _warp_mistakes(x, blocks, threads)
                               if np.isclose(out[0], value, rtol=1e-4)), ("", ""))
            fail(ex, f"n={n} over {blocks} blocks of {threads}: the sum is {float(out[0]):.6g} (yours) but should be "
                 f"{want:.6g} (spec){': ' + what if what else ''}", hint)
        checks += 1
    if isinstance(source, str):
        _reduction_counted(ex, source, name, "warp", threads)
        checks += 3
    passed(ex, checks)


def _warp_mistakes(x: np.ndarray, blocks: int, threads: int) -> list[tuple[float, str, str]]:
    """(the sum it gives, what it is, its hint) for the usual mistakes of a warp-shuffle sum, worked out on the NumPy
    warp (labkit.kernels.warp) from the same grid-stride partial sums."""
    part = _thread_sums(x, blocks, threads).reshape(-1, warp.WARP)
    x64 = x.astype(np.float64)

    def lane0(**how) -> float:
        return float(sum(warp.tree_sum(w, **how)[0] for w in part))

    found = [(lane0(offsets=(32, 16, 8, 4, 2, 1)), "every warp's total came out twice: the first shuffle's offset is "
              "32, a whole warp", "no lane has a partner 32 lanes above it, so each got its own value back and added "
              "it to itself. What is the farthest a value must travel to reach lane 0, in a warp of lanes 0 to 31?"),
             (lane0(offsets=(8, 4, 2, 1)), "lane 0 collected 16 lanes, not 32, the sum of lanes 0 to 15 only: the "
              "tree is one level short at its start", "the values of lanes 16 to 31 never came down. With 4 lanes, "
              "offsets 2 then 1 bring all 4 to lane 0: for 32 lanes, which offset must come first?"),
             (lane0(offsets=(16, 8, 4, 2)), "lane 0 ended with the sum of the even lanes only: the tree stopped one "
              "level early", "count the steps: a tree over 32 lanes takes log2(32) = 5, the last one bringing lane 1 "
              "down to lane 0. Does your loop run that step?"),
             (float(sum(warp.tree_sum(w).sum() for w in part)), "every lane added what it holds", "only lane 0 of each "
              "warp holds the warp's total: how does a thread tell, from threadIdx.x, that it is lane 0 of its warp?"),
             (lane0(kind="up"), "lane 0 ended with 32 times its own value", "__shfl_up_sync moves values to higher "
              "lanes, so lane 0 never receives another lane's value: use __shfl_down_sync, which brings them down to "
              "lane 0"),
             (0.0, "nothing reached *out", "lane 0 of each warp must atomicAdd the warp's total")]
    if len(x) > blocks * threads:
        found.append((x64[:blocks * threads].sum(), f"only the first {blocks * threads:,} values were added, one per "
                      "thread: the threads do not loop over the rest", "there are more values than threads: each thread "
                      "loops, stepping by the number of threads in the whole grid, until it passes n: the grid-stride "
                      "loop of exercise 3"))
    return found


@recorded
def shared_transpose(source: str, name: str = "transpose_tiled") -> None:
    """Lab 05: out = in^T through a 32 x 32 __shared__ tile, coalesced both ways and without bank conflicts.

    Signature (const float* in, float* out, int rows, int cols): in is (rows, cols), out (cols, rows), both
    row-major; launched with block (32, 32) and grid (ceil(cols/32), ceil(rows/32)). Judged by the values and, counted
    on the emulator in a 64 x 64 transpose, by 4 sectors per warp load and store and no bank conflicts.
    """
    ex = "shared transpose"
    source = capture.source(source)
    print(f"{ex}: out on 5 sizes, then, counted in a 64 x 64 transpose: the 32-byte sectors of each warp's loads and "
          f"stores (coalesced: 4) and the shared-memory bank conflicts (none){RACES}")
    k = load_student_kernel(ex, source, name, {
        "__shared__": "stage each 32 x 32 tile in a __shared__ array: read it along rows of in, write it along rows of out",
        "__syncthreads": "wait with __syncthreads() between filling the tile and reading it back"},
        probe=lambda k: k((2, 2), (32, 32), (np.ones((64, 64), np.float32), np.zeros((64, 64), np.float32),
                                             np.int32(64), np.int32(64))))
    rng = np.random.default_rng(capture.seed(3))
    checks = 0
    for rows, cols in each_case([(32, 32), (64, 96), (1, 1), (33, 70), (100, 37)], more=int(isinstance(source, str))):
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        y = np.full((cols, rows), np.nan, np.float32)
        awkward = rows % 32 or cols % 32
        run_student_kernel(ex, k, (-(-cols // 32), -(-rows // 32)), (32, 32), (x, y, np.int32(rows), np.int32(cols)),
                           "guard the read (row < rows, col < cols) and the write (inside out's cols x rows) separately, "
                           "and keep every thread going through __syncthreads()" if awkward else
                           "in is (rows, cols) and out (cols, rows), both row-major", reverse=rows == 64,
                           what=f"rows={rows}, cols={cols}")
        bad = ~(y == x.T)
        if bad.any():
            i, j = map(int, np.argwhere(bad)[0])
            fail(ex, f"rows={rows}, cols={cols}: out[{i}, {j}] is {float(y[i, j]):.6g} (yours) but should be in[{j}, {i}] = "
                 f"{float(x[j, i]):.6g}; {int(bad.sum())} of {y.size} entries wrong",
                 "" if not awkward else "on sizes that are not multiples of 32, write only inside out, and read only "
                 "inside in")
        checks += 1
    if isinstance(source, str):
        x = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
        y = np.zeros((64, 64), np.float32)
        def count() -> tuple:
            t = counts.traffic(source, name, (2, 2), (32, 32), (x, y, np.int32(64), np.int32(64)))
            return t.sectors_per_load, t.sectors_per_store, t.bank_conflicts, t.total("shared_requests")

        per_load, per_store, conflicts, requests = capture.step("traffic", count)  # plain numbers: a record keeps them
        for what, sectors in (("loads from in", per_load), ("stores to out", per_store)):
            if sectors > 4:
                fail(ex, f"a warp's {what} touch {sectors:g} sectors of 32 bytes on average; coalesced, they touch 4",
                     "the 32 lanes of a warp (threadIdx.x 0..31) must read 32 neighbouring floats of a row of in and "
                     "write 32 neighbouring floats of a row of out: the transposing happens in the tile. Which entry "
                     "of the tile holds what the thread writing out's row i, column j needs?")
        checks += 1
        if conflicts:
            fail(ex, f"{conflicts:,} bank conflicts in {requests:,} shared-memory requests (a 64 x 64 transpose): "
                 "some warp reads or writes several words of one bank", "a warp that reads a column of a 32 x 32 float "
                 "tile finds all 32 words in one bank: element [i][j] is word 32 i + j, in bank j whatever i. With W "
                 "floats per row it is word W i + j: for which W do i = 0 .. 31 fall in 32 different banks?")
        checks += 1
    passed(ex, checks)


SOFTMAX_UNWRITTEN = -1.0  # y's entries before the launch: no softmax is negative, while a NaN may be computed


def _softmax_rows_of(x: np.ndarray) -> dict[str, list[int]]:
    """The check's rows by kind: a row of +-100 with 1000 in column 0 (the max in thread 0's own column), a row of
    equal values (-300: exp(-300) is 0 in float32), the +-100 row with the 1000 in column 3 (where a max tree
    without its barriers never looks), three rows far below zero (values about -1000; -inf but for one -1000, with
    -inf in column 0; every value -3e38, near float32's lowest), and the ordinary rows of N(0, 16) scores."""
    rows = x.shape[0]
    special = {"large": 1, "equal": 2, "large3": 3, "deep": 4, "masked": 5, "lowest": 6}
    kinds = {kind: [r] if r < rows else [] for kind, r in special.items()}
    return {**kinds, "ordinary": [r for r in range(rows) if r == 0 or r > 6]}


SOFTMAX_LOWEST = -3e38  # the "lowest" row's value: only a max started below it (-3.4e38f) or from the row is right


def _softmax_inputs(rng, rows: int, cols: int) -> np.ndarray:
    x = (rng.standard_normal((rows, cols)) * 4).astype(np.float32)
    for r, at in ((1, 0), (3, min(3, cols - 1))):
        if r < rows:
            x[r] = rng.choice(np.float32([-100, 100]), cols)
            x[r, at] = 1000
    if rows > 2:
        x[2] = -300
    if rows > 4:
        x[4] -= 1000
    if rows > 5:
        x[5] = -np.inf
        x[5, int(rng.integers(1, cols))] = -1000
    if rows > 6:
        x[6] = SOFTMAX_LOWEST
    return x


def _softmax_mistake(x: np.ndarray, y: np.ndarray, want: np.ndarray, threads: int) -> tuple[str, str] | None:
    """(what, hint) for the usual mistakes of a row softmax, read from what the kernel left in y; None if it is
    none of them."""
    rows, cols = x.shape
    kinds = _softmax_rows_of(x)
    unwritten = y == SOFTMAX_UNWRITTEN
    if unwritten.any():
        stride = ("thread t handles the columns t, t + blockDim.x, t + 2 * blockDim.x, ... while they are below "
                  "cols: in the max, in the sum and in the writes")
        if cols > threads and unwritten[:, threads:].all() and not unwritten[:, :threads].any():
            return (f"only the first {threads} columns of each row were written ({int(unwritten.sum()):,} entries of y "
                    f"never written): stride over the row", stride)
        never = sorted({int(r) for r in np.nonzero(unwritten.all(axis=1))[0]})
        if never:
            return (f"row{'s' if len(never) > 1 else ''} {', '.join(map(str, never[:5]))} of y never written",
                    "block r writes row r of y: in a row-major (rows, cols) array, how many floats lie before row r?")
        return f"{int(unwritten.sum()):,} entries of y were never written", stride
    finite = np.isfinite(y)
    with np.errstate(all="ignore"):
        sums = y.astype(np.float64).sum(axis=1)
        if rows > 1 and finite.all() and abs(sums.sum() - 1) < 1e-3 and not np.allclose(sums, 1, atol=1e-3):
            listed = ", ".join(f"{s:.3g}" for s in sums[:5])
            return (f"y sums to 1 over the whole matrix, not in each row (row sums {listed}): the sum is over all rows "
                    "instead of one", "block r reduces row r alone: its max and its sum "
                    "come from the columns of that row alone, cols of them")
        if rows > 1 and np.allclose(y, want[0], rtol=1e-5, atol=1e-9) and not np.allclose(want, want[0]):
            return ("every row of y holds the softmax of row 0: each block computes the same row",
                    "block r owns row r: where it reads x and writes y must move on past the r rows before it")
        for r in kinds["ordinary"]:
            if np.allclose(y[r], want[r], rtol=1e-5, atol=1e-9):
                continue
            seen = want[r] > 1e-30
            ratio = np.where(seen, y[r] / np.where(seen, want[r], 1), np.nan)
            if np.isfinite(ratio[seen]).all() and np.allclose(ratio[seen], ratio[seen][0], rtol=1e-4):
                return (f"row {r} of y sums to {sums[r]:.6g}, not 1, though it is proportional to the right softmax: "
                        "what you divide by is not the row's sum of exps", "add every column's exp, tree-sum the "
                        "block's partial sums with __syncthreads() after every level, outside the if, then read the "
                        "total from s[0]")
            groups = [ratio[c::threads][seen[c::threads]] for c in range(min(threads, cols))]
            groups = [g for g in groups if g.size]
            if all(np.isfinite(g).all() and np.allclose(g, g[0], rtol=1e-4) for g in groups) and \
                    not np.allclose([g[0] for g in groups], groups[0][0], rtol=1e-4):
                return (f"row {r}: the threads of its block did not all subtract the same max (or divide by the same "
                        "sum): each thread's columns are right up to a factor, but the factor differs between threads",
                        "read the max from s[0] after the tree's last __syncthreads(), and wait once more before any "
                        "thread stores its partial sum into s: else a thread ahead overwrites s[0] while others "
                        "still read the max there")
            return None  # an ordinary row wrong in some other way: the check shows the first wrong entry
        for r in kinds["large"]:
            if not finite[r].all():
                return (f"row {r}, values of -100, 100 and 1000, gives {_nonfinite(y[r])} in y: exp overflowed. Subtract "
                        "the row's max before exp", "expf(100) is already inf in float32 (above 3.4e38), and inf / "
                        "inf is nan. softmax(x) = softmax(x - max): then every exponent is at most 0")
        for r in kinds["equal"]:
            if not finite[r].all():
                return (f"row {r}, every value -300, gives {_nonfinite(y[r])} in y, where each entry is 1 / {cols}: the "
                        "max you subtract is above the row's values (did it start at 0?), so every exp is 0 and the "
                        "sum is 0", "start each thread's max from a value that cannot win: one that no score is below "
                        "(float32's lowest is about -3.4e38), or a value of the row itself (INFINITY and FLT_MAX need "
                        "headers a GPU's compiler lacks)")
        for r in kinds["large3"]:
            if not np.allclose(y[r], want[r], rtol=1e-5, atol=1e-9):
                right = all(np.allclose(y[q], want[q], rtol=1e-5, atol=1e-9) for q in kinds["large"])
                return (f"row {r}, values of -100 and 100 with 1000 in column 3, gives {_nonfinite(y[r])} in y"
                        + (", while the same values with the 1000 in column 0 come out right" if right else "")
                        + ": the max your threads subtract is not the row's max", "every level of the max tree must "
                        "end with __syncthreads(), outside the if: without it a thread reads the entry h above its own "
                        "before the thread that owns it has written it")
        return _softmax_far_below(x, y, want)


def _softmax_far_below(x: np.ndarray, y: np.ndarray, want: np.ndarray) -> tuple[str, str] | None:
    """(what, hint) for a softmax that fails only on the rows far below zero: a max started at a constant, or a -inf
    minus a -inf; None if those rows are right or wrong in another way."""
    kinds = _softmax_rows_of(x)
    cols = x.shape[1]
    right = {kind: all(np.allclose(y[r], want[r], rtol=1e-5, atol=1e-9) for r in rows) for kind, rows in kinds.items()}
    start = ("start each thread's max from a value that cannot win: one that no score is below (float32's lowest is "
             "about -3.4e38), or a value of the row itself (INFINITY and FLT_MAX need headers a GPU's compiler lacks)")
    for r in kinds["deep"]:
        if not np.isfinite(y[r]).all():
            return (f"row {r}, values about -1000, gives {_nonfinite(y[r])} in y" + (
                ", while the row of -300 came out right" if kinds["equal"] and right["equal"] else "") + ": the max you "
                "subtract is above every value of the row, so every exp is 0 and the sum is 0: a max started at a "
                "constant, not at a value the row cannot lie below", start)
    for r in kinds["masked"]:
        if not np.isfinite(y[r]).all():
            j = int(np.argmax(x[r]))
            return (f"row {r}, -inf in every column but one -1000 (column {j}), gives {_nonfinite(y[r])} in y, where it "
                    f"is 1 in column {j} and 0 elsewhere" + (", while the row of values about -1000 came out right" if
                                                             kinds["deep"] and right["deep"] else "") +
                    ": a -inf minus a -inf is nan. A max still at -inf (the row's first element, -inf here, or a start "
                    "of -inf) was subtracted from a -inf: an online softmax that rescales its sum by expf(old max - "
                    "new max) from the first element does this", "expf(x - max) is safe once max is the row's max, "
                    "found first by a tree of its own; a running max needs a start that no score is below and that is "
                    "not -inf, or its rescaling skipped while it is still -inf")
    for r in kinds["lowest"]:
        if not np.isfinite(y[r]).all():
            return (f"row {r}, every value -3e38 (near float32's lowest, -3.4e38), gives "
                    f"{_nonfinite(y[r])} in y, where each entry is 1 / {cols}" + (
                        ", while the row of values about -1000 came out right" if kinds["deep"] and right["deep"] else "")
                    + ": the max you subtract is above every value of the row, so every exp is 0 and the sum is 0: a "
                    "max started at a constant (such as -1e9), not at a value the row cannot lie below", start)
    return None


def _nonfinite(v: np.ndarray) -> str:
    n_nan, n_inf = int(np.isnan(v).sum()), int(np.isinf(v).sum())
    said = [f"{n} {w}" for n, w in ((n_nan, "nan"), (n_inf, "inf")) if n]
    return " and ".join(said) or "wrong values"


@recorded
def row_softmax(source: str, name: str = "softmax_rows", threads: int = 256) -> None:
    """Lab 05: y = softmax(x) row by row, one block of ``threads`` threads per row.

    Signature (const float* x, float* y, int rows, int cols), both (rows, cols) row-major; launched with grid (rows,)
    and block (threads,). Judged by the values against NumPy's softmax (shifted by the row max, in float64) to a
    relative 1e-5, by each row's sum, and, counted on the emulator in a (2, 1024) softmax, by each thread's loads
    (its own columns, not the whole row) and the sectors of each warp's loads (coalesced: 4).
    """
    ex = "row softmax"
    source = capture.source(source)
    print(f"{ex}: y on 7 shapes from (1, 1) to (1, 4097), with rows of large and of equal values and rows far below "
          "zero (about -1000; -inf but for one -1000; all -3e38), against NumPy to a relative 1e-5; then, counted in a "
          f"(2, 1024) softmax, the loads of each thread and the sectors of each warp's loads{RACES}")
    k = load_student_kernel(ex, source, name, {
        "__shared__": "the block shares its max and its sum through a __shared__ array of 256 floats, a tree as in "
                      "exercise 3",
        "__syncthreads": "wait with __syncthreads() after every level of the trees, and between reading the max and "
                         "storing the sums"},
        probe=lambda k: k((2,), (threads,), (np.ones((2, 1000), np.float32), np.zeros((2, 1000), np.float32),
                                             np.int32(2), np.int32(1000))), refused=_start_refused)
    rng = np.random.default_rng(capture.seed(4))
    drawn = (int(rng.integers(2, 7)), int(rng.integers(300, 3000)))
    checks = 0
    for rows, cols in each_case([(1, 1), (3, 5), (4, threads), (2, threads + 1), (7, 1000), (1, 4097), drawn],
            more=int(isinstance(source, str))):
        x = _softmax_inputs(rng, rows, cols)
        y = np.full((rows, cols), SOFTMAX_UNWRITTEN, np.float32)
        what = f"rows={rows}, cols={cols}"
        before = _copies((x, y, np.int32(rows), np.int32(cols)))
        try:
            k((rows,), (threads,), (x, y, np.int32(rows), np.int32(cols)))
            if cols == 1000:
                in_reverse_order(ex, k, (rows,), (threads,), before, (x, y), what)
        except kernels.KernelError as e:
            named_race(ex, what, e)
            m = re.search(r"out-of-bounds access (\w+)\[", str(e))
            fail(ex, f"{what}: the emulator stopped your kernel: {e}",
                 f"row r of {m.group(1)} has cols columns, and r full rows lie before it: where does it start, where "
                 "does it end, and does each strided loop stop below cols?" if m else "every thread must reach each "
                 "__syncthreads() of the trees; guard the work, not the barrier")
        except (TypeError, ValueError) as e:
            fail(ex, f"your kernel's parameters do not fit the launch: {e}",
                 "keep the signature given in the exercise: the check launches it with exactly those arguments")
        x64 = x.astype(np.float64)
        e64 = np.exp(x64 - x64.max(axis=1, keepdims=True))
        want = e64 / e64.sum(axis=1, keepdims=True)
        bad = ~np.isclose(y, want, rtol=1e-5, atol=1e-9)
        if bad.any():
            said = _softmax_mistake(x, y, want, threads)
            if said:
                fail(ex, f"{what}: {said[0]}", said[1])
            i, j = map(int, np.argwhere(bad)[0])
            fail(ex, f"{what}: y[{i}, {j}] is {float(y[i, j]):.6g} (yours) but should be {want[i, j]:.6g} (spec); "
                 f"{int(bad.sum())} of {y.size} entries wrong")
        sums = y.astype(np.float64).sum(axis=1)
        if not np.allclose(sums, 1, atol=1e-4):
            r = int(np.argmax(np.abs(sums - 1)))
            fail(ex, f"{what}: row {r} of y sums to {sums[r]:.7g}, not 1")
        checks += 1
    if isinstance(source, str):
        rows, cols = 2, 4 * threads
        x = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)

        def count() -> tuple:
            t = counts.traffic(source, name, (rows,), (threads,), (x, np.zeros_like(x), np.int32(rows), np.int32(cols)))
            per = t.thread_loads.reshape(rows, threads)
            b, th = map(int, np.unravel_index(int(per.argmax()), per.shape))
            return int(per.max()), b, th, t.sectors_per_load

        most, block, thread, sectors = capture.step("traffic", count)  # plain numbers: a record keeps them
        share = 3 * (cols // threads)
        if most > 2 * share + 2:
            fail(ex, f"in a ({rows}, {cols}) softmax thread {thread} of block {block} loads {most:,} floats from global "
                 f"memory; a thread that works on its own {cols // threads} columns (for the max, the sum and y) loads "
                 f"about {share}", "a thread reads only its own columns, t, t + blockDim.x, ...: the row's max and "
                 "sum come from the block's trees in shared memory, not from every thread reading the whole row")
        checks += 1
        if sectors > 4:
            fail(ex, f"a warp's loads touch {sectors:.3g} sectors of 32 bytes on average; coalesced, they touch 4",
                 "let the 32 lanes of a warp read 32 neighbouring columns: thread t starts at column t and steps by "
                 "blockDim.x, rather than taking a block of columns of its own")
        checks += 1
    passed(ex, checks)


EXERCISES = (
    Exercise("naive_matmul", "05", sources=(("kernels/matmul.cu", "matmul_naive"),), hints=(
        "The launch covers C with blocks of 16 x 16 threads: the grid's x runs along the columns of C (ceil(N / 16) "
        "blocks), its y along the rows (ceil(M / 16)). Each thread computes one entry of C.",
        "A thread's column counts over the whole grid, not only its block. With blocks 16 wide, thread x = 3 of block "
        "x = 2 has 2 blocks of 16 columns to its left and 3 more columns in its own block: it owns column 35. Its row "
        "comes the same way from the y indices.",
        "The grid is rounded up to whole blocks: with M = 17 it has 32 rows of threads, and rows 17 to 31 lie past "
        "the edge of C. Threads past the edge, in rows or in columns, must read and write nothing.",
        "C[row][col] is the sum over k of A[row][k] * B[k][col], with every array row-major: in a matrix of 3 columns, "
        "element [2][1] is at offset 2 * 3 + 1 = 7. How many columns do A, B and C each have, so where do A[row][k], "
        "B[k][col] and C[row][col] lie? And which values does k take?",
    )),
    Exercise("tiled_matmul", "05", sources=(("kernels/matmul.cu", "matmul_tiled"),), hints=(
        "A block of TILE x TILE threads computes one TILE x TILE tile of C; thread (ty, tx) owns one entry, whose "
        "row and col come from the block and thread indices as in your naive kernel (with TILE as the block size).",
        "Walk along K one tile at a time, t running over 0, TILE, 2 TILE, ... At step t the block needs A's tile of its own rows "
        "and of columns t to t + TILE - 1, and B's tile of rows t to t + TILE - 1 and its own columns. Every thread "
        "loads ONE element of each into two __shared__ TILE x TILE arrays, at its own place, row ty and column tx.",
        "Wait with __syncthreads() after the loads, before any thread reads the tiles. Then add the TILE products of "
        "row ty of A's tile and column tx of B's tile, and wait again before the next step's loads overwrite the "
        "tiles.",
        "Sizes need not be multiples of TILE. Take M = N = K = 17 with TILE 16: at the second step, t = 16, only one "
        "column of A's tile and one row of B's lie inside A and B. What must the other threads put in the tiles so "
        "that their products add nothing, and which threads may write C? Each must still reach every "
        "__syncthreads().",
    )),
    Exercise("fast_matmul", "05", sources=(("kernels/matmul.cu", "matmul_regblock"),), hints=(
        "Any kernel that is right scores; the check prints the unit that bounds yours. Start from your tiled kernel "
        "of exercise 2, written for a 1-D block: THREADS = TILE * TILE and BM = BN = TILE, each thread's row and "
        "column found from threadIdx.x alone.",
        "Count for one step along K of your tiled kernel: how many floats does a thread read from shared memory, and "
        "how many multiply-adds does it make from them? If a thread computed a 2 x 2 block of C instead of one entry, "
        "how many would it read for the same step, and how many multiply-adds?",
        "With a sub-tile of C per thread, a block of THREADS threads covers BM x BN entries of C, each thread "
        "BM x BN / THREADS of them. The tiles staged in shared memory then hold BM rows of A and BN columns of B for a "
        "step of BK values of k: how many floats must each thread load into them per step, and in which order do "
        "neighbouring threads read A and B so that a warp's loads are coalesced?",
        "Print your kernel's counts beside labkit's register-blocked one (section 4). Which unit bounds each? A "
        "grid of fewer blocks than the GPU's SMs leaves SMs idle: how many blocks does your tile give at 1024^3?",
    )),
    Exercise("block_reduction", "05", sources=(("kernels/reduce.cu", None),), hints=(
        "There may be fewer threads than values: first each thread adds up its own share into a private sum. It starts "
        "at its index in the whole grid, found as a column was in exercise 1, and steps by the number of threads in "
        "the whole grid until it passes n: a grid-stride loop. No value is then taken twice, none is missed.",
        "Store the private sum in a __shared__ array of 256 floats, one entry per thread, and wait for every thread. "
        "Then a tree: at each level the lower half of the entries still in play adds in the upper half, and the "
        "entries in play halve, until one entry holds the block's total.",
        "Between two levels of the tree every thread of the block must wait at __syncthreads(), the threads that add "
        "nothing too: put the barrier outside the if that selects the adding threads.",
        "Over 8 entries the tree takes 3 levels: 4 threads add the entry 4 above them, then 2 add the entry 2 above, "
        "then 1 adds s[1] into s[0]. How many levels do 256 entries take, and how far up does the first reach? And "
        "when s[0] holds the block's total, how does it reach *out, which other blocks add to at the same time?",
    )),
    Exercise("warp_reduction", "05", sources=(("kernels/reduce.cu", "warp_sum"),), hints=(
        "Start as in exercise 3: each thread adds up its share of x in a grid-stride loop, into a float in a register. "
        "A thread whose loop never ran holds 0.0f and still takes part in what follows.",
        "__shfl_down_sync(mask, v, offset), with all 32 bits of the mask set, gives each lane the v of the lane "
        "`offset` above it. If every lane adds what it receives to its own v, lane 0 then holds the sum of lanes 0 "
        "and offset. Every lane runs every shuffle: no if around them, as the mask says all 32 lanes arrive.",
        "A smaller warp, by hand: 4 lanes hold 1, 2, 3 and 4. After offset 2, lanes 0 and 1 hold 1 + 3 = 4 and "
        "2 + 4 = 6; after offset 1, lane 0 holds 4 + 6 = 10, the sum of all 4. What lanes 1 to 3 hold then is never "
        "read.",
        "Which offsets, in which order, make lane 0 of a warp of 32 hold the sum of all 32? And how does a thread tell "
        "from threadIdx.x that it is lane 0 of its warp, the one lane that adds the warp's total to *out?",
    )),
    Exercise("shared_transpose", "05", hints=(
        "A block of 32 x 32 threads moves one 32 x 32 tile. Let each thread read the element of in that "
        "transpose_naive's thread of the same indices reads: the 32 lanes of a warp (threadIdx.x = 0 .. 31) read 32 "
        "neighbouring floats of a row of in, coalesced.",
        "Writing that value straight to out puts the lanes a whole row of out apart. Store it instead in a __shared__ "
        "32 x 32 tile, at row ty and column tx, and wait for the block. Then let threadIdx.x run along a row of out: "
        "block (bx, by)'s tile of in lands in out's block row bx and block column by. Which entry of the tile does the "
        "thread writing out's row i, column j of that block need?",
        "On sizes that are not multiples of 32, some threads fall outside in and some outside out, which is cols x "
        "rows: guard the read by in's size and the write by out's, each on its own, and let every thread reach "
        "__syncthreads().",
        "Shared memory has 32 banks of 4 bytes, word w in bank w % 32. In a tile of W floats per row, element [i][j] "
        "is word W i + j. The 32 lanes of a warp reading one column of the tile (j fixed, i = 0 .. 31): which banks do "
        "they hit when W is 32? For which W do they hit 32 different banks?",
    )),
    Exercise("row_softmax", "05", sources=(("kernels/softmax_rows.cu", "softmax_rows"),), hints=(
        "Block r = blockIdx.x owns row r of x and of y: in a row-major (rows, cols) array, r full rows lie before "
        "it. Its 256 threads share the row's columns as the grid-stride loop of exercise 3 shares values: thread t "
        "takes columns t, t + blockDim.x, t + 2 blockDim.x, ... while they are below cols, so any cols is covered and "
        "the 32 lanes of a warp read 32 neighbouring floats.",
        "First the row's max. Each thread takes the max of its own columns with fmaxf and stores it in a __shared__ "
        "array of 256 floats; a thread with no column must store a value that cannot win. INFINITY and FLT_MAX come "
        "from C headers that a GPU's compiler lacks: which start values lose to every score and still compile?",
        "The block then halves that array as the tree of exercise 3 did, with fmaxf in place of +: every level ends "
        "with __syncthreads() outside the if, and s[0] holds the row's max. Every thread reads it from there, then "
        "waits at one more __syncthreads() before the array is used again.",
        "Then the sum: each thread adds expf(x - max) over its columns, and the same tree, with +, leaves the row's "
        "sum in s[0]. With the max subtracted every exponent is at most 0, so no expf overflows "
        "(expf(100) is already inf in float32), and the largest term is 1, so the sum is at least 1.",
        "By hand, the row (2, 1, 0): its max is 2, the exponentials of 0, -1 and -2 are 1, 0.368 and 0.135, their sum "
        "1.503, and the softmax is (0.665, 0.245, 0.090). Which of these numbers does a thread need to write one "
        "column of y, and where does it find each once the trees are done?",
    )),
)


# Compiled before a reduction kernel for one more launch of it: every atomicAdd and every warp shuffle is counted per
# thread (the kernel gets one more parameter, labkit_ops_: two counts per thread), and the warps of a block see
# their threadIdx.x in the opposite order: the emulator runs warp 0 first, a GPU in any order.
_COUNTED = r"""static thread_local unsigned int* labkit_ops_at_ = nullptr;
inline unsigned long long labkit_thread_() {
    return ((unsigned long long)(blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x)
        * (blockDim.x * blockDim.y * blockDim.z) + (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
}
template <class P, class V> inline auto labkit_atomic_add_(P p, V v) {
    if (labkit_ops_at_) labkit_ops_at_[2 * labkit_thread_()] += 1;
    return atomicAdd(p, v);
}
template <class T> inline T labkit_shuffled_(T v) {
    if (labkit_ops_at_) labkit_ops_at_[2 * labkit_thread_() + 1] += 1;
    return v;
}
inline uint3 labkit_reordered_() {
    uint3 t = ::threadIdx;
    t.x = ((blockDim.x + 31) / 32 - 1 - t.x / 32) * 32 + t.x % 32;
    return t;
}
#define atomicAdd(...) labkit_atomic_add_(__VA_ARGS__)
#undef __shfl_sync
#undef __shfl_up_sync
#undef __shfl_down_sync
#undef __shfl_xor_sync
#define __shfl_sync(...) labkit_shuffled_(::labkit::shfl_call<::labkit::SHFL_IDX>{__LINE__}(__VA_ARGS__))
#define __shfl_up_sync(...) labkit_shuffled_(::labkit::shfl_call<::labkit::SHFL_UP>{__LINE__}(__VA_ARGS__))
#define __shfl_down_sync(...) labkit_shuffled_(::labkit::shfl_call<::labkit::SHFL_DOWN>{__LINE__}(__VA_ARGS__))
#define __shfl_xor_sync(...) labkit_shuffled_(::labkit::shfl_call<::labkit::SHFL_XOR>{__LINE__}(__VA_ARGS__))
#define threadIdx (labkit_reordered_())
#line 1
"""


def _counted_run(source: str, name: str, n: int, blocks: int, threads: int, seed: int) -> tuple:
    """(the sum, atomics of each block, most shuffles of a thread, most shared-memory requests of a warp) of one
    launch of a reduction kernel with its warps in the opposite order and its atomics and shuffles counted."""
    text = strip_comments(source)
    decl = next(k for k in find_kernels(text) if k.name == name)
    a, b = decl.params_span
    body = text.index("{", b)
    text = text[:b] + ", unsigned int* labkit_ops_" + text[b:body + 1] + " labkit_ops_at_ = labkit_ops_;" + text[body + 1:]
    x = np.random.default_rng(seed).random(n).astype(np.float32)
    out, ops = np.zeros(1, np.float32), np.zeros(2 * blocks * threads, np.uint32)
    k = kernels.load(_COUNTED + text, backend="emulator", checked=True, gpu_check=False).get_function(name)
    k((blocks,), (threads,), (x, out, np.int32(n), ops))
    ops = ops.reshape(blocks, threads, 2)
    plain = np.zeros(1, np.float32)
    t = counts.traffic(source, name, (blocks,), (threads,), (x, plain, np.int32(n)))
    return (float(out[0]), float(x.sum(dtype=np.float64)), [int(v) for v in ops[..., 0].sum(axis=1)],
            [int(v) for v in np.nonzero(ops[0, :, 0])[0][:9]], int(ops[..., 1].max()),
            int(t.warps[..., 4].max()))  # shared_requests


def _reduction_counted(ex: str, source: str, name: str, per: str, threads: int) -> None:
    """Fail a reduction whose sum is right only in the emulator's order of warps, that calls atomicAdd other than
    once per ``per`` ("block" or "warp"), or whose adding is not a tree (counted in one launch of 8 blocks)."""
    n, blocks = 10_000, 8
    got, want, per_block, callers, shuffles, requests = capture.step(
        "counted", lambda: _counted_run(source, name, n, blocks, threads, capture.seed(5)))
    where = f"n={n:,} over {blocks} blocks of {threads}"
    if not np.isclose(got, want, rtol=1e-4):
        fail(ex, f"{where}: the sum is {got:.6g} (yours) but should be {want:.6g} (spec) when the warps of each block run "
             "in the opposite order (the emulator runs warp 0 first; a GPU runs the warps in any order): a race "
             "between warps", "a thread reads an entry of the shared array that a thread of another warp writes in the "
             "same step: each step of the tree must read only what the steps before it wrote, with a __syncthreads() "
             "between two steps")
    expected = 1 if per == "block" else threads // 32
    calls = max(per_block, key=lambda c: abs(c - expected))
    if calls != expected:
        who = {threads: "every thread calls it", threads // 32: "one thread of each warp calls it", 0: "no thread "
               "calls it"}.get(calls, f"threads {', '.join(map(str, callers[:8]))}{', ...' if len(callers) > 8 else ''} "
                                      "call it")
        fail(ex, f"{where}: {calls} atomicAdd calls in a block where one per {per} ({expected}) are expected: {who}",
             "atomics on one address take turns: " + ("sum the block in shared memory first, and let thread 0 alone "
                                                      "add the block total" if per == "block" else "let the shuffles "
                                                      "bring the warp total to lane 0, and lane 0 alone add it"))
    steps = int(math.log2(threads if per == "block" else 32))
    if per == "warp" and shuffles > steps:
        fail(ex, f"{where}: a lane made {shuffles} shuffles, where a tree over the 32 lanes of a warp takes log2(32) = "
             f"{steps}: the warp's values were collected one at a time, not halved step by step",
             "a tree lets every lane add at each step, and each step halves the lanes whose partial sums still "
             "count. With 4 lanes, two shuffles suffice (offsets 2, then 1): which 5 offsets do it for 32?")
    if per == "block" and requests > 4 * steps + 8:
        fail(ex, f"{where}: one warp made {requests} shared-memory requests, where a tree of log2({threads}) = {steps} "
             f"steps makes about 3 per step: the block's values were added one after the other, not by a tree",
             "a tree halves the adding threads each step: over 8 values, 4 threads each add the entry 4 above "
             "them, then 2 add the entry 2 above, then 1 adds s[1] into s[0]. What are the levels for 256?")
