"""C on the host: compile C source with the system's C compiler and call its functions with NumPy arrays.

    lib = hostc.load(SOURCE, opt="-O2", openmp=True)
    lib.axpy(np.float32(2.0), x, y, np.int32(len(x)))   # checked against the C signature, then called
    lib.axpy.threads_used                                 # the OpenMP threads a parallel region got

Every call is checked against the function's C parameter list as the CUDA launcher checks a kernel's (array or value,
the pointee's dtype, C-contiguity, writeable unless ``const``, scalars of exactly the parameter's type). Compiled
libraries are kept in labkit's cache of compiled code (:mod:`labkit.native.build`), keyed by source, compiler and
flags.

:func:`cache_counts` runs a C program under Valgrind's cachegrind, on one fixed cache for every machine, and gives one
function's memory instructions and cache misses: exact counts, the same in every run however busy the machine.

``checked=True`` (for students' code) builds with AddressSanitizer and UndefinedBehaviorSanitizer and runs every call
in a fresh child Python, on copies of the arrays that get red zones around them: an access out of bounds, undefined
behaviour (a signed overflow, a misaligned pointer) or a crash comes back as a :class:`CError` naming the function,
the kind of fault and the source line, and the notebook's own process is never touched. A checked call costs the
start of a Python process (a fraction of a second): for checks, not for timing.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import CodeError, CompileError, ToolMissing
from .native.build import BuildFailed, c_compiler, shared_library
from .native.csource import (
    Param,
    UnbalancedBracket,
    check_args,
    line_of,
    matching_bracket,
    parse_param,
    split_params,
    strip_comments,
)


class CompilerMissing(ToolMissing):
    """No C compiler on this machine (the message says how to get one)."""


class CCompileError(CompileError):
    """The C source did not compile; the compiler's errors are in the message."""


class CError(CodeError):
    """A checked call found a fault: out-of-bounds access, undefined behaviour, a crash or the time limit."""


_RESTYPES = {"void": None, "int": ctypes.c_int, "long": ctypes.c_long, "long long": ctypes.c_longlong,
             "float": ctypes.c_float, "double": ctypes.c_double, "int64_t": ctypes.c_int64, "size_t": ctypes.c_size_t}
_CTYPES = {("f", 4): ctypes.c_float, ("f", 8): ctypes.c_double, ("i", 1): ctypes.c_int8, ("i", 2): ctypes.c_int16,
           ("i", 4): ctypes.c_int32, ("i", 8): ctypes.c_int64, ("u", 1): ctypes.c_uint8, ("u", 2): ctypes.c_uint16,
           ("u", 4): ctypes.c_uint32, ("u", 8): ctypes.c_uint64, ("b", 1): ctypes.c_bool}
# appended after the user's code (their line numbers stay): how many threads a parallel region gets, and setting it
_HELPERS = r"""
#ifdef _OPENMP
#include <omp.h>
int labkit_threads_used(void) { int n = 1;
#pragma omp parallel
  {
#pragma omp single
    n = omp_get_num_threads();
  }
  return n; }
void labkit_set_threads(int n) { omp_set_num_threads(n); }
int labkit_max_threads(void) { return omp_get_max_threads(); }
#else
int labkit_threads_used(void) { return 1; }
void labkit_set_threads(int n) { (void)n; }
int labkit_max_threads(void) { return 1; }
#endif
"""
_CHECKED_FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"]
_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}


@functools.cache
def compiler() -> tuple[str, str]:
    """(path, version line) of the host C compiler: $CC, else cc, gcc or clang."""
    found = c_compiler()
    if found:
        return found
    raise CompilerMissing("compiling C needs a C compiler and none was found ($CC, cc, gcc, clang). Install one "
                          "(Debian/Ubuntu: apt install gcc; Fedora: dnf install gcc; macOS: xcode-select --install; "
                          "Windows: use WSL), then run this cell again.")


@dataclass(frozen=True)
class CDecl:
    """A C function found in the source: its name, return type and parameters."""

    name: str
    restype: str
    params: tuple[Param, ...]
    line: int


