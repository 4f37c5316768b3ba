"""The CPU emulator: the unchanged .cu compiled by the host C++ compiler against cuda_emu.h, run through ctypes.

A module is compiled once per (source, mode, options, compiler) and kept in labkit's cache of compiled code
(:mod:`labkit.native.build`), so a second run, or a second process, only loads it.
Blocks spread over ``$LABKIT_EMU_THREADS`` OS threads (default: the cores this process may use).

Checked mode rewrites two things before compiling, keeping every line where it was so compiler
messages and run-time reports point at the student's own line numbers:
``const float* A`` in a kernel's parameters becomes ``labkit::cptr<const float> A`` (a pointer that
knows the array behind it), and ``__shared__ float t[16][17]`` becomes ``labkit::sarr<float, 16, 17>``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

from .. import settings
from ..errors import CodeError, ToolMissing
from ..machine import usable_cores
from ..native.build import BuildFailed, cxx_compiler, shared_library
from ..native.csource import line_of, matching_bracket, strip_comments
from .source import (
    KernelCompileError,
    KernelDecl,
    UnsupportedFeature,
    brace_depth_at,
    find_constants,
    find_kernels,
    unsupported,
)

HEADER = Path(__file__).with_name("cuda_emu.h")
_ERRLEN = 2048


class EmulatorUnavailable(ToolMissing):
    """No C++ compiler: the emulator cannot build kernels."""


class LaunchArgs(ctypes.Structure):
    """Mirror of labkit::LaunchArgs in cuda_emu.h."""

    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("args", ctypes.POINTER(ctypes.c_void_p)),
        ("nbytes", ctypes.POINTER(ctypes.c_uint64)),
        ("nargs", ctypes.c_int),
        ("nworkers", ctypes.c_int),
        ("dyn_shared", ctypes.c_uint64),
        ("timeout_s", ctypes.c_double),
        ("err", ctypes.c_char_p),
        ("errlen", ctypes.c_uint64),
        ("reversed", ctypes.c_int),
    ]


@functools.cache
def compiler() -> tuple[str, str]:
    """(path, version line) of the host C++ compiler: $CXX, else c++, g++ or clang++."""
    found = cxx_compiler()
    if found:
        return found
    raise EmulatorUnavailable(
        "the CPU emulator needs a C++ compiler and none was found ($CXX, c++, g++, clang++). "
        "Install one (Debian/Ubuntu: apt install g++; macOS: xcode-select --install; Windows: use WSL), "
        "or run on a machine with a CUDA GPU and CuPy."
    )


def workers() -> int:
    """OS threads per launch: $LABKIT_EMU_THREADS, else the cores this process may run on."""
    return settings.emu_threads() or usable_cores()


# -- rewriting -------------------------------------------------------------------------------------


def _rewrite_dynamic_shared(clean: str, checked: bool) -> str:
    """`extern __shared__ T name[];` -> a pointer to the block's dynamic shared memory (same line)."""
    def repl(m):
        if brace_depth_at(clean, m.start()) == 0:
            raise UnsupportedFeature(f"line {line_of(clean, m.start())}: `extern __shared__` at file scope is not supported "
                                     "by the CPU emulator; declare it inside the kernel")
        t, name = " ".join(m.group(1).split()), m.group(2)
        if checked:
            return f'::labkit::cptr<{t}> {name} = ::labkit::dynamic_shared_checked<{t}>("{name}");'
        return f"{t}* {name} = ::labkit::dynamic_shared<{t}>();"
    return re.sub(r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s*)?([\w\s]+?)\s+(\w+)\s*\[\s*\]\s*;", repl, clean)


def _rewrite_shared_arrays(clean: str) -> str:
    """`__shared__ T name[A][B];` -> `alignas(128) __shared__ ::labkit::sarr<T, (A), (B)> name;` (checked mode): aligned
    as a GPU's shared memory, so that counting finds element 0 in bank 0. In a function, its name follows on the same
    line, for a race report to name its elements."""
    def repl(m):
        dims = re.findall(r"\[([^\]]+)\]", m.group(3))
        name = m.group(2)
        named = f' ::labkit::name_shared(&{name}, "{name}");' if brace_depth_at(clean, m.start()) > 0 else ""
        return (f"alignas(128) __shared__ ::labkit::sarr<{' '.join(m.group(1).split())}, "
                f"{', '.join(f'({d})' for d in dims)}> {name};{named}")
    return re.sub(r"__shared__\s+((?:unsigned\s+|signed\s+)?\w+)\s+(\w+)\s*((?:\[[^\]]+\]\s*)+);", repl, clean)


