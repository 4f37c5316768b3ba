"""Building shared libraries from C and C++ source: the compilers found, one cache folder, and the compile itself.

Lab 03's C (:mod:`labkit.hostc`), the CUDA emulator (:mod:`labkit.kernels.emulator`) and MPI's loopback guard
(``loopback_bind.c``, :mod:`labkit.cluster.launch`) build with this. A library is compiled once per source,
compiler and flags, and kept in the cache folder, so a second run, or a second process, only loads it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .. import settings
from ..errors import CompileError


class BuildFailed(CompileError):
    """The compiler refused a source; ``stderr`` holds its words, the source named by its own file name."""

    def __init__(self, filename: str, stderr: str):
        super().__init__(f"{filename} did not compile:\n{stderr}")
        self.filename, self.stderr = filename, stderr


def find_compiler(names) -> tuple[str, str] | None:
    """(path, first line of ``--version``) of the first of ``names`` (None entries skipped) that is on the PATH and
    runs, or None."""
    for name in names:
        path = shutil.which(name) if name else None
        if not path:
            continue
        try:
            version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        return path, version.splitlines()[0] if version else "?"
    return None


def _c_names() -> list[str | None]:
    return [os.environ.get("CC"), "cc", "gcc", "clang"]


def c_compiler() -> tuple[str, str] | None:
    """The host C compiler, as :func:`find_compiler` gives it: $CC, else cc, gcc or clang."""
    return find_compiler(_c_names())


def c_compiler_path() -> str | None:
    """The host C compiler's path, found as :func:`c_compiler` finds it but without starting it to ask its version:
    for a library built on every MPI job's start, which its source alone identifies."""
    return next((path for path in map(shutil.which, filter(None, _c_names())) if path), None)


def cxx_compiler() -> tuple[str, str] | None:
    """The host C++ compiler, as :func:`find_compiler` gives it: $CXX, else c++, g++ or clang++."""
    return find_compiler([os.environ.get("CXX"), "c++", "g++", "clang++"])


def cache_dir() -> Path:
    """Where compiled libraries are kept: ``native`` in labkit's cache ($LABKIT_CACHE, else ~/.cache/labkit)."""
    d = settings.cache_dir() / "native"
    d.mkdir(parents=True, exist_ok=True)
    return d


def shared_library(compiler: tuple[str, str], text: str, filename: str, flags: Sequence[str], *,
                   libs: Sequence[str] = (), stamp: Sequence[str] = (), suffix: str = ".so") -> Path:
    """The shared library compiled from ``text`` (as the file ``filename``) by ``compiler`` (path, version) with
    ``flags`` (``-shared`` among them; without it, a program, ``suffix`` "") and linked with ``libs``: from the
    cache, else compiled into it now. ``stamp`` is what else the library depends on (a header's text), so that a
    change to it compiles anew. Raises :class:`BuildFailed` with the compiler's words."""
    cc, version = compiler
    key = hashlib.sha256("\0".join([text, cc, version, *flags, *libs, *stamp]).encode()).hexdigest()[:24]
    folder = cache_dir()
    library = folder / f"{Path(filename).stem}-{key}{suffix}"
    if not library.exists():
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            src = Path(tmp) / Path(filename).name
            src.write_text(text)
            out = Path(tmp) / "lib.so"
            r = subprocess.run([cc, *flags, str(src), "-o", str(out), *libs], capture_output=True, text=True)
            if r.returncode != 0:
                raise BuildFailed(src.name, r.stderr.replace(str(src), src.name))
            os.replace(out, library)  # atomic: another process compiling the same library is harmless
    return library