def find_functions(clean: str) -> list[CDecl]:
    """Every function *defined* at file scope in comment-free C, except ``static`` ones (file-local helpers)."""
    found = []
    for m in re.finditer(r"(?m)^[ \t]*((?:[A-Za-z_]\w*[ \t\*]+)+?)([A-Za-z_]\w*)\s*\(", clean):
        head, name = m.group(1), m.group(2)
        if clean.count("{", 0, m.start()) != clean.count("}", 0, m.start()):
            continue  # inside a function body
        words = head.replace("*", " * ").split()
        if not words or words[0] in ("return", "else", "typedef", "static", "if", "while", "for", "switch"):
            continue
        if "static" in words:
            continue
        close = matching_bracket(clean, m.end() - 1)
        if not re.match(r"\s*\{", clean[close + 1:]):
            continue  # a declaration or a call, not a definition
        restype = " ".join(w for w in words if w not in ("inline", "extern", "const"))
        params = tuple(parse_param(p, i) for i, p in enumerate(split_params(clean[m.end():close])))
        found.append(CDecl(name, restype, params, line_of(clean, m.start())))
    return found


def _flags(opt: str, openmp: bool, native: bool, checked: bool, extra: tuple[str, ...]) -> list[str]:
    if opt not in ("-O0", "-O1", "-O2", "-O3", "-Os", "-Ofast"):
        raise ValueError(f"opt must be one of -O0, -O1, -O2, -O3, -Os, -Ofast, got {opt!r}")
    # size_t and the fixed-width integers without an #include, as in a CUDA kernel
    flags = ["-std=gnu11", opt, "-g", "-fPIC", "-shared", "-include", "stddef.h", "-include", "stdint.h"]
    if openmp:
        flags.append("-fopenmp")
    if native:
        flags.append("-march=native")
    if checked:
        flags += _CHECKED_FLAGS
    return flags + list(extra)


def _build(source: str, filename: str, flags: list[str]) -> Path:
    """Compile (or find in the cache) one shared library; its path."""
    try:
        return shared_library(compiler(), source + "\n" + _HELPERS, filename, flags, libs=("-lm",))
    except BuildFailed as e:
        lines = e.stderr.splitlines()
        errors = [ln for ln in lines if "error" in ln or "note" in ln]
        raise CCompileError(f"{filename} did not compile:\n" + "\n".join((errors or lines)[:30])) from None


class CFunction:
    """One C function of a :class:`CModule`; call it with the C parameters' arrays and NumPy scalars."""

    def __init__(self, module: CModule, decl: CDecl):
        self.module, self.decl, self.name = module, decl, decl.name
        self.threads_used: int | None = None  # after a call: the threads an OpenMP parallel region got

    def __repr__(self):
        return f"<C function {self.decl.restype} {self.name}({', '.join(p.describe() for p in self.decl.params)})>"

    def __call__(self, *args, threads: int | None = None, timeout_s: float = 60.0):
        """Call the function; ``threads`` sets OMP_NUM_THREADS for this call (OpenMP modules)."""
        check_args(self.decl.params, args, f"C function {self.name}")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive int, got {threads!r}")
        if self.decl.restype not in _RESTYPES:
            raise TypeError(f"C function {self.name} returns {self.decl.restype}; labkit calls functions that return "
                            f"one of {', '.join(_RESTYPES)}")
        if self.module.checked:
            return _call_in_child(self, args, threads, timeout_s)
        lib = self.module.lib
        fn = getattr(lib, self.name)
        fn.restype = _RESTYPES[self.decl.restype]
        fn.argtypes = [ctypes.c_void_p if p.pointer else _CTYPES.get(p.code, ctypes.c_void_p) for p in self.decl.params]
        before = lib.labkit_max_threads()
        if threads is not None:
            lib.labkit_set_threads(ctypes.c_int(threads))
        try:  # ctypes lets go of the GIL for the call: Python threads may call C functions side by side
            result = fn(*[a.ctypes.data if p.pointer else a.item() for p, a in zip(self.decl.params, args)])
            self.threads_used = int(lib.labkit_threads_used())
        finally:
            lib.labkit_set_threads(ctypes.c_int(before))  # per call: the next call gets the run's setting again
        return result