_SHARED_SCALAR = re.compile(r"__shared__\s+((?:unsigned\s+|signed\s+)?\w+)\s+(\w+)\s*;")


def _rewrite_shared_scalars(text: str) -> str:
    """`__shared__ float m;` in a function -> `__shared__ float m[1];`, and `m` -> `m[0]` to the end of its block
    (checked mode): a shared scalar is then checked, and its races named, as an array's element is."""
    for m in reversed(list(_SHARED_SCALAR.finditer(text))):
        if brace_depth_at(text, m.start()) == 0:
            continue
        end, depth = m.end(), 0
        while end < len(text) and depth >= 0:
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        name = m.group(2)
        body = re.sub(rf"(?<!\.)(?<!->)\b{name}\b(?!\s*\[)", f"{name}[0]", text[m.end():end])
        text = text[:m.start()] + f"__shared__ {m.group(1)} {name}[1];" + body + text[end:]
    return text


def _rewrite_params(clean: str, kernels: list[KernelDecl]) -> str:
    """Pointer parameters of every kernel -> labkit::cptr<T> (checked mode). Works from the end backwards."""
    out = clean
    for k in sorted(kernels, key=lambda k: -k.params_span[0]):
        if k.template:
            continue
        a, b = k.params_span
        new = []
        for p in k.params:
            if p.pointer and p.ctype != "?":
                new.append(f"::labkit::cptr<{'const ' if p.const else ''}{p.ctype}> {p.name}")
            else:
                new.append(p.text)
        text = ", ".join(new)
        text += "\n" * (out[a:b].count("\n") - text.count("\n"))  # keep the lines after it where they were
        out = out[:a] + text + out[b:]
    return out


_POINTER_DECL = re.compile(r"(?<![\w.>])((?:const\s+)?(?:(?:unsigned|signed)\s+)?\w+)\s*\*\s*(\w+)\s*=\s*([^;,{}]+);")


def _rewrite_derived_pointers(text: str, kernels: list[KernelDecl]) -> tuple[str, set[str]]:
    """Checked mode: ``T* q = expr;`` in a kernel's body -> ``auto q = ::labkit::derive<T>(expr);``: a pointer made
    from a checked argument keeps its bounds. Returns the text and the names so declared."""
    names: set[str] = set()
    for k in reversed(kernels):
        start = text.find("{", k.params_span[1])
        if start < 0:
            continue
        end = matching_bracket(text, start, "{", "}")
        body = text[start:end]
        for m in reversed(list(_POINTER_DECL.finditer(body))):
            if m.group(1) in ("return", "else", "case", "goto"):
                continue
            names.add(m.group(2))
            body = body[:m.start()] + f"auto {m.group(2)} = ::labkit::derive<{m.group(1)}>({m.group(3)});" + body[m.end():]
        text = text[:start] + body + text[end:]
    return text, names


def _rewrite_subscripts(text: str, names: set[str], counting: bool = False) -> str:
    """`A[i]` -> `A[::labkit::at(__LINE__, i)]` for the checked names, so a fault can name its line. With ``counting``
    (checked mode: counts and race tracking), also which subscript it is (its site) and whether it loads, stores or
    both: `A[::labkit::at(__LINE__, i, 3, 1)]`."""
    if not names:
        return text
    pattern = re.compile(r"\b(" + "|".join(sorted(map(re.escape, names))) + r")\s*\[")
    found = list(pattern.finditer(text))
    for site, m in reversed(list(enumerate(found))):
        open_pos = m.end() - 1
        close = _closing(text, open_pos)
        if close is None or not text[open_pos + 1:close].strip():
            continue
        inner = text[open_pos + 1:close]
        extra = f", {site}, {_access_kind(text, m.start(), close)}" if counting else ""
        text = text[:open_pos + 1] + f"::labkit::at(__LINE__, {inner}{extra})" + text[close:]
    return text


def _closing(text: str, open_pos: int) -> int | None:
    """The index of the ``]`` that closes the ``[`` at ``open_pos``."""
    depth = 0
    for close in range(open_pos, len(text)):
        depth += {"[": 1, "]": -1}.get(text[close], 0)
        if depth == 0:
            return close
    return None


