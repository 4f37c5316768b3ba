"""Reading C and CUDA C source: comments out, brackets paired, parameter lists read, and calls checked against them.

Lab 03's C (:mod:`labkit.hostc`) and labs 04-05's CUDA (:mod:`labkit.kernels`) read their sources with this: each
finds its functions or kernels with it, and checks every call's arguments against the parameter list it reads here.
It is a small scanner for the C that the labs are written in, not a C or C++ parser: what it does not understand it
leaves unchecked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..errors import CompileError


class UnbalancedBracket(CompileError):
    """A bracket of the source is never closed: the scanner cannot read past it, and a compiler would refuse it too."""


_SCALARS = {
    "float": ("f", 4), "double": ("f", 8),
    "int": ("i", 4), "signed": ("i", 4), "signed int": ("i", 4), "int32_t": ("i", 4),
    "unsigned": ("u", 4), "unsigned int": ("u", 4), "uint32_t": ("u", 4),
    "long long": ("i", 8), "long long int": ("i", 8), "int64_t": ("i", 8), "long": ("i", 8), "long int": ("i", 8),
    "ptrdiff_t": ("i", 8),
    "unsigned long long": ("u", 8), "unsigned long long int": ("u", 8), "uint64_t": ("u", 8), "size_t": ("u", 8),
    "unsigned long": ("u", 8),
    "short": ("i", 2), "int16_t": ("i", 2), "unsigned short": ("u", 2), "uint16_t": ("u", 2),
    "char": ("i", 1), "signed char": ("i", 1), "int8_t": ("i", 1), "unsigned char": ("u", 1), "uint8_t": ("u", 1),
    "bool": ("b", 1),
}


@dataclass(frozen=True)
class Param:
    """One parameter of a C function or a kernel: `const float* __restrict__ A` is Param("A", "float", pointer=True,
    const=True)."""

    name: str
    ctype: str          # the base type without qualifiers: "float", "unsigned int", "void", ...
    pointer: bool
    const: bool
    text: str           # as written

    @property
    def code(self) -> tuple[str, int] | None:
        """(numpy kind, itemsize) of the value or of the pointee, or None for types not checked."""
        return _SCALARS.get(self.ctype)

    def describe(self) -> str:
        return f"{'const ' if self.const else ''}{self.ctype}{'*' if self.pointer else ''} {self.name}"

    def accepts_dtype(self, dtype: np.dtype) -> bool:
        if self.pointer and self.ctype == "void":
            return True
        code = self.code
        if code is None:
            return True
        kind, size = code
        return dtype.itemsize == size and dtype.kind == kind

    def numpy_type(self):
        """The NumPy scalar type this parameter takes (np.float32 for float), or None."""
        code = self.code
        if code is None:
            return None
        kind, size = code
        return {"f": {4: np.float32, 8: np.float64}, "i": {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64},
                "u": {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}, "b": {1: np.bool_}}[kind][size]


def strip_comments(src: str) -> str:
    """The source with comments blanked out (newlines kept, so line numbers stay) and strings left alone."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in src[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            out.append(src[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def line_of(src: str, pos: int) -> int:
    """The line (from 1) on which index ``pos`` of the source stands."""
    return src.count("\n", 0, pos) + 1


def matching_bracket(src: str, open_pos: int, open_ch: str = "(", close_ch: str = ")") -> int:
    """The index of the bracket that closes the one at ``open_pos`` (nested pairs skipped)."""
    depth = 0
    for j in range(open_pos, len(src)):
        if src[j] == open_ch:
            depth += 1
        elif src[j] == close_ch:
            depth -= 1
            if depth == 0:
                return j
    raise UnbalancedBracket(f"unbalanced '{open_ch}' at line {line_of(src, open_pos)}")


def split_params(text: str) -> list[str]:
    """A parameter list's text (between its parentheses) cut at its top-level commas; ``void`` alone is no parameter."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip() and p.strip() != "void"]


def parse_param(text: str, index: int) -> Param:
    """One parameter as written (``const float* __restrict__ A``); what is not understood is left unchecked."""
    t = " ".join(re.sub(r"\b(__restrict__|__restrict|restrict|volatile)\b", " ", text).split())
    words = re.findall(r"\w+", t)
    name = words[-1] if words else f"arg{index}"
    if "[" in t or "(" in t or "&" in t or t.count("*") > 1 or not re.fullmatch(r"[\w\s\*]+", t):
        return Param(name, "?", "*" in t or "[" in t, False, text)      # not understood: left unchecked
    if "*" in t:
        head, tail = t.split("*")
        tail_words = [w for w in tail.split() if w != "const"]
        if len(tail_words) != 1:
            return Param(name, "?", True, False, text)
        base = [w for w in head.split() if w != "const"]
        return Param(tail_words[0], " ".join(base), True, "const" in head.split(), text)
    base = [w for w in t.split()[:-1] if w != "const"]
    return Param(name, " ".join(base), False, "const" in t.split(), text)


def check_args(params: tuple[Param, ...], args, where: str, on_gpu: bool = False) -> list[int]:
    """Check call arguments against a C parameter list, as a compiler would not: array or value, the pointee's dtype,
    C-contiguity, writeable unless ``const``, and scalars of exactly the parameter's type (the callee reads exactly
    those bytes). Returns each argument's size in bytes (0 for values); raises TypeError/ValueError naming the
    argument, the parameter and the fix. ``where`` names the callee ("kernel matmul", "C function backprop")."""
    if len(args) != len(params):
        sig = ", ".join(p.describe() for p in params)
        raise TypeError(f"{where} takes {len(params)} arguments ({sig}), got {len(args)}")
    device = "the GPU" if on_gpu else "the CPU"
    nbytes = []
    for i, (p, a) in enumerate(zip(params, args)):
        what = f"{where}: argument {i} ({p.describe()})"
        is_cupy = type(a).__module__.startswith("cupy")
        if p.pointer:
            if isinstance(a, np.ndarray) and on_gpu:
                raise TypeError(f"{what} is a NumPy array, but this kernel runs on the GPU: pass cupy.asarray(...)")
            if is_cupy and not on_gpu:
                raise TypeError(f"{what} is a CuPy array, but this code runs on {device}: pass .get()")
            if not (isinstance(a, np.ndarray) or is_cupy):
                raise TypeError(f"{what} must be an array, got {type(a).__name__}")
            if not a.flags.c_contiguous:
                raise ValueError(f"{what} is not C-contiguous: C indexes flat memory; pass an ascontiguousarray copy")
            if not p.accepts_dtype(a.dtype):
                raise TypeError(f"{what} points to {p.ctype}, but the array's dtype is {a.dtype}")
            if not p.const and isinstance(a, np.ndarray) and not a.flags.writeable:
                raise ValueError(f"{what} is written by the function, but the array is read-only")
            nbytes.append(int(a.nbytes))
        else:
            if isinstance(a, np.ndarray | list | tuple) or is_cupy:
                raise TypeError(f"{what} takes a single value, got an array")
            want = p.numpy_type()
            if want is not None and type(a) is not want:
                raise TypeError(f"{what} needs a {want.__name__} (the function reads exactly those bytes), "
                                f"got {type(a).__name__}: pass {want.__name__}({a!r})")
            if want is None and not isinstance(a, np.generic):
                raise TypeError(f"{what} needs a NumPy scalar of the parameter's type, got {type(a).__name__}")
            nbytes.append(0)
    return nbytes