class CModule:
    """A compiled C source: its functions are attributes (``mod.name``) or ``mod.get_function(name)``."""

    def __init__(self, source: str, filename: str = "code.c", opt: str = "-O2", openmp: bool = False,
                 native: bool = False, checked: bool = False, options: tuple[str, ...] = ()):
        self.source, self.filename, self.checked, self.openmp = source, filename, checked, openmp
        try:
            self.functions = {d.name: d for d in find_functions(strip_comments(source))}
        except UnbalancedBracket as e:
            raise CCompileError(f"{filename} did not compile: {e}") from None
        if not self.functions:
            raise CCompileError(f"{filename}: no function defined (static functions are file-local and not callable)")
        self.flags = _flags(opt, openmp, native, checked, tuple(options))
        self.path = _build(source, filename, self.flags)
        self._lib: ctypes.CDLL | None = None
        self._bound: dict[str, CFunction] = {}

    @property
    def lib(self) -> ctypes.CDLL:
        """The library loaded into this process (not for checked modules: they run in a child)."""
        if self.checked:
            raise RuntimeError("a checked module's functions run in a child process; call them through the module")
        with _lock:
            if self._lib is None:
                self._lib = _loaded.get(str(self.path)) or ctypes.CDLL(str(self.path))
                _loaded[str(self.path)] = self._lib
        return self._lib

    def get_function(self, name: str) -> CFunction:
        if name not in self.functions:
            raise AttributeError(f"{self.filename} defines no callable function {name!r}; it defines "
                                 f"{', '.join(self.functions) or 'none'}")
        if name not in self._bound:  # one object per function, so threads_used is there after the call
            self._bound[name] = CFunction(self, self.functions[name])
        return self._bound[name]

    def __getattr__(self, name: str) -> CFunction:
        if name.startswith("_") or name in ("functions", "source", "filename", "checked", "openmp", "flags", "path", "lib"):
            raise AttributeError(name)
        return self.get_function(name)


def load(source: str | os.PathLike, *, opt: str = "-O2", openmp: bool = False, native: bool = False,
         checked: bool = False, options: tuple[str, ...] = ()) -> CModule:
    """Compile C source (a string, or a path to a ``.c`` file) into a :class:`CModule`.

    ``opt`` is the optimisation level, ``openmp`` adds ``-fopenmp``, ``native`` adds ``-march=native`` (vector
    instructions of this processor), ``checked`` builds with the sanitizers and runs every call in a child process.
    """
    if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source and source.endswith(".c")):
        path = Path(source)
        return CModule(path.read_text(), path.name, opt, openmp, native, checked, options)
    return CModule(str(source), "code.c", opt, openmp, native, checked, options)


# -- exact counts: a program under cachegrind -----------------------------------------------------------------

# cachegrind's cache, the same everywhere (not this machine's): 32 KB L1 caches of 64-byte lines, 8 ways; a 1 MB last
# level, 16 ways. Counts on it depend on the code and the compiler alone.
CACHE = {"I1": (32768, 8, 64), "D1": (32768, 8, 64), "LL": (1 << 20, 16, 64)}