_LOAD, _STORE, _LOAD_STORE, _ADDRESS = range(4)  # labkit::AccessKind


def _access_kind(text: str, start: int, close: int) -> int:
    """Whether the subscript chain that begins at ``start`` (``A[..]`` and any ``[..]`` after it) loads, stores, does
    both (``+=``, ``++``) or only takes an address (``&A[i]``, as atomicAdd is given it; ``__ldg(&A[i])`` loads)."""
    end = close + 1
    while True:  # the rest of the chain: s[i][j]
        m = re.match(r"\s*\[", text[end:])
        if not m:
            break
        c = _closing(text, end + m.end() - 1)
        if c is None:
            break
        end = c + 1
    before, after = text[:start].rstrip(), text[end:]
    if before.endswith("&") and not before.endswith("&&"):
        return _LOAD if re.search(r"__ldg\s*\(\s*&$", before) else _ADDRESS
    if before.endswith(("++", "--")) or re.match(r"\s*(\+\+|--|(<<|>>|[-+*/%&|^])=)", after):
        return _LOAD_STORE
    if re.match(r"\s*=(?!=)", after):
        return _STORE
    return _LOAD


STATIC_SHARED_LIMIT = 48 * 1024  # bytes of static __shared__ memory a GPU gives one block
_SHARED_DECL = re.compile(r"__shared__\s+((?:(?:unsigned|signed|const|volatile)\s+)*\w+)\s+(\w+)\s*((?:\[[^\[\]]+\])+)\s*;")


def _limit_static_shared(text: str) -> str:
    """After each kernel's last static ``__shared__`` array, a static_assert that all of them fit in the 48 KB a GPU
    gives a block: too much is a compile error naming the kernel, as nvcc's ptxas reports it, not a silent success."""
    for k in reversed(find_kernels(text)):
        start = text.find("{", k.params_span[1])
        if start < 0:
            continue
        end = matching_bracket(text, start, "{", "}")
        decls = list(_SHARED_DECL.finditer(text, start, end))
        if not decls:
            continue
        total = " + ".join(f"sizeof({d.group(1)}{d.group(3)})" for d in decls)
        names = ", ".join(d.group(2) for d in decls)
        check = (f" static_assert({total} <= {STATIC_SHARED_LIMIT}, \"kernel {k.name}: its __shared__ arrays ({names}) "
                 f"need more than the 48 KB of static shared memory a GPU gives a block; use smaller tiles, or "
                 f"extern __shared__ with shared_mem= and max_dynamic_shared_size_bytes\");")
        text = text[:decls[-1].end()] + check + text[decls[-1].end():]  # on the same line: line numbers stay
    return text


def _glue(kernels: list[KernelDecl], constants: list[str], fibered: bool) -> str:
    lines = ["", "// ---- labkit emulator entry points (generated) ----"]
    for k in kernels:
        if k.template:
            continue
        names = ", ".join(f'"{p.name}"' for p in k.params)
        lines.append(f"static const char* const labkit_names_{k.name}[] = {{{names}{', ' if names else ''}nullptr}};")
        lines.append(f'extern "C" int labkit_launch_{k.name}(const ::labkit::LaunchArgs* L) '
                     f'{{ return ::labkit::launch("{k.name}", &{k.name}, labkit_names_{k.name}, L, {str(fibered).lower()}); }}')
    for c in constants:
        lines.append(f'extern "C" void* labkit_constant_{c}(unsigned long long* size) '
                     f'{{ *size = sizeof({c}); return (void*)&{c}; }}')
    return "\n".join(lines) + "\n"


# what makes a thread wait for others, so that threads must run as fibers
_WAITS = re.compile(r"\b__(syncthreads|syncwarp|activemask|shfl_sync|shfl_up_sync|shfl_down_sync|shfl_xor_sync|"
                    r"ballot_sync|any_sync|all_sync)\b")


