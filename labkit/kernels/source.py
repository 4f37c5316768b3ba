"""Reading CUDA C source: kernels and their parameters found, unsupported features named, ``#define`` values read.

Both back ends use this: the loader checks every launch's arguments against the parameter list it
finds here, and the emulator rewrites the source from it. What C and CUDA C share (comments out,
brackets paired, a parameter list read) is :mod:`labkit.native.csource`'s; this adds what is CUDA's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import CompileError
from ..native.csource import Param, line_of, matching_bracket, parse_param, split_params, strip_comments


class KernelCompileError(CompileError):
    """A kernel's source did not compile (the compiler's message is included)."""


class UnsupportedFeature(KernelCompileError):
    """The source uses something the CPU emulator cannot run."""


# (pattern, what to say) for what the emulator cannot run; checked on the source without comments.
UNSUPPORTED = [
    (r"\b__shfl(_up|_down|_xor)?\b(?!_sync)",
     "{m} is the form without a mask, which CUDA removed (Volta and later): use {m}_sync(mask, ...)"),
    (r"\b__(any|all|ballot)\b(?!_sync)",
     "{m} is the form without a mask, which CUDA removed (Volta and later): use {m}_sync(mask, ...)"),
    (r"\b__(match_any|match_all|reduce_add|reduce_min|reduce_max|reduce_and|reduce_or|reduce_xor)_sync\b",
     "{m} is not supported on the emulator; build it from __shfl_xor_sync or __ballot_sync"),
    (r"\bcooperative_groups\b|\bcg::", "cooperative groups are not supported; use __syncthreads() within a block"),
    (r"\b(tex1D|tex2D|tex3D|tex1Dfetch|surf2Dwrite|surf2Dread)\b|\btexture\s*<",
     "texture and surface memory ({m}) are not supported; read through a const pointer (and __ldg)"),
    (r"\basm\s*(volatile\s*)?\(", "inline PTX (asm) is not supported; write it in C"),
    (r"\bwmma::", "tensor-core intrinsics ({m}) are not supported; write the product with ordinary arithmetic"),
    (r"\b__nanosleep\b|\bclock64\b|\bclock\s*\(\s*\)", "device clocks ({m}) are not supported; time kernels from the host"),
    (r"\bmalloc\s*\(|\bnew\s+\w", "allocation inside a kernel ({m}) is not supported; allocate on the host and pass a pointer"),
    (r"#\s*include\b", "#include is not supported: kernels must be self-contained (NVRTC has no host headers either)"),
]


@dataclass(frozen=True)
class KernelDecl:
    """A kernel found in the source: its name, its parameters and where their list stands."""

    name: str
    params: tuple[Param, ...]
    params_span: tuple[int, int]   # where the parameter list's text is, in the comment-free source
    template: bool


def find_kernels(clean: str) -> list[KernelDecl]:
    """Every `__global__ void name(...)` in comment-free source."""
    out = []
    bounds = r"(?:__launch_bounds__\s*\([^)]*\)\s*)?"
    for m in re.finditer(r"__global__\s+" + bounds + r"void\s+" + bounds + r"(\w+)\s*\(", clean):
        open_pos = m.end() - 1
        close = matching_bracket(clean, open_pos)
        before = clean[max(0, m.start() - 200):m.start()]
        template = bool(re.search(r"template\s*<[^;{}]*>\s*(extern\s*\"C\"\s*)?$", before))
        params = tuple(parse_param(p, i) for i, p in enumerate(split_params(clean[open_pos + 1:close])))
        out.append(KernelDecl(m.group(1), params, (open_pos + 1, close), template))
    return out


def find_constants(clean: str) -> list[str]:
    """Names of `__constant__` variables."""
    return re.findall(r"__constant__\s+[\w\s\*]*?\b(\w+)\s*(?:\[[^\]]*\]\s*)*(?:=[^;]*)?;", clean)


def unsupported(clean: str) -> list[str]:
    """What in this source the emulator cannot run: one line per feature, with where it first appears."""
    found = []
    for pattern, what in UNSUPPORTED:
        m = re.search(pattern, clean)
        if m:
            found.append(f"line {line_of(clean, m.start())}: {what.format(m=m.group(0).strip())}")
    return found


def brace_depth_at(clean: str, pos: int) -> int:
    return clean.count("{", 0, pos) - clean.count("}", 0, pos)


def define(src: str, name: str, default: int | None = None) -> int | None:
    """The integer a ``#define NAME value`` of the source gives (``TILE`` of a tiled kernel), else ``default``."""
    found = re.search(rf"^[ \t]*#[ \t]*define[ \t]+{re.escape(name)}[ \t]+\(?[ \t]*(\d+)[ \t]*\)?[ \t]*$",
                      strip_comments(src), re.M)
    return int(found.group(1)) if found else default


KERNEL_DIR = Path(__file__).parent  # labkit's own .cu files


def read_source(source: str | Path) -> tuple[str, str]:
    """(text, file name) from CUDA C text, a path to a .cu file, or the name of a labkit kernel file ("matmul")."""
    if isinstance(source, str) and "\n" not in source and (KERNEL_DIR / f"{source}.cu").exists():
        source = KERNEL_DIR / f"{source}.cu"
    if isinstance(source, Path) or (isinstance(source, str) and "\n" not in source and source.endswith(".cu")):
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"no CUDA source at {path}")
        return path.read_text(), path.name
    return str(source), "kernel.cu"