def cache_counts(program: str, function: str | None, opt: str = "-O3", timeout_s: float = 300,
                 flags: tuple[str, ...] = ()) -> dict[str, int] | None:
    """The events of ``function`` (None: of the whole program, what it calls included) in one run of the C
    ``program`` (a main of its own) under cachegrind: ``Ir`` instructions, ``Dr`` and ``Dw`` memory reads and writes
    (one per instruction, however many bytes it moves: a vector load of 8 floats is one), ``D1mr``/``D1mw``
    first-level and ``DLmr``/``DLmw`` last-level misses, on :data:`CACHE`; ``flags`` for the compiler besides ``opt``.
    None where Valgrind is not installed (apt install valgrind; Homebrew has none for Apple silicon)."""
    import shutil

    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    try:
        exe = shared_library(compiler(), program, "counted.c", [opt, "-g", "-fno-inline-functions-called-once",
                                                                *flags], libs=("-lm",), suffix="")
    except BuildFailed as e:
        raise CCompileError(str(e)) from None
    caches = [f"--{k}={','.join(map(str, v))}" for k, v in CACHE.items()]
    with tempfile.TemporaryDirectory(prefix="labkit-cachegrind-") as tmp:
        out = Path(tmp) / "cachegrind.out"
        done = subprocess.run([valgrind, "--tool=cachegrind", "--cache-sim=yes", *caches,
                               f"--cachegrind-out-file={out}", str(exe)], capture_output=True, text=True,
                              timeout=timeout_s)
        if done.returncode != 0 or not out.is_file():
            raise CError(f"the counted program failed under cachegrind (exit {done.returncode}): "
                         f"{done.stderr.strip()[-500:]}")
        return function_events(out.read_text(), function) if function else program_events(out.read_text())


def program_events(text: str) -> dict[str, int]:
    """The whole run's totals in a cachegrind output file's text (its ``summary:`` line)."""
    events = next((line.split()[1:] for line in text.splitlines() if line.startswith("events:")), None)
    summary = next((line.split()[1:] for line in text.splitlines() if line.startswith("summary:")), None)
    if not events or not summary:
        raise CError("not a cachegrind output: no events or summary line")
    return dict(zip(events, map(int, summary)))


def function_events(text: str, function: str) -> dict[str, int]:
    """One function's totals in a cachegrind output file's text (its ``fn=`` blocks, over every file)."""
    events: list[str] = []
    totals: list[int] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
            totals = [0] * len(events)
        elif line.startswith("fn="):
            inside = line[3:].strip() == function
        elif inside and line[:1].isdigit():
            for k, value in enumerate(line.split()[1:]):
                totals[k] += int(value)
    if not events:
        raise CError("not a cachegrind output: no events line")
    return dict(zip(events, totals))


# -- checked calls: a child Python with the sanitizers' runtime preloaded --------------------------------------


@functools.cache
def _asan_runtime() -> str:
    cc, _ = compiler()
    out = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    if not out or not Path(out).exists():
        raise CompilerMissing(f"checked mode needs AddressSanitizer's runtime (libasan), which {cc} does not have: "
                              "install it (Debian/Ubuntu: apt install libasan8 or gcc), or call with checked=False")
    return out


