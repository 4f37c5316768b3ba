"""Warming labkit's cache of compiled code: every library the labs build from labkit's own sources, compiled before a
lab needs it.

    from labkit.kernels import warm
    warm.warm_cache()   # a progress bar, then "compiled 26 of labkit's kernels in 41 s (2 cores); the next runs load them"

The labs compile C and CUDA C on first use, and :mod:`labkit.native.build` keeps each library in the cache, keyed by
its source, compiler and flags. ``labkit lab`` and ``labkit report`` call :func:`warm_cache` first. It builds each of
labkit's libraries by the call a lab makes (:func:`jobs` lists them), in worker processes over the usable cores, so
the keys are the labs' own; kernels written in the notebooks' cells are the students' and compile when they run. A
warm-up that finished leaves a stamp named by a fingerprint of labkit's sources, the compilers and the settings: the
next one only reads the fingerprint, and a changed kernel source or compiler warms again.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from .. import settings
from ..machine import usable_cores
from ..native.build import cache_dir
from ..progress import progress_bar
from .loader import Module, backend, load, load_file
from .source import read_source

PACKAGE = Path(__file__).resolve().parent.parent  # labkit/
# what the libraries are built from (in labkit/), and the programs that build or count them: the fingerprint's parts
SOURCES = ("kernels", "native", "c", "cluster/launch.py", "hostc.py", "openmp.py", "settings.py")
TOOLS = ("cc", "c++", "gcc", "g++", "clang", "clang++", "valgrind")
STAMP = "warmed-"  # a finished warm-up's mark in the cache folder, followed by the fingerprint
LIBRARIES = ("matmul", "layers", "reduce", "softmax", "optim", "conv")  # labs 04 and 05 launch these
COUNTED = ("matmul", "layers", "reduce")  # counts.traffic counts these in labs 04 and 05
# lab 03's backprop.c: the optimisation levels its runs use (-O3 -march=native for line_up and train_epoch_c), and the
# versions cachegrind counts in its section on the compiler (cell "runs" of 03_openmp_c.ipynb)
BACKPROP = (("-O2", False), ("-O0", False), ("-O3", False), ("-O3", True))
VERSIONS_COUNTED = (("naive", "-O2"), ("interchanged", "-O2"), ("hoisted", "-O2"), ("fused", "-O2"), ("simd", "-O2"),
                    ("fused", "-O0"), ("fused", "-O3"))


def _library(name: str) -> None:
    """One of labkit's kernel files as its launchers load it."""
    load_file(name)


def _counted(name: str) -> None:
    """One of labkit's kernel files as :func:`labkit.kernels.counts.traffic` builds it, every access counted."""
    Module(*read_source(name), backend="emulator", checked=True, counting=True)


def _matmul_loads(variant: str) -> None:
    """Lab 05's count of A's loads by labkit's matmul, which it shows while the student's is not written."""
    from . import counts

    counts.matmul_loads(None, variant)


def _bank_conflicts() -> None:
    """Lab 05's bank conflicts of a column read from shared memory (labkit's own small kernel)."""
    from . import counts

    counts.tile_column_conflicts(32)


def _softmax_rows() -> None:
    """Lab 05's reference row softmax, checked, which it runs while the student's is not written."""
    load("softmax_rows", backend="emulator", checked=True)


def _backprop(opt: str, native: bool) -> None:
    """Lab 03's backprop.c at one optimisation level."""
    from .. import openmp

    openmp.module(opt, native)


def _version_counted(version: str, opt: str) -> None:
    """Lab 03's program of one backprop.c version, counted by cachegrind (nothing without Valgrind)."""
    from .. import openmp

    openmp.version_counts({version: (version, opt)})


def _row_outer_counted() -> None:
    """Lab 03's row-order outer product, counted by cachegrind as the loop-interchange check counts it."""
    from .. import openmp

    openmp.outer_counts(openmp.ROW_OUTER)


def _loopback() -> None:
    """The MPI labs' loopback guard (labkit/native/loopback_bind.c), preloaded into every job."""
    from ..cluster import launch

    launch.loopback_preload()


def jobs(emulated: bool) -> list[tuple[str, object, tuple]]:
    """(label, function, arguments) of each library to build; ``emulated``: the kernels run on the CPU emulator (on a
    GPU labkit's launchers go through CuPy, and only the counting runs on the emulator)."""
    todo = [(f"{name}.cu counted", _counted, (name,)) for name in COUNTED]
    todo += [(f"matmul.cu, {v} loads counted", _matmul_loads, (v,)) for v in ("naive", "tiled")]
    todo += [("bank conflicts counted", _bank_conflicts, ()), ("softmax_rows.cu checked", _softmax_rows, ())]
    todo += [(f"{name}.cu", _library, (name,)) for name in LIBRARIES if emulated]
    todo += [(f"backprop.c {opt}{' native' if native else ''}", _backprop, (opt, native)) for opt, native in BACKPROP]
    todo += [(f"backprop.c {v} {opt} counted", _version_counted, (v, opt)) for v, opt in VERSIONS_COUNTED]
    todo += [("outer_acc rows counted", _row_outer_counted, ()), ("loopback_bind.c", _loopback, ())]
    return todo