def prepare(source: str, filename: str, checked: bool, counting: bool = False) -> tuple[str, list[KernelDecl], list[str], bool]:
    """(C++ text to compile, kernels, constants, fibered) for one .cu source; ``counting`` (checked mode with every
    access counted, labkit.kernels.counts.traffic) marks each subscript with its site and kind."""
    checked = checked or counting
    clean = strip_comments(source)
    problems = unsupported(clean)
    if problems:
        raise UnsupportedFeature(f"{filename}: " + "; ".join(problems))
    kernels = find_kernels(clean)
    constants = find_constants(clean)
    fibered = checked or bool(_WAITS.search(clean))
    text = _limit_static_shared(_rewrite_dynamic_shared(clean, checked))
    if checked:
        text = _rewrite_shared_scalars(text)
        shared = set(re.findall(r"__shared__\s+(?:unsigned\s+|signed\s+)?\w+\s+(\w+)\s*\[", text))
        shared |= set(re.findall(r"dynamic_shared_checked<[^>]*>\(\"(\w+)\"\)", text))
        text = _rewrite_shared_arrays(text)
        kernels = find_kernels(text)
        pointers = {p.name for k in kernels for p in k.params if p.pointer and p.ctype != "?"}
        text = _rewrite_params(text, kernels)
        text, derived = _rewrite_derived_pointers(text, find_kernels(text))
        text = _rewrite_subscripts(text, pointers | shared | derived, counting=True)
    # every kernel under a name of labkit's, so that one called like a C library function (div, abs, exp) does not
    # collide with the declaration the emulator's headers bring in; the entry points keep the kernel's own name
    renames = "".join(f"#define {k.name} labkit_kernel_{k.name}\n" for k in kernels)
    text = renames + f'#line 1 "{filename}"\n' + text + _glue(kernels, constants, fibered)
    return text, kernels, constants, fibered


# -- compiling and loading -------------------------------------------------------------------------

_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}


def _flags(checked: bool, options: tuple[str, ...]) -> list[str]:
    # checked and counting builds run small launches, where compiling is most of the time: -O1 compiles them about
    # a fifth faster; the timed (unchecked) builds keep -O2
    flags = ["-std=c++17", "-O1" if checked else "-O2", "-fPIC", "-shared", "-pthread", "-w"]
    if checked:
        flags.append("-DLABKIT_EMU_CHECKED=1")
    if settings.emu_ucontext():
        flags.append("-DLABKIT_EMU_UCONTEXT=1")
    flags.append(f"-DLABKIT_EMU_STACK_KB={settings.emu_stack_kb()}")
    return flags + list(options)


def build(text: str, filename: str, checked: bool, options: tuple[str, ...]) -> ctypes.CDLL:
    """Compile (or find in the cache) and load one prepared module."""
    flags = [*_flags(checked, options), "-include", str(HEADER)]
    with _lock:
        try:
            so = shared_library(compiler(), text, Path(filename).stem + ".cpp", flags, stamp=(HEADER.read_text(),))
        except BuildFailed as e:
            raise KernelCompileError(f"{filename} did not compile for the CPU emulator:\n{_trim(e.stderr)}") from None
        if str(so) not in _loaded:
            _loaded[str(so)] = ctypes.CDLL(str(so))
        return _loaded[str(so)]


def _trim(stderr: str, limit: int = 40) -> str:
    """The compiler's errors, without the notes about the emulator header that only confuse."""
    keep = [ln for ln in stderr.splitlines() if "error" in ln or not ln.startswith(str(HEADER))]
    errors = [ln for ln in keep if "error" in ln]
    body = "\n".join((errors or keep)[:limit])
    return body


class KernelError(CodeError):
    """A kernel stopped with an error: out-of-bounds access, barrier divergence, time limit, a crash."""


# Where a launch can run in a child process (fork keeps the compiled module and the arguments' copies)
CAN_ISOLATE = sys.platform.startswith("linux") and hasattr(os, "fork")
_GRACE_S = 3.0  # past the kernel's own time limit, which reports where it was, before the child is killed
_SIGNALS = {signal.SIGSEGV: "a segmentation fault: a read or write outside any array (a wild pointer, an index far "
                            "out of bounds, a pointer computed by hand), or a stack overflow from deep recursion",
            signal.SIGBUS: "a bus error: a misaligned or unmapped access through a pointer",
            signal.SIGABRT: "an abort: the C++ runtime gave up, often an allocation that could not be made",
            signal.SIGFPE: "a floating-point exception: an integer division by zero"}