def _call_in_child(fn: CFunction, args, threads: int | None, timeout_s: float):
    with tempfile.TemporaryDirectory(prefix="labkit-c-") as tmp:
        spec = {"library": str(fn.module.path), "function": fn.name, "restype": fn.decl.restype, "threads": threads,
                "args": []}
        for i, (p, a) in enumerate(zip(fn.decl.params, args)):
            if p.pointer:
                np.save(Path(tmp) / f"{i}.npy", a, allow_pickle=False)
                spec["args"].append({"array": f"{i}.npy", "write": not p.const})
            else:
                spec["args"].append({"value": a.item(), "ctype": list(p.code)})
        (Path(tmp) / "spec.json").write_text(json.dumps(spec))
        env = {**os.environ, "LD_PRELOAD": _asan_runtime(),
               "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:symbolize=1:allocator_may_return_null=1",
               "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}
        child = subprocess.Popen([sys.executable, "-m", "labkit.hostc", tmp], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = child.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(child)
            raise CError(f"C function '{fn.name}' ran past the {timeout_s:g} s limit and was stopped: an endless loop, "
                         "or a loop bound far larger than meant?") from None
        except BaseException:  # Ctrl-C in the notebook: the child goes too
            _kill(child)
            raise
        if child.returncode != 0:
            raise CError(_explain(fn, err, child.returncode))
        result = json.loads(out.strip().splitlines()[-1])
        for i, (p, a) in enumerate(zip(fn.decl.params, args)):
            if p.pointer and not p.const:
                a[...] = np.load(Path(tmp) / f"{i}.npy", allow_pickle=False)
        fn.threads_used = result["threads_used"]
        return result["value"]


def _kill(child: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


_ASAN_KIND = {"heap-buffer-overflow": "an access outside an array (past its end or before its start)",
              "stack-buffer-overflow": "an access outside a local array", "global-buffer-overflow":
              "an access outside a global array", "heap-use-after-free": "a use of memory after free",
              "SEGV": "a segmentation fault: an access through a wild or null pointer", "stack-overflow":
              "a stack overflow (unbounded recursion, or a huge local array)", "double-free": "a double free"}


def _explain(fn: CFunction, stderr: str, code: int) -> str:
    """The sanitizer's report (or the signal) as one message naming the function, the fault and the line."""
    name, filename = fn.name, fn.module.filename
    where = ""
    # The first frame in the student's file. GCC names an OpenMP parallel region's body FUNCTION._omp_fn.N, and a
    # worker thread's stack holds only that, so which thread faulted first must not change what the message says.
    for frame in re.finditer(r"#\d+ 0x[0-9a-f]+ in ([\w.]+) (\S+?):(\d+)", stderr):
        if frame.group(2).endswith(filename):
            function, region = re.subn(r"\._omp_fn\.\d+$", "", frame.group(1))
            inside = " (in its parallel region)" if region else ""
            where = f" in {function}{inside}, line {frame.group(3)} of {filename}"
            break
    m = re.search(r"ERROR: AddressSanitizer: ([\w-]+)", stderr)
    if m:
        access = re.search(r"(READ|WRITE) of size (\d+)", stderr)
        what = _ASAN_KIND.get(m.group(1), m.group(1))
        if access:
            what += f": a {access.group(1).lower()} of {access.group(2)} bytes"
        return (f"C function '{name}' made {what}{where}. It ran in a process of its own on copies of your arrays, "
                "so this notebook and the arrays are unharmed. Check the loop bounds and the index arithmetic.")
    m = re.search(r"(\S+?):(\d+):\d+: runtime error: (.*)", stderr)
    if m:
        line = f" (line {m.group(2)} of {filename})" if m.group(1).endswith(filename) else where
        return f"C function '{name}': undefined behaviour{line}: {m.group(3).strip()}"
    if code < 0:
        return f"C function '{name}' crashed with {signal.Signals(-code).name}{where}"
    tail = "\n".join(stderr.strip().splitlines()[-6:])
    return f"C function '{name}' failed in its checked run (exit status {code}):\n{tail}"


def _child(folder: str) -> None:
    """The checked call itself (``python -m labkit.hostc FOLDER``): fresh arrays, so the sanitizer guards their edges."""
    d = Path(folder)
    spec = json.loads((d / "spec.json").read_text())
    lib = ctypes.CDLL(spec["library"])
    if spec["threads"] is not None:
        lib.labkit_set_threads(ctypes.c_int(spec["threads"]))
    arrays, values, types = {}, [], []
    for i, a in enumerate(spec["args"]):
        if "array" in a:
            loaded = np.load(d / a["array"], allow_pickle=False)
            fresh = np.empty(loaded.shape, loaded.dtype)  # allocated here: red zones on both sides
            fresh[...] = loaded
            arrays[i] = fresh
            values.append(fresh.ctypes.data)
            types.append(ctypes.c_void_p)
        else:
            t = _CTYPES[tuple(a["ctype"])]
            values.append(a["value"])
            types.append(t)
    f = getattr(lib, spec["function"])
    f.restype, f.argtypes = _RESTYPES[spec["restype"]], types
    value = f(*values)
    for i, a in enumerate(spec["args"]):
        if "array" in a and a["write"]:
            np.save(d / a["array"], arrays[i], allow_pickle=False)
    print(json.dumps({"value": value, "threads_used": int(lib.labkit_threads_used())}))


if __name__ == "__main__":
    _child(sys.argv[1])