def _tool(name: str) -> str:
    """A program on the PATH, resolved, with its size and time (a compiler upgraded changes them); "" if none."""
    path = shutil.which(name)
    if path is None:
        return ""
    real = Path(path).resolve()
    return f"{path} {real} {real.stat().st_size} {real.stat().st_mtime_ns}"


def fingerprint(emulated: bool) -> str:
    """What the libraries depend on, hashed, without starting a program: labkit's sources they are built from, the
    compilers and Valgrind, the settings the emulator's flags follow and whether the kernels are emulated."""
    h = hashlib.sha256()
    for entry in SOURCES:
        paths = sorted((PACKAGE / entry).rglob("*")) if (PACKAGE / entry).is_dir() else [PACKAGE / entry]
        for path in paths:
            if path.suffix in (".py", ".c", ".h", ".cu") and "__pycache__" not in path.parts:
                h.update(f"{path.relative_to(PACKAGE)}\0".encode() + path.read_bytes())
    tools = [os.environ.get("CC"), os.environ.get("CXX"), *map(_tool, TOOLS)]
    flags = (settings.checked(), settings.emu_ucontext(), settings.emu_stack_kb())
    h.update(repr((tools, flags, emulated)).encode())
    return h.hexdigest()[:24]


@dataclass
class Warmed:
    """What a warm-up did: libraries compiled of those labkit builds, why some failed, its seconds and workers."""

    compiled: int
    total: int
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0
    cores: int = 1

    def line(self) -> str:
        """The warm-up in one line."""
        said = (f"compiled {self.compiled} of labkit's kernels in {self.seconds:.0f} s "
                f"({self.cores} core{'s' if self.cores > 1 else ''})")
        if self.failed:
            return (f"{said}; {len(self.failed)} did not compile ({self.failed[0]}): the labs that use them say why "
                    "when they run")
        return f"{said}; the next runs load them" if self.compiled else "labkit's kernels were compiled already"


def _libraries(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if not p.name.startswith((STAMP, "tmp"))}


def _build(fn, args: tuple) -> str | None:
    """In a worker: build one library; None, or why it failed in one sentence."""
    try:
        fn(*args)
    except Exception as e:  # no compiler, a compiler that refuses: the lab reports it when it gets there
        said = str(e).strip().split("\n")[0].split(". ")[0]  # the first sentence: the rest is for the lab to say
        return f"{type(e).__name__}: {said}" if said else type(e).__name__
    return None


def _run(todo: list, cores: int, progress: bool | None) -> list[str]:
    """Build ``todo`` on ``cores`` worker processes under a progress bar; the failures, each labelled."""
    failed = []
    # spawned, not forked: a worker reads the settings and the compilers afresh, as the lab's own process will, never
    # what this process cached under other settings (a notebook's, or a test's)
    pool = ProcessPoolExecutor(max_workers=cores, mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = {pool.submit(_build, fn, args): label for label, fn, args in todo}
        with progress_bar(total=len(todo), enable=progress, desc="compiling labkit's kernels", unit="kernel",
                          leave=False) as bar:
            for done in as_completed(futures):
                try:
                    why = done.result()
                except Exception as e:  # a worker that died
                    why = f"{type(e).__name__}: {e}"
                if why:
                    failed.append(f"{futures[done]}: {why}")
                bar.update()
    finally:
        pool.shutdown(cancel_futures=True)  # after Ctrl-C, what had not started never starts
    return failed


def warm_cache(cores: int | None = None, progress: bool | None = None, todo: list | None = None) -> Warmed:
    """Compile every library the labs build from labkit's own sources that the cache lacks, on ``cores`` worker
    processes (default: the usable cores), and print what it did in one line; a stamp of the same fingerprint makes it
    return at once, quietly. ``todo`` replaces :func:`jobs` (tests). A library that does not compile is named in the
    line, and the rest go on."""
    start = time.perf_counter()
    emulated = backend() == "emulator"
    todo = jobs(emulated) if todo is None else todo
    folder = cache_dir()
    stamp = folder / f"{STAMP}{fingerprint(emulated)}"
    if stamp.exists():
        return Warmed(0, len(todo), seconds=time.perf_counter() - start)
    cores = max(1, min(cores or usable_cores(), len(todo)))
    before = _libraries(folder)
    failed = _run(todo, cores, progress)
    done = Warmed(len(_libraries(folder) - before), len(todo), failed, time.perf_counter() - start, cores)
    for old in folder.glob(f"{STAMP}*"):
        old.unlink(missing_ok=True)
    stamp.touch()  # failures too: the compilers are in the fingerprint, and one installed warms again
    if done.compiled or done.failed:
        print(done.line(), flush=True)
    return done