def _run_in_child(call, name: str, timeout_s: float, crash_site=lambda: "") -> int:
    """Run ``call()`` (returns 0 on success) in a forked child; its status here. A crash, the time limit (plus a grace
    period) and Ctrl-C end the child from outside, whatever the kernel does; ``crash_site()`` says where a crash was."""
    pid = os.fork()
    if pid == 0:  # the child: only C from here on, then leave without running Python's exit machinery
        code = 70
        try:
            code = 0 if call() == 0 else 3
        finally:
            os._exit(code)
    limit = timeout_s + _GRACE_S if timeout_s and timeout_s > 0 else None
    start, nap = time.monotonic(), 1e-5
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if limit is not None and time.monotonic() - start > limit:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise KernelError(f"kernel '{name}' ran past the {timeout_s:g} s limit (LABKIT_KERNEL_TIMEOUT) and was "
                                  "stopped: an endless loop, or a grid far larger than meant?")
            time.sleep(nap)
            nap = min(nap * 2, 0.005)
    except BaseException:  # Ctrl-C in a notebook (KeyboardInterrupt) or anything else: the child goes too
        with contextlib.suppress(ChildProcessError, ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        raise
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        why = _SIGNALS.get(sig, signal.Signals(sig).name if sig in signal.Signals.__members__.values() else str(sig))
        site = crash_site()
        at = f" ({site.replace(f'kernel {name!r}, ', '')})" if site else ""
        raise KernelError(f"kernel '{name}' crashed the emulator{at} with {why}. The kernel ran in a process of its own, so "
                          "this notebook and your arrays are unharmed (the arrays are as before the launch). On a GPU "
                          "this is an 'illegal memory access'. Check the pointer arithmetic and the index bounds.")
    return os.WEXITSTATUS(status)


class EmulatorModule:
    """A compiled module: ``get_function(name)`` gives a launchable kernel."""

    def __init__(self, source: str, filename: str = "kernel.cu", checked: bool = False, options: tuple[str, ...] = (),
                 isolated: bool | None = None, counting: bool = False):
        self.filename = filename
        self.checked = checked or counting
        self.counting = counting
        self.isolated = (self.checked if isolated is None else isolated) and CAN_ISOLATE  # each launch in a child process
        text, self.kernels, self.constants, self.fibered = prepare(source, filename, checked, counting)
        options = (*options, "-DLABKIT_EMU_COUNT=1") if counting else tuple(options)
        self._lib = build(text, filename, self.checked, options)
        self._launchers: dict = {}

    def count_into(self, thread_loads: np.ndarray, thread_stores: np.ndarray, warps: np.ndarray,
                   launch: np.ndarray | None = None) -> None:
        """Counting mode: the arrays the next launches add their counts to (uint32 per thread, uint64 per warp and
        field, and ``launch``: 3 uint64, the atomics, the most atomics on one address and the barriers passed); they
        must outlive those launches, and be in shared memory for an isolated launch to reach them."""
        if not self.counting:
            raise RuntimeError("this module was not compiled for counting (counting=True)")
        if launch is not None and (launch.dtype != np.uint64 or launch.size < 3):
            raise ValueError(f"launch must be 3 uint64 (atomics, the most on one address, barriers), got "
                             f"{launch.size} {launch.dtype}")
        fn = self._lib.labkit_count_into
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_void_p, ctypes.c_ulonglong,
                       ctypes.c_void_p]
        fn.restype = None
        fn(thread_loads.ctypes.data, thread_stores.ctypes.data, thread_loads.size, warps.ctypes.data, warps.shape[0],
           None if launch is None else launch.ctypes.data)

    def launcher(self, name: str):
        if name not in self._launchers:
            fn = getattr(self._lib, f"labkit_launch_{name}")
            fn.argtypes = [ctypes.POINTER(LaunchArgs)]
            fn.restype = ctypes.c_int
            self._launchers[name] = fn
        return self._launchers[name]

    def constant_address(self, name: str) -> tuple[int, int]:
        fn = getattr(self._lib, f"labkit_constant_{name}")
        fn.argtypes = [ctypes.POINTER(ctypes.c_ulonglong)]
        fn.restype = ctypes.c_void_p
        size = ctypes.c_ulonglong(0)
        addr = fn(ctypes.byref(size))
        return addr, size.value

    def launch(self, name: str, grid, block, args, nbytes, shared_mem: int = 0, timeout_s: float = 0.0,
               writable: list[bool] | None = None, isolated: bool | None = None, reversed_order: bool = False) -> None:
        """Run kernel ``name``; args are already checked numpy arrays and numpy scalars. ``reversed_order`` runs each
        block's threads from the last to the first (warps, and lanes within a warp), as a GPU may.

        ``isolated`` (default: the module's; in checked mode for code that is not labkit's, where a fork exists) runs
        the kernel in a child process on copies of the arrays in shared memory, copied back into the ``writable`` ones
        after a clean finish: a wild pointer, a stack overflow or an allocation failure then kills the child, not this
        process (a notebook's kernel), and is reported as a :class:`KernelError`; the time limit and Ctrl-C are
        enforced from here, whatever the kernel does (``timeout_s`` 0: no limit)."""
        if isolated is None:
            isolated = self.isolated
        if isolated:
            return self._launch_isolated(name, grid, block, args, nbytes, shared_mem, timeout_s, writable, reversed_order)
        err = ctypes.create_string_buffer(_ERRLEN)
        keep = []  # the values ctypes points at must live until the call returns
        la = self._launch_args(grid, block, args, [a.ctypes.data if isinstance(a, np.ndarray) else 0 for a in args],
                               nbytes, shared_mem, timeout_s, ctypes.addressof(err), keep, reversed_order)
        rc = self.launcher(name)(ctypes.byref(la))
        if rc != 0:
            raise KernelError(err.value.decode(errors="replace") or f"kernel '{name}' failed")

    @staticmethod
    def _launch_args(grid, block, args, addresses, nbytes, shared_mem, timeout_s, err_address, keep,
                     reversed_order=False) -> LaunchArgs:
        n = len(args)
        ptrs = (ctypes.c_void_p * max(n, 1))()
        sizes = (ctypes.c_uint64 * max(n, 1))()
        for i, a in enumerate(args):
            if isinstance(a, np.ndarray):
                v = ctypes.c_void_p(addresses[i])
                keep.append(v)
                ptrs[i] = ctypes.addressof(v)
            else:
                s = np.array(a)  # a 0-d copy holding the scalar's bytes
                keep.append(s)
                ptrs[i] = s.ctypes.data
            sizes[i] = nbytes[i]
        keep += [ptrs, sizes]
        return LaunchArgs((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), ptrs, sizes, n, workers(),
                          int(shared_mem), float(timeout_s), ctypes.c_char_p(err_address), _ERRLEN, int(reversed_order))

    def _launch_isolated(self, name, grid, block, args, nbytes, shared_mem, timeout_s, writable, reversed_order) -> None:
        fn = self.launcher(name)
        arrays = [i for i, a in enumerate(args) if isinstance(a, np.ndarray)]
        offsets, total = {}, _ERRLEN
        for i in arrays:
            offsets[i] = total
            total += (args[i].nbytes + 63) // 64 * 64  # each copy aligned for any dtype
        shared = mmap.mmap(-1, total)  # anonymous and shared: the child's writes are seen here
        try:
            view = np.frombuffer(shared, dtype=np.uint8)
            base = view.ctypes.data
            for i in arrays:
                view[offsets[i]:offsets[i] + args[i].nbytes] = args[i].reshape(-1).view(np.uint8)
            keep: list = []
            la = self._launch_args(grid, block, args, [base + offsets.get(i, 0) for i in range(len(args))], nbytes,
                                   shared_mem, timeout_s, base, keep, reversed_order)
            report = self._lib.labkit_crash_reports
            report.argtypes, report.restype = [ctypes.c_void_p, ctypes.c_ulonglong], None

            def child() -> int:
                report(base, _ERRLEN)  # a fatal signal writes the kernel, block and thread here first
                return fn(ctypes.byref(la))

            def crash_site() -> str:
                return shared[:_ERRLEN].split(b"\0", 1)[0].decode(errors="replace")

            status = _run_in_child(child, name, timeout_s, crash_site)
            if status != 0:
                msg = bytes(view[:_ERRLEN]).split(b"\0", 1)[0].decode(errors="replace")
                raise KernelError(msg or f"kernel '{name}' failed")
            for i in arrays:
                if writable is None or writable[i]:
                    args[i].reshape(-1).view(np.uint8)[:] = view[offsets[i]:offsets[i] + args[i].nbytes]
        finally:
            del view
            shared.close()
